"""Reductions: one thread, warp or block per row of a last-dim reduction, column reductions
(tiled, or split into chunks), and two-stage split reductions when rows are few and long.

Held apart because the launch-shape arithmetic (``_column_splits``, ``_column_tile``,
``_row_threads``) belongs to reductions alone (the accumulator table is
``_reduce_accumulators``); ``_ReduceEmitter`` is a mixin of ``emit._Emitter``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from stitch_graph.codegen._cat_slices import concatenated, stored_in_slices
from stitch_graph.codegen._emit_base import (
    _CTYPE,
    _MAX_GRID,
    _TORCH_DTYPE,
    EmitError,
    _aligned_launch,
    _Args,
    _EmitterBase,
    _py,
)
from stitch_graph.codegen._reduce_accumulators import _accumulator, _reduced, _takes_fours
from stitch_graph.codegen.ir import Group, Ref, numel, reduction_runs, row_layout
from stitch_graph.codegen.schedule import reduction_dims
from stitch_graph.codegen.tuning import KernelTuning

_SPLITTABLE = {"sum", "mean", "norm", "amax", "amin", "max", "min", "prod", "logsumexp", "var",
               "std"}


_HELD_ROW = 64  # strided rows up to this long are reduced and rewritten from registers
# warps along a column tile's strided rows, at least: 8 ran ConvNeXt's channels-first layer
# norm (96 channels) in 0.067 ms, 4 in 0.073 and 16 in 0.083 (H100)
_BROADCAST_WARPS = 8
_COLUMN_UNROLL = 4  # loads in flight a thread that walks its column alone, untuned


def _column_splits(rows: int, length: int) -> int:
    """Chunks to cut a column reduction into: enough threads to fill an H200-class GPU
    (132 SMs x 2048 threads), chunks of at least 32 elements."""
    wanted = math.ceil(132 * 2048 / max(rows, 1))
    return max(1, min(wanted, length // 32, 1024))


_GPU_THREADS = 132 * 2048  # resident threads of an H200-class GPU
_ROW_REDUCE = {"sum", "mean", "norm", "prod", "amax", "amin", "max", "min", "logsumexp"}


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(n, 1))))


def _pow2_at_most(n: int) -> int:
    return 1 << max(0, int(math.log2(max(n, 1))))


def _column_tile(rows: int, length: int, block: int) -> tuple[int, int]:
    """``(slices, lanes)`` of a column block: ``lanes`` adjacent outputs x ``slices`` chunks of the
    reduced dim, enough threads in all to fill the GPU. Lanes stay >= 8 so a warp still reads
    whole 32-byte sectors; chunks stay >= 8 elements so each thread has loads to overlap."""
    wanted = math.ceil(0.9 * _GPU_THREADS / max(rows, 1))
    slices = min(_pow2_at_least(wanted), block // 8, _pow2_at_most(max(1, length // 8)))
    return slices, block // slices


def _row_threads(units: int, rows: int) -> int:
    """Threads per row of a last-dim reduction (a power of two up to 1024): about 8 loads each,
    more threads while the rows are too few to fill the GPU."""
    threads = _pow2_at_least(math.ceil(units / 8))
    while threads < 1024 and threads < units and rows * threads < _GPU_THREADS:
        threads *= 2
    return min(threads, 1024)


def _row_combine(threads: int, acc: str) -> str:
    """The line that gives every one of a row's ``threads`` its row's ``acc`` combined: shuffles
    within a warp, shared memory across warps, nothing for a thread a row."""
    if threads == 1:
        return ""
    call = f"sg_group_reduce<{threads}>" if threads <= 32 else "sg_block_reduce"
    return f"{acc} = {call}({acc});"


def _gathered_index(runs: list[tuple[int, bool]]) -> str:
    """Input offset of element ``k`` of row ``r`` when the reduced runs are not adjacent: ``k``
    counts over the reduced runs, ``r`` over the kept ones, each in memory order."""
    strides = [math.prod(n for n, _ in runs[j + 1 :]) for j in range(len(runs))]

    def terms(var: str, reduced: bool) -> list[str]:
        parts = [(n, stride) for (n, red), stride in zip(runs, strides, strict=True) if red == reduced]  # noqa: E501
        out: list[str] = []
        for j, (n, stride) in enumerate(parts):
            inner = math.prod(m for m, _ in parts[j + 1 :])
            c = f"({var} / {inner})" if inner > 1 else var
            c = f"({c} % {n})" if j > 0 else c
            out.append(c if stride == 1 else f"{c} * {stride}")
        return out

    return " + ".join([*terms("k", True), *terms("r", False)]) or "0"


def _one_row_loops(
    mode: str, rows: int, length: int, block: int, index: str
) -> tuple[str, str, str, int]:
    """Row loop, element loop, reduction line and grid when a thread, a warp or a block owns
    each row (after a warp's or a block's reduction every thread holds the result)."""
    if mode == "thread":
        row_loop = (
            f"for ({index} r = ({index})blockIdx.x * {block} + threadIdx.x; r < {rows}; "
            f"r += ({index})gridDim.x * {block})"
        )
        return row_loop, f"for ({index} k = 0; k < {length}; ++k)", "", max(
            1, min(math.ceil(rows / block), _MAX_GRID))
    if mode == "warp":
        warps = block // 32
        row_loop = (
            f"for ({index} r = ({index})blockIdx.x * {warps} + (threadIdx.x >> 5); r < {rows}; "
            f"r += ({index})gridDim.x * {warps})"
        )
        k_loop = f"for ({index} k = threadIdx.x & 31; k < {length}; k += 32)"
        return row_loop, k_loop, "acc = sg_warp_reduce(acc);", max(
            1, min(math.ceil(rows / warps), _MAX_GRID))
    row_loop = f"for ({index} r = blockIdx.x; r < {rows}; r += gridDim.x)"
    k_loop = f"for ({index} k = threadIdx.x; k < {length}; k += {block})"
    return row_loop, k_loop, "acc = sg_block_reduce(acc);", max(1, min(rows, 65535))


def _two_stage_launch(
    g: Group,
    kernel: str,
    out: Any,
    args: _Args,
    args2: _Args,
    partials: int,
    launch1: tuple[int, int],
    launch2: tuple[int, int],
    aligned: list[str] | None = None,
    bytes_each: int = 16,
) -> list[str]:
    """Host lines of a split reduction: a workspace of ``partials`` partial results of
    ``bytes_each`` bytes a reduction (16: an accumulator; 8: a top-k's key), stage
    ``<kernel>_part`` writing them, then ``<kernel>`` combining them into ``out``.
    With ``aligned`` (tensors read or written as float4, ``out`` besides), both stages run as
    their ``_v4`` twins when every one starts on a 16-byte boundary, else as the scalar pair."""
    ws = f"_ws_{g.id}"
    p1 = ", ".join([*(_py(r) for r in args.refs), ws])
    p2 = ", ".join([*(_py(r) for r in args2.refs), ws, out.name])
    size = partials * bytes_each * len(g.anchors)
    alloc_ws = f"{ws} = torch.empty({size}, device=_dev, dtype=torch.uint8)"
    alloc_out = (
        f"{out.name} = torch.empty({list(out.shape)}, device=_dev, "
        f"dtype={_TORCH_DTYPE.get(out.dtype, 'torch.float32')})"
    )

    def stages(suffix: str) -> list[str]:
        return [
            f"KERNELS.{kernel}_part{suffix}({launch1[0]}, {launch1[1]}, {p1})",
            f"KERNELS.{kernel}{suffix}({launch2[0]}, {launch2[1]}, {p2})",
        ]

    if aligned is None:
        part, final = stages("")
        return [alloc_ws, part, alloc_out, final]
    return [
        alloc_ws,
        alloc_out,
        f"if _aligned({', '.join([*aligned, out.name])}):",
        *(f"    {line}" for line in stages("_v4")),
        "else:",
        *(f"    {line}" for line in stages("")),
    ]


class _SplitLoops:
    """Launch shape and loop lines of a reduction split into chunks of its rows: enough blocks
    for two waves of resident threads (a streaming read needs many loads in flight), with the
    last wave at least 90% full where a few more chunks get there (64 rows of 1024-thread
    blocks: 12 chunks a row, not 9 and a last wave 18% full), chunks of at least eight elements
    a thread, at most ``most`` chunks a row, each a multiple of ``align`` elements."""

    def __init__(
        self,
        rows: int,
        length: int,
        block: int,
        index: str,
        offset: str,
        acc: str,
        most: int,
        align: int = 1,
    ) -> None:
        self.rows, self.length, self.block, self.index = rows, length, block, index
        self.offset, self.acc = offset, acc
        resident = max(1, _GPU_THREADS // block)
        cap = max(2, min(most, math.ceil(length / (block * 8))))
        first = max(2, min(cap, math.ceil(2 * resident / rows)))

        def fill(splits: int) -> float:
            blocks = rows * splits
            return blocks / (math.ceil(blocks / resident) * resident)

        self.splits = next(
            (s for s in range(first, min(cap, 2 * first) + 1) if fill(s) >= 0.9), first
        )
        self.chunk = align * math.ceil(length / self.splits / align)

    def head(self) -> list[str]:
        """Row and chunk of this block, and an empty accumulator."""
        ix = self.index
        return [
            f"  const {ix} r = blockIdx.x / {self.splits};",
            f"  const {ix} s = blockIdx.x % {self.splits};",
            f"  const {ix} end = min(({ix})((s + 1) * {self.chunk}), ({ix}){self.length});",
            f"  {self.acc} acc = {self.acc}::init();",
        ]

    def chunk_loop(self) -> str:
        """The loop over the block's chunk of row ``r``, with ``i`` the element's offset."""
        ix = self.index
        return (
            f"  for ({ix} k = s * {self.chunk} + threadIdx.x; k < end; k += {self.block}) {{\n"
            f"    const {ix} i = {self.offset};"
        )


@dataclass(frozen=True)
class _Reduction:
    """One reduction group as every kernel variant sees it: its rows, their layout, the
    accumulator, and the closures that load a value and finish a row."""

    g: Group
    kernel: str
    rows: int
    length: int
    in_idx: str  # element of row r, position k, in the input
    contiguous: bool  # rows lie one after another in the input (``in_idx`` is r * length + k)
    index: str  # "int" or "long long"
    acc: str
    vtype: str  # what one element gives the accumulator: float, or float2/3 with siblings
    load_value: Callable[[_Args, dict[str, str]], tuple[list[str], str]]
    finish: Callable[..., tuple[list[str], str]]


class _ReduceEmitter(_EmitterBase):
    """Reduction kernels (``reduction`` and its variants)."""

    # ---- reductions ----------------------------------------------------------------------------
    def reduction(self, g: Group, kernel: str, tun: KernelTuning) -> list[str]:
        ir = self.ir
        node = ir.node(g.anchor or "")
        src: Ref = node.args["input"]
        in_shape = ir.shapes[src]
        dims = reduction_dims(ir, node)
        layout = row_layout(in_shape, dims)
        gathered = layout is None
        big = numel(in_shape) >= 2**31
        index = "long long" if big else "int"
        if gathered:  # non-adjacent dims: row r's elements k found by index
            runs = reduction_runs(in_shape, dims)
            length = numel(tuple(n for n, red in runs if red))
            outer, inner = numel(in_shape) // max(length, 1), 1
            in_idx = _gathered_index(runs)
        else:
            outer, length, inner = layout
            in_idx = (
                f"(r / {inner}) * {length * inner} + k * {inner} + r % {inner}"
                if inner > 1
                else (f"r * {length} + k" if outer > 1 else "k")
            )
        rows = outer * inner
        anchors = [ir.node(a) for a in g.anchors]
        ops = {a.op for a in anchors}

        def reduced(n: Any) -> set[int]:  # -1 and 2 of a 3-D input are one dim
            return {d % len(in_shape) for d in reduction_dims(ir, n)} or set(range(len(in_shape)))

        if len(anchors) > 1 and any(
            a.args.get("input") is None or ir.shapes[a.args["input"]] != in_shape
            or reduced(a) != reduced(node) or a.shape != node.shape
            for a in anchors
        ):
            msg = f"{g.id}: sibling reductions must reduce the same dims of inputs of one shape"
            raise EmitError(msg)
        acc, vtype, fields = _accumulator(anchors, ir.dtypes)
        out = ir.node(g.output)
        anchor_shape = node.shape
        # siblings whose results are concatenated: each stored into its slice of the result
        slices = concatenated(ir, g, out)
        epilogue = [m for m in g.epilogue if m != out.name] if slices else g.epilogue
        # results other kernels read too, of reductions joined into this pass
        # (``_fusion_passes.join_row_passes``): stored beside, one value a row
        beside = self.stored_beside(g.members, out)
        if beside and (slices or out.shape != anchor_shape or any(
            m.name in g.prologue or m.shape != anchor_shape for m in beside
        )):
            msg = f"{g.id}: results stored beside a reduction's are one value a row"
            raise EmitError(msg)

        def load_value(args: _Args, env: dict[str, str]) -> tuple[list[str], str]:
            lines = self.exprs(g.prologue, in_shape, "i", env, args)
            values: list[str] = []
            for n, a in enumerate(anchors):
                value = self.value_of(a.args["input"], in_shape, "i", env, args)
                if a.op == "norm":
                    square = f"sq{n}" if n else "sq"
                    lines.append(f"const float {square} = {value} * {value};")
                    value = square
                values.append(value)
            if len(values) == 1:
                return lines, values[0]
            return lines, f"make_{vtype}({', '.join(values)})"

        def finish(
            args: _Args,
            a: str,
            members: list[str] | None = None,
            result_of: str | None = None,
            env: dict[str, str] | None = None,
        ) -> tuple[list[str], str]:
            """The reduced values and the epilogue (``members``, default all) at one output;
            ``env`` receives every value computed, by node name."""
            env = {} if env is None else env
            lines: list[str] = []
            for anchor, field in zip(anchors, fields, strict=True):
                ctype = _CTYPE.get(anchor.dtype, "float")
                result = _reduced(anchor.op, anchor.args, f"{a}{field}", length)
                lines.append(f"const {ctype} v_{anchor.name} = ({ctype})({result});")
                env[anchor.name] = f"v_{anchor.name}"
            lines += self.exprs(epilogue if members is None else members, anchor_shape, "r",
                                env, args)
            if members is None:
                lines += [f"{args.store(Ref('node', m.name))}[r] = {env[m.name]};" for m in beside]
            if slices and result_of is None:  # the first slice is the kernel's own store
                (first, _), *rest = slices
                lines += [f"out[{where.element('r')}] = {env[name]};" for name, where in rest]
                return lines, env[first]
            return lines, env[result_of or out.name]

        red = _Reduction(
            g, kernel, rows, length, in_idx, inner == 1 and not gathered, index, acc, vtype,
            load_value, finish,
        )
        if slices:
            return stored_in_slices(self, slices[0][1], lambda: self._reduction_layout(
                red, tun, in_shape, inner, gathered, ops, False))
        # consumers that broadcast the result back over the rows joined: reduce, then rewrite
        broadcast = out.shape != anchor_shape and numel(out.shape) == numel(in_shape)
        allocs = [
            f"{m.name} = torch.empty({list(m.shape)}, device=_dev, "
            f"dtype={_TORCH_DTYPE.get(m.dtype, 'torch.float32')})"
            for m in beside
        ]
        return [*allocs, *self._reduction_layout(red, tun, in_shape, inner, gathered, ops,
                                                  broadcast)]

    def _reduction_layout(
        self,
        red: _Reduction,
        tun: KernelTuning,
        in_shape: tuple[int, ...],
        inner: int,
        gathered: bool,
        ops: set[str],
        broadcast: bool,
    ) -> list[str]:
        """The kernel layout for ``red``'s rows: a row kernel, split rows, a thread, warp or
        block per output, column tiles; ``broadcast`` rewrites each row from its result."""
        ir, g, node = self.ir, red.g, self.ir.node(red.g.anchor or "")
        rows, length, kernel, load_value = red.rows, red.length, red.kernel, red.load_value
        finish, in_idx, index, acc = red.finish, red.in_idx, red.index, red.acc
        out = ir.node(g.output)
        if gathered and broadcast:
            msg = f"{node.name}: a reduction over non-adjacent dims does not rewrite its rows"
            raise EmitError(msg)
        row_kernel = red.contiguous and tun.rows_per_block == 0 and ops <= _ROW_REDUCE
        if broadcast and row_kernel:
            return self._row_reduction(red, tun, broadcast=self._broadcast_parts(g))
        split = tun.split_reduction
        if split is None:
            split = rows < 132 and length >= 65536 and ops <= _SPLITTABLE
        split = bool(split) and ops <= _SPLITTABLE and not broadcast
        if split:
            return self._split_reduction(red, tun)
        if tun.rows_per_block == 0:
            mode = "thread" if inner >= 32 else ("warp" if length <= 1024 else "block")
        else:
            mode = "block" if tun.rows_per_block == 1 else "warp"
        if mode == "thread" and not broadcast:
            # outputs along contiguous memory: one thread per output, and when there are too
            # few outputs to fill the GPU, the reduced dimension split into chunks as well: in
            # one block (one launch) unless even that leaves most of a big input's GPU idle
            splits = _column_splits(rows, length)
            if splits == 1 and tun.split_reduction and length >= 64:
                # outputs enough for a thread each, asked to split all the same (the tuner
                # times it): four chunks an output, eight loads in flight a thread
                return self._column_tile_reduction(red, 4, 64)
            if splits > 1:
                slices, lanes = _column_tile(rows, length, 512)
                if (
                    2 * rows * slices < _GPU_THREADS
                    and numel(in_shape) >= 2**22
                    and tun.split_reduction is not False
                ):
                    return self._column_split_reduction(red, tun, splits)
                return self._column_tile_reduction(red, slices, lanes)
        elif row_kernel and length * rows > 0 and not broadcast:
            return self._row_reduction(red, tun)
        if (
            broadcast and mode == "thread" and inner % 32 == 0 and length > _HELD_ROW
            and tun.unroll <= 1 and ops <= _ROW_REDUCE | {"var", "std"}
        ):
            # shorter rows stay a thread each: held in registers, as fast (H100, 64 channels)
            return self._column_broadcast(red, tun)
        block = tun.block_size
        if mode == "block":
            block = min(block, 1024)
        args = _Args(ir)
        env: dict[str, str] = {}
        pre, value = load_value(args, env)
        otype = _CTYPE.get(out.dtype, "float")
        # a thread per output walks its column alone: unroll so that several of its loads are
        # in flight (one at a time leaves a column argmax at 2.1 TB/s on an H200); a warp or a
        # block per gathered row likewise, where each thread has four loads or more
        per_thread = length / (32 if mode == "warp" else block)
        factor = tun.unroll if tun.unroll > 1 else (
            _COLUMN_UNROLL if mode == "thread" and length >= 8
            else 4 if mode != "thread" and per_thread >= 4 else 1
        )
        unroll = f"#pragma unroll {factor}" if factor > 1 else ""
        if broadcast and mode == "thread" and length <= _HELD_ROW and tun.unroll <= 1:
            # both loops unrolled whole: nvcc keeps the row's loads in registers for the rewrite
            # (64 loads in the PTX instead of 128 for RMS norm over 64 channels, 80 registers)
            unroll = "#pragma unroll"
        row_loop, k_loop, reduce_line, grid = _one_row_loops(mode, rows, length, block, index)
        if broadcast:  # every thread of the row has the result: rewrite the row
            per_row, row_result, per_element = self._broadcast_parts(g)
            env = {}
            row_lines, _ = finish(args, "acc", per_row, row_result, env)
            element = self.exprs(per_element, in_shape, "i", env, args)
            tail = [
                *row_lines, unroll, f"{k_loop} {{", f"  const {index} i = {in_idx};",
                *(f"  {line}" for line in element), f"  out[i] = {env[out.name]};", "}",
            ]
        else:
            post, result = finish(args, "acc")
            writer = {"thread": "", "warp": "if ((threadIdx.x & 31) == 0)"}.get(
                mode, "if (threadIdx.x == 0)"
            )
            tail = [f"{writer} {{", *(f"  {line}" for line in post), f"  out[r] = {result};", "}"]
        src_lines = [
            f"// {node.op} over {length} element(s) of {rows} row(s), {mode} per row"
            + (", then the result broadcast back over each row" if broadcast else ""),
            f'extern "C" __global__ __launch_bounds__({block}) void {kernel}('
            f"{args.signature([f'{otype}* __restrict__ out'])}) {{",
            f"  {row_loop} {{",
            f"    {acc} acc = {acc}::init();",
            f"    {unroll}",
            f"    {k_loop} {{",
            f"      const {index} i = {in_idx};",
            *(f"      {line}" for line in pre),
            f"      acc.update({value}, k);",
            "    }",
            f"    {reduce_line}",
            *(f"    {line}" for line in tail),
            "  }",
            "}",
        ]
        return self._add_kernel(src_lines, kernel, grid, block, args, out)

    def _column_broadcast(self, red: _Reduction, tun: KernelTuning) -> list[str]:
        """A strided-row reduction rewritten over its rows, a tile of 32 adjacent rows a block.

        A thread per row walks its whole row alone: 65536 rows of 512 channels made 256 blocks,
        latency-bound at 24% occupancy (0.32 ms on an H100; this kernel 0.093, a copy 0.090).
        Here lane ``l`` owns row ``tile * 32 + l`` (a warp load is one 128-byte line) and warp
        ``w`` positions ``w + c * W``; ``sg_slice_reduce`` merges the warps' accumulators lane by
        lane, then the same threads rewrite their positions: from registers where the loop is
        unrolled whole (nvcc keeps the loads: 32 in the PTX, not 64), else from cache.
        Accumulators that take elements in any order take them four at once (one Welford
        division per four). A block size other than the default is the tuner's: that many warps.
        """
        g, kernel, rows, length, in_idx = red.g, red.kernel, red.rows, red.length, red.in_idx
        index, acc, load_value, finish = red.index, red.acc, red.load_value, red.finish
        ir = self.ir
        node = ir.node(g.anchor or "")
        out = ir.node(g.output)
        warps = min(16, _pow2_at_least(max(_BROADCAST_WARPS, math.ceil(length / 32))))
        if tun.block_size != KernelTuning().block_size:
            warps = min(16, max(2, _pow2_at_most(tun.block_size // 32)))
        if length % warps and warps > 4 and length % (warps // 2) == 0:
            warps //= 2  # whole slots: a guarded last slot's loads are not kept in registers
        slots = math.ceil(length / warps)  # positions a thread
        # unrolled whole while short: every load in flight at once, and the values kept in
        # registers for the rewrite (the input is read-only and restrict, so across the barrier)
        unroll = "#pragma unroll" if slots <= 32 else "#pragma unroll 4"
        guard = [f"if (k >= {length}) continue;"] if length % warps else []  # last slot short
        args = _Args(ir)
        pre, value = load_value(args, {})
        per_row, row_result, per_element = self._broadcast_parts(g)
        env: dict[str, str] = {}
        row_lines, _ = finish(args, "acc", per_row, row_result, env)
        element = self.exprs(per_element, ir.shapes[node.args["input"]], "i", env, args)
        otype = _CTYPE.get(out.dtype, "float")

        def position(slot: str) -> list[str]:
            step = f"({index}){slot}" if slot == "c" else f"({index})({slot})"
            return [f"const {index} k = w + {step} * {warps};", *guard,
                    f"const {index} i = {in_idx};"]

        def walk(body: list[str]) -> list[str]:
            return [
                f"    {unroll}",
                f"    for (int c = 0; c < {slots}; ++c) {{",
                *(f"      {line}" for line in [*position("c"), *body]),
                "    }",
            ]

        reduce = walk([*pre, f"acc.update({value}, k);"])
        if slots % 4 == 0 and not guard and _takes_fours(red.acc):
            reduce = [
                f"    {unroll}",
                f"    for (int c = 0; c < {slots}; c += 4) {{",
                f"      {red.vtype} v4[4];",
                "      #pragma unroll",
                "      for (int j = 0; j < 4; ++j) {",
                *(f"        {line}" for line in [*position("c + j"), *pre, f"v4[j] = {value};"]),
                "      }",
                "      acc.update4(v4, w);",
                "    }",
            ]

        tiles = rows // 32  # inner % 32 == 0: whole tiles
        src_lines = [
            f"// {node.op} over {length} element(s) of {rows} strided row(s): column tiles of 32 "
            f"rows x {warps} warps, then the result broadcast back over each row",
            f'extern "C" __global__ __launch_bounds__({32 * warps}) void {kernel}('
            f"{args.signature([f'{otype}* __restrict__ out'])}) {{",
            f"  const {index} w = threadIdx.x >> 5;",
            # block-uniform: every thread reaches sg_slice_reduce's barriers
            f"  for ({index} tile = blockIdx.x; tile < {tiles}; tile += gridDim.x) {{",
            f"    const {index} r = tile * 32 + (threadIdx.x & 31);",
            f"    {acc} acc = {acc}::init();",
            *reduce,
            f"    acc = sg_slice_reduce<{warps}>(acc);",
            *(f"    {line}" for line in row_lines),
            *walk([*element, f"out[i] = {env[out.name]};"]),
            "  }",
            "}",
        ]
        grid = max(1, min(tiles, _MAX_GRID))
        return self._add_kernel(src_lines, kernel, grid, 32 * warps, args, out)

    def _broadcast_parts(self, g: Group) -> tuple[list[str], str, list[str]]:
        """A broadcast-back group's per-row epilogue, the node holding each row's value, and
        the element-wise epilogue that reads it."""
        node = self.ir.node(g.anchor or "")
        per_row = [m for m in g.epilogue if self.ir.node(m).shape == node.shape]
        per_element = [m for m in g.epilogue if m not in per_row]
        return per_row, (per_row[-1] if per_row else node.name), per_element

    def _column_split_reduction(
        self,
        red: _Reduction,
        tun: KernelTuning,
        splits: int,
    ) -> list[str]:
        """Thread per (output, chunk) writing a partial, then thread per output combining them.

        Consecutive threads take consecutive outputs, which lie side by side in memory, so both
        stages read coalesced; no shared memory or shuffles are needed.
        """
        g, kernel, rows, length, in_idx = red.g, red.kernel, red.rows, red.length, red.in_idx
        index, acc, load_value, finish = red.index, red.acc, red.load_value, red.finish
        ir = self.ir
        out = ir.node(g.output)
        block = min(tun.block_size, 1024)
        chunk = math.ceil(length / splits)
        args = _Args(ir)
        env: dict[str, str] = {}
        pre, value = load_value(args, env)
        total = rows * splits
        stage1 = [
            f"// stage 1 of a column reduction: {rows} output(s) x {splits} chunk(s) of {chunk}",
            f'extern "C" __global__ __launch_bounds__({block}) void {kernel}_part('
            f"{args.signature(['unsigned char* __restrict__ ws'])}) {{",
            f"  for ({index} t = ({index})blockIdx.x * {block} + threadIdx.x; t < {total}; "
            f"t += ({index})gridDim.x * {block}) {{",
            f"    const {index} r = t % {rows};",
            f"    const {index} s = t / {rows};",
            f"    const {index} end = min(({index})((s + 1) * {chunk}), ({index}){length});",
            f"    {acc} acc = {acc}::init();",
            "    #pragma unroll 4",
            f"    for ({index} k = s * {chunk}; k < end; ++k) {{",
            f"      const {index} i = {in_idx};",
            *(f"      {line}" for line in pre),
            f"      acc.update({value}, k);",
            "    }",
            f"    reinterpret_cast<{acc}*>(ws)[t] = acc;",
            "  }",
            "}",
        ]
        args2 = _Args(ir)
        post, result = finish(args2, "acc")
        otype = _CTYPE.get(out.dtype, "float")
        stage2 = [
            f'extern "C" __global__ __launch_bounds__({block}) void {kernel}('
            f"{args2.signature(['const unsigned char* __restrict__ ws', f'{otype}* __restrict__ out'])}) {{",  # noqa: E501
            f"  for ({index} r = ({index})blockIdx.x * {block} + threadIdx.x; r < {rows}; "
            f"r += ({index})gridDim.x * {block}) {{",
            f"    const {acc}* part = reinterpret_cast<const {acc}*>(ws);",
            f"    {acc} acc = part[r];",
            f"    for (int s = 1; s < {splits}; ++s) acc.combine(part[s * {rows} + r]);",
            *(f"    {line}" for line in post),
            f"    out[r] = {result};",
            "  }",
            "}",
        ]
        self.kernels.append("\n".join(stage1))
        self.kernels.append("\n".join(stage2))
        grid1 = max(1, min(math.ceil(total / block), _MAX_GRID))
        grid2 = max(1, min(math.ceil(rows / block), _MAX_GRID))
        return _two_stage_launch(g, kernel, out, args, args2, total, (grid1, block), (grid2, block))

    def _column_tile_reduction(
        self,
        red: _Reduction,
        slices: int,
        lanes: int,
    ) -> list[str]:
        """One launch for a reduction whose outputs lie side by side and are too few to fill the
        GPU with a thread each.

        A block takes ``lanes`` adjacent outputs; its ``slices`` threads per output each reduce
        one contiguous chunk of the reduced dim (loads coalesced across lanes, up to 8 in flight
        per thread), then the chunks are combined in shared memory by a tree that merges
        neighbouring chunks only, so the result is deterministic and keeps the first-index
        tie and NaN rules of the arg reductions.
        """
        g, kernel, rows, length, in_idx = red.g, red.kernel, red.rows, red.length, red.in_idx
        index, acc, load_value, finish = red.index, red.acc, red.load_value, red.finish
        ir = self.ir
        node = ir.node(g.anchor or "")
        out = ir.node(g.output)
        block = slices * lanes
        chunk = math.ceil(length / slices)
        groups = math.ceil(rows / lanes)
        batch = 8
        ragged = length % chunk != 0 or chunk % batch != 0
        inside = "k < ke" if ragged else "true"
        args = _Args(ir)
        pre, value = load_value(args, {})
        post, result = finish(args, "acc")
        otype = _CTYPE.get(out.dtype, "float")
        combine: list[str] = []
        step = 1
        while step < slices:
            combine += [
                f"    if ((y & {2 * step - 1}) == 0) sh[t].combine(sh[t + {step * lanes}]);",
                "    __syncthreads();",
            ]
            step *= 2
        src_lines = [
            f"// {node.op} over {length} element(s) of {rows} output(s): {lanes} adjacent "
            f"output(s) x {slices} chunk(s) of {chunk} a block, chunks merged in shared memory",
            f'extern "C" __global__ __launch_bounds__({block}) void {kernel}('
            f"{args.signature([f'{otype}* __restrict__ out'])}) {{",
            f"  __shared__ {acc} sh[{block}];",
            "  const int t = threadIdx.x;",
            f"  const int lane = t % {lanes}, y = t / {lanes};",
            f"  const {index} kb = ({index})y * {chunk};",
            f"  const {index} ke = min(kb + {chunk}, ({index}){length});",
            f"  for ({index} grp = blockIdx.x; grp < {groups}; grp += gridDim.x) {{",
            f"    const {index} r = grp * {lanes} + lane;",
            f"    {acc} acc = {acc}::init();",
            f"    if (r < {rows}) {{",
            f"      for ({index} k0 = kb; k0 < ke; k0 += {batch}) {{",
            f"        {red.vtype} x[{batch}];",
            "        #pragma unroll",
            f"        for (int u = 0; u < {batch}; ++u) {{",
            f"          const {index} k = k0 + u;",
            f"          if ({inside}) {{",
            f"            const {index} i = {in_idx};",
            *(f"            {line}" for line in pre),
            f"            x[u] = {value};",
            "          }",
            "        }",
            "        #pragma unroll",
            f"        for (int u = 0; u < {batch}; ++u) "
            f"if ({inside.replace('k <', 'k0 + u <')}) acc.update(x[u], k0 + u);",
            "      }",
            "    }",
            "    sh[t] = acc;",
            "    __syncthreads();",
            *combine,
            f"    if (y == 0 && r < {rows}) {{",
            "      acc = sh[t];",
            *(f"      {line}" for line in post),
            f"      out[r] = {result};",
            "    }",
            "    __syncthreads();",
            "  }",
            "}",
        ]
        grid = max(1, min(groups, _MAX_GRID))
        return self._add_kernel(src_lines, kernel, grid, block, args, out)

    def _row_reduction(
        self,
        red: _Reduction,
        tun: KernelTuning,
        broadcast: tuple[list[str], str, list[str]] | None = None,
    ) -> list[str]:
        """Reduction over contiguous rows (the last dims): float4 loads when every full-size
        operand is 16-byte aligned and the length a multiple of 4 (``_v4`` kernel, scalar twin
        chosen at run time otherwise), each thread issuing a batch of loads before it reduces
        them, and a group of threads per row sized by ``_row_threads`` (several short rows a
        warp, a block for long ones). With ``broadcast`` (``_broadcast_parts``) the row's threads
        then rewrite the row with the element-wise epilogue instead of storing the reduction."""
        g, kernel, length = red.g, red.kernel, red.length
        out = self.ir.node(g.output)
        alloc = (
            f"{out.name} = torch.empty({list(out.shape)}, device=_dev, "
            f"dtype={_TORCH_DTYPE.get(out.dtype, 'torch.float32')})"
        )
        scalar_src, sargs, _, slaunch = self._row_reduction_variant(
            red, kernel, vec=False, broadcast=broadcast
        )
        self.kernels.append("\n".join(scalar_src))
        py_args = ", ".join([*(_py(r) for r in sargs.refs), out.name])
        launch = f"KERNELS.{kernel}({slaunch[0]}, {slaunch[1]}, {py_args})"
        if tun.vector_width != 4 or length % 4 or out.dtype != "float32":
            return [alloc, launch]
        vsrc, vargs, aligned, vlaunch = self._row_reduction_variant(
            red, f"{kernel}_v4", vec=True, broadcast=broadcast
        )
        if not aligned or vargs.refs != sargs.refs:
            return [alloc, launch]
        self.kernels.append("\n".join(vsrc))
        names = [_py(r) for r in aligned]
        return [alloc, *_aligned_launch(names, kernel, vlaunch, py_args, launch)]

    def _row_reduction_variant(
        self,
        red: _Reduction,
        name: str,
        *,
        vec: bool,
        broadcast: tuple[list[str], str, list[str]] | None = None,
    ) -> tuple[list[str], _Args, list[Ref], tuple[int, int]]:
        """Source, arguments, float4 operands and ``(grid, block)`` of one ``_row_reduction``
        kernel. A thread's units (float4 chunks or elements) are ``t + c * threads``; the loads
        of a batch of units are all issued before the first is reduced."""
        g, rows, length, index, acc = red.g, red.rows, red.length, red.index, red.acc
        load_value, finish = red.load_value, red.finish
        ir = self.ir
        node = ir.node(g.anchor or "")
        out = ir.node(g.output)
        w = 4 if vec else 1
        nu = length // w
        threads = _row_threads(nu, rows)
        batch = 4 if vec else 8
        batches = math.ceil(math.ceil(nu / threads) / batch)
        block = max(threads, 256) if threads <= 32 else threads
        per_block = block // threads
        in_shape = ir.shapes[node.args["input"]]
        row = (in_shape, length) if red.contiguous else None  # i = r * length + k
        args = _Args(ir, vector=vec, row=row)
        pre, value = load_value(args, {})
        shared = _Args(ir, refs=args.refs, written=args.written)  # the same parameters
        post, result = ([], "") if broadcast else finish(shared, "acc")
        otype = _CTYPE.get(out.dtype, "float")
        unit = f"const {index} u = t + ({index})(b * {batch} + j) * {threads};"
        inside = f"u < {nu}" if nu % (threads * batch) else "true"
        tail: list[str] = []  # a broadcast-back group: the row rewritten after its reduction
        tail_vec: list[Ref] = []
        if broadcast is not None:
            per_row, row_result, per_element = broadcast
            env: dict[str, str] = {}
            row_lines, _ = finish(shared, "acc", per_row, row_result, env)
            targs = _Args(ir, refs=args.refs, vector=vec, row=row)
            element = self.exprs(per_element, in_shape, "i", env, targs)
            tail_vec = targs.vec_refs
            at = [f"const {index} i = r * {length} + k;", *element]
            if vec:
                store = [
                    *(f"const float4 a{args.refs.index(q)}v = reinterpret_cast<const float4*>("
                      f"a{args.refs.index(q)})[r * {nu} + u];" for q in tail_vec),
                    "float4 o;",
                    "#pragma unroll",
                    "for (int l = 0; l < 4; ++l) {",
                    f"  const {index} k = u * 4 + l;",
                    *(f"  {line}" for line in at),
                    f"  (&o.x)[l] = {env[out.name]};",
                    "}",
                    f"reinterpret_cast<float4*>(out)[r * {nu} + u] = o;",
                ]
            else:
                store = [f"const {index} k = u;", *at, f"out[i] = {env[out.name]};"]
            tail = [
                f"    if (r < {rows}) {{",
                *(f"      {line}" for line in row_lines),
                f"      for (int b = 0; b < {batches}; ++b) {{",
                f"        for (int j = 0; j < {batch}; ++j) {{",
                f"          {unit}",
                f"          if ({inside}) {{",
                *(f"            {line}" for line in store),
                "          }",
                "        }",
                "      }",
                "    }",
            ]
        if vec:
            bufs = [args.refs.index(r) for r in args.vec_refs]
            used = [*pre, value]
            k_decl = [f"const {index} k = u * 4 + l;"]
            i_decl = [f"const {index} i = r * {length} + k;"] if any(
                re.search(r"\bi\b", line) for line in used
            ) else []
            load = [
                *(f"float4 a{q}b[{batch}];" for q in bufs),
                "#pragma unroll",
                f"for (int j = 0; j < {batch}; ++j) {{",
                f"  {unit}",
                f"  if ({inside}) {{",
                *(
                    f"    a{q}b[j] = reinterpret_cast<const float4*>(a{q})[r * {nu} + u];"
                    for q in bufs
                ),
                "  }",
                "}",
                "#pragma unroll",
                f"for (int j = 0; j < {batch}; ++j) {{",
                f"  {unit}",
                f"  if ({inside}) {{",
                *(f"    const float4 a{q}v = a{q}b[j];" for q in bufs),
                "    #pragma unroll",
                "    for (int l = 0; l < 4; ++l) {",
                *(f"      {line}" for line in [*k_decl, *i_decl, *pre]),
                f"      acc.update({value}, k);",
                "    }",
                "  }",
                "}",
            ]
        else:
            load = [
                f"{red.vtype} x[{batch}];",
                "#pragma unroll",
                f"for (int j = 0; j < {batch}; ++j) {{",
                f"  {unit}",
                f"  if ({inside}) {{",
                f"    const {index} k = u;",
                f"    const {index} i = r * {length} + k;",
                *(f"    {line}" for line in pre),
                f"    x[j] = {value};",
                "  }",
                "}",
                "#pragma unroll",
                f"for (int j = 0; j < {batch}; ++j) {{",
                f"  {unit}",
                f"  if ({inside}) acc.update(x[j], u);",
                "}",
            ]
        reduce_line = _row_combine(threads, "acc")
        src_lines = [
            f"// {node.op} over the last {length} element(s) of {rows} row(s): {threads} "
            f"thread(s) a row, {batch} {'float4' if vec else 'scalar'} loads in flight a thread"
            + (", then the result broadcast back over the row" if broadcast else ""),
            f'extern "C" __global__ __launch_bounds__({block}) void {name}('
            f"{args.signature([f'{otype}* __restrict__ out'])}) {{",
            f"  const int t = threadIdx.x % {threads};",
            f"  for ({index} rb = ({index})blockIdx.x * {per_block}; rb < {rows}; "
            f"rb += ({index})gridDim.x * {per_block}) {{",
            f"    const {index} r = rb + threadIdx.x / {threads};",
            f"    {acc} acc = {acc}::init();",
            f"    if (r < {rows}) {{",
            f"      #pragma unroll {1 if batches > 2 else batches}",
            f"      for (int b = 0; b < {batches}; ++b) {{",
            *(f"        {line}" for line in load),
            "      }",
            "    }",
            f"    {reduce_line}",
            *(tail or [
                f"    if (t == 0 && r < {rows}) {{",
                *(f"      {line}" for line in post),
                f"      out[r] = {result};",
                "    }",
            ]),
            "  }",
            "}",
        ]
        grid = max(1, min(math.ceil(rows / per_block), _MAX_GRID if threads <= 32 else 65535))
        return src_lines, args, list(dict.fromkeys(args.vec_refs + tail_vec)), (grid, block)

    def _split_reduction(
        self,
        red: _Reduction,
        tun: KernelTuning,
    ) -> list[str]:
        g, kernel, rows, length, in_idx = red.g, red.kernel, red.rows, red.length, red.in_idx
        index, acc, load_value, finish = red.index, red.acc, red.load_value, red.finish
        ir = self.ir
        out = ir.node(g.output)
        block = min(tun.block_size, 1024)
        # contiguous rows a multiple of four long: chunks of whole float4s, read as float4s
        # where every operand is aligned (a ``_v4`` pair, the scalar pair otherwise)
        wide = tun.vector_width == 4 and red.contiguous and length % 4 == 0
        loops = _SplitLoops(rows, length, block, index, in_idx, acc, most=4096,
                            align=4 if wide else 1)
        splits, chunk = loops.splits, loops.chunk
        args = _Args(ir)
        env: dict[str, str] = {}
        pre, value = load_value(args, env)
        reduce_block = [
            "  acc = sg_block_reduce(acc);",
            f"  if (threadIdx.x == 0) reinterpret_cast<{acc}*>(ws)[blockIdx.x] = acc;",
            "}",
        ]
        stage1 = [
            f"// stage 1 of a split reduction: {rows} row(s) x {splits} chunk(s) of {chunk}",
            f'extern "C" __global__ __launch_bounds__({block}) void {kernel}_part('
            f"{args.signature(['unsigned char* __restrict__ ws'])}) {{",
            *loops.head(),
            "#pragma unroll 4",  # independent loads issued together; the sum stays in order
            loops.chunk_loop(),
            *(f"    {line}" for line in pre),
            f"    acc.update({value}, k);",
            "  }",
            *reduce_block,
        ]
        args2 = _Args(ir)
        post, result = finish(args2, "acc")
        otype = _CTYPE.get(out.dtype, "float")
        block2 = 32 * min(32, max(1, math.ceil(splits / 32)))

        def stage2(name: str) -> str:
            return "\n".join([
                f'extern "C" __global__ __launch_bounds__({block2}) void {name}('
                f"{args2.signature(['const unsigned char* __restrict__ ws', f'{otype}* __restrict__ out'])}) {{",  # noqa: E501
                f"  const {index} r = blockIdx.x;",
                f"  const {acc}* part = reinterpret_cast<const {acc}*>(ws) + r * {splits};",
                f"  {acc} acc = {acc}::init();",
                f"  for (int j = threadIdx.x; j < {splits}; j += {block2}) acc.combine(part[j]);",
                "  acc = sg_block_reduce(acc);",
                "  if (threadIdx.x == 0) {",
                *(f"    {line}" for line in post),
                f"    out[r] = {result};",
                "  }",
                "}",
            ])

        self.kernels.append("\n".join(stage1))
        self.kernels.append(stage2(kernel))
        aligned = None
        vargs = _Args(ir, vector=True)
        vpre, vvalue = load_value(vargs, {}) if wide else ([], "")
        if wide and vargs.vec_refs and vargs.refs == args.refs:
            nu = length // 4
            stage1_v4 = [
                f'extern "C" __global__ __launch_bounds__({block}) void {kernel}_part_v4('
                f"{vargs.signature(['unsigned char* __restrict__ ws'])}) {{",
                *loops.head(),
                "#pragma unroll 4",
                f"  for ({index} u = s * {chunk // 4} + threadIdx.x; u < end / 4; u += {block}) {{",
                *(
                    f"    const float4 a{q}v = reinterpret_cast<const float4*>(a{q})[r * {nu} + u];"
                    for q in (args.refs.index(ref) for ref in vargs.vec_refs)
                ),
                "    #pragma unroll",
                "    for (int l = 0; l < 4; ++l) {",
                f"      const {index} k = u * 4 + l;",
                f"      const {index} i = {in_idx};",
                *(f"      {line}" for line in vpre),
                f"      acc.update({vvalue}, k);",
                "    }",
                "  }",
                *reduce_block,
            ]
            self.kernels.append("\n".join(stage1_v4))
            self.kernels.append(stage2(f"{kernel}_v4"))  # loads no float4: the same, renamed
            aligned = [_py(r) for r in vargs.vec_refs]
        return _two_stage_launch(
            g, kernel, out, args, args2, rows * splits, (rows * splits, block), (rows, block2),
            aligned,
        )
