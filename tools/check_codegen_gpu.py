"""Check the rule-based code generator on a GPU: every problem of the suite, end to end.

For each problem: capture, plan, emit, build the kernels with NVRTC (``KernelLibrary``), build
``ModelNew``, load the reference's state_dict, compare outputs on 3 random draws (atol = rtol =
1e-4, TF32 off on both sides), then time eager, the candidate and torch.compile (median of 20
CUDA-event timings). Prints one line per problem and the geometric means.

With ``--methods`` each of eager, candidate and torch.compile is also timed four ways, to tell
device time from host overhead: ``harness`` (the Verifier's ``time_cuda``: L2 flushed, inputs
refilled), ``events`` (events around one call, nothing flushed), ``loop`` (events around 50
back-to-back calls, per call: the host overlaps the device) and ``kernels`` (the summed CUDA time of
the kernels, from ``torch.profiler``: no host time at all); torch._dynamo's counters follow.

With ``--isolate S`` every problem runs in a worker process that is replaced after a crash or
after S seconds without an answer, so one bad kernel (an illegal address poisons the CUDA context)
costs one row, not the sweep. ``--tol`` sets atol = rtol (KernelBench's own checks use 1e-2).

Usage: ``PYTHONPATH=src python tools/check_codegen_gpu.py [problems_dir] [--compile-budget S]
[--only TEXT] [--methods] [--isolate S] [--tol T]``
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch


def _import_without_graph_stack() -> None:
    """Import stitch_graph's submodules without its __init__ (which needs LangGraph)."""
    import importlib.util
    import types

    try:
        import stitch_graph  # noqa: F401
    except ImportError:
        spec = importlib.util.find_spec("stitch_graph.artifacts".split(".")[0])
        root = Path(__file__).resolve().parent.parent / "src" / "stitch_graph"
        package = types.ModuleType("stitch_graph")
        package.__path__ = [str(root)] if spec is None else list(spec.submodule_search_locations)
        sys.modules["stitch_graph"] = package


_import_without_graph_stack()

from stitch_graph.codegen import capture_program, emit_candidate, plan_program  # noqa: E402
from stitch_graph.execution._common import load_module_state, module_state  # noqa: E402
from stitch_graph.runtime.kernels import KernelLibrary  # noqa: E402
from stitch_graph.runtime.problem_source import exec_problem  # noqa: E402
from stitch_graph.task import load_task  # noqa: E402


def _time(fn, args, runs: int = 20) -> float:
    for _ in range(3):
        fn(*args)
    torch.cuda.synchronize()
    times = []
    for _ in range(runs):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn(*args)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _loop(fn, args, calls: int = 50) -> float:
    for _ in range(3):
        fn(*args)
    torch.cuda.synchronize()
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn(*args)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / calls


def _kernels(fn, args, calls: int = 10) -> float:
    """Milliseconds of kernel time per call, as CUPTI saw it (host time excluded)."""
    from torch.profiler import ProfilerActivity, profile

    fn(*args)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn(*args)
        torch.cuda.synchronize()
    total_us = sum(e.device_time for e in prof.events() if e.device_type.name == "CUDA")
    return total_us / 1000.0 / calls


def _methods(fn, args) -> dict[str, float]:
    from stitch_graph.execution.timing import time_cuda

    clean = [a.clone() if torch.is_tensor(a) else a for a in args]

    def refill(_i: int) -> None:
        for dst, src in zip(args, clean, strict=True):
            if torch.is_tensor(dst):
                dst.copy_(src)

    return {
        "harness": time_cuda(lambda: fn(*args), before_each=refill)["median_ms"],
        "events": _time(fn, args),
        "loop": _loop(fn, args),
        "kernels": _kernels(fn, args),
    }


def _inputs(namespace: dict, seed: int) -> list:
    """One draw of the problem's inputs, made on the GPU (large CPU draws take seconds)."""
    torch.manual_seed(seed)
    with torch.device("cuda"):
        return [x.cuda() if torch.is_tensor(x) else x for x in namespace["get_inputs"]()]


def _outs(value) -> list[torch.Tensor]:
    return list(value) if isinstance(value, list | tuple) else [value]


def check(path: Path, compile_left: float, methods: bool = False, tol: float = 1e-4) -> dict:
    row: dict = {"name": f"{path.parent.name}/{path.stem}"}
    task = load_task(str(path))
    ir = capture_program(task)
    plan = plan_program(ir)
    cand = emit_candidate(ir, plan)
    row["declared"] = cand.declared_torch_ops
    row["kernels"] = len(plan.items)
    namespace = exec_problem(task.source, str(path), "reference")
    init = list(task.init_args) or list(namespace["get_init_inputs"]())
    torch.manual_seed(0)
    ref = namespace["Model"](*init).cuda()
    library = KernelLibrary(cand.kernel_source)
    host: dict = {"KERNELS": library, "__name__": "candidate"}
    exec(compile(cand.host_source, "<host>", "exec"), host)
    new = host["ModelNew"](*init).cuda()
    load_module_state(new, module_state(ref))
    new.train(ref.training)
    worst = 0.0
    ok = True
    with torch.no_grad():
        for trial in range(3):
            args = _inputs(namespace, 1000 + trial)
            expected = _outs(ref(*args))
            got = _outs(new(*args))
            for e, g in zip(expected, got, strict=True):
                if e.shape != g.shape or e.dtype != g.dtype:
                    ok = False
                    continue
                diff = (e.double() - g.double()).abs()
                worst = max(worst, float(diff.max()) if diff.numel() else 0.0)
                ok &= bool(torch.allclose(e, g, atol=tol, rtol=tol, equal_nan=True))
        row["correct"] = ok
        row["max_err"] = worst
        args = _inputs(namespace, 7)
        row["eager_ms"] = _time(ref, args)
        row["cand_ms"] = _time(new, args)
        row["compile_ms"] = None
        if compile_left > 0:
            t0 = time.time()
            try:
                compiled = torch.compile(ref)
                row["compile_ms"] = _time(compiled, args)
                if methods:
                    row["methods"] = {"eager": _methods(ref, args), "cand": _methods(new, args),
                                      "compile": _methods(compiled, args)}
                    from torch._dynamo.utils import counters

                    row["dynamo"] = {k: dict(v) for k, v in counters.items() if v}
                    counters.clear()
            except Exception as error:  # noqa: BLE001
                row["compile_error"] = str(error)[:80]
            row["compile_s"] = time.time() - t0
    return row


def _serve(jobs, rows) -> None:
    """Worker process: check each problem it is sent; exceptions become rows."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    while (job := jobs.get()) is not None:
        path, budget, methods, tol = job
        try:
            rows.put(check(Path(path), budget, methods, tol))
        except Exception as error:  # noqa: BLE001
            rows.put({"error": f"{type(error).__name__}: {error}"})


class _IsolatedChecker:
    """Runs ``check`` in a spawned worker; a crash or a hang becomes an error row."""

    def __init__(self, timeout_s: float) -> None:
        import multiprocessing

        self._ctx = multiprocessing.get_context("spawn")
        self._timeout = timeout_s
        self._worker = None

    def __call__(self, path: Path, budget: float, methods: bool, tol: float) -> dict:
        import queue

        if self._worker is None or not self._worker.is_alive():
            self._jobs, self._rows = self._ctx.Queue(), self._ctx.Queue()
            self._worker = self._ctx.Process(target=_serve, args=(self._jobs, self._rows))
            self._worker.start()
        self._jobs.put((str(path), budget, methods, tol))
        deadline = time.time() + self._timeout
        while time.time() < deadline:
            try:
                row = self._rows.get(timeout=1.0)
            except queue.Empty:
                if not self._worker.is_alive():
                    return self._lost(f"worker died (exit code {self._worker.exitcode})")
                continue
            if "error" in row:
                raise RuntimeError(row["error"])
            return row
        return self._lost(f"no answer in {self._timeout:.0f} s")

    def _lost(self, why: str) -> dict:
        self._worker.kill()
        self._worker.join()
        self._worker = None
        raise RuntimeError(why)

    def close(self) -> None:
        if self._worker is not None and self._worker.is_alive():
            self._jobs.put(None)
            self._worker.join(timeout=10)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("problems", nargs="?", default="problems")
    parser.add_argument("--compile-budget", type=float, default=240.0)
    parser.add_argument("--only", default="")
    parser.add_argument("--methods", action="store_true", help="time four ways (see above)")
    parser.add_argument("--isolate", type=float, default=0.0, help="per-problem worker timeout (s)")
    parser.add_argument("--tol", type=float, default=1e-4, help="atol = rtol of the comparison")
    opts = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    files = sorted(Path(opts.problems).glob("*/*.py")) + sorted(Path(opts.problems).glob("*.py"))
    files = [f for f in files if opts.only in str(f)]
    print(
        f"{'problem':40s} {'ok':>5s} {'max_err':>9s} {'eager':>8s} {'cand':>8s} {'compile':>8s} "
        f"{'vs eager':>8s} {'vs comp':>8s} declared"
    )
    budget = opts.compile_budget
    ratios_e, ratios_c, correct = [], [], 0
    run = _IsolatedChecker(opts.isolate) if opts.isolate > 0 else check
    for path in files:
        try:
            row = run(path, budget, opts.methods, opts.tol)
        except Exception as error:  # noqa: BLE001
            print(f"{path.parent.name}/{path.stem:34s} ERROR {type(error).__name__}: {error}"[:300])
            traceback.print_exc(limit=2, file=sys.stdout)
            continue
        budget -= row.get("compile_s", 0.0)
        correct += row["correct"]
        se = row["eager_ms"] / row["cand_ms"]
        sc = row["compile_ms"] / row["cand_ms"] if row["compile_ms"] else None
        if row["correct"]:
            ratios_e.append(se)
            if sc:
                ratios_c.append(sc)
        comp = f"{row['compile_ms']:8.3f}" if row["compile_ms"] else f"{'-':>8s}"
        print(
            f"{row['name']:40s} {str(row['correct']):>5s} {row['max_err']:9.2e} "
            f"{row['eager_ms']:8.3f} {row['cand_ms']:8.3f} {comp} {se:8.2f} "
            f"{(f'{sc:8.2f}' if sc else '       -')} {','.join(row['declared']) or '-'}"
        )
        for who, numbers in row.get("methods", {}).items():
            print(f"    {who:8s} " + "  ".join(f"{k} {v:.4f}" for k, v in numbers.items()))
        if "dynamo" in row:
            print(f"    dynamo   {row['dynamo']}")
        sys.stdout.flush()

    if isinstance(run, _IsolatedChecker):
        run.close()

    def gmean(xs: list[float]) -> float:
        return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")

    print(
        f"correct {correct}/{len(files)}; geomean speedup vs eager {gmean(ratios_e):.2f} "
        f"(n={len(ratios_e)}), vs torch.compile {gmean(ratios_c):.2f} (n={len(ratios_c)})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
