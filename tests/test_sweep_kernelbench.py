"""The KernelBench sweep's bookkeeping: speedups, per-level summaries, fast_p, rows read back."""

from __future__ import annotations

import math

import pytest

from tests.tool_scripts import load_tool


@pytest.fixture(scope="module")
def sweep():
    return load_tool("sweep_kernelbench")


ROWS = [
    {
        "problem": "level2/1_a",
        "correct": True,
        "max_err": 0.0,
        "eager_ms": 2.0,
        "ours_ms": 1.0,
        "compile_ms": 1.5,
        "reduce_overhead_ms": 0.5,
        "untuned_ms": 2.0,
        "declared": [],
    },
    {
        "problem": "level2/2_b",
        "correct": True,
        "max_err": 0.0,
        "eager_ms": 1.0,
        "ours_ms": 2.0,
        "compile_ms": 1.0,
        "reduce_overhead_ms": 1.0,
        "declared": ["dropout"],
    },
    {
        "problem": "level2/3_c",
        "correct": False,
        "max_err": 1.0,
        "eager_ms": 1.0,
        "ours_ms": 0.1,
        "compile_ms": 1.0,
        "reduce_overhead_ms": 1.0,
        "declared": [],
    },
    {"problem": "level2/4_d", "error": "worker died (exit code -11)"},
]


def test_summary_counts_wrong_and_failed_rows_against_fast_p(sweep):
    summary = sweep.summarize(ROWS)
    assert summary["problems"] == 4 and summary["correct"] == 2
    assert summary["partial"] == 1 and summary["errors"] == 1
    assert summary["fast_0"] == pytest.approx(0.5)
    # the wrong row's 10x is never counted
    assert summary["gmean_vs_eager"] == pytest.approx(math.sqrt(2.0 * 0.5))
    assert summary["gmean_vs_compile"] == pytest.approx(math.sqrt(1.5 * 0.5))
    assert summary["fast_1_vs_eager"] == pytest.approx(0.25)
    assert summary["fast_1_vs_reduce_overhead"] == 0.0
    assert summary["gmean_tuned_vs_untuned"] == pytest.approx(2.0)


def test_printed_rows_read_back_to_the_same_summary(sweep, tmp_path, capsys):
    for row in ROWS:
        sweep.print_row(row)
    printed = tmp_path / "part.txt"
    printed.write_text("# header\n" + capsys.readouterr().out)
    back = sweep.rows_from_output([printed])["level2"]
    assert [r["problem"] for r in back] == [r["problem"] for r in ROWS]
    ours, theirs = sweep.summarize(back), sweep.summarize(ROWS)
    for key in ("correct", "partial", "errors", "fast_1_vs_compile"):
        assert ours[key] == theirs[key]
    assert ours["gmean_vs_compile"] == pytest.approx(theirs["gmean_vs_compile"], rel=1e-3)


def test_problems_are_ordered_by_number_with_skip_and_limit(sweep, tmp_path):
    for name in ("10_x.py", "2_y.py", "1_z.py", "3_w.py"):
        (tmp_path / name).write_text("")
    files = sweep.problem_files([tmp_path], only="", limit=2, skip=1)
    assert [f.name for f in files] == ["2_y.py", "3_w.py"]


def test_ill_conditioned_rows_are_counted_apart_and_read_back(sweep, tmp_path, capsys):
    row = {**ROWS[2], "problem": "level3/24_e", "correct_f64": True}
    row |= {"compile_correct": False, "compile_max_err": 3e-3}
    summary = sweep.summarize([ROWS[0], row])
    assert summary["correct"] == 1 and summary["correct_f64"] == 1
    assert summary["gmean_vs_eager"] == pytest.approx(2.0)  # never in the speedups
    sweep.print_row(row)
    printed = tmp_path / "part.txt"
    printed.write_text(capsys.readouterr().out)
    assert " f64 " in printed.read_text()
    assert "torch.compile against eager: max err 3.0e-03, also outside" in printed.read_text()
    (back,) = sweep.rows_from_output([printed])["level3"]
    assert back["correct"] is False and back["correct_f64"] is True


def test_a_program_is_judged_against_float64_only_as_far_as_pytorch_is(sweep, monkeypatch):
    torch = pytest.importorskip("torch")

    class Cancelling(torch.nn.Module):  # float32 keeps rounding noise that float64 does not
        def forward(self, x):
            return (x + 1.0 - 1.0 - x) * 1e6

    class Exact(torch.nn.Module):
        def forward(self, x):
            return (x - x) * 1e6

    class Wrong(torch.nn.Module):
        def forward(self, x):
            return x * 1e6

    namespace = {"get_inputs": lambda: [torch.rand(4096) * 1e-3]}
    monkeypatch.setattr(sweep, "_draw", lambda torch, ns, seed: ns["get_inputs"]())
    exact = sweep._against_float64(torch, Cancelling(), Exact(), namespace)
    assert exact["eager_err_f64"] > 1e-4 and exact["correct_f64"] is True
    wrong = sweep._against_float64(torch, Cancelling(), Wrong(), namespace)
    assert wrong["ours_err_f64"] > 2 * wrong["eager_err_f64"] and wrong["correct_f64"] is False


def test_each_side_gets_its_own_copy_of_inputs_a_model_writes(sweep, monkeypatch):
    torch = pytest.importorskip("torch")

    class ClipsInPlace(torch.nn.Module):  # an optimiser step or a clip writes its inputs
        def forward(self, g):
            g.mul_(0.5)
            return g.sum()

    namespace = {"get_inputs": lambda: [torch.rand(64)]}
    monkeypatch.setattr(sweep, "_draw", lambda torch, ns, seed: ns["get_inputs"]())
    assert sweep._check(torch, ClipsInPlace(), ClipsInPlace(), namespace, 1e-4) == (True, 0.0)


def test_a_hung_baseline_keeps_the_programs_own_row(sweep):
    """The worker reported the program and eager, then hung in a baseline's compile: the row
    counts as correct against eager, with the baselines it never reached marked failed."""
    partial = {**ROWS[0], "seconds": 12.0}
    del partial["compile_ms"], partial["reduce_overhead_ms"]
    row = sweep.row_after_loss(partial, "no answer in 200 s")
    assert "error" not in row and row["compile_error"] == row["reduce_overhead_error"]
    summary = sweep.summarize([row])
    assert summary["correct"] == 1 and summary["n_vs_eager"] == 1
    assert summary["n_vs_compile"] == 0 and summary["n_vs_reduce_overhead"] == 0
    assert sweep.row_after_loss(None, "worker died (exit code -9)") == {
        "error": "worker died (exit code -9)"
    }


def test_a_problem_printed_again_later_keeps_its_latest_row(sweep, tmp_path, capsys):
    first, second = tmp_path / "a.txt", tmp_path / "b.txt"
    for row in ROWS:
        sweep.print_row(row)
    first.write_text(capsys.readouterr().out)
    faster = {**ROWS[0], "ours_ms": ROWS[0]["ours_ms"] / 2}
    sweep.print_row(faster)
    second.write_text(capsys.readouterr().out)
    back = sweep.rows_from_output([first, second])["level2"]
    assert sorted(r["problem"] for r in back) == sorted(r["problem"] for r in ROWS)
    again = next(r for r in back if r["problem"] == ROWS[0]["problem"])
    assert again["from"] == "b.txt"
    assert again["ours_ms"] == pytest.approx(faster["ours_ms"], rel=1e-3)


def test_a_row_says_why_an_emitter_fault_left_an_item_to_pytorch(sweep, tmp_path, monkeypatch):
    from stitch_graph.codegen.emit import _Emitter

    problem = tmp_path / "1_pool.py"
    problem.write_text(
        "import torch\nimport torch.nn.functional as F\n\n"
        "class Model(torch.nn.Module):\n"
        "    def forward(self, x):\n        return F.max_pool2d(x, 2)\n\n"
        "def get_inputs():\n    return [torch.randn(2, 3, 8, 8)]\n\n"
        "def get_init_inputs():\n    return []\n"
    )
    _task, _cand, info = sweep._generate(problem, tune=False)
    assert info["declared"] == [] and "left_to_pytorch" not in info

    def broken(self, *args):
        raise AttributeError("no such emitter")

    monkeypatch.setattr(_Emitter, "pool", broken)
    _task, _cand, info = sweep._generate(problem, tune=False)
    assert "max_pool2d" in info["declared"]
    assert info["left_to_pytorch"] == ["k0 left to PyTorch: AttributeError: no such emitter"]


def test_a_worker_whose_cuda_state_broke_retires_after_its_row(sweep, monkeypatch):
    """A failed graph capture or a sticky fault would make every later row of the process an
    error: the worker sends its row, marked, and exits, leaving the next job to a fresh one."""
    import queue

    monkeypatch.setattr(sweep, "measure", lambda path, **options: {"problem": path.name})
    monkeypatch.setattr(sweep, "_cuda_broken", lambda: "RuntimeError: offset increment")
    jobs, rows = queue.Queue(), queue.Queue()
    for name in ("a.py", "b.py"):
        jobs.put((name, {}))
    sweep._serve(jobs, rows)
    assert rows.get_nowait() == (
        "row",
        {"problem": "a.py", "worker_retired": "RuntimeError: offset increment"},
    )
    assert rows.empty()
    assert list(jobs.queue) == [("b.py", {})]  # left for the next worker

    monkeypatch.setattr(sweep, "_cuda_broken", lambda: "")
    jobs.put(None)
    sweep._serve(jobs, rows)
    assert rows.get_nowait() == ("row", {"problem": "b.py"})  # no mark: the worker goes on


def test_a_worker_that_still_holds_much_gpu_memory_retires_after_its_row(sweep, monkeypatch):
    """Compiled graphs' pools of earlier rows add up: a worker still holding a large share of
    the GPU's memory once the row's objects are freed leaves the next problem to a fresh one."""
    import queue

    monkeypatch.setattr(sweep, "measure", lambda path, **options: {"problem": path.name})
    monkeypatch.setattr(sweep, "_cuda_broken", lambda: "")
    monkeypatch.setattr(sweep, "_memory_held", lambda: "40.0 GiB of GPU memory still reserved")
    jobs, rows = queue.Queue(), queue.Queue()
    for name in ("a.py", "b.py"):
        jobs.put((name, {}))
    sweep._serve(jobs, rows)
    assert rows.get_nowait()[1]["worker_retired"].startswith("40.0 GiB")
    assert list(jobs.queue) == [("b.py", {})]
