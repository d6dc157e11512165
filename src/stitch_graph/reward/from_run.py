"""Training samples from a finished run's checkpoints.

Every Verifier step of a checkpointed run is one round: the program the Coder wrote, what the
Verifier found and the feedback the Coder had acted on. Walking the state history oldest-first
turns those rounds into ``RoundSample``s with their reward, ready for ``export_training_data``.
"""

from __future__ import annotations

from typing import Any

from stitch_graph.artifacts import Candidate, Feedback, HackReport, TestResult
from stitch_graph.reward.export import RoundSample
from stitch_graph.reward.reward import RewardConfig, compute_reward
from stitch_graph.reward.rubric import score_rubric

__all__ = ["samples_from_history", "samples_from_run"]

_FIX_CATEGORIES = ("compile_error", "wrong_result", "runtime_error", "hack", "bottleneck")


def _round_test(values: dict[str, Any], record: Any) -> TestResult:
    """This round's test; a program that never ran gets an error result, not a stale one."""
    if record.compiled and record.test != "not_run":
        return values["test_result"]
    if not record.compiled:
        return TestResult(status="error", reason=record.summary or "did not build")
    return TestResult(status="not_run", reason="not run: no GPU")


def samples_from_history(
    snapshots: list[dict[str, Any]], config: RewardConfig | None = None
) -> list[RoundSample]:
    """One sample per round, from state values ordered oldest first."""
    samples: list[RoundSample] = []
    seen_rounds: set[int] = set()
    previous: Candidate | None = None
    acted_on: Feedback | None = None
    for values in snapshots:
        history = values.get("history") or []
        if not history or history[-1].round in seen_rounds:
            continue
        record = history[-1]
        if record.feedback is None:  # a model analysis still in progress
            continue
        seen_rounds.add(record.round)
        task, plan, candidate = values["task"], values["plan"], values["candidate"]
        hacks: HackReport = values.get("hack_report") or HackReport()
        test = _round_test(values, record)
        timing = values.get("timing") if test.status == "passed" else None
        item = next((i for i in plan.items if i.id == candidate.item_id), None)
        covered = [op for i in plan.items if i.status == "done" for op in i.ops]
        reference_ops = [op for i in plan.items for op in i.ops] + plan.unsupported_ops
        feedback = acted_on if previous is not None else None
        rubric = score_rubric(
            candidate,
            hack_report=hacks,
            compile_result=values.get("compile_result") if record.compiled else None,
            covered_ops=covered if test.status == "passed" else [],
            reference_ops=reference_ops,
            feedback_items=feedback.items if feedback else None,
            previous=previous if feedback else None,
        )
        samples.append(
            RoundSample(
                task_name=task.name,
                task_source=task.source,
                plan_item=item,
                previous_candidate=previous if feedback else None,
                feedback=feedback,
                candidate=candidate,
                test=test,
                timing=timing,
                hack_report=hacks,
                reward=compute_reward(test, timing, hacks, rubric, config),
            )
        )
        verdict: Feedback | None = values.get("feedback")
        acted_on = verdict if verdict and verdict.category in _FIX_CATEGORIES else None
        previous = candidate
    return samples


def samples_from_run(graph: Any, config: dict[str, Any], reward: RewardConfig | None = None):
    """Samples of the run that ``config``'s thread holds in ``graph``'s checkpointer."""
    snapshots = [s.values for s in graph.get_state_history(config)]
    return samples_from_history(list(reversed(snapshots)), reward)
