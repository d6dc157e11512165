"""Rule-based code generation: capture -> IR -> fusion schedule/plan -> CUDA + host emission.

The split follows PyTorch Inductor at a much smaller scale so that the Planner reasons over the
IR and the plan while the Coder only emits: ``capture_program`` traces a KernelBench task into a
``ProgramIR``; ``plan_program`` fuses it into kernel items (a ``Plan``); ``emit_candidate``
writes CUDA plus a ``ModelNew`` host module for the items done so far; ``apply_feedback`` turns
Verifier feedback into ``Tuning`` changes for the next round. Op coverage lives in one registry
(``ops.REGISTRY``); ``explain_unsupported`` says why an op stays in PyTorch.
"""

from stitch_graph.codegen.capture import CaptureError, capture_program
from stitch_graph.codegen.emit import EmitError, emit_candidate
from stitch_graph.codegen.ir import Group, OpNode, ParamSpec, ProgramIR, Ref
from stitch_graph.codegen.ops import REGISTRY, OpInfo, explain_unsupported
from stitch_graph.codegen.schedule import (
    LAUNCH_US,
    estimate_us,
    group_signature,
    groups_from_plan,
    plan_program,
    schedule_program,
)
from stitch_graph.codegen.tuning import KernelTuning, Tuning, apply_feedback

__all__ = [
    "REGISTRY",
    "CaptureError",
    "EmitError",
    "Group",
    "KernelTuning",
    "OpInfo",
    "OpNode",
    "ParamSpec",
    "ProgramIR",
    "Ref",
    "Tuning",
    "apply_feedback",
    "capture_program",
    "emit_candidate",
    "LAUNCH_US",
    "estimate_us",
    "explain_unsupported",
    "group_signature",
    "groups_from_plan",
    "plan_program",
    "schedule_program",
]
