"""Best of N: run the stitch graph under several settings in parallel and keep the best program.

Each variant is a set of ``StitchContext`` overrides (another Coder model, another GPU target,
more rounds, ...). LangGraph's ``Send`` fans the task out to one ``attempt`` per variant; the
reports come back through a list channel and ``pick_best`` keeps the verified, fastest program.
"""

from __future__ import annotations

import operator
from typing import Annotated, Any

from langchain_core.messages import AIMessage, AnyMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import Send
from typing_extensions import TypedDict

from stitch_graph import RunReport, StitchContext, Task, create_stitch_graph

_RANK = {"verified": 0, "partial": 1, "compiled_only": 2, "no_program": 3, "failed": 4}


class BestOfNState(TypedDict, total=False):
    """The task, the variants to try, and one report per variant."""

    messages: Annotated[list[AnyMessage], add_messages]
    task: Task
    variants: list[dict[str, Any]]
    reports: Annotated[list[dict[str, Any]], operator.add]
    report: RunReport


class AttemptInput(TypedDict):
    """What one parallel attempt receives."""

    task: Task
    variant: dict[str, Any]


def fan_out(state: BestOfNState) -> list[Send]:
    """One ``attempt`` per variant (a single default attempt when none are given)."""
    variants = state.get("variants") or [{}]
    return [Send("attempt", {"task": state["task"], "variant": v}) for v in variants]


def attempt(payload: AttemptInput) -> dict[str, Any]:
    """Run the whole stitch graph under one variant's settings."""
    context = StitchContext().with_overrides(**payload["variant"])
    result = create_stitch_graph().invoke({"task": payload["task"]}, context=context)
    return {"reports": [{"variant": _label(payload["variant"]), "report": result["report"]}]}


def _label(variant: dict[str, Any]) -> str:
    return ", ".join(f"{k}={getattr(v, 'model_name', v)}" for k, v in variant.items()) or "defaults"


def _key(entry: dict[str, Any]) -> tuple[int, float]:
    report: RunReport = entry["report"]
    timing = report.best.timing if report.best else None
    ms = timing.candidate_ms if timing and timing.candidate_ms else float("inf")
    return _RANK.get(report.outcome, 9), ms


def pick_best(state: BestOfNState) -> dict[str, Any]:
    """Keep the best report: verified before partial, then the fastest."""
    best = min(state["reports"], key=_key)
    lines = [f"- {e['variant']}: {e['report'].summary}" for e in state["reports"]]
    text = f"best of {len(state['reports'])}: {best['variant']}\n" + "\n".join(lines)
    return {"report": best["report"], "messages": [AIMessage(content=text)]}


def build_best_of_n() -> StateGraph:
    """The uncompiled best-of-N graph."""
    builder = StateGraph(BestOfNState)
    builder.add_node("attempt", attempt)
    builder.add_node("pick_best", pick_best)
    builder.add_conditional_edges(START, fan_out, ["attempt"])
    builder.add_edge("attempt", "pick_best")
    builder.add_edge("pick_best", END)
    return builder


graph = build_best_of_n().compile(name="stitch_best_of_n")
