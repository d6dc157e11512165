"""Tuning spaces: the knob settings worth timing for each kind of generated kernel.

The emitter picks launch shapes from the problem's shapes by rule; the rule is often right and
sometimes far off (a warp per row where a block wins, 256 threads where 1024 fill the GPU). Like
Inductor's autotuner, the autotuner times a short list of settings on the real shapes and keeps
the fastest. Each kernel kind declares its list here: block sizes, rows per block (warp or block
per row), vector width, unroll, split or single-pass reductions, the cuDNN or generated
convolution and which of cuDNN's FP32 engines runs it (cuDNN's heuristics rank engines; timing
the first few on the real shape is what ``torch.backends.cudnn.benchmark`` does). Settings that emit the same code as another are removed by the autotuner before
anything is built, so a list may be generous.

Profile findings narrow a space: ``narrow_space`` keeps the settings that address the named
bottleneck first, so a tuning budget is spent where ncu points.
"""

from __future__ import annotations

from typing import Any

from stitch_graph.codegen.tuning import KernelTuning

__all__ = ["SPACES", "narrow_space", "space_kind", "tuning_space"]

_BLOCKS = (128, 256, 512, 1024)

SPACES: dict[str, list[dict[str, Any]]] = {
    "pointwise": [
        *({"block_size": b} for b in _BLOCKS),
        *({"block_size": b, "unroll": 4} for b in (256, 1024)),
        *({"grid_waves": w} for w in (32, 128)),
        {"vector_width": 1},
        {"transpose_tile": False},
    ],
    "reduction": [
        *({"rows_per_block": r, "block_size": b} for r in (0, 1) for b in _BLOCKS),
        *({"rows_per_block": r} for r in (2, 4, 8)),
        {"split_reduction": True},
        {"split_reduction": False},
        *({"unroll": u} for u in (4, 8)),  # more loads in flight on long rows
        {"vector_width": 1},
    ],
    # a thread an output walking a strided column: what moves it is more loads in flight, a
    # tile of chunks an output or a longer unroll; rows per block only serialise it (a 1.5 s
    # budget timed four row settings of KernelBench L1's strided argmax and none of these)
    "column_reduction": [
        {"split_reduction": True},
        *({"unroll": u} for u in (8, 16)),
        *({"block_size": b} for b in (128, 512)),
        {"split_reduction": False},
    ],
    "softmax": [
        *({"rows_per_block": r, "block_size": b} for r in (0, 1) for b in _BLOCKS),
        *({"rows_per_block": r} for r in (2, 4, 8)),
        {"split_reduction": True},
        {"split_reduction": False},
        *({"unroll": u} for u in (4, 8)),  # more loads in flight on long rows
        {"vector_width": 1},
    ],
    "norm": [
        *({"rows_per_block": r, "block_size": b} for r in (0, 1) for b in _BLOCKS),
        *({"rows_per_block": r} for r in (2, 4, 8)),
        {"split_reduction": True},
        {"split_reduction": False},
        *({"unroll": u} for u in (4, 8)),  # more loads in flight on long rows
        {"vector_width": 1},
    ],
    "conv": [  # the convolution itself first, its epilogue's block size last: a cut budget
        *({"conv_library": True, "conv_engine": e} for e in (1, 2, 3)),  # keeps what matters
        {"conv_library": False},
        {"conv_library": False, "gemm_algo": 1},  # im2col (1x1: none) + a cuBLASLt algorithm
        *({"conv_library": True, "block_size": b} for b in _BLOCKS),
        {"conv_library": False, "block_size": 128},
    ],
    # cuDNN's FP32 transposed 3-D convolutions (backward data) lost to the generated path by
    # 1.5-2.1x on KernelBench level 2 (H200): time that first, before a short budget ends
    "conv_transpose": [
        {"conv_library": False},
        *({"conv_library": True, "conv_engine": e} for e in (1, 2, 3)),
        {"conv_library": False, "gemm_algo": 1},
        *({"conv_library": True, "block_size": b} for b in _BLOCKS),
        {"conv_library": False, "block_size": 128},
    ],
    # cuDNN's depthwise engines ranged from 2x faster than eager to 4.4x slower (KernelBench L1
    # 82-86, H200; 83's 3x1 kernel: 6.3 ms against eager's 1.4 ms), and a 1.5 s budget timed
    # only its engines: the generated direct kernel goes first
    "conv_depthwise": [
        {"conv_library": False},
        *({"conv_library": False, "block_size": b} for b in (128, 512)),
        *({"conv_library": True, "conv_engine": e} for e in (1, 2, 3)),
        *({"conv_library": True, "block_size": b} for b in _BLOCKS),
    ],
    "gemm": [  # the GEMM is most of the time: a skinny one's own kernel, then the library's
        {"gemm_kernel": True},
        *({"gemm_algo": a} for a in (1, 2, 3)),
        {"gemm_epilogue": False},
        *({"block_size": b} for b in _BLOCKS),
        {"fuse": False},
    ],
    # staged or not first: each beat the other by 1.3-3x on KernelBench L1 (H200), block sizes
    # moved those rows by a few percent. Windows sliding by one: four outputs a thread beat a
    # thread per output by 1.6x and 1.5x on L1 41 and 42 and lost by 1.5x on 44 (H200)
    "pool": [
        {"stage_window": True},
        {"stage_window": False},
        {"stage_window": False, "vector_width": 1},
        *({"block_size": b} for b in _BLOCKS),
    ],
    "scan": [
        {"split_reduction": False},  # a thread a line against chunks of lines (or the reverse)
        {"split_reduction": True},
        *({"block_size": b} for b in _BLOCKS),
        {"rows_per_block": 1},
        {"vector_width": 1},  # a warp a line: 32 elements a step rather than 128
    ],
    # fused attention against the three kernels it replaces (GEMM, softmax, GEMM), then the
    # queries a block of the fused kernel (more blocks where the batch and sequence are short)
    "attention": [
        {"fused_attention": True},
        {"fused_attention": False},
        *({"fused_attention": True, "rows_per_block": r} for r in (64, 32, 16)),
    ],
    "rnn": [
        {"rows_per_block": 2},  # the persistent kernel's batch rows a block
        {"rnn_persistent": False},
        *({"rnn_persistent": False, "block_size": b} for b in _BLOCKS),
        {"fuse": False},
        # last, against the best generated steps: cuDNN's RNN, declared, taken only when faster
        # (once taken, settings that generate the layer again no longer compare)
        {"rnn_library": True},
    ],
}

# Bottleneck class (as the Verifier names it) -> the knobs whose settings come first.
_FIRST_FOR: dict[str, tuple[str, ...]] = {
    "memory_bound": ("vector_width", "transpose_tile", "grid_waves", "unroll", "rows_per_block"),
    "latency_bound": ("block_size", "rows_per_block", "split_reduction"),
    "low_occupancy": ("block_size", "rows_per_block"),
    "launch_bound": ("rows_per_block", "fuse"),
    "compute_bound": ("gemm_algo", "conv_library", "conv_engine", "unroll"),
    "register_spill": ("block_size", "unroll"),
}


def space_kind(
    kind: str, anchor_op: str | None, *, strided: bool = False, depthwise: bool = False
) -> str:
    """The space a kernel is tuned in: its group kind, except that transposed and
    ``depthwise`` convolutions and reductions over a ``strided`` dim (outputs along contiguous
    memory) have their own order."""
    if kind == "conv" and (anchor_op or "").startswith("conv_transpose"):
        return "conv_transpose"
    if kind == "conv" and depthwise:
        return "conv_depthwise"
    if kind == "reduction" and strided:
        return "column_reduction"
    return kind


def tuning_space(kind: str, base: KernelTuning | None = None) -> list[KernelTuning]:
    """The settings to time for a kernel of ``kind``, each a change of ``base``; ``base`` first.

    Args:
        kind: The group kind (``pointwise``, ``reduction``, ``softmax``, ``norm``, ``conv``,
            ``gemm``, ``pool``, ``scan``, ``rnn``), or ``conv_transpose``, ``conv_depthwise`` or
            ``column_reduction`` (``space_kind``).
        base: The settings the kernel has now (defaults when ``None``).

    Returns:
        ``base`` followed by every distinct setting of the kind's space.
    """
    base = base or KernelTuning()
    settings = [base]
    for change in SPACES.get(kind, []):
        setting = base.model_copy(update=change)
        if setting not in settings:
            settings.append(setting)
    return settings


def narrow_space(space: list[KernelTuning], bottleneck: str | None) -> list[KernelTuning]:
    """Reorder ``space`` so the settings that touch the bottleneck's knobs come right after the
    first (the current) one; ``bottleneck`` is a Verifier class such as ``memory_bound``."""
    knobs = _FIRST_FOR.get(bottleneck or "", ())
    if not knobs or len(space) < 2:
        return list(space)
    base, rest = space[0], space[1:]

    def touches(setting: KernelTuning) -> bool:
        return any(getattr(setting, k) != getattr(base, k) for k in knobs)

    return [base, *[s for s in rest if touches(s)], *[s for s in rest if not touches(s)]]
