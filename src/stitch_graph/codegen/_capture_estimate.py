"""What a rewrite of the lowered IR would cost once scheduled, so a pass keeps it only where
the estimate falls: a copy of the IR to try it on, and the scheduler's estimate of the device
time (every group's bytes or FLOPs at the GPU's rate, plus one launch a group)."""

from __future__ import annotations

import copy

from stitch_graph.codegen.ir import ProgramIR
from stitch_graph.codegen.schedule import LAUNCH_US, estimate_us, schedule_program


def trial_copy(ir: ProgramIR) -> ProgramIR:
    """A copy whose node list, nodes and layout tables a rewrite may change (a rewrite gives a
    node new argument containers rather than changing them in place)."""
    trial = copy.copy(ir)
    trial.nodes = [copy.copy(n) for n in ir.nodes]
    trial.outputs = list(ir.outputs)
    trial.shapes, trial.strides, trial.dtypes = dict(ir.shapes), dict(ir.strides), dict(ir.dtypes)
    return trial


def adopt(ir: ProgramIR, trial: ProgramIR) -> None:
    """``ir`` takes the trial's nodes, outputs and layouts."""
    ir.nodes, ir.outputs = trial.nodes, trial.outputs
    ir.shapes, ir.strides, ir.dtypes = trial.shapes, trial.strides, trial.dtypes


def device_us(ir: ProgramIR) -> float:
    """The scheduled program's estimated device time, launches included."""
    groups = schedule_program(ir)
    return sum(estimate_us(ir, g) for g in groups) + LAUNCH_US * len(groups)
