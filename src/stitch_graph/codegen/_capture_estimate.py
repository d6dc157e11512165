"""What a rewrite of the lowered IR would cost once scheduled, so a pass keeps it only where
the estimate falls: a copy of the IR to try it on, and the scheduler's estimate of the device
time (every group's bytes or FLOPs at the GPU's rate, plus one launch a group)."""

from __future__ import annotations

import copy

from stitch_graph.codegen.ir import ProgramIR, numel
from stitch_graph.codegen.schedule import (
    HBM_BYTES_PER_US,
    LAUNCH_US,
    epilogue_kernel_follows,
    estimate_us,
    schedule_program,
)


def trial_copy(ir: ProgramIR) -> ProgramIR:
    """A copy whose node list, nodes, parameters and layout tables a rewrite may change (a
    rewrite gives a node new argument containers rather than changing them in place)."""
    trial = copy.copy(ir)
    trial.nodes = [copy.copy(n) for n in ir.nodes]
    trial.params = list(ir.params)
    trial.outputs = list(ir.outputs)
    trial.shapes, trial.strides, trial.dtypes = dict(ir.shapes), dict(ir.strides), dict(ir.dtypes)
    return trial


def adopt(ir: ProgramIR, trial: ProgramIR) -> None:
    """``ir`` takes the trial's nodes, outputs, parameters and layouts."""
    ir.nodes, ir.outputs, ir.params = trial.nodes, trial.outputs, trial.params
    ir.shapes, ir.strides, ir.dtypes = trial.shapes, trial.strides, trial.dtypes


def device_us(ir: ProgramIR) -> float:
    """The scheduled program's estimated device time, launches included. A library call
    (cuBLAS, cuDNN) followed by its bias and epilogue kernel counts that kernel too: a launch,
    and the product written by the library and read back, which the group's roofline (its
    FLOPs, where the GEMM is compute-bound) leaves out."""
    groups = schedule_program(ir)
    total = sum(estimate_us(ir, g) for g in groups) + LAUNCH_US * len(groups)
    for g in groups:
        if epilogue_kernel_follows(ir, g):
            total += LAUNCH_US + 8.0 * numel(ir.node(g.anchor or "").shape) / HBM_BYTES_PER_US
    return total
