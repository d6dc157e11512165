"""Sweep whole KernelBench levels: the generated program against eager and both torch.compile modes.

For every problem of the given level folders (fetched for evaluation; never part of this
repository), in the same run on the same GPU and the same inputs:

- the rule-based generator's program (capture, plan, emit; tuned when ``--tune``),
- PyTorch eager, ``torch.compile`` (default mode) and ``torch.compile(mode="reduce-overhead")``,

each timed with the Verifier's rules (CUDA events, warm-up, L2 flushed and inputs refilled in
place before every run, median of ``--runs``), except that a timing's warm-up lasts
``--warmup-s`` (0.05 s) at least instead of 0.2 s: the sweep keeps the GPU busy throughout. The program is judged on three fresh draws at
atol = rtol = ``--tol`` with TF32 off on both sides. A program wrong at that tolerance is judged
once more against PyTorch's float64 forward: ``f64`` in the ``ok`` column when it is no farther
from it than PyTorch's own float32 (an ill-conditioned model), counted apart from the correct.

Two phases keep a level inside minutes. ``--warm N`` first runs N processes in parallel that
capture, emit and build each program and compile each reference in both modes once, so Inductor's
and Triton's on-disk caches are warm; then one worker times problem after problem. The timing
worker is replaced after a crash or a hang, so a bad problem costs one row; one that hangs in a
baseline's compile keeps the program's own timing, with the baselines not reached left blank.

Prints one row per problem, then per level: geometric means of the speedups over the correct rows
against eager, compile and reduce-overhead, and KernelBench's fast_0 / fast_1 (share of all
problems that are correct / correct and faster than the baseline). ``--json FILE`` keeps the rows
(and ``FILE.rows.jsonl`` each row as it comes, so a run cut short keeps what it measured);
``--summarize OUTPUT...`` reads printed sweeps back (parts of one level joined, a problem's
latest row kept) and prints the summaries and the slowest rows against torch.compile.

Usage: ``PYTHONPATH=src python tools/sweep_kernelbench.py LEVEL_DIR [LEVEL_DIR ...] [--warm 12]
[--only TEXT] [--skip N] [--limit N] [--timeout 180] [--runs 20] [--warmup-s 0.05] [--tol 1e-4]
[--tune] [--json FILE]``
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import multiprocessing
import os
import queue
import signal
import subprocess
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

SIDES = ("eager", "ours", "compile", "reduce_overhead")


# ----------------------------------------------------------------------------------------------
# One problem (runs inside a worker process)


def _setup_torch() -> Any:
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_grad_enabled(False)
    return torch


def _namespace(source: str, path: Path) -> dict[str, Any]:
    from stitch_graph.runtime.problem_source import exec_problem

    return exec_problem(source, str(path), f"kb_{path.stem}")  # the problem under test


def _draw(torch: Any, namespace: dict[str, Any], seed: int) -> list[Any]:
    torch.manual_seed(seed)
    with torch.device("cuda"):
        return [x.cuda() if torch.is_tensor(x) else x for x in namespace["get_inputs"]()]


def _outputs(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else [value]


def _generate(
    path: Path, tune: bool, tune_budget: float = 30.0, exact_order: bool = False
) -> tuple[Any, Any, dict[str, Any]]:
    """Task, candidate and notes (kernels, declared ops, tuning, the rewrites that reordered a
    sum) of the generated program."""
    from stitch_graph.codegen import capture_program, emit_candidate, plan_program
    from stitch_graph.task import load_task

    task = load_task(str(path))
    ir = capture_program(task, exact_order=exact_order)
    plan = plan_program(ir)
    candidate = emit_candidate(ir, plan)
    info: dict[str, Any] = {"kernels": len(plan.items), "reordered": ir.reordered}
    if tune:
        from stitch_graph.execution.autotune import tune_program

        try:
            tuned, _tuning, report = tune_program(task, ir, plan, budget_s=tune_budget)
            info["tuning"] = report.model_dump()
            info["untuned"] = candidate
            candidate = tuned
        except Exception as error:  # noqa: BLE001 - the untuned program is measured instead
            info["tune_error"] = f"{type(error).__name__}: {error}"[:200]
    info["declared"] = list(candidate.declared_torch_ops)
    # why an item the plan generates was left to PyTorch after all (an emitter fault)
    left = [n.strip() for n in candidate.notes.split(";") if " left to PyTorch: " in n]
    if left:
        info["left_to_pytorch"] = left
    return task, candidate, info


def _build(
    torch: Any, task: Any, candidate: Any, namespace: dict[str, Any], reference: Any = None
) -> tuple[Any, Any]:
    """The reference (built seeded unless given) and the candidate with its weights.

    The reference draws its weights on the GPU (``build_on``): the candidate is judged against
    it holding the same weights, and a CPU draw takes about a second a gigabyte (KernelBench L2
    55's 4.3 GB linear weight took seconds a build)."""
    from stitch_graph.execution._common import build_on, load_module_state, module_state
    from stitch_graph.runtime.kernels import KernelLibrary

    init = list(task.init_args) or list(namespace.get("get_init_inputs", list)())
    if reference is None:
        torch.manual_seed(0)
        reference = build_on(namespace["Model"], init, "cuda")
    host: dict[str, Any] = {"KERNELS": KernelLibrary(candidate.kernel_source), "__name__": "ours"}
    exec(compile(candidate.host_source, "<generated host>", "exec"), host)  # noqa: S102
    ours = build_on(host["ModelNew"], init, "cuda")  # its weights are the reference's
    load_module_state(ours, module_state(reference))
    ours.train(reference.training)
    return reference, ours


def _check(
    torch: Any, reference: Any, ours: Any, namespace: dict, tol: float
) -> tuple[bool, float]:
    worst, ok = 0.0, True
    for trial in range(3):
        args = _draw(torch, namespace, 1000 + trial)
        # the same seed before each side's forward: draws made in forward (an LSTM's random
        # initial state, training dropout) are then the same on both sides
        torch.manual_seed(2000 + trial)
        expected = _outputs(reference(*_copies(torch, args)))
        torch.manual_seed(2000 + trial)
        got = _outputs(ours(*_copies(torch, args)))
        if len(expected) != len(got):
            return False, math.inf
        for e, g in zip(expected, got, strict=True):
            if not torch.is_tensor(e):
                ok &= e == g
                continue
            if e.shape != g.shape or e.dtype != g.dtype:
                return False, math.inf
            close, error = _compare(torch, e, g, tol)
            ok &= close
            worst = max(worst, error)
    return ok, worst


def _against_float64(torch: Any, reference: Any, ours: Any, namespace: dict) -> dict[str, Any]:
    """For a program that missed the tolerance: the largest errors of PyTorch's float32 forward
    and of the program against PyTorch's float64 forward, on one draw.

    Some models amplify rounding (a norm over a batch's two values): PyTorch's own float32
    output is then far from the exact answer, and no float32 program can match it at 1e-4.
    Such a program counts as ``correct_f64`` when it is at most twice as far from the float64
    answer as PyTorch's float32 is; it is never counted as correct at the tolerance."""
    import copy

    args = _draw(torch, namespace, 1000)
    try:
        exact_model = copy.deepcopy(reference).double()
        torch.manual_seed(3000)  # as in _check: the same draws in every forward
        exact = _outputs(exact_model(*[a.double() if _floating(torch, a) else a for a in args]))
        del exact_model
        torch.manual_seed(3000)
        fp32 = _outputs(reference(*_copies(torch, args)))
        torch.manual_seed(3000)
        got = _outputs(ours(*_copies(torch, args)))
    except Exception as error:  # noqa: BLE001 - no float64 forward: no second opinion
        return {"f64_error": f"{type(error).__name__}: {error}"[:160]}
    if not (len(exact) == len(fp32) == len(got)) or not all(map(torch.is_tensor, exact)):
        return {}
    torch_err = max(_compare(torch, e, f, 0.0)[1] for e, f in zip(exact, fp32, strict=True))
    ours_err = max(_compare(torch, e, g, 0.0)[1] for e, g in zip(exact, got, strict=True))
    return {
        "eager_err_f64": torch_err,
        "ours_err_f64": ours_err,
        "correct_f64": math.isfinite(ours_err) and ours_err <= 2 * torch_err,
    }


def _copies(torch: Any, args: list[Any]) -> list[Any]:
    """The inputs of one forward: a model that writes into its inputs (an optimiser step, a
    gradient clipped in place) leaves the next side the draw it was given."""
    return [a.clone() if torch.is_tensor(a) else a for a in args]


def _floating(torch: Any, value: Any) -> bool:
    return torch.is_tensor(value) and value.is_floating_point()


def _compare(torch: Any, expected: Any, got: Any, tol: float) -> tuple[bool, float]:
    """``allclose`` and the largest absolute error, a slice at a time: whole-tensor temporaries
    in float64 (or the indices of a boolean mask) of a multi-gigabyte output would not fit."""
    flat_e, flat_g = expected.reshape(-1), got.reshape(-1)
    ok, worst, step = True, 0.0, 1 << 26
    for start in range(0, flat_e.numel(), step):
        e, g = flat_e[start : start + step].double(), flat_g[start : start + step].double()
        diff = torch.where(e.isnan() & g.isnan(), 0.0, (e - g).abs().nan_to_num(nan=math.inf))
        worst = max(worst, float(diff.max()))
        ok &= bool(torch.allclose(e, g, atol=tol, rtol=tol, equal_nan=True))
    return ok, worst


def _timer(torch: Any, args: list[Any], runs: int, warmup_s: float) -> Any:
    """``time(fn)``: the Verifier's timing rules, inputs refilled in place from device copies.

    The warm-up lasts ``warmup_s`` at least (and five calls): the sweep keeps the GPU busy from
    one timing to the next, so its clocks never idle, and every side gets the same warm-up."""
    from stitch_graph.execution.timing import make_flush_buffer, time_cuda

    clean = [a.clone() if torch.is_tensor(a) else a for a in args]
    flush = make_flush_buffer()

    def refill(_run: int) -> None:
        for dst, src in zip(args, clean, strict=True):
            if torch.is_tensor(dst):
                dst.copy_(src)

    def time_it(fn: Any) -> float:
        return time_cuda(
            lambda: fn(*args),
            runs=runs,
            before_each=refill,
            flush_buffer=flush,
            warmup_s=warmup_s,
        )["median_ms"]

    return time_it


def _warned(call: Any) -> tuple[Any, list[str]]:
    """``call()``'s result and the run-time warnings it raised (each once, shortened)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RuntimeWarning)
        result = call()
    return result, sorted({str(w.message)[:200] for w in caught if w.category is RuntimeWarning})


def measure(
    path: Path,
    *,
    tol: float,
    runs: int,
    tune: bool,
    tune_budget: float,
    warmup_s: float = 0.05,
    progress: Any = None,
) -> dict[str, Any]:
    """The row of one problem: correctness of the generated program and four timings.

    ``progress`` gets a copy of the row once the program and eager are timed and after each
    ``torch.compile`` baseline, so a baseline that hangs (a big model's reduce-overhead compile)
    does not cost the program's own verdict."""
    torch = _setup_torch()
    row: dict[str, Any] = {"problem": f"{path.parent.name}/{path.stem}"}
    started = time.perf_counter()
    (task, candidate, info), said = _warned(lambda: _generate(path, tune, tune_budget))
    if said:  # a CUDA graph the tuner could not capture says why once, here
        row["tune_said"] = said
    gc.collect()  # the tuner's reference and inputs: a big problem needs the memory back
    torch.cuda.empty_cache()
    untuned = info.pop("untuned", None)
    row.update(info)
    row["generate_s"] = round(time.perf_counter() - started, 2)
    namespace = _namespace(task.source, path)
    reference, ours = _build(torch, task, candidate, namespace)
    row["correct"], row["max_err"] = _check(torch, reference, ours, namespace, tol)
    if not row["correct"] and info["reordered"]:
        # as the Coder does after a wrong result: the program whose sums keep eager's order,
        # kept where it passes (else the reordered one, faster and as wrong)
        t0 = time.perf_counter()
        task, exact, exact_info = _generate(path, tune, tune_budget, exact_order=True)
        exact_ours = _build(torch, task, exact, namespace, reference)[1]
        passed, error = _check(torch, reference, exact_ours, namespace, tol)
        row["exact_order_max_err"] = error
        if passed:
            candidate, untuned, ours = exact, exact_info.pop("untuned", None), exact_ours
            row.update({**exact_info, "exact_order": True, "reordered": row["reordered"]})
            row["correct"], row["max_err"] = passed, error
        row["generate_s"] += round(time.perf_counter() - t0, 2)
    if not row["correct"] and math.isfinite(row["max_err"]):
        row.update(_against_float64(torch, reference, ours, namespace))
    args = _draw(torch, namespace, 7)
    time_it = _timer(torch, args, runs, warmup_s)
    row["eager_ms"] = time_it(reference)
    row["ours_ms"], said = _warned(lambda: time_it(ours))
    if said:  # a graph capture that failed in this worker runs plain launches: say so
        row["ours_said"] = said
    if untuned is not None:
        kept = (untuned.host_source, untuned.kernel_source) == (
            candidate.host_source,
            candidate.kernel_source,
        )  # the tuner kept the untuned program: the same program, timed already
        row["untuned_ms"] = (
            row["ours_ms"] if kept else time_it(_build(torch, task, untuned, namespace, reference)[1])
        )
    for side, mode in (("compile", "default"), ("reduce_overhead", "reduce-overhead")):
        if progress is not None:
            progress({**row, "seconds": round(time.perf_counter() - started, 2)})
        t0 = time.perf_counter()
        try:
            compiled = torch.compile(reference, mode=mode)
            row[f"{side}_ms"] = time_it(compiled)
            if side == "compile" and not row["correct"]:
                # a second float32 program's verdict on the same draws: where Inductor misses
                # the tolerance too, the tolerance asks more than float32 gives
                row["compile_correct"], row["compile_max_err"] = _check(
                    torch, reference, compiled, namespace, tol
                )
        except Exception as error:  # noqa: BLE001 - a baseline that fails is a blank cell
            row[f"{side}_error"] = f"{type(error).__name__}: {error}"[:160]
        row[f"{side}_s"] = round(time.perf_counter() - t0, 2)
    row["seconds"] = round(time.perf_counter() - started, 2)
    return row


def warm(path: Path) -> None:
    """Fill the build and compile caches for one problem; its numbers are thrown away.

    Tuning is left to the timing phase: times taken while other processes share the GPU would
    choose (and cache) the wrong settings.
    """
    torch = _setup_torch()
    task, candidate, _ = _generate(path, tune=False)
    namespace = _namespace(task.source, path)
    reference, _ours = _build(torch, task, candidate, namespace)
    args = _draw(torch, namespace, 7)
    for mode in ("default", "reduce-overhead"):
        compiled = torch.compile(reference, mode=mode)
        for _ in range(3):
            compiled(*args)
    torch.cuda.synchronize()


# ----------------------------------------------------------------------------------------------
# Workers


def _serve(jobs: Any, rows: Any) -> None:
    """Timing worker: measure each problem it is sent; an exception becomes an error row."""

    def progress(row: dict[str, Any]) -> None:
        rows.put(("partial", row))

    while (job := jobs.get()) is not None:
        path, options = job
        try:
            row = measure(Path(path), **options, progress=progress)
        except Exception as error:  # noqa: BLE001
            row = {"error": f"{type(error).__name__}: {error}"[:300]}
        broken = _cuda_broken() or _memory_held()
        rows.put(("row", {**row, "worker_retired": broken} if broken else row))
        if broken:
            return  # the next problem gets a fresh process


def _cuda_broken() -> str:
    """Why this process's CUDA state cannot time another problem ("" when it can): a sticky
    kernel fault, or a generator left in capture mode by a failed graph capture, would turn
    every later row into an error."""
    import torch

    try:
        torch.randn(16, device="cuda").sum().item()
    except Exception as error:  # noqa: BLE001 - any failure retires the worker
        return f"{type(error).__name__}: {error}"[:200]
    return ""


_HELD_SHARE = 0.25  # of the GPU's memory, still reserved once a row's objects are freed


def _memory_held() -> str:
    """Why this process holds too much GPU memory to time another problem ("" when it does
    not), after freeing what the last row left: compiled graphs' private pools and cached
    blocks of earlier rows add up, and a large problem late in a level ran out of memory on
    an 80 GB card."""
    import torch

    if not torch.cuda.is_available():
        return ""
    gc.collect()
    torch._dynamo.reset()  # compiled baselines and their CUDA-graph pools
    torch.cuda.empty_cache()
    held = torch.cuda.memory_reserved()
    total = torch.cuda.get_device_properties(0).total_memory
    if held <= _HELD_SHARE * total:
        return ""
    return f"{held / 2**30:.1f} GiB of GPU memory still reserved after the row"


def row_after_loss(partial: dict[str, Any] | None, why: str) -> dict[str, Any]:
    """The row of a problem whose worker died or hung: an error row, unless the program and
    eager were already timed; then their row, with the baselines not reached marked failed."""
    if partial is None:
        return {"error": why}
    row = dict(partial)
    for side in ("compile", "reduce_overhead"):
        if f"{side}_ms" not in row:
            row[f"{side}_error"] = why
    return row


class IsolatedMeasurer:
    """Runs ``measure`` in a spawned worker; a crash or a hang becomes an error row."""

    def __init__(self, timeout_s: float, options: dict[str, Any]) -> None:
        self._context = multiprocessing.get_context("spawn")
        self._timeout = timeout_s
        self._options = options
        self._worker: Any = None

    def __call__(self, path: Path) -> dict[str, Any]:
        if self._worker is None or not self._worker.is_alive():
            self._jobs, self._rows = self._context.Queue(), self._context.Queue()
            self._worker = self._context.Process(target=_serve, args=(self._jobs, self._rows))
            self._worker.start()
        self._jobs.put((str(path), self._options))
        deadline = time.time() + self._timeout
        partial = None
        while time.time() < deadline:
            try:
                kind, row = self._rows.get(timeout=1.0)
            except queue.Empty:
                if not self._worker.is_alive():
                    why = f"worker died (exit code {self._worker.exitcode})"
                    return self._lost(partial, why)
                continue
            if kind == "row":
                if row.get("worker_retired"):
                    self._worker.join(timeout=30)
                    self._worker = None
                return row
            partial = row
        return self._lost(partial, f"no answer in {self._timeout:.0f} s")

    def _lost(self, partial: dict[str, Any] | None, why: str) -> dict[str, Any]:
        self._worker.kill()
        self._worker.join()
        self._worker = None
        return row_after_loss(partial, why)

    def close(self) -> None:
        if self._worker is not None and self._worker.is_alive():
            self._jobs.put(None)
            self._worker.join(timeout=10)


def warm_all(paths: list[Path], processes: int, deadline_s: float) -> float:
    """Warm the caches with ``processes`` workers in parallel, each taking every n-th problem.

    Each worker leads its own process group, and at the deadline the whole group is killed:
    Inductor's compile subprocesses outlive a killed parent, and left running they share the
    machine with the timing that follows (a launch-bound model's eager time doubled)."""
    started = time.perf_counter()
    workers = [
        subprocess.Popen(
            [sys.executable, __file__, "--warm-only", *map(str, paths[k::processes])],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={**os.environ, "CUDA_MODULE_LOADING": "LAZY"},
            start_new_session=True,
        )
        for k in range(processes)
        if paths[k::processes]
    ]
    for worker in workers:
        try:
            worker.wait(timeout=max(1.0, deadline_s - (time.perf_counter() - started)))
        except subprocess.TimeoutExpired:
            pass
        with contextlib.suppress(ProcessLookupError):
            os.killpg(worker.pid, signal.SIGKILL)  # its compile workers too, finished or not
        worker.wait()
    return time.perf_counter() - started


# ----------------------------------------------------------------------------------------------
# Report


def gmean(values: list[float]) -> float:
    """Geometric mean; NaN for no values."""
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else math.nan


def speedup(row: dict[str, Any], side: str) -> float | None:
    """Baseline time over ours, where both exist."""
    base, ours = row.get(f"{side}_ms"), row.get("ours_ms")
    return base / ours if base and ours else None


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-level geometric means over correct rows and fast_0/fast_1 over all rows."""
    correct = [r for r in rows if r.get("correct")]
    summary: dict[str, Any] = {
        "problems": len(rows),
        "correct": len(correct),
        "partial": sum(1 for r in correct if r.get("declared")),
        "correct_f64": sum(1 for r in rows if not r.get("correct") and r.get("correct_f64")),
        "errors": sum(1 for r in rows if "error" in r),
        "fast_0": len(correct) / len(rows) if rows else math.nan,
    }
    tuned = [r["untuned_ms"] / r["ours_ms"] for r in correct if r.get("untuned_ms")]
    summary["gmean_tuned_vs_untuned"] = gmean(tuned)
    for side in ("eager", "compile", "reduce_overhead"):
        ratios = [s for r in correct if (s := speedup(r, side))]
        summary[f"gmean_vs_{side}"] = gmean(ratios)
        summary[f"n_vs_{side}"] = len(ratios)
        summary[f"fast_1_vs_{side}"] = (
            sum(1 for r in correct if (speedup(r, side) or 0) > 1.0) / len(rows) if rows else 0
        )
    return summary


def _cell(value: float | None, width: int = 8, digits: int = 3) -> str:
    return f"{value:{width}.{digits}f}" if value is not None else f"{'-':>{width}s}"


def _verdict(row: dict[str, Any]) -> str:
    """True, False, or f64: wrong at the tolerance, as close to float64 as PyTorch's float32."""
    if not row["correct"] and row.get("correct_f64"):
        return "f64"
    return str(row["correct"])


def print_row(row: dict[str, Any]) -> None:
    """One line per problem; errors on their own line."""
    name = row["problem"][:44]
    if "error" in row:
        print(f"{name:44s} ERROR {row['error']}", flush=True)
        return
    ratios = "".join(_cell(speedup(row, s), 7, 2) for s in ("eager", "compile", "reduce_overhead"))
    print(
        f"{name:44s} {_verdict(row):>5s} {row['max_err']:9.1e}"
        + "".join(_cell(row.get(f"{s}_ms")) for s in SIDES)
        + ratios
        + _cell(row["untuned_ms"] / row["ours_ms"] if row.get("untuned_ms") else None, 7, 2)
        + f"{row.get('seconds', 0):6.1f}s  {','.join(row.get('declared', [])) or '-'}",
        flush=True,
    )
    for message in row.get("ours_said", []):
        print(f"{'':44s} the program said: {message}", flush=True)
    if "compile_correct" in row:
        print(
            f"{'':44s} torch.compile against eager: max err {row['compile_max_err']:.1e}, "
            + ("within" if row["compile_correct"] else "also outside")
            + " the tolerance",
            flush=True,
        )


def print_summary(level: str, summary: dict[str, Any]) -> None:
    """The per-level block."""
    print(
        f"{level}: {summary['correct']}/{summary['problems']} correct "
        f"({summary['partial']} partial, {summary['errors']} errors"
        + (
            f", {summary['correct_f64']} more as close to float64 as PyTorch's float32"
            if summary.get("correct_f64")
            else ""
        )
        + "); geomean vs eager "
        f"{summary['gmean_vs_eager']:.2f}, vs compile {summary['gmean_vs_compile']:.2f}, "
        f"vs reduce-overhead {summary['gmean_vs_reduce_overhead']:.2f}; fast_0 "
        f"{summary['fast_0']:.2f}, fast_1 vs eager {summary['fast_1_vs_eager']:.2f}, "
        f"vs compile {summary['fast_1_vs_compile']:.2f}, "
        f"vs reduce-overhead {summary['fast_1_vs_reduce_overhead']:.2f}; tuned vs untuned "
        f"{summary['gmean_tuned_vs_untuned']:.2f}",
        flush=True,
    )


def machine() -> str:
    """The GPU, torch and CUDA versions, for the header of a sweep."""
    import torch

    return (
        f"{torch.cuda.get_device_name()} | torch {torch.__version__} | CUDA {torch.version.cuda} "
        f"| {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
    )


def problem_files(folders: list[Path], only: str, limit: int, skip: int = 0) -> list[Path]:
    """The problems of each level folder, sorted by KernelBench's numeric prefix."""

    def number(path: Path) -> tuple[int, str]:
        head = path.stem.split("_", 1)[0]
        return (int(head) if head.isdigit() else 10**6, path.stem)

    files: list[Path] = []
    for folder in folders:
        found = sorted((p for p in folder.glob("*.py") if only in p.name), key=number)
        found = found[skip:]
        files += found[:limit] if limit else found
    return files


def rows_from_output(paths: list[Path]) -> dict[str, list[dict[str, Any]]]:
    """Rows read back from printed sweeps (several parts of one level may be joined). A
    problem printed again in a later file, or later in one, keeps only its latest row, which
    names the file it came from (``from``)."""
    rows: dict[str, dict[str, dict[str, Any]]] = {}
    for path in paths:
        for line in path.read_text().splitlines():
            head, _, rest = line.partition(" ")
            if "/" not in head or not head.startswith("level"):
                continue
            fields = rest.split()
            row: dict[str, Any] = {"problem": head, "from": path.name}
            if fields[0] == "ERROR":
                row["error"] = rest.partition("ERROR ")[2]
            else:
                row["correct"] = fields[0] == "True"
                row["correct_f64"] = fields[0] == "f64"
                row["max_err"] = float(fields[1])
                for side, cell in zip(SIDES, fields[2:6], strict=True):
                    if cell != "-":
                        row[f"{side}_ms"] = float(cell)
                xtune = fields[9]
                if xtune != "-" and row.get("ours_ms"):
                    row["untuned_ms"] = float(xtune) * row["ours_ms"]
                row["declared"] = [] if fields[-1] == "-" else fields[-1].split(",")
            level = rows.setdefault(head.split("/")[0], {})
            level.pop(head, None)  # the latest row goes last, in the order rows were printed
            level[head] = row
    return {level: list(by_problem.values()) for level, by_problem in rows.items()}


def print_slowest(rows: list[dict[str, Any]], side: str = "compile", count: int = 10) -> None:
    """The correct rows that lose most against ``side``."""
    ranked = sorted(
        (r for r in rows if r.get("correct") and speedup(r, side)), key=lambda r: speedup(r, side)
    )
    for row in ranked[:count]:
        print(
            f"  {row['problem']:50s} vs {side} {speedup(row, side):.2f}, "
            f"vs eager {speedup(row, 'eager') or math.nan:.2f}"
        )


def main(argv: list[str] | None = None) -> int:
    """Warm, time, print the rows and the per-level summaries."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", type=Path)
    parser.add_argument("--only", default="", help="only problems whose file name contains this")
    parser.add_argument("--limit", type=int, default=0, help="first N problems of each level")
    parser.add_argument("--skip", type=int, default=0, help="leave out the first N of each level")
    parser.add_argument("--warm", type=int, default=0, help="processes warming caches first")
    parser.add_argument("--warm-deadline", type=float, default=300.0)
    parser.add_argument("--timeout", type=float, default=180.0, help="per-problem limit (s)")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument(
        "--warmup-s", type=float, default=0.05, help="seconds of warm-up calls a timing at least"
    )
    parser.add_argument("--tol", type=float, default=1e-4)
    parser.add_argument("--tune", action="store_true", help="autotune the generated kernels")
    parser.add_argument("--tune-budget", type=float, default=30.0, help="seconds per problem")
    parser.add_argument("--json", type=Path, help="write the rows and summaries here")
    parser.add_argument("--warm-only", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--summarize", action="store_true", help="the folders are printed sweeps: summarize them"
    )
    opts = parser.parse_args(argv)
    if opts.summarize:
        for level, level_rows in sorted(rows_from_output(opts.folders).items()):
            print_summary(level, summarize(level_rows))
            print_slowest(level_rows)
        return 0
    if opts.warm_only:
        for path in opts.folders:
            try:
                warm(path)
            except Exception:  # noqa: BLE001 - the timing phase reports it
                traceback.print_exc()
        return 0

    files = problem_files(opts.folders, opts.only, opts.limit, opts.skip)
    print(f"# {machine()}", flush=True)
    if opts.warm:
        spent = warm_all(files, opts.warm, opts.warm_deadline)
        print(f"# warmed {len(files)} problems with {opts.warm} processes in {spent:.0f} s")
    print(
        f"{'problem':44s} {'ok':>5s} {'max_err':>9s}"
        + "".join(f"{s[:8]:>8s}" for s in SIDES)
        + f"{'xeager':>7s}{'xcomp':>7s}{'xro':>7s}{'xtune':>7s}{'time':>7s}  declared",
        flush=True,
    )
    measurer = IsolatedMeasurer(
        opts.timeout,
        {
            "tol": opts.tol,
            "runs": opts.runs,
            "tune": opts.tune,
            "tune_budget": opts.tune_budget,
            "warmup_s": opts.warmup_s,
        },
    )
    rows: dict[str, list[dict[str, Any]]] = {}
    started = time.perf_counter()
    try:
        for path in files:
            row = measurer(path)
            row.setdefault("problem", f"{path.parent.name}/{path.stem}")
            rows.setdefault(path.parent.name, []).append(row)
            print_row(row)
            if opts.json:
                with opts.json.with_suffix(".rows.jsonl").open("a") as stream:
                    stream.write(json.dumps(row, default=str) + "\n")
    finally:
        measurer.close()
    summaries = {level: summarize(level_rows) for level, level_rows in rows.items()}
    for level, summary in summaries.items():
        print_summary(level, summary)
    print(f"# timed {len(files)} problems in {time.perf_counter() - started:.0f} s")
    if opts.json:
        opts.json.write_text(
            json.dumps(
                {"machine": machine(), "rows": rows, "summaries": summaries}, indent=1, default=str
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
