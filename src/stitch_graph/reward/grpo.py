"""The reward as a GRPO trainer calls it: ``reward(prompts, completions, **kwargs) -> list[float]``.

TRL's ``GRPOTrainer(reward_funcs=[...])`` calls each reward function with the batch's prompts,
the sampled completions (strings, or chat message lists for conversational datasets) and every
other dataset column as a keyword argument of lists. :class:`KernelReward` takes the ``ModelNew``
code block out of each completion, runs the static hack checks, verifies what passes them (all
candidates of a batch at once, through the executor, so several GPUs work in parallel), grades
the rubric and returns R for each completion.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from stitch_graph.artifacts import Candidate, HackReport, Task, TestResult, TimingResult
from stitch_graph.checks import check_candidate
from stitch_graph.reward.judges import RubricJudge, RubricSample, RuleBasedJudge
from stitch_graph.reward.reward import RewardBreakdown, RewardConfig, compute_reward

__all__ = ["KernelReward", "completion_text", "extract_candidate", "extract_model_new"]

Verifier = Callable[[Task, Candidate], Any]
"""``(task, candidate) -> outcome`` with ``.test`` and ``.timing`` (a ``VerificationOutcome``)."""

_BLOCK = re.compile(r"```[ \t]*([\w+-]*)[^\n]*\n(.*?)```", re.S)


def completion_text(completion: Any) -> str:
    """The text of a completion: a string, a message, or a chat list (last assistant turn)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Mapping):
        content = completion.get("content", "")
        return content if isinstance(content, str) else _join_parts(content)
    if isinstance(completion, Sequence):
        turns = [m for m in completion if _role(m) in {"assistant", "ai"}] or list(completion)
        return completion_text(turns[-1]) if turns else ""
    content = getattr(completion, "content", "")
    return content if isinstance(content, str) else _join_parts(content)


def _role(message: Any) -> str:
    if isinstance(message, Mapping):
        return str(message.get("role", ""))
    return str(getattr(message, "type", getattr(message, "role", "")))


def _join_parts(parts: Any) -> str:
    texts = []
    for part in parts or []:
        if isinstance(part, str):
            texts.append(part)
        elif isinstance(part, Mapping) and isinstance(part.get("text"), str):
            texts.append(part["text"])
    return "\n".join(texts)


def extract_candidate(completion: Any) -> Candidate | None:
    """The program in a completion as a candidate.

    A ``cuda`` block beside a ``ModelNew`` that launches through ``KERNELS`` is the project's
    own form (``nvrtc``); a ``ModelNew`` block alone is a KernelBench file that builds its own
    kernels (form ``external``).

    Returns:
        The candidate, or None when the completion defines no ``ModelNew``.
    """
    host = extract_model_new(completion)
    if host is None:
        return None
    text = completion_text(completion)
    cuda = [body for lang, body in _BLOCK.findall(text) if lang.lower() in {"cuda", "cu", "c++"}]
    if cuda and re.search(r"\bKERNELS\.", host):
        return Candidate(kernel_source=cuda[-1], host_source=host, form="nvrtc", author="policy")
    return Candidate(kernel_source="", host_source=host, form="external", author="policy")


def extract_model_new(completion: Any) -> str | None:
    """The ``ModelNew`` program in a completion: its last code block that defines ``ModelNew``.

    A completion without fenced blocks counts when its whole text defines ``ModelNew``.

    Returns:
        The program text, or None when the completion holds none.
    """
    text = completion_text(completion)
    blocks = [body for lang, body in _BLOCK.findall(text) if lang.lower() in {"", "python", "py"}]
    defining = [b for b in blocks if re.search(r"^class\s+ModelNew\b", b, re.M)]
    if defining:
        return defining[-1].strip() + "\n"
    if not blocks and re.search(r"^class\s+ModelNew\b", text, re.M):
        return text.strip() + "\n"
    return None


class KernelReward:
    """A GRPO reward function over KernelBench problems.

    Args:
        problems: Problem name (or any key a dataset column holds) to problem text or
            :class:`Task`. A column value that is not a key is taken as the problem's text.
        problem_column: The dataset column naming each prompt's problem.
        config: The reward's constants.
        judge: The rubric judge; the rule-based judge when None.
        verifier: ``(task, candidate) -> outcome`` with ``.test`` and ``.timing``. On a GPU
            machine, ``stitch_graph.execution.external.gpu_verifier()`` (the Verifier's
            protocol through the executor); tests pass a scripted one.
        parallel: How many candidates of a batch are verified at once (the executor spreads
            them over the GPUs).

    Example:
        ``GRPOTrainer(model, reward_funcs=[KernelReward(problems, verifier=gpu_verifier())],
        train_dataset=dataset)``, where ``dataset`` has a ``problem`` column.
    """

    def __init__(
        self,
        problems: Mapping[str, str | Task] | None = None,
        *,
        problem_column: str = "problem",
        config: RewardConfig | None = None,
        judge: RubricJudge | None = None,
        verifier: Verifier | None = None,
        parallel: int = 8,
    ) -> None:
        if verifier is None:
            msg = (
                "KernelReward needs a verifier: pass verifier=gpu_verifier() from "
                "stitch_graph.execution.external on a GPU machine, or a callable "
                "(task, candidate) -> outcome with .test and .timing"
            )
            raise TypeError(msg)
        if parallel < 1:
            msg = f"parallel must be at least 1, not {parallel}"
            raise ValueError(msg)
        self.__name__ = "stitch_kernel_reward"  # trainers log each reward under its name
        self.problems = dict(problems or {})
        self.problem_column = problem_column
        self.config = config or RewardConfig()
        self.judge = judge or RuleBasedJudge()
        self.verifier = verifier
        self.parallel = parallel
        self.last: list[RewardBreakdown] = []
        self._tasks: dict[str, Task] = {}

    def _task(self, key: str) -> Task:
        task = self._tasks.get(key)
        if task is None:
            value = self.problems.get(key, key)
            if isinstance(value, Task):
                task = value
            else:
                from stitch_graph.task import load_task

                task = load_task(value)
            self._tasks[key] = task
        return task

    def _problem_keys(self, count: int, kwargs: dict[str, Any]) -> list[str]:
        column = kwargs.get(self.problem_column)
        if column is None:
            if len(self.problems) == 1:
                return [next(iter(self.problems))] * count
            msg = (
                f"the batch has no {self.problem_column!r} column; give the dataset a column "
                "naming each prompt's problem, or build KernelReward with one problem"
            )
            raise KeyError(msg)
        keys = [column] * count if isinstance(column, str) else list(column)
        if len(keys) != count:
            msg = f"{self.problem_column!r} has {len(keys)} values for {count} completions"
            raise ValueError(msg)
        return [str(k) for k in keys]

    def __call__(
        self, prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any
    ) -> list[float]:
        """R for every completion, in order (0 for no code, a hack or a wrong result)."""
        keys = self._problem_keys(len(completions), kwargs)
        breakdowns: list[RewardBreakdown | None] = [None] * len(completions)
        pending: list[tuple[int, Task, Candidate, HackReport]] = []
        for i, (completion, key) in enumerate(zip(completions, keys, strict=True)):
            candidate = extract_candidate(completion)
            task = self._task(key)
            if candidate is None:
                breakdowns[i] = self._zero("no ModelNew code block in the completion")
                continue
            report = check_candidate(candidate, reference_source=task.source)
            if report.rejected:
                test = TestResult(status="not_run", reason="refused by the static checks")
                breakdowns[i] = self._score(task, candidate, report, test, None)
                continue
            pending.append((i, task, candidate, report))
        if pending:
            prebuild = getattr(self.verifier, "prebuild", None)
            if prebuild is not None:  # load_inline builds side by side, not one per GPU job
                prebuild([p[2] for p in pending], jobs=self.parallel)
            with ThreadPoolExecutor(max_workers=min(self.parallel, len(pending))) as pool:
                outcomes = list(pool.map(lambda p: self.verifier(p[1], p[2]), pending))
            for (i, task, candidate, report), outcome in zip(pending, outcomes, strict=True):
                breakdowns[i] = self._score(task, candidate, report, outcome.test, outcome.timing)
        self.last = [b for b in breakdowns if b is not None]
        return [b.value if b is not None else 0.0 for b in breakdowns]

    def _zero(self, reason: str) -> RewardBreakdown:
        c = self.config
        return RewardBreakdown(
            correct=False,
            hacked=False,
            speedup=0.0,
            rubric=0.0,
            tau=c.tau,
            lam=c.lam,
            r_max=c.r_max,
            uncapped=0.0,
            value=0.0,
            reason=reason,
        )

    def _score(
        self,
        task: Task,
        candidate: Candidate,
        report: HackReport,
        test: TestResult,
        timing: TimingResult | None,
    ) -> RewardBreakdown:
        sample = RubricSample(
            task_source=task.source,
            candidate=candidate,
            hack_report=report,
            test=test,
            timing=timing,
        )
        rubric = self.judge.judge(sample).as_rubric_scores()
        return compute_reward(test, timing, report, rubric, self.config)
