"""``einsum`` of any number of operands as registry ops: pairwise contractions.

Each step takes two operands (in the order of ATen's recorded contraction path where there is
one, else the pair with the smallest result), and appends its result at the end, as
opt_einsum's convention does. Letters
that neither the other operand nor anything later needs are summed out first. Letters shared by
both and needed later are batch letters; letters shared and not needed are contracted. With
something to contract, the pair becomes one (batched) ``matmul`` of operands permuted to
``[batch, free, contracted]`` and ``[batch, contracted, free]``; with nothing, a broadcast
``mul``. A last permute gives the output's letter order.

Only plain equations are taken: explicit ``->``, no letter twice in one operand (but for a
diagonal), float32 operands whose sizes agree letter by letter; an ellipsis is first spelled
out in letters (``expand_ellipsis``). Anything else stays in PyTorch.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from stitch_graph.codegen.ir import ProgramIR, Ref

__all__ = ["einsum_operands", "expand_ellipsis", "lower_einsum"]


def einsum_operands(args: list[Any]) -> tuple[str, list[Any]] | None:
    """``(equation, operands)`` of ``torch.einsum(eq, a, b, ...)`` or ``aten.einsum(eq, [a,
    b, ...])``; ``None`` for any other form."""
    if len(args) < 2 or not isinstance(args[0], str):
        return None
    if len(args) == 2 and isinstance(args[1], list | tuple):
        return args[0], list(args[1])
    return args[0], list(args[1:])


def expand_ellipsis(eq: str, ranks: list[int]) -> str | None:
    """``eq`` with each ``...`` spelled out in unused letters, for operands of ``ranks``
    dims: an operand's ellipsis spans the dims its letters leave, right-aligned across
    operands as einsum broadcasts them; an output without ``->`` (implicit) lists the
    ellipsis' dims, then the letters used once, in alphabetical order. ``None`` where the
    ranks do not fit the equation."""
    eq = eq.replace(" ", "")
    if "." not in eq:
        return eq
    lhs, arrow, out = eq.partition("->")
    subs = lhs.split(",")
    if len(subs) != len(ranks) or any(s.count("...") > 1 or "." in s.replace("...", "") for s in subs):
        return None
    spans = [rank - len(s.replace("...", "")) if "..." in s else 0 for s, rank in zip(subs, ranks, strict=True)]
    if any(n < 0 for n in spans):
        return None
    width = max(spans)
    free = [c for c in "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ" if c not in eq]
    if len(free) < width:
        return None
    letters = "".join(free[:width])
    subs = [s.replace("...", letters[width - n:]) for s, n in zip(subs, spans, strict=True)]
    if not arrow:
        once = sorted(c for c in set("".join(subs)) if "".join(subs).count(c) == 1 and c not in letters)
        out = letters + "".join(once)
    elif "..." in out:
        out = out.replace("...", letters)
    return ",".join(subs) + "->" + out


def _diagonals_taken(
    ir: ProgramIR, build: Any, eq: str, operands: list[Any]
) -> tuple[str, list[Any]] | None:
    """The equation with each letter an operand repeats (``'bii->b'``, a batch of traces)
    replaced by that operand's diagonal over the two dims (a view; its dim goes last), as
    einsum reads it; ``None`` where the repeated dims differ in size."""
    eq = eq.replace(" ", "")
    if "->" not in eq:
        return eq, operands
    lhs, out = eq.split("->")
    subs = lhs.split(",")
    if len(subs) != len(operands):
        return None
    for letters, ref in zip(subs, operands, strict=True):
        repeated = {c for c in letters if letters.count(c) > 1}
        if repeated and (not isinstance(ref, Ref) or len(letters) != len(ir.shapes[ref])):
            return None
        for c in repeated:
            sizes = {ir.shapes[ref][k] for k, d in enumerate(letters) if d == c}
            if len(sizes) != 1 or letters.count(c) != 2:
                return None
    taken_subs, taken_ops = [], []
    for letters, ref in zip(subs, operands, strict=True):
        while any(letters.count(c) > 1 for c in letters):
            c = next(c for c in letters if letters.count(c) > 1)
            first = letters.index(c)
            second = letters.index(c, first + 1)
            ref = build("diagonal", torch.diagonal, ref, 0, first, second)
            letters = "".join(d for k, d in enumerate(letters) if k not in (first, second)) + c
        taken_subs.append(letters)
        taken_ops.append(ref)
    return f"{','.join(taken_subs)}->{out}", taken_ops


def _parse(ir: ProgramIR, eq: str, operands: list[Any]) -> tuple[list[str], str, dict] | None:
    eq = eq.replace(" ", "")
    if "->" not in eq or "." in eq:
        return None
    lhs, out = eq.split("->")
    subs = lhs.split(",")
    if len(subs) != len(operands) or len(set(out)) != len(out):
        return None
    sizes: dict[str, int] = {}
    for letters, ref in zip(subs, operands, strict=True):
        if not isinstance(ref, Ref) or ir.dtypes.get(ref) != "float32":
            return None
        shape = ir.shapes[ref]
        if len(set(letters)) != len(letters) or len(letters) != len(shape):
            return None
        for letter, size in zip(letters, shape, strict=True):
            if sizes.setdefault(letter, size) != size:
                return None  # broadcast sizes: left to PyTorch
    if not set(out) <= set(sizes):
        return None
    return subs, out, sizes


def _pairs(path: Any, count: int) -> list[tuple[int, int]] | None:
    """The contraction order: ATen's flattened path of pairs where it is a valid one."""
    flat = list(path) if isinstance(path, list | tuple) else []
    pairs = [(int(flat[i]), int(flat[i + 1])) for i in range(0, len(flat) - 1, 2)]
    left = count
    for i, j in pairs:
        if i == j or not (0 <= i < left and 0 <= j < left):
            return None
        left -= 1
    return pairs if len(pairs) == count - 1 else None


def _smallest_pair(subs: list[str], out: str, sizes: dict[str, int]) -> tuple[int, int]:
    """The pair whose result is smallest (the first such, left to right), as opt_einsum's
    greedy path picks: a fixed order can make a huge intermediate (Mamba2's four-operand
    einsum, paired first to last, broadcast two operands into 34 GB where PyTorch's order
    keeps 0.5 GB)."""
    best: tuple[int, tuple[int, int]] | None = None
    for i in range(len(subs)):
        for j in range(i + 1, len(subs)):
            rest = [s for k, s in enumerate(subs) if k not in (i, j)]
            needed = set(out).union(*map(set, rest))
            size = math.prod(sizes[c] for c in set(subs[i] + subs[j]) & needed)
            if best is None or size < best[0]:
                best = (size, (i, j))
    assert best is not None
    return best[1]


class _Einsum:
    """Appends the nodes of one einsum through ``build`` (the decomposition's builder)."""

    def __init__(self, ir: ProgramIR, build: Any, sizes: dict[str, int]) -> None:
        self.ir, self.b, self.sizes = ir, build, sizes

    def permute(self, ref: Ref, letters: str, order: str) -> Ref:
        if letters == order:
            return ref
        return self.b("permute", "permute", ref, *[letters.index(c) for c in order])

    def view(self, ref: Ref, shape: list[int]) -> Ref:
        if list(self.ir.shapes[ref]) == shape:
            return ref
        return self.b("view", "reshape", ref, shape)

    def reshape(self, ref: Ref, groups: list[str]) -> Ref:
        return self.view(ref, [math.prod(self.sizes[c] for c in g) for g in groups])

    def sum_out(self, ref: Ref, letters: str, keep: set[str]) -> tuple[Ref, str]:
        gone = [i for i, c in enumerate(letters) if c not in keep]
        if not gone:
            return ref, letters
        kept = "".join(c for c in letters if c in keep)
        return self.b("sum", torch.sum, ref, gone), kept

    def pair(self, a: Ref, sa: str, b: Ref, sb: str, needed: set[str]) -> tuple[Ref, str]:
        a, sa = self.sum_out(a, sa, needed | set(sb))
        b, sb = self.sum_out(b, sb, needed | set(sa))
        batch = "".join(c for c in sa if c in sb and c in needed)
        contracted = "".join(c for c in sa if c in sb and c not in needed)
        free_a = "".join(c for c in sa if c not in sb)
        free_b = "".join(c for c in sb if c not in sa)
        letters = batch + free_a + free_b
        if not contracted:  # an outer or elementwise product: a broadcast multiply
            ones_a, ones_b = [1] * len(free_b), [1] * len(free_a)
            left = self.view(
                self.permute(a, sa, batch + free_a), [*self._sizes(batch + free_a), *ones_a]
            )
            right = self.view(
                self.permute(b, sb, batch + free_b),
                [*self._sizes(batch), *ones_b, *self._sizes(free_b)],
            )
            return self.b("mul", torch.mul, left, right), letters
        if batch:
            groups_a, groups_b = [batch, free_a, contracted], [batch, contracted, free_b]
        else:
            groups_a, groups_b = [free_a, contracted], [contracted, free_b]
        left = self.reshape(self.permute(a, sa, batch + free_a + contracted), groups_a)
        right = self.reshape(self.permute(b, sb, batch + contracted + free_b), groups_b)
        product = self.b("matmul", torch.matmul, left, right)
        return self.view(product, self._sizes(letters)), letters

    def _sizes(self, letters: str) -> list[int]:
        return [self.sizes[c] for c in letters]


def lower_einsum(ir: ProgramIR, build: Any, args: list[Any], path: Any = None) -> Ref | None:
    """The result of ``einsum(*args)`` built from registry ops, or ``None`` (nothing built)
    where the equation is outside what this reproduces.

    Args:
        ir: The program being lowered (operand shapes and dtypes).
        build: The decomposition's node builder, ``build(op, fn, *args) -> Ref``.
        args: The call's arguments (either calling form).
        path: ATen's contraction path (a flat list of operand pairs), if it recorded one.
    """
    parsed = einsum_operands(args)
    if parsed is None:
        return None
    eq, operands = parsed
    taken = _diagonals_taken(ir, build, eq, operands)
    if taken is None:
        return None
    eq, operands = taken
    spec = _parse(ir, eq, operands)
    if spec is None:
        return None
    subs, out, sizes = spec
    steps = _Einsum(ir, build, sizes)
    items: list[tuple[Ref, str]] = list(zip(operands, subs, strict=True))
    pairs = _pairs(path, len(items))
    for step in range(len(items) - 1):
        i, j = pairs[step] if pairs else _smallest_pair([s for _, s in items], out, sizes)
        (a, sa), (b, sb) = items[i], items[j]
        rest = [s for k, (_, s) in enumerate(items) if k not in (i, j)]
        needed = set(out).union(*map(set, rest)) if rest else set(out)
        for k in sorted((i, j), reverse=True):
            del items[k]
        items.append(steps.pair(a, sa, b, sb, needed))
    (result, letters), = items
    result, letters = steps.sum_out(result, letters, set(out))
    return steps.permute(result, letters, out)
