"""A concatenation (or stack) written in place: each operand's kernel stores into its slice of
the result.

Emitted as its own kernel, ``torch.cat`` reads every operand back and writes it again: a full
pass over the result (SqueezeNet's fire module took 9.7 ms with it and 7.4 ms without, on an
H200). Operands that are outputs of generated kernels nothing else reads, and that store each
element at its own index (pointwise kernels: a convolution's or GEMM's bias and epilogue, a
pool, a fused chain; scans), are stored by those kernels into the result, allocated once. The
other operands (inputs and views of them, as the pass-through half of a partial rotary
embedding; values read elsewhere too) are copied into their slices by one kernel; with none,
the concatenation emits nothing. An operand whose kernel stores otherwise (a library call
writing its own output, a reduction) is copied with them: ``emit_candidate`` emits again with
it among the copied; where no operand's kernel stored in place, the concatenation keeps its
own kernel.

Reductions of the same rows whose results are concatenated (CBAM's channel mean and max) are
siblings of one pass instead: its kernel stores each result into its slice (``concatenated``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from stitch_graph.codegen.ir import Group, OpNode, ProgramIR, Ref, numel


@dataclass(frozen=True)
class CatSlice:
    """Where one operand's elements go: its element ``i`` is element
    ``(i / run) * stride + start + i % run`` of ``buffer`` (the concatenation's result)."""

    buffer: str
    run: int  # operand elements per index of the dims before the concatenated one
    stride: int  # result elements per such index
    start: int  # where the operand's first run begins
    total: int  # elements of the result

    @property
    def vector_ok(self) -> bool:
        """Whether float4 stores stay inside one run and 16-byte aligned."""
        return self.run % 4 == 0 and self.start % 4 == 0 and self.stride % 4 == 0

    def element(self, i: str, width: int = 1) -> str:
        """The result's index (of ``width``-element vectors) for the operand's index ``i``."""
        run, stride, start = self.run // width, self.stride // width, self.start // width
        at = f" + {start}" if start else ""
        if run == stride:
            return f"{i}{at}"
        return f"({i} / {run}) * {stride}{at} + {i} % {run}"


def cat_slices(ir: ProgramIR, groups: list[Group], wanted: set[str]) -> dict[str, list[str]]:
    """Concatenations that can be written in place: the concatenation's node name -> the
    operands whose kernels may store into it (outputs of other wanted groups, read by it
    alone, each once). Each is a group of that one node over float32 operands, one such
    operand at least; ``copied_slices`` names the rest."""
    users = ir.users()
    produced = {g.output for g in groups if g.id in wanted}
    found: dict[str, list[str]] = {}
    for g in groups:
        node = ir.node(g.output)
        if g.id not in wanted or node.op not in ("cat", "stack") or g.members != [g.output]:
            continue
        tensors = node.args.get("tensors")
        dim = node.args.get("dim", 0)
        if not isinstance(tensors, list | tuple) or not isinstance(dim, int):
            continue
        if node.dtype != "float32" or any(
            not isinstance(t, Ref) or ir.dtypes.get(t) != "float32" for t in tensors
        ):
            continue
        names = [t.name for t in tensors if t.kind == "node"]
        computed = [
            n for n in names
            if names.count(n) == 1 and users.get(n) == [node.name] and n in produced
        ]
        if computed:
            found[node.name] = computed
    return found


def _operand_slices(ir: ProgramIR, cat: str) -> list[tuple[Ref, CatSlice]]:
    """Every operand of ``cat`` (or ``stack``: each operand one index of the new dim) in
    order, with its slice of the result."""
    node = ir.node(cat)
    shape = tuple(node.shape)
    dim = int(node.args.get("dim", 0)) % max(len(shape), 1)
    inner = numel(shape[dim + 1 :])
    stride = shape[dim] * inner
    out: list[tuple[Ref, CatSlice]] = []
    start = 0
    for ref in node.args["tensors"]:
        run = (1 if node.op == "stack" else ir.shapes[ref][dim]) * inner
        out.append((ref, CatSlice(cat, run, stride, start, numel(shape))))
        start += run
    return out


def slices_of(ir: ProgramIR, cat: str, operands: list[str]) -> dict[str, CatSlice]:
    """Each named operand's ``CatSlice`` in the result of ``cat``."""
    return {
        ref.name: where for ref, where in _operand_slices(ir, cat)
        if ref.kind == "node" and ref.name in operands
    }


def copied_slices(ir: ProgramIR, cat: str, computed: list[str]) -> list[tuple[Ref, CatSlice]]:
    """The operands of ``cat`` that no kernel of theirs stores in place (inputs, views of
    them, values read elsewhere too), with their slices: a copy kernel writes those."""
    return [
        (ref, where) for ref, where in _operand_slices(ir, cat)
        if not (ref.kind == "node" and ref.name in computed)
    ]


def concatenated(ir: ProgramIR, g: Group, out: OpNode) -> list[tuple[str, CatSlice]]:
    """Each concatenated result of a sibling group whose output is their concatenation, with
    its slice of it (``[]`` for any other group)."""
    if out.op != "cat" or not g.siblings or out.name not in g.epilogue:
        return []
    names = [t.name for t in out.args["tensors"]]
    where = slices_of(ir, out.name, names)
    return [(name, where[name]) for name in names]


def stored_in_slices(emitter: Any, first: CatSlice, build: Callable[[], list[str]]) -> list[str]:
    """``build()``'s host lines; the kernels it adds store their result (``out[r] = ``) into
    the first slice, the finish lines having stored the others."""
    count = len(emitter.kernels)
    lines = build()
    for k in range(count, len(emitter.kernels)):
        emitter.kernels[k] = emitter.kernels[k].replace("out[r] = ", f"out[{first.element('r')}] = ")
    return lines
