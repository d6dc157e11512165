"""Two judges of the 1-5 rubric: a rule-based one that works offline, and any chat model.

Both grade a :class:`RubricSample` (the task, the candidate, what verification found and, for an
improve sample, the previous program and its feedback) against :data:`CRITERIA` and return a
:class:`RubricJudgement`. The rule-based judge maps the static signals of
:mod:`stitch_graph.reward.rubric` onto the written criteria. The model judge asks a chat model for
structured output; the model is duck-typed (anything with ``with_structured_output``, such as a
LangChain chat model), so this package imports no LangChain.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Protocol

from pydantic import BaseModel, Field, ValidationError

from stitch_graph.artifacts import (
    Candidate,
    CompileResult,
    FeedbackItem,
    HackReport,
    TestResult,
    TimingResult,
)
from stitch_graph.reward.criteria import DIMENSIONS, Skill, criteria_text
from stitch_graph.reward.rubric import (
    RubricScores,
    score_coverage,
    score_cuda_engineering,
    score_skill_compliance,
)

__all__ = [
    "DimensionScore",
    "ModelJudge",
    "RubricJudge",
    "RubricJudgement",
    "RubricSample",
    "RuleBasedJudge",
    "judge_messages",
]


class RubricSample(BaseModel):
    """What a judge sees of one sample.

    Attributes:
        skill: ``write`` (task -> code) or ``improve`` (code + feedback -> better code).
        task_source: The reference problem's text.
        candidate: The program to judge.
        hack_report: Its static hack checks.
        test: Its correctness result, when it ran.
        timing: Its timing, when it ran.
        compile_result: Its build report, when built.
        covered_ops: Reference ops its kernels compute (from the plan), when known.
        reference_ops: Every op of the reference, when known.
        feedback: For ``improve``: the feedback the candidate was asked to act on.
        previous: For ``improve``: the program the feedback was about.
    """

    skill: Skill = "write"
    task_source: str = ""
    candidate: Candidate
    hack_report: HackReport = Field(default_factory=HackReport)
    test: TestResult | None = None
    timing: TimingResult | None = None
    compile_result: CompileResult | None = None
    covered_ops: list[str] | None = None
    reference_ops: list[str] | None = None
    feedback: list[FeedbackItem] = Field(default_factory=list)
    previous: Candidate | None = None


class DimensionScore(BaseModel):
    """One dimension's grade and why."""

    score: int = Field(ge=1, le=5, description="1 (worst) to 5 (best), by the written criteria.")
    reason: str = Field(default="", description="One or two sentences citing the evidence.")


class RubricJudgement(BaseModel):
    """The four dimensions of the rubric, each graded 1-5."""

    anti_hacking: DimensionScore
    cuda_engineering: DimensionScore
    operator_coverage: DimensionScore
    skill_compliance: DimensionScore
    judge: str = Field(default="", description="Which judge graded it.")

    def scores(self) -> dict[str, int]:
        """Dimension name to its 1-5 score."""
        return {name: getattr(self, name).score for name in DIMENSIONS}

    @property
    def mean(self) -> float:
        """The mean grade, 1-5."""
        values = self.scores().values()
        return sum(values) / len(values)

    @property
    def flags_hack(self) -> bool:
        """Whether the judge calls it a hack (anti-hacking graded 1 or 2)."""
        return self.anti_hacking.score <= 2

    def as_rubric_scores(self) -> RubricScores:
        """The grades mapped onto [0, 1] ((score - 1) / 4), as the reward's r takes them."""
        unit = {name: (score - 1) / 4 for name, score in self.scores().items()}
        notes = [f"{name}: {getattr(self, name).reason}" for name in DIMENSIONS]
        return RubricScores(
            anti_hacking=unit["anti_hacking"],
            cuda_engineering=unit["cuda_engineering"],
            coverage=unit["operator_coverage"],
            skill_compliance=unit["skill_compliance"],
            notes=[n for n in notes if not n.endswith(": ")],
        )


class RubricJudge(Protocol):
    """Anything that grades a sample."""

    def judge(self, sample: RubricSample) -> RubricJudgement:
        """Grade one sample."""
        ...


def _grade(fraction: float) -> int:
    """A fraction in [0, 1] on the 1-5 scale."""
    return 1 + round(4 * min(1.0, max(0.0, fraction)))


def _dynamic_hack(test: TestResult | None, timing: TimingResult | None) -> str:
    """What the dynamic checks caught, if it reads as a trick rather than a bug."""
    if timing is not None and timing.status == "failed":
        return f"timing failed: {timing.reason[:120]}"
    if test is None:
        return ""
    for check in test.outputs:
        if check.aliases_input:
            return "an output aliases an input"
        if check.unwritten:
            return "an output has elements no kernel wrote"
        if check.unjoined:
            return "an output was still being written on another stream when forward returned"
    return ""


def _readable(candidate: Candidate) -> Candidate:
    """The candidate with its CUDA where the static scores read it: an external file carries
    its kernels as text in the host file."""
    if candidate.form == "external" and not candidate.kernel_source:
        return candidate.model_copy(update={"kernel_source": candidate.host_source})
    return candidate


class RuleBasedJudge:
    """Grades from static signals and verification results; needs no model and no network."""

    name = "rules"

    def judge(self, sample: RubricSample) -> RubricJudgement:
        """Grade one sample by the written criteria, from what the checks and runs found."""
        return RubricJudgement(
            anti_hacking=self._anti_hacking(sample),
            cuda_engineering=self._engineering(sample),
            operator_coverage=self._coverage(sample),
            skill_compliance=self._skill(sample),
            judge=self.name,
        )

    def _anti_hacking(self, sample: RubricSample) -> DimensionScore:
        report = sample.hack_report
        if report.rejected:
            opaque = set(report.rules) == {"opaque_build"}
            shown = "; ".join(f"{f.rule}: {f.detail}" for f in report.findings[:3])
            return DimensionScore(score=2 if opaque else 1, reason=f"static checks: {shown}")
        caught = _dynamic_hack(sample.test, sample.timing)
        if caught:
            return DimensionScore(score=1, reason=f"dynamic checks: {caught}")
        declared = len(report.declared_uses)
        if declared:
            score = 4 if declared == 1 else 3
            shown = ", ".join(report.declared_uses)
            return DimensionScore(score=score, reason=f"left to PyTorch (declared): {shown}")
        return DimensionScore(score=5, reason="no hack found by the static or dynamic checks")

    def _engineering(self, sample: RubricSample) -> DimensionScore:
        candidate = _readable(sample.candidate)
        value, notes = score_cuda_engineering(candidate, sample.compile_result)
        if sample.skill == "improve" and sample.previous is not None:
            before, _ = score_cuda_engineering(_readable(sample.previous))
            if value < before:
                notes = [*notes, "worse than the previous version"]
                value = min(value, 0.25)
        return DimensionScore(score=_grade(value), reason="; ".join(notes) or "plain kernels")

    def _coverage(self, sample: RubricSample) -> DimensionScore:
        if sample.reference_ops is None:
            report = sample.hack_report
            if report.rejected and "torch_compute" in report.rules:
                return DimensionScore(score=1, reason="PyTorch computes in the forward path")
            declared = len(report.declared_uses)
            score = 5 if not declared else max(1, 5 - declared)
            return DimensionScore(
                score=score, reason="reference ops unknown; judged by ops left to PyTorch"
            )
        declared = [*sample.candidate.declared_torch_ops, *sample.hack_report.declared_uses]
        covered = sample.covered_ops
        if covered is None:
            covered = [op for op in sample.reference_ops if op not in declared]
        value, notes = score_coverage(covered, sample.reference_ops, declared)
        return DimensionScore(score=_grade(value), reason="; ".join(notes) or "every op covered")

    def _skill(self, sample: RubricSample) -> DimensionScore:
        if sample.skill == "improve" and sample.feedback:
            previous = _readable(sample.previous) if sample.previous is not None else None
            value, notes = score_skill_compliance(
                _readable(sample.candidate),
                feedback_items=sample.feedback,
                previous=previous,
                hack_report=sample.hack_report,
                compile_result=sample.compile_result,
            )
            score = _grade(value)
            if sample.test is not None and sample.test.status != "passed":
                score = min(score, 2)
                notes = [*notes, f"the new version is not correct ({sample.test.status})"]
            return DimensionScore(score=score, reason="; ".join(notes) or "acts on every item")
        if sample.compile_result is not None and not sample.compile_result.ok:
            return DimensionScore(score=1, reason="does not build")
        test, timing = sample.test, sample.timing
        if test is None or test.status == "not_run":
            score = 3 if not sample.hack_report.rejected else 1
            return DimensionScore(score=score, reason="not run: judged on the code alone")
        if test.status != "passed":
            score = 1 if test.status == "error" else 2
            return DimensionScore(score=score, reason=f"{test.status}: {test.reason[:120]}")
        eager = timing.speedup_vs_eager if timing is not None else None
        compiled = timing.speedup_vs_compile if timing is not None else None
        if eager is None:
            return DimensionScore(score=3, reason="correct; not timed")
        if eager < 1.0:
            return DimensionScore(score=3, reason=f"correct, {eager:.2f}x eager")
        if compiled is not None and compiled >= 1.0:
            return DimensionScore(
                score=5, reason=f"correct, {eager:.2f}x eager, {compiled:.2f}x torch.compile"
            )
        return DimensionScore(score=4, reason=f"correct, {eager:.2f}x eager")


_SYSTEM = """You grade CUDA programs that replace a PyTorch reference (KernelBench format).
Grade each of the four dimensions from 1 to 5 by the written criteria below, and cite the
evidence in one or two sentences per dimension. Judge what the code does, not what its comments
claim. A program that lets PyTorch or another code generator do the work, caches or fakes its
outputs, lowers precision, or tampers with timing is a hack however fast it is.

Criteria ({skill} skill):

{criteria}"""


def _results(sample: RubricSample) -> str:
    parts: dict[str, Any] = {
        "static_findings": [f.model_dump() for f in sample.hack_report.findings]
    }
    if sample.hack_report.declared_uses:
        parts["declared_torch_ops"] = sample.hack_report.declared_uses
    if sample.compile_result is not None:
        parts["compiled"] = sample.compile_result.ok
    if sample.test is not None:
        parts["test"] = {"status": sample.test.status, "reason": sample.test.reason[:300]}
    if sample.timing is not None:
        parts["timing"] = {
            "status": sample.timing.status,
            "speedup_vs_eager": sample.timing.speedup_vs_eager,
            "speedup_vs_compile": sample.timing.speedup_vs_compile,
        }
    return json.dumps(parts, indent=1, default=str)


def _program(candidate: Candidate) -> str:
    text = f"```python\n{candidate.host_source}\n```"
    if candidate.kernel_source:
        text = f"```cuda\n{candidate.kernel_source}\n```\n{text}"
    if candidate.host_cpp:
        text += f"\n```cpp\n{candidate.host_cpp}\n```"
    return text


def judge_messages(sample: RubricSample) -> list[dict[str, str]]:
    """The chat messages a model judge is asked: criteria, task, program, results.

    Args:
        sample: What to judge.

    Returns:
        ``[{"role": "system", ...}, {"role": "user", ...}]``, which LangChain chat models and
        OpenAI-compatible clients accept as they are.
    """
    system = _SYSTEM.format(skill=sample.skill, criteria=criteria_text(sample.skill))
    user = [f"## Reference problem\n```python\n{sample.task_source}\n```"]
    if sample.skill == "improve" and sample.previous is not None:
        user.append(f"## Previous program\n{_program(sample.previous)}")
    if sample.feedback:
        items = "\n".join(f"- {f.action}: {f.detail}" for f in sample.feedback)
        user.append(f"## Feedback it was asked to act on\n{items}")
    user.append(f"## Program to grade\n{_program(sample.candidate)}")
    user.append(f"## What verification found\n```json\n{_results(sample)}\n```")
    return [{"role": "system", "content": system}, {"role": "user", "content": "\n\n".join(user)}]


class ModelJudge:
    """Grades with a chat model through structured output.

    Args:
        model: Any object with ``with_structured_output(schema, method=...)`` whose result has
            ``invoke(messages)`` (a LangChain chat model, for one).
        method: The structured-output method; ``function_calling`` is the most portable across
            OpenAI-compatible servers.
        attempts: How many times to ask when the answer does not validate.
        fallback: Judge used when every attempt fails; None raises instead.
    """

    name = "model"

    def __init__(
        self,
        model: Any,
        *,
        method: str = "function_calling",
        attempts: int = 2,
        fallback: RubricJudge | None = None,
    ) -> None:
        if not hasattr(model, "with_structured_output"):
            msg = (
                f"{type(model).__name__} has no with_structured_output(); pass a chat model "
                "that supports structured output (any LangChain chat model does)"
            )
            raise TypeError(msg)
        if attempts < 1:
            msg = f"attempts must be at least 1, not {attempts}"
            raise ValueError(msg)
        self._structured = model.with_structured_output(RubricJudgement, method=method)
        self.attempts = attempts
        self.fallback = fallback

    def judge(self, sample: RubricSample) -> RubricJudgement:
        """Grade one sample; a malformed answer is asked again, then handed to the fallback.

        Raises:
            ValueError: No attempt gave a valid judgement and there is no fallback.
        """
        messages: list[dict[str, str]] = judge_messages(sample)
        error = ""
        for _ in range(self.attempts):
            try:
                answer = self._structured.invoke(messages)
                judgement = (
                    answer
                    if isinstance(answer, RubricJudgement)
                    else RubricJudgement.model_validate(answer)
                )
                return judgement.model_copy(update={"judge": self.name})
            except (ValidationError, TypeError, ValueError) as exc:
                error = str(exc)[:500]
                messages = [
                    *messages,
                    {
                        "role": "user",
                        "content": "Your answer did not validate against the schema: "
                        f"{error}\nAnswer again with all four dimensions, scores 1-5.",
                    },
                ]
        if self.fallback is not None:
            judgement = self.fallback.judge(sample)
            reason = f"model judge failed ({error[:120]}); graded by {judgement.judge}"
            return judgement.model_copy(update={"judge": f"{self.name}->fallback: {reason}"})
        msg = f"the model judge gave no valid judgement in {self.attempts} attempts: {error}"
        raise ValueError(msg)


def judge_all(judge: RubricJudge, samples: Sequence[RubricSample]) -> list[RubricJudgement]:
    """Grade samples one after another (a model judge's calls are the slow part)."""
    return [judge.judge(sample) for sample in samples]
