"""Emission: CUDA kernels and ``ModelNew`` host code for the items of a plan.

This module only emits; every decision about what to fuse was taken by the scheduler (and is in
the plan's items), every knob comes from ``Tuning``. Kernel styles: grid-stride pointwise kernels
with ``__restrict__`` pointers and a float4 twin chosen at run time when all full-size operands are
16-byte aligned; reductions with one thread, warp or block per row (or two stages when rows are few
and long); softmax/log-softmax and layer/group/batch/instance/RMS norms (fused affine) with the
row held in registers (float4 twin; one read, one write) when it fits, else a statistics pass
(online max+sum, Welford) then a write pass that reads the row again; convolutions as im2col by
chunks of images + cuBLAS SGEMM (one per group when grouped) + one bias/epilogue kernel, else
direct with the epilogue fused (1-D, 2-D and 3-D); transposed convolutions with stride 1 as the
equivalent convolution (weight transposed and flipped by a small kernel at each call), others
(groups=1) as cuBLAS SGEMM into a column buffer + a col2im gather that fuses bias and epilogue,
else a direct gather kernel; pooling (max, average, adaptive) as a pointwise kernel whose anchor
value loops over the window; scans (cumsum/cumprod) with a thread per line or a warp per line
(shuffle scan plus carry); ops that read other positions (cat, stack, flip, gather, index, roll,
pad, triu/tril) as pointwise expressions with their own indexing; GEMMs through cuBLAS (true FP32)
followed by one epilogue kernel. Items not yet generated, or whose emission fails, run in PyTorch
inside ``forward`` and are declared in ``Candidate.declared_torch_ops``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from stitch_graph.artifacts import Candidate, Plan
from stitch_graph.codegen._cuda import PRELUDE
from stitch_graph.codegen.ir import (
    Group,
    OpNode,
    ProgramIR,
    Ref,
    contiguous_strides,
    matrix_layout,
    numel,
    row_layout,
)
from stitch_graph.codegen.ops import INDEXED, lookup
from stitch_graph.codegen.schedule import (
    groups_from_plan,
    index_position,
    node_kind,
    pool_dims,
    reduction_dims,
)
from stitch_graph.codegen.tuning import KernelTuning, Tuning

__all__ = ["EmitError", "emit_candidate"]

_CTYPE = {"float32": "float", "bool": "bool", "int64": "long long"}
_TORCH_DTYPE = {"float32": "torch.float32", "bool": "torch.bool", "int64": "torch.int64"}
_MAX_GRID = 132 * 32
_ACC = {
    "sum": "SgSum",
    "mean": "SgSum",
    "norm": "SgSum",
    "prod": "SgProd",
    "amax": "SgMax",
    "max": "SgMax",
    "amin": "SgMin",
    "min": "SgMin",
    "argmax": "SgArgMax",
    "argmin": "SgArgMin",
    "var": "SgWelford",
    "std": "SgWelford",
    "logsumexp": "SgLse",
}
_SPLITTABLE = {"sum", "mean", "norm", "amax", "amin", "max", "min", "prod", "logsumexp"}


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


def _two_stage_launch(
    g: Group,
    kernel: str,
    out: Any,
    args: _Args,
    args2: _Args,
    partials: int,
    launch1: tuple[int, int],
    launch2: tuple[int, int],
) -> list[str]:
    """Host lines of a split reduction: a workspace of ``partials`` accumulators (16 bytes
    each), stage ``<kernel>_part`` writing them, then ``<kernel>`` combining them into ``out``."""
    ws = f"_ws_{g.id}"
    p1 = ", ".join([*(_py(r) for r in args.refs), ws])
    p2 = ", ".join([*(_py(r) for r in args2.refs), ws, out.name])
    return [
        f"{ws} = torch.empty({partials * 16}, device=_dev, dtype=torch.uint8)",
        f"KERNELS.{kernel}_part({launch1[0]}, {launch1[1]}, {p1})",
        f"{out.name} = torch.empty({list(out.shape)}, device=_dev, "
        f"dtype={_TORCH_DTYPE.get(out.dtype, 'torch.float32')})",
        f"KERNELS.{kernel}({launch2[0]}, {launch2[1]}, {p2})",
    ]


class EmitError(ValueError):
    """The plan asks for something the emitter cannot produce."""


def _literal(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        f = float(value)
        if math.isnan(f):
            return "SG_NAN"
        if math.isinf(f):
            return "SG_INF" if f > 0 else "(-SG_INF)"
        return f"{f!r}f"
    msg = f"cannot use {value!r} as a CUDA literal"
    raise EmitError(msg)


def _offset(
    shape: tuple[int, ...], strides: tuple[int, ...], space: tuple[int, ...], idx: str
) -> str:
    """Element offset of a (broadcast) operand at linear index ``idx`` of ``space``."""
    if tuple(shape) == tuple(space) and tuple(strides) == contiguous_strides(tuple(space)):
        return idx
    lead = len(space) - len(shape)
    terms: list[str] = []
    for d, (size, stride) in enumerate(zip(shape, strides, strict=True)):
        if size == 1 or stride == 0:
            continue
        inner = numel(space[lead + d + 1 :])
        coord = f"({idx} / {inner})" if inner > 1 else idx
        if lead + d > 0:
            coord = f"({coord} % {space[lead + d]})"
        terms.append(coord if stride == 1 else f"{coord} * {stride}")
    return " + ".join(terms) or "0"


@dataclass
class _Args:
    """Tensor parameters of one kernel, in the order host code passes them."""

    ir: ProgramIR
    refs: list[Ref] = field(default_factory=list)
    vector: bool = False
    vec_refs: list[Ref] = field(default_factory=list)

    def param(self, ref: Ref) -> str:
        if ref not in self.refs:
            self.refs.append(ref)
        return f"a{self.refs.index(ref)}"

    def load(
        self, ref: Ref, space: tuple[int, ...], idx: str, bshape: tuple[int, ...] | None = None
    ) -> str:
        name = self.param(ref)
        shape = tuple(bshape) if bshape else self.ir.shapes[ref]
        strides = contiguous_strides(shape) if bshape else self.ir.strides[ref]
        full = shape == tuple(space) and tuple(strides) == contiguous_strides(tuple(space))
        if self.vector and full and self.ir.dtypes.get(ref, "float32") == "float32":
            if ref not in self.vec_refs:
                self.vec_refs.append(ref)
            return f"(&{name}v.x)[l]"
        return f"{name}[{_offset(shape, strides, space, idx)}]"

    def signature(self, extra: list[str]) -> str:
        params = [
            f"const {_CTYPE.get(self.ir.dtypes.get(r, 'float32'), 'float')}* __restrict__ a{i}"
            for i, r in enumerate(self.refs)
        ]
        return ", ".join(params + extra)


# Convolutions run as im2col + cuBLAS SGEMM (one SGEMM per group when grouped); the im2col scratch
# of one chunk of images stays under _CONV_SCRATCH_BYTES (one image at a time if a single image
# needs more, up to _CONV_SCRATCH_MAX per image; beyond that, and for a per-group K = C/groups*KH*KW
# or, when grouped, a per-group output channel count below _CONV_GEMM_MIN_K, the direct kernel is
# kept: a GEMM with a tiny inner or outer dimension is all memory traffic).
_CONV_SCRATCH_BYTES = 256 * 2**20
_CONV_SCRATCH_MAX = 2 * 2**30
_CONV_GEMM_MIN_K = 16


@dataclass(frozen=True)
class _ConvGeom:
    """Geometry of a conv1d/2d/3d (conv1d as KH = H = OH = 1; conv1d/2d as KD = D = OD = 1)."""

    n: int
    cin: int
    h: int
    w: int
    cout: int
    kh: int
    kw: int
    oh: int
    ow: int
    sh: int
    sw: int
    ph: int
    pw: int
    dh: int
    dw: int
    d: int = 1
    kd: int = 1
    od: int = 1
    sd: int = 1
    pd: int = 0
    dd: int = 1

    @property
    def k(self) -> int:
        """Inner GEMM dimension C*KD*KH*KW (rows of the unfolded input)."""
        return self.cin * self.kd * self.kh * self.kw

    @property
    def p(self) -> int:
        """Output pixels per image OD*OH*OW (columns of the unfolded input)."""
        return self.od * self.oh * self.ow

    @property
    def pointwise(self) -> bool:
        """1x1, stride 1, no padding: the input image already is the [C, H*W] matrix."""
        kernel = (self.kd, self.kh, self.kw, self.sd, self.sh, self.sw)
        return kernel == (1,) * 6 and (self.pd, self.ph, self.pw) == (0, 0, 0)


def _conv_chunk(geo: _ConvGeom) -> tuple[int, int]:
    """Images per im2col chunk and the number of chunks (balanced: the last is not a sliver)."""
    return _conv_chunk_sizes(geo.n, geo.k * geo.p * 4)


def _conv_chunk_sizes(n: int, per_image: int) -> tuple[int, int]:
    most = max(1, _CONV_SCRATCH_BYTES // max(per_image, 1))
    chunks = math.ceil(n / most)
    return math.ceil(n / chunks), chunks


def _col2im_elems(geo: _ConvGeom) -> int:
    """Elements of one image's col2im buffer: OC*KD*KH*KW rows of D*H*W input pixels."""
    return geo.cout * geo.kd * geo.kh * geo.kw * geo.d * geo.h * geo.w


def _conv_transpose_gemm_ok(ir: ProgramIR, node: OpNode, g: Group, geo: _ConvGeom) -> bool:
    """Whether a groups=1 transposed convolution takes the SGEMM + col2im path."""
    x, w, b = node.args["input"], node.args["weight"], node.args.get("bias")
    refs = [x, w, *([b] if isinstance(b, Ref) else [])]
    return (
        not g.prologue
        and node.dtype == "float32"
        and all(ir.dtypes.get(r, "float32") == "float32" for r in refs)
        and ir.is_contiguous(x)
        and ir.is_contiguous(w)
        and geo.cin >= _CONV_GEMM_MIN_K
        and _col2im_elems(geo) * 4 <= _CONV_SCRATCH_MAX
    )


def _conv_library_ok(ir: ProgramIR, node: OpNode, g: Group, geo: _ConvGeom) -> bool:
    """Whether cuDNN can run the convolution as captured: FP32, contiguous, output shape as the
    stride/padding/dilation give it (a transposed one within its output padding)."""
    x, w, b = node.args["input"], node.args["weight"], node.args.get("bias")
    refs = [x, w, *([b] if isinstance(b, Ref) else [])]
    dims = [
        (geo.d, geo.od, geo.kd, geo.sd, geo.pd, geo.dd),
        (geo.h, geo.oh, geo.kh, geo.sh, geo.ph, geo.dh),
        (geo.w, geo.ow, geo.kw, geo.sw, geo.pw, geo.dw),
    ]
    if node.op.startswith("conv_transpose"):
        shapes_ok = all(
            0 <= o - ((i - 1) * s - 2 * p + dl * (k - 1) + 1) < max(s, dl)
            for i, o, k, s, p, dl in dims
        )
    else:
        shapes_ok = all(o == (i + 2 * p - dl * (k - 1) - 1) // s + 1 for i, o, k, s, p, dl in dims)
    return (
        not g.prologue
        and shapes_ok
        and node.dtype == "float32"
        and all(ir.dtypes.get(r, "float32") == "float32" for r in refs)
        and ir.is_contiguous(x)
        and ir.is_contiguous(w)
    )


def _conv_transpose_as_conv(geo: _ConvGeom) -> _ConvGeom | None:
    """The ordinary convolution a stride-1 transposed one equals, or None.

    With stride 1, ``out[o] = sum_k x[o + p - k*dil] w[k]`` is a convolution of x with the flipped
    filter and padding ``dil*(K-1) - p`` (same dilation); that padding must not be negative.
    Output padding shows up as an output size the convolution does not produce, which
    ``_conv_gemm_ok`` refuses.
    """
    if (geo.sd, geo.sh, geo.sw) != (1, 1, 1):
        return None
    pads = [
        dil * (k - 1) - p
        for dil, k, p in ((geo.dd, geo.kd, geo.pd), (geo.dh, geo.kh, geo.ph), (geo.dw, geo.kw, geo.pw))
    ]
    if min(pads) < 0:
        return None
    return replace(geo, pd=pads[0], ph=pads[1], pw=pads[2])


def _conv_gemm_ok(
    ir: ProgramIR, node: OpNode, g: Group, geo: _ConvGeom, groups: int = 1
) -> bool:
    """Whether a convolution takes the im2col + cuBLAS path (one SGEMM per group)."""
    x, w, b = node.args["input"], node.args["weight"], node.args.get("bias")
    refs = [x, w, *([b] if isinstance(b, Ref) else [])]
    return (
        not g.prologue
        and node.dtype == "float32"
        and all(ir.dtypes.get(r, "float32") == "float32" for r in refs)
        and ir.is_contiguous(x)
        and ir.is_contiguous(w)
        and geo.k // groups >= _CONV_GEMM_MIN_K
        and (groups == 1 or geo.cout // groups >= _CONV_GEMM_MIN_K)
        and (geo.pointwise or geo.k * geo.p * 4 <= _CONV_SCRATCH_MAX)
        and geo.od == (geo.d + 2 * geo.pd - geo.dd * (geo.kd - 1) - 1) // geo.sd + 1
        and geo.oh == (geo.h + 2 * geo.ph - geo.dh * (geo.kh - 1) - 1) // geo.sh + 1
        and geo.ow == (geo.w + 2 * geo.pw - geo.dw * (geo.kw - 1) - 1) // geo.sw + 1
    )


def _conv_transpose_via_im2col(
    ir: ProgramIR, node: OpNode, g: Group, geo: _ConvGeom, groups: int, col2im: bool
) -> _ConvGeom | None:
    """The convolution geometry to run a transposed convolution as, or None to keep it.

    Taken when the equivalent convolution can take the im2col path, unless the col2im path is
    open too and its column buffer is less than half the im2col one (many more input than output
    channels): both paths write their buffer once and read it once, so traffic follows its size.
    A 1x1 convolution needs no buffer at all.
    """
    fwd = _conv_transpose_as_conv(geo)
    if fwd is None or not _conv_gemm_ok(ir, node, g, fwd, groups):
        return None
    if col2im and not fwd.pointwise and fwd.k * fwd.p > 2 * _col2im_elems(geo):
        return None
    return fwd


class _Emitter:
    def __init__(self, ir: ProgramIR, tuning: Tuning) -> None:
        self.ir = ir
        self.tuning = tuning
        self.kernels: list[str] = []
        self.notes: list[str] = []

    def emit(self, part: Group, kernel: str, tun: KernelTuning) -> list[str]:
        """Kernels for one group (kept in ``self.kernels``); returns the host lines."""
        if part.kind == "pointwise":
            return self.pointwise(part.id, kernel, part.epilogue, self.ir.node(part.output), tun)
        if part.kind == "reduction":
            return self.reduction(part, kernel, tun)
        if part.kind in ("norm", "softmax"):
            return self.row_op(part, kernel, tun)
        if part.kind == "conv":
            return self.conv(part, kernel, tun)
        if part.kind == "gemm":
            return self.gemm(part, kernel, tun)
        if part.kind == "pool":
            return self.pool(part, kernel, tun)
        if part.kind == "scan":
            return self.scan(part, kernel, tun)
        msg = f"{part.id}: no emitter for {part.kind} groups"
        raise EmitError(msg)

    # ---- expressions -------------------------------------------------------------------------
    def exprs(
        self,
        members: list[str],
        space: tuple[int, ...],
        idx: str,
        env: dict[str, str],
        args: _Args,
    ) -> list[str]:
        lines: list[str] = []
        for name in members:
            node = self.ir.node(name)
            info = lookup(node.op)
            if node.op in INDEXED:
                ctype = _CTYPE.get(node.dtype, "float")
                value = self.indexed(node, space, idx, args, env)
                lines.append(f"const {ctype} v_{name} = ({ctype})({value});")
                env[name] = f"v_{name}"
                continue
            if info is None or info.expr is None:
                msg = f"node {name} ({node.op}) has no pointwise expression"
                raise EmitError(msg)
            values: dict[str, str] = {}
            bshapes = node.attrs.get("bshape", {})
            for pname, default in info.params:
                if "{" + pname + "}" not in info.expr:
                    continue  # e.g. the dtype of zeros_like: nothing to load or spell
                value = node.args.get(pname, default)
                if isinstance(value, Ref):
                    if value.kind == "node" and value.name in env:
                        values[pname] = env[value.name]
                    else:
                        values[pname] = args.load(value, space, idx, bshapes.get(pname))
                elif value is None or value is ...:
                    values[pname] = "0.f" if default in (None, ...) else _literal(default)
                elif isinstance(value, str):
                    values[pname] = "0"
                else:
                    values[pname] = _literal(value)
            ctype = _CTYPE.get(node.dtype, "float")
            lines.append(f"const {ctype} v_{name} = ({ctype})({info.expr.format(**values)});")
            env[name] = f"v_{name}"
        return lines

    def indexed(
        self, node: OpNode, space: tuple[int, ...], idx: str, args: _Args, env: dict[str, str]
    ) -> str:
        """Value of an op that reads its operands at other positions than the output's.

        ``cat`` picks the operand whose slice holds the output coordinate along ``dim``;
        ``flip`` mirrors the coordinate along its dims; ``gather`` replaces it by the index
        operand's value (clamped into range); ``triu``/``tril`` compare row and column. The
        node's shape is aligned right against ``space`` (it may be broadcast into it).
        Operands are always read from memory, never from fused values (see the scheduler).
        """
        ir = self.ir
        shape = tuple(node.shape)
        lead = len(space) - len(shape)

        def coord(d: int) -> str:
            """Coordinate of the output element along dim ``d`` of the node's shape."""
            inner = numel(space[lead + d + 1 :])
            c = f"({idx} / {inner})" if inner > 1 else f"({idx})"
            return f"(int)({c} % {space[lead + d]})"

        def base(ref: Ref, skip: set[int]) -> str:
            """Offset of ``ref`` at the output position, without the dims in ``skip``."""
            rshape = list(ir.shapes[ref])
            rlead = len(shape) - len(rshape)
            masked = tuple(1 if rlead + d in skip else n for d, n in enumerate(rshape))
            return _offset(masked, tuple(ir.strides[ref]), space, idx)

        def stride(ref: Ref, d: int) -> int:
            rshape = ir.shapes[ref]
            rd = d - (len(shape) - len(rshape))
            return 0 if rd < 0 or rshape[rd] == 1 else int(ir.strides[ref][rd])

        nd = max(len(shape), 1)
        if node.op == "cat":
            tensors = [t for t in node.args["tensors"] if isinstance(t, Ref)]
            dim = int(node.args.get("dim", 0)) % nd
            c = coord(dim)
            start = 0
            parts: list[tuple[int, str]] = []
            for ref in tensors:
                size = ir.shapes[ref][dim - (len(shape) - len(ir.shapes[ref]))]
                if size == 0:
                    continue
                load = f"{args.param(ref)}[{base(ref, {dim})} + ({c} - {start}) * {stride(ref, dim)}]"
                start += size
                parts.append((start, load))
            value = parts[-1][1]
            for end, load in reversed(parts[:-1]):
                value = f"({c} < {end} ? {load} : {value})"
            return value
        if node.op == "stack":
            tensors = [t for t in node.args["tensors"] if isinstance(t, Ref)]
            dim = int(node.args.get("dim", 0)) % nd
            c = coord(dim)
            loads = []
            for ref in tensors:
                rshape = list(ir.shapes[ref])
                rstrides = list(ir.strides[ref])
                rd = dim - (len(shape) - 1 - len(rshape))
                masked = tuple(rshape[:rd] + [1] + rshape[rd:])
                strides = tuple(rstrides[:rd] + [0] + rstrides[rd:])
                loads.append(f"{args.param(ref)}[{_offset(masked, strides, space, idx)}]")
            value = loads[-1]
            for k in range(len(loads) - 2, -1, -1):
                value = f"({c} == {k} ? {loads[k]} : {value})"
            return value
        if node.op == "flip":
            src: Ref = node.args["input"]
            raw = node.args.get("dims")
            dims = {int(d) % nd for d in (raw if isinstance(raw, list | tuple) else [raw])}
            terms = [base(src, dims)]
            for d in sorted(dims):
                terms.append(f"({shape[d] - 1} - {coord(d)}) * {stride(src, d)}")
            return f"{args.param(src)}[{' + '.join(terms)}]"
        if node.op == "gather":
            src = node.args["input"]
            index: Ref = node.args["index"]
            dim = int(node.args["dim"]) % nd
            size = ir.shapes[src][dim]
            at = env.get(index.name) if index.kind == "node" else None
            at = at or f"{args.param(index)}[{_offset(ir.shapes[index], ir.strides[index], space, idx)}]"  # noqa: E501
            k = f"(long long)({at})"
            k = f"({k} < 0 ? {k} + {size} : {k})"
            k = f"min(max({k}, 0LL), {size - 1}LL)"
            return f"{args.param(src)}[{base(src, {dim})} + {k} * {stride(src, dim)}]"
        if node.op == "index":
            src = node.args["input"]
            d, index = index_position(ir, node) or (0, node.args["input"])
            rshape, rstrides = ir.shapes[src], ir.strides[src]
            k = len(ir.shapes[index])
            at = " + ".join(
                [f"{coord(d + m)} * {s_}" for m, s_ in enumerate(ir.strides[index]) if ir.shapes[index][m] != 1]  # noqa: E501
            ) or "0"
            i = f"(long long)({args.param(index)}[{at}])"
            i = f"min(max(({i} < 0 ? {i} + {rshape[d]} : {i}), 0LL), {rshape[d] - 1}LL)"
            terms = [f"{i} * {rstrides[d]}"]
            for j in range(len(rshape)):
                if j != d and rshape[j] != 1:
                    terms.append(f"{coord(j if j < d else j + k - 1)} * {rstrides[j]}")
            return f"{args.param(src)}[{' + '.join(terms)}]"
        if node.op == "roll":
            src = node.args["input"]
            shifts, dims = node.args["shifts"], node.args["dims"]
            shifts = list(shifts) if isinstance(shifts, list | tuple) else [shifts]
            dims = [int(v) % nd for v in (dims if isinstance(dims, list | tuple) else [dims])]
            terms = [base(src, set(dims))]
            for shift, d in zip(shifts, dims, strict=True):
                n = shape[d]
                terms.append(f"(({coord(d)} + {(-int(shift)) % n}) % {n}) * {stride(src, d)}")
            return f"{args.param(src)}[{' + '.join(terms)}]"
        if node.op == "pad":
            src = node.args["input"]
            pads = [int(v) for v in node.args["pad"]]
            rshape = ir.shapes[src]
            fill = node.args.get("value")
            inside: list[str] = []
            terms: list[str] = []
            padded: set[int] = set()
            for j in range(len(pads) // 2):
                d = len(shape) - 1 - j
                before = pads[2 * j]
                if before == 0 and pads[2 * j + 1] == 0:
                    continue
                padded.add(d)
                c = f"({coord(d)} - {before})"
                inside.append(f"{c} >= 0 && {c} < {rshape[d]}")
                terms.append(f"{c} * {stride(src, d)}")
            load = f"{args.param(src)}[{' + '.join([base(src, padded), *terms])}]"
            if not inside:
                return load
            return f"(({' && '.join(inside)}) ? {load} : {_literal(float(fill or 0.0))})"
        if node.op in ("triu", "tril"):
            src = node.args["input"]
            diagonal = int(node.args.get("diagonal", 0) or 0)
            row, col = coord(len(shape) - 2), coord(len(shape) - 1)
            value = self.value_of(src, space, idx, env, args)
            keep = f"{col} - {row} >= {diagonal}" if node.op == "triu" else (
                f"{col} - {row} <= {diagonal}"
            )
            return f"(({keep}) ? {value} : 0.f)"
        msg = f"{node.name}: no indexed rule for {node.op}"
        raise EmitError(msg)

    def value_of(
        self, ref: Any, space: tuple[int, ...], idx: str, env: dict[str, str], args: _Args
    ) -> str:
        if isinstance(ref, Ref):
            if ref.kind == "node" and ref.name in env:
                return env[ref.name]
            return args.load(ref, space, idx)
        return _literal(ref)

    # ---- pointwise -----------------------------------------------------------------------------
    def pointwise(
        self,
        gid: str,
        kernel: str,
        members: list[str],
        out: OpNode,
        tun: KernelTuning,
        anchor_line: Callable[[_Args, str], tuple[str, str]] | None = None,
    ) -> list[str]:
        """Emit a pointwise kernel (and its float4 twin); return the host launch lines."""
        space = out.shape
        n = numel(space)
        index = "long long" if n >= 2**31 else "int"
        block = tun.block_size
        otype = _CTYPE.get(out.dtype, "float")

        def body(args: _Args, idx: str) -> tuple[list[str], str]:
            env: dict[str, str] = {}
            lines: list[str] = []
            if anchor_line is not None:
                name, line = anchor_line(args, idx)
                lines.append(line)
                env[name] = f"v_{name}"
            lines += self.exprs(members, space, idx, env, args)
            return lines, env[out.name]

        args = _Args(self.ir)
        lines, result = body(args, "i")
        unroll = f"#pragma unroll {tun.unroll}\n  " if tun.unroll > 1 else ""
        src = [
            f'extern "C" __global__ __launch_bounds__({block}) void {kernel}('
            f"{args.signature([f'{otype}* __restrict__ out'])}) {{",
            f"  {unroll}for ({index} i = ({index})blockIdx.x * {block} + threadIdx.x; i < {n}; "
            f"i += ({index})gridDim.x * {block}) {{",
            *(f"    {line}" for line in lines),
            f"    out[i] = {result};",
            "  }",
            "}",
        ]
        self.kernels.append("\n".join(src))
        grid = max(1, min(math.ceil(n / block), _MAX_GRID))
        py_args = ", ".join([*(_py(r) for r in args.refs), out.name])
        alloc = (
            f"{out.name} = torch.empty({list(space)}, device=_dev, "
            f"dtype={_TORCH_DTYPE.get(out.dtype, 'torch.float32')})"
        )
        scalar_launch = f"KERNELS.{kernel}({grid}, {block}, {py_args})"
        vector_ok = tun.vector_width == 4 and n % 4 == 0 and n >= 4 and out.dtype == "float32"
        if not vector_ok:
            return [alloc, scalar_launch]
        vargs = _Args(self.ir, vector=True)
        vlines, vresult = body(vargs, "i")
        if vargs.refs != args.refs:
            return [alloc, scalar_launch]
        n4 = n // 4
        vsrc = [
            f'extern "C" __global__ __launch_bounds__({block}) void {kernel}_v4('
            f"{vargs.signature([f'{otype}* __restrict__ out'])}) {{",
            f"  for ({index} j = ({index})blockIdx.x * {block} + threadIdx.x; j < {n4}; "
            f"j += ({index})gridDim.x * {block}) {{",
            *(
                f"    const float4 a{args.refs.index(r)}v = "
                f"reinterpret_cast<const float4*>(a{args.refs.index(r)})[j];"
                for r in vargs.vec_refs
            ),
            "    float r[4];",
            "#pragma unroll",
            "    for (int l = 0; l < 4; ++l) {",
            f"      const {index} i = j * 4 + l;",
            *(f"      {line}" for line in vlines),
            f"      r[l] = {vresult};",
            "    }",
            "    reinterpret_cast<float4*>(out)[j] = make_float4(r[0], r[1], r[2], r[3]);",
            "  }",
            "}",
        ]
        self.kernels.append("\n".join(vsrc))
        vgrid = max(1, min(math.ceil(n4 / block), _MAX_GRID))
        aligned = ", ".join([*(_py(r) for r in vargs.vec_refs), out.name])
        return [
            alloc,
            f"if _aligned({aligned}):",
            f"    KERNELS.{kernel}_v4({vgrid}, {block}, {py_args})",
            "else:",
            f"    {scalar_launch}",
        ]

    # ---- reductions ----------------------------------------------------------------------------
    def _add_kernel(
        self, src_lines: list[str], kernel: str, grid: int, block: int, args: _Args, out: OpNode
    ) -> list[str]:
        """Keep a kernel's source; return the host lines that allocate its output and launch it."""
        self.kernels.append("\n".join(src_lines))
        py_args = ", ".join([*(_py(r) for r in args.refs), out.name])
        return [
            f"{out.name} = torch.empty({list(out.shape)}, device=_dev, "
            f"dtype={_TORCH_DTYPE.get(out.dtype, 'torch.float32')})",
            f"KERNELS.{kernel}({grid}, {block}, {py_args})",
        ]

    def reduction(self, g: Group, kernel: str, tun: KernelTuning) -> list[str]:
        ir = self.ir
        node = ir.node(g.anchor or "")
        src: Ref = node.args["input"]
        in_shape = ir.shapes[src]
        dims = reduction_dims(ir, node)
        layout = row_layout(in_shape, dims)
        if layout is None:
            msg = f"{node.name}: cannot reduce over dims {dims} of {in_shape}"
            raise EmitError(msg)
        outer, length, inner = layout
        rows = outer * inner
        acc = _ACC[node.op]
        out = ir.node(g.output)
        anchor_shape = node.shape
        big = numel(in_shape) >= 2**31
        index = "long long" if big else "int"
        in_idx = (
            f"(r / {inner}) * {length * inner} + k * {inner} + r % {inner}"
            if inner > 1
            else (f"r * {length} + k" if rows > 1 else "k")
        )

        def load_value(args: _Args, env: dict[str, str]) -> tuple[list[str], str]:
            lines = self.exprs(g.prologue, in_shape, "i", env, args)
            value = self.value_of(src, in_shape, "i", env, args)
            if node.op == "norm":
                lines.append(f"const float sq = {value} * {value};")
                value = "sq"
            return lines, value

        def finish(args: _Args, a: str) -> tuple[list[str], str]:
            result = {
                "sum": f"{a}.s",
                "mean": f"{a}.s / {float(length)!r}f",
                "norm": f"sqrtf({a}.s)",
                "prod": f"{a}.p",
                "amax": f"{a}.m",
                "max": f"{a}.m",
                "amin": f"{a}.m",
                "min": f"{a}.m",
                "argmax": f"{a}.i",
                "argmin": f"{a}.i",
                "logsumexp": f"({a}.m == -SG_INF ? -SG_INF : {a}.m + logf({a}.s))",
            }.get(node.op)
            if node.op in ("var", "std"):
                corr = node.args.get("correction")
                if corr is None:
                    corr = 1 if node.args.get("unbiased", True) else 0
                var = f"{a}.m2 / fmaxf({a}.n - {float(corr)!r}f, 0.f)"
                result = f"sqrtf({var})" if node.op == "std" else var
            ctype = _CTYPE.get(node.dtype, "float")
            env = {node.name: f"v_{node.name}"}
            lines = [f"const {ctype} v_{node.name} = ({ctype})({result});"]
            lines += self.exprs(g.epilogue, anchor_shape, "r", env, args)
            return lines, env[out.name]

        split = tun.split_reduction
        if split is None:
            split = rows < 132 and length >= 65536 and node.op in _SPLITTABLE
        split = bool(split) and node.op in _SPLITTABLE
        if split:
            return self._split_reduction(
                g, kernel, tun, rows, length, in_idx, index, acc, load_value, finish
            )
        if tun.rows_per_block == 0:
            mode = "thread" if inner >= 32 else ("warp" if length <= 1024 else "block")
        else:
            mode = "block" if tun.rows_per_block == 1 else "warp"
        if mode == "thread":
            # outputs along contiguous memory: one thread per output, and when there are too
            # few outputs to fill the GPU, the reduced dimension split into chunks as well: in
            # one block (one launch) unless even that leaves most of a big input's GPU idle
            splits = _column_splits(rows, length)
            if splits > 1:
                slices, lanes = _column_tile(rows, length, 512)
                if (
                    2 * rows * slices < _GPU_THREADS
                    and numel(in_shape) >= 2**22
                    and tun.split_reduction is not False
                ):
                    return self._column_split_reduction(
                        g, kernel, tun, rows, length, splits, in_idx, index, acc, load_value, finish
                    )
                return self._column_tile_reduction(
                    g, kernel, rows, length, slices, lanes, in_idx, index, acc, load_value, finish
                )
        elif (
            tun.rows_per_block == 0 and inner == 1 and node.op in _ROW_REDUCE and length * rows > 0
        ):
            return self._row_reduction(g, kernel, tun, rows, length, index, acc, load_value, finish)
        block = tun.block_size
        if mode == "block":
            block = min(block, 1024)
        args = _Args(ir)
        env: dict[str, str] = {}
        pre, value = load_value(args, env)
        post, result = finish(args, "acc")
        otype = _CTYPE.get(out.dtype, "float")
        unroll = f"#pragma unroll {tun.unroll}" if tun.unroll > 1 else ""
        if mode == "thread":
            row_loop = (
                f"for ({index} r = ({index})blockIdx.x * {block} + threadIdx.x; r < {rows}; "
                f"r += ({index})gridDim.x * {block})"
            )
            k_loop = f"for ({index} k = 0; k < {length}; ++k)"
            reduce_line, writer = "", ""
            grid = max(1, min(math.ceil(rows / block), _MAX_GRID))
        elif mode == "warp":
            warps = block // 32
            row_loop = (
                f"for ({index} r = ({index})blockIdx.x * {warps} + (threadIdx.x >> 5); r < {rows}; "
                f"r += ({index})gridDim.x * {warps})"
            )
            k_loop = f"for ({index} k = threadIdx.x & 31; k < {length}; k += 32)"
            reduce_line, writer = "acc = sg_warp_reduce(acc);", "if ((threadIdx.x & 31) == 0)"
            grid = max(1, min(math.ceil(rows / warps), _MAX_GRID))
        else:
            row_loop = f"for ({index} r = blockIdx.x; r < {rows}; r += gridDim.x)"
            k_loop = f"for ({index} k = threadIdx.x; k < {length}; k += {block})"
            reduce_line, writer = "acc = sg_block_reduce(acc);", "if (threadIdx.x == 0)"
            grid = max(1, min(rows, 65535))
        src_lines = [
            f"// {node.op} over {length} element(s) of {rows} row(s), {mode} per row",
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
            f"    {writer} {{",
            *(f"      {line}" for line in post),
            f"      out[r] = {result};",
            "    }",
            "  }",
            "}",
        ]
        return self._add_kernel(src_lines, kernel, grid, block, args, out)

    def _column_split_reduction(
        self,
        g: Group,
        kernel: str,
        tun: KernelTuning,
        rows: int,
        length: int,
        splits: int,
        in_idx: str,
        index: str,
        acc: str,
        load_value: Callable[[_Args, dict[str, str]], tuple[list[str], str]],
        finish: Callable[[_Args, str], tuple[list[str], str]],
    ) -> list[str]:
        """Thread per (output, chunk) writing a partial, then thread per output combining them.

        Consecutive threads take consecutive outputs, which lie side by side in memory, so both
        stages read coalesced; no shared memory or shuffles are needed.
        """
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
        g: Group,
        kernel: str,
        rows: int,
        length: int,
        slices: int,
        lanes: int,
        in_idx: str,
        index: str,
        acc: str,
        load_value: Callable[[_Args, dict[str, str]], tuple[list[str], str]],
        finish: Callable[[_Args, str], tuple[list[str], str]],
    ) -> list[str]:
        """One launch for a reduction whose outputs lie side by side and are too few to fill the
        GPU with a thread each.

        A block takes ``lanes`` adjacent outputs; its ``slices`` threads per output each reduce
        one contiguous chunk of the reduced dim (loads coalesced across lanes, up to 8 in flight
        per thread), then the chunks are combined in shared memory by a tree that merges
        neighbouring chunks only, so the result is deterministic and keeps the first-index
        tie and NaN rules of the arg reductions.
        """
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
            f"        float x[{batch}];",
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
        g: Group,
        kernel: str,
        tun: KernelTuning,
        rows: int,
        length: int,
        index: str,
        acc: str,
        load_value: Callable[[_Args, dict[str, str]], tuple[list[str], str]],
        finish: Callable[[_Args, str], tuple[list[str], str]],
    ) -> list[str]:
        """Reduction over contiguous rows (the last dims): float4 loads when every full-size
        operand is 16-byte aligned and the length a multiple of 4 (``_v4`` kernel, scalar twin
        chosen at run time otherwise), each thread issuing a batch of loads before it reduces
        them, and a group of threads per row sized by ``_row_threads`` (several short rows a
        warp, a block for long ones)."""
        out = self.ir.node(g.output)
        alloc = (
            f"{out.name} = torch.empty({list(out.shape)}, device=_dev, "
            f"dtype={_TORCH_DTYPE.get(out.dtype, 'torch.float32')})"
        )
        scalar_src, sargs, _, slaunch = self._row_reduction_variant(
            g, kernel, rows, length, index, acc, load_value, finish, vec=False
        )
        self.kernels.append("\n".join(scalar_src))
        py_args = ", ".join([*(_py(r) for r in sargs.refs), out.name])
        launch = f"KERNELS.{kernel}({slaunch[0]}, {slaunch[1]}, {py_args})"
        if tun.vector_width != 4 or length % 4 or out.dtype != "float32":
            return [alloc, launch]
        vsrc, vargs, aligned, vlaunch = self._row_reduction_variant(
            g, f"{kernel}_v4", rows, length, index, acc, load_value, finish, vec=True
        )
        if not aligned or vargs.refs != sargs.refs:
            return [alloc, launch]
        self.kernels.append("\n".join(vsrc))
        return [
            alloc,
            f"if _aligned({', '.join(_py(r) for r in aligned)}):",
            f"    KERNELS.{kernel}_v4({vlaunch[0]}, {vlaunch[1]}, {py_args})",
            "else:",
            f"    {launch}",
        ]

    def _row_reduction_variant(
        self,
        g: Group,
        name: str,
        rows: int,
        length: int,
        index: str,
        acc: str,
        load_value: Callable[[_Args, dict[str, str]], tuple[list[str], str]],
        finish: Callable[[_Args, str], tuple[list[str], str]],
        *,
        vec: bool,
    ) -> tuple[list[str], _Args, list[Ref], tuple[int, int]]:
        """Source, arguments, float4 operands and ``(grid, block)`` of one ``_row_reduction``
        kernel. A thread's units (float4 chunks or elements) are ``t + c * threads``; the loads
        of a batch of units are all issued before the first is reduced."""
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
        args = _Args(ir, vector=vec)
        pre, value = load_value(args, {})
        post, result = finish(_Args(ir, refs=args.refs), "acc")
        otype = _CTYPE.get(out.dtype, "float")
        unit = f"const {index} u = t + ({index})(b * {batch} + j) * {threads};"
        inside = f"u < {nu}" if nu % (threads * batch) else "true"
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
                f"float x[{batch}];",
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
        if threads == 1:
            reduce_line = ""
        elif threads <= 32:
            reduce_line = f"acc = sg_group_reduce<{threads}>(acc);"
        else:
            reduce_line = "acc = sg_block_reduce(acc);"
        src_lines = [
            f"// {node.op} over the last {length} element(s) of {rows} row(s): {threads} "
            f"thread(s) a row, {batch} {'float4' if vec else 'scalar'} loads in flight a thread",
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
            f"    if (t == 0 && r < {rows}) {{",
            *(f"      {line}" for line in post),
            f"      out[r] = {result};",
            "    }",
            "  }",
            "}",
        ]
        grid = max(1, min(math.ceil(rows / per_block), _MAX_GRID if threads <= 32 else 65535))
        return src_lines, args, list(args.vec_refs), (grid, block)

    def _split_reduction(
        self,
        g: Group,
        kernel: str,
        tun: KernelTuning,
        rows: int,
        length: int,
        in_idx: str,
        index: str,
        acc: str,
        load_value: Callable[[_Args, dict[str, str]], tuple[list[str], str]],
        finish: Callable[[_Args, str], tuple[list[str], str]],
    ) -> list[str]:
        ir = self.ir
        out = ir.node(g.output)
        block = min(tun.block_size, 1024)
        splits = max(2, min(1024, math.ceil(264 / rows), math.ceil(length / (block * 8))))
        chunk = math.ceil(length / splits)
        args = _Args(ir)
        env: dict[str, str] = {}
        pre, value = load_value(args, env)
        stage1 = [
            f"// stage 1 of a split reduction: {rows} row(s) x {splits} chunk(s) of {chunk}",
            f'extern "C" __global__ __launch_bounds__({block}) void {kernel}_part('
            f"{args.signature(['unsigned char* __restrict__ ws'])}) {{",
            f"  const {index} r = blockIdx.x / {splits};",
            f"  const {index} s = blockIdx.x % {splits};",
            f"  const {index} end = min(({index})((s + 1) * {chunk}), ({index}){length});",
            f"  {acc} acc = {acc}::init();",
            f"  for ({index} k = s * {chunk} + threadIdx.x; k < end; k += {block}) {{",
            f"    const {index} i = {in_idx};",
            *(f"    {line}" for line in pre),
            f"    acc.update({value}, k);",
            "  }",
            "  acc = sg_block_reduce(acc);",
            f"  if (threadIdx.x == 0) reinterpret_cast<{acc}*>(ws)[blockIdx.x] = acc;",
            "}",
        ]
        args2 = _Args(ir)
        post, result = finish(args2, "acc")
        otype = _CTYPE.get(out.dtype, "float")
        block2 = 32 * min(8, max(1, math.ceil(splits / 32)))
        stage2 = [
            f'extern "C" __global__ __launch_bounds__({block2}) void {kernel}('
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
        ]
        self.kernels.append("\n".join(stage1))
        self.kernels.append("\n".join(stage2))
        return _two_stage_launch(
            g, kernel, out, args, args2, rows * splits, (rows * splits, block), (rows, block2)
        )

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
    ) -> list[str] | None:
        """Softmax/norm kernel that keeps each row in registers: one global read, one write.

        A warp (short rows) or a block of up to 1024 threads (long rows) owns a row; each thread
        holds its ``vpt`` values in ``float v[vpt]`` (element ``t + c * threads``, or float4 chunk
        ``t + c * threads`` when the row is contiguous and its length a multiple of 4: ``_v4``
        kernel, scalar twin chosen at run time when an operand is not 16-byte aligned).
        Statistics come from the registers: max, then sum of ``exp(v - max)`` for softmax; exact
        mean, then sum of squared deviations for the norms; sum of squares for RMS. Slots beyond
        the row end are never loaded, reduced or stored. Knobs: ``rows_per_block`` > 1 / == 1
        force a warp / a block per row, ``vector_width`` 1 the scalar kernel alone, ``block_size``
        the rows per block (warp) or the threads per row (block; raised until ``vpt`` <= 16, at
        most to 512). Returns ``None`` (two-pass kernel instead) when ``vpt`` would exceed the
        register budget: 32 values a thread up to 512 threads a block, 16 at 1024 (32 for float4
        softmax rows, which need few other registers: a 32000-class row read once).
        """
        ir = self.ir
        node = ir.node(g.anchor or "")
        op = node.op
        src: Ref = node.args["input"]
        shape = ir.shapes[src]
        out = ir.node(g.output)
        if numel(out.shape) != numel(shape) or length < 1:
            return None
        if tun.rows_per_block > 1:
            mode = "warp"
        elif tun.rows_per_block == 1:
            mode = "block"
        else:
            mode = "warp" if length <= 1024 else "block"
        vector = (
            tun.vector_width == 4
            and offset == f"r * {length} + k"
            and length % 4 == 0
            and out.dtype == "float32"
        )

        def vpt(threads: int) -> int:  # registers per thread for the row (float4: whole chunks)
            return 4 * math.ceil(length / 4 / threads) if vector else math.ceil(length / threads)

        # softmax rows in float4 reading one tensor need few registers besides v[] (49 at 1024
        # threads x 32 values; a second tensor read in the write pass spills)
        members = {node.name, *g.prologue, *g.epilogue}
        read = {
            ref
            for m in members
            for ref in ir.node(m).tensor_refs()
            if ref.kind != "node" or ref.name not in members
        }
        wide = (
            vector and op in ("softmax", "log_softmax") and tun.rows_per_block == 0 and len(read) == 1
        )

        def budget(block: int) -> int:  # ptxas gives 255 registers a thread up to 256 threads,
            if block <= 512 or wide:  # 128 at 512, 64 at 1024: keep v[] well below
                return 32
            return 16

        block = min(tun.block_size, 1024)
        if mode == "warp":
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
        reduce_fn = "sg_warp_reduce" if mode == "warp" else "sg_block_reduce"
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

        def uses(name: str, decl: str, lines: list[str]) -> list[str]:
            """``[decl]`` when a line reads the variable ``name``, else nothing."""
            return [decl] if any(re.search(rf"\b{name}\b", line) for line in lines) else []

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
            load_args = _Args(ir, refs=args.refs, vector=vec)
            write_args = _Args(ir, refs=args.refs, vector=vec)

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
                i_decl = uses("i", f"const {index} i = j * 4 + l;", [*pre, value])
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
                return [
                    f"{acc} {name} = {acc}::init();",
                    *slots(body),
                    f"{name} = {reduce_fn}({name});",
                ]

            if op in ("softmax", "log_softmax"):
                stats = reduce("mx", [f"mx.update({s}, 0);"])
                if op == "softmax":
                    stats += reduce("sm", [f"{s} = expf({s} - mx.m);", f"sm.s += {s};"])
                    stats.append("const float inv = 1.f / sm.s;")
                    y = f"{s} * inv"
                else:
                    stats += reduce("sm", [f"sm.s += expf({s} - mx.m);"])
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
                body += uses("i", f"const {index} i = j * 4 + l;", [*pre2, *post])
                body += [*pre2, *post, f"o[l] = {result};"]
                tail = ["reinterpret_cast<float4*>(out)[j] = make_float4(o[0], o[1], o[2], o[3]);"]
                write = slots(body, head, tail)
            else:
                write = slots(
                    [*pre2, *post, f"out[i] = {result};"],
                    [f"const {index} k = u;", f"const {index} i = {offset};"],
                )

            if mode == "warp":
                warps = block // 32
                tid = "threadIdx.x & 31"
                row_loop = (
                    f"for ({index} r = ({index})blockIdx.x * {warps} + (threadIdx.x >> 5); "
                    f"r < {rows}; r += ({index})gridDim.x * {warps})"
                )
            else:
                tid = "threadIdx.x"
                row_loop = f"for ({index} r = blockIdx.x; r < {rows}; r += gridDim.x)"
            name = f"{kernel}_v4" if vec else kernel
            src_lines = [
                f"// {op}: {rows} row(s) of {length}, {mode} per row; the row stays in registers "
                f"({nv * w} per thread{', float4' if vec else ''}): one read, one write",
                f'extern "C" __global__ __launch_bounds__({block}) void {name}('
                f"{args.signature([f'{otype}* __restrict__ out'])}) {{",
                f"  const int t = {tid};",
                f"  {row_loop} {{",
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

        if mode == "warp":
            grid = max(1, min(math.ceil(rows / (block // 32)), _MAX_GRID))
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
        return [
            alloc,
            f"if _aligned({', '.join([*(_py(r) for r in aligned), out.name])}):",
            f"    KERNELS.{kernel}_v4({grid}, {block}, {py_args})",
            "else:",
            f"    {launch}",
        ]

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
        if op in ("softmax", "log_softmax"):
            outer, length, inner = row_layout(shape, [int(node.args["dim"])]) or (1, 1, 1)
            rows = outer * inner
            offset = (
                f"(r / {inner}) * {length * inner} + k * {inner} + r % {inner}"
                if inner > 1
                else f"r * {length} + k"
            )
        elif op in ("layer_norm", "rms_norm"):
            normalized = node.args["normalized_shape"]
            count = len(normalized) if isinstance(normalized, list | tuple) else 1
            length = numel(shape[len(shape) - count :])
            rows = numel(shape) // length
            offset = f"r * {length} + k"
            if op == "rms_norm" and eps is None:
                eps = 1.1920928955078125e-07
        else:
            n, c = shape[0], shape[1]
            hw = numel(shape[2:])
            if op == "group_norm":
                groups = int(node.args["num_groups"])
                rows, length = n * groups, (c // groups) * hw
                offset = f"r * {length} + k"
                affine_idx = f"(r % {groups}) * {c // groups} + k / {hw}"
            elif op == "instance_norm":
                rows, length = n * c, hw
                offset = f"r * {length} + k"
                affine_idx = f"r % {c}"
            else:  # batch_norm with batch statistics
                rows, length = c, n * hw
                offset = f"(k / {hw}) * {c * hw} + r * {hw} + k % {hw}"
                affine_idx = "r"
        cached = self._row_cached(g, kernel, tun, rows, length, offset, affine_idx, eps, index)
        if cached is not None:
            return cached
        # rows too long for registers: statistics pass, then a write pass that reads the row again
        acc = {"softmax": "SgLse", "log_softmax": "SgLse", "rms_norm": "SgSum"}.get(op, "SgWelford")
        if tun.rows_per_block > 1:
            mode = "warp"
        elif tun.rows_per_block == 1:
            mode = "block"
        else:
            mode = "warp" if length <= 1024 else "block"
        block = min(tun.block_size, 1024)
        if tun.rows_per_block == 0 and mode == "block":
            # rows get here when too long for registers: few per SM, so use more threads per row
            # (H200, 256 rows of 32K: 0.08 ms at 256 threads, 0.03 ms at 1024)
            block = min(4 * tun.block_size, 1024)
        args = _Args(ir)
        env: dict[str, str] = {}
        pre = self.exprs(g.prologue, shape, "i", env, args)
        value = self.value_of(src, shape, "i", env, args)
        update = (
            f"acc.update({value} * {value}, k);"
            if op == "rms_norm"
            else (f"acc.update({value}, k);")
        )
        stats: list[str]
        if op == "softmax":
            stats = ["const float inv = 1.f / acc.s;"]
            y = f"expf({value} - acc.m) * inv"
        elif op == "log_softmax":
            stats = ["const float lse = acc.m + logf(acc.s);"]
            y = f"{value} - lse"
        elif op == "rms_norm":
            stats = [f"const float scale = rsqrtf(acc.s / {float(length)!r}f + {_literal(eps)});"]
            y = f"{value} * scale"
        else:
            stats = [
                "const float mean = acc.mean;",
                f"const float rstd = rsqrtf(acc.m2 / acc.n + {_literal(eps or 1e-5)});",
            ]
            y = f"({value} - mean) * rstd"
        weight, bias = node.args.get("weight"), node.args.get("bias")
        if isinstance(weight, Ref):
            y = f"({y}) * {args.param(weight)}[{affine_idx}]"
        if isinstance(bias, Ref):
            y = f"({y}) + {args.param(bias)}[{affine_idx}]"
        env2 = dict(env)  # the write pass re-evaluates the prologue under the same names
        pre2 = pre
        env2[node.name] = f"v_{node.name}"
        post = [f"const float v_{node.name} = {y};"]
        post += self.exprs(g.epilogue, shape, "i", env2, args)
        result = env2[out.name]
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
        src_lines = [
            f"// {op}: {rows} row(s) of {length}, {mode} per row; statistics pass, then write pass",
            f'extern "C" __global__ __launch_bounds__({block}) void {kernel}('
            f"{args.signature([f'{otype}* __restrict__ out'])}) {{",
            f"  {row_loop} {{",
            f"    {acc} acc = {acc}::init();",
            f"    {unroll}",
            f"    for ({index} k = {k_start}; k < {length}; k += {k_step}) {{",
            f"      const {index} i = {offset};",
            *(f"      {line}" for line in pre),
            f"      {update}",
            "    }",
            f"    {reduce_line}",
            *(f"    {line}" for line in stats),
            f"    {unroll}",
            f"    for ({index} k = {k_start}; k < {length}; k += {k_step}) {{",
            f"      const {index} i = {offset};",
            *(f"      {line}" for line in pre2),
            *(f"      {line}" for line in post),
            f"      out[i] = {result};",
            "    }",
            "  }",
            "}",
        ]
        return self._add_kernel(src_lines, kernel, grid, block, args, out)

    # ---- convolution ---------------------------------------------------------------------------
    def _conv_geometry(self, node: OpNode) -> tuple[_ConvGeom, int]:
        """Geometry and groups of a conv1d/2d/3d or transposed convolution (missing dims 1)."""
        ir = self.ir
        xs, ws = ir.shapes[node.args["input"]], ir.shapes[node.args["weight"]]
        os_ = node.shape
        nd = len(xs) - 2
        if nd not in (1, 2, 3) or len(os_) != len(xs) or len(ws) != len(xs):
            msg = f"{node.name}: {node.op} needs a batched (N, C, ...) input"
            raise EmitError(msg)
        groups = int(node.args.get("groups", 1) or 1)

        def per_dim(value: Any, fill: int) -> list[int]:
            if value is None:
                value = fill
            vals = [int(v) for v in value] if isinstance(value, list | tuple) else [int(value)]
            vals = vals * nd if len(vals) == 1 else vals
            return [fill] * (3 - nd) + vals

        def spatial(shape: tuple[int, ...]) -> list[int]:
            return [1] * (3 - nd) + [int(v) for v in shape[2:]]

        padding = node.args.get("padding", 0)
        pd, ph, pw = [0, 0, 0] if padding == "valid" else per_dim(padding, 0)
        d, h, wd = spatial(xs)
        kd, kh, kw = spatial(ws)
        od, oh, ow = spatial(os_)
        sd, sh, sw = per_dim(node.args.get("stride", 1), 1)
        dd, dh, dw = per_dim(node.args.get("dilation", 1), 1)
        cout = ws[1] * groups if node.op.startswith("conv_transpose") else ws[0]
        geo = _ConvGeom(
            xs[0], xs[1], h, wd, cout, kh, kw, oh, ow, sh, sw, ph, pw, dh, dw, d, kd, od, sd, pd, dd
        )
        return geo, groups

    def conv(self, g: Group, kernel: str, tun: KernelTuning) -> list[str]:
        ir = self.ir
        node = ir.node(g.anchor or "")
        x: Ref = node.args["input"]
        w: Ref = node.args["weight"]
        b = node.args.get("bias")
        xs, ws, os_ = ir.shapes[x], ir.shapes[w], node.shape
        geo, groups = self._conv_geometry(node)
        transposed = node.op.startswith("conv_transpose")
        three = len(xs) == 5
        if tun.conv_library and _conv_library_ok(ir, node, g, geo):
            return self._conv_library(g, kernel, tun, geo, groups)
        if transposed:
            col2im = groups == 1 and _conv_transpose_gemm_ok(ir, node, g, geo)
            fwd = _conv_transpose_via_im2col(ir, node, g, geo, groups, col2im)
            if fwd is not None:
                lines, weight = self._flipped_weight(g, kernel, tun, geo, groups)
                return lines + self._conv_gemm(g, kernel, tun, fwd, groups, weight)
            if col2im:
                return self._conv_transpose_gemm(g, kernel, tun, geo)
        elif _conv_gemm_ok(ir, node, g, geo, groups):
            return self._conv_gemm(g, kernel, tun, geo, groups)
        cin, cout = geo.cin, geo.cout
        cig = cin // groups
        cog = cout // groups
        total = numel(os_)
        index = "long long" if total >= 2**31 or numel(xs) >= 2**31 else "int"
        out = ir.node(g.output)
        args = _Args(ir)
        xa, wa = args.param(x), args.param(w)
        init = f"{args.param(b)}[co]" if isinstance(b, Ref) else "0.f"
        env = {node.name: f"v_{node.name}"}
        post = self.exprs(g.epilogue, os_, "idx", env, args)
        block = tun.block_size
        unroll = f"#pragma unroll {tun.unroll}" if tun.unroll > 1 else "#pragma unroll"
        plane = geo.od * geo.oh * geo.ow
        in_plane = geo.d * geo.h * geo.w
        taps = geo.kd * geo.kh * geo.kw
        coords = [
            f"    const int ox = idx % {geo.ow};",
            f"    const int oy = (idx / {geo.ow}) % {geo.oh};",
            *([f"    const int oz = (idx / {geo.ow * geo.oh}) % {geo.od};"] if three else []),
            f"    const int co = (idx / {plane}) % {cout};",
            f"    const {index} nb = idx / {plane * cout};",
            f"    const int g = co / {cog};",
        ]

        def tap(axis: str, k: str, o: str, stride: int, pad: int, dil: int, size: int) -> list[str]:
            """Lines that set input coordinate ``i<axis>`` for tap ``k`` (or skip the tap)."""
            if not transposed:
                return [
                    f"const int i{axis} = {o} * {stride} - {pad} + {k} * {dil};",
                    f"if (i{axis} < 0 || i{axis} >= {size}) continue;",
                ]
            t = f"t{axis}"
            skip = f"{t} < 0" + (f" || {t} % {stride} != 0" if stride > 1 else "")
            return [
                f"const int {t} = {o} + {pad} - {k} * {dil};",
                f"if ({skip}) continue;",
                f"const int i{axis} = {t}" + (f" / {stride};" if stride > 1 else ";"),
                f"if (i{axis} >= {size}) continue;",
            ]

        loops: list[list[str]] = []
        if three:
            loops.append(
                [f"for (int kz = 0; kz < {geo.kd}; ++kz) {{"]
                + tap("z", "kz", "oz", geo.sd, geo.pd, geo.dd, geo.d)
            )
        loops.append(
            [f"for (int ky = 0; ky < {geo.kh}; ++ky) {{"]
            + tap("y", "ky", "oy", geo.sh, geo.ph, geo.dh, geo.h)
        )
        loops.append(
            [f"for (int kx = 0; kx < {geo.kw}; ++kx) {{"]
            + tap("x", "kx", "ox", geo.sw, geo.pw, geo.dw, geo.w)
        )
        x_off = "(iz * {h} + iy) * {w} + ix" if three else "iy * {w} + ix"
        w_off = "(kz * {kh} + ky) * {kw} + kx" if three else "ky * {kw} + kx"
        x_off = x_off.format(h=geo.h, w=geo.w)
        w_off = w_off.format(kh=geo.kh, kw=geo.kw)
        w_base = (
            f"((g * {cig} + ci) * {cog} + co % {cog}) * {taps}"
            if transposed
            else f"(co * {cig} + ci) * {taps}"
        )
        nest: list[str] = []
        for depth, loop in enumerate(loops):
            pad_ = "  " * depth
            nest += [f"      {pad_}{unroll}", f"      {pad_}{loop[0]}"]
            nest += [f"        {pad_}{line}" for line in loop[1:]]
        inner = "  " * len(loops)
        nest.append(f"      {inner}acc = fmaf(__ldg(xp + {x_off}), __ldg(wp + {w_off}), acc);")
        nest += [f"      {'  ' * d}}}" for d in range(len(loops) - 1, -1, -1)]
        what = "transposed " if transposed else ""
        src_lines = [
            f"// direct {what}{node.op}: {list(xs)} * {list(ws)} -> {list(os_)}, "
            "one output per thread",
            f'extern "C" __global__ __launch_bounds__({block}) void {kernel}('
            f"{args.signature(['float* __restrict__ out'])}) {{",
            f"  for ({index} idx = ({index})blockIdx.x * {block} + threadIdx.x; idx < {total}; "
            f"idx += ({index})gridDim.x * {block}) {{",
            *coords,
            f"    float acc = {init};",
            f"    for (int ci = 0; ci < {cig}; ++ci) {{",
            f"      const float* xp = {xa} + (nb * {cin} + g * {cig} + ci) * {in_plane};",
            f"      const float* wp = {wa} + {w_base};",
            *nest,
            "    }",
            f"    const float v_{node.name} = acc;",
            *(f"    {line}" for line in post),
            f"    out[idx] = {env[out.name]};",
            "  }",
            "}",
        ]
        grid = max(1, min(math.ceil(total / block), _MAX_GRID * 4))
        return self._add_kernel(src_lines, kernel, grid, block, args, out)

    def _conv_transpose_gemm(
        self, g: Group, kernel: str, tun: KernelTuning, geo: _ConvGeom
    ) -> list[str]:
        """Transposed convolution (groups = 1) as cuBLAS SGEMM + a col2im gather.

        Row-major, image n: ``col[n] (OC*K x P) = W^T (OC*K x C) @ x[n] (C x P)`` with K =
        KD*KH*KW, P = D*H*W (input pixels) and W's [C, OC, KD, KH, KW] layout read as a C x OC*K
        matrix. Column-major, cuBLAS computes ``col[n]^T (P x OC*K) = x[n]^T (P x C) @ W (C x
        OC*K)``: A = x[n] as is (lda = P), B = W transposed (ldb = OC*K), C = col[n] (ldc = P),
        batched over the images of a chunk. Each output element then gathers its taps: for tap
        (kz, ky, kx) the input pixel is ``(o + pad - k*dil) / stride`` per dim when that divides
        exactly and lies inside the input; the bias and the fused epilogue follow in the same
        kernel when the whole batch fits one chunk, else in a second pointwise kernel.
        """
        ir = self.ir
        node = ir.node(g.anchor or "")
        x: Ref = node.args["input"]
        w: Ref = node.args["weight"]
        b = node.args.get("bias")
        out = ir.node(g.output)
        space = tuple(node.shape)
        three = len(space) == 5
        taps = geo.kd * geo.kh * geo.kw
        pin = geo.d * geo.h * geo.w
        rows = geo.cout * taps
        chunk, nchunks = _conv_chunk_sizes(geo.n, rows * pin * 4)
        col = f"_col_{g.id}"
        plane = geo.od * geo.oh * geo.ow
        col_big = chunk * rows * pin >= 2**31
        cidx = "long long" if col_big else "int"

        def gather(col_name: str, bias: str | None, idx: str, name: str) -> list[str]:
            lines = [
                f"float v_{name};",
                "{",
                f"  const int ox = (int)({idx} % {geo.ow});",
                f"  const int oy = (int)(({idx} / {geo.ow}) % {geo.oh});",
                *([f"  const int oz = (int)(({idx} / {geo.ow * geo.oh}) % {geo.od});"] if three else []),  # noqa: E501
                f"  const int co = (int)(({idx} / {plane}) % {geo.cout});",
                f"  const {cidx} nb = ({cidx})({idx} / {plane * geo.cout});",
                f"  const float* cp = {col_name} + (nb * {rows} + ({cidx})co * {taps}) * {pin};",
                f"  float acc = {bias or '0.f'};",
            ]
            dims = [("y", "ky", "oy", geo.sh, geo.ph, geo.dh, geo.h, geo.kh)]
            dims.append(("x", "kx", "ox", geo.sw, geo.pw, geo.dw, geo.w, geo.kw))
            if three:
                dims.insert(0, ("z", "kz", "oz", geo.sd, geo.pd, geo.dd, geo.d, geo.kd))
            depth = 1
            for axis, k, o, stride, pad, dil, size, kk in dims:
                ind = "  " * depth
                t = f"t{axis}"
                skip = f"{t} < 0" + (f" || {t} % {stride} != 0" if stride > 1 else "")
                lines += [
                    f"{ind}for (int {k} = 0; {k} < {kk}; ++{k}) {{",
                    f"{ind}  const int {t} = {o} + {pad} - {k} * {dil};",
                    f"{ind}  if ({skip}) continue;",
                    f"{ind}  const int i{axis} = {t}" + (f" / {stride};" if stride > 1 else ";"),
                    f"{ind}  if (i{axis} >= {size}) continue;",
                ]
                depth += 1
            tap_ = "(kz * {kh} + ky) * {kw} + kx" if three else "ky * {kw} + kx"
            pix = "(iz * {h} + iy) * {w} + ix" if three else "iy * {w} + ix"
            tap_ = tap_.format(kh=geo.kh, kw=geo.kw)
            pix = pix.format(h=geo.h, w=geo.w)
            ind = "  " * depth
            lines.append(f"{ind}acc += __ldg(cp + ({cidx})({tap_}) * {pin} + {pix});")
            lines += ["  " * d + "}" for d in range(depth - 1, 0, -1)]
            lines += [f"  v_{name} = acc;", "}"]
            return lines

        lines = [
            f"# transposed conv by parts: SGEMM of {chunk} image(s) at a time into {col} "
            f"[{chunk}, {rows}, {pin}] ({chunk * rows * pin * 4 / 2**20:.1f} MiB), then a gather",
            f"{col} = torch.empty([{chunk}, {rows}, {pin}], device=_dev, dtype=torch.float32)",
        ]
        gemm = (
            f"_sgemm(0, 1, {pin}, {rows}, {geo.cin}, {{x}}, {pin}, {geo.cin * pin}, {_py(w)}, "
            f"{rows}, 0, {col}, {pin}, {rows * pin}, {{cnt}})"
        )
        if nchunks == 1:
            lines.append(gemm.format(x=_py(x), cnt=geo.n))

            def anchor_line(args: _Args, idx: str) -> tuple[str, str]:
                col_arg = args.param(Ref("node", col))
                bias = f"{args.param(b)}[({idx} / {plane}) % {geo.cout}]" if isinstance(b, Ref) else None
                return node.name, "\n    ".join(gather(col_arg, bias, idx, node.name))

            return lines + self.pointwise(g.id, kernel, g.epilogue, out, tun, anchor_line)
        product = f"{node.name}_ct" if g.epilogue else node.name
        args = _Args(ir)
        bias = f"{args.param(b)}[co]" if isinstance(b, Ref) else None
        block = tun.block_size
        n_out = chunk * geo.cout * plane
        oidx = "long long" if n_out >= 2**31 else "int"
        body = gather("col", bias, "i", node.name)
        src = [
            f"// col2im gather for {node.op}: cnt image(s) of {list(space[1:])} from col "
            f"[cnt, {rows}, {pin}]",
            f'extern "C" __global__ __launch_bounds__({block}) void {kernel}_col2im('
            f"{args.signature(['const float* __restrict__ col', 'float* __restrict__ out', 'int cnt'])}) {{",  # noqa: E501
            f"  const {oidx} total = ({oidx})cnt * {geo.cout * plane};",
            f"  for ({oidx} i = ({oidx})blockIdx.x * {block} + threadIdx.x; i < total; "
            f"i += ({oidx})gridDim.x * {block}) {{",
            *(f"    {line}" for line in body),
            f"    out[i] = v_{node.name};",
            "  }",
            "}",
        ]
        self.kernels.append("\n".join(src))
        grid = max(1, min(math.ceil(n_out / block), _MAX_GRID))
        refs = "".join(f"{_py(r)}, " for r in args.refs)
        lines += [
            f"{product} = torch.empty({list(space)}, device=_dev, dtype=torch.float32)",
            f"for _n0 in range(0, {geo.n}, {chunk}):",
            f"    _nc = min({chunk}, {geo.n} - _n0)",
            "    " + gemm.format(x=f"{_py(x)}[_n0:_n0 + _nc]", cnt="_nc"),
            f"    KERNELS.{kernel}_col2im({grid}, {block}, {refs}{col}, {product}[_n0:_n0 + _nc], _nc)",  # noqa: E501
        ]
        if not g.epilogue:
            return lines

        def load_product(args: _Args, idx: str) -> tuple[str, str]:
            raw = args.load(Ref("node", product), space, idx, space)
            return node.name, f"const float v_{node.name} = {raw};"

        return lines + self.pointwise(g.id, kernel, g.epilogue, out, tun, load_product)

    def _flipped_weight(
        self, g: Group, kernel: str, tun: KernelTuning, geo: _ConvGeom, groups: int
    ) -> tuple[list[str], str]:
        """A transposed convolution's weight as the equivalent convolution's, at every call.

        ``[C, OC/groups, KD, KH, KW]`` becomes ``[OC, C/groups, KD, KH, KW]`` with every spatial
        dim reversed (reversing all of them reverses the flat tap index). The weight is a
        parameter that may change between calls, so a small kernel rebuilds it in each forward.
        Returns the host lines and the name of the new weight.
        """
        node = self.ir.node(g.anchor or "")
        w: Ref = node.args["weight"]
        taps = geo.kd * geo.kh * geo.kw
        cig, cog = geo.cin // groups, geo.cout // groups
        total = geo.cout * cig * taps
        block = tun.block_size
        name = f"_wf_{g.id}"
        src = [
            f"// {node.op} weight [{geo.cin}, {cog}, {taps} taps] -> conv weight "
            f"[{geo.cout}, {cig}, {taps} taps], taps reversed ({groups} group(s))",
            f'extern "C" __global__ __launch_bounds__({block}) void {kernel}_wflip('
            "const float* __restrict__ w, float* __restrict__ out) {",
            f"  for (int i = blockIdx.x * {block} + threadIdx.x; i < {total}; "
            f"i += gridDim.x * {block}) {{",
            f"    const int t = i % {taps};",
            f"    const int ci = (i / {taps}) % {cig};",
            f"    const int co = i / {taps * cig};",
            f"    const int grp = co / {cog};",
            f"    out[i] = __ldg(w + ((grp * {cig} + ci) * {cog} + co % {cog}) * {taps} "
            f"+ {taps - 1} - t);",
            "  }",
            "}",
        ]
        self.kernels.append("\n".join(src))
        shape = [geo.cout, cig, *self.ir.shapes[w][2:]]
        grid = max(1, min(math.ceil(total / block), _MAX_GRID))
        return [
            f"# {node.op} with stride 1 as a convolution with the flipped, transposed weight",
            f"{name} = torch.empty({shape}, device=_dev, dtype=torch.float32)",
            f"KERNELS.{kernel}_wflip({grid}, {block}, {_py(w)}, {name})",
        ], name

    def _conv_gemm(
        self,
        g: Group,
        kernel: str,
        tun: KernelTuning,
        geo: _ConvGeom,
        groups: int = 1,
        weight: str | None = None,
    ) -> list[str]:
        """Convolution as implicit GEMM by parts: im2col of a chunk of images, then cuBLAS.

        Row-major, image n: ``out[n] (OC x P) = W (OC x K) @ col[n] (K x P)`` with P = OH*OW,
        K = C*KH*KW and ``col[n][(c*KH + ky)*KW + kx, oy*OW + ox] = x[n, c, oy*sh - ph + ky*dh,
        ox*sw - pw + kx*dw]`` (0 in the padding), the row order of W's [OC, C, KH, KW] layout.
        cuBLAS is column-major, and a row-major R x C matrix with leading dimension C is the
        column-major C x R matrix (its transpose) with the same leading dimension. So cuBLAS
        computes ``out[n]^T (P x OC) = col[n]^T (P x K) @ W^T (K x OC)`` with no transposes
        (ta = tb = N): m = P, n = OC, k = K; A = col[n] read as column-major P x K, lda = P, batch
        stride K*P; B = W read as column-major K x OC, ldb = K, batch stride 0 (one filter bank);
        C = out[n] read as column-major P x OC, ldc = P, batch stride OC*P, which is NCHW. A 1x1
        conv with stride 1 and no padding has col[n] == x[n] ([C, H*W]): x itself is A.
        Grouped: the rows of col[n] (and x[n]) go by input channel, so group j's are the slice
        ``[j*K/G, (j+1)*K/G)`` and its filters the rows ``[j*OC/G, (j+1)*OC/G)`` of W, whose
        [OC, C/G, ...] layout is already those K/G x OC/G matrices: one strided-batched SGEMM per
        group on views (m = P, n = OC/G, k = K/G; the same leading dims and batch strides).
        ``weight`` names the host tensor to use as W when it is not the node's own weight.
        The bias and the fused epilogue run afterwards in one pointwise kernel (as for ``gemm``).
        """
        ir = self.ir
        node = ir.node(g.anchor or "")
        x: Ref = node.args["input"]
        w: Ref = node.args["weight"]
        b = node.args.get("bias")
        space = tuple(node.shape)
        k, p, cout = geo.k, geo.p, geo.cout
        needs_epilogue = isinstance(b, Ref) or bool(g.epilogue)
        product = f"{node.name}_mm" if needs_epilogue else node.name
        xa, wa = _py(x), weight or _py(w)
        kg, cog = k // groups, cout // groups

        def sgemm(a: str, c: str, cnt: object) -> list[str]:
            """Host lines for the SGEMM(s) of ``cnt`` images: A = ``a``, C = ``c``."""
            if groups == 1:
                return [
                    f"_sgemm(0, 0, {p}, {cout}, {k}, {a}, {p}, {k * p}, {wa}, {k}, 0, "
                    f"{c}, {p}, {cout * p}, {cnt})"
                ]
            return [
                f"for _g in range({groups}):",
                f"    _sgemm(0, 0, {p}, {cog}, {kg}, {a}[:, _g * {kg}:(_g + 1) * {kg}], {p}, "
                f"{k * p}, {wa}[_g * {cog}:(_g + 1) * {cog}], {kg}, 0, "
                f"{c}[:, _g * {cog}:(_g + 1) * {cog}], {p}, {cout * p}, {cnt})",
            ]

        lines = [f"{product} = torch.empty({list(space)}, device=_dev, dtype=torch.float32)"]
        if geo.pointwise:
            lines += [
                f"# 1x1 {node.op}, stride 1, no padding: x[n] is already the [{k}, {p}] matrix",
                *sgemm(xa, product, geo.n),
            ]
        else:
            chunk, nchunks = _conv_chunk(geo)
            block = tun.block_size
            elems = chunk * k * p
            big = max(elems, chunk * geo.cin * geo.d * geo.h * geo.w) >= 2**31
            index = "long long" if big else "int"
            unroll = f"#pragma unroll {tun.unroll}\n  " if tun.unroll > 1 else ""
            im2col = f"{kernel}_im2col"
            three = len(space) == 5
            im2col_2d = [
                f"    const int ox = q % {geo.ow}, oy = q / {geo.ow};",
                f"    const int kx = r % {geo.kw}, ky = (r / {geo.kw}) % {geo.kh};",
                f"    const int c = r / {geo.kh * geo.kw};",
                f"    const int iy = oy * {geo.sh} - {geo.ph} + ky * {geo.dh};",
                f"    const int ix = ox * {geo.sw} - {geo.pw} + kx * {geo.dw};",
                "    float v = 0.f;",
                f"    if (iy >= 0 && iy < {geo.h} && ix >= 0 && ix < {geo.w}) "
                f"v = __ldg(x + (nb * {geo.cin} + c) * {geo.h * geo.w} + iy * {geo.w} + ix);",
            ]
            im2col_3d = [  # row ((c*KD + kz)*KH + ky)*KW + kx, column (oz*OH + oy)*OW + ox
                f"    const int ox = q % {geo.ow}, oy = (q / {geo.ow}) % {geo.oh};",
                f"    const int oz = q / {geo.ow * geo.oh};",
                f"    const int kx = r % {geo.kw}, ky = (r / {geo.kw}) % {geo.kh};",
                f"    const int kz = (r / {geo.kw * geo.kh}) % {geo.kd};",
                f"    const int c = r / {geo.kd * geo.kh * geo.kw};",
                f"    const int iz = oz * {geo.sd} - {geo.pd} + kz * {geo.dd};",
                f"    const int iy = oy * {geo.sh} - {geo.ph} + ky * {geo.dh};",
                f"    const int ix = ox * {geo.sw} - {geo.pw} + kx * {geo.dw};",
                "    float v = 0.f;",
                f"    if (iz >= 0 && iz < {geo.d} && iy >= 0 && iy < {geo.h} && ix >= 0 && "
                f"ix < {geo.w}) v = __ldg(x + (nb * {geo.cin} + c) * {geo.d * geo.h * geo.w} + "
                f"(iz * {geo.h} + iy) * {geo.w} + ix);",
            ]
            src = [
                f"// im2col for {node.op}: cnt image(s) of x [{geo.cin}, {geo.h}, {geo.w}] -> "
                f"col [cnt, {k}, {p}]; row (c*{geo.kh} + ky)*{geo.kw} + kx, column oy*{geo.ow} + ox",
                f'extern "C" __global__ __launch_bounds__({block}) void {im2col}('
                "const float* __restrict__ x, float* __restrict__ col, int cnt) {",
                f"  const {index} total = ({index})cnt * {k * p};",
                f"  {unroll}for ({index} i = ({index})blockIdx.x * {block} + threadIdx.x; "
                f"i < total; i += ({index})gridDim.x * {block}) {{",
                f"    const int q = (int)(i % {p});",
                f"    const int r = (int)((i / {p}) % {k});",
                f"    const {index} nb = i / {k * p};",
                *(im2col_3d if three else im2col_2d),
                "    col[i] = v;",
                "  }",
                "}",
            ]
            self.kernels.append("\n".join(src))
            grid = max(1, min(math.ceil(elems / block), _MAX_GRID))
            col = f"_col_{g.id}"
            mib = elems * 4 / 2**20
            per_chunk = "one batched SGEMM" if groups == 1 else f"{groups} batched SGEMMs (groups)"
            lines += [
                f"# implicit GEMM by parts: im2col of {chunk} image(s) at a time into "
                f"{col} [{chunk}, {k}, {p}] ({mib:.1f} MiB), then {per_chunk} per chunk",
                f"{col} = torch.empty([{chunk}, {k}, {p}], device=_dev, dtype=torch.float32)",
            ]
            if nchunks == 1:
                lines += [
                    f"KERNELS.{im2col}({grid}, {block}, {xa}, {col}, {geo.n})",
                    *sgemm(col, product, geo.n),
                ]
            else:
                lines += [
                    f"for _n0 in range(0, {geo.n}, {chunk}):",
                    f"    _nc = min({chunk}, {geo.n} - _n0)",
                    f"    KERNELS.{im2col}({grid}, {block}, {xa}[_n0:_n0 + _nc], {col}, _nc)",
                    *(f"    {line}" for line in sgemm(col, f"{product}[_n0:_n0 + _nc]", "_nc")),
                ]
        if not needs_epilogue:
            return lines
        return lines + self._conv_epilogue(g, kernel, tun, product, cout)

    def _conv_epilogue(
        self, g: Group, kernel: str, tun: KernelTuning, product: str, cout: int
    ) -> list[str]:
        """One pointwise kernel over a library-computed convolution: its bias plus the epilogue."""
        node = self.ir.node(g.anchor or "")
        b = node.args.get("bias")
        space = tuple(node.shape)

        def anchor_line(args: _Args, idx: str) -> tuple[str, str]:
            raw = args.load(Ref("node", product), space, idx, space)
            if isinstance(b, Ref):
                addend = args.load(b, space, idx, (cout,) + (1,) * (len(space) - 2))
                return node.name, f"const float v_{node.name} = {raw} + {addend};"
            return node.name, f"const float v_{node.name} = {raw};"

        out = self.ir.node(g.output)
        return self.pointwise(g.id, kernel, g.epilogue, out, tun, anchor_line)

    def _conv_library(
        self, g: Group, kernel: str, tun: KernelTuning, geo: _ConvGeom, groups: int
    ) -> list[str]:
        """Convolution (forward or transposed, any groups) through cuDNN, then one pointwise
        kernel for the bias and the fused epilogue (none when there is neither)."""
        node = self.ir.node(g.anchor or "")
        b = node.args.get("bias")
        space = tuple(node.shape)
        nd = len(space) - 2
        needs_epilogue = isinstance(b, Ref) or bool(g.epilogue)
        product = f"{node.name}_conv" if needs_epilogue else node.name
        stride = [geo.sd, geo.sh, geo.sw][3 - nd :]
        padding = [geo.pd, geo.ph, geo.pw][3 - nd :]
        dilation = [geo.dd, geo.dh, geo.dw][3 - nd :]
        call = "conv_transpose" if node.op.startswith("conv_transpose") else "conv"
        lines = [
            f"# {node.op} through cuDNN (FP32 math, its heuristic's algorithm)"
            + ("; bias and epilogue follow in one kernel" if needs_epilogue else ""),
            f"{product} = torch.empty({list(space)}, device=_dev, dtype=torch.float32)",
            f"KERNELS.{call}({_py(node.args['input'])}, {_py(node.args['weight'])}, {product}, "
            f"{stride}, {padding}, {dilation}, {groups})",
        ]
        if not needs_epilogue:
            return lines
        return lines + self._conv_epilogue(g, kernel, tun, product, geo.cout)

    # ---- pooling -------------------------------------------------------------------------------
    def pool(self, g: Group, kernel: str, tun: KernelTuning) -> list[str]:
        """Max/average pooling (fixed or adaptive windows) over the last 1-3 dims.

        A grid-stride pointwise kernel over the output whose anchor value loops over the window:
        one thread per output, the pointwise prologue evaluated on each window element and the
        epilogue on the pooled value. Window bounds follow PyTorch: padding is skipped (max) or
        counted as ``count_include_pad`` says (average, divisor from the window clipped to the
        padded input); adaptive windows are ``[floor(o*I/O), ceil((o+1)*I/O))``.
        """
        ir = self.ir
        node = ir.node(g.anchor or "")
        op = node.op
        nd = pool_dims(node)
        x: Ref = node.args["input"]
        xs, os_ = ir.shapes[x], tuple(node.shape)
        isp, osp = xs[-nd:], os_[-nd:]
        in_sp, out_sp = numel(isp), numel(osp)
        it = "long long" if numel(xs) >= 2**31 else "int"
        adaptive = op.startswith("adaptive")
        is_max = "max" in op

        def per_dim(key: str, default: Any) -> list[int]:
            value = node.args.get(key)
            if value is None or (isinstance(value, list | tuple) and not value):
                value = default
            values = [int(v) for v in value] if isinstance(value, list | tuple) else [int(value)]
            return values * nd if len(values) == 1 else values

        if not adaptive:
            ks = per_dim("kernel_size", 1)
            st = per_dim("stride", ks)
            pad = per_dim("padding", 0)
            dil = per_dim("dilation", 1) if is_max else [1] * nd

        def anchor_line(args: _Args, idx: str) -> tuple[str, str]:
            loads = _Args(ir, refs=args.refs)  # window elements: scalar loads, never float4
            env: dict[str, str] = {}
            pre = self.exprs(g.prologue, xs, "ii", env, loads)
            value = self.value_of(x, xs, "ii", env, loads)
            lines = [f"const {it} base = ({it})({idx} / {out_sp}) * {in_sp};"]
            for j in range(nd):
                inner = numel(osp[j + 1 :])
                coord = f"({idx} / {inner})" if inner > 1 else idx
                lines.append(f"const int o{j} = (int)({coord} % {osp[j]});")
            loops: list[str] = []
            count: list[str] = []
            size: list[str] = []
            for j in range(nd):
                i_j, o_j = isp[j], osp[j]
                if adaptive:
                    lines += [
                        f"const int s{j} = (int)(((long long)o{j} * {i_j}) / {o_j});",
                        f"const int e{j} = (int)(((long long)(o{j} + 1) * {i_j} + {o_j - 1}) / {o_j});",  # noqa: E501
                    ]
                    loops.append(f"for (int c{j} = s{j}; c{j} < e{j}; ++c{j}) {{")
                    count.append(f"(e{j} - s{j})")
                elif is_max:
                    loops += [
                        f"for (int w{j} = 0; w{j} < {ks[j]}; ++w{j}) {{",
                        f"const int c{j} = o{j} * {st[j]} - {pad[j]} + w{j} * {dil[j]};",
                        f"if (c{j} < 0 || c{j} >= {i_j}) continue;",
                    ]
                else:
                    lines += [
                        f"int s{j} = o{j} * {st[j]} - {pad[j]};",
                        f"int e{j} = min(s{j} + {ks[j]}, {i_j + pad[j]});",
                        f"const int n{j} = e{j} - s{j};",
                        f"s{j} = max(s{j}, 0);",
                        f"e{j} = min(e{j}, {i_j});",
                    ]
                    loops.append(f"for (int c{j} = s{j}; c{j} < e{j}; ++c{j}) {{")
                    count.append(f"(e{j} - s{j})")
                    size.append(f"n{j}")
            offset = "c0"
            for j in range(1, nd):
                offset = f"({offset}) * {isp[j]} + c{j}"
            update = "acc = (v > acc || v != v) ? v : acc;" if is_max else "acc += v;"
            body = [f"const {it} ii = base + {offset};", *pre, f"const float v = {value};", update]
            if is_max:
                result = "acc"
            else:
                divisor = node.args.get("divisor_override")
                if divisor:
                    div = _literal(float(divisor))
                elif adaptive or not node.args.get("count_include_pad", True):
                    div = f"(float)({' * '.join(count)})"
                else:
                    div = f"(float)({' * '.join(size)})"
                result = f"acc / {div}"
            init = "-SG_INF" if is_max else "0.f"
            nested: list[str] = []
            depth = 0
            for line in loops:
                nested.append("  " * depth + line)
                depth += line.endswith("{")
            nested += ["  " * depth + line for line in body]
            code = [
                f"float v_{node.name};",
                "{",
                *(f"  {line}" for line in lines),
                f"  float acc = {init};",
                *(f"  {line}" for line in nested),
                "  " + "}" * depth,
                f"  v_{node.name} = {result};",
                "}",
            ]
            return node.name, "\n    ".join(code)

        out = ir.node(g.output)
        return self.pointwise(g.id, kernel, g.epilogue, out, tun, anchor_line)

    # ---- scans ---------------------------------------------------------------------------------
    def scan(self, g: Group, kernel: str, tun: KernelTuning) -> list[str]:
        """Inclusive cumulative sum/product along one dim, prologue on load, epilogue on store.

        Lines whose elements are ``inner`` apart with ``inner >= 32`` (a non-last dim): one thread
        per line, neighbouring threads on neighbouring lines (coalesced). Contiguous lines: one
        warp per line, 32 elements at a time with a ``__shfl_up_sync`` scan and a carry
        (``tun.rows_per_block == 1`` forces the thread-per-line kernel).
        """
        ir = self.ir
        node = ir.node(g.anchor or "")
        x: Ref = node.args["input"]
        xs = ir.shapes[x]
        dim = int(node.args["dim"]) % max(len(xs), 1)
        outer, length, inner = row_layout(xs, [dim]) if xs else (1, 1, 1)
        lines_n = outer * inner
        out = ir.node(g.output)
        big = numel(xs) >= 2**31
        index = "long long" if big else "int"
        is_sum = node.op == "cumsum"
        ident, combine = ("0.f", "+") if is_sum else ("1.f", "*")
        args = _Args(ir)
        env: dict[str, str] = {}
        pre = self.exprs(g.prologue, xs, "i", env, args)
        value = self.value_of(x, xs, "i", env, args)
        env2 = dict(env)
        env2[node.name] = f"v_{node.name}"
        post = self.exprs(g.epilogue, xs, "i", env2, args)
        result = env2[out.name]
        otype = _CTYPE.get(out.dtype, "float")
        block = min(tun.block_size, 1024)
        warp = inner == 1 and tun.rows_per_block != 1 and length > 1
        base = f"(r / {inner}) * {length * inner} + r % {inner}" if inner > 1 else f"r * {length}"
        if not warp:
            src = [
                f"// {node.op} along {length} element(s) of {lines_n} line(s), thread per line",
                f'extern "C" __global__ __launch_bounds__({block}) void {kernel}('
                f"{args.signature([f'{otype}* __restrict__ out'])}) {{",
                f"  for ({index} r = ({index})blockIdx.x * {block} + threadIdx.x; r < {lines_n}; "
                f"r += ({index})gridDim.x * {block}) {{",
                f"    const {index} b = {base};",
                f"    float run = {ident};",
                f"    for ({index} k = 0; k < {length}; ++k) {{",
                f"      const {index} i = b + k * {inner};",
                *(f"      {line}" for line in pre),
                f"      run = run {combine} {value};",
                f"      const float v_{node.name} = run;",
                *(f"      {line}" for line in post),
                f"      out[i] = {result};",
                "    }",
                "  }",
                "}",
            ]
            grid = max(1, min(math.ceil(lines_n / block), _MAX_GRID))
            return self._add_kernel(src, kernel, grid, block, args, out)
        warps = block // 32
        src = [
            f"// {node.op} along {length} element(s) of {lines_n} line(s), warp per line: "
            "32 elements a step, shuffle scan plus carry",
            f'extern "C" __global__ __launch_bounds__({block}) void {kernel}('
            f"{args.signature([f'{otype}* __restrict__ out'])}) {{",
            "  const int lane = threadIdx.x & 31;",
            f"  for ({index} r = ({index})blockIdx.x * {warps} + (threadIdx.x >> 5); r < {lines_n}; "
            f"r += ({index})gridDim.x * {warps}) {{",
            f"    const {index} b = {base};",
            f"    float carry = {ident};",
            f"    for ({index} k0 = 0; k0 < {length}; k0 += 32) {{",
            f"      const {index} k = k0 + lane;",
            f"      const {index} i = b + (k < {length} ? k : 0);",
            f"      float run = {ident};",
            f"      if (k < {length}) {{",
            *(f"        {line}" for line in pre),
            f"        run = {value};",
            "      }",
            "#pragma unroll",
            "      for (int o = 1; o < 32; o <<= 1) {",
            "        const float y = __shfl_up_sync(SG_FULL, run, o);",
            f"        if (lane >= o) run = y {combine} run;",
            "      }",
            f"      run = carry {combine} run;",
            "      carry = __shfl_sync(SG_FULL, run, 31);",
            f"      if (k < {length}) {{",
            f"        const float v_{node.name} = run;",
            *(f"        {line}" for line in post),
            f"        out[i] = {result};",
            "      }",
            "    }",
            "  }",
            "}",
        ]
        grid = max(1, min(math.ceil(lines_n / warps), _MAX_GRID))
        return self._add_kernel(src, kernel, grid, block, args, out)

    # ---- GEMM ----------------------------------------------------------------------------------
    def gemm(self, g: Group, kernel: str, tun: KernelTuning) -> list[str]:
        ir = self.ir
        node = ir.node(g.anchor or "")
        out_shape = node.shape
        if node.op == "linear":
            a_ref: Ref = node.args["input"]
            w_ref: Ref = node.args["weight"]
            k = ir.shapes[w_ref][1]
            n = ir.shapes[w_ref][0]
            m = numel(ir.shapes[a_ref]) // k
            a_layout, b_layout = (False, k, 0), (True, k, 0)
            b_ref, batch = w_ref, 1
            m_rows = m
        else:
            a_ref = node.args["mat1" if node.op == "addmm" else "input"]
            b_ref = node.args["mat2" if node.op == "addmm" else "other"]
            a_layout = matrix_layout(ir.shapes[a_ref], ir.strides[a_ref])
            b_layout = matrix_layout(ir.shapes[b_ref], ir.strides[b_ref])
            if a_layout is None or b_layout is None:
                msg = f"{node.name}: operand layout not expressible as strided-batched GEMM"
                raise EmitError(msg)
            m_rows, k = ir.shapes[a_ref][-2], ir.shapes[a_ref][-1]
            n = ir.shapes[b_ref][-1]
            batch = numel(out_shape[:-2])
        ta, lda, sa = a_layout
        tb, ldb, sb = b_layout
        bias = node.args.get("bias") if node.op == "linear" else None
        needs_epilogue = node.op == "addmm" or isinstance(bias, Ref) or bool(g.epilogue)
        product = f"{node.name}_mm" if needs_epilogue else node.name
        lines = [
            f"{product} = torch.empty({list(out_shape)}, device=_dev, dtype=torch.float32)",
            f"_sgemm({int(tb)}, {int(ta)}, {n}, {m_rows}, {k}, {_py(b_ref)}, {ldb}, {sb}, "
            f"{_py(a_ref)}, {lda}, {sa}, {product}, {n}, {m_rows * n}, {batch})",
        ]
        if not needs_epilogue:
            return lines
        space = tuple(out_shape)

        def anchor_line(args: _Args, idx: str) -> tuple[str, str]:
            raw = args.load(Ref("node", product), space, idx, space)
            if isinstance(bias, Ref):
                addend = args.load(bias, space, idx)
                return node.name, f"const float v_{node.name} = {raw} + {addend};"
            if node.op == "addmm":
                alpha = _literal(node.args.get("alpha", 1))
                beta = _literal(node.args.get("beta", 1))
                addend = self.value_of(node.args["input"], space, idx, {}, args)
                return (
                    node.name,
                    f"const float v_{node.name} = {alpha} * {raw} + {beta} * {addend};",
                )
            return node.name, f"const float v_{node.name} = {raw};"

        out = ir.node(g.output)
        return lines + self.pointwise(g.id, kernel, g.epilogue, out, tun, anchor_line)


def _py(ref: Ref) -> str:
    if ref.kind == "param":
        return f"_get(self, {ref.name!r})"
    return ref.name


_HOST_HEADER = '''"""ModelNew generated by stitch_graph.codegen for {task!r} ({n_items} item(s)).

Kernels come from the global KERNELS (NVRTC-built from kernel_source); GEMMs call cuBLAS in true
FP32 on PyTorch's current stream. {declared}
"""

import torch
import torch.nn as nn


def _get(module, name):
    """A parameter or buffer by dotted name."""
    for part in name.split("."):
        module = getattr(module, part)
    return module


def _aligned(*tensors):
    """Whether every tensor starts on a 16-byte boundary (float4 loads and stores)."""
    return all(t.data_ptr() % 16 == 0 for t in tensors)


def _sgemm(ta, tb, m, n, k, a, lda, sa, b, ldb, sb, c, ldc, sc, batch):
    """Column-major C = op(A) op(B) through cuBLAS on PyTorch's stream, true FP32 (no TF32)."""
    KERNELS.sgemm(ta, tb, m, n, k, a, lda, sa, b, ldb, sb, c, ldc, sc, batch)


_PARAMS = {params}


class ModelNew(nn.Module):
    """Same parameters and buffers (dotted names, shapes) as the reference Model."""

    def __init__(self, *init_args):
        super().__init__()
        for name, shape, dtype, buffer, persistent, value in _PARAMS:
            owner = self
            *path, leaf = name.split(".")
            for part in path:
                if not hasattr(owner, part):
                    owner.add_module(part, nn.Module())
                owner = getattr(owner, part)
            if value is not None:
                tensor = torch.tensor(value, dtype=dtype).reshape(shape)
            else:
                tensor = torch.zeros(shape, dtype=dtype)
            if buffer:
                owner.register_buffer(leaf, tensor, persistent=persistent)
            else:
                owner.register_parameter(leaf, nn.Parameter(tensor))

    def forward(self, {inputs}):
'''


def _render(value: Any) -> str:
    if isinstance(value, Ref):
        return _py(value)
    if isinstance(value, list):
        return "[" + ", ".join(_render(v) for v in value) + "]"
    if isinstance(value, tuple):
        inner = ", ".join(_render(v) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k!r}: {_render(v)}" for k, v in value.items()) + "}"
    if isinstance(value, float) and (math.isinf(value) or math.isnan(value)):
        return f"float({str(value)!r})"
    if isinstance(value, torch.device):
        return "_dev"  # traced on meta tensors: the device is the inputs' at run time
    if isinstance(value, slice):
        return f"slice({_render(value.start)}, {_render(value.stop)}, {_render(value.step)})"
    return repr(value)


def _torch_line(node: OpNode) -> str:
    args = [_render(a) for a in node.call_args]
    kwargs = [f"{k}={_render(v)}" for k, v in node.call_kwargs.items()]
    if node.call.startswith("."):
        target = f"{args[0]}{node.call}"
        rest = ", ".join(args[1:] + kwargs)
    else:
        target = node.call
        rest = ", ".join(args + kwargs)
    imports = "import operator; " if node.call.startswith("operator.") else ""
    return f"{imports}{node.name} = {target}({rest})"


def _split_unfused(ir: ProgramIR, g: Group) -> list[Group]:
    """Un-fuse an anchored group: prologue and epilogue become pointwise kernels of their own."""
    if g.anchor is None:
        return [g]
    parts: list[Group] = []
    if g.prologue:
        parts.append(Group(f"{g.id}p", "pointwise", None, [], list(g.prologue), g.prologue[-1]))
    parts.append(Group(g.id, g.kind, g.anchor, [], [], g.anchor))
    if g.epilogue:
        parts.append(Group(f"{g.id}e", "pointwise", None, [], list(g.epilogue), g.output))
    return parts


def emit_candidate(
    ir: ProgramIR,
    plan: Plan,
    *,
    through: str | None = None,
    tuning: Tuning | None = None,
) -> Candidate:
    """Emit the candidate program for the plan's items.

    Args:
        ir: The captured program.
        plan: The plan; its items' ``ops`` say which nodes each kernel covers.
        through: Generate the items whose status is ``done`` plus this item; ``None``: all items.
        tuning: Kernel knobs (``None``: defaults).

    Returns:
        A candidate whose ``host_source`` defines ``ModelNew``; ops of items not generated run in
        PyTorch and are listed in ``declared_torch_ops``.

    Raises:
        EmitError: ``through`` names no item, or an item cannot be emitted.
    """
    tuning = tuning or Tuning()
    status = {item.id: item.status for item in plan.items}
    kernels_by_id = {item.id: item.kernel for item in plan.items}
    if through is not None and through not in status:
        msg = f"through={through!r} names no plan item (items: {', '.join(status)})"
        raise EmitError(msg)
    groups = groups_from_plan(ir, plan)
    wanted = {g.id for g in groups if through is None or status[g.id] == "done" or g.id == through}
    emitter = _Emitter(ir, tuning)
    launch_at: dict[str, list[str]] = {}
    covered: set[str] = set()
    for group in groups:
        if group.id not in wanted:
            continue
        tun = tuning.for_item(group.id)
        parts = _split_unfused(ir, group) if not tun.fuse else [group]
        n_kernels = len(emitter.kernels)
        emitted: list[tuple[Group, list[str]]] = []
        try:
            for part in parts:
                base = kernels_by_id[group.id]
                kernel = base + part.id.removeprefix(group.id) if part.id != group.id else base
                kernel = "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in kernel)
                emitted.append((part, [f"# {part.id}: {kernel}", *emitter.emit(part, kernel, tun)]))
        except Exception as error:  # noqa: BLE001 - the item's ops stay in PyTorch, declared
            del emitter.kernels[n_kernels:]
            emitter.notes.append(f"{group.id} left to PyTorch: {type(error).__name__}: {error}")
            continue
        for part, lines in emitted:
            launch_at.setdefault(part.output, []).extend(lines)
            covered.update(part.members)
    body: list[str] = []
    declared: list[str] = []
    tensor_inputs = [name for name, shape in ir.inputs if shape is not None]
    body.append(f"_dev = {tensor_inputs[0]}.device" if tensor_inputs else "_dev = 'cuda'")
    for node in ir.nodes:
        if node.name in launch_at:
            body.extend(launch_at[node.name])
            continue
        if node.name in covered:
            continue
        kind, _ = node_kind(ir, node)
        body.append(_torch_line(node))
        if kind != "view":
            # the reference op and the PyTorch call that computes it (matmul may run as bmm)
            for name in (node.op, node.call.rsplit(".", 1)[-1]):
                if name not in declared:
                    declared.append(name)
    outs = [ref.name if ref.kind != "param" else _py(ref) for ref in ir.outputs]
    if ir.output_is_tuple:
        body.append(f"return ({', '.join(outs)}{',' if len(outs) == 1 else ''})")
    else:
        body.append(f"return {outs[0]}")
    params = (
        "["
        + ", ".join(
            f"({p.name!r}, {list(p.shape)!r}, torch.{p.dtype}, {p.buffer!r}, {p.persistent!r}, "
            f"{p.value!r})"
            for p in ir.params
        )
        + "]"
    )
    inputs = ", ".join(name for name, _ in ir.inputs) or "*args"
    note = (
        f"Declared PyTorch ops (not yet generated): {', '.join(declared)}."
        if declared
        else "No PyTorch compute ops in forward."
    )
    header = _HOST_HEADER.format(
        task=ir.task.name, n_items=len(plan.items), declared=note, params=params, inputs=inputs
    )
    graphed = (tuning.cuda_graph if tuning.cuda_graph is not None else plan.host.cuda_graph) and (
        not declared
    )
    if graphed:  # launch-bound: the runtime captures _launch in a CUDA graph and replays it
        header += (
            f"        return KERNELS.graphed(self, self._launch, {inputs})\n\n"
            f"    def _launch(self, {inputs}):\n"
        )
    host = header + "".join(f"        {line}\n" for line in body)
    kernel_source = PRELUDE + "\n\n" + "\n\n".join(emitter.kernels) + "\n"
    failed = {note.split(" ", 1)[0] for note in emitter.notes}
    generated = sorted(wanted - failed)
    return Candidate(
        kernel_source=kernel_source,
        host_source=host,
        form="nvrtc",
        link_libraries=["cublas"]
        if any(g.kind == "gemm" for g in groups if g.id in wanted)
        or any(
            line.lstrip().startswith("_sgemm(") for lines in launch_at.values() for line in lines
        )
        else [],
        declared_torch_ops=declared,
        item_id=through,
        author="rules",
        notes=(
            f"generated items: {', '.join(generated) or 'none'}; "
            f"tuning: {tuning.model_dump_json(exclude={'history'})}"
            + "".join(f"; {note}" for note in emitter.notes)
        ),
    )
