"""Fingerprint what the rule-based generator emits, to prove a refactor changed no output.

For every problem file under the given folders: load, capture, plan and emit with two tunings
(the defaults, and one that turns every knob away from them), then hash the plan, the kernel
source and the host source. Prints one line per problem (``name digest``) and a digest over all,
so two runs (before and after a change) compare with ``diff``. A problem that fails any stage
prints the error's type instead of a digest, which is also part of the fingerprint. The shared
CUDA prelude is left out of the kernel source: a helper added to it is not a change of every
program.

Usage: ``python tools/codegen_fingerprint.py DIR [DIR ...] [--out FILE]``
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

from stitch_graph.codegen import (
    KernelTuning,
    Tuning,
    capture_program,
    emit_candidate,
    plan_program,
)
from stitch_graph.codegen._cuda import PRELUDE
from stitch_graph.task import load_task

_TUNINGS = (
    Tuning(),
    Tuning(
        default=KernelTuning(
            block_size=128,
            vector_width=1,
            rows_per_block=2,
            unroll=4,
            split_reduction=True,
            fuse=False,
            conv_library=False,
        ),
        cuda_graph=True,
    ),
)


def fingerprint(path: Path) -> str:
    """The digest of one problem's plan and its programs under both tunings."""
    digest = hashlib.sha256()
    try:
        task = load_task(path, run_reference=False)
        ir = capture_program(task)
        plan = plan_program(ir)
        digest.update(plan.model_dump_json().encode())
        for tuning in _TUNINGS:
            candidate = emit_candidate(ir, plan, tuning=tuning)
            kernels = candidate.kernel_source.replace(PRELUDE, "", 1)
            for text in (kernels, candidate.host_source, candidate.notes):
                digest.update(text.encode())
    except Exception as error:  # noqa: BLE001 - a failing stage is part of the fingerprint
        return f"error:{type(error).__name__}"
    return digest.hexdigest()[:16]


def main(argv: list[str] | None = None) -> int:
    """Print ``name digest`` per problem and the digest over all."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, help="also write the lines to this file")
    args = parser.parse_args(argv)
    lines = []
    for folder in args.folders:
        for path in sorted(folder.rglob("*.py")):
            if path.name.startswith("_") or path.name == "README.py":
                continue
            line = f"{path.relative_to(folder.parent)} {fingerprint(path)}"
            print(line, flush=True)
            lines.append(line)
    total = hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]
    print(f"ALL {len(lines)} {total}")
    if args.out:
        args.out.write_text("\n".join([*lines, f"ALL {len(lines)} {total}"]) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
