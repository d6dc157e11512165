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

A ``flip`` of such a kernel's result, its only reader, is written the same way: the kernel
stores each element at its mirrored index (``FlipSlice``). A reverse cumulative sum,
``cumsum(x.flip(d), d).flip(d)``, then reads and writes its tensor once, where the second flip
was a kernel that read it back and wrote it again (KernelBench L1 91).
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


@dataclass(frozen=True)
class FlipSlice:
    """Where a flipped operand's elements go: its element ``i`` is the element of ``buffer``
    (the flip's result, of ``shape``) with the coordinates along ``dims`` mirrored."""

    buffer: str
    shape: tuple[int, ...]
    dims: tuple[int, ...]
    total: int
    vector_ok = False  # four neighbours land in reverse order, or rows apart

    def element(self, i: str, width: int = 1) -> str:
        """The result's index for the operand's index ``i`` (``width`` 1 only)."""
        terms = [i]
        for d in self.dims:
            inner = numel(self.shape[d + 1 :])
            at = f"({i} / {inner}) % {self.shape[d]}" if inner > 1 else f"{i} % {self.shape[d]}"
            terms.append(f"({self.shape[d] - 1} - 2 * ({at})) * {inner}")
        return "(" + " + ".join(terms) + ")"


def _flip_dims(node: OpNode) -> tuple[int, ...] | None:
    """The dims a ``flip`` mirrors (non-negative, each once), or ``None`` if not plain ints."""
    dims = node.args.get("dims")
    dims = list(dims) if isinstance(dims, list | tuple) else [dims]
    if not dims or not all(isinstance(d, int) for d in dims):
        return None
    nd = max(len(node.shape), 1)
    return tuple(sorted({d % nd for d in dims}))


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
        if g.id not in wanted or node.op not in ("cat", "stack", "flip") or g.members != [g.output]:
            continue
        if node.op == "flip":
            source = node.args.get("input")
            if (
                isinstance(source, Ref) and source.kind == "node" and source.name in produced
                and users.get(source.name) == [node.name] and _flip_dims(node) is not None
                and node.dtype == ir.dtypes.get(source) == "float32"
            ):
                found[node.name] = [source.name]
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


def _operand_slices(ir: ProgramIR, cat: str) -> list[tuple[Ref, CatSlice | FlipSlice]]:
    """Every operand of ``cat`` (or ``stack``: each operand one index of the new dim; or
    ``flip``: its one operand, mirrored) in order, with its slice of the result."""
    node = ir.node(cat)
    shape = tuple(node.shape)
    if node.op == "flip":
        dims = _flip_dims(node) or ()
        return [(node.args["input"], FlipSlice(cat, shape, dims, numel(shape)))]
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
