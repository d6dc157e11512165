"""``stitch-graph bench``: discovery, durable rows and resume, the summary's arithmetic, the
reports, and whole sweeps on this GPU-less machine (graph and ``--candidates``)."""

from __future__ import annotations

import base64
import contextlib
import csv
import io
import json
import math
import shutil
from pathlib import Path

import pytest

from stitch_graph.bench import RowStore, find_problems, geomean, summarize, write_reports
from stitch_graph.bench.report import write_atomic
from stitch_graph.cli import main
from stitch_graph.execution import gpu_available
from tests.tool_scripts import load_tool

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "tests" / "fixtures" / "verify_corpus"
MACHINE = {"host": "h1", "gpu": "NVIDIA H200", "torch": "2.11", "cuda": "13.0"}


def _run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def _rows(folder: Path) -> list[dict]:
    return [
        json.loads(line)
        for line in (folder / "rows.jsonl").read_text().splitlines()
        if "problem" in json.loads(line)
    ]


def test_problems_are_found_in_subfolders_in_numeric_order(tmp_path):
    for name in ("level1/10_b.py", "level1/2_a.py", "level2/1_c.py", "level1/_helper.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    found = [str(p.relative_to(tmp_path)) for p in find_problems(tmp_path)]
    assert found == ["level1/2_a.py", "level1/10_b.py", "level2/1_c.py"]
    assert [p.name for p in find_problems(tmp_path, ["level2"])] == ["1_c.py"]


def test_rows_survive_a_torn_line_and_a_new_host_keeps_them(tmp_path):
    store = RowStore(tmp_path, MACHINE)
    store.add({"problem": "l1/a.py", "outcome": "verified"})
    store.add({"problem": "l1/b.py", "outcome": "error"})
    with open(store.path, "a") as stream:
        stream.write('{"problem": "l1/c.py", "outc')  # killed mid-write
    again = RowStore(tmp_path, {**MACHINE, "host": "h2"})
    assert sorted(r["problem"] for r in again.rows) == ["l1/a.py", "l1/b.py"]
    assert again.done() == {"l1/a.py", "l1/b.py"}
    assert again.done(retry_errors=True) == {"l1/a.py"}
    change = again.machine_change()
    assert change is not None and "'h1' -> 'h2'" in change and "2 rows are kept" in change
    assert RowStore(tmp_path, MACHINE).machine_change() is None


def test_a_problem_run_again_replaces_its_row(tmp_path):
    store = RowStore(tmp_path, MACHINE)
    store.add({"problem": "a.py", "outcome": "error"})
    store.add({"problem": "a.py", "outcome": "verified"})
    assert [r["outcome"] for r in RowStore(tmp_path, MACHINE).rows] == ["verified"]


def _timed(problem: str, ours: float, eager: float, compile_: float, correct=True) -> dict:
    return {
        "problem": problem,
        "outcome": "verified" if correct else "failed",
        "correct": correct,
        "candidate_ms": ours,
        "eager_ms": eager,
        "compile_ms": compile_,
        "best_per_round": [eager / ours / 2, eager / ours],
        "time_spent": {"build": 1.0, "test": 2.0},
    }


def test_summary_counts_fast_p_over_all_problems_and_geomeans_over_correct_ones():
    rows = [
        _timed("level1/a.py", 1.0, 3.0, 1.0),  # 3x eager, 1x compile
        _timed("level1/b.py", 1.0, 1.2, 0.5),  # 1.2x eager
        _timed("level1/c.py", 1.0, 9.0, 9.0, correct=False),  # fast but wrong: never counted
        _timed("level2/d.py", 2.0, 1.0, 1.0),  # 0.5x
    ]
    summary = summarize(rows)
    level1 = summary["groups"]["level1"]
    assert level1["problems"] == 3 and level1["correct"] == 2
    assert math.isclose(level1["success_rate"], 2 / 3)
    assert level1["fast_p"]["eager"] == pytest.approx(
        {"0": 2 / 3, "1": 2 / 3, "1.5": 1 / 3, "2": 1 / 3}
    )
    assert math.isclose(level1["geomean"]["eager"], math.sqrt(3.0 * 1.2))
    assert level1["geomean"]["reduce_overhead"] is None  # never timed
    assert summary["all"]["fast_p"]["compile"]["1"] == 0  # 1.0x is not faster
    assert summary["groups"]["level2"]["geomean"]["eager"] == 0.5
    assert summary["gpu"] is True and summary["note"] == ""


def test_without_a_gpu_the_summary_says_so_and_rates_nothing():
    rows = [{"problem": "a/x.py", "outcome": "compiled_only", "correct": None}]
    summary = summarize(rows, gpu=False)
    assert summary["gpu"] is False and "no GPU" in summary["note"]
    assert summary["all"]["success_rate"] is None
    assert summary["all"]["compiled_only"] == 1


def test_geomean_skips_missing_values():
    assert math.isclose(geomean([2.0, 8.0, None]), 4.0)
    assert geomean([None]) is None


def test_reports_are_json_csv_and_html_with_four_embedded_plots(tmp_path):
    rows = [_timed("level1/a.py", 1.0, 3.0, 1.5), _timed("level2/b.py", 1.0, 0.8, 0.9)]
    for row in rows:
        row.update(vs_eager=row["eager_ms"], vs_compile=row["compile_ms"])
    summary = summarize(rows)
    files = write_reports(tmp_path, rows, summary, MACHINE)
    data = json.loads(files["json"].read_text())
    assert data["summary"]["all"]["problems"] == 2 and len(data["rows"]) == 2
    table = list(csv.DictReader(files["csv"].open()))
    assert [r["problem"] for r in table] == ["level1/a.py", "level2/b.py"]
    assert table[0]["vs_eager"] == "3.0"
    page = files["html"].read_text()
    images = page.split("src='data:image/png;base64,")[1:]
    assert len(images) == 4  # distribution, per group, rounds, time
    assert all(base64.b64decode(i.split("'", 1)[0])[:4] == b"\x89PNG" for i in images)
    assert "Where the time went" in page
    assert "src='http" not in page and "<script" not in page  # opens offline


def test_atomic_write_leaves_no_temporary_file(tmp_path):
    write_atomic(tmp_path / "bench.json", "{}")
    assert [p.name for p in tmp_path.iterdir()] == ["bench.json"]


@pytest.fixture
def suite(tmp_path):
    """Two problems of the project's suite in two groups."""
    root = tmp_path / "suite"
    for rel in ("elementwise/01_swish_scale_shift.py", "norm/02_rms_norm.py"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / "problems" / rel, root / rel)
    return root


@pytest.mark.skipif(gpu_available(), reason="checks the GPU-less sweep; tests/gpu covers GPUs")
def test_a_sweep_without_gpu_builds_every_program_and_resumes_where_it_stopped(suite, tmp_path):
    out = tmp_path / "out"
    argv = ["bench", str(suite), "--out", str(out), "--no-knowledge", "--max-rounds", "2"]
    code, stdout, stderr = _run(argv)
    assert code == 0, stderr
    rows = _rows(out)
    assert sorted(r["problem"] for r in rows) == [
        "elementwise/01_swish_scale_shift.py",
        "norm/02_rms_norm.py",
    ]
    assert {r["outcome"] for r in rows} == {"compiled_only"}
    assert all(r["rounds"] >= 1 and r["time_spent"].get("build") for r in rows)
    report = json.loads((out / "bench.json").read_text())
    assert report["summary"]["gpu"] is False and "no GPU" in report["summary"]["note"]
    assert (out / "bench.csv").exists() and (out / "report.html").exists()
    assert "reports:" in stdout

    lines = (out / "rows.jsonl").read_text().splitlines()
    (out / "rows.jsonl").write_text("\n".join(lines[:2]) + "\n")  # killed after one problem
    kept = json.loads(lines[1])["problem"]
    code, _, stderr = _run(argv)
    assert code == 0
    assert "2 problems, 1 already done; running 1" in stderr
    rows = _rows(out)
    assert len(rows) == 2 and rows[0]["problem"] == kept  # the kept row was not run again


def test_candidates_are_checked_with_the_verify_protocol(tmp_path):
    suite = tmp_path / "suite"
    shutil.copytree(CORPUS / "problems", suite / "lvl")
    shutil.copy(CORPUS / "problems" / "bias_relu.py", suite / "lvl" / "no_candidate.py")
    candidates = tmp_path / "candidates" / "lvl"
    candidates.mkdir(parents=True)
    shutil.copy(CORPUS / "honest" / "cupy_rawkernel.py", candidates / "bias_relu.py")
    shutil.copy(CORPUS / "hacks" / "tf32_switch.py", candidates / "linear_relu.py")
    out = tmp_path / "out"
    code, _, stderr = _run(
        ["bench", str(suite), "--candidates", str(tmp_path / "candidates"), "--out", str(out)]
    )
    assert code == 0, stderr
    rows = {r["problem"]: r for r in _rows(out)}
    assert rows["lvl/linear_relu.py"]["outcome"] == "rejected"
    assert any("precision_downgrade" in r for r in rows["lvl/linear_relu.py"]["reasons"])
    if not gpu_available():
        assert rows["lvl/bias_relu.py"]["outcome"] == "compiled_only"
    others = [
        r for name, r in rows.items() if name not in ("lvl/bias_relu.py", "lvl/linear_relu.py")
    ]
    assert others and all(
        r["outcome"] == "missing" and "no candidate" in r["error"] for r in others
    )


def test_a_missing_suite_is_answered_with_the_fix(tmp_path):
    code, _, stderr = _run(["bench", str(tmp_path / "nowhere")])
    assert code == 2 and "not a folder" in stderr and "Fix:" in stderr


def test_report_only_rewrites_reports_from_the_rows(tmp_path, suite):
    out = tmp_path / "out"
    store = RowStore(out, MACHINE)
    store.add(
        {**_timed("elementwise/01_swish_scale_shift.py", 1.0, 2.0, 1.0), "group": "elementwise"}
    )
    code, _, stderr = _run(["bench", str(suite), "--out", str(out), "--report-only"])
    assert code == 0, stderr
    summary = json.loads((out / "bench.json").read_text())["summary"]
    assert summary["all"]["geomean"]["eager"] == 2.0
    assert "another machine" in " ".join(summary["notes"])  # written on h1, read here


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs an NVIDIA GPU")
def test_baselines_time_all_four_sides_on_a_gpu(tmp_path):
    from stitch_graph.bench import time_baselines
    from stitch_graph.execution import RunSettings
    from stitch_graph.task import load_task

    task = load_task(str(ROOT / "problems" / "conv" / "01_conv2d_relu.py"))
    out = time_baselines(task, RunSettings(work_dir=str(tmp_path)))
    assert "baseline_error" not in out, out
    for side in ("eager", "eager_default_flags", "compile", "reduce_overhead"):
        assert out[f"{side}_ms"] and out[f"{side}_ms"] > 0, (side, out)



def test_the_docs_tables_and_the_executor_comparison():
    tables = load_tool("bench_tables")
    rows = [_timed("level1/a.py", 1.0, 3.0, 1.5), _timed("level1/b.py", 2.0, 2.0, 2.0)]
    for start, row in enumerate(rows):
        row.update(seconds=10.0, finished=100.0 + 20 * start)
    data = {"machine": MACHINE, "summary": summarize(rows), "rows": rows}
    text = tables.table(data)
    assert "| level1 | 2 | 2 | 1.00 |" in text and "| all |" in text
    slower = [{**r, "candidate_ms": r["candidate_ms"] * 1.1, "outcome": "verified"} for r in rows]
    slower[1]["outcome"] = "failed"
    report = tables.compare(data, {"rows": slower})
    assert "outcome differs: 1 ['level1/b.py']" in report
    assert "wall time: 30 s" in report and "1.100" in report


def test_ray_without_the_package_says_how_to_install_it(tmp_path, suite, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_ray(name, *args, **kwargs):
        if name == "ray" or name.startswith("ray."):
            raise ImportError("No module named 'ray'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_ray)
    code, _, stderr = _run(["bench", str(suite), "--out", str(tmp_path / "o"), "--ray", "local"])
    assert code == 2 and "pip install 'stitch-graph[ray]'" in stderr


class _AnsweringExecutor:
    """Answers every job with ``result``, keeping the jobs it was given."""

    def __init__(self, result: dict):
        self.result, self.jobs = result, []

    def submit(self, job):
        from concurrent.futures import Future

        from stitch_graph.execution import JobResult

        self.jobs.append(job)
        done = Future()
        done.set_result(JobResult(status="ok", result=self.result, seconds=3.0, gpu="2"))
        return done

    def shutdown(self):
        pass


def test_baselines_ask_the_reference_worker_for_all_four_sides_in_fp32(tmp_path):
    from stitch_graph.artifacts import Task
    from stitch_graph.bench import time_baselines
    from stitch_graph.execution import RunSettings

    answer = {"eager_ms": 2.0, "eager_default_flags_ms": 0.8, "compile_ms": 1.5}
    answer.update(reduce_overhead_ms=None, reduce_overhead_error="RuntimeError: graphs")
    executor = _AnsweringExecutor(answer)
    task = Task(name="t", source=(CORPUS / "problems" / "bias_relu.py").read_text())
    out = time_baselines(task, RunSettings(work_dir=str(tmp_path)), executor=executor)
    payload = executor.jobs[0].payload
    assert executor.jobs[0].kind == "reference" and payload["allow_tf32"] is False
    assert payload["reduce_overhead"] is True and payload["default_flags_eager"] is True
    assert out["eager_ms"] == 2.0 and out["eager_default_flags_ms"] == 0.8
    assert out["reduce_overhead_ms"] is None and "graphs" in out["reduce_overhead_error"]
    assert out["baseline_gpu"] == "2" and out["baseline_seconds"] == 3.0


def test_the_baselines_worker_is_the_runs_reference_and_is_never_taken_from_a_cache(tmp_path):
    from stitch_graph.artifacts import Task
    from stitch_graph.bench import time_baselines
    from stitch_graph.execution import RunSettings
    from stitch_graph.execution.reference import ensure_reference

    executor = _AnsweringExecutor({"eager_ms": 2.0, "compile_ms": 1.5})
    task = Task(name="t", source=(CORPUS / "problems" / "bias_relu.py").read_text())
    settings = RunSettings(work_dir=str(tmp_path))
    time_baselines(task, settings, executor=executor)
    reference = ensure_reference(task, settings, executor=executor)  # what the Verifier asks
    assert len(executor.jobs) == 1 and reference.meta["eager_ms"] == 2.0
    time_baselines(task, settings, executor=executor)  # a later run times its own baselines
    assert len(executor.jobs) == 2


def test_the_planners_timeline_comes_from_the_runs_reference_worker(tmp_path, monkeypatch):
    """A graph run's baselines worker also profiles the forward for the Planner, so the
    Planner's timeline and the Verifier's reference start no worker of their own; a cached
    reference without a timeline is run again when one is asked for."""
    from stitch_graph.artifacts import Task
    from stitch_graph.bench import time_baselines
    from stitch_graph.execution import RunSettings, profiling
    from stitch_graph.execution.placement import RunnerOn
    from stitch_graph.execution.reference import ensure_reference

    timeline = {"hotspots": [{"op": "aten::relu", "cuda_time_us": 4.0, "share": 1.0}]}
    timeline.update(busy_us=4.0, gap_us=12.0, span_us=16.0, kernels_per_forward=2.0)
    executor = _AnsweringExecutor({"eager_ms": 2.0, "compile_ms": 1.5, "timeline": timeline})
    task = Task(name="t", source=(CORPUS / "problems" / "bias_relu.py").read_text())
    settings = RunSettings(work_dir=str(tmp_path))
    time_baselines(task, settings, executor=executor, timeline=5)
    assert executor.jobs[0].payload["timeline_iterations"] == 5
    monkeypatch.setattr(profiling, "gpu_available", lambda: True)
    report = RunnerOn(executor).reference_timeline(task, settings)
    assert report.status == "passed" and report.hotspots[0].op == "aten::relu"
    assert report.bottleneck == "launch" and abs(report.headroom - 0.75) < 1e-9
    ensure_reference(task, settings, executor=executor)  # the Verifier's ask
    assert len(executor.jobs) == 1

    plain = _AnsweringExecutor({"eager_ms": 2.0, "compile_ms": 1.5})
    other = RunSettings(work_dir=str(tmp_path / "other"))
    ensure_reference(task, other, executor=plain)
    assert "timeline_iterations" not in plain.jobs[0].payload
    ensure_reference(task, other, executor=plain, timeline=5)
    assert len(plain.jobs) == 2 and plain.jobs[1].payload["timeline_iterations"] == 5


def test_a_run_report_becomes_a_row_with_rounds_and_time_spent():
    from stitch_graph.artifacts import (
        BestProgram,
        Candidate,
        RoundRecord,
        RunReport,
        TestResult,
        TimingResult,
    )
    from stitch_graph.bench import add_speedups, row_from_report

    best = BestProgram(
        round=2,
        candidate=Candidate(kernel_source="", host_source=""),
        test=TestResult(status="passed"),
        timing=TimingResult(status="passed", candidate_ms=0.5, eager_ms=1.0, compile_ms=0.75),
    )
    history = [
        RoundRecord(round=1, test="failed", steps={"build": 1.0}),
        RoundRecord(round=2, test="passed", speedup_vs_eager=1.5, steps={"build": 2.0, "test": 1}),
        RoundRecord(round=3, test="passed", speedup_vs_eager=1.2, steps={"test": 1.0}),
    ]
    report = RunReport(task="t", outcome="verified", rounds=3, best=best, summary="ok")
    row = row_from_report("level1/t.py", report, history, seconds=12.345, host="h")
    assert row["group"] == "level1" and row["correct"] is True and row["rounds"] == 3
    assert row["best_per_round"] == [None, 1.5, 1.5]
    assert row["time_spent"] == {"build": 3.0, "test": 2.0}
    row["eager_ms"] = 2.0  # from the baseline worker
    assert add_speedups(row)["vs_eager"] == 4.0 and row["vs_compile"] is None
