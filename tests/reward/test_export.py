"""Training-data export: two JSONL files, right counts, valid JSON, hacks as negatives."""

from __future__ import annotations

import json
from pathlib import Path

from stitch_graph.artifacts import (
    Candidate,
    Feedback,
    FeedbackItem,
    HackFinding,
    Task,
    TestResult,
    TimingResult,
    TodoItem,
)
from stitch_graph.checks import HackReport
from stitch_graph.reward import (
    IMPROVE_FILE,
    WRITE_FILE,
    RewardConfig,
    RoundSample,
    RubricScores,
    compute_reward,
    export_training_data,
    write_task_samples,
)

TASK = Task(name="add_relu", source="class Model: ...\n")
ITEM = TodoItem(id="k1", kernel="add_relu", ops=["add", "relu"], kind="pointwise")
RUBRIC = RubricScores(anti_hacking=1, cuda_engineering=0.5, coverage=1, skill_compliance=1)


def _cand(tag: str) -> Candidate:
    return Candidate(kernel_source=f"// {tag}\n", host_source=f"# {tag}\n", item_id="k1")


def _sample(
    tag: str, *, previous: Candidate | None = None, hack: bool = False, passed: bool = True
) -> RoundSample:
    report = HackReport(
        findings=[HackFinding(rule="output_cache", detail="cached")] if hack else []
    )
    test = TestResult(status="passed" if passed else "failed")
    timing = TimingResult(status="passed", candidate_ms=1.0, compile_ms=2.0, eager_ms=3.0)
    feedback = (
        Feedback(
            target="coder",
            category="bottleneck",
            items=[FeedbackItem(action="vectorize loads")],
        )
        if previous
        else None
    )
    return RoundSample(
        task_source=TASK.source,
        plan_item=ITEM,
        previous_candidate=previous,
        feedback=feedback,
        candidate=_cand(tag),
        test=test,
        timing=timing,
        hack_report=report,
        reward=compute_reward(test, timing, report, RUBRIC, RewardConfig()),
    )


def _read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _history() -> list[RoundSample]:
    first = _sample("v1")
    return [
        first,
        _sample("v2", previous=first.candidate),
        _sample("v3", previous=_cand("v2"), hack=True),
        _sample("v4", previous=_cand("v3"), passed=False),
        _sample("fresh", hack=True),
    ]


def test_export_writes_both_files(tmp_path: Path) -> None:
    report = export_training_data(_history(), tmp_path / "out")
    write = _read(tmp_path / "out" / WRITE_FILE)
    improve = _read(tmp_path / "out" / IMPROVE_FILE)
    assert report.counts == {"write_from_task": 2, "improve_from_feedback": 3}
    assert report.total == 5 and report.hacks_written == 2
    assert len(write) == 2 and len(improve) == 3

    assert write[0]["skill"] == "write_from_task"
    assert write[0]["prompt"]["plan_item"]["id"] == "k1"
    assert "previous_candidate" not in write[0]["prompt"]
    assert write[0]["response"]["kernel_source"] == "// v1\n"
    assert write[0]["reward"] > 0 and write[0]["hack"] is None

    assert improve[0]["prompt"]["previous_candidate"]["kernel_source"] == "// v1\n"
    assert improve[0]["prompt"]["feedback"]["items"][0]["action"] == "vectorize loads"
    hacked = improve[1]
    assert hacked["reward"] == 0.0 and hacked["hack"]["rules"] == ["output_cache"]
    assert improve[2]["reward"] == 0.0 and improve[2]["test"] == "failed"
    assert write[1]["hack"] is not None


def test_export_can_drop_hacks(tmp_path: Path) -> None:
    report = export_training_data(_history(), tmp_path, include_hacks=False)
    assert report.counts == {"write_from_task": 1, "improve_from_feedback": 2}
    assert report.hacks_skipped == 2
    for name in (WRITE_FILE, IMPROVE_FILE):
        assert all(r["hack"] is None for r in _read(tmp_path / name))


def test_empty_export_still_creates_files(tmp_path: Path) -> None:
    report = export_training_data([], tmp_path)
    assert report.total == 0
    assert (tmp_path / WRITE_FILE).read_text() == ""
    assert (tmp_path / IMPROVE_FILE).read_text() == ""


def test_write_task_samples_appends_and_fills_task(tmp_path: Path) -> None:
    history = [s.model_copy(update={"task_source": "", "task_name": ""}) for s in _history()]
    write_task_samples(history[:2], TASK, tmp_path)
    write_task_samples(history[2:], TASK, tmp_path)
    write = _read(tmp_path / WRITE_FILE)
    improve = _read(tmp_path / IMPROVE_FILE)
    assert len(write) == 2 and len(improve) == 3
    assert {r["task"] for r in write + improve} == {"add_relu"}
    assert all(r["prompt"]["task_source"] == TASK.source for r in write + improve)
