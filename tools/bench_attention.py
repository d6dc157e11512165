"""Fused attention against the three kernels it replaces, eager and torch.compile, on a GPU.

For each shape of a grid (batch x heads, queries = keys, head dim, causal or not), the rule-based
generator's program is emitted twice: attention as one kernel (``fused_attention=True``) and as
cuBLAS scores, the softmax kernel and cuBLAS with the values (``False``). Both are matched
against eager at 1e-4 (TF32 off), then the two programs, eager and ``torch.compile`` are timed
in turns in one process, three medians each, the best kept. One line a shape: the four times in
ms and fused against the others, so the default (``_fusion_attention.runs_fused``) can follow
the measurements.

Usage: ``PYTHONPATH=src python tools/bench_attention.py [--quick]``
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from ab_codegen_setting import _close, _model_of

from stitch_graph.codegen import capture_program, emit_candidate, plan_program
from stitch_graph.codegen.tuning import KernelTuning, Tuning
from stitch_graph.execution.timing import time_cuda
from stitch_graph.task import load_task

_PROBLEM = """
import math
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("keep", torch.tril(torch.ones({t}, {t}, dtype=torch.bool)))

    def forward(self, q, k, v):
        s = (q @ k.transpose(-2, -1)) / math.sqrt({d})
        {mask}
        return torch.softmax(s, dim=-1) @ v


def get_inputs():
    return [torch.randn({b}, {h}, {t}, {d}) for _ in range(3)]


def get_init_inputs():
    return []
"""
_CAUSAL = "s = s.masked_fill(~self.keep, float('-inf'))"

# (batch, heads, tokens, head dim): a ViT, GPT-2 small and medium, an LLM's long context
GRID = [
    (64, 12, 197, 64), (16, 12, 512, 64), (16, 8, 1024, 96), (8, 16, 1024, 64),
    (4, 32, 2048, 128), (128, 4, 64, 32),
]
QUICK = GRID[:3]


def _timed(fns: list[Any]) -> list[float]:
    turns = [[time_cuda(fn, runs=15)["median_ms"] for fn in fns] for _ in range(3)]
    return [min(column) for column in zip(*turns, strict=True)]


def bench(b: int, h: int, t: int, d: int, causal: bool) -> str:
    """One shape's line."""
    source = _PROBLEM.format(b=b, h=h, t=t, d=d, mask=_CAUSAL if causal else "")
    ir = capture_program(load_task(source))
    plan = plan_program(ir)
    programs = [
        emit_candidate(ir, plan, tuning=Tuning(default=KernelTuning(fused_attention=fused)))
        for fused in (True, False)
    ]
    namespace: dict[str, Any] = {"__name__": "reference"}
    exec(compile(source, "<attention>", "exec"), namespace)  # noqa: S102 - the problem
    reference = namespace["Model"]().cuda()
    fused, three = (_model_of(p, [], reference) for p in programs)
    compiled = torch.compile(reference)
    with torch.no_grad():
        torch.manual_seed(0)
        inputs = [x.cuda() for x in namespace["get_inputs"]()]
        want = reference(*inputs)
        matches = [_close(m(*inputs), want) for m in (fused, three)]
        compiled(*inputs)  # compiled before it is timed
        times = _timed([lambda m=m: m(*inputs) for m in (fused, three, reference, compiled)])
    f, u, e, c = times
    label = f"{b}x{h} x {t} x {d} {'causal' if causal else 'full'}"
    return (
        f"{label:28s} fused {f:7.3f} three {u:7.3f} eager {e:7.3f} compile {c:7.3f} | "
        f"fused x three {u / f:5.2f} x eager {e / f:5.2f} x compile {c / f:5.2f} "
        f"match {matches[0]} {matches[1]}"
    )


def main(argv: list[str]) -> None:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    print(f"# {torch.cuda.get_device_name()} | torch {torch.__version__}", flush=True)
    for shape in QUICK if "--quick" in argv else GRID:
        for causal in (True, False):
            try:
                print(bench(*shape, causal), flush=True)
            except Exception as error:  # noqa: BLE001 - one shape's failure is its line
                print(f"{shape} causal={causal} ERROR {type(error).__name__}: {error}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
