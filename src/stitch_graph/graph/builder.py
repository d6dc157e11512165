"""The Planner-Coder-Verifier state machine and its two factories.

``build_stitch_graph()`` returns the uncompiled ``StateGraph`` so users can add nodes, swap one or
nest it; ``create_stitch_graph()`` compiles it with an optional checkpointer. The routers return
``Literal`` types so the drawing shows the real edges, tool nodes included.
"""

from __future__ import annotations

from typing import Any, Literal

from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.prebuilt import ToolNode
from langgraph.types import Checkpointer

from stitch_graph.agents.coder import coder_node
from stitch_graph.agents.context import StitchContext
from stitch_graph.agents.finalize import GRAPH_NAME, finalize_node
from stitch_graph.agents.planner import planner_node
from stitch_graph.agents.state import StitchInput, StitchOutput, StitchState
from stitch_graph.agents.tools import coder_tools, verifier_tools
from stitch_graph.agents.verifier import verifier_node


def route_after_planner(state: StitchState) -> Literal["coder", "finalize"]:
    """To the Coder once there is a plan with work in it; to finalize if planning failed."""
    plan = state.get("plan")
    if plan is None or plan.next_pending() is None:
        return "finalize"
    return "coder"


def route_after_coder(state: StitchState) -> Literal["coder_tools", "verifier", "finalize"]:
    """Run the Coder's tool calls, hand a finished program over, or stop on failure."""
    status = state.get("coder_status")
    if status == "tools":
        return "coder_tools"
    if status == "submitted":
        return "verifier"
    return "finalize"


def route_after_verifier(
    state: StitchState,
) -> Literal["verifier_tools", "coder", "planner", "finalize"]:
    """Follow the Verifier's verdict.

    Compile errors, wrong results and hacks go back to the Coder (bounded per item); a finished
    item sends the Coder to the next one; a bottleneck with headroom goes to the Planner; a
    met target or a spent budget goes to finalize.
    """
    if state.get("verifier_status") == "tools":
        return "verifier_tools"
    feedback = state.get("feedback")
    if feedback is None:
        return "finalize"
    return feedback.target


def build_stitch_graph(
    *,
    planner: Any = planner_node,
    coder: Any = coder_node,
    verifier: Any = verifier_node,
) -> StateGraph:
    """The uncompiled graph; any agent node can be replaced by a callable of the same contract.

    Args:
        planner: node writing ``plan`` (and ``task`` when it loads it).
        coder: node writing ``candidate`` and ``coder_status``.
        verifier: node writing ``feedback`` (whose ``target`` routes the loop).
    """
    builder = StateGraph(
        StitchState,
        context_schema=StitchContext,
        input_schema=StitchInput,
        output_schema=StitchOutput,
    )
    builder.add_node("planner", planner)
    builder.add_node("coder", coder)
    builder.add_node("coder_tools", ToolNode(coder_tools(), messages_key="coder_messages"))
    builder.add_node("verifier", verifier)
    builder.add_node("verifier_tools", ToolNode(verifier_tools(), messages_key="verifier_messages"))
    builder.add_node("finalize", finalize_node)
    builder.add_edge(START, "planner")
    builder.add_conditional_edges("planner", route_after_planner)
    builder.add_conditional_edges("coder", route_after_coder)
    builder.add_edge("coder_tools", "coder")
    builder.add_conditional_edges("verifier", route_after_verifier)
    builder.add_edge("verifier_tools", "verifier")
    builder.add_edge("finalize", END)
    return builder


def create_stitch_graph(
    *,
    checkpointer: Checkpointer = None,
    name: str = GRAPH_NAME,
    debug: bool = False,
) -> CompiledStateGraph:
    """The compiled graph, ready to ``invoke``/``stream`` with ``context=StitchContext(...)``.

    Args:
        checkpointer: e.g. ``SqliteSaver`` (see ``stitch_graph.graph.checkpoint``) to persist and resume.
        name: the graph's name, as a parent graph or supervisor sees it; the closing message
            is named ``stitch_graph`` whatever it is.
        debug: LangGraph debug output.
    """
    return build_stitch_graph().compile(checkpointer=checkpointer, name=name, debug=debug)


def build_agent_graph(agent: Literal["planner", "coder", "verifier"]) -> StateGraph:
    """One agent alone as a graph (with its tool node where it has one), for composing."""
    nodes = {"planner": planner_node, "coder": coder_node, "verifier": verifier_node}
    builder = StateGraph(StitchState, context_schema=StitchContext)
    builder.add_node(agent, nodes[agent])
    builder.add_edge(START, agent)
    tools = {"coder": coder_tools, "verifier": verifier_tools}.get(agent)
    if tools is None:
        builder.add_edge(agent, END)
        return builder
    key = f"{agent}_messages"
    status = f"{agent}_status"
    builder.add_node(f"{agent}_tools", ToolNode(tools(), messages_key=key))
    builder.add_edge(f"{agent}_tools", agent)

    def route(state: StitchState) -> Literal["tools", "end"]:
        return "tools" if state.get(status) == "tools" else "end"

    builder.add_conditional_edges(agent, route, {"tools": f"{agent}_tools", "end": END})
    return builder
