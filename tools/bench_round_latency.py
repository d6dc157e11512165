"""Benchmark one Verifier round: build + correctness + timing (and ncu), cold and warm.

For each hand-written honest candidate in ``examples/candidates`` (each names its problem in
``examples/problems``), this measures:

* ``ref``: the reference worker (outputs + eager + torch.compile timings), once per problem;
* ``cold``: a round with empty build caches (nvcc cubin compile, NVRTC, worker start, trials,
  timing);
* ``warm``: the median of further rounds with caches warm;
* ``ncu``: a warm round plus an Nsight Compute profile of the candidate.

Workers are pre-started (the executor starts the next worker, which imports torch and CuPy, while a
job runs); ``--no-prestart`` starts every worker cold, to compare. The ``pre`` column says how many
of the candidate's rounds had their candidate job picked up by a pre-started worker (cold round,
then warm rounds). It prints a table and the machine (GPU, CUDA, torch, CuPy, nvcc). Goals: median
round <= 3 s without ncu, <= 15 s with it. Usage: ``python tools/bench_round_latency.py [--rounds 3]
[--no-ncu] [--no-prestart] [--json OUT.json]``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import statistics
import sys
import tempfile
import time
import types
from concurrent.futures import Future
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _ensure_importable() -> None:
    """Load ``stitch_graph`` even where its top level's LangChain imports are unavailable."""
    if importlib.util.find_spec("stitch_graph") is None:
        sys.path.insert(0, str(ROOT / "src"))
    try:
        import stitch_graph  # noqa: F401
    except ImportError:
        spec = importlib.util.find_spec("stitch_graph")
        folder = Path(next(iter(spec.submodule_search_locations)))
        bare = types.ModuleType("stitch_graph")
        bare.__path__ = [str(folder)]
        sys.modules["stitch_graph"] = bare


def _machine() -> dict[str, str]:
    import torch

    info = {"torch": torch.__version__, "cuda": str(torch.version.cuda)}
    info["gpu"] = torch.cuda.get_device_name() if torch.cuda.is_available() else "none"
    try:
        import cupy

        info["cupy"] = cupy.__version__
    except ImportError:
        info["cupy"] = "missing"
    from stitch_graph.toolchain.nvcc import nvcc_version

    info["nvcc"] = (nvcc_version() or "missing").splitlines()[-1]
    return info


class _Recorder:
    """An executor that runs jobs through another and notes whether a pre-started worker took each."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.jobs: list[dict[str, Any]] = []

    def submit(self, job: Any) -> Future[Any]:
        """Run ``job`` on the inner executor, wait, record it; an already resolved future."""
        result = self.inner.submit(job).result()
        self.jobs.append({"kind": job.kind, "warm_start": result.warm_start,
                          "seconds": result.seconds, "status": result.status})
        done: Future[Any] = Future()
        done.set_result(result)
        return done

    def shutdown(self) -> None:
        """Shut the inner executor down (kills idle pre-started workers)."""
        self.inner.shutdown()


def _round(task: Any, candidate: Any, settings: Any, executor: _Recorder, *,
           ncu: bool) -> dict[str, Any]:
    from stitch_graph.execution import profile_candidate, verify_candidate
    from stitch_graph.toolchain.nvcc import nvcc_compile

    seen = len(executor.jobs)
    start = time.perf_counter()
    compiled = None
    if candidate.form == "nvrtc":
        compiled = nvcc_compile(candidate.kernel_source, arch=settings.gpu_arch, mode="cubin",
                                work_dir=str(Path(settings.work_dir) / "nvcc"))
    build_s = time.perf_counter() - start
    outcome = verify_candidate(task, candidate, settings, executor=executor,
                               compile_result=compiled)
    row = {
        "seconds": time.perf_counter() - start,
        "build_s": build_s,
        "status": outcome.test.status,
        "reason": outcome.test.reason,
        "timing": outcome.timing.model_dump(),
    }
    jobs = executor.jobs[seen:]
    row["prestarted"] = any(j["kind"] == "candidate" and j["warm_start"] for j in jobs)
    row["candidate_job_s"] = next((j["seconds"] for j in jobs if j["kind"] == "candidate"), None)
    if ncu:
        t = time.perf_counter()
        report = profile_candidate(task, candidate, settings, compile_result=compiled,
                                   executor=executor)
        row["ncu_s"] = time.perf_counter() - t
        row["ncu_status"] = report.status
        row["ncu_reason"] = report.reason[:200]
        row["bottleneck"] = report.bottleneck
        row["seconds"] = time.perf_counter() - start
        row["jobs"] = executor.jobs[seen:]
    else:
        row["jobs"] = jobs
    return row


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; returns the exit status (1 if a candidate failed)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--candidates", default=str(ROOT / "examples" / "candidates"))
    parser.add_argument("--rounds", type=int, default=3, help="warm rounds per candidate")
    parser.add_argument("--no-ncu", action="store_true", help="skip the rounds with ncu")
    parser.add_argument("--no-prestart", action="store_true",
                        help="start every worker cold (no pre-started workers)")
    parser.add_argument("--json", help="write all measurements here")
    parser.add_argument("--only", help="comma-separated candidate folder names to run")
    args = parser.parse_args(argv)
    _ensure_importable()
    from stitch_graph.artifacts import Task
    from stitch_graph.execution import LocalGPUExecutor, RunSettings, gpu_available
    from stitch_graph.execution.files import load_candidate_dir
    from stitch_graph.execution.reference import ensure_reference

    machine = _machine()
    print("machine: " + ", ".join(f"{k} {v}" for k, v in machine.items()))
    if not gpu_available():
        print("no GPU (or no CuPy): nothing to benchmark")
        return 0
    work = Path(tempfile.mkdtemp(prefix="stitch-bench-"))
    settings = RunSettings(work_dir=str(work))
    prestart = not args.no_prestart
    executor = _Recorder(LocalGPUExecutor(prestart=prestart))
    print(f"workers: {'pre-started' if prestart else 'cold (--no-prestart)'}")
    rows: list[dict[str, Any]] = []
    try:
        wanted = set(args.only.split(",")) if args.only else None
        folders = sorted(p for p in Path(args.candidates).iterdir() if p.is_dir())
        for folder in [f for f in folders if wanted is None or f.name in wanted]:
            candidate, meta = load_candidate_dir(folder)
            problem = Path(meta["problem"])
            task = Task(name=problem.stem, source=problem.read_text(), path=str(problem))
            t = time.perf_counter()
            ensure_reference(task, settings, executor=executor)
            ref_s = time.perf_counter() - t
            for cache in ("nvcc", "builds", "cupy-cache"):  # cold: no build caches at all
                shutil.rmtree(Path(settings.root()) / cache, ignore_errors=True)
                shutil.rmtree(work / cache, ignore_errors=True)
            cold = _round(task, candidate, settings, executor, ncu=False)
            warm = [_round(task, candidate, settings, executor, ncu=False)
                    for _ in range(max(1, args.rounds))]
            with_ncu = None if args.no_ncu else _round(task, candidate, settings, executor,
                                                       ncu=True)
            rows.append({"candidate": folder.name, "form": candidate.form, "ref_s": ref_s,
                         "cold": cold, "warm": warm, "ncu": with_ncu, "prestart": prestart})
            print(f"done {folder.name}: ref {ref_s:.2f} s, cold {cold['seconds']:.2f} s, warm "
                  + ", ".join(f"{w['seconds']:.2f}" + ("*" if w["prestarted"] else "")
                              for w in warm) + " s"
                  + (f", with ncu {with_ncu['seconds']:.2f} s" if with_ncu else "")
                  + " (* candidate job on a pre-started worker)", flush=True)
    finally:
        executor.shutdown()
    _print_table(rows)
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": machine, "prestart": prestart,
                                               "rows": rows}, indent=1))
    shutil.rmtree(work, ignore_errors=True)
    ok = all(r["cold"]["status"] == "passed" for r in rows)
    return 0 if ok else 1


def _fmt(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _print_table(rows: list[dict[str, Any]]) -> None:
    head = (f"{'candidate':<24} {'form':<11} {'status':<7} {'ref s':>6} {'cold s':>7} "
            f"{'warm s':>7} {'pre':>5} {'ncu s':>6} {'cand ms':>8} {'eager ms':>8} {'compile ms':>10} "
            f"{'x eager':>7} {'x compile':>9}")
    print(head)
    print("-" * len(head))
    warm_all, cold_all, ncu_all = [], [], []
    picked, rounds = 0, 0
    for r in rows:
        warm_s = statistics.median(w["seconds"] for w in r["warm"])
        warm_all.append(warm_s)
        cold_all.append(r["cold"]["seconds"])
        ncu_s = r["ncu"]["seconds"] if r["ncu"] else None
        if ncu_s is not None:
            ncu_all.append(ncu_s)
        t = r["warm"][-1]["timing"]
        cand, eager, comp = t.get("candidate_ms"), t.get("eager_ms"), t.get("compile_ms")
        xe = eager / cand if cand and eager else None
        xc = comp / cand if cand and comp else None
        pre = [r["cold"], *r["warm"]]
        n_pre = sum(bool(x.get("prestarted")) for x in pre)
        picked, rounds = picked + n_pre, rounds + len(pre)
        print(f"{r['candidate']:<24} {r['form']:<11} {r['cold']['status']:<7} "
              f"{_fmt(r['ref_s']):>6} {_fmt(r['cold']['seconds']):>7} {_fmt(warm_s):>7} "
              f"{f'{n_pre}/{len(pre)}':>5} {_fmt(ncu_s):>6} {_fmt(cand, 4):>8} {_fmt(eager, 4):>8} {_fmt(comp, 4):>10} "
              f"{_fmt(xe):>7} {_fmt(xc):>9}")
        if r["cold"]["status"] != "passed":
            print(f"    reason: {r['cold']['reason']}")
        if r["ncu"] and r["ncu"].get("ncu_status") != "passed":
            print(f"    ncu: {r['ncu'].get('ncu_status')}: {r['ncu'].get('ncu_reason')}")
    print("-" * len(head))
    med = statistics.median
    print(f"median round: cold {_fmt(med(cold_all))} s, warm {_fmt(med(warm_all))} s"
          + (f", with ncu {_fmt(med(ncu_all))} s" if ncu_all else "")
          + "  (goals: <= 3 s without ncu, <= 15 s with it)")
    prestart = all(r.get("prestart", False) for r in rows) if rows else False
    print(f"workers pre-started: {'yes' if prestart else 'no'}; candidate jobs picked up by a "
          f"pre-started worker: {picked}/{rounds} rounds")


if __name__ == "__main__":
    sys.exit(main())
