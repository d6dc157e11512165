"""``stitch-graph bench SUITE``: the graph (or given candidates) over a whole suite, with reports.

SUITE is a folder of KernelBench-format problems (a KernelBench level folder, a folder of levels,
or the project's ``problems/``), searched recursively. For each problem the command runs the graph
with the chosen agents (rule-based by default), or with ``--candidates DIR`` only checks the
candidate found there for it with the ``verify`` protocol. On a GPU the baselines (eager in FP32
and under PyTorch's default flags, ``torch.compile`` default and reduce-overhead) are timed first,
in the reference worker whose outputs the run then compares with.

Each finished problem is one line of ``OUT/rows.jsonl``, written durably before the next starts,
so the same command run again continues a killed sweep where it stopped (``--rerun-errors`` also
retries the problems that ended in an error). ``OUT/bench.json``, ``OUT/bench.csv`` and
``OUT/report.html`` are rewritten after every problem. ``--ray ADDRESS`` sends every evaluation to
a Ray cluster, one GPU each, and runs as many problems at once as the cluster has GPUs.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from stitch_graph.cli.models import add_model_options, check_models, context_from_args

__all__ = ["add_parser", "cmd_bench", "find_candidate"]


def find_candidate(folder: Path, problem: str) -> Path | None:
    """The candidate for ``problem`` (relative to the suite) in ``folder``, or None.

    Looked up as ``folder/PROBLEM`` (a ModelNew file), ``folder/PROBLEM-without-.py`` (a candidate
    or run folder), then the same by file name alone.
    """
    rel = Path(problem)
    for path in (folder / rel, folder / rel.with_suffix(""), folder / rel.name, folder / rel.stem):
        if path.exists():
            return path
    return None


def _run_graph(path: Path, problem: str, ctx: Any, host: str) -> dict[str, Any]:
    from stitch_graph.bench import row_from_report
    from stitch_graph.graph import create_stitch_graph
    from stitch_graph.graph.checkpoint import memory_checkpointer
    from stitch_graph.task import load_task

    started = time.monotonic()
    task = load_task(str(path))
    graph = create_stitch_graph(checkpointer=memory_checkpointer())
    config = {"configurable": {"thread_id": problem}, "recursion_limit": 500}
    graph.invoke({"task": task, "problem_path": str(path)}, config, context=ctx)
    values = graph.get_state(config).values
    report = values.get("report")
    if report is None:
        msg = "the run ended without a report"
        raise RuntimeError(msg)
    return row_from_report(
        problem,
        report,
        list(values.get("history", [])),
        seconds=time.monotonic() - started,
        host=host,
    )


def _run_candidate(
    path: Path, problem: str, folder: Path, settings: Any, executor: Any, host: str
) -> dict[str, Any]:
    from stitch_graph.bench import group_of, row_from_verdict
    from stitch_graph.cli.verify import verify_files

    candidate = find_candidate(folder, problem)
    if candidate is None:
        return {
            "problem": problem,
            "group": group_of(problem),
            "mode": "candidates",
            "outcome": "missing",
            "correct": False,
            "host": host,
            "error": f"no candidate for {problem} in {folder} (looked for {problem}, its folder, "
            "and the same by file name)",
        }
    started = time.monotonic()
    verdict = verify_files(path, candidate, settings=settings, executor=executor)
    return row_from_verdict(
        problem, verdict.model_dump(), seconds=time.monotonic() - started, host=host
    )


def measure_problem(
    path: Path,
    problem: str,
    args: argparse.Namespace,
    *,
    executor: Any,
    ctx: Any,
    settings: Any,
    host: str,
    gpu: bool,
) -> dict[str, Any]:
    """The row of one problem (baselines, then graph run or verdict); failures become rows.

    Args:
        path: The problem file.
        problem: Its path relative to the suite (the row's key).
        args: The command's options.
        executor: Where its jobs run; each is recorded into the row's ``placement``.
        ctx: The run's ``StitchContext`` (None with ``--candidates``).
        settings: ``RunSettings`` of the verdicts and baselines.
        host: This machine's name.
        gpu: Whether this machine can run candidates.

    Returns:
        The row, speedups included.
    """
    from stitch_graph.bench import add_speedups, group_of, time_baselines
    from stitch_graph.execution.placement import RecordingExecutor, RunnerOn
    from stitch_graph.task import load_task

    mine: list[Any] = []
    recorded = RecordingExecutor(executor, tag=problem, records=mine)
    try:
        baselines = {}
        if gpu and not args.no_baselines:  # first: their worker is the run's reference
            timeline = 0 if args.candidates else 5  # the Planner's timeline, in the same worker
            baselines = time_baselines(
                load_task(str(path)), settings, executor=recorded, timeline=timeline
            )
        if args.candidates:
            row = _run_candidate(path, problem, Path(args.candidates), settings, recorded, host)
        else:
            row = _run_graph(
                path, problem, dataclasses.replace(ctx, executor=RunnerOn(recorded)), host
            )
        row.update(baselines)
    except Exception as exc:  # noqa: BLE001 - one problem's failure is a row, not the end
        row = {
            "problem": problem,
            "group": group_of(problem),
            "outcome": "error",
            "correct": False,
            "host": host,
            "error": f"{type(exc).__name__}: {str(exc)[:500]}",
        }
    for key in ("eager", "compile"):  # no baseline job: the Verifier's in-run figures
        if row.get(f"{key}_ms") is None and row.get(f"verifier_{key}_ms"):
            row[f"{key}_ms"] = row[f"verifier_{key}_ms"]
            row["baselines_from"] = "verifier"
    row["placement"] = [r.model_dump() for r in mine]
    row["finished"] = time.time()
    return add_speedups(row)


def _problem_on_node(path: str, problem: str, options: dict[str, Any]) -> dict[str, Any]:
    """A Ray task's body: one whole problem on the node and GPU Ray gave it, with a local
    executor pinned to that GPU (Ray sets ``CUDA_VISIBLE_DEVICES``)."""
    import platform

    from stitch_graph.execution import LocalGPUExecutor, gpu_available

    args = argparse.Namespace(**options)
    ctx, settings = _settings(args)
    executor = LocalGPUExecutor()
    try:
        return measure_problem(
            Path(path),
            problem,
            args,
            executor=executor,
            ctx=ctx,
            settings=settings,
            host=platform.node(),
            gpu=gpu_available(),
        )
    finally:
        executor.shutdown()


def _settings(args: argparse.Namespace) -> tuple[Any, Any]:
    """The run context (None with ``--candidates``) and the ``RunSettings`` of a sweep."""
    from stitch_graph.execution.settings import RunSettings

    out = Path(args.out)
    ctx = None if args.candidates else context_from_args(args, out, timeout_s=args.timeout)
    settings = RunSettings(
        timeout_s=args.timeout, gpu_arch=args.arch, work_dir=str(Path(args.out) / "work")
    )
    return ctx, (RunSettings.from_context(ctx) if ctx is not None else settings)


class _Sweep:
    """One sweep's shared state: options, executor, row store and placement records."""

    def __init__(self, args: argparse.Namespace, executor: Any) -> None:
        from stitch_graph.bench import RowStore, machine_info
        from stitch_graph.execution import gpu_available

        self.args = args
        self.executor = executor
        self.ctx, self.settings = _settings(args)
        self.machine = machine_info()
        self.gpu = gpu_available()
        self.store = RowStore(Path(args.out), self.machine)
        self.lock = threading.Lock()

    def submit(self, pool: ThreadPoolExecutor, path: Path, problem: str) -> Future[dict]:
        """Start one problem: a Ray task per problem in graph mode on Ray, else a thread here
        whose evaluations go to the executor."""
        from stitch_graph.execution.ray_executor import RayExecutor

        if isinstance(self.executor, RayExecutor) and not self.args.candidates:
            options = {k: v for k, v in vars(self.args).items() if k != "func"}
            gpu = self.executor.gpu_slots() > 0
            call = self.executor.submit_call(
                _problem_on_node, str(path.resolve()), problem, options, gpu=gpu, tag=problem
            )
            future: Future[dict] = Future()

            def done(finished: Future) -> None:
                try:
                    row, placement = finished.result()
                    row["placement"] = [*row.get("placement", []), placement.model_dump()]
                    future.set_result(self.keep(row))
                except Exception as exc:  # noqa: BLE001 - handed to the loop
                    future.set_exception(exc)

            call.add_done_callback(done)
            return future
        return pool.submit(self.one, path, problem)

    def one(self, path: Path, problem: str) -> dict[str, Any]:
        """Measure one problem here and keep its row."""
        row = measure_problem(
            path,
            problem,
            self.args,
            executor=self.executor,
            ctx=self.ctx,
            settings=self.settings,
            host=self.machine["host"],
            gpu=self.gpu,
        )
        return self.keep(row)

    def keep(self, row: dict[str, Any]) -> dict[str, Any]:
        """Store ``row`` durably and rewrite the reports."""
        with self.lock:
            self.store.add(row)
            self.write()
        return row

    def summary(self) -> dict[str, Any]:
        """The summary, with the notes a reader needs (machine change, GPUs shared)."""
        from stitch_graph.bench import summarize
        from stitch_graph.execution.placement import Placement, shared_gpu_overlaps

        summary = summarize(self.store.rows, gpu=self.gpu or None)
        notes = []
        change = self.store.machine_change()
        if change:
            notes.append(change)
        records = [Placement(**p) for r in self.store.rows for p in r.get("placement", [])]
        overlaps = shared_gpu_overlaps(records)
        summary["gpu_overlaps"] = len(overlaps)
        if overlaps:
            first, second = overlaps[0]
            notes.append(
                f"{len(overlaps)} pairs of jobs shared a GPU at once (first: {first.tag} "
                f"{first.kind} and {second.tag} {second.kind} on {first.node} GPU {first.gpu}); "
                "their timings are not trustworthy: rerun them with one job per GPU"
            )
        summary["notes"] = notes
        return summary

    def write(self) -> dict[str, Path]:
        """Rewrite the JSON, CSV and HTML reports from the rows so far."""
        from stitch_graph.bench import write_reports

        rows = sorted(self.store.rows, key=lambda r: r["problem"])
        return write_reports(Path(self.args.out), rows, self.summary(), self.machine)


def _print_summary(console: Any, summary: dict[str, Any]) -> None:
    from rich.table import Table

    from stitch_graph.bench import BASELINES

    table = Table(title="bench summary (fast_1: against eager; gm: geometric mean)")
    short = {"eager": "eager", "eager_default_flags": "eager-tf32", "compile": "compile"}
    for column in ["group", "n", "ok", "success", "fast_1"]:
        table.add_column(column)
    for baseline in BASELINES:
        table.add_column(f"gm {short.get(baseline, 'reduce-oh')}")

    def cell(value: Any) -> str:
        return (
            "-" if value is None else (f"{value:.2f}" if isinstance(value, float) else str(value))
        )

    for name, s in [*summary["groups"].items(), ("ALL", summary["all"])]:
        table.add_row(
            name,
            str(s["problems"]),
            str(s["correct"]),
            cell(s["success_rate"]),
            cell(s["fast_p"]["eager"]["1"]),
            *[cell(s["geomean"][b]) for b in BASELINES],
        )
    console.print(table)
    for note in [*summary.get("notes", []), summary.get("note") or ""]:
        if note:
            console.print(note, markup=False, highlight=False)


def _prebuild_candidates(
    todo: list[tuple[Path, str]], folder: Path, settings: Any, console: Any
) -> None:
    """Build the given files' own ``load_inline`` extensions side by side before their runs,
    which would otherwise build them one GPU job at a time."""
    from stitch_graph.cli.verify import prebuild_files

    pairs = [(path, found) for path, problem in todo if (found := find_candidate(folder, problem))]
    built = prebuild_files(pairs, settings, jobs=max(1, (os.cpu_count() or 2) // 2))
    if built:
        console.print(f"built {built} load_inline extensions first", markup=False)


def _executor(args: argparse.Namespace) -> tuple[Any, int]:
    """The executor and how many problems to run at once."""
    if args.ray:
        from stitch_graph.execution.ray_executor import RayExecutor

        local = {"num_cpus": args.ray_cpus} if args.ray == "local" and args.ray_cpus else {}
        executor = RayExecutor(args.ray, **local)
        slots = executor.gpu_slots() or int(executor.resources().get("CPU", 1))
        return executor, args.jobs or max(1, slots)
    from stitch_graph.execution import LocalGPUExecutor

    executor = LocalGPUExecutor()
    return executor, args.jobs or max(1, len(executor.gpus))


def cmd_bench(args: argparse.Namespace) -> int:
    """Run the graph (or check given candidates) on every problem of SUITE; write the reports."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from stitch_graph.bench import find_problems

    console = Console(stderr=True, highlight=False)
    suite = Path(args.suite)
    if not suite.is_dir():
        print(
            f"cannot bench {suite}: not a folder. Fix: pass a folder of KernelBench problem "
            "files (a KernelBench level folder or problems/)",
            file=sys.stderr,
        )
        return 2
    if args.candidates and not Path(args.candidates).is_dir():
        print(
            f"--candidates {args.candidates}: not a folder. Fix: pass the folder that holds one "
            "candidate per problem, at the problem's path relative to SUITE",
            file=sys.stderr,
        )
        return 2
    args.out = args.out or str(Path("bench") / suite.resolve().name)
    paths = find_problems(suite, args.only)
    if not paths:
        print(
            f"no problem files (*.py) under {suite}"
            + (f" matching --only {args.only}" if args.only else "")
            + ". Fix: pass the folder of KernelBench problem files, or loosen --only",
            file=sys.stderr,
        )
        return 2
    args.out = str(Path(args.out).resolve())  # Ray nodes share the folder by its full path
    ctx, _ = _settings(args)
    if ctx is not None and (message := check_models(ctx, args)):
        print(message, file=sys.stderr)
        return 2
    if args.report_only:
        sweep = _Sweep(args, None)
        files = sweep.write()
        _print_summary(console, sweep.summary())
        print(f"reports: {', '.join(str(p) for p in files.values())}")
        return 0
    try:
        executor, jobs = _executor(args)
    except RuntimeError as exc:  # ray missing or the cluster unreachable; the text has the fix
        print(exc, file=sys.stderr)
        return 2
    pool: ThreadPoolExecutor | None = None
    try:
        sweep = _Sweep(args, executor)
        if change := sweep.store.machine_change():
            console.print(change, markup=False)
        done = sweep.store.done(retry_errors=args.rerun_errors)
        todo = [(p, str(p.relative_to(suite))) for p in paths]
        todo = [(p, name) for p, name in todo if name not in done]
        console.print(
            f"{len(paths)} problems, {len(paths) - len(todo)} already done; running {len(todo)}"
            f" ({jobs} at a time) -> {Path(args.out).resolve()}"
            + ("" if sweep.gpu else " [no GPU: programs are built, not checked or timed]"),
            markup=False,
        )
        if args.candidates and sweep.gpu:
            _prebuild_candidates(todo, Path(args.candidates), sweep.settings, console)
        pool = ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="stitch-bench")
        columns = ("{task.description}", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*columns, console=console) as progress:
            bar = progress.add_task("bench", total=len(todo))
            futures = {sweep.submit(pool, p, name): name for p, name in todo}
            for future in as_completed(futures):
                row = future.result()
                speed = row.get("vs_eager")
                progress.console.print(
                    f"{row['problem']}: {row['outcome']}"
                    + (f", {speed:.2f}x eager" if speed else "")
                    + (f" ({row['error'][:120]})" if row.get("error") else ""),
                    markup=False,
                )
                progress.advance(bar)
        pool.shutdown()
        files = sweep.write()
    except KeyboardInterrupt:
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
        print(
            f"interrupted: the finished rows are in {Path(args.out) / 'rows.jsonl'}; run the same "
            "command again to continue",
            file=sys.stderr,
        )
        return 130
    finally:
        executor.shutdown()
    _print_summary(console, sweep.summary())
    print(f"reports: {', '.join(str(p) for p in files.values())}")
    return 0


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Register ``bench`` on the ``stitch-graph`` sub-command parsers."""
    parser = sub.add_parser(
        "bench",
        help="run the graph (or check candidates) over a suite; JSON, CSV and HTML reports",
        description=cmd_bench.__doc__,
    )
    parser.add_argument("suite", help="folder of KernelBench problem files (searched recursively)")
    parser.add_argument("--out", help="output folder (default: bench/<suite folder name>)")
    parser.add_argument(
        "--only", action="append", help="only problems whose path contains this (repeatable)"
    )
    parser.add_argument(
        "--candidates",
        metavar="DIR",
        help="check the candidates in DIR (PROBLEM's relative path, as a file or folder) "
        "with the verify protocol instead of running the graph",
    )
    add_model_options(parser)
    parser.add_argument("--max-rounds", type=int, default=6)
    parser.add_argument("--wall-time", type=float, default=1800.0, help="seconds per problem")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per worker")
    parser.add_argument(
        "--tune-budget", type=float, default=15.0, help="seconds of autotuning a problem at most"
    )
    parser.add_argument("--arch", default="sm_90a", help="nvcc architecture (sm_90a: H100/H200)")
    parser.add_argument("--no-profile", action="store_true", help="skip ncu profiling")
    parser.add_argument("--no-knowledge", action="store_true", help="skip knowledge-index advice")
    parser.add_argument(
        "--no-baselines",
        action="store_true",
        help="skip the baseline worker (reduce-overhead and default-flags eager stay blank)",
    )
    parser.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="run evaluations on a Ray cluster: 'auto' (the one `ray start` joined), "
        "HOST:PORT, or 'local' (a cluster of this machine); needs the ray extra",
    )
    parser.add_argument(
        "--ray-cpus",
        type=int,
        default=0,
        metavar="N",
        help="with --ray local: CPUs of the local cluster (default: all of this machine's)",
    )
    parser.add_argument(
        "--jobs", type=int, default=0, help="problems at once (default: one per GPU)"
    )
    parser.add_argument(
        "--rerun-errors", action="store_true", help="also run problems whose row is an error"
    )
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="rewrite the reports from OUT's rows, run nothing",
    )
    parser.set_defaults(func=cmd_bench)
    return parser
