"""Check generated programs for KernelBench problems on the CPU, batch shrunk, in training mode.

Usage:
    python tools/check_kernelbench_cpu.py PROBLEM_OR_DIR... [--batch N] [--timeout S] [--json F]

Each problem runs in its own process with a time limit. The problem's module-level
``batch_size`` is set to ``--batch`` (default 2), and its program is generated with the rule-based
generator. The program's kernels then run in the cooperative CPU emulation
(``tests/codegen/cpu_emulation.py``: every thread of a block a coroutine, so warp shuffles and
block barriers keep their CUDA meaning). The result is compared with PyTorch's forward of the
same weights and inputs, in training mode as KernelBench runs models, and with the RNG seeded
before each side's forward. The row also gives both sides' distance from PyTorch's float64
forward, which separates an ill-conditioned problem from a wrong program. No GPU is needed;
nothing here is a timing.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def shrink(source: str, batch: int) -> str:
    """The problem's source with its module-level ``batch_size`` set to ``batch``."""
    return re.sub(r"^(batch_size\s*=\s*)\d+", rf"\g<1>{batch}", source, flags=re.M)


def _max_error(got: list[Any], expected: list[Any]) -> float:
    """The largest difference; equal values (infinities too) and NaN on both sides agree, a
    NaN or an infinity on one side only is infinitely far."""
    worst = 0.0
    for g, e in zip(got, expected):
        g, e = g.double(), e.double()
        same = (g == e) | (g.isnan() & e.isnan())
        diff = (g - e).abs().masked_fill(same, 0.0).nan_to_num(nan=float("inf"))
        worst = max(worst, float(diff.max()) if diff.numel() else 0.0)
    return worst


def check(path: Path, batch: int) -> dict[str, Any]:
    """One problem's row: ``ok`` at 1e-4, errors against eager and against float64."""
    import torch

    sys.path.insert(0, str(ROOT))
    from stitch_graph.codegen import capture_program, emit_candidate, plan_program
    from stitch_graph.execution._common import load_module_state, module_state
    from stitch_graph.task import load_task
    from tests.codegen.cpu_emulation import load_on_cpu

    task = load_task(shrink(path.read_text(), batch))
    ir = capture_program(task)
    program = emit_candidate(ir, plan_program(ir))
    row: dict[str, Any] = {"problem": path.stem, "declared": program.declared_torch_ops}
    with tempfile.TemporaryDirectory() as work:
        kernels, host, ns = load_on_cpu(task, program, Path(work), cooperative=True)
        torch.manual_seed(0)
        reference = ns["Model"](*ns["get_init_inputs"]())
        with torch.no_grad():
            for param in reference.parameters():  # no zero bias can hide a wrong epilogue
                param.add_(0.01 * torch.randn_like(param))
        model = host["ModelNew"](*ns["get_init_inputs"]())
        load_module_state(model, module_state(reference))
        torch.manual_seed(1)
        inputs = ns["get_inputs"]()

        def run(fn: Any, args: list[Any]) -> list[Any]:
            torch.manual_seed(2)
            with torch.no_grad():
                out = fn(*args)
            return list(out) if isinstance(out, list | tuple) else [out]

        def fresh(cast: Any = None) -> list[Any]:
            """The inputs copied for one run: a forward that writes its inputs changes none
            of the others' (``cast``: float inputs converted, to float64)."""
            return [
                (t.to(cast) if cast is not None and t.is_floating_point() else t.clone())
                if torch.is_tensor(t) else t
                for t in inputs
            ]

        got = run(model, fresh())
        expected = run(reference, fresh())
        row["ok"] = all(
            torch.allclose(g, e, rtol=1e-4, atol=1e-4, equal_nan=True) for g, e in zip(got, expected)
        )
        row["err"] = _max_error(got, expected)
        try:
            exact = run(reference.double(), fresh(torch.float64))
            row["err_f64"] = _max_error(got, exact)
            row["eager_err_f64"] = _max_error(expected, exact)
        except Exception:  # noqa: BLE001 - no float64 forward (a float32 tensor made in forward)
            pass
        row["kernels"] = len(kernels.launched)
    return row


def _problems(paths: list[Path]) -> list[Path]:
    found: list[Path] = []
    for path in paths:
        found += sorted(path.glob("*.py")) if path.is_dir() else [path]
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", type=Path)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds a problem")
    parser.add_argument("--json", type=Path, help="write the rows here")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:  # the child: one problem, its row as JSON on stdout
        print(json.dumps(check(args.paths[0], args.batch)))
        return 0
    rows = []
    for path in _problems(args.paths):
        command = [sys.executable, __file__, str(path), "--batch", str(args.batch), "--one"]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout)
            lines = done.stdout.strip().splitlines()
            row = json.loads(lines[-1]) if done.returncode == 0 and lines else {
                "problem": path.stem, "ok": False, "error": done.stderr.strip()[-300:]
            }
        except subprocess.TimeoutExpired:
            row = {"problem": path.stem, "ok": False, "error": f"over {args.timeout:.0f} s"}
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(f"# {sum(bool(r.get('ok')) for r in rows)}/{len(rows)} correct at 1e-4")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
