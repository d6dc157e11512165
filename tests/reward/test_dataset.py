"""Training data as one dataset: chat prompts, two splits that ``datasets`` loads from Parquet
and from JSONL, a dataset card, and ``stitch-graph export-data`` over a real run."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from stitch_graph.artifacts import (
    Candidate,
    Feedback,
    FeedbackItem,
    HackFinding,
    TestResult,
    TimingResult,
    TodoItem,
)
from stitch_graph.checks import HackReport
from stitch_graph.cli import main
from stitch_graph.reward import RoundSample, RubricScores, compute_reward, write_dataset
from stitch_graph.toolchain.nvcc import find_nvcc

datasets = pytest.importorskip("datasets")

ROOT = Path(__file__).resolve().parents[2]
PROBLEM = ROOT / "tests" / "fixtures" / "verify_corpus" / "problems" / "bias_relu.py"
RUBRIC = RubricScores(anti_hacking=1, cuda_engineering=0.5, coverage=1, skill_compliance=1)


def _sample(tag: str, *, previous: Candidate | None = None, hack: bool = False) -> RoundSample:
    candidate = Candidate(
        kernel_source=f'extern "C" __global__ void k_{tag}(float* y) {{ y[0] = 1.f; }}\n',
        host_source=f"class ModelNew:  # {tag}\n    pass\n",
    )
    report = HackReport(findings=[HackFinding(rule="output_cache", detail="x")] if hack else [])
    test = TestResult(status="passed")
    timing = TimingResult(status="passed", candidate_ms=1.0, eager_ms=3.0, compile_ms=2.0)
    feedback = None
    if previous is not None:
        items = [FeedbackItem(action="vectorize loads", detail="float4")]
        feedback = Feedback(
            target="coder", category="bottleneck", summary="memory-bound", items=items
        )
    return RoundSample(
        task_name="bias_relu",
        task_source=PROBLEM.read_text(),
        plan_item=TodoItem(id="k1", kernel="bias_relu", ops=["add", "relu"], kind="pointwise"),
        previous_candidate=previous,
        feedback=feedback,
        candidate=candidate,
        test=test,
        timing=timing,
        hack_report=report,
        reward=compute_reward(test, timing, report, RUBRIC),
    )


def test_two_splits_load_from_parquet_and_jsonl(tmp_path):
    first = _sample("a")
    samples = [first, _sample("b", previous=first.candidate), _sample("c", hack=True)]
    report = write_dataset(samples, tmp_path / "ds")
    assert report.counts == {"write_from_task": 2, "improve_from_feedback": 1}
    folder = tmp_path / "ds"
    card = (folder / "README.md").read_text()
    assert card.startswith("---\nconfigs:\n") and "split: improve_from_feedback" in card
    assert "### skill_compliance" in card  # the rubric criteria are documented
    loaded = datasets.load_dataset(str(folder))
    assert set(loaded) == {"write_from_task", "improve_from_feedback"}
    assert loaded["write_from_task"].num_rows == 2
    improve = loaded["improve_from_feedback"][0]
    assert [m["role"] for m in improve["prompt"]] == ["system", "user"]
    assert "vectorize loads: float4" in improve["prompt"][1]["content"]
    assert "k_a" in improve["prompt"][1]["content"]  # the previous program is shown
    assert improve["completion"][0]["role"] == "assistant"
    assert "```cuda" in improve["completion"][0]["content"]
    assert improve["reward"] == pytest.approx(samples[1].reward.value) and improve["reward"] > 0
    hacks = [r for r in loaded["write_from_task"] if r["hacked"]]
    assert (
        len(hacks) == 1 and hacks[0]["reward"] == 0.0 and hacks[0]["hack_rules"] == ["output_cache"]
    )
    jsonl = {s: str(folder / "data" / f"{s}.jsonl") for s in report.counts}
    again = datasets.load_dataset("json", data_files=jsonl)
    assert again["improve_from_feedback"][0]["prompt"] == improve["prompt"]
    assert json.loads(improve["reward_breakdown"])["value"] == improve["reward"]


def test_hacks_can_be_left_out_and_an_empty_export_is_refused(tmp_path):
    report = write_dataset(
        [_sample("a"), _sample("h", hack=True)], tmp_path / "a", include_hacks=False
    )
    assert report.counts["write_from_task"] == 1 and report.hacks_skipped == 1
    card = (tmp_path / "a" / "README.md").read_text()
    assert "improve_from_feedback.parquet" not in card  # an empty split stays out of configs
    with pytest.raises(ValueError, match="no samples"):
        write_dataset([], tmp_path / "b")


def _run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def test_export_data_of_a_bad_run_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _, err = _run(["export-data", str(tmp_path), "--out", "ds"])
    assert code == 2 and "no checkpoints.sqlite" in err


@pytest.mark.skipif(find_nvcc() is None, reason="the rule-based run needs nvcc")
def test_export_data_of_a_finished_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = _run(
        ["optimize", str(PROBLEM), "--out", "runs/br", "--no-knowledge", "--no-profile", "--quiet"]
    )
    assert code == 0, out + err
    code, out, err = _run(["export-data", "runs/br", "--out", "ds"])
    assert code == 0, err
    assert "write_from_task: 1 rows" in out
    loaded = datasets.load_dataset(str(tmp_path / "ds"))
    row = loaded["write_from_task"][0]
    assert row["task"] == "bias_relu" and row["skill"] == "write_from_task"
    assert "class Model" in row["problem"] and "__global__" in row["completion"][0]["content"]
