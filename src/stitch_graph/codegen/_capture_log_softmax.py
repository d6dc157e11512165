"""``log_softmax`` read only by gathers and row sums or means along its dim, written from the
row's logsumexp instead of as a tensor.

``log_softmax(x).gather(d, t) = x.gather(d, t) - lse`` and ``log_softmax(x).mean(d) =
x.mean(d) - lse``: a cross entropy with label smoothing written by hand, or an NLL of picked
log-probabilities, then reads ``x`` once (the logsumexp and the row sums share its pass) where
it wrote the log-probabilities and read them back. ``F.cross_entropy`` is lowered this way
already (``_capture_decompose``). Any other reader keeps the tensor.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from stitch_graph.codegen._capture_base import _subst
from stitch_graph.codegen._capture_builder import _Builder
from stitch_graph.codegen._capture_names import _canonical_name
from stitch_graph.codegen.ir import ProgramIR, Ref
from stitch_graph.codegen.ops import lookup


@dataclass(frozen=True)
class _RowLogSoftmax:
    """A ``log_softmax`` its readers rewrite: its input and the row's logsumexp (the dim
    dropped, so that a row mean beside it is a sibling reduction of the same pass)."""

    x: Ref
    lse: Ref
    dim: int


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
    if args and isinstance(args[0], _RowLogSoftmax):
        return _reader(b, _canonical_name(fx_node), args[0], _bound(fx_node, args, kwargs))
    if _canonical_name(fx_node) != "log_softmax":
        return None
    a = _bound(fx_node, args, kwargs)
    x, dim = a.get("input"), a.get("dim")
    if not isinstance(x, Ref) or ir.dtypes[x] != "float32" or not isinstance(dim, int):
        return None
    if a.get("dtype") is not None or not ir.shapes[x]:
        return None
    dim %= len(ir.shapes[x])
    if not fx_node.users or not all(_rewritable(user, fx_node, dim, ir.shapes[x]) for user in fx_node.users):  # noqa: E501
        return None
    return _RowLogSoftmax(x, b("logsumexp", torch.logsumexp, x, dim), dim)


def _bound(fx_node: torch.fx.Node, args: list[Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    info = lookup(_canonical_name(fx_node))
    return info.bind(args, kwargs) if info is not None else {}


def _rewritable(user: torch.fx.Node, source: torch.fx.Node, dim: int, shape: tuple) -> bool:
    """Whether ``user`` reads the log-softmax as a gather or a row sum or mean along ``dim``
    (and as nothing else: not as the index, not twice)."""
    name = _canonical_name(user) if user.op in ("call_function", "call_method") else ""
    if name not in ("gather", "sum", "mean") or not user.args or user.args[0] is not source:
        return False
    rest = [*user.args[1:], *user.kwargs.values()]
    if any(v is source for v in rest):
        return False
    a = _bound(user, list(user.args), dict(user.kwargs))
    d = a.get("dim")
    d = d[0] if isinstance(d, list | tuple) and len(d) == 1 else d
    if not isinstance(d, int) or d % len(shape) != dim:
        return False
    return name == "gather" or a.get("dtype") is None


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
