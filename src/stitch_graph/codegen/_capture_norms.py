"""Hand-written layer norms recognised as the ``layer_norm`` they compute.

``(x - x.mean(-1, keepdim=True)) / torch.sqrt(var + eps)`` with the variance written as the mean
of the squared deviations (or ``x.var(..., unbiased=False)``) is two dependent row reductions.
Scheduled as written, they become two kernels, and the first writes the centred tensor for the
second to read back: two reads and two writes where ``layer_norm`` takes one of each (0.57x of
``torch.compile`` on an H100 for a (8192, 4096) layer norm written so). As one ``layer_norm``
node, the row kernel holds each row in registers, and a following affine ``* weight + bias``
fuses into it as its epilogue. Only the exact forms are taken: normalised over trailing dims,
``eps`` inside the square root, every intermediate read by the chain alone.
"""

from __future__ import annotations

from typing import Any

from stitch_graph.codegen.ir import OpNode, ProgramIR, Ref

_Nodes = dict[str, OpNode]


def recognize_layer_norms(ir: ProgramIR) -> None:
    """Replace each hand-written layer norm's last node by one ``layer_norm`` node of the same
    name; the chain it replaces is left without readers for dead-node elimination."""
    nodes = {n.name: n for n in ir.nodes}
    users = ir.users()
    for position, node in enumerate(ir.nodes):
        norm = _layer_norm(ir, node, nodes, users)
        if norm is not None:
            ir.nodes[position] = norm
            nodes[norm.name] = norm
            users = ir.users()


def _layer_norm(ir: ProgramIR, y: OpNode, nodes: _Nodes, users: dict[str, list[str]]) -> OpNode | None:
    """The ``layer_norm`` node that ``y`` computes, or ``None`` when it is not one."""
    centred, inv = _scaled(y, nodes)
    if centred is None or inv is None or inv.op not in ("sqrt", "rsqrt"):
        return None
    shifted = _node(inv.args.get("input"), nodes)
    if shifted is None or shifted.op != "add" or shifted.args.get("alpha", 1) != 1:
        return None
    var, eps = _node(shifted.args.get("input"), nodes), shifted.args.get("other")
    if not isinstance(eps, int | float) or isinstance(eps, bool) or var is None:
        return None
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
    square = _variance_input(var, c, x, dims, nodes, len(shape))
    if square is False:
        return None
    chain = [mean.name, var.name, shifted.name, inv.name] + ([square] if square else [])
    readers = {mean.name: {c.name}, var.name: {shifted.name}, shifted.name: {inv.name},
               inv.name: {y.name}, c.name: {y.name, *([square] if square else [])}}
    if square:
        readers[square] = {var.name}
    if any(set(users.get(n, ())) - readers[n] for n in [*chain, c.name]):
        return None  # an intermediate is read elsewhere (or is an output): keep the chain
    if any(ir.dtypes.get(Ref("node", n), "float32") != "float32" for n in [*chain, y.name]):
        return None
    normalized = tuple(shape[len(shape) - len(dims):])
    kwargs = {"weight": None, "bias": None, "eps": float(eps)}
    return OpNode(
        name=y.name,
        op="layer_norm",
        args={"input": x, "normalized_shape": normalized, **kwargs},
        shape=tuple(y.shape),
        dtype=y.dtype,
        call="torch.nn.functional.layer_norm",
        call_args=[x, normalized],
        call_kwargs=kwargs,
    )


def _node(value: Any, nodes: _Nodes) -> OpNode | None:
    return nodes.get(value.name) if isinstance(value, Ref) and value.kind == "node" else None


def _scaled(y: OpNode, nodes: _Nodes) -> tuple[Ref | None, OpNode | None]:
    """``(centred, sqrt node)`` of ``centred / sqrt(...)``, or ``(centred, rsqrt node)`` of
    ``centred * rsqrt(...)`` in either order."""
    a, b = y.args.get("input"), y.args.get("other")
    if y.op == "div" and y.args.get("rounding_mode") is None:
        den = _node(b, nodes)
        if isinstance(a, Ref) and a.kind == "node" and den is not None and den.op == "sqrt":
            return a, den
    if y.op == "mul":
        for centred, scale in ((a, b), (b, a)):
            inv = _node(scale, nodes)
            if isinstance(centred, Ref) and centred.kind == "node" and inv is not None:
                if inv.op == "rsqrt":
                    return centred, inv
    return None, None


def _row_mean(mean: OpNode, x: Ref) -> bool:
    return (
        mean.op == "mean"
        and mean.args.get("input") == x
        and bool(mean.args.get("keepdim"))
        and mean.args.get("dtype") is None
    )


def _trailing(dim: Any, ndim: int) -> tuple[int, ...] | None:
    """The reduced dims when they are the last ones (each once), else ``None``."""
    if ndim == 0 or dim is None:
        return None
    dims = sorted({int(d) % ndim for d in (dim if isinstance(dim, list | tuple) else [dim])})
    return tuple(dims) if dims == list(range(ndim - len(dims), ndim)) else None


def _variance_input(
    var: OpNode, c: OpNode, x: Ref, dims: tuple[int, ...], nodes: _Nodes, ndim: int
) -> str | None | bool:
    """How the chain's variance is computed: the name of the squared deviations it averages,
    ``None`` for ``x.var(..., unbiased=False)``, ``False`` when it is no biased variance over
    ``dims``."""
    if _trailing(var.args.get("dim"), ndim) != dims or not var.args.get("keepdim"):
        return False
    if var.op == "var":
        correction = var.args.get("correction")
        biased = correction == 0 if correction is not None else var.args.get("unbiased") is False
        return None if var.args.get("input") == x and biased else False
    square = _node(var.args.get("input"), nodes)
    if var.op != "mean" or var.args.get("dtype") is not None or square is None:
        return False
    me = Ref("node", c.name)
    if square.op == "mul" and square.args.get("input") == me and square.args.get("other") == me:
        return square.name
    if square.op == "pow" and square.args.get("input") == me and square.args.get("exponent") == 2:
        return square.name
    return False
