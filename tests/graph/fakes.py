"""Test doubles: a scripted chat model and a scripted GPU executor.

The chat model replays AI messages in order (tool calls included), so structured output through
function calling and tool loops run through LangChain's real parsing. The executor stands in for
the GPU in routing tests only; the real harness has its own GPU tests.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from pydantic import Field

from stitch_graph.artifacts import (
    KernelMetrics,
    OutputCheck,
    ProfileReport,
    TestResult,
    TimingResult,
)
from stitch_graph.execution import VerificationOutcome

_ids = itertools.count()


def call(name: str, **args: Any) -> AIMessage:
    """An AI message calling one tool (or answering with one structured object)."""
    return AIMessage(
        content="", tool_calls=[{"name": name, "args": args, "id": f"call_{next(_ids)}"}]
    )


class ScriptedChatModel(BaseChatModel):
    """Answers with the scripted messages in order; records every prompt it was given."""

    script: list[BaseMessage]
    prompts: list[list[BaseMessage]] = Field(default_factory=list)
    bound_tools: list[list[str]] = Field(default_factory=list)

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> ScriptedChatModel:
        names = [getattr(t, "name", getattr(t, "__name__", str(t))) for t in tools]
        self.bound_tools.append(names)
        return self

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        self.prompts.append(list(messages))
        if not self.script:
            raise RuntimeError("scripted model ran out of answers")
        message = self.script.pop(0)
        return ChatResult(generations=[ChatGeneration(message=message)])


def passed(ms: float = 1.0) -> VerificationOutcome:
    test = TestResult(
        status="passed", trials=3, atol=1e-4, rtol=1e-4, outputs=[OutputCheck(index=0)]
    )
    timing = TimingResult(
        status="passed", device="fake GPU", runs=20, candidate_ms=ms, eager_ms=2.0, compile_ms=1.5
    )
    return VerificationOutcome(test=test, timing=timing, seconds=0.1)


def wrong() -> VerificationOutcome:
    check = OutputCheck(index=0, max_abs_error=0.5, max_rel_error=0.3, mismatch_fraction=0.25)
    test = TestResult(
        status="failed", reason="output 0 differs from the reference", trials=3, outputs=[check]
    )
    return VerificationOutcome(test=test, timing=TimingResult(status="not_run"), seconds=0.1)


def profile(headroom: float) -> ProfileReport:
    kernel = KernelMetrics(
        name="add_relu",
        duration_us=50.0,
        dram_pct=100 * (1 - headroom),
        sm_pct=10.0,
        bottleneck="memory",
    )
    return ProfileReport(
        status="passed", source="ncu", kernels=[kernel], bottleneck="memory", headroom=headroom
    )


class ScriptedExecutor:
    """Stands in for the GPU worker pool: replays verification outcomes and profiles."""

    def __init__(self, outcomes: list[VerificationOutcome], profiles: list[ProfileReport] = ()):
        self.outcomes = list(outcomes)
        self.profiles = list(profiles)
        self.verified: list[str] = []

    def verify_candidate(self, task, candidate, ctx, *, compile_result):
        assert compile_result.ok, "the verifier must only run programs that compiled"
        self.verified.append(candidate.digest)
        return self.outcomes.pop(0)

    def profile_candidate(self, task, candidate, ctx, **kwargs):
        return self.profiles.pop(0) if self.profiles else profile(0.05)
