"""Time the NVRTC build of generated programs whole and split into parts, from cold caches.

For each problem: capture, plan and emit the rule-based program, then build its kernels three
ways, each with an empty CuPy kernel cache: whole (one NVRTC build), split (``KernelLibrary``'s
default: up to one part a core, built at once), and a tuning variant (one kernel's block size
changed) built split against the cache the split build left, which is what the tuner pays per
setting (``rebuilt``: the variant's parts not in that cache). Prints one row per problem and the
machine.

Usage: ``PYTHONPATH=src python tools/bench_split_build.py PROBLEM.py [PROBLEM.py ...]``
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def _timed_build(source: str, cache: str, parts: int | None) -> float:
    """Seconds to build ``source`` into a ``KernelLibrary`` with CuPy's cache at ``cache``."""
    from stitch_graph.runtime.kernels import KernelLibrary

    os.environ["CUPY_CACHE_DIR"] = cache  # CuPy reads it at each build
    begun = time.perf_counter()
    KernelLibrary(source, parts=parts)
    return time.perf_counter() - begun


def _variant(ir: Any, plan: Any, program: str) -> str:
    """The program with the first item whose block size changes its code given another."""
    from stitch_graph.codegen import KernelTuning, Tuning, emit_candidate

    for item in plan.items:
        for block in (128, 256, 512):
            tuning = Tuning(kernels={item.id: KernelTuning(block_size=block)})
            source = emit_candidate(ir, plan, tuning=tuning).kernel_source
            if source != program:
                return source
    return program


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("problems", nargs="+")
    args = parser.parse_args(argv)

    import torch

    from stitch_graph.codegen import capture_program, emit_candidate, plan_program
    from stitch_graph.runtime.kernels import kernel_signatures
    from stitch_graph.runtime.split import default_parts, split_kernels
    from stitch_graph.task import load_task

    print(f"# {torch.cuda.get_device_name()} | torch {torch.__version__} | {os.cpu_count()} CPUs")
    print(f"{'problem':44} {'kernels':>7} {'parts':>5} {'whole s':>8} {'split s':>8} "
          f"{'variant s':>9} {'rebuilt':>7}")
    root = tempfile.mkdtemp(prefix="split_build_")
    for path in args.problems:
        task = load_task(Path(path))
        ir = capture_program(task)
        plan = plan_program(ir)
        program = emit_candidate(ir, plan).kernel_source
        variant = _variant(ir, plan, program)
        pieces = split_kernels(program, default_parts())
        rebuilt = len(set(split_kernels(variant, default_parts())) - set(pieces))
        # fresh caches a problem, kept to the end: CuPy may keep writing to the folder it read
        whole, split = tempfile.mkdtemp(dir=root), tempfile.mkdtemp(dir=root)
        whole_s = _timed_build(program, whole, parts=1)
        split_s = _timed_build(program, split, parts=None)
        variant_s = _timed_build(variant, split, parts=None)
        name = Path(path).stem[:44]
        print(f"{name:44} {len(kernel_signatures(program)):7d} {len(pieces):5d} {whole_s:8.1f} "
              f"{split_s:8.1f} {variant_s:9.1f} {rebuilt:7d}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
