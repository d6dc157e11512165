"""Emission: CUDA kernels and ``ModelNew`` host code for the items of a plan.

This module only emits; every decision about what to fuse was taken by the scheduler (and is in
the plan's items), every knob comes from ``Tuning``. Kernel styles: grid-stride pointwise kernels
with ``__restrict__`` pointers and a float4 twin chosen at run time when all full-size operands are
16-byte aligned; reductions with one thread, warp or block per row (or two stages when rows are few
and long); softmax/log-softmax with an online max+sum pass then a write pass; layer/group/batch/
instance/RMS norms with Welford statistics and fused affine; direct convolution with the bias and
epilogue fused; GEMMs through cuBLAS (true FP32) followed by one epilogue kernel. Items not yet
generated run in PyTorch inside ``forward`` and are declared in ``Candidate.declared_torch_ops``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

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
from stitch_graph.codegen.ops import lookup
from stitch_graph.codegen.schedule import groups_from_plan, node_kind, reduction_dims
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


class _Emitter:
    def __init__(self, ir: ProgramIR, tuning: Tuning) -> None:
        self.ir = ir
        self.tuning = tuning
        self.kernels: list[str] = []
        self.notes: list[str] = []

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
            if info is None or info.expr is None:
                msg = f"node {name} ({node.op}) has no pointwise expression"
                raise EmitError(msg)
            values: dict[str, str] = {}
            bshapes = node.attrs.get("bshape", {})
            for pname, default in info.params:
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
        ws = f"_ws_{g.id}"
        p1 = ", ".join([*(_py(r) for r in args.refs), ws])
        p2 = ", ".join([*(_py(r) for r in args2.refs), ws, out.name])
        return [
            f"{ws} = torch.empty({rows * splits * 16}, device=_dev, dtype=torch.uint8)",
            f"KERNELS.{kernel}_part({rows * splits}, {block}, {p1})",
            f"{out.name} = torch.empty({list(out.shape)}, device=_dev, "
            f"dtype={_TORCH_DTYPE.get(out.dtype, 'torch.float32')})",
            f"KERNELS.{kernel}({rows}, {block2}, {p2})",
        ]

    # ---- softmax and normalisations ------------------------------------------------------------
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
        acc = {"softmax": "SgLse", "log_softmax": "SgLse", "rms_norm": "SgSum"}.get(op, "SgWelford")
        if tun.rows_per_block > 1:
            mode = "warp"
        elif tun.rows_per_block == 1:
            mode = "block"
        else:
            mode = "warp" if length <= 1024 else "block"
        block = min(tun.block_size, 1024)
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
    def conv(self, g: Group, kernel: str, tun: KernelTuning) -> list[str]:
        ir = self.ir
        node = ir.node(g.anchor or "")
        x: Ref = node.args["input"]
        w: Ref = node.args["weight"]
        b = node.args.get("bias")
        xs, ws, os_ = ir.shapes[x], ir.shapes[w], node.shape
        one_d = node.op == "conv1d"

        def pair(value: Any) -> tuple[int, int]:
            if isinstance(value, list | tuple):
                return (1, int(value[0])) if one_d else (int(value[0]), int(value[-1]))
            return (1, int(value)) if one_d else (int(value), int(value))

        def pad_pair(value: Any) -> tuple[int, int]:
            if value == "valid":
                return 0, 0
            first, second = pair(value)
            return (0, second) if one_d else (first, second)

        cin = xs[1]
        h, wd = (1, xs[2]) if one_d else (xs[2], xs[3])
        cout = ws[0]
        cig = ws[1]
        kh, kw = (1, ws[2]) if one_d else (ws[2], ws[3])
        oh, ow = (1, os_[2]) if one_d else (os_[2], os_[3])
        sh, sw = pair(node.args.get("stride", 1))
        ph, pw = pad_pair(node.args.get("padding", 0))
        dh, dw = pair(node.args.get("dilation", 1))
        groups = int(node.args.get("groups", 1))
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
        src_lines = [
            f"// direct {node.op}: {list(xs)} * {list(ws)} -> {list(os_)}, one output per thread",
            f'extern "C" __global__ __launch_bounds__({block}) void {kernel}('
            f"{args.signature(['float* __restrict__ out'])}) {{",
            f"  for ({index} idx = ({index})blockIdx.x * {block} + threadIdx.x; idx < {total}; "
            f"idx += ({index})gridDim.x * {block}) {{",
            f"    const int ox = idx % {ow};",
            f"    const int oy = (idx / {ow}) % {oh};",
            f"    const int co = (idx / {ow * oh}) % {cout};",
            f"    const {index} nb = idx / {ow * oh * cout};",
            f"    const int g = co / {cog};",
            f"    float acc = {init};",
            f"    for (int ci = 0; ci < {cig}; ++ci) {{",
            f"      const float* xp = {xa} + (nb * {cin} + g * {cig} + ci) * {h * wd};",
            f"      const float* wp = {wa} + (co * {cig} + ci) * {kh * kw};",
            f"      {unroll}",
            f"      for (int ky = 0; ky < {kh}; ++ky) {{",
            f"        const int iy = oy * {sh} - {ph} + ky * {dh};",
            f"        if (iy < 0 || iy >= {h}) continue;",
            f"        {unroll}",
            f"        for (int kx = 0; kx < {kw}; ++kx) {{",
            f"          const int ix = ox * {sw} - {pw} + kx * {dw};",
            f"          if (ix < 0 || ix >= {wd}) continue;",
            f"          acc = fmaf(__ldg(xp + iy * {wd} + ix), __ldg(wp + ky * {kw} + kx), acc);",
            "        }",
            "      }",
            "    }",
            f"    const float v_{node.name} = acc;",
            *(f"    {line}" for line in post),
            f"    out[idx] = {env[out.name]};",
            "  }",
            "}",
        ]
        grid = max(1, min(math.ceil(total / block), _MAX_GRID * 4))
        return self._add_kernel(src_lines, kernel, grid, block, args, out)

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

import numpy as np
import torch
import torch.nn as nn

_ONE = np.ones(1, dtype=np.float32)
_ZERO = np.zeros(1, dtype=np.float32)
_STREAMS = {{}}


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
    import cupy
    from cupy.cuda import cublas

    handle = cupy.cuda.device.get_cublas_handle()
    ptr = torch.cuda.current_stream().cuda_stream
    stream = _STREAMS.get(ptr)
    if stream is None:
        stream = _STREAMS[ptr] = cupy.cuda.ExternalStream(ptr)
    with stream:
        cublas.setStream(handle, ptr)
        cublas.setPointerMode(handle, cublas.CUBLAS_POINTER_MODE_HOST)
        cublas.setMathMode(handle, cublas.CUBLAS_DEFAULT_MATH)
        one, zero = _ONE.ctypes.data, _ZERO.ctypes.data
        if batch == 1:
            cublas.sgemm(handle, ta, tb, m, n, k, one, a.data_ptr(), lda, b.data_ptr(), ldb,
                         zero, c.data_ptr(), ldc)
        else:
            cublas.sgemmStridedBatched(handle, ta, tb, m, n, k, one, a.data_ptr(), lda, sa,
                                       b.data_ptr(), ldb, sb, zero, c.data_ptr(), ldc, sc, batch)


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
        for part in parts:
            base = kernels_by_id[group.id]
            kernel = base + part.id.removeprefix(group.id) if part.id != group.id else base
            kernel = "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in kernel)
            if part.kind == "pointwise":
                out = ir.node(part.output)
                lines = emitter.pointwise(part.id, kernel, part.epilogue, out, tun)
            elif part.kind == "reduction":
                lines = emitter.reduction(part, kernel, tun)
            elif part.kind in ("norm", "softmax"):
                lines = emitter.row_op(part, kernel, tun)
            elif part.kind == "conv":
                lines = emitter.conv(part, kernel, tun)
            else:
                lines = emitter.gemm(part, kernel, tun)
            launch_at.setdefault(part.output, []).extend([f"# {part.id}: {kernel}", *lines])
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
    host = header + "".join(f"        {line}\n" for line in body)
    kernel_source = PRELUDE + "\n\n" + "\n\n".join(emitter.kernels) + "\n"
    generated = sorted(wanted)
    return Candidate(
        kernel_source=kernel_source,
        host_source=host,
        form="nvrtc",
        link_libraries=["cublas"]
        if any(g.kind == "gemm" for g in groups if g.id in wanted)
        else [],
        declared_torch_ops=declared,
        item_id=through,
        author="rules",
        notes=(
            f"generated items: {', '.join(generated) or 'none'}; "
            f"tuning: {tuning.model_dump_json(exclude={'history'})}"
        ),
    )
