"""Run the whole loop on a problem suite and print what was measured.

The maintainer script behind the suite's recorded results; ``stitch-graph bench`` is the command
for users (resumable rows kept across hosts, fast_p, reduce-overhead and default-flags eager,
JSON, CSV and HTML reports, Ray).

For every problem: the outcome, whether the program is correct, its speedup against PyTorch eager
and torch.compile (both timed in the same run, on the same inputs and machine), the rounds used and
the ops left to PyTorch. Geometric means are printed per folder and overall. With no model given
the rule-based agents run.

    python tools/bench_suite.py problems --out results/suite.json [--max-rounds 6] [--only gemm]
        [--warm-compile 8]

``--shard K/N`` runs every N-th problem starting at the K-th (0-based), so that N GPUs can share
a sweep (one process per GPU, each with its own ``--out``); ``--merge A.json B.json ...`` then
prints one table over their rows without running anything. ``--group NAME=FOLDER,FOLDER`` adds a
geometric-mean line over several folders (for instance the fusion problems).

Every sweep works in a folder of its own, so eager and torch.compile are timed afresh for each
problem in this run, never taken from the reference cache of an earlier one.

``--warm-compile N`` first compiles every selected reference with ``torch.compile`` in N parallel
processes, into the Inductor cache the reference workers use, so that the sequential sweep does
not spend most of its time compiling (the timings themselves are unaffected: the same kernels are
loaded from the cache).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

from stitch_graph import StitchContext, create_stitch_graph, load_task
from stitch_graph.bench import geomean


def machine() -> str:
    """The GPU (or CPU) and software versions, for the table's header."""
    import torch

    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    return (
        f"{gpu}; torch {torch.__version__}; CUDA {torch.version.cuda}; "
        f"Python {platform.python_version()}; {platform.node()}"
    )


def run_one(path: Path, ctx: StitchContext) -> dict:
    """Optimise one problem and summarise its report."""
    started = time.time()
    try:
        task = load_task(path)
        result = create_stitch_graph().invoke(
            {"task": task}, context=ctx, config={"recursion_limit": 500}
        )
    except Exception as exc:  # one problem's failure is a row of the table, not the end
        return {"problem": str(path), "outcome": "error", "error": f"{type(exc).__name__}: {exc}"}
    report = result["report"]
    row = {
        "problem": str(path),
        "outcome": report.outcome,
        "rounds": report.rounds,
        "seconds": round(time.time() - started, 1),
        "summary": report.summary,
    }
    best = report.best
    if best is not None:
        row["correct"] = best.test.status == "passed"
        row["declared_torch_ops"] = best.declared_torch_ops
        if best.timing is not None and best.timing.status == "passed":
            t = best.timing
            row.update(
                candidate_ms=t.candidate_ms,
                eager_ms=t.eager_ms,
                compile_ms=t.compile_ms,
                vs_eager=t.speedup_vs_eager,
                vs_compile=t.speedup_vs_compile,
                device=t.device,
            )
    return row


def _compile_reference(path: str) -> str:
    """Compile one problem's reference as the reference worker does; runs in a child process."""
    import torch

    from stitch_graph.execution._common import (
        clone_to,
        draw_inputs,
        init_inputs,
        load_problem,
        set_tf32,
    )

    started = time.time()
    try:
        problem = load_problem(Path(path).read_text(), "stitch_warm_problem")
        set_tf32(False)
        init = init_inputs(problem, 42)  # the default seed: same shapes and constants
        model = problem["Model"](*init).to("cuda")
        args = clone_to(draw_inputs(problem, 43), "cuda")
        with torch.no_grad():
            torch.compile(model)(*args)
        torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001 - the sweep reports compile failures itself
        return f"{path}: not compiled ({type(exc).__name__})"
    return f"{path}: compiled in {time.time() - started:.1f} s"


def warm_compile_cache(paths: list[Path], workers: int) -> None:
    """Fill the shared Inductor cache for ``paths`` with ``workers`` processes at once."""
    import multiprocessing
    import os
    from concurrent.futures import ProcessPoolExecutor

    from stitch_graph.execution.reference import _inductor_cache_dir

    os.environ["TORCHINDUCTOR_CACHE_DIR"] = _inductor_cache_dir()
    started = time.time()
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        for line in pool.map(_compile_reference, [str(p) for p in paths]):
            print(line, file=sys.stderr, flush=True)
    print(f"compile cache warmed in {time.time() - started:.0f} s", file=sys.stderr)


def kept_rows(out: Path, current_machine: str) -> list[dict]:
    """Rows of an earlier run written to ``out`` on this same machine (else none)."""
    if not out.exists():
        return []
    earlier = json.loads(out.read_text())
    if earlier.get("machine") != current_machine:
        print(f"not keeping {out}: it was measured on {earlier.get('machine')}", file=sys.stderr)
        return []
    return [r for r in earlier.get("rows", []) if r.get("outcome") != "error"]


def select_shard(paths: list[Path], shard: str | None) -> list[Path]:
    """The K-th of N interleaved parts of ``paths`` for ``shard`` written "K/N" (all when None)."""
    if shard is None:
        return paths
    try:
        k, n = (int(part) for part in shard.split("/"))
    except ValueError:
        raise SystemExit(f"--shard {shard!r}: write it as K/N, for instance 0/2") from None
    if not 0 <= k < n:
        raise SystemExit(f"--shard {shard!r}: K must be at least 0 and below N")
    return paths[k::n]


def merged_rows(files: list[Path]) -> tuple[list[dict], str]:
    """The rows of several ``--out`` files, sorted by problem, and the machines they name."""
    rows, machines = [], []
    for file in files:
        data = json.loads(file.read_text())
        rows.extend(data.get("rows", []))
        if data.get("machine") not in machines:
            machines.append(data.get("machine"))
    return sorted(rows, key=lambda r: r["problem"]), " | ".join(map(str, machines))


def parse_groups(specs: list[str] | None) -> dict[str, list[str]]:
    """``NAME=FOLDER,FOLDER`` options as a mapping from name to folders."""
    groups = {}
    for spec in specs or []:
        name, sep, folders = spec.partition("=")
        if not sep or not name or not folders:
            raise SystemExit(f"--group {spec!r}: write it as NAME=FOLDER,FOLDER")
        groups[name] = folders.split(",")
    return groups


def print_table(rows: list[dict], header: str, extra_groups: dict | None = None) -> None:
    """Rows side by side, then geometric means per folder, per named group and overall."""
    print(f"# {header}")
    print(
        f"{'problem':48} {'outcome':14} {'ok':3} {'eager ms':>9} {'compile ms':>10} "
        f"{'ours ms':>9} {'vs eager':>8} {'vs comp':>8} {'rounds':>6}"
    )

    def fmt(v, spec):
        if isinstance(v, (int, float)):
            return format(v, spec)
        return format("-", ">" + "".join(c for c in spec.split(".")[0] if c.isdigit()))

    for r in rows:
        print(
            f"{Path(r['problem']).parent.name + '/' + Path(r['problem']).stem:48} "
            f"{r['outcome']:14} {'yes' if r.get('correct') else 'no':3} "
            f"{fmt(r.get('eager_ms'), '9.4f')} {fmt(r.get('compile_ms'), '10.4f')} "
            f"{fmt(r.get('candidate_ms'), '9.4f')} {fmt(r.get('vs_eager'), '8.2f')} "
            f"{fmt(r.get('vs_compile'), '8.2f')} {fmt(r.get('rounds'), '6d')}"
        )
    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(Path(r["problem"]).parent.name, []).append(r)
    for name, folders in (extra_groups or {}).items():
        groups[name] = [r for r in rows if Path(r["problem"]).parent.name in folders]
    groups["ALL"] = rows
    width = max(12, *map(len, groups))
    print(
        f"\n{'group':{width}} {'problems':>8} {'verified':>8} {'partial':>7} {'gm vs eager':>11} "
        f"{'gm vs compile':>13}"
    )
    for name, group in groups.items():
        full = [r for r in group if r["outcome"] == "verified"]
        partial = [r for r in group if r["outcome"] == "partial"]
        ge = geomean([r.get("vs_eager") for r in full])
        gc = geomean([r.get("vs_compile") for r in full])
        print(
            f"{name:{width}} {len(group):8d} {len(full):8d} {len(partial):7d} "
            f"{fmt(ge, '11.2f')} {fmt(gc, '13.2f')}"
        )


def main(argv: list[str] | None = None) -> int:
    """Run the suite (or a part of it) and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path, help="folder of problem files (searched recursively)")
    parser.add_argument("--out", type=Path, help="write the rows as JSON here")
    parser.add_argument(
        "--only", action="append", help="only problems whose path contains this text (repeatable)"
    )
    parser.add_argument("--max-rounds", type=int, default=6)
    parser.add_argument("--no-profile", action="store_true")
    parser.add_argument("--model", help="chat model for every agent (default: rule-based)")
    parser.add_argument(
        "--keep",
        action="store_true",
        help="keep the rows already in --out (same machine) and run only the missing problems",
    )
    parser.add_argument(
        "--warm-compile", type=int, default=0, metavar="N",
        help="compile the references in N parallel processes first (see above)",
    )
    parser.add_argument("--shard", metavar="K/N", help="run only the K-th of N interleaved parts")
    parser.add_argument(
        "--merge", nargs="+", type=Path, metavar="JSON",
        help="print one table over these --out files and run nothing (root is ignored)",
    )
    parser.add_argument(
        "--group", action="append", metavar="NAME=FOLDER,FOLDER",
        help="also print the geometric means over these folders together (repeatable)",
    )
    args = parser.parse_args(argv)
    groups = parse_groups(args.group)
    if args.merge:
        rows, header = merged_rows(args.merge)
        print_table(rows, header, groups)
        return 0
    paths = sorted(p for p in args.root.rglob("*.py") if not p.name.startswith("_"))
    if args.only:
        paths = [p for p in paths if any(part in str(p) for part in args.only)]
    paths = select_shard(paths, args.shard)
    ctx = StitchContext(
        planner_model=args.model,
        coder_model=args.model,
        verifier_model=args.model,
        max_rounds=args.max_rounds,
        profile=not args.no_profile,
        work_dir=tempfile.mkdtemp(prefix="stitch-suite-"),  # references timed in this run
    )
    rows = kept_rows(args.out, machine()) if args.keep and args.out else []
    done = {r["problem"] for r in rows}
    paths = [p for p in paths if str(p) not in done]
    if args.warm_compile and paths:
        warm_compile_cache(paths, args.warm_compile)
    for path in paths:
        row = run_one(path, ctx)
        rows.append(row)
        print(json.dumps(row, default=str), file=sys.stderr, flush=True)
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(
                json.dumps({"machine": machine(), "rows": rows}, indent=1, default=str)
            )
    print_table(rows, machine(), groups)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
