"""Normalisations read only by row kernels, computed as those kernels load.

A group norm whose result a mean reads (KernelBench L2 23), a batch norm a max pool reads: the
norm kernel writes the whole normalised tensor and the next kernel reads it back. Split instead
into the statistics (each row's mean and ``1/std``: sibling reductions of one pass, stored in one
small tensor) and the normalisation itself, a pointwise chain that the reading kernel computes
on load, as Inductor schedules these programs: the tensor is read twice and never written,
where it was read, written and read again. A group norm's statistics are combined from its
channels' and reach the readers per channel (``_group_steps``).

Only where every reader of the normalised value (through same-shape pointwise ops) is a kernel
that computes its input on load, and only where the scheduler's estimate of the device time
falls; by default only for large batch and group norms (``_SPLIT``, ``_LARGE``: what measured
faster).
"""

from __future__ import annotations

import operator
from typing import Any

import torch

from stitch_graph.codegen._capture_base import _rewire
from stitch_graph.codegen._capture_builder import Metas, _Builder
from stitch_graph.codegen._capture_estimate import adopt, device_us, trial_copy
from stitch_graph.codegen._capture_recompute import recompute_cheap_producers
from stitch_graph.codegen.ir import OpNode, ProgramIR, Ref, numel
from stitch_graph.codegen.ops import INDEXED, LOADS_THROUGH_PROLOGUE, lookup

__all__ = ["normalize_on_load"]

_NORMS = frozenset({"group_norm", "layer_norm", "instance_norm", "batch_norm", "rms_norm"})
# split by default, what measured faster on an H100: batch norms 1.01-1.12x (KernelBench L2 15,
# 72, 84, a BN before a max pool) and group norms 1.01-1.18x (L2 23, 27, 85, 92); a layer norm
# (L2 3, 0.94x), an instance norm (0.99x) and a batch norm of 2M elements (0.90x) lost
_SPLIT = frozenset({"batch_norm", "group_norm"})
_LARGE = 1 << 23  # elements: 32 MB of float32, a pass that costs far more than a launch


def normalize_on_load(ir: ProgramIR) -> None:
    """Split each norm whose readers all compute it on load into statistics and a pointwise
    normalisation, where the estimate falls."""
    base = None  # the program's estimate, taken once and after each adoption
    for name in [n.name for n in ir.nodes if n.op in _SPLIT and numel(n.shape) >= _LARGE]:
        node = ir.node(name)
        geometry = _geometry(ir, node)
        if geometry is None or not _read_on_load(ir, node):
            continue
        trial = trial_copy(ir)
        _split(trial, trial.node(name), *geometry)
        recompute_cheap_producers(trial)  # the input's producers, computed by both readers
        base = device_us(ir) if base is None else base
        estimate = device_us(trial)
        if estimate < base:
            adopt(ir, trial)
            base = estimate


def _read_on_load(ir: ProgramIR, norm: OpNode) -> bool:
    """Whether every kernel the norm's value reaches (through pointwise ops of its shape) can
    compute it as it loads: pointwise ones, and one at least that computes its input on load
    (a reduction, pool, norm, softmax or scan). The norm itself is no program output."""
    users = ir.users()
    frontier, seen, anchored = [norm.name], {norm.name}, False
    while frontier:
        name = frontier.pop()
        for reader in users[name]:
            if reader == "output":
                if name == norm.name:
                    return False
                continue
            node = ir.node(reader)
            info = lookup(node.op)
            if info is None:
                return False
            if info.kind == "pointwise" and node.op not in INDEXED and node.shape == norm.shape:
                if reader not in seen:
                    seen.add(reader)
                    frontier.append(reader)
                continue
            ref = Ref("node", name)
            if info.kind not in LOADS_THROUGH_PROLOGUE or node.args.get("input") != ref:
                return False
            if any(v == ref for k, v in node.args.items() if k != "input"):
                return False
            anchored = True
    return anchored


def _geometry(ir: ProgramIR, norm: OpNode) -> tuple[list[int], tuple[int, ...]] | None:
    """How the norm's rows lie in its input: ``(dims, broadcast)``, the dims a statistic
    reduces (a group norm's: each channel's, combined per group after) and the shape it takes to
    broadcast against the input; ``None`` for a norm left whole."""
    x = norm.args.get("input")
    if not isinstance(x, Ref) or norm.dtype != "float32" or ir.dtypes.get(x) != "float32":
        return None
    if not ir.is_contiguous(x) or norm.shape != ir.shapes[x]:
        return None
    shape = ir.shapes[x]
    rank = len(shape)
    if norm.op in ("layer_norm", "rms_norm"):
        normalized = norm.args.get("normalized_shape")
        count = len(normalized) if isinstance(normalized, list | tuple) else 1
        if count >= rank:
            return None  # one statistic for the whole tensor: no rows
        return list(range(rank - count, rank)), (*shape[: rank - count], *[1] * count)
    if rank < 2:
        return None
    n, c, spatial = shape[0], shape[1], [1] * (rank - 2)
    if norm.op == "batch_norm":
        if not norm.args.get("training"):
            return None
        return [0, *range(2, rank)], (c, *spatial)
    if rank < 3:
        return None  # statistics of single elements
    if norm.op == "instance_norm" and not norm.args.get("use_input_stats", True):
        return None
    if norm.op == "group_norm":
        groups = int(norm.args.get("num_groups") or 0)
        if groups < 1 or c % groups:
            return None
        return list(range(2, rank)), (n, groups, *spatial)
    return list(range(2, rank)), (n, c, *spatial)


def _split(ir: ProgramIR, norm: OpNode, dims: list[int], broadcast: tuple[int, ...]) -> None:
    """Replace ``norm`` by its statistics and the pointwise chain that normalises with them
    (its rows as ``_geometry`` gives them); each of its readers reads a chain of its own."""
    x: Ref = norm.args["input"]
    at = ir.nodes.index(norm)
    before = len(ir.nodes)
    b = _Builder(ir, Metas(ir), f"{norm.name}_onload")
    eps = norm.args.get("eps")
    weighted = True  # the chain multiplies by the weight (a group norm's folds it in)
    if norm.op == "rms_norm":
        eps = torch.finfo(torch.float32).eps if eps is None else eps
        rstd = _rsqrt(b, b("mean", torch.mean, b("mul", torch.mul, x, x), dims), eps)
        steps = [("mul", b("view", "view", rstd, *broadcast))]
    elif norm.op == "group_norm" and broadcast[1] != ir.shapes[x][1]:
        steps, weighted = _group_steps(b, norm, dims, broadcast[1], eps), False
    else:
        var = b("var", torch.var, x, dims, correction=0)
        mean, rstd = _one_pass(b, b("mean", torch.mean, x, dims), _rsqrt(b, var, eps))
        steps = [(op, b("view", "view", s, *broadcast)) for op, s in (("sub", mean), ("mul", rstd))]
    readers = ir.users()[norm.name]
    chains = {reader: _normalised(b, norm, steps, weighted) for reader in readers}
    added = ir.nodes[before:]
    del ir.nodes[before:]
    ir.nodes[at : at + 1] = added
    for reader, value in chains.items():  # each reader computes the chain on its own load
        _rewire(ir.node(reader), {Ref("node", norm.name): value})


_STEP = {"sub": torch.sub, "add": torch.add, "mul": torch.mul}


def _normalised(b: _Builder, norm: OpNode, steps: list[tuple[str, Ref]], weighted: bool) -> Ref:
    """The norm's value: its input through ``steps`` (each an op and its per-row operand,
    broadcast against the input), then the affine weight and bias."""
    x: Ref = norm.args["input"]
    shape = b.ir.shapes[x]
    value = x
    for op, operand in steps:
        value = b(op, _STEP[op], value, operand)
    for key, op in (("weight", "mul"), ("bias", "add")):
        affine = norm.args.get(key)
        if isinstance(affine, Ref) and (weighted or key == "bias"):
            if norm.op not in ("layer_norm", "rms_norm"):  # per channel
                affine = b("view", "view", affine, shape[1], *[1] * (len(shape) - 2))
            value = b(op, _STEP[op], value, affine)
    return value


def _rsqrt(b: _Builder, var: Ref, eps: Any) -> Ref:
    return b("rsqrt", torch.rsqrt, b("add", torch.add, var, 1e-5 if eps is None else eps))


def _one_pass(b: _Builder, first: Ref, second: Ref) -> tuple[Ref, Ref]:
    """Two statistics of the same rows as slices of one tensor: the scheduler then takes both
    reductions in one pass over the input (``_cat_slices``)."""
    stats = b("cat", torch.cat, [first, second], 0)
    count = b.ir.shapes[first][0]
    return (
        b("getitem", operator.getitem, stats, (slice(0, count, None),)),
        b("getitem", operator.getitem, stats, (slice(count, 2 * count, None),)),
    )


def _group_steps(
    b: _Builder, norm: OpNode, dims: list[int], groups: int, eps: Any
) -> list[tuple[str, Ref]]:
    """A group norm's steps from its channels' means and variances, all per channel.

    The pass over the input reduces each channel (its producers stay on load; a view of the
    groups would keep them in memory). Then, per channel, ``apart`` = its mean's distance from
    its group's, and ``scale`` = the group's ``1/std`` (the mean of its channels' variances
    plus their squared distances: equal counts) times the channel's weight: ``(x - mean_c +
    apart) * scale`` is the group's ``(x - mean_g) / std_g * weight``. Each is a small kernel
    that writes one value a channel, so the readers load per channel, with no index."""
    x: Ref = norm.args["input"]
    shape = b.ir.shapes[x]
    n, c = shape[0], shape[1]
    var = b("var", torch.var, x, dims, correction=0)
    mean, var = _one_pass(b, b("mean", torch.mean, x, dims), var)
    by_group = b("view", "view", mean, n, groups, c // groups)
    apart = b("sub", torch.sub, by_group, b("mean", torch.mean, by_group, [2], True))
    spread = b("view", "view", var, n, groups, c // groups)
    spread = b("add", torch.add, spread, b("mul", torch.mul, apart, apart))
    rstd = _rsqrt(b, b("mean", torch.mean, spread, [2], True), eps)
    weight = norm.args.get("weight")
    weight = weight if isinstance(weight, Ref) else b.constant(torch.ones(c))
    scale = b("mul", torch.mul, rstd, b("view", "view", weight, groups, c // groups))
    per_channel = (n, c, *[1] * (len(shape) - 2))
    return [
        ("sub", b("view", "view", mean, *per_channel)),
        ("add", b("view", "view", apart, *per_channel)),
        ("mul", b("view", "view", scale, *per_channel)),
    ]
