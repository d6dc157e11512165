"""Hand-written layer norms, RMS norms and softmaxes recognised as the ``layer_norm``,
``rms_norm`` and ``softmax`` they compute.

``(x - x.mean(-1, keepdim=True)) / torch.sqrt(var + eps)`` with the variance written as the mean
of the squared deviations (or ``x.var(..., unbiased=False)``) is two dependent row reductions,
and so is ``e = exp(x - x.amax(d, keepdim=True)); e / e.sum(d, keepdim=True)``. Scheduled as
written, each becomes two kernels, the first writing an intermediate tensor for the second to
read back: two reads and two writes where the row op takes one of each (0.57x of
``torch.compile`` on an H100 for a (8192, 4096) layer norm written so). As one node, the row
kernel holds each row in registers, and what follows (an affine ``* weight + bias``) fuses into
it as its epilogue. Only the exact forms are taken: a layer norm over trailing dims with ``eps``
inside the square root, a softmax or log-softmax that subtracts the maximum, every intermediate
read by the chain alone.

A mean of squared deviations from the mean over other dims (ConvNeXt's channels-first layer
norm) is still a ``var(..., correction=0)`` of the input: so written, it reads the input beside
the mean instead of after it, and the scheduler takes both in one pass as sibling reductions.
"""

from __future__ import annotations

from typing import Any

from stitch_graph.codegen.ir import OpNode, ProgramIR, Ref, contiguous_strides

_Nodes = dict[str, OpNode]


def recognize_norms(ir: ProgramIR) -> None:
    """Replace each hand-written layer norm's or softmax's last node by one row-op node of the
    same name; the chain it replaces is left without readers for dead-node elimination."""
    nodes = {n.name: n for n in ir.nodes}
    users = ir.users()
    for position, node in enumerate(ir.nodes):
        norm = (
            _layer_norm(ir, node, nodes, users) or _rms_norm(ir, node, nodes, users)
            or _softmax(ir, node, nodes, users)
        )
        if norm is not None:
            ir.nodes[position] = norm
            nodes[norm.name] = norm
            users = ir.users()
    for position, node in enumerate(ir.nodes):  # after the norms, whose chains it would break
        var = _biased_variance(ir, node, nodes)
        if var is not None:
            ir.nodes[position] = var
            nodes[var.name] = var
    users = ir.users()
    for position, node in enumerate(ir.nodes):  # after the layer norms it is made of
        group = _group_norm(ir, node, nodes, users)
        if group is not None:
            ir.nodes[position] = group
            nodes[group.name] = group


_VIEWS = ("view", "reshape")


def _group_norm(
    ir: ProgramIR, back: OpNode, nodes: _Nodes, users: dict[str, list[str]]
) -> OpNode | None:
    """The ``group_norm`` (without affine) that ``back`` computes, or ``None``: a view of an
    input ``(N, C, ...)`` as ``(N, G, ...)``, a layer norm of all the dims after ``G``, and a view
    back. As written, the per-channel scale and shift that follow read the norm through a view
    that merges channels with positions, so they took a kernel of their own (0.83x of
    ``torch.compile`` on an H100); as a group norm over the input's own shape they are its
    epilogue."""
    norm = _node(back.args.get("input"), nodes)
    if back.op not in _VIEWS or norm is None or norm.op != "layer_norm":
        return None
    if norm.args.get("weight") is not None or norm.args.get("bias") is not None:
        return None
    grouped = _node(norm.args.get("input"), nodes)
    if grouped is None or grouped.op not in _VIEWS:
        return None
    x = grouped.args.get("input")
    if not isinstance(x, Ref):
        return None
    shape, by_group = tuple(ir.shapes.get(x, ())), tuple(grouped.shape)
    if len(shape) < 3 or len(by_group) < 3 or tuple(back.shape) != shape:
        return None
    batch, channels, groups = shape[0], shape[1], by_group[1]
    normalized = norm.args["normalized_shape"]
    if by_group[0] != batch or channels % groups or len(normalized) != len(by_group) - 2:
        return None
    if tuple(ir.strides.get(x, contiguous_strides(shape))) != contiguous_strides(shape):
        return None
    if users.get(norm.name) != [back.name]:
        return None  # the grouped values are read as they are: keep them
    if any(ir.dtypes.get(ref, "float32") != "float32" for ref in (x, Ref("node", back.name))):
        return None
    eps = norm.args["eps"]
    return OpNode(
        name=back.name,
        op="group_norm",
        args={"input": x, "num_groups": groups, "weight": None, "bias": None, "eps": eps},
        shape=shape,
        dtype=back.dtype,
        call="torch.nn.functional.group_norm",
        call_args=[x, groups, None, None, eps],
        call_kwargs={},
    )


def _layer_norm(
    ir: ProgramIR, y: OpNode, nodes: _Nodes, users: dict[str, list[str]]
) -> OpNode | None:
    """The ``layer_norm`` node that ``y`` computes, or ``None`` when it is not one."""
    centred, inv = _scaled(y, nodes)
    root = _root_of_shifted(inv, nodes)
    if centred is None or inv is None or root is None:
        return None
    shifted, var, eps = root
    c = nodes.get(centred.name)
    if c is None or c.op != "sub" or c.args.get("alpha", 1) != 1:
        return None
    x, mean = c.args.get("input"), _node(c.args.get("other"), nodes)
    if not isinstance(x, Ref) or mean is None or not _row_mean(mean, x):
        return None
    shape = ir.shapes.get(x)
    dims = _trailing(mean.args.get("dim"), len(shape or ()))
    if shape is None or dims is None or tuple(y.shape) != tuple(shape):
        return None
    squares = _squares(var, c, x, dims, nodes, len(shape))
    if squares is None or not var.args.get("keepdim"):
        return None
    readers = {
        mean.name: {c.name},
        var.name: {shifted.name},
        shifted.name: {inv.name},
        inv.name: {y.name},
        c.name: {y.name, *squares},
        **{square: {var.name} for square in squares},
    }
    if not _read_only_within(users, readers):
        return None
    if any(ir.dtypes.get(Ref("node", n), "float32") != "float32" for n in [*readers, y.name]):
        return None
    return _row_norm(y, "layer_norm", x, shape, dims, {"weight": None, "bias": None, "eps": eps})


def _rms_norm(
    ir: ProgramIR, y: OpNode, nodes: _Nodes, users: dict[str, list[str]]
) -> OpNode | None:
    """The ``rms_norm`` of ``x * rsqrt(x.pow(2).mean(dims, keepdim=True) + eps)`` (or
    ``x / sqrt(...)``, the square as ``pow`` or ``x * x``) over trailing dims, as LLaMA and T5
    write it, or ``None``."""
    x, inv = _scaled(y, nodes, any_operand=True)
    root = _root_of_shifted(inv, nodes)
    if x is None or inv is None or root is None:
        return None
    shifted, ms, eps = root
    square = _node(ms.args.get("input"), nodes)
    shape = ir.shapes.get(x)
    if ms.op != "mean" or not ms.args.get("keepdim") or ms.args.get("dtype") or square is None:
        return None
    squares_x = (square.op == "pow" and square.args.get("exponent") == 2) or (
        square.op == "mul" and square.args.get("other") == x
    )
    if not squares_x or square.args.get("input") != x or shape is None:
        return None
    dims = _trailing(ms.args.get("dim"), len(shape))
    if dims is None or tuple(y.shape) != tuple(shape):
        return None
    readers = {square.name: {ms.name}, ms.name: {shifted.name}, shifted.name: {inv.name},
               inv.name: {y.name}}
    if not _read_only_within(users, readers):
        return None
    if any(ir.dtypes.get(r, "float32") != "float32" for r in [x, Ref("node", y.name)]):
        return None
    return _row_norm(y, "rms_norm", x, shape, dims, {"weight": None, "eps": eps})


def _root_of_shifted(inv: OpNode | None, nodes: _Nodes) -> tuple[OpNode, OpNode, float] | None:
    """``(shifted, statistic, eps)`` of ``inv = sqrt(statistic + eps)`` (or ``rsqrt``), eps a
    number; ``None`` for any other form."""
    if inv is None or inv.op not in ("sqrt", "rsqrt"):
        return None
    shifted = _node(inv.args.get("input"), nodes)
    if shifted is None or shifted.op != "add" or shifted.args.get("alpha", 1) != 1:
        return None
    statistic, eps = _node(shifted.args.get("input"), nodes), shifted.args.get("other")
    if not isinstance(eps, int | float) or isinstance(eps, bool) or statistic is None:
        return None
    return shifted, statistic, float(eps)


def _read_only_within(users: dict[str, list[str]], readers: dict[str, set[str]]) -> bool:
    """Whether each intermediate is read by the chain alone (not elsewhere, not an output)."""
    return not any(set(users.get(n, ())) - allowed for n, allowed in readers.items())


def _row_norm(
    y: OpNode, op: str, x: Ref, shape: tuple[int, ...], dims: tuple[int, ...],
    kwargs: dict[str, Any],
) -> OpNode:
    """The ``op`` node (``layer_norm``, ``rms_norm``) over ``x``'s trailing ``dims`` that takes
    ``y``'s name and place."""
    normalized = tuple(shape[len(shape) - len(dims) :])
    return OpNode(
        name=y.name,
        op=op,
        args={"input": x, "normalized_shape": normalized, **kwargs},
        shape=tuple(y.shape),
        dtype=y.dtype,
        call=f"torch.nn.functional.{op}",
        call_args=[x, normalized],
        call_kwargs=kwargs,
    )


def _node(value: Any, nodes: _Nodes) -> OpNode | None:
    return nodes.get(value.name) if isinstance(value, Ref) and value.kind == "node" else None


def _scaled(
    y: OpNode, nodes: _Nodes, *, any_operand: bool = False
) -> tuple[Ref | None, OpNode | None]:
    """``(centred, sqrt node)`` of ``centred / sqrt(...)``, or ``(centred, rsqrt node)`` of
    ``centred * rsqrt(...)`` in either order; ``centred`` a node's value, or with
    ``any_operand`` any tensor (an RMS norm scales its input itself)."""
    a, b = y.args.get("input"), y.args.get("other")

    def operand(ref: Any) -> bool:
        return isinstance(ref, Ref) and (any_operand or ref.kind == "node")

    if y.op == "div" and y.args.get("rounding_mode") is None:
        den = _node(b, nodes)
        if operand(a) and den is not None and den.op == "sqrt":
            return a, den
    if y.op == "mul":
        for centred, scale in ((a, b), (b, a)):
            inv = _node(scale, nodes)
            if operand(centred) and inv is not None and inv.op == "rsqrt":
                return centred, inv
    return None, None


def _row_mean(mean: OpNode, x: Ref) -> bool:
    return (
        mean.op == "mean"
        and mean.args.get("input") == x
        and bool(mean.args.get("keepdim"))
        and mean.args.get("dtype") is None
    )


def _reduced_dims(dim: Any, ndim: int) -> tuple[int, ...] | None:
    """The reduced dims, each once and in order (``None`` for all of them or none)."""
    if ndim == 0 or dim is None:
        return None
    return tuple(sorted({int(d) % ndim for d in (dim if isinstance(dim, list | tuple) else [dim])}))


def _trailing(dim: Any, ndim: int) -> tuple[int, ...] | None:
    """The reduced dims when they are the last ones (each once), else ``None``."""
    dims = _reduced_dims(dim, ndim)
    return dims if dims is not None and dims == tuple(range(ndim - len(dims), ndim)) else None


def _biased_variance(ir: ProgramIR, v: OpNode, nodes: _Nodes) -> OpNode | None:
    """``x.var(dims, correction=0)`` for ``v = ((x - x.mean(dims, keepdim=True)) ** 2).mean(dims)``
    (the square as ``pow`` or a product), or ``None``."""
    square = _node(v.args.get("input"), nodes) if v.op == "mean" else None
    c = _node(square.args.get("input"), nodes) if square is not None else None
    if c is None or c.op != "sub" or c.args.get("alpha", 1) != 1:
        return None
    x, mean = c.args.get("input"), _node(c.args.get("other"), nodes)
    if not isinstance(x, Ref) or mean is None or not _row_mean(mean, x):
        return None
    if ir.shapes.get(x) != tuple(c.shape):
        return None
    dims = _reduced_dims(mean.args.get("dim"), len(c.shape))
    if dims is None or _squares(v, c, x, dims, nodes, len(c.shape)) is None:
        return None
    chain = [Ref("node", n) for n in (v.name, square.name, c.name, mean.name)]  # type: ignore[union-attr]
    if any(ir.dtypes.get(r, "float32") != "float32" for r in [x, *chain]):
        return None
    kwargs = {"dim": dims, "correction": 0, "keepdim": bool(v.args.get("keepdim"))}
    return OpNode(
        name=v.name,
        op="var",
        args={"input": x, **kwargs, "unbiased": False},
        shape=tuple(v.shape),
        dtype=v.dtype,
        call="torch.var",
        call_args=[x],
        call_kwargs=kwargs,
    )


def _squares(
    var: OpNode, c: OpNode, x: Ref, dims: tuple[int, ...], nodes: _Nodes, ndim: int
) -> list[str] | None:
    """The squared deviations the chain's variance averages (none for ``x.var(...,
    unbiased=False)``), or ``None`` when it is no biased variance over ``dims``."""
    if _reduced_dims(var.args.get("dim"), ndim) != dims:
        return None
    if var.op == "var":
        correction = var.args.get("correction")
        biased = correction == 0 if correction is not None else var.args.get("unbiased") is False
        return [] if var.args.get("input") == x and biased else None
    square = _node(var.args.get("input"), nodes)
    if var.op != "mean" or var.args.get("dtype") is not None or square is None:
        return None
    me = Ref("node", c.name)
    if square.op == "mul" and square.args.get("input") == me and square.args.get("other") == me:
        return [square.name]
    if square.op == "pow" and square.args.get("input") == me and square.args.get("exponent") == 2:
        return [square.name]
    return None


def _softmax(ir: ProgramIR, y: OpNode, nodes: _Nodes, users: dict[str, list[str]]) -> OpNode | None:
    """The ``softmax`` of ``e / e.sum(d)`` or the ``log_softmax`` of ``s - log(e.sum(d))``,
    with ``e = exp(s)`` and ``s = x - x.amax(d)``, or ``None``."""
    a, b = _node(y.args.get("input"), nodes), _node(y.args.get("other"), nodes)
    log: OpNode | None = None
    if y.op == "div" and y.args.get("rounding_mode") is None and a is not None:
        op, e, total = "softmax", a, b
    elif y.op == "sub" and y.args.get("alpha", 1) == 1 and b is not None and b.op == "log":
        op, log = "log_softmax", b
        total = _node(log.args.get("input"), nodes)
        e = _node(total.args.get("input"), nodes) if total is not None else None
    else:
        return None
    if e is None or e.op != "exp" or total is None or total.op != "sum":
        return None
    shifted = _node(e.args.get("input"), nodes)
    if shifted is None or shifted.op != "sub" or shifted.args.get("alpha", 1) != 1:
        return None
    if total.args.get("input") != Ref("node", e.name) or (log and a is not shifted):
        return None
    x, peak = shifted.args.get("input"), _node(shifted.args.get("other"), nodes)
    shape = ir.shapes.get(x) if isinstance(x, Ref) else None
    if peak is None or peak.op != "amax" or peak.args.get("input") != x or shape is None:
        return None
    dim = _one_dim(peak.args.get("dim"), len(shape))
    if dim is None or _one_dim(total.args.get("dim"), len(shape)) != dim:
        return None
    if not (peak.args.get("keepdim") and total.args.get("keepdim")) or total.args.get("dtype"):
        return None
    if tuple(y.shape) != tuple(shape):
        return None
    readers = {
        peak.name: {shifted.name},
        shifted.name: {e.name, *([y.name] if log else [])},
        e.name: {total.name, *([] if log else [y.name])},
        total.name: {log.name if log else y.name},
        **({log.name: {y.name}} if log else {}),
    }
    if not _read_only_within(users, readers):
        return None
    if any(ir.dtypes.get(Ref("node", n), "float32") != "float32" for n in [*readers, y.name]):
        return None
    kwargs = {"dim": dim, "dtype": None}
    return OpNode(
        name=y.name,
        op=op,
        args={"input": x, **kwargs},
        shape=tuple(y.shape),
        dtype=y.dtype,
        call=f"torch.nn.functional.{op}",
        call_args=[x],
        call_kwargs=kwargs,
    )


def _one_dim(dim: Any, ndim: int) -> int | None:
    """The one reduced dim (non-negative), or ``None`` for none or several."""
    dims = dim if isinstance(dim, list | tuple) else [dim]
    if ndim == 0 or len(dims) != 1 or dims[0] is None:
        return None
    return int(dims[0]) % ndim
