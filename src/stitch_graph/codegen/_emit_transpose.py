"""Pointwise kernels that read an operand transposed, through a shared-memory tile.

A pointwise kernel walks its output in memory order, so consecutive threads write consecutive
elements. An operand read through a permutation that moves its unit stride elsewhere (a
ConvNeXt block's NHWC result added back to an NCHW input, a ViT's ``flatten(2).transpose(1,
2)``, keys laid out for a product) is then read a 32-byte sector per thread for 4 useful bytes.
Here the output is cut into 32 x 32 tiles over two of its dims: ``b``, the one along which the
operand is contiguous, and the dims after it, taken as one (the output's rows). The block loads
each such operand's tile with consecutive threads along ``b``, then computes the outputs with
consecutive threads along the rows, reading the operand from the tile. Both sides coalesce.
A ``[32][33]`` tile keeps the column reads free of bank conflicts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from stitch_graph.codegen.ir import ProgramIR, Ref, numel

TILE = 32
_ROWS_A_PASS = 8  # warps of a block: each walks every 8th line of the tile
TILE_THREADS = TILE * _ROWS_A_PASS
_SMALLEST = 16  # dims shorter than this leave most of a tile idle: read strided instead


@dataclass(frozen=True)
class TransposeTile:
    """The output as ``(outer, span, rows)``: ``span`` is dim ``b``'s length, ``rows`` the
    elements after it; ``refs`` are the operands read through the tile."""

    outer: int
    span: int
    rows: int
    refs: tuple[Ref, ...]

    @property
    def tiles(self) -> int:
        return self.outer * math.ceil(self.span / TILE) * math.ceil(self.rows / TILE)


def _strides_in(ir: ProgramIR, ref: Ref, space: tuple[int, ...]) -> list[int]:
    """``ref``'s stride along each dim of ``space`` (aligned right; 0 where it broadcasts)."""
    shape, strides = ir.shapes[ref], ir.strides[ref]
    lead = len(space) - len(shape)
    return [
        0 if d < lead or shape[d - lead] == 1 else int(strides[d - lead]) for d in range(len(space))
    ]


def _contiguous_dim(strides: list[int], space: tuple[int, ...]) -> int | None:
    """The dim ``b`` of ``space`` whose stride is 1 when the dims after it are one dim of a
    stride above 1 (mergeable: each stride is the next one's times the next dim's length),
    else ``None``."""
    after = [d for d in range(len(space)) if space[d] > 1]
    if len(after) < 2 or strides[after[-1]] <= 1:
        return None
    for b in after[:-1]:
        if strides[b] != 1:
            continue
        tail = [d for d in after if d > b]
        if all(strides[d] == strides[e] * space[e] for d, e in zip(tail, tail[1:], strict=False)):
            return b
    return None


def plan_tile(ir: ProgramIR, refs: list[Ref], space: tuple[int, ...]) -> TransposeTile | None:
    """The tile for a pointwise kernel over ``space`` reading ``refs``, or ``None`` where no
    operand is read transposed, or the operands read transposed disagree on ``b``, or a tile
    would be mostly idle."""
    found: dict[int, list[Ref]] = {}
    for ref in refs:
        if ref not in ir.shapes or ir.dtypes.get(ref, "float32") != "float32":
            continue
        shape = ir.shapes[ref]
        lead = len(space) - len(shape)
        if lead < 0 or any(n not in (1, space[lead + d]) for d, n in enumerate(shape)):
            continue  # not read at the output's element (a concatenation's operand)
        b = _contiguous_dim(_strides_in(ir, ref, space), space)
        if b is not None:
            found.setdefault(b, []).append(ref)
    if len(found) != 1:
        return None
    ((b, tiled),) = found.items()
    span, rows = space[b], numel(space[b + 1 :])
    if span < _SMALLEST or rows < _SMALLEST:
        return None
    return TransposeTile(numel(space[:b]), span, rows, tuple(tiled))


def tile_read(k: int) -> str:
    """Operand ``k``'s value at the element a thread computes, from its tile."""
    return f"tl_t{k}[tl_y][tl_x]"


def tile_kernel(
    tile: TransposeTile,
    kernel: str,
    signature: str,
    index: str,
    loads: list[str],
    lines: list[str],
    store: str,
    result: str,
) -> str:
    """The kernel's source: ``loads[k]`` reads operand ``k`` at element ``i``; ``lines`` and
    ``result`` compute element ``i`` with operand ``k`` read as ``tile_read(k)``."""
    per_span = math.ceil(tile.span / TILE)
    per_rows = math.ceil(tile.rows / TILE)

    def element(along_span: str, along_rows: str) -> list[str]:
        return [
            f"const int tl_b = tl_b0 + {along_span}, tl_r = tl_r0 + {along_rows};",
            f"if (tl_b < {tile.span} && tl_r < {tile.rows}) {{",
            f"  const {index} i = (tl_o * {tile.span} + tl_b) * ({index}){tile.rows} + tl_r;",
        ]

    return "\n".join(
        [
            f"// pointwise, {len(tile.refs)} operand(s) read transposed: {tile.outer} x "
            f"{tile.span} x {tile.rows}, {TILE}x{TILE} tiles through shared memory",
            f'extern "C" __global__ __launch_bounds__({TILE_THREADS}) void {kernel}({signature}) {{',
            *(f"  __shared__ float tl_t{k}[{TILE}][{TILE + 1}];" for k in range(len(loads))),
            f"  const int tl_x = threadIdx.x & {TILE - 1}, tl_w = threadIdx.x >> 5;",
            f"  const {index} tl_o = ({index})blockIdx.x / {per_span * per_rows};",
            f"  const int tl_b0 = (int)((blockIdx.x / {per_rows}) % {per_span}) * {TILE};",
            f"  const int tl_r0 = (int)(blockIdx.x % {per_rows}) * {TILE};",
            f"  for (int tl_y = tl_w; tl_y < {TILE}; tl_y += {_ROWS_A_PASS}) {{",
            *(f"    {line}" for line in element("tl_x", "tl_y")),
            *(f"      tl_t{k}[tl_x][tl_y] = {load};" for k, load in enumerate(loads)),
            "    }",
            "  }",
            "  __syncthreads();",
            f"  for (int tl_y = tl_w; tl_y < {TILE}; tl_y += {_ROWS_A_PASS}) {{",
            *(f"    {line}" for line in element("tl_y", "tl_x")),
            *(f"      {line}" for line in lines),
            f"      out[{store}] = {result};",
            "    }",
            "  }",
            "}",
        ]
    )
