"""What limits a generated program: every kernel of one forward call under Nsight Compute.

For each problem file: the rule-based program is generated (tuned from the tuning cache when
``--tune``, so a sweep's choices are reused), run without CUDA-graph replay so that each launch
is its own kernel, and profiled with ncu's SpeedOfLight, Occupancy and LaunchStats sections
through the Verifier's own profiling job. Prints the kernels by duration with DRAM and SM
throughput (% of peak), occupancy, registers and launch shape, ncu's bottleneck class per
kernel, and the time shares of generated kernels and library kernels (cuDNN, cuBLAS).

Usage: ``PYTHONPATH=src python tools/profile_program.py PROBLEM.py [...] [--tune] [--top 12]
[--json FILE]``
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any


def profile(path: Path, tune: bool, budget_s: float) -> dict[str, Any]:
    """The ncu report of one problem's generated program, as a plain dict."""
    from stitch_graph.codegen import Tuning, capture_program, emit_candidate, plan_program
    from stitch_graph.execution.profiling import profile_candidate
    from stitch_graph.task import load_task

    task = load_task(str(path))
    ir = capture_program(task)
    plan = plan_program(ir)
    tuning = Tuning()
    if tune:
        from stitch_graph.execution.autotune import tune_program

        tuning = tune_program(task, ir, plan, budget_s=budget_s)[1]
    tuning = tuning.model_copy(update={"cuda_graph": False})  # one kernel per launch
    candidate = emit_candidate(ir, plan, tuning=tuning)
    report = profile_candidate(task, candidate, launch_count=None)
    return {"problem": path.stem, **report.model_dump()}


def _library(name: str) -> bool:
    """Whether a kernel is a library's (cuDNN, cuBLAS, CUTLASS): generated ones are ``k<N>_*``."""
    return re.match(r"k\d+_", name) is None


def print_report(row: dict[str, Any], top: int) -> None:
    kernels = row.get("kernels") or []
    print(f"## {row['problem']}: {row['status']} {row.get('reason', '')}".rstrip())
    if not kernels:
        return
    total = sum(k.get("duration_us") or 0.0 for k in kernels)
    library = sum(k.get("duration_us") or 0.0 for k in kernels if _library(k["name"]))
    print(
        f"{len(kernels)} kernels, {total:.1f} us of GPU time; library kernels "
        f"{100 * library / total if total else 0:.0f}%, generated "
        f"{100 * (total - library) / total if total else 0:.0f}%; bottleneck {row['bottleneck']}"
    )
    print(f"{'kernel':44s} {'us':>8s} {'dram%':>6s} {'sm%':>6s} {'occ%':>6s} {'regs':>5s}"
          f" {'block':>6s} {'grid':>7s}  limit")
    ranked = sorted(kernels, key=lambda k: -(k.get("duration_us") or 0.0))
    for k in ranked[:top]:
        print(
            f"{k['name'][:44]:44s} {_cell(k, 'duration_us', 8, 1)} {_cell(k, 'dram_pct')} "
            f"{_cell(k, 'sm_pct')} {_cell(k, 'achieved_occupancy_pct')} "
            f"{_cell(k, 'registers_per_thread', 5)} {_cell(k, 'block_size')} "
            f"{_cell(k, 'grid_size', 7)}  {k.get('bottleneck', '')}"
        )


def _cell(kernel: dict[str, Any], key: str, width: int = 6, digits: int = 0) -> str:
    value = kernel.get(key)
    return f"{value:{width}.{digits}f}" if value is not None else f"{'-':>{width}s}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("problems", nargs="+", type=Path)
    parser.add_argument("--tune", action="store_true", help="tune first (cached choices reused)")
    parser.add_argument("--tune-budget", type=float, default=20.0)
    parser.add_argument("--top", type=int, default=12, help="kernels shown per problem")
    parser.add_argument("--json", type=Path, help="write every report here")
    args = parser.parse_args(argv)
    rows = []
    for path in args.problems:
        try:
            row = profile(path, args.tune, args.tune_budget)
        except Exception as error:  # noqa: BLE001 - one problem's failure is its row
            row = {"problem": path.stem, "status": "error", "reason": f"{error}"[:300]}
        rows.append(row)
        print_report(row, args.top)
        sys.stdout.flush()
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
