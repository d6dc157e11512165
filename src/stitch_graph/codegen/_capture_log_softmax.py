"""``softmax`` and ``log_softmax`` that are only reduced, written from the row's logsumexp
instead of as a tensor.

``log_softmax(x).gather(d, t) = x.gather(d, t) - lse`` and ``log_softmax(x).mean(d) =
x.mean(d) - lse``: a cross entropy with label smoothing written by hand, or an NLL of picked
log-probabilities, then reads ``x`` once (the logsumexp and the row sums share its pass) where
it wrote the log-probabilities and read them back. ``F.cross_entropy`` is lowered this way
already (``_capture_decompose``).

Where pointwise ops read the result and every chain of them ends in a reduction along the
softmax's dim (a KL divergence or an entropy written by hand, a calibration's top
probability), ``log_softmax(x)`` is ``x - lse`` and ``softmax(x)`` is ``exp(x - lse)``: pointwise
ops the reduction computes as it reads, so no probability tensor is written and read back. A
view that regroups the rows (``lprobs.view(-1, V)``) passes the rewrite on to its readers, the
input and the logsumexp viewed alike. Any other reader (a returned value, a matmul, another
view) keeps the tensor.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from stitch_graph.codegen._capture_base import _copy_of, _subst
from stitch_graph.codegen._capture_builder import _Builder
from stitch_graph.codegen._capture_names import _canonical_name
from stitch_graph.codegen.ir import OpNode, ProgramIR, Ref
from stitch_graph.codegen.ops import POINTWISE, lookup

_ROW_OPS = ("softmax", "log_softmax")
_CHAIN_DEPTH = 6  # pointwise ops between the softmax and the reduction that ends a chain


@dataclass(frozen=True)
class _RowLogSoftmax:
    """A ``softmax`` or ``log_softmax`` its readers rewrite: its input and the row's logsumexp
    (the dim dropped, so that a row mean beside it is a sibling reduction of the same pass)."""

    x: Ref
    lse: Ref
    dim: int
    op: str = "log_softmax"
    name: str = ""


def lower_log_softmax_rows(
    ir: ProgramIR, fx_node: torch.fx.Node, env: dict[str, Any], ours: dict[Ref, Any]
) -> Any:
    """The value a ``log_softmax`` or one of its readers lowers to here, or ``None`` (nothing
    appended) where the rewrite does not apply."""
    if fx_node.op not in ("call_function", "call_method"):
        return None
    args = list(_subst(fx_node.args, env))
    kwargs = dict(_subst(fx_node.kwargs, env))
    b = _Builder(ir, ours, fx_node.name)
    name = _canonical_name(fx_node)
    rows = [v for v in [*args, *kwargs.values()] if isinstance(v, _RowLogSoftmax)]
    if rows and args and rows[0] is args[0] and rows[0].op == "log_softmax" and name in _READERS:
        return _reader(b, name, rows[0], _bound(fx_node, args, kwargs))
    if rows and args and rows[0] is args[0] and name in _ROW_VIEWS:
        return _viewed(b, rows[0], tuple(fx_node.meta["sg_value"].shape), fx_node.name)
    # a pointwise reader: the value as pointwise ops of x and the lse; a loss's own lowering
    # names its nodes after it too, so these take another prefix
    values = _Builder(ir, ours, f"{fx_node.name}_rows") if name in _LOSSES else b
    for row in rows:
        env[row.name] = _value(values, row)
    if rows or name not in _ROW_OPS:
        return None
    a = _bound(fx_node, args, kwargs)
    x, dim = a.get("input"), a.get("dim")
    if not isinstance(x, Ref) or ir.dtypes[x] != "float32" or not isinstance(dim, int):
        return None
    if a.get("dtype") is not None or not ir.shapes[x]:
        return None
    dim %= len(ir.shapes[x])
    direct = name == "log_softmax"
    if not fx_node.users or not all(
        _rewritable(user, fx_node, dim, ir.shapes[x], direct) for user in fx_node.users
    ):
        return None
    return _RowLogSoftmax(x, _row_lse(b, x, dim), dim, name, fx_node.name)


def _bound(fx_node: torch.fx.Node, args: list[Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    info = lookup(_canonical_name(fx_node))
    return info.bind(args, kwargs) if info is not None else {}


_READERS = ("gather", "sum", "mean")
# reductions along the softmax's dim that end a chain of pointwise readers: each computes the
# values as it reads them (a calibration's max probability and its class, an entropy's sum)
_CHAIN_ENDS = ("sum", "mean", "max", "amax", "min", "amin", "argmax", "argmin")
_LOSSES = ("kl_div",)  # of (log-)probabilities: summed whole, or elementwise ("none")
_ROW_VIEWS = ("view", "reshape")  # rows of the last dim, regrouped (``lprobs.view(-1, V)``)
_SHAPE_READS = ("size", "dim", "numel")


def _rewritable(
    user: torch.fx.Node, source: torch.fx.Node, dim: int, shape: tuple, direct: bool
) -> bool:
    """Whether ``user`` reads the result as a gather or a row sum or mean along ``dim`` (a
    ``log_softmax``'s ``direct`` readers; not as the index, not twice), or as a pointwise op
    whose every chain of pointwise readers ends in a sum or a mean over ``dim``."""
    name = _canonical_name(user) if user.op in ("call_function", "call_method") else ""
    if name in _SHAPE_READS:
        return True  # its value is the traced size, a constant
    if name in _ROW_VIEWS and user.args and user.args[0] is source:
        return _keeps_rows(user, source, dim, shape, direct)
    if name not in _READERS or not user.args or user.args[0] is not source or not direct:
        return _reduced_later(user, dim, len(shape), _CHAIN_DEPTH)
    rest = [*user.args[1:], *user.kwargs.values()]
    if any(v is source for v in rest):
        return False
    a = _bound(user, list(user.args), dict(user.kwargs))
    d = a.get("dim")
    d = d[0] if isinstance(d, list | tuple) and len(d) == 1 else d
    if not isinstance(d, int) or d % len(shape) != dim:
        return False
    return name == "gather" or a.get("dtype") is None


def _keeps_rows(
    view: torch.fx.Node, source: torch.fx.Node, dim: int, shape: tuple, direct: bool
) -> bool:
    """Whether ``view`` regroups only the dims before the last, rows along it, and its own
    readers are rewritable along its last dim."""
    value = view.meta.get("sg_value")
    if not torch.is_tensor(value) or dim != len(shape) - 1 or not value.dim():
        return False
    if value.shape[-1] != shape[-1] or any(v is source for v in [*view.args[1:], *view.kwargs.values()]):
        return False
    new = tuple(value.shape)
    return bool(view.users) and all(
        _rewritable(user, view, len(new) - 1, new, direct) for user in view.users
    )


def _reduced_later(node: torch.fx.Node, dim: int, rank: int, depth: int) -> bool:
    """Whether ``node`` is a reduction over ``dim`` (which ends a chain: the reduction
    computes the values as it reads them, the row's lse constant along its row), or a pointwise
    op whose readers, followed through pointwise ops, all end so."""
    name = _canonical_name(node) if node.op in ("call_function", "call_method") else ""
    if name in _CHAIN_ENDS:
        d = _bound(node, list(node.args), dict(node.kwargs)).get("dim")
        dims = [d] if isinstance(d, int) else list(d) if isinstance(d, list | tuple) else None
        return dims is None or not dims or dim in [v % rank for v in dims]
    info = lookup(name)
    if name in _LOSSES:  # reduced whole, or elementwise ("none") and reduced by its readers
        if len(node.args) > 2 or node.kwargs.get("size_average") or node.kwargs.get("reduce"):
            return False
        if node.kwargs.get("reduction", "mean") != "none":
            return True
    elif info is None or info.kind != POINTWISE:
        return False
    if depth == 0 or not node.users:
        return False
    return all(_reduced_later(user, dim, rank, depth - 1) for user in node.users)


def _row_lse(b: _Builder, x: Ref, dim: int) -> Ref:
    """The logsumexp of ``x``'s rows: one already taken of the same value (a softmax and a
    log_softmax of ``x / T`` written twice) is reused. Where ``x`` is one pointwise op of a
    stored tensor (``logits / T``), the logsumexp reads its own copy of that op, so that ``x``
    keeps a single reader kernel, which computes it as it reads, and is never stored."""
    for node in b.ir.nodes:
        done = node.attrs.get("row_lse_of")
        if done and node.args.get("dim") == dim and _same_value(b.ir, Ref(*done), x):
            return Ref("node", node.name)
    lse = b("logsumexp", torch.logsumexp, _recomputed(b, x), dim)
    b.ir.node(lse.name).attrs["row_lse_of"] = (x.kind, x.name)
    return lse


def _producer(ir: ProgramIR, ref: Ref) -> OpNode | None:
    """The one-op pointwise node that computes ``ref`` from stored tensors, if it is one."""
    if ref.kind != "node":
        return None
    node = ir.node(ref.name)
    info = lookup(node.op)
    if info is None or info.kind != POINTWISE:  # random ops are of other kinds
        return None
    inputs = [v for v in node.args.values() if isinstance(v, Ref)]
    return node if all(_producer_kind(ir, v) != POINTWISE for v in inputs) else None


def _producer_kind(ir: ProgramIR, ref: Ref) -> str:
    if ref.kind != "node":
        return "input"
    info = lookup(ir.node(ref.name).op)
    return info.kind if info is not None else "unknown"


def _same_value(ir: ProgramIR, a: Ref, b: Ref) -> bool:
    """``a`` and ``b`` are one tensor, or one pointwise op of the same operands."""
    if a == b:
        return True
    pa, pb = _producer(ir, a), _producer(ir, b)
    return pa is not None and pb is not None and (pa.op, pa.args) == (pb.op, pb.args)


def _recomputed(b: _Builder, x: Ref) -> Ref:
    """A copy of ``x``'s one-op pointwise producer (``x`` itself where it has none)."""
    node = _producer(b.ir, x)
    if node is None:
        return x
    b.count += 1
    copy = _copy_of(b.ir, node, f"{b.name}__{b.count}")
    copy.attrs.pop("strided_in_torch", None)
    b.ir.nodes.append(copy)
    ref = Ref("node", copy.name)
    b.ours[ref] = torch.empty(node.shape, dtype=b.ours[x].dtype, device="meta")
    return ref


def _viewed(b: _Builder, row: _RowLogSoftmax, shape: tuple, name: str) -> _RowLogSoftmax:
    """The rows regrouped: the input viewed as ``shape``, the logsumexp as its rows."""
    x = b("view", "reshape", row.x, list(shape))
    lse = b("view", "reshape", row.lse, list(shape[:-1]))
    return _RowLogSoftmax(x, lse, len(shape) - 1, row.op, name)


def _value(b: _Builder, row: _RowLogSoftmax) -> Ref:
    """The softmax or log-softmax itself, as pointwise ops of its input and the row's lse."""
    shifted = b("sub", torch.sub, row.x, b("unsqueeze", "unsqueeze", row.lse, row.dim))
    return b("exp", torch.exp, shifted) if row.op == "softmax" else shifted


def _reader(b: _Builder, name: str, row: _RowLogSoftmax, a: dict[str, Any]) -> Ref:
    """A reader of the log-softmax, from its input and the row's logsumexp."""
    kept = b("unsqueeze", "unsqueeze", row.lse, row.dim)
    if name == "gather":
        picked = b("gather", torch.gather, row.x, row.dim, a["index"])
        return b("sub", torch.sub, picked, kept)
    keepdim = bool(a.get("keepdim", False))
    lse = kept if keepdim else row.lse
    reduced = b(name, getattr(torch, name), row.x, row.dim, keepdim)
    if name == "sum":
        count = b.ir.shapes[row.x][row.dim]
        lse = b("mul", torch.mul, lse, float(count))
    return b("sub", torch.sub, reduced, lse)
