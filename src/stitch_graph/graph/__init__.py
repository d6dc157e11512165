"""The assembled graph: the Planner-Coder-Verifier state machine and what wraps it.

``builder`` wires the agents' nodes into a ``StateGraph``; ``checkpoint`` gives checkpointers that
know the artefact types; ``drawing`` draws a graph offline; ``subagent`` wraps a compiled graph as
a tool for a tool-calling agent and reads a run's structured result. This is the top library
layer: it imports the agents and nothing imports it back but the command line.
"""

from stitch_graph.graph.builder import (
    build_agent_graph,
    build_stitch_graph,
    create_stitch_graph,
    route_after_coder,
    route_after_planner,
    route_after_verifier,
)
from stitch_graph.graph.checkpoint import (
    artifact_serializer,
    memory_checkpointer,
    sqlite_checkpointer,
)
from stitch_graph.graph.drawing import available_formats, draw
from stitch_graph.graph.subagent import as_tool, result_of

__all__ = [
    "artifact_serializer",
    "as_tool",
    "available_formats",
    "build_agent_graph",
    "build_stitch_graph",
    "create_stitch_graph",
    "draw",
    "memory_checkpointer",
    "route_after_coder",
    "route_after_planner",
    "route_after_verifier",
    "result_of",
    "sqlite_checkpointer",
]
