"""The graph state: typed channels holding the artefacts of ``artifacts.py``.

The full state is internal; a parent graph sees the narrow ``StitchInput`` / ``StitchOutput``
contract (messages in, messages and a report out), so the graph nests as a sub-agent without
its private channels leaking or list channels being duplicated on the way back.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from langchain_core.messages import AnyMessage
from langgraph.graph.message import add_messages
from typing_extensions import TypedDict

from stitch_graph.artifacts import (
    AgentFailure,
    BestProgram,
    Candidate,
    CompileResult,
    Feedback,
    HackReport,
    Plan,
    ProfileReport,
    RoundRecord,
    RunReport,
    Task,
    TestResult,
    TimingResult,
    TuningReport,
)


def append_records(left: list[RoundRecord] | None, right: list[RoundRecord] | None) -> list:
    """Append round records; a record for a round already present replaces it (keyed by round).

    Keying by round keeps a parent graph's copy and a resumed run free of duplicates, and lets
    the Verifier complete a round's record after a model analysis that went through tools.
    """
    merged = {r.round: r for r in left or []}
    for record in right or []:
        merged[record.round] = record
    return [merged[k] for k in sorted(merged)]


class StitchInput(TypedDict, total=False):
    """What a caller gives: a task, a problem path, or the problem source in a message."""

    messages: Annotated[list[AnyMessage], add_messages]
    task: Task
    problem_path: str


class StitchOutput(TypedDict, total=False):
    """What a caller gets back: a final message, the run report and the structured result.

    ``result`` is plain JSON data (see ``agents.finalize.build_result``); the final message
    carries the same dict in ``additional_kwargs["stitch_result"]``.
    """

    messages: Annotated[list[AnyMessage], add_messages]
    report: RunReport
    result: dict[str, Any]


class StitchState(TypedDict, total=False):
    """Everything the agents share while optimising one task."""

    messages: Annotated[list[AnyMessage], add_messages]
    problem_path: str
    task: Task
    plan: Plan
    candidate: Candidate
    compile_result: CompileResult
    hack_report: HackReport
    test_result: TestResult
    timing: TimingResult
    profile: ProfileReport
    reference_profile: ProfileReport
    feedback: Feedback
    history: Annotated[list[RoundRecord], append_records]
    best: BestProgram
    last_compiled: Candidate
    coder_memory: dict[str, Any]
    coder_status: Literal["tools", "submitted", "failed"]
    verifier_status: Literal["tools", "done"]
    verified_digest: str
    rounds: int
    item_attempts: int
    replans: int
    tuning: TuningReport
    started_at: float
    failures: list[AgentFailure]
    coder_messages: Annotated[list[AnyMessage], add_messages]
    verifier_messages: Annotated[list[AnyMessage], add_messages]
    report: RunReport
    result: dict[str, Any]


__all__ = ["StitchInput", "StitchOutput", "StitchState", "append_records"]
