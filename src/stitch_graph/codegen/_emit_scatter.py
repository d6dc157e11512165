"""Scatters (``scatter_add``, ``index_add``, ``scatter`` of a value or a tensor,
``scatter_reduce`` by sum, amax or amin): the input copied into the output (or computed there:
the zeros a scatter usually starts from), then a thread per source element (computed there too
where a pointwise kernel would only have stored it) adding (``atomicAdd``), taking the larger or
smaller (a compare-and-swap loop; a NaN, once written, stays) or storing into the position its
index names along ``dim``.

Float atomics add in whatever order threads arrive, as PyTorch's CUDA kernels do, so sums agree
to rounding. Stores race where indices repeat, as PyTorch's do (its CUDA result is then one of
the writes, unspecified): indices that are unique along the dim (``topk``'s, a permutation) or
repeats that carry equal values give PyTorch's result exactly. Indices outside the dim write
nothing (PyTorch raises). ``_ScatterEmitter`` is a mixin of ``emit._Emitter``.
"""

from __future__ import annotations

import math
from typing import Any

from stitch_graph.codegen._emit_base import (
    _CTYPE,
    _MAX_GRID,
    _TORCH_DTYPE,
    _Args,
    _EmitterBase,
    _literal,
    _py,
)
from stitch_graph.codegen._emit_region import written_by_a_kernel
from stitch_graph.codegen.ir import Group, Ref, contiguous_strides, numel
from stitch_graph.codegen.schedule import _read_inside, node_kind
from stitch_graph.codegen.tuning import KernelTuning

# how a source element meets its position: scatter_add and scatter_reduce's reductions
_WRITES = {
    "scatter_add": "atomicAdd(&out[o], v);",
    "sum": "atomicAdd(&out[o], v);",
    "amax": "sg_atomic_max(&out[o], v);",
    "amin": "sg_atomic_min(&out[o], v);",
}


_IDENTITY = {"sum": "0.f", "amax": "-SG_INF", "amin": "SG_INF"}


def _reset_targets(
    ir: Any,
    node: Any,
    kernel: str,
    block: int,
    space: tuple[int, ...],
    dim: int,
    target: list[str],
    shape: tuple[int, ...],
) -> tuple[list[str], str]:
    """A kernel that stores the reduction's identity at every position a source element
    reaches (a thread each, all storing the same value), and the host name of its index."""
    index = node.args["index"]
    coords = [f"c{d}" for d in range(len(space))]
    lines = [
        f"// {node.op} without the input: its targets start from the reduction's identity",
        f'extern "C" __global__ __launch_bounds__({block}) void {kernel}_reset('
        f"const long long* __restrict__ a0, float* __restrict__ out) {{",
        f"  for (long long e = (long long)blockIdx.x * {block} + threadIdx.x; e < {numel(space)}; "
        f"e += (long long)gridDim.x * {block}) {{",
        *(f"    {line}" for line in _coords("e", space)),
        f"    const long long j = a0[{_at(ir.strides[index], coords)}];",
        f"    if (j < 0 || j >= {shape[dim]}) continue;",
        f"    out[{_at(contiguous_strides(shape), target)}] = {_IDENTITY[node.args['reduce']]};",
        "  }",
        "}",
    ]
    return lines, _py(index)


def _coords(idx: str, shape: tuple[int, ...]) -> list[str]:
    """``c0..`` of the linear index ``idx`` over ``shape``."""
    lines = []
    for d in range(len(shape)):
        inner = numel(shape[d + 1 :])
        coord = f"({idx} / {inner})" if inner > 1 else idx
        lines.append(f"const long long c{d} = {coord} % {shape[d]};")
    return lines


def _at(strides: tuple[int, ...], coords: list[str]) -> str:
    """The offset of the element at ``coords`` in a tensor of ``strides``."""
    return " + ".join(f"{c} * {s}" for c, s in zip(coords, strides, strict=True)) or "0"


def _feeding(ir: Any, members: list[str], ref: Ref) -> list[str]:
    """The members ``ref`` is computed from, itself included, in their order."""
    if ref.kind != "node" or ref.name not in members:
        return []
    wanted = {ref.name} | _read_inside(ir, [ref.name], set(members))
    return [m for m in members if m in wanted]


def _writable_input(ir: Any, node: Any, g: Group) -> bool:
    """Whether the scatter may write into its input's buffer instead of a copy: the input is
    the whole of a contiguous tensor a kernel of this program computed (directly or through
    views), and nothing else reads it or its views, nor is it an output (a chain of
    ``index_put_`` calls on one adjacency matrix then writes it once)."""
    x = node.args["input"]
    if not isinstance(x, Ref) or x.kind != "node" or x.name in g.prologue:
        return False
    users, size = ir.users(), numel(ir.shapes[x])
    reader = node.name
    while True:
        if users.get(x.name) != [reader] or not ir.is_contiguous(x):
            return False
        if numel(ir.shapes[x]) != size or ir.dtypes.get(x) != node.dtype:
            return False
        producer = ir.node(x.name)
        if node_kind(ir, producer)[0] != "view":
            return written_by_a_kernel(ir, producer)
        source = producer.args.get("input")
        if not isinstance(source, Ref) or source.kind != "node":
            return False  # a view of an input or a parameter
        reader, x = x.name, source


class _ScatterEmitter(_EmitterBase):
    """The copy and scatter kernels of a ``scatter`` group."""

    def scatter(self, g: Group, kernel: str, tun: KernelTuning) -> list[str]:
        """Copy ``input`` into the output, then add or store each source element at its
        index along ``dim`` (``index_add``: the index of its coordinate along ``dim``)."""
        ir = self.ir
        node = ir.node(g.anchor or "")
        x: Ref = node.args["input"]
        shape = tuple(node.shape)
        dim = int(node.args["dim"]) % max(len(shape), 1)
        index: Ref = node.args["index"]
        block = min(tun.block_size, 1024)
        ctype = _CTYPE[node.dtype]
        total = numel(shape)
        copy_args = _Args(ir)
        env: dict[str, str] = {}
        pre = self.exprs(_feeding(ir, g.prologue, x), shape, "i", env, copy_args)
        loaded = self.value_of(x, shape, "i", env, copy_args)
        copy = [
            f"// {node.op}: the input copied into the output first",
            f'extern "C" __global__ __launch_bounds__({block}) void {kernel}_copy('
            f"{copy_args.signature([f'{ctype}* __restrict__ out'])}) {{",
            f"  for (long long i = (long long)blockIdx.x * {block} + threadIdx.x; i < {total}; "
            f"i += (long long)gridDim.x * {block}) {{",
            *(f"    {line}" for line in pre),
            f"    out[i] = {loaded};",
            "  }",
            "}",
        ]
        args = _Args(ir)
        index_name = args.param(index)
        source = node.args.get("source" if node.op == "index_add" else "src")
        computed: dict[str, str] = {}  # the source's producers, computed at each element
        source_lines = []
        if isinstance(source, Ref) and source.name in g.prologue:
            source_lines = self.exprs(
                _feeding(ir, g.prologue, source), ir.shapes[source], "e", computed, args
            )
        out_strides = contiguous_strides(shape)
        if node.op == "index_add":
            space = ir.shapes[source]
            coords = [f"c{d}" for d in range(len(space))]
            target = ["j" if d == dim else c for d, c in enumerate(coords)]
            j = f"{index_name}[c{dim} * {ir.strides[index][0]}]"
            alpha = float(node.args.get("alpha", 1))
            if source.name in g.prologue:
                value = self.value_of(source, space, "e", computed, args)
            else:
                value = f"{args.param(source)}[{_at(ir.strides[source], coords)}]"
            value = value if alpha == 1 else f"{_literal(alpha)} * {value}"
            write = "atomicAdd(&out[o], v);"
        else:
            space = ir.shapes[index]
            coords = [f"c{d}" for d in range(len(space))]
            target = ["j" if d == dim else c for d, c in enumerate(coords)]
            j = f"{index_name}[{_at(ir.strides[index], coords)}]"
            src = node.args["src"] if node.args.get("src") is not None else node.args["value"]
            if isinstance(src, Ref) and src.name in g.prologue:
                value = self.value_of(src, space, "e", computed, args)
            elif isinstance(src, Ref):
                value = f"{args.param(src)}[{_at(ir.strides[src], coords)}]"
            elif node.dtype == "bool":
                value = "true" if src else "false"
            else:
                value = _literal(float(src))
            write = _WRITES.get(node.args.get("reduce") if node.op == "scatter_reduce" else node.op,
                                "out[o] = v;")
        count = numel(space)
        src_lines = [
            f"// {node.op} along dim {dim}: a thread per source element, "
            + ("a store" if write == "out[o] = v;" else write.split("(")[0]),
            f'extern "C" __global__ __launch_bounds__({block}) void {kernel}('
            f"{args.signature([f'{ctype}* __restrict__ out'])}) {{",
            f"  for (long long e = (long long)blockIdx.x * {block} + threadIdx.x; e < {count}; "
            f"e += (long long)gridDim.x * {block}) {{",
            *(f"    {line}" for line in _coords("e", space)),
            f"    const long long j = {j};",
            f"    if (j < 0 || j >= {shape[dim]}) continue;",
            f"    const long long o = {_at(out_strides, target)};",
            *(f"    {line}" for line in source_lines),
            f"    const {ctype} v = {value};",
            f"    {write}",
            "  }",
            "}",
        ]
        grid = max(1, min(math.ceil(count / block), _MAX_GRID))
        py = ", ".join([*(_py(r) for r in args.refs), node.name])
        # include_self=False: the positions a source element reaches start from the
        # reduction's identity, not the input (those no element reaches keep the input)
        reset: list[str] = []
        if node.op == "scatter_reduce" and node.args.get("include_self") is False:
            source, index_arg = _reset_targets(ir, node, kernel, block, space, dim, target, shape)
            self.kernels.append("\n".join(source))
            reset = [f"KERNELS.{kernel}_reset({grid}, {block}, {index_arg}, {node.name})"]
        if _writable_input(ir, node, g):
            self.kernels.append("\n".join(src_lines))
            return [
                f"{node.name} = {_py(x)}  # written in place: nothing else reads it",
                *reset,
                f"KERNELS.{kernel}({grid}, {block}, {py})",
            ]
        self.kernels.extend(["\n".join(copy), "\n".join(src_lines)])
        copy_grid = max(1, min(math.ceil(total / block), _MAX_GRID))
        copy_py = ", ".join([*(_py(r) for r in copy_args.refs), node.name])
        return [
            f"{node.name} = torch.empty({list(shape)}, device=_dev, "
            f"dtype={_TORCH_DTYPE[node.dtype]})",
            f"KERNELS.{kernel}_copy({copy_grid}, {block}, {copy_py})",
            *reset,
            f"KERNELS.{kernel}({grid}, {block}, {py})",
        ]
