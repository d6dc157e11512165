"""stitch-graph: PyTorch programs to verified, faster CUDA with Planner, Coder and Verifier agents.

Build the graph with ``build_stitch_graph()`` (uncompiled, to extend or nest) or
``create_stitch_graph()`` (compiled); run it with ``context=StitchContext(...)``.
"""

from stitch_graph.artifacts import (
    BestProgram,
    Candidate,
    CompileResult,
    Feedback,
    Plan,
    ProfileReport,
    RunReport,
    Task,
    TestResult,
    TimingResult,
    TodoItem,
)
from stitch_graph.checkpoint import artifact_serializer, memory_checkpointer, sqlite_checkpointer
from stitch_graph.context import StitchContext
from stitch_graph.draw import draw
from stitch_graph.graph import build_agent_graph, build_stitch_graph, create_stitch_graph
from stitch_graph.state import StitchInput, StitchOutput, StitchState
from stitch_graph.subagent import as_tool
from stitch_graph.task import TaskLoadError, load_task

__all__ = [
    "BestProgram",
    "Candidate",
    "CompileResult",
    "Feedback",
    "Plan",
    "ProfileReport",
    "RunReport",
    "StitchContext",
    "StitchInput",
    "StitchOutput",
    "StitchState",
    "Task",
    "TaskLoadError",
    "TestResult",
    "TimingResult",
    "TodoItem",
    "artifact_serializer",
    "as_tool",
    "build_agent_graph",
    "build_stitch_graph",
    "create_stitch_graph",
    "draw",
    "load_task",
    "memory_checkpointer",
    "sqlite_checkpointer",
]
