"""A person approves the program before it is accepted: the stitch graph, then an interrupt.

``review`` pauses the run with LangGraph's ``interrupt`` and shows the report; the run goes on
with ``Command(resume={"approved": True})`` (or ``False`` and a comment). Needs a checkpointer,
since a paused run lives in its checkpoint.
"""

from __future__ import annotations

from typing import Annotated, Any

from langchain_core.messages import AIMessage, AnyMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import interrupt
from typing_extensions import TypedDict

from stitch_graph import RunReport, Task, create_stitch_graph, memory_checkpointer


class ReviewState(TypedDict, total=False):
    """The task, the stitch graph's report, and the reviewer's verdict."""

    messages: Annotated[list[AnyMessage], add_messages]
    task: Task
    report: RunReport
    approved: bool
    comment: str


def review(state: ReviewState) -> dict[str, Any]:
    """Pause for a person's verdict on the finished run."""
    report = state["report"]
    program = report.best.candidate.kernel_source if report.best else ""
    verdict = interrupt({"summary": report.summary, "outcome": report.outcome, "cuda": program})
    approved = bool(verdict.get("approved"))
    comment = str(verdict.get("comment", ""))
    text = f"{'approved' if approved else 'rejected'} by reviewer" + (
        f": {comment}" if comment else ""
    )
    return {"approved": approved, "comment": comment, "messages": [AIMessage(content=text)]}


def build_human_review() -> StateGraph:
    """The uncompiled review graph: stitch, then review."""
    builder = StateGraph(ReviewState)
    builder.add_node("stitch", create_stitch_graph())
    builder.add_node("review", review)
    builder.add_edge(START, "stitch")
    builder.add_edge("stitch", "review")
    builder.add_edge("review", END)
    return builder


graph = build_human_review().compile(checkpointer=memory_checkpointer(), name="stitch_reviewed")
