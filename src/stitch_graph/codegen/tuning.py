"""Tuning knobs of the emitted kernels, and the map from Verifier feedback to knob changes.

``Tuning`` is what the rule-based Coder's optimisation loop turns: the Verifier says "low
occupancy", "uncoalesced loads", "launch-bound", "registers spill", ...; ``apply_feedback`` changes
the knobs of the kernels the feedback names (or all of them), and ``emit_candidate`` emits different
code for different knobs (block size and ``__launch_bounds__``, float4 or scalar paths, rows per
block, unroll pragmas, split reductions, fused or separate epilogues, cuDNN or generated
convolutions, CUDA graphs).
"""

from __future__ import annotations

import re

from pydantic import BaseModel, Field

from stitch_graph.artifacts import Feedback, Plan

__all__ = ["KernelTuning", "Tuning", "apply_feedback"]


class KernelTuning(BaseModel):
    """Knobs of one kernel (or the defaults of all)."""

    block_size: int = Field(default=256, description="Threads per block (multiple of 32).")
    vector_width: int = Field(default=4, description="4: float4 path when legal; 1: scalar only.")
    rows_per_block: int = Field(
        default=0, description="Rows a block handles (warp per row); 0: pick from the shape."
    )
    unroll: int = Field(default=1, description="Unroll factor of the inner loops.")
    split_reduction: bool | None = Field(
        default=None, description="Two-stage reduction over long rows; None: pick from the shape."
    )
    fuse: bool = Field(default=True, description="False: prologue/epilogue run as own kernels.")
    conv_engine: int = Field(
        default=0,
        description="Which of cuDNN's FP32 engines (heuristic order) runs the convolution; 0 is "
        "cuDNN's first choice, as PyTorch eager takes it.",
    )
    grid_waves: int = Field(
        default=0,
        description="Blocks per SM at most for grid-stride pointwise kernels; 0: one element "
        "(or float4) per thread, no cap (as PyTorch's elementwise kernels launch; on the H200 "
        "0.93x of torch.relu's bandwidth capped at 32, 1.0x uncapped).",
    )
    conv_library: bool = Field(
        default=True,
        description="Convolutions through cuDNN; False: generated im2col + cuBLAS or direct kernels.",
    )
    rnn_library: bool = Field(
        default=False,
        description="True: a recurrent layer runs as PyTorch's own (cuDNN) RNN, declared as left "
        "to PyTorch; the tuner takes it only when it is faster than the generated steps.",
    )
    rnn_persistent: bool | None = Field(
        default=None,
        description="Recurrent layers: True one kernel runs every time step, each block a few "
        "batch rows with W_hh held in registers; False one launch a step; None: persistent "
        "where the weights fit in a block's registers.",
    )
    gemm_algo: int = Field(
        default=0,
        description="GEMM library call: 0 cublasSgemm (as eager runs it); N > 0 cuBLASLt's N-th "
        "ranked FP32 algorithm for the shape.",
    )
    gemm_kernel: bool = Field(
        default=False,
        description="True: a generated GEMM for at most 16 rows (a warp per few output columns, "
        "the epilogue fused) in place of cuBLAS; the tuner takes it only when faster.",
    )
    transpose_tile: bool = Field(
        default=True,
        description="Pointwise kernels reading an operand whose unit stride lies along another "
        "dim than the output's: True reads it through 32x32 shared-memory tiles (both sides "
        "coalesced); False reads it strided.",
    )
    gemm_epilogue: bool = Field(
        default=True,
        description="A linear layer's bias, and a ReLU that is all its epilogue, applied by "
        "cuBLASLt's epilogue as the GEMM stores its result; False: by a generated kernel after "
        "cuBLAS (a read and a write of the product more).",
    )
    stage_window: bool | None = Field(
        default=None,
        description="Pooling: True stages each window row's input span in shared memory, a "
        "block per run of outputs (windows wider than one element, rows of a warp of outputs "
        "or more); False: a thread per output reading its window from memory; None: staged "
        "over inputs of 2**31 elements or more.",
    )
    fused_attention: bool | None = Field(
        default=None,
        description="Attention groups: True one kernel with the scores on chip; False the "
        "cuBLAS scores, the softmax kernel and cuBLAS with the values; None: one kernel where "
        "a mask hides whole tiles of keys (causal), else three (on an H100 a causal attention "
        "ran 1.11x faster fused, an unmasked one of 197 tokens 0.71x).",
    )


class Tuning(BaseModel):
    """Per-kernel knobs, keyed by plan item id, over a default."""

    default: KernelTuning = Field(default_factory=KernelTuning)
    kernels: dict[str, KernelTuning] = Field(default_factory=dict)
    cuda_graph: bool | None = Field(default=None, description="None: follow the plan.")
    history: list[str] = Field(default_factory=list, description="What feedback changed.")

    def for_item(self, item_id: str) -> KernelTuning:
        """The knobs of one item."""
        return self.kernels.get(item_id, self.default)

    def pruned(self) -> Tuning:
        """This tuning without the items that only repeat the default: two tunings that emit
        the same program then compare equal (a tuner's choice and the same choice from a cache)."""
        kept = {k: v for k, v in self.kernels.items() if v != self.default}
        return self.model_copy(update={"kernels": kept}, deep=True)


def _targets(text: str, plan: Plan) -> list[str]:
    hits = [
        i.id
        for i in plan.items
        if re.search(rf"\b{re.escape(i.id)}\b", text) or (i.kernel and i.kernel in text)
    ]
    return hits or [i.id for i in plan.items]


def apply_feedback(tuning: Tuning | None, plan: Plan, feedback: Feedback) -> Tuning:
    """Turn Verifier feedback into knob changes.

    Understood: block size / occupancy, vectorise / coalescing, registers / spills, unroll,
    split reduction, fuse / unfuse, launch-bound / CUDA graph, rows per block. Items naming a
    kernel (its item id or kernel name) change that kernel only, else all kernels.

    Args:
        tuning: Current knobs (``None``: defaults).
        plan: The plan the kernels come from.
        feedback: The Verifier's feedback.

    Returns:
        New knobs; ``history`` says what changed. Unchanged knobs mean nothing was understood.
    """
    new = (tuning or Tuning()).model_copy(deep=True)
    for item in feedback.items:
        text = f"{item.action} {item.detail}".lower()
        for item_id in _targets(text, plan):
            k = new.kernels.get(item_id, new.default).model_copy()
            before = k.model_dump()
            if "unfuse" in text or "un-fuse" in text or "separate kernel" in text:
                k.fuse = False
            elif "fuse" in text:
                k.fuse = True
            if "register" in text or "spill" in text:
                k.block_size = max(64, k.block_size // 2)
                k.unroll = 1
            elif "occupancy" in text or "block size" in text:
                smaller = "smaller" in text or "decrease" in text or "reduce block" in text
                k.block_size = (
                    max(64, k.block_size // 2) if smaller else min(1024, k.block_size * 2)
                )
            if "vectori" in text or "coalesc" in text or "float4" in text:
                k.vector_width = 4 if k.vector_width == 1 or "scalar" not in text else 1
                if k.vector_width == 4 and before["vector_width"] == 4:
                    k.rows_per_block = 0 if k.rows_per_block else 4
            if "unroll" in text:
                k.unroll = 4 if k.unroll < 4 else 8
            failed = feedback.category in ("runtime_error", "wrong_result")
            if "im2col" in text or "generated conv" in text or ("cudnn" in text and failed):
                k.conv_library = False
            elif "cudnn" in text:
                k.conv_library = True
            if "split" in text and "reduc" in text:
                k.split_reduction = True
            if "rows per block" in text or "warp per row" in text:
                k.rows_per_block = max(1, k.rows_per_block) * 2
            if k.model_dump() != before:
                new.kernels[item_id] = k
                new.history.append(f"{item_id}: {item.action} -> {_diff(before, k.model_dump())}")
        if "launch" in text or "cuda graph" in text:
            if new.cuda_graph is not True:
                new.cuda_graph = True
                new.history.append(f"host: {item.action} -> cuda_graph=True")
    return new


def _diff(before: dict, after: dict) -> str:
    return ", ".join(f"{k}={after[k]}" for k in after if after[k] != before[k])
