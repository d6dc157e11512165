"""The program IR: tensors, canonical op nodes and fusion groups.

The capture step lowers a traced PyTorch program into ``ProgramIR``: a topologically ordered list
of ``OpNode`` whose arguments are ``Ref`` (to an input, a parameter or another node) or Python
constants, with static shapes and the strides our own buffers will have. The scheduler groups nodes
into ``Group`` (one kernel each, usually): a pointwise expression DAG, or an anchor (reduction,
normalisation, softmax, GEMM, convolution) with pointwise producers fused as prologue and consumers
as epilogue. Everything downstream (plan, emission) reads these few types only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from stitch_graph.artifacts import Task

__all__ = [
    "Group",
    "GroupKind",
    "OpNode",
    "ParamSpec",
    "ProgramIR",
    "Ref",
    "contiguous_strides",
    "gemm_loop_dim",
    "layout_without",
    "looped_batch_dim",
    "matrix_layout",
    "numel",
    "reduction_runs",
    "row_layout",
]

RefKind = Literal["input", "param", "node"]
GroupKind = Literal[
    "pointwise", "reduction", "norm", "softmax", "gemm", "conv", "rnn", "scatter", "attention"
]


def numel(shape: tuple[int, ...] | list[int]) -> int:
    """Number of elements of ``shape``."""
    n = 1
    for d in shape:
        n *= int(d)
    return n


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major strides of ``shape``."""
    strides: list[int] = []
    acc = 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= max(int(d), 1)
    return tuple(reversed(strides))


@dataclass(frozen=True)
class Ref:
    """A tensor value: a forward input, a parameter/buffer (dotted name) or a node's output."""

    kind: RefKind
    name: str


@dataclass
class ParamSpec:
    """A parameter or buffer of the reference module, under its dotted ``state_dict`` name."""

    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"
    buffer: bool = False
    persistent: bool = True
    value: list[Any] | None = None  # baked values of non-persistent buffers and constants


@dataclass
class OpNode:
    """One canonical op of the program.

    Attributes:
        name: Unique node name (from the trace), a valid Python identifier.
        op: Canonical op name, a key of the op registry (or an unknown name).
        args: Bound arguments by signature name; tensors are ``Ref``.
        shape: Output shape.
        dtype: Output dtype name.
        call: Python callable of the original call (``torch.nn.functional.gelu``) or
            ``.method`` for a tensor method, used when the node runs in PyTorch.
        call_args: Original positional arguments (``Ref`` for tensors).
        call_kwargs: Original keyword arguments.
        attrs: Lowering details (e.g. broadcast shapes of per-channel operands).
    """

    name: str
    op: str
    args: dict[str, Any]
    shape: tuple[int, ...]
    dtype: str = "float32"
    call: str = ""
    call_args: list[Any] = field(default_factory=list)
    call_kwargs: dict[str, Any] = field(default_factory=dict)
    attrs: dict[str, Any] = field(default_factory=dict)

    def tensor_refs(self) -> list[Ref]:
        """Tensor operands in argument order (nested lists included)."""
        refs: list[Ref] = []

        def walk(value: Any) -> None:
            if isinstance(value, Ref):
                if value not in refs:
                    refs.append(value)
            elif isinstance(value, list | tuple):
                for v in value:
                    walk(v)

        for value in self.args.values():
            walk(value)
        return refs


@dataclass
class ProgramIR:
    """A captured program: inputs, parameters, nodes in program order and outputs."""

    task: Task
    inputs: list[tuple[str, tuple[int, ...] | None]]
    input_values: dict[str, Any]
    params: list[ParamSpec]
    nodes: list[OpNode]
    outputs: list[Ref]
    output_is_tuple: bool = False
    shapes: dict[Ref, tuple[int, ...]] = field(default_factory=dict)
    strides: dict[Ref, tuple[int, ...]] = field(default_factory=dict)
    dtypes: dict[Ref, str] = field(default_factory=dict)
    training: bool = True
    method: str = "fx"
    notes: list[str] = field(default_factory=list)
    # rewrites that changed the order in which a sum adds its terms: a program that misses the
    # tolerance by rounding alone is captured again without them (``exact_order``)
    reordered: list[str] = field(default_factory=list)
    exact_order: bool = False  # captured without them
    # name -> position in ``nodes``, checked on every use and rebuilt when passes have moved
    # nodes: a scan per look-up made capture quadratic (minutes on a 700-node unrolled loop)
    _position: dict[str, int] = field(default_factory=dict, init=False, repr=False, compare=False)

    def node(self, name: str) -> OpNode:
        """The node called ``name``."""
        nodes = self.nodes
        at = self._position.get(name, -1)
        if 0 <= at < len(nodes) and nodes[at].name == name:
            return nodes[at]
        self._position.clear()
        for i, n in enumerate(nodes):
            self._position.setdefault(n.name, i)
        at = self._position.get(name, -1)
        if at >= 0:
            return nodes[at]
        msg = f"no node named {name!r} in the program"
        raise KeyError(msg)

    def position(self, name: str) -> int:
        """Where the node called ``name`` stands in program order."""
        self.node(name)
        return self._position[name]

    def users(self) -> dict[str, list[str]]:
        """Node name -> names of the nodes that read it (outputs count as the user ``output``)."""
        users: dict[str, list[str]] = {n.name: [] for n in self.nodes}
        for n in self.nodes:
            for ref in n.tensor_refs():
                if ref.kind == "node" and n.name not in users[ref.name]:
                    users[ref.name].append(n.name)
        for ref in self.outputs:
            if ref.kind == "node":
                users[ref.name].append("output")
        return users

    def shape(self, ref: Ref) -> tuple[int, ...]:
        """Static shape of a tensor value."""
        return self.shapes[ref]

    def is_contiguous(self, ref: Ref) -> bool:
        """Whether our buffer for ``ref`` is row-major contiguous."""
        shape = self.shapes[ref]
        strides = self.strides.get(ref, contiguous_strides(shape))
        return all(
            s == c or d == 1
            for d, s, c in zip(shape, strides, contiguous_strides(shape), strict=True)
        )


@dataclass
class Group:
    """Nodes fused into one kernel (or one library call plus its epilogue kernel).

    Attributes:
        id: Stable id (``k0``, ``k1``, ...), also the plan item's id.
        kind: What the kernel is built around.
        anchor: The reduction/normalisation/GEMM/convolution node, ``None`` for pointwise.
        prologue: Pointwise nodes computed while loading the anchor's input.
        epilogue: Pointwise nodes applied to the anchor's result (all members for pointwise).
        output: The one node whose value the group writes to memory.
        siblings: Further reductions of the same rows, reduced in the anchor's pass (a mean
            beside a logsumexp, two distances from one anchor): the rows are read once.
        before: A reduction of the same rows whose per-row results this group's loads read
            (``mean(x - lse)``): reduced first in the same kernel, each row then read again,
            from cache where it fits, where a second kernel read it from memory.
    """

    id: str
    kind: GroupKind
    anchor: str | None
    prologue: list[str]
    epilogue: list[str]
    output: str
    siblings: list[str] = field(default_factory=list)
    before: Group | None = None

    @property
    def anchors(self) -> list[str]:
        """The anchor and its siblings (empty for pointwise)."""
        return [self.anchor, *self.siblings] if self.anchor else []

    @property
    def members(self) -> list[str]:
        """All node names in evaluation order."""
        first = self.before.members if self.before is not None else []
        return [*first, *self.prologue, *self.anchors, *self.epilogue]


def matrix_layout(shape: tuple[int, ...], strides: tuple[int, ...]) -> tuple[bool, int, int] | None:
    """How a GEMM operand sits in memory: ``(transposed, ld, batch_stride)``, or ``None``.

    The last two dims are the matrix; it must be row-major (``transposed=False``) or column-major
    (``transposed=True``) with a leading dimension, and all leading dims must collapse into one
    batch dim with a single stride (0 when broadcast), as cuBLAS strided-batched GEMM needs.
    """
    if len(shape) < 2:
        return None
    rows, cols = shape[-2], shape[-1]
    s_r, s_c = strides[-2], strides[-1]
    # rows (or columns) that overlap, a broadcast's stride 0 among them, have no leading dim
    if (s_c == 1 or cols == 1) and (rows == 1 or s_r >= cols):
        transposed, ld = False, max(s_r if rows > 1 else cols, cols)
    elif (s_r == 1 or rows == 1) and (cols == 1 or s_c >= rows):
        transposed, ld = True, max(s_c if cols > 1 else rows, rows)
    else:
        return None
    batch_dims = [(d, s) for d, s in zip(shape[:-2], strides[:-2], strict=True) if d != 1]
    if not batch_dims:
        return transposed, ld, 0
    batch_stride = batch_dims[-1][1]
    expected = batch_stride
    for d, s in reversed(batch_dims):
        if s != expected:
            return None
        expected = s * d
    return transposed, ld, batch_stride


def rows_layout(
    shape: tuple[int, ...], strides: tuple[int, ...], width: int
) -> tuple[int, int, int, int, int, int] | None:
    """How a linear's input rows (their last dim contiguous) and its contiguous output rows of
    ``width`` are cut into one strided-batched GEMM: ``(rows, lda, batch_stride_a, ldc,
    batch_stride_c, batch)``, the leading dim with the most rows as the rows and the others
    collapsing into one batch stride in both, or ``None``.

    A batch-first activation seen sequence-first (``x.transpose(0, 1)``, as
    ``nn.MultiheadAttention`` sees it) is then 8 GEMMs of 256 rows, not 256 of 8."""
    if len(shape) < 2 or strides[-1] != 1:
        return None
    out = contiguous_strides((*shape[:-1], width))
    lead = [(d, s, o) for d, s, o in zip(shape[:-1], strides[:-1], out[:-1], strict=True) if d != 1]
    if not lead:
        return None
    best = None
    for pick in range(len(lead)):
        rows, lda, ldc = lead[pick]
        if lda < shape[-1] and rows > 1:
            continue  # rows that overlap
        rest = [x for i, x in enumerate(lead) if i != pick]
        a = matrix_layout((*(d for d, _, _ in rest), 1, shape[-1]), (*(s for _, s, _ in rest), 0, 1))
        c = matrix_layout((*(d for d, _, _ in rest), 1, width), (*(o for _, _, o in rest), 0, 1))
        if a is None or c is None or (best is not None and rows <= best[0]):
            continue
        best = (rows, lda, a[2], ldc, c[2], numel(tuple(d for d, _, _ in rest)))
    return best


GEMM_LOOP_MOST = 16  # calls a looped GEMM makes at most: each costs host time


def looped_batch_dim(
    batch: tuple[int, ...], operands: list[tuple[tuple[int, ...], tuple[int, ...]]]
) -> int | None:
    """A batch dim to loop over, a strided-batched GEMM call for each of its indices, where
    the operands' (shape, strides) collapse into one batch stride once it is taken out: the
    heads of attention's q and k split from one (B, T, 3C) projection are (B, H) batches
    ``T * 3C`` and ``D`` apart, which one stride cannot step, and B alone can. The shortest
    such dim of at most ``GEMM_LOOP_MOST``; ``None`` where there is none."""
    for o in sorted(range(len(batch)), key=lambda d: batch[d]):
        if batch[o] > GEMM_LOOP_MOST:
            continue
        if all(
            tuple(shape[:-2]) == tuple(batch) and layout_without(shape, strides, o) is not None
            for shape, strides in operands
        ):
            return o
    return None


def layout_without(
    shape: tuple[int, ...], strides: tuple[int, ...], d: int
) -> tuple[bool, int, int] | None:
    """``matrix_layout`` of the operand with its batch dim ``d`` taken out (one call of a
    looped product reads it so)."""
    return matrix_layout((*shape[:d], *shape[d + 1 :]), (*strides[:d], *strides[d + 1 :]))


def gemm_loop_dim(ir: ProgramIR, node: OpNode) -> int | None:
    """``looped_batch_dim`` of a ``matmul``/``bmm`` node's operands as they lie and its
    (contiguous) result; ``None`` for other GEMMs."""
    a, b = node.args.get("input"), node.args.get("other")
    if node.op not in ("matmul", "bmm") or not isinstance(a, Ref) or not isinstance(b, Ref):
        return None
    if a not in ir.strides or b not in ir.strides or len(node.shape) < 3:
        return None
    shape = tuple(node.shape)
    operands = [(ir.shapes[r], ir.strides[r]) for r in (a, b)]
    return looped_batch_dim(shape[:-2], [*operands, (shape, contiguous_strides(shape))])


def reduction_runs(shape: tuple[int, ...], dims: list[int]) -> list[tuple[int, bool]]:
    """``shape`` as runs of adjacent dims, each ``(elements, reduced)``, neighbours of the same
    kind merged: ``(N, C, H, W)`` over ``(0, 2, 3)`` is ``[(N, True), (C, False), (H*W, True)]``.
    """
    nd = len(shape)
    reduced = {d % nd for d in dims} if dims else set(range(nd))
    runs: list[tuple[int, bool]] = []
    for d, size in enumerate(shape):
        if size == 1:
            continue  # a dim of one is in no run: it changes no index
        if runs and runs[-1][1] == (d in reduced):
            runs[-1] = (runs[-1][0] * size, runs[-1][1])
        else:
            runs.append((size, d in reduced))
    return runs


def row_layout(shape: tuple[int, ...], dims: list[int]) -> tuple[int, int, int] | None:
    """``(outer, length, inner)`` of reducing ``shape`` over ``dims``, or ``None``.

    ``dims`` must be one run of adjacent dims; an empty list means all dims.
    """
    nd = len(shape)
    if nd == 0:
        return 1, 1, 1
    norm = sorted({d % nd for d in dims}) if dims else list(range(nd))
    if norm != list(range(norm[0], norm[-1] + 1)):
        return None
    outer = numel(shape[: norm[0]])
    length = numel(shape[norm[0] : norm[-1] + 1])
    inner = numel(shape[norm[-1] + 1 :])
    return outer, length, inner
