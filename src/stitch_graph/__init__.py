"""stitch-graph: PyTorch programs to verified, faster CUDA with Planner, Coder and Verifier agents.

Build the graph with ``build_stitch_graph()`` (uncompiled, to extend or nest) or
``create_stitch_graph()`` (compiled); run it with ``context=StitchContext(...)``.

Names import lazily: ``stitch_graph.execution`` and ``stitch_graph.runtime`` run in candidate
workers and on GPU machines that need neither LangGraph nor LangChain.
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

try:
    __version__ = version("stitch-graph")
except PackageNotFoundError:  # a source tree on sys.path that was never installed
    __version__ = "0+unknown"

_EXPORTS: dict[str, str] = {
    "BestProgram": "stitch_graph.artifacts",
    "Candidate": "stitch_graph.artifacts",
    "CompileResult": "stitch_graph.artifacts",
    "Feedback": "stitch_graph.artifacts",
    "Plan": "stitch_graph.artifacts",
    "ProfileReport": "stitch_graph.artifacts",
    "RunReport": "stitch_graph.artifacts",
    "Task": "stitch_graph.artifacts",
    "TestResult": "stitch_graph.artifacts",
    "TimingResult": "stitch_graph.artifacts",
    "TodoItem": "stitch_graph.artifacts",
    "artifact_serializer": "stitch_graph.graph.checkpoint",
    "memory_checkpointer": "stitch_graph.graph.checkpoint",
    "sqlite_checkpointer": "stitch_graph.graph.checkpoint",
    "StitchContext": "stitch_graph.agents.context",
    "draw": "stitch_graph.graph.drawing",
    "build_agent_graph": "stitch_graph.graph",
    "build_stitch_graph": "stitch_graph.graph",
    "create_stitch_graph": "stitch_graph.graph",
    "StitchInput": "stitch_graph.agents.state",
    "StitchOutput": "stitch_graph.agents.state",
    "StitchState": "stitch_graph.agents.state",
    "as_tool": "stitch_graph.graph.subagent",
    "result_of": "stitch_graph.graph.subagent",
    "TaskLoadError": "stitch_graph.task",
    "load_task": "stitch_graph.task",
    "write_run": "stitch_graph.agents.run_folder",
}

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
    "result_of",
    "sqlite_checkpointer",
    "write_run",
]

if TYPE_CHECKING:
    from stitch_graph.agents.context import StitchContext
    from stitch_graph.agents.run_folder import write_run
    from stitch_graph.agents.state import StitchInput, StitchOutput, StitchState
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
    from stitch_graph.graph import build_agent_graph, build_stitch_graph, create_stitch_graph
    from stitch_graph.graph.checkpoint import (
        artifact_serializer,
        memory_checkpointer,
        sqlite_checkpointer,
    )
    from stitch_graph.graph.drawing import draw
    from stitch_graph.graph.subagent import as_tool, result_of
    from stitch_graph.task import TaskLoadError, load_task


def __getattr__(name: str) -> Any:
    """Import a public name on first use."""
    module = _EXPORTS.get(name)
    if module is None:
        msg = f"module 'stitch_graph' has no attribute {name!r}"
        raise AttributeError(msg)
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
