"""A/B of one code-generator setting on a GPU: is a heuristic worth keeping?

Each problem's program is emitted twice: with a module attribute of the generator replaced
(A) and as it is (B). Both are checked against the reference (train mode, as KernelBench runs
it; 1e-4 with TF32 off) and timed in turns, three medians each. Prints both times in ms, B's
gain over A, whether both match, and "(same source)" where the setting changed nothing.

Usage: ``PYTHONPATH=src python tools/ab_codegen_setting.py MODULE ATTRIBUTE VALUE_A FILE...``,
e.g. ``stitch_graph.codegen._emit_pool_scan _Window.slides 'lambda self, ir, x: False'``
(``VALUE_A`` is a Python expression; ``ATTRIBUTE`` may be dotted through a class).
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

import torch

from stitch_graph.codegen import capture_program, emit_candidate, plan_program
from stitch_graph.execution._common import load_module_state, module_state
from stitch_graph.execution.timing import time_cuda
from stitch_graph.runtime.kernels import KernelLibrary
from stitch_graph.runtime.problem_source import exec_problem
from stitch_graph.task import load_task


def _close(got: Any, want: Any) -> bool:
    """Outputs equal at 1e-4, a tuple of them output by output."""
    if isinstance(want, tuple | list):
        return len(got) == len(want) and all(map(_close, got, want))
    if not torch.is_tensor(want):
        return got == want
    if want.is_floating_point():
        return torch.allclose(got, want, rtol=1e-4, atol=1e-4)
    return torch.equal(got, want)


def _emitted(source: str) -> Any:
    ir = capture_program(load_task(source))
    return emit_candidate(ir, plan_program(ir))


def _model_of(program: Any, init: list[Any], reference: torch.nn.Module) -> torch.nn.Module:
    host = {"KERNELS": KernelLibrary(program.kernel_source), "__name__": "candidate"}
    exec(compile(program.host_source, "<host>", "exec"), host)  # noqa: S102 - the program
    model = host["ModelNew"](*init).cuda()
    load_module_state(model, module_state(reference))
    return model


def compare(owner: Any, attribute: str, value_a: Any, path: Path) -> str:
    """One problem's line: A's and B's median ms, B's gain, and whether each matches."""
    source = path.read_text()
    saved = getattr(owner, attribute)
    setattr(owner, attribute, value_a)
    try:
        program_a = _emitted(source)
    finally:
        setattr(owner, attribute, saved)
    program_b = _emitted(source)
    namespace = exec_problem(source, str(path), "reference")
    init = namespace["get_init_inputs"]()
    torch.manual_seed(0)
    reference = namespace["Model"](*init).cuda()
    models = [_model_of(p, init, reference) for p in (program_a, program_b)]
    with torch.no_grad():
        torch.manual_seed(1)
        inputs = [x.cuda() if torch.is_tensor(x) else x for x in namespace["get_inputs"]()]
        want = reference(*inputs)
        matches = [_close(m(*inputs), want) for m in models]
        turns = [
            [time_cuda(lambda m=m: m(*inputs), runs=15)["median_ms"] for m in models]
            for _ in range(3)
        ]
    time_a, time_b = (min(column) for column in zip(*turns, strict=True))
    same = " (same source)" if program_a.kernel_source == program_b.kernel_source else ""
    return (
        f"{path.name[:48]:48s} A {time_a:.3f} B {time_b:.3f} gain {time_a / time_b:.3f} "
        f"match {matches[0]} {matches[1]}{same}"
    )


def main(argv: list[str]) -> None:
    if len(argv) < 4:
        sys.exit(__doc__)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    owner = importlib.import_module(argv[0])
    *path, attribute = argv[1].split(".")
    for part in path:
        owner = getattr(owner, part)
    value_a = eval(argv[2])  # noqa: S307 - the user's own expression
    for name in argv[3:]:
        try:
            print(compare(owner, attribute, value_a, Path(name)), flush=True)
        except Exception as error:  # noqa: BLE001 - one problem's failure is its row
            print(f"{Path(name).name[:48]:48s} ERROR {type(error).__name__}: {error}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
