"""Which common ``torch`` and ``torch.nn.functional`` calls the generator covers.

Usage: ``PYTHONPATH=src python tools/probe_op_coverage.py [CALLS_FILE] [--show all|missing]``

Each line of CALLS_FILE (default ``tools/op_probe/calls.txt``; ``#`` starts a comment) is one
expression of the tensors ``x`` and ``y``, both of shape (4, 8, 16, 32). Every expression becomes
a small problem that is captured, planned and emitted on the CPU (no GPU, no compiler); its row
says ``ok`` when the program leaves nothing to PyTorch, ``DECL`` with the ops it leaves
(declared), or ``ERR`` with why the problem did not capture. The last line counts each. This
finds coverage gaps by sweeping; correctness is the job of the tests (``tests/codegen``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
_PROBLEM = """
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def forward(self, x, y):
        return {expr}


def get_inputs():
    return [torch.randn(4, 8, 16, 32), torch.randn(4, 8, 16, 32)]


def get_init_inputs():
    return []
"""


def probe(expr: str) -> tuple[str, str]:
    """``("ok" | "DECL" | "ERR", detail)`` for one expression."""
    from stitch_graph.codegen import capture_program, emit_candidate, plan_program
    from stitch_graph.task import load_task

    try:
        ir = capture_program(load_task(_PROBLEM.format(expr=expr)))
        declared = emit_candidate(ir, plan_program(ir)).declared_torch_ops
    except Exception as error:  # noqa: BLE001 - a row, never the end of the probe
        return "ERR", f"{type(error).__name__}: {str(error).splitlines()[0][:120]}"
    return ("DECL", ",".join(declared)) if declared else ("ok", "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("calls", nargs="?", type=Path, default=HERE / "op_probe" / "calls.txt")
    parser.add_argument("--show", choices=("all", "missing"), default="missing")
    args = parser.parse_args(argv)
    lines = args.calls.read_text().splitlines()
    exprs = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    counts = {"ok": 0, "DECL": 0, "ERR": 0}
    for expr in exprs:
        status, detail = probe(expr)
        counts[status] += 1
        if args.show == "all" or status != "ok":
            print(f"{status:4s} | {expr}" + (f" | {detail}" if detail else ""), flush=True)
    print(f"{counts['ok']} of {len(exprs)} generated whole; {counts['DECL']} leave ops to "
          f"PyTorch (declared); {counts['ERR']} did not capture")
    return 0


if __name__ == "__main__":
    sys.exit(main())
