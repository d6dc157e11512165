"""Softmax, log-softmax and layer/group/batch/instance/RMS norms: one row per block, held in
registers when it fits (one read, one write), else a statistics pass then a write pass.

``_SoftmaxNormEmitter`` is a mixin of ``emit._Emitter``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from stitch_graph.codegen._emit_base import (
    _CTYPE,
    _MAX_GRID,
    _SMS,
    _TORCH_DTYPE,
    _aligned_launch,
    _Args,
    _EmitterBase,
    _literal,
    _py,
)
from stitch_graph.codegen._emit_reduce import (
    _GPU_THREADS,
    _pow2_at_least,
    _SplitLoops,
    _two_stage_launch,
)
from stitch_graph.codegen.ir import Group, Ref, contiguous_strides, numel, row_layout
from stitch_graph.codegen.tuning import KernelTuning

_COLUMN_RUN = 8  # batch norms whose channels run fewer elements than this take column tiles
_COLUMN_SLICES = 8  # warps of a column-tile block


class _ColumnLoops:
    """Launch shape of a row op whose rows are columns of memory (batch norm over (N, C)): a
    block takes 32 adjacent rows, a lane each, and one chunk of their length, its warps walking
    alternate positions; enough chunks for two waves of resident blocks, and at least eight
    positions a thread."""

    def __init__(self, rows: int, length: int, index: str) -> None:
        self.rows, self.length, self.index = rows, length, index
        self.block = 32 * _COLUMN_SLICES
        self.tiles = math.ceil(rows / 32)
        resident = _GPU_THREADS // self.block
        most = max(1, length // (_COLUMN_SLICES * 8))
        self.splits = max(1, min(math.ceil(2 * resident / self.tiles), most, 1024))
        self.chunk = math.ceil(length / self.splits)

    def head(self) -> list[str]:
        """Row (this lane's column) and chunk of this block, and an empty accumulator."""
        ix = self.index
        return [
            f"  const {ix} r = ({ix})(blockIdx.x / {self.splits}) * 32 + (threadIdx.x & 31);",
            f"  const {ix} s = blockIdx.x % {self.splits};",
            f"  const {ix} end = min(({ix})((s + 1) * {self.chunk}), ({ix}){self.length});",
            "  SgWelford acc = SgWelford::init();",
        ]


def _row_mode(tun: KernelTuning, length: int) -> str:
    """A warp or a block per row: the tuning's choice, else a warp for rows up to 1024."""
    if tun.rows_per_block > 1:
        return "warp"
    if tun.rows_per_block == 1:
        return "block"
    return "warp" if length <= 1024 else "block"


_THREAD_ROWS = 16384  # strided rows a thread each: enough of them to fill an H200's SMs
_THREAD_ROW_LENGTH = 32  # at most this many values a thread, held in registers


def _thread_per_row(tun: KernelTuning, length: int, rows: int, contiguous: bool) -> bool:
    """A thread per row for many short strided rows (softmax over the channels of NCHW): the
    threads of a warp take neighbouring rows, so every load of a channel is one coalesced line,
    where the lanes of a warp on one such row would each read another line. Only by default:
    a tuning that names rows per block keeps its warp or block."""
    return (
        tun.rows_per_block == 0
        and not contiguous
        and length <= _THREAD_ROW_LENGTH
        and rows >= _THREAD_ROWS
    )


def _column_warps(tun: KernelTuning, op: str, length: int, inner: int) -> int:
    """Warps of a column-mode block, 0 where it does not apply. Softmax over a strided dim
    (channels of NCHW) with a warp per row has its lanes read positions ``inner`` floats apart,
    a line each; a lane per row instead makes each warp load 32 adjacent rows, one line, with
    the block's warps splitting the row's positions. Needs ``inner`` of 8 or more (a tile of
    32 rows then spans at most five runs of memory; where 32 does not divide it, a tile's rows
    straddle two outer slices, and the last tile is partial: lanes past the rows compute a
    copy of the last row and store nothing) and at most 1024 positions (32 warps, 32 values a
    thread); rows up to ``_THREAD_ROW_LENGTH`` keep a thread each. Only by default, as for
    ``_thread_per_row``. A warp per row over 1666-float strides ran log-softmax over 96
    channels at 0.092 ms for 40 MB on an H100, eager's at 0.080 ms."""
    if (
        tun.rows_per_block != 0
        or op not in ("softmax", "log_softmax")
        or inner < 8
        or not _THREAD_ROW_LENGTH < length <= 1024
    ):
        return 0
    return _pow2_at_least(max(4, math.ceil(length / 32)))  # a power of two: vpt <= 32


def _declared(name: str, decl: str, lines: list[str]) -> list[str]:
    """``[decl]`` when a line reads the variable ``name``, else nothing."""
    return [decl] if any(re.search(rf"\b{name}\b", line) for line in lines) else []


@dataclass(frozen=True)
class _Pass:
    """The loops of one variant of a two-pass row op: scalar, or float4 (``vec``: four
    consecutive elements a thread, loaded and stored as one ``float4``)."""

    vec: bool
    args: _Args
    offset: str  # element of row r, position k
    index: str
    pre: list[str]  # statistics pass: prologue, then the value reduced
    elem: str
    stats: list[str]  # the row's statistics from the reduced accumulator
    pre2: list[str]  # write pass: prologue, the op and its epilogue
    post: list[str]
    result: str
    load_vec: list[Ref]
    write_vec: list[Ref]

    @property
    def suffix(self) -> str:
        return "_v4" if self.vec else ""

    @property
    def aligned(self) -> list[Ref]:
        """Tensors read or written as float4: they must start on 16-byte boundaries."""
        return list(dict.fromkeys([*self.load_vec, *self.write_vec]))

    def stats_loop(self, start: str, end: str, step: str, tid: str) -> list[str]:
        """Positions ``start + tid``, stepping by ``step``, up to ``end`` into ``acc``."""
        if not self.vec:
            body = [*self.pre, f"acc.update({self.elem}, k);"]
            return self._scalar(start, end, step, tid, body)
        body = [*self.pre, f"x[l] = {self.elem};"]
        return self._vector(
            start, end, step, tid, body, self.load_vec, "float x[4];", "acc.update4(x, q * 4);"
        )

    def write_loop(self, start: str, end: str, step: str, tid: str) -> list[str]:
        """The same positions, normalised and written."""
        if not self.vec:
            body = [*self.pre2, *self.post, f"out[i] = {self.result};"]
            return self._scalar(start, end, step, tid, body)
        body = [*self.pre2, *self.post, f"o[l] = {self.result};"]
        store = "reinterpret_cast<float4*>(out)[j] = make_float4(o[0], o[1], o[2], o[3]);"
        return self._vector(start, end, step, tid, body, self.write_vec, "float o[4];", store)

    def _scalar(self, start: str, end: str, step: str, tid: str, body: list[str]) -> list[str]:
        ix = self.index
        return [
            f"for ({ix} k = {start} + ({tid}); k < {end}; k += {step}) {{",
            f"  const {ix} i = {self.offset};",
            *(f"  {line}" for line in body),
            "}",
        ]

    def _vector(
        self,
        start: str,
        end: str,
        step: str,
        tid: str,
        body: list[str],
        refs: list[Ref],
        head: str,
        tail: str,
    ) -> list[str]:
        ix = self.index
        inner = [
            *_declared("k", f"const {ix} k = q * 4 + l;", body),
            *_declared("i", f"const {ix} i = j * 4 + l;", body),
            *body,
        ]
        names = [f"a{self.args.refs.index(r)}" for r in refs]
        first = re.sub(r"\bk\b", "(q * 4)", self.offset)  # the chunk's first element
        return [
            f"for ({ix} q = ({start}) / 4 + ({tid}); q < ({end}) / 4; q += {step}) {{",
            f"  const {ix} j = ({first}) / 4;",
            *(f"  const float4 {n}v = reinterpret_cast<const float4*>({n})[j];" for n in names),
            f"  {head}",
            "  #pragma unroll",
            "  for (int l = 0; l < 4; ++l) {",
            *(f"    {line}" for line in inner),
            "  }",
            f"  {tail}",
            "}",
        ]


class _Streams:
    """Builds the scalar and float4 variants of a two-pass row op (rows too long for
    registers): the same expressions, loaded per element or from float4 chunks."""

    def __init__(
        self,
        emitter: _EmitterBase,
        g: Group,
        offset: str,
        affine_idx: str,
        eps: Any,
        index: str,
        length: int,
    ) -> None:
        self.em, self.g, self.offset, self.affine_idx = emitter, g, offset, affine_idx
        self.eps, self.index, self.length = eps, index, length

    def variant(self, vec: bool) -> _Pass:
        em, g = self.em, self.g
        ir = em.ir
        node = ir.node(g.anchor or "")
        op = node.op
        src: Ref = node.args["input"]
        shape = ir.shapes[src]
        args = _Args(ir)
        load_args = _Args(ir, refs=args.refs, vector=vec)
        write_args = _Args(ir, refs=args.refs, vector=vec)
        env: dict[str, str] = {}
        pre = em.exprs(g.prologue, shape, "i", env, load_args)
        value = em.value_of(src, shape, "i", env, load_args)
        elem = f"{value} * {value}" if op == "rms_norm" else value
        env2: dict[str, str] = {}  # the write pass re-evaluates the prologue under the same names
        pre2 = em.exprs(g.prologue, shape, "i", env2, write_args)
        value2 = em.value_of(src, shape, "i", env2, write_args)
        stats, y = self._finish(op, value2)
        for key, sign in (("weight", "*"), ("bias", "+")):
            ref = node.args.get(key)
            if isinstance(ref, Ref):
                y = f"({y}) {sign} {write_args.param(ref)}[{self.affine_idx}]"
        env2[node.name] = f"v_{node.name}"
        post = [f"const float v_{node.name} = {y};"]
        post += em.exprs(g.epilogue, shape, "i", env2, write_args)
        return _Pass(
            vec,
            args,
            self.offset,
            self.index,
            pre,
            elem,
            stats,
            pre2,
            post,
            env2[ir.node(g.output).name],
            list(load_args.vec_refs),
            list(write_args.vec_refs),
        )

    def _finish(self, op: str, value: str) -> tuple[list[str], str]:
        """Lines turning the reduced ``acc`` into the row's statistics, and the op's value."""
        if op == "softmax":
            return ["const float inv = 1.f / acc.s;"], f"sg_row_exp({value} - acc.m) * inv"
        if op == "log_softmax":
            return ["const float lse = acc.m + logf(acc.s);"], f"{value} - lse"
        if op == "rms_norm":
            scale = f"rsqrtf(acc.s / {float(self.length)!r}f + {_literal(self.eps)})"
            return [f"const float scale = {scale};"], f"{value} * scale"
        return [
            "const float mean = acc.mean;",
            f"const float rstd = rsqrtf(acc.m2 / acc.n + {_literal(self.eps or 1e-5)});",
        ], f"({value} - mean) * rstd"


class _SoftmaxNormEmitter(_EmitterBase):
    """Row-wise softmax and normalisation kernels (``row_op``)."""

    # ---- softmax and normalisations ------------------------------------------------------------
    def _row_cached(
        self,
        g: Group,
        kernel: str,
        tun: KernelTuning,
        rows: int,
        length: int,
        offset: str,
        affine_idx: str,
        eps: Any,
        index: str,
        inner: int = 1,
    ) -> list[str] | None:
        """Softmax/norm kernel that keeps each row in registers: one global read, one write.

        A warp (short rows) or a block of up to 1024 threads (long rows) owns a row, or (rows
        ``inner`` apart in memory, see ``_thread_per_row`` and ``_column_warps``) a thread, or a
        lane of a block whose ``threads`` warps split the row (column mode); each thread
        holds its ``vpt`` values in ``float v[vpt]`` (element ``t + c * threads``, or float4 chunk
        ``t + c * threads`` when the row is contiguous and its length a multiple of 4: ``_v4``
        kernel, scalar twin chosen at run time when an operand is not 16-byte aligned).
        Statistics come from the registers: max, then sum of ``exp(v - max)`` for softmax; exact
        mean, then sum of squared deviations for the norms; sum of squares for RMS. Slots beyond
        the row end are never loaded, reduced or stored. Knobs: ``rows_per_block`` > 1 / == 1
        force a warp / a block per row, ``vector_width`` 1 the scalar kernel alone, ``block_size``
        the rows per block (warp) or the threads per row (block; raised until ``vpt`` <= 16, at
        most to 512); column mode sizes its own block. Returns ``None`` (two-pass kernel
        instead) when ``vpt`` would exceed the register budget: 32 values a thread up to 512
        threads a block, 16 at 1024 (32 for float4 or column softmax rows reading one tensor,
        which need few other registers: a 32000-class row read once). Column mode that would
        exceed it falls back to a warp or block per row.
        """
        ir = self.ir
        node = ir.node(g.anchor or "")
        op = node.op
        src: Ref = node.args["input"]
        shape = ir.shapes[src]
        out = ir.node(g.output)
        if numel(out.shape) != numel(shape) or length < 1:
            return None
        contiguous = offset == f"r * {length} + k"
        mode = _row_mode(tun, length)
        if _thread_per_row(tun, length, rows, contiguous):
            mode = "thread"
        slices = _column_warps(tun, op, length, inner)
        if slices:
            mode = "column"
        vector = (
            tun.vector_width == 4
            and contiguous
            and length % 4 == 0
            and out.dtype == "float32"
        )

        def vpt(threads: int) -> int:  # registers per thread for the row (float4: whole chunks)
            return 4 * math.ceil(length / 4 / threads) if vector else math.ceil(length / threads)

        # softmax rows in float4 reading one tensor need few registers besides v[] (49 at 1024
        # threads x 32 values; a second tensor read in the write pass spills); so do column
        # tiles (64, no spill, at 1024 threads x 32 values; 76+ bytes spilled with two tensors)
        members = {node.name, *g.prologue, *g.epilogue}
        read = {
            ref
            for m in members
            for ref in ir.node(m).tensor_refs()
            if ref.kind != "node" or ref.name not in members
        }
        wide = (
            (vector or mode == "column")
            and op in ("softmax", "log_softmax")
            and tun.rows_per_block == 0
            and len(read) == 1
        )

        def budget(block: int) -> int:  # ptxas gives 255 registers a thread up to 256 threads,
            if block <= 512 or wide:  # 128 at 512, 64 at 1024: keep v[] well below
                return 32
            return 16

        if mode == "column" and vpt(slices) > budget(32 * slices):
            mode = _row_mode(tun, length)  # would spill: a warp per row, as before
        tiles = math.ceil(rows / 32)  # column mode's tiles of 32 rows
        block = min(tun.block_size, 1024)
        if mode == "thread":
            threads, block = 1, min(block, 512)
        elif mode == "column":
            threads, block = slices, 32 * slices
        elif mode == "warp":
            threads = 32
            if vpt(threads) > budget(block):
                block = min(block, 512)  # fewer rows per block rather than spilling
        else:
            threads = block  # at most 16 a thread up to 512 threads, then 32; 1024 only if asked
            while threads < 512 and vpt(threads) > 16:
                threads = min(512, threads * 2)
            if wide and vpt(threads) > budget(threads):
                threads = 1024  # one read instead of a statistics pass and a second read
            block = threads
        if vpt(threads) > budget(block):
            return None
        reduce_fn = {
            "warp": "sg_warp_reduce",
            "block": "sg_block_reduce",
            "column": f"sg_slice_reduce<{threads}>",  # lane by lane across the warps
        }.get(mode)
        weight, bias = node.args.get("weight"), node.args.get("bias")
        # the scheduler gives prologue values one reader; re-evaluate them if the epilogue reads any
        prologue = set(g.prologue)
        needs_prologue = any(
            ref.kind == "node" and ref.name in prologue
            for m in g.epilogue
            for ref in ir.node(m).tensor_refs()
        )
        otype = _CTYPE.get(out.dtype, "float")
        if op == "rms_norm":
            eps_lit = _literal(eps)
        elif op not in ("softmax", "log_softmax"):
            eps_lit = _literal(eps or 1e-5)

        def affine_vector(ref: Any) -> bool:
            if not isinstance(ref, Ref) or affine_idx != "k":
                return False
            rshape = tuple(ir.shapes[ref])
            return (
                ir.dtypes.get(ref, "float32") == "float32"
                and numel(rshape) == length
                and tuple(ir.strides.get(ref, contiguous_strides(rshape)))
                == contiguous_strides(rshape)
            )

        def variant(vec: bool) -> tuple[list[str], _Args, list[Ref]]:
            w = 4 if vec else 1
            nu = length // w  # elements or float4 chunks per row
            nv = math.ceil(nu / threads)  # per thread
            full = nu // threads  # chunks c < full are in the row for every thread
            ok = "" if nu % threads == 0 else (f"c < {full} || u < {nu}" if full else f"u < {nu}")
            s = "v[c * 4 + l]" if vec else "v[c]"
            args = _Args(ir)
            row = (tuple(shape), length) if contiguous else None  # i = r * length + k
            load_args = _Args(ir, refs=args.refs, vector=vec, row=row)
            write_args = _Args(ir, refs=args.refs, vector=vec, row=row)

            def slots(
                body: list[str], head: list[str] | None = None, tail: list[str] | None = None
            ) -> list[str]:
                """Loop over this thread's slots of the row (unrolled; tail slots guarded)."""
                inner = list(head or [])
                if vec:
                    inner += ["#pragma unroll", "for (int l = 0; l < 4; ++l) {"]
                    inner += [f"  {b}" for b in body] + ["}"]
                else:
                    inner += body
                inner += tail or []
                lines = ["#pragma unroll", f"for (int c = 0; c < {nv}; ++c) {{"]
                if ok or head:
                    lines.append(f"  const int u = t + c * {threads};")
                if ok:
                    lines += [f"  if ({ok}) {{", *(f"    {x}" for x in inner), "  }"]
                else:
                    lines += [f"  {x}" for x in inner]
                return [*lines, "}"]

            def vec_loads(refs: list[Ref], at: str) -> list[str]:
                return [
                    f"const float4 a{args.refs.index(r)}v = "
                    f"reinterpret_cast<const float4*>(a{args.refs.index(r)})[{at}];"
                    for r in refs
                ]

            # load pass: prologue on load, one read per element
            env: dict[str, str] = {}
            pre = self.exprs(g.prologue, shape, "i", env, load_args)
            value = self.value_of(src, shape, "i", env, load_args)
            if vec:
                i_decl = _declared("i", f"const {index} i = j * 4 + l;", [*pre, value])
                load = slots(
                    [*i_decl, *pre, f"{s} = {value};"],
                    [f"const {index} j = r * {nu} + u;", *vec_loads(load_args.vec_refs, "j")],
                )
            else:
                load = slots(
                    [*pre, f"{s} = {value};"],
                    [f"const {index} k = u;", f"const {index} i = {offset};"],
                )

            # statistics from the registers
            def reduce(name: str, body: list[str]) -> list[str]:
                acc = "SgMax" if name == "mx" else "SgSum"
                combine = [f"{name} = {reduce_fn}({name});"] if reduce_fn else []
                return [f"{acc} {name} = {acc}::init();", *slots(body), *combine]

            if op in ("softmax", "log_softmax"):
                stats = reduce("mx", [f"mx.update({s}, 0);"])
                if op == "softmax":
                    stats += reduce("sm", [f"{s} = sg_row_exp({s} - mx.m);", f"sm.s += {s};"])
                    stats.append("const float inv = 1.f / sm.s;")
                    y = f"{s} * inv"
                else:
                    stats += reduce("sm", [f"sm.s += sg_row_exp({s} - mx.m);"])
                    stats.append("const float lse = mx.m + logf(sm.s);")
                    y = f"{s} - lse"
            elif op == "rms_norm":
                stats = reduce("sm", [f"sm.s += {s} * {s};"])
                stats.append(f"const float scale = rsqrtf(sm.s / {float(length)!r}f + {eps_lit});")
                y = f"{s} * scale"
            else:
                stats = reduce("sm", [f"sm.s += {s};"])
                stats.append(f"const float mean = sm.s / {float(length)!r}f;")
                stats += reduce("sq", [f"const float d = {s} - mean;", "sq.s += d * d;"])
                stats.append(f"const float rstd = rsqrtf(sq.s / {float(length)!r}f + {eps_lit});")
                y = f"({s} - mean) * rstd"

            # write pass from the registers: affine, epilogue, one write per element
            affine_vec: list[Ref] = []
            uses_k = False
            for ref, sign in ((weight, "*"), (bias, "+")):
                if not isinstance(ref, Ref):
                    continue
                name = write_args.param(ref)
                if vec and affine_vector(ref):
                    affine_vec.append(ref)
                    y = f"({y}) {sign} (&{name}w.x)[l]"
                else:
                    uses_k = uses_k or "k" in affine_idx
                    y = f"({y}) {sign} {name}[{affine_idx}]"
            env2: dict[str, str] = {}
            pre2 = self.exprs(g.prologue, shape, "i", env2, write_args) if needs_prologue else []
            env2[node.name] = f"v_{node.name}"
            post = [f"const float v_{node.name} = {y};"]
            post += self.exprs(g.epilogue, shape, "i", env2, write_args)
            result = env2[out.name]
            if vec:
                head = [
                    f"const {index} j = r * {nu} + u;",
                    *vec_loads(write_args.vec_refs, "j"),
                    *(
                        f"const float4 a{args.refs.index(r)}w = "
                        f"reinterpret_cast<const float4*>(a{args.refs.index(r)})[u];"
                        for r in affine_vec
                    ),
                    f"{otype} o[4];",
                ]
                body = [f"const {index} k = u * 4 + l;"] if uses_k else []
                body += _declared("i", f"const {index} i = j * 4 + l;", [*pre2, *post])
                body += [*pre2, *post, f"o[l] = {result};"]
                tail = ["reinterpret_cast<float4*>(out)[j] = make_float4(o[0], o[1], o[2], o[3]);"]
                write = slots(body, head, tail)
            else:
                store = f"out[i] = {result};"
                if mode == "column" and rows % 32:
                    store = f"if (lane_row < {rows}) {store}"
                write = slots(
                    [*pre2, *post, store],
                    [f"const {index} k = u;", f"const {index} i = {offset};"],
                )

            how = f"{mode} per row"
            row_head: list[str] = []
            if mode == "thread":
                tid = "0"
                row_loop = (
                    f"for ({index} r = ({index})blockIdx.x * {block} + threadIdx.x; "
                    f"r < {rows}; r += ({index})gridDim.x * {block})"
                )
            elif mode == "warp":
                warps = block // 32
                tid = "threadIdx.x & 31"
                row_loop = (
                    f"for ({index} r = ({index})blockIdx.x * {warps} + (threadIdx.x >> 5); "
                    f"r < {rows}; r += ({index})gridDim.x * {warps})"
                )
            elif mode == "column":
                # lane l holds row tile * 32 + l, warp t its positions t, t + W, ...; the tile
                # loop is block-uniform, as sg_slice_reduce's barriers need (32 | rows)
                how = f"column tiles: a lane per row, {threads} warps along it"
                tid = "threadIdx.x >> 5"
                row_loop = (
                    f"for ({index} tile = blockIdx.x; tile < {tiles}; tile += gridDim.x)"
                )
                row_head = [f"const {index} r = tile * 32 + (threadIdx.x & 31);"]
                if rows % 32:  # the last tile's lanes past the rows repeat the last row
                    row_head = [
                        f"const {index} lane_row = tile * 32 + (threadIdx.x & 31);",
                        f"const {index} r = lane_row < {rows} ? lane_row : {rows - 1};",
                    ]
            else:
                tid = "threadIdx.x"
                row_loop = f"for ({index} r = blockIdx.x; r < {rows}; r += gridDim.x)"
            name = f"{kernel}_v4" if vec else kernel
            src_lines = [
                f"// {op}: {rows} row(s) of {length}, {how}; the row stays in registers "
                f"({nv * w} per thread{', float4' if vec else ''}): one read, one write",
                f'extern "C" __global__ __launch_bounds__({block}) void {name}('
                f"{args.signature([f'{otype}* __restrict__ out'])}) {{",
                f"  const int t = {tid};",
                f"  {row_loop} {{",
                *(f"    {line}" for line in row_head),
                f"    float v[{nv * w}] = {{}};  // slots past the row end stay 0, never read",
                *(f"    {line}" for line in [*load, *stats, *write]),
                "  }",
                "}",
            ]
            aligned: list[Ref] = []
            for ref in [*load_args.vec_refs, *write_args.vec_refs, *affine_vec]:
                if ref not in aligned:
                    aligned.append(ref)
            return src_lines, args, aligned

        if mode == "thread":
            grid = max(1, min(math.ceil(rows / block), _MAX_GRID))
        elif mode == "warp":
            grid = max(1, min(math.ceil(rows / (block // 32)), _MAX_GRID))
        elif mode == "column":
            grid = max(1, min(tiles, _MAX_GRID))
        else:
            grid = max(1, min(rows, 65535))
        scalar_src, sargs, _ = variant(False)
        self.kernels.append("\n".join(scalar_src))
        py_args = ", ".join([*(_py(r) for r in sargs.refs), out.name])
        alloc = (
            f"{out.name} = torch.empty({list(out.shape)}, device=_dev, "
            f"dtype={_TORCH_DTYPE.get(out.dtype, 'torch.float32')})"
        )
        launch = f"KERNELS.{kernel}({grid}, {block}, {py_args})"
        if not vector:
            return [alloc, launch]
        vsrc, vargs, aligned = variant(True)
        if vargs.refs != sargs.refs:
            return [alloc, launch]
        self.kernels.append("\n".join(vsrc))
        names = [*(_py(r) for r in aligned), out.name]
        return [alloc, *_aligned_launch(names, kernel, (grid, block), py_args, launch)]

    def row_op(self, g: Group, kernel: str, tun: KernelTuning) -> list[str]:
        ir = self.ir
        node = ir.node(g.anchor or "")
        src: Ref = node.args["input"]
        shape = ir.shapes[src]
        out = ir.node(g.output)
        big = numel(shape) >= 2**31
        index = "long long" if big else "int"
        op = node.op
        affine_idx = "k"
        eps = node.args.get("eps")
        run = 0  # contiguous elements of a row between jumps (float4 needs 4 | run)
        inner = 1  # distance of a row's neighbouring elements (softmax over a middle dim)
        if op in ("softmax", "log_softmax"):
            outer, length, inner = row_layout(shape, [int(node.args["dim"])]) or (1, 1, 1)
            rows = outer * inner
            offset = (
                f"(r / {inner}) * {length * inner} + k * {inner} + r % {inner}"
                if inner > 1
                else f"r * {length} + k"
            )
            run = length if inner == 1 else 0
        elif op in ("layer_norm", "rms_norm"):
            normalized = node.args["normalized_shape"]
            count = len(normalized) if isinstance(normalized, list | tuple) else 1
            length = numel(shape[len(shape) - count :])
            rows = numel(shape) // length
            offset, run = f"r * {length} + k", length
            if op == "rms_norm" and eps is None:
                eps = 1.1920928955078125e-07
        else:
            n, c = shape[0], shape[1]
            hw = numel(shape[2:])
            if op == "group_norm":
                groups = int(node.args["num_groups"])
                rows, length = n * groups, (c // groups) * hw
                offset, run = f"r * {length} + k", length
                affine_idx = f"(r % {groups}) * {c // groups} + k / {hw}"
            elif op == "instance_norm":
                rows, length = n * c, hw
                offset, run = f"r * {length} + k", length
                affine_idx = f"r % {c}"
            else:  # batch_norm with batch statistics
                rows, length = c, n * hw
                offset, run = f"(k / {hw}) * {c * hw} + r * {hw} + k % {hw}", hw
                affine_idx = "r"
                if hw < _COLUMN_RUN:  # a channel's elements lie a row of memory apart
                    stream = _Streams(self, g, offset, affine_idx, eps, index, length)
                    loops = _ColumnLoops(rows, length, index)
                    return self._column_row_op(g, kernel, loops, stream.variant(False))
        split = tun.split_reduction
        if split is None:  # too few rows to fill the GPU, and long enough to cut into chunks
            split = rows < 2 * _SMS and length >= 65536
        cached = (
            None
            if split
            else self._row_cached(
                g, kernel, tun, rows, length, offset, affine_idx, eps, index, inner=inner
            )
        )
        if cached is not None:
            return cached
        # rows too long for registers: statistics pass, then a write pass that reads the row again
        acc = {"softmax": "SgLse", "log_softmax": "SgLse", "rms_norm": "SgSum"}.get(op, "SgWelford")
        mode = _row_mode(tun, length)
        block = min(tun.block_size, 1024)
        if tun.rows_per_block == 0 and mode == "block":
            # rows get here when too long for registers: few per SM, so use more threads per row
            # (H200, 256 rows of 32K: 0.08 ms at 256 threads, 0.03 ms at 1024)
            block = min(4 * tun.block_size, 1024)
        vector = (
            tun.vector_width == 4
            and out.dtype == "float32"
            and numel(out.shape) == numel(shape)
            and run > 0
            and run % 4 == 0
        )
        stream = _Streams(self, g, offset, affine_idx, eps, index, length)
        scalar = stream.variant(False)
        twin = stream.variant(True) if vector else None
        if twin is not None and twin.args.refs != scalar.args.refs:
            twin = None
        if split:
            loops = _SplitLoops(rows, length, block, index, offset, acc, most=1024, align=4)
            return self._split_row_op(g, kernel, loops, scalar, twin)
        out_alloc = (
            f"{out.name} = torch.empty({list(out.shape)}, device=_dev, "
            f"dtype={_TORCH_DTYPE.get(out.dtype, 'torch.float32')})"
        )
        if mode == "warp":
            warps = block // 32
            row_loop = (
                f"for ({index} r = ({index})blockIdx.x * {warps} + (threadIdx.x >> 5); r < {rows}; "
                f"r += ({index})gridDim.x * {warps})"
            )
            k_start, k_step, reduce_line = "threadIdx.x & 31", "32", "acc = sg_warp_reduce(acc);"
            grid = max(1, min(math.ceil(rows / warps), _MAX_GRID))
        else:
            row_loop = f"for ({index} r = blockIdx.x; r < {rows}; r += gridDim.x)"
            k_start, k_step, reduce_line = "threadIdx.x", str(block), "acc = sg_block_reduce(acc);"
            grid = max(1, min(rows, 65535))
        unroll = f"#pragma unroll {tun.unroll}" if tun.unroll > 1 else ""
        otype = _CTYPE.get(out.dtype, "float")
        for pas in (scalar, twin):
            if pas is None:
                continue
            span = ("0", str(length), k_step, k_start)
            self.kernels.append(
                "\n".join(
                    [
                        f"// {op}: {rows} row(s) of {length}, {mode} per row; statistics pass, then "
                        f"write pass{', float4' if pas.vec else ''}",
                        f'extern "C" __global__ __launch_bounds__({block}) void {kernel}{pas.suffix}('
                        f"{pas.args.signature([f'{otype}* __restrict__ out'])}) {{",
                        f"  {row_loop} {{",
                        f"    {acc} acc = {acc}::init();",
                        f"    {unroll}",
                        *(f"    {line}" for line in pas.stats_loop(*span)),
                        f"    {reduce_line}",
                        *(f"    {line}" for line in pas.stats),
                        f"    {unroll}",
                        *(f"    {line}" for line in pas.write_loop(*span)),
                        "  }",
                        "}",
                    ]
                )
            )
        py_args = ", ".join([*(_py(r) for r in scalar.args.refs), out.name])
        launch = f"KERNELS.{kernel}({grid}, {block}, {py_args})"
        if twin is None:
            return [out_alloc, launch]
        names = [*(_py(r) for r in twin.aligned), out.name]
        return [out_alloc, *_aligned_launch(names, kernel, (grid, block), py_args, launch)]

    def _column_row_op(self, g: Group, kernel: str, loops: _ColumnLoops, pas: _Pass) -> list[str]:
        """A row op whose rows are columns of memory, in two kernels over ``loops``' tiles:
        ``<kernel>_part`` writes each chunk's statistics of its 32 rows, ``<kernel>`` combines
        them and writes the chunk. A lane per row keeps every warp load one 128-byte line,
        where a block per row would read 4 bytes of each 32-byte sector."""
        out = self.ir.node(g.output)
        otype = _CTYPE.get(out.dtype, "float")
        ix, rows, slices = loops.index, loops.rows, _COLUMN_SLICES
        span = (f"s * {loops.chunk}", "end", str(slices), "(threadIdx.x >> 5)")
        reduce = f"  acc = sg_slice_reduce<{slices}>(acc);"
        part = [
            f"// stage 1: statistics of {rows} column(s) x {loops.splits} chunk(s) of "
            f"{loops.chunk}, a lane per column",
            f'extern "C" __global__ __launch_bounds__({loops.block}) void {kernel}_part('
            f"{pas.args.signature(['unsigned char* __restrict__ ws'])}) {{",
            *loops.head(),
            f"  if (r < {rows}) {{",
            "#pragma unroll 4",
            *(f"    {line}" for line in pas.stats_loop(*span)),
            "  }",
            reduce,
            f"  if ((threadIdx.x >> 5) == 0 && r < {rows}) "
            f"reinterpret_cast<SgWelford*>(ws)[s * {rows} + r] = acc;",
            "}",
        ]
        write = [
            "// stage 2: each column's statistics from its chunks, then this chunk written",
            f'extern "C" __global__ __launch_bounds__({loops.block}) void {kernel}('
            f"{pas.args.signature(['const unsigned char* __restrict__ ws', f'{otype}* __restrict__ out'])}) {{",  # noqa: E501
            *loops.head(),
            "  const SgWelford* parts = reinterpret_cast<const SgWelford*>(ws);",
            f"  if (r < {rows})",
            f"    for ({ix} j = threadIdx.x >> 5; j < {loops.splits}; j += {slices}) "
            f"acc.combine(parts[j * {rows} + r]);",
            reduce,
            f"  if (r >= {rows}) return;",
            *(f"  {line}" for line in pas.stats),
            *(f"  {line}" for line in pas.write_loop(*span)),
            "}",
        ]
        self.kernels.append("\n".join(part))
        self.kernels.append("\n".join(write))
        launch = (loops.tiles * loops.splits, loops.block)
        args = pas.args
        return _two_stage_launch(g, kernel, out, args, args, rows * loops.splits, launch, launch)

    def _split_row_op(
        self,
        g: Group,
        kernel: str,
        loops: _SplitLoops,
        scalar: _Pass,
        twin: _Pass | None,
    ) -> list[str]:
        """A row op over few long rows in two kernels, each with ``splits`` blocks a row:
        ``<kernel>_part`` writes each chunk's statistics, ``<kernel>`` combines its row's and
        writes its chunk (float4 twins ``_v4`` when ``twin`` is given, chosen at run time)."""
        out = self.ir.node(g.output)
        otype = _CTYPE.get(out.dtype, "float")
        span = (f"s * {loops.chunk}", "end", str(loops.block), "threadIdx.x")
        for pas in (scalar, twin):
            if pas is None:
                continue
            part = [
                f"// stage 1: statistics of {loops.rows} row(s) x {loops.splits} chunk(s) of "
                f"{loops.chunk}{', float4' if pas.vec else ''}",
                f'extern "C" __global__ __launch_bounds__({loops.block}) void '
                f"{kernel}_part{pas.suffix}("
                f"{pas.args.signature(['unsigned char* __restrict__ ws'])}) {{",
                *loops.head(),
                "#pragma unroll 4",
                *(f"  {line}" for line in pas.stats_loop(*span)),
                "  acc = sg_block_reduce(acc);",
                f"  if (threadIdx.x == 0) reinterpret_cast<{loops.acc}*>(ws)[blockIdx.x] = acc;",
                "}",
            ]
            write = [
                "// stage 2: the row's statistics from its chunks, then this chunk written",
                f'extern "C" __global__ __launch_bounds__({loops.block}) void {kernel}{pas.suffix}('
                f"{pas.args.signature(['const unsigned char* __restrict__ ws', f'{otype}* __restrict__ out'])}) {{",  # noqa: E501
                *loops.head(),
                f"  const {loops.acc}* parts = reinterpret_cast<const {loops.acc}*>(ws) + r * "
                f"{loops.splits};",
                f"  for (int j = threadIdx.x; j < {loops.splits}; j += {loops.block}) "
                "acc.combine(parts[j]);",
                "  acc = sg_block_reduce(acc);",
                *(f"  {line}" for line in pas.stats),
                *(f"  {line}" for line in pas.write_loop(*span)),
                "}",
            ]
            self.kernels.append("\n".join(part))
            self.kernels.append("\n".join(write))
        blocks = loops.rows * loops.splits
        launch = (blocks, loops.block)
        aligned = None if twin is None else [_py(r) for r in twin.aligned]
        args = scalar.args
        return _two_stage_launch(g, kernel, out, args, args, blocks, launch, launch, aligned)
