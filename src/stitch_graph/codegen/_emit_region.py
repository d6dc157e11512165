"""Assignment into a slice, written in place (``h[:, 0] *= 2``, ``x[..., :d] = v``): where the
tensor assigned into is a buffer of this program that nothing reads after the assignment, the
kernel stores the value over the region only, instead of copying the whole tensor with the region
replaced. ``_RegionEmitter`` is a mixin of ``emit._Emitter``.
"""

from __future__ import annotations

from typing import Any

from stitch_graph.codegen._capture_setitem import region_shape
from stitch_graph.codegen._emit_base import (
    _CTYPE,
    _MAX_GRID,
    _Args,
    _EmitterBase,
    _literal,
    _py,
)
from stitch_graph.codegen.ir import Group, OpNode, ProgramIR, Ref, contiguous_strides, numel
from stitch_graph.codegen.schedule import node_kind
from stitch_graph.codegen.tuning import KernelTuning


def _root(ir: ProgramIR, ref: Any) -> Any:
    """The tensor ``ref`` is a view of (through any chain of views), or ``ref`` itself."""
    while isinstance(ref, Ref) and ref.kind == "node":
        producer = ir.node(ref.name)
        if node_kind(ir, producer)[0] != "view" or not isinstance(producer.args.get("input"), Ref):
            return ref
        ref = producer.args["input"]
    return ref


def written_by_a_kernel(ir: ProgramIR, producer: OpNode) -> bool:
    """Whether ``producer``'s result is a buffer of its own that a kernel of the program wrote
    (what PyTorch returns may be a view of another tensor)."""
    kind = node_kind(ir, producer)[0]
    return kind not in ("unsupported", "view") and producer.op != "getitem"


def writes_in_place(ir: ProgramIR, node: OpNode, members: list[str]) -> bool:
    """Whether the assignment ``node`` may store into its input's buffer: a contiguous tensor
    a kernel of this program wrote, not an output; its value no view of it; and every other
    reader of it, through its views too, an earlier kernel than the group of ``members``."""
    base, value = node.args["input"], node.args.get("value")
    if not isinstance(base, Ref) or base.kind != "node" or not ir.is_contiguous(base):
        return False
    if tuple(ir.shapes[base]) != tuple(node.shape) or ir.dtypes.get(base) != node.dtype:
        return False
    if not written_by_a_kernel(ir, ir.node(base.name)):
        return False
    if isinstance(value, Ref) and _root(ir, value) == base:
        return False  # y[1:] = y[:-1]: the stores would overwrite what other threads read
    order = {n.name: k for k, n in enumerate(ir.nodes)}
    users = ir.users()
    pending, seen = [base.name], set()
    while pending:
        name = pending.pop()
        for user in users.get(name, []):
            if user == node.name or user in seen:
                continue
            seen.add(user)
            if user == "output" or user in members:
                return False
            if node_kind(ir, ir.node(user))[0] == "view":
                pending.append(user)
            elif order[user] > order[node.name]:
                return False
    return True


class _RegionEmitter(_EmitterBase):
    """The in-place store of an assignment's region."""

    def region_write(self, part: Group, kernel: str, tun: KernelTuning, out: OpNode) -> list[str]:
        """A thread per element of the region: the value computed there (the group's other
        members at the region's coordinates) and stored at its place in the input."""
        ir = self.ir
        base: Ref = out.args["input"]
        value = out.args["value"]
        dims = out.args["index"]
        space = region_shape(dims, tuple(ir.shapes[base]))
        n = numel(space)
        index = "long long" if numel(ir.shapes[base]) >= 2**31 else "int"
        args = _Args(ir)
        env: dict[str, str] = {}
        members = [m for m in part.epilogue if m != out.name]
        lines = self.exprs(members, space, "i", env, args)
        if isinstance(value, Ref):
            new = self.value_of(value, space, "i", env, args)
        else:
            new = _literal(value if isinstance(value, bool) else float(value))
        offset, j = [], 0  # the region's coordinate j along each of the input's dims
        for spec, stride in zip(dims, contiguous_strides(tuple(ir.shapes[base])), strict=True):
            if spec[0] == "int":
                offset.append(f"{spec[1]} * {stride}")
                continue
            inner = numel(space[j + 1:])
            coord = f"((i / {inner}) % {space[j]})" if inner > 1 else f"(i % {space[j]})"
            place = coord if spec[0] == "all" else f"({spec[1]} + {coord} * {spec[3]})"
            offset.append(f"{place} * {stride}")
            j += 1
        block = tun.block_size
        ctype = _CTYPE.get(out.dtype, "float")
        self.kernels.append("\n".join([
            f"// {out.name}: the assigned region stored into the input, in place",
            f'extern "C" __global__ __launch_bounds__({block}) void {kernel}('
            f"{args.signature([f'{ctype}* __restrict__ out'])}) {{",
            f"  for ({index} i = ({index})blockIdx.x * {block} + threadIdx.x; i < {n}; "
            f"i += ({index})gridDim.x * {block}) {{",
            *(f"    {line}" for line in lines),
            f"    out[{' + '.join(offset) or '0'}] = ({ctype})({new});",
            "  }",
            "}",
        ]))
        grid = max(1, min(-(-n // block), _MAX_GRID))
        py_args = ", ".join([*(_py(r) for r in args.refs), out.name])
        return [
            f"{out.name} = {_py(base)}  # the region written in place: nothing reads it after",
            f"KERNELS.{kernel}({grid}, {block}, {py_args})",
        ]
