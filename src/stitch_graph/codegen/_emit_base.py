"""Shared core of kernel emission: constants, ``EmitError``, kernel parameter lists (``_Args``),
literals and broadcast offsets, and ``_EmitterBase`` with the expression and pointwise emitters.

Every other emitter module builds on this one: a group's member ops become CUDA expressions here
(``exprs``; ``indexed`` for ops that read other positions, one rule per op in ``_INDEXED_RULES``;
``value_of``), and fused pointwise kernels (grid-stride, with a float4 twin) are written by
``pointwise``. The mixins for reductions, softmax/norms, convolutions, pooling/scans and GEMMs
subclass ``_EmitterBase``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from stitch_graph.codegen._cat_slices import CatSlice
from stitch_graph.codegen._emit_transpose import TILE_THREADS, plan_tile, tile_kernel, tile_read
from stitch_graph.codegen._indexed_rules import index_position, own_position_operands
from stitch_graph.codegen.ir import OpNode, ProgramIR, Ref, contiguous_strides, numel, row_layout
from stitch_graph.codegen.ops import INDEXED, lookup
from stitch_graph.codegen.tuning import KernelTuning, Tuning

_CTYPE = {"float32": "float", "bool": "bool", "int64": "long long", "int32": "int"}
_TORCH_DTYPE = {
    "float32": "torch.float32", "bool": "torch.bool", "int64": "torch.int64", "int32": "torch.int32",
}
_MAX_GRID = 132 * 32
_SMS = 132


def _grid_stride_blocks(n: int, block: int, waves: int) -> int:
    """Blocks of a grid-stride loop over ``n`` items: ``waves`` blocks per SM at most (each
    thread walks several items), 0 (the default) for one item each."""
    cap = _SMS * waves if waves > 0 else 2**31 - 1
    return max(1, min(math.ceil(n / block), cap))


class EmitError(ValueError):
    """The plan asks for something the emitter cannot produce."""


def _line_layout(shape: tuple[int, ...], dim: int) -> tuple[int, int, int, str]:
    """The lines along ``dim`` of a contiguous tensor of ``shape``: their length, the stride
    ``inner`` between a line's elements, their count, and where line ``r`` starts (an
    expression of ``r``)."""
    outer, length, inner = row_layout(shape, [dim]) if shape else (1, 1, 1)
    base = f"(r / {inner}) * {length * inner} + r % {inner}" if inner > 1 else f"r * {length}"
    return length, inner, outer * inner, base


_INTEGER_LIMITS = {"long long": 2**63 - 1, "int": 2**31 - 1}


def _scalar(value: Any, default: Any, integer: str | None = None) -> str:
    """A non-tensor argument as a pointwise template spells it: ``None`` as its default, a
    string (a dtype, a mode) as ``0``, a number as a literal; in integer arithmetic (``integer``
    names the result's C type) an integer one, an infinite bound the type's limit."""
    if value is None or value is ...:
        value = default
        if value in (None, ...):
            return "0.f"
    if isinstance(value, str):
        return "0"
    if integer is None or isinstance(value, bool):
        return _literal(value)
    if isinstance(value, float) and math.isinf(value):
        limit = _INTEGER_LIMITS[integer]
        value = limit if value > 0 else -limit - 1
    if isinstance(value, int):  # the most negative long long has no literal of its own
        return f"(({integer})({value + 1}LL - 1))" if value == -(2**63) else f"(({integer}){value}LL)"
    return _literal(value)


_INTEGER_TYPES = ("int64", "int32")
# templates whose float form rounds or leaves float: their integer form (``_cuda``'s overloads)
_INTEGER_TEMPLATES = {
    "remainder": "sg_mod({input}, {other})",
    "abs": "sg_abs({input})",
    "fmod": "(({input}) % ({other}))",  # truncated, the dividend's sign, as torch.fmod
    "floor": "({input})",
    "ceil": "({input})",
    "trunc": "({input})",
    "round": "({input})",  # of integers only with decimals=0, which PyTorch alone allows
    "fmax": "sg_max({input}, {other})",
    "fmin": "sg_min({input}, {other})",
    "pow": "sg_powi({input}, {exponent})",
}


def _integer_arithmetic(ir: ProgramIR, node: OpNode) -> str | None:
    """The C type ``node`` computes in when it computes integers from integers (and
    booleans): exactly, as PyTorch does, not through float32, which holds integers only up
    to 2**24 (a hash such as ``ids * 1000003 % buckets``). Every operand is cast to it, so
    that the int and long long overloads of ``sg_max`` and the like are never ambiguous."""
    if node.dtype not in _INTEGER_TYPES:
        return None
    kinds = (*_INTEGER_TYPES, "bool")
    if any(ir.dtypes.get(ref, "float32") not in kinds for ref in node.tensor_refs()):
        return None
    return _CTYPE[node.dtype]


def _operand_type(ir: ProgramIR, node: OpNode, ref: Ref, integer: str | None) -> str | None:
    """The C type an operand is cast to: the integer type of integer arithmetic, or float
    where a float result takes an integer tensor (``a / b`` of int64 is a true division, and
    ``maximum(ids, x)`` compares in float), as PyTorch promotes; ``None``: loaded as it is."""
    if integer:
        return integer
    if node.dtype == "float32" and ir.dtypes.get(ref, "float32") in _INTEGER_TYPES:
        return "float"
    return None


def _pointwise_template(ir: ProgramIR, node: OpNode, info: Any) -> tuple[str | None, str | None]:
    """The op's expression template for ``node`` and the integer type it computes in, if any."""
    integer = _integer_arithmetic(ir, node)
    template = info.template(node.args)
    if integer and template is not None:
        template = _INTEGER_TEMPLATES.get(node.op, template)
    return template, integer


def _literal(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        f = float(value)
        if math.isnan(f):
            return "SG_NAN"
        if math.isinf(f):
            return "SG_INF" if f > 0 else "(-SG_INF)"
        return f"{f!r}f"
    msg = f"cannot use {value!r} as a CUDA literal"
    raise EmitError(msg)


def _offset(
    shape: tuple[int, ...], strides: tuple[int, ...], space: tuple[int, ...], idx: str
) -> str:
    """Element offset of a (broadcast) operand at linear index ``idx`` of ``space``."""
    if tuple(shape) == tuple(space) and tuple(strides) == contiguous_strides(tuple(space)):
        return idx
    lead = len(space) - len(shape)
    terms: list[str] = []
    for d, (size, stride) in enumerate(zip(shape, strides, strict=True)):
        if size == 1 or stride == 0:
            continue
        inner = numel(space[lead + d + 1 :])
        coord = f"({idx} / {inner})" if inner > 1 else idx
        if lead + d > 0:
            coord = f"({coord} % {space[lead + d]})"
        terms.append(coord if stride == 1 else f"{coord} * {stride}")
    return " + ".join(terms) or "0"


def _row_offset(
    shape: tuple[int, ...], strides: tuple[int, ...], space: tuple[int, ...], length: int
) -> str | None:
    """Offset of an operand that is the same at every element of a row (the trailing dims of
    ``space`` holding ``length`` elements), written with the row ``r`` alone; ``None`` for an
    operand that varies along the row."""
    tail, count = 0, 1
    while count < length and tail < len(space):
        tail += 1
        count *= space[-tail]
    if count != length or length < 2:
        return None
    lead, rows = len(space) - len(shape), len(space) - tail
    kept = max(0, rows - lead)  # operand dims outside the row
    if any(size != 1 and stride != 0 for size, stride in zip(shape[kept:], strides[kept:])):
        return None
    return _offset(shape[:kept], strides[:kept], space[:rows], "r") if kept else "0"


@dataclass
class _Args:
    """Tensor parameters of one kernel, in the order host code passes them.

    ``row``: ``(space, length)`` in a kernel whose element ``i`` of ``space`` is ``r * length +
    k``. An operand constant along the row (a per-row scale, an embedding's token id) is then
    indexed from ``r`` alone, so nvcc hoists its load out of the row's loop instead of dividing
    ``i`` for every element (a logsumexp with a per-channel temperature was issue-bound on it).
    """

    ir: ProgramIR
    refs: list[Ref] = field(default_factory=list)
    vector: bool = False
    vec_refs: list[Ref] = field(default_factory=list)
    row: tuple[tuple[int, ...], int] | None = None
    tiles: dict[Ref, str] = field(default_factory=dict)  # operand -> its shared-memory tile
    tile_space: tuple[int, ...] = ()
    tile_missed: bool = False  # a tiled operand was read at another element than ``i``
    written: set[Ref] = field(default_factory=set)  # results stored beside, by ``store``

    def row_length(self, space: tuple[int, ...], idx: str) -> int:
        """The row length when ``idx`` of ``space`` is ``r * length + k`` here, else 0."""
        if self.row is None or idx != "i" or tuple(space) != self.row[0]:
            return 0
        return self.row[1]

    def param(self, ref: Ref) -> str:
        if ref in self.tiles:
            self.tile_missed = True  # read by its pointer (an indexed op's own offset)
        if ref not in self.refs:
            self.refs.append(ref)
        return f"a{self.refs.index(ref)}"

    def load(
        self, ref: Ref, space: tuple[int, ...], idx: str, bshape: tuple[int, ...] | None = None
    ) -> str:
        if ref in self.tiles:
            if idx == "i" and bshape is None and tuple(space) == self.tile_space:
                if ref not in self.refs:
                    self.refs.append(ref)
                return self.tiles[ref]
            self.tile_missed = True
        name = self.param(ref)
        shape = tuple(bshape) if bshape else self.ir.shapes[ref]
        strides = contiguous_strides(shape) if bshape else self.ir.strides[ref]
        full = shape == tuple(space) and tuple(strides) == contiguous_strides(tuple(space))
        if self.vector and full and self.ir.dtypes.get(ref, "float32") == "float32":
            if ref not in self.vec_refs:
                self.vec_refs.append(ref)
            return f"(&{name}v.x)[l]"
        length = self.row_length(space, idx)
        offset = _row_offset(shape, tuple(strides), tuple(space), length) if length else None
        if offset is not None:
            return f"{name}[{offset}]"
        return f"{name}[{_offset(shape, strides, space, idx)}]"

    def store(self, ref: Ref) -> str:
        """The parameter a result stored beside the kernel's own is written through (passed
        with the operands, in their order, not ``const``)."""
        self.written.add(ref)
        return self.param(ref)

    def signature(self, extra: list[str]) -> str:
        params = [
            f"{'' if r in self.written else 'const '}"
            f"{_CTYPE.get(self.ir.dtypes.get(r, 'float32'), 'float')}* __restrict__ a{i}"
            for i, r in enumerate(self.refs)
        ]
        return ", ".join(params + extra)


@dataclass(frozen=True)
class _Position:
    """The output element an indexed op computes: linear index ``idx`` of ``space``, with the
    op's output ``shape`` aligned right against ``space`` (it may be broadcast into it)."""

    ir: ProgramIR
    shape: tuple[int, ...]
    space: tuple[int, ...]
    idx: str
    row: int = 0  # ``idx`` is ``r * row + k`` (see ``_Args.row``), 0 where it is not

    @property
    def nd(self) -> int:
        """Rank of the op's output, at least 1 (``dim`` arguments are taken modulo it)."""
        return max(len(self.shape), 1)

    def coord(self, d: int) -> str:
        """Coordinate of the output element along dim ``d`` of the op's output."""
        lead = len(self.space) - len(self.shape)
        inner = numel(self.space[lead + d + 1 :])
        if self.row and inner % self.row == 0:  # a dim outside the row: from the row alone
            rows = inner // self.row
            return f"(int)(({f'r / {rows}' if rows > 1 else 'r'}) % {self.space[lead + d]})"
        c = f"({self.idx} / {inner})" if inner > 1 else f"({self.idx})"
        return f"(int)({c} % {self.space[lead + d]})"

    def base(self, ref: Ref, skip: set[int]) -> str:
        """Offset of ``ref`` at the output position, without the dims in ``skip``."""
        rshape = list(self.ir.shapes[ref])
        rlead = len(self.shape) - len(rshape)
        masked = tuple(1 if rlead + d in skip else n for d, n in enumerate(rshape))
        return _offset(masked, tuple(self.ir.strides[ref]), self.space, self.idx)

    def stride(self, ref: Ref, d: int) -> int:
        """Stride of ``ref`` along dim ``d`` of the op's output (0 where ``ref`` broadcasts)."""
        rshape = self.ir.shapes[ref]
        rd = d - (len(self.shape) - len(rshape))
        return 0 if rd < 0 or rshape[rd] == 1 else int(self.ir.strides[ref][rd])


def _moved(at: _Position, ref: Ref, coords: list[tuple[str, int]]) -> str:
    """Offset of ``ref`` at the output position with the coordinate along each dim ``d`` of
    ``coords`` replaced by its expression (a roll's or a pad's source element)."""
    terms = [f"{c} * {at.stride(ref, d)}" for c, d in coords if at.stride(ref, d)]
    return " + ".join([at.base(ref, {d for _, d in coords}), *terms])


def _aligned_launch(
    aligned: list[str], kernel: str, launch: tuple[int, int], py_args: str, scalar_launch: str
) -> list[str]:
    """Host lines choosing at run time: ``<kernel>_v4`` (float4) when every tensor named in
    ``aligned`` starts on a 16-byte boundary, else the scalar twin's ``scalar_launch``."""
    return [
        f"if _aligned({', '.join(aligned)}):",
        f"    KERNELS.{kernel}_v4({launch[0]}, {launch[1]}, {py_args})",
        "else:",
        f"    {scalar_launch}",
    ]


def _py(ref: Ref) -> str:
    if ref.kind == "param":
        return f"_get(self, {ref.name!r})"
    return ref.name


# Indexed op (``ops.INDEXED``) -> the name of the ``_EmitterBase`` method that builds its value at
# one output position (looked up on the instance, so overrides apply); a new indexed op is one
# method and one entry here, besides its name in ``ops.INDEXED``.
_INDEXED_RULES: dict[str, str] = {
    "cat": "_indexed_cat",
    "stack": "_indexed_stack",
    "interleave": "_indexed_interleave",
    "flip": "_indexed_flip",
    "gather": "_indexed_gather",
    "index": "_indexed_index",
    "roll": "_indexed_roll",
    "pad": "_indexed_pad",
    "triu": "_indexed_triangle",
    "tril": "_indexed_triangle",
    "setitem": "_indexed_setitem",
    "bucketize": "_indexed_bucketize",
}


_ELEMENT_STORE = re.compile(r"\bout\[i\] = ")  # a kernel's store of element i of its output
_ANY_STORE = re.compile(r"\bout\[")


class _EmitterBase:
    """State of one emission (the program, its tuning, the kernels so far, notes) and the
    expression and pointwise emitters every kernel style builds on."""

    def __init__(
        self, ir: ProgramIR, tuning: Tuning, cat_slices: dict[str, CatSlice] | None = None
    ) -> None:
        self.ir = ir
        self.tuning = tuning
        self.kernels: list[str] = []
        self.notes: list[str] = []
        self.cat_slices = cat_slices or {}  # output node -> its slice of a concatenation
        self.written_in_place: set[str] = set()
        # members their indexed reader computes (``_read``) -> the parameters it loads
        self.through: dict[str, tuple[str, ...]] = {}
        self._users: dict[str, list[str]] | None = None  # node -> its readers, when first asked

    # ---- expressions -------------------------------------------------------------------------
    def exprs(
        self,
        members: list[str],
        space: tuple[int, ...],
        idx: str,
        env: dict[str, str],
        args: _Args,
    ) -> list[str]:
        """The lines that compute ``members`` at element ``idx``, each value bound in ``env``.
        A value spelled as one already computed here (copies a reader was given of a cheap
        producer, ``_capture_recompute``, that met in one kernel) takes that one's name: the
        lines share one scope and element and hold no store, and the templates are pure."""
        lines: list[str] = []
        spelled: dict[str, str] = {}

        def bind(name: str, ctype: str, value: str) -> None:
            rhs = f"({ctype})({value})"
            if rhs in spelled:
                env[name] = spelled[rhs]
                return
            lines.append(f"const {ctype} v_{name} = {rhs};")
            env[name] = spelled[rhs] = f"v_{name}"

        for name in members:
            node = self.ir.node(name)
            info = lookup(node.op)
            if name in self.through:
                continue  # computed where its indexed reader reads it (``_read``)
            if node.op in INDEXED:
                ctype = _CTYPE.get(node.dtype, "float")
                bind(name, ctype, self.indexed(node, space, idx, args, env))
                continue
            template, integer = (None, None) if info is None else _pointwise_template(
                self.ir, node, info
            )
            if info is None or template is None:
                msg = f"node {name} ({node.op}) has no pointwise expression"
                raise EmitError(msg)
            values: dict[str, str] = {}
            bshapes = node.attrs.get("bshape", {})
            for pname, default in info.params:
                if "{" + pname + "}" not in template:
                    continue  # e.g. the dtype of zeros_like: nothing to load or spell
                value = node.args.get(pname, default)
                if isinstance(value, Ref):
                    if value.kind == "node" and value.name in env:
                        values[pname] = env[value.name]
                    else:
                        values[pname] = args.load(value, space, idx, bshapes.get(pname))
                    cast = _operand_type(self.ir, node, value, integer)
                    if cast:
                        values[pname] = f"(({cast}){values[pname]})"
                else:
                    values[pname] = _scalar(value, default, integer)
            bind(name, _CTYPE.get(node.dtype, "float"), template.format(**values))
        return lines

    def indexed(
        self, node: OpNode, space: tuple[int, ...], idx: str, args: _Args, env: dict[str, str]
    ) -> str:
        """Value of an op that reads its operands at other positions than the output's.

        The op's rule in ``_INDEXED_RULES`` builds it from the output position (``_Position``).
        Operands are always read from memory, never from fused values (see the scheduler).
        """
        rule = _INDEXED_RULES.get(node.op)
        if rule is None:
            msg = f"{node.name}: no indexed rule for {node.op}"
            raise EmitError(msg)
        at = _Position(self.ir, tuple(node.shape), space, idx, args.row_length(space, idx))
        return getattr(self, rule)(node, at, args, env)

    def _read(self, ref: Ref, args: _Args, offset: Callable[[Ref], str]) -> str:
        """The element of ``ref`` at ``offset(ref)``: a load, or, for a one-op producer its
        indexed reader computes (``self.through``, from ``_fusion_passes.read_through``), the op
        applied to its operands' elements at the same coordinates."""
        through = self.through.get(ref.name) if ref.kind == "node" else None
        if through is None:
            return f"{args.param(ref)}[{offset(ref)}]"
        node = self.ir.node(ref.name)
        info = lookup(node.op)
        template, integer = (None, None) if info is None else _pointwise_template(
            self.ir, node, info
        )
        if template is None:
            msg = f"node {node.name} ({node.op}) is read through but has no expression"
            raise EmitError(msg)
        values = {}
        for pname, default in info.params:
            value = node.args.get(pname, default)
            if "{" + pname + "}" not in template:
                continue
            if pname in through:
                values[pname] = self._read(value, args, offset)
                cast = _operand_type(self.ir, node, value, integer)
                if cast:
                    values[pname] = f"(({cast}){values[pname]})"
            else:
                values[pname] = _scalar(value, default, integer)
        return f"({template.format(**values)})"

    def _indexed_cat(
        self, node: OpNode, at: _Position, args: _Args, env: dict[str, str]
    ) -> str:
        """The operand whose slice holds the output coordinate along ``dim``."""
        ir = self.ir
        tensors = [t for t in node.args["tensors"] if isinstance(t, Ref)]
        dim = int(node.args.get("dim", 0)) % at.nd
        c = at.coord(dim)
        start = 0
        parts: list[tuple[int, str]] = []
        for ref in tensors:
            size = ir.shapes[ref][dim - (len(at.shape) - len(ir.shapes[ref]))]
            if size == 0:
                continue
            load = self._read(
                ref, args, lambda r, s=start: f"{at.base(r, {dim})} + ({c} - {s}) * {at.stride(r, dim)}"  # noqa: E501
            )
            start += size
            parts.append((start, load))
        value = parts[-1][1]
        for end, load in reversed(parts[:-1]):
            value = f"({c} < {end} ? {load} : {value})"
        return value

    def _indexed_stack(
        self, node: OpNode, at: _Position, args: _Args, env: dict[str, str]
    ) -> str:
        """The operand whose index along the new ``dim`` is the output coordinate."""
        ir = self.ir
        tensors = [t for t in node.args["tensors"] if isinstance(t, Ref)]
        dim = int(node.args.get("dim", 0)) % at.nd
        c = at.coord(dim)
        loads = []

        def offset(ref: Ref) -> str:
            rshape, rstrides = list(ir.shapes[ref]), list(ir.strides[ref])
            rd = dim - (len(at.shape) - 1 - len(rshape))
            masked = tuple(rshape[:rd] + [1] + rshape[rd:])
            strides = tuple(rstrides[:rd] + [0] + rstrides[rd:])
            return _offset(masked, strides, at.space, at.idx)

        for ref in tensors:
            loads.append(self._read(ref, args, offset))
        value = loads[-1]
        for k in range(len(loads) - 2, -1, -1):
            value = f"({c} == {k} ? {loads[k]} : {value})"
        return value

    def _indexed_interleave(
        self, node: OpNode, at: _Position, args: _Args, env: dict[str, str]
    ) -> str:
        """Operand ``c % k`` of the ``k`` at coordinate ``c / k`` along ``dim``."""
        tensors = [t for t in node.args["tensors"] if isinstance(t, Ref)]
        k = len(tensors)
        dim = int(node.args["dim"]) % at.nd
        c = at.coord(dim)

        def offset(ref: Ref) -> str:
            return f"{at.base(ref, {dim})} + ({c} / {k}) * {at.stride(ref, dim)}"

        loads = {ref: self._read(ref, args, offset) for ref in dict.fromkeys(tensors)}
        value = loads[tensors[-1]]
        for j in range(k - 2, -1, -1):
            if loads[tensors[j]] != value:
                value = f"({c} % {k} == {j} ? {loads[tensors[j]]} : {value})"
        return value

    def _indexed_flip(
        self, node: OpNode, at: _Position, args: _Args, env: dict[str, str]
    ) -> str:
        """The operand with the coordinate mirrored along each of ``dims``."""
        src: Ref = node.args["input"]
        raw = node.args.get("dims")
        dims = {int(d) % at.nd for d in (raw if isinstance(raw, list | tuple) else [raw])}

        def offset(ref: Ref) -> str:
            terms = [at.base(ref, dims)]
            for d in sorted(dims):
                terms.append(f"({at.shape[d] - 1} - {at.coord(d)}) * {at.stride(ref, d)}")
            return " + ".join(terms)

        return self._read(src, args, offset)

    def _indexed_gather(
        self, node: OpNode, at: _Position, args: _Args, env: dict[str, str]
    ) -> str:
        """The operand with the coordinate along ``dim`` replaced by the index operand's
        value (negative values wrap, then clamped into range)."""
        ir = self.ir
        src: Ref = node.args["input"]
        index: Ref = node.args["index"]
        dim = int(node.args["dim"]) % at.nd
        size = ir.shapes[src][dim]
        value = env.get(index.name) if index.kind == "node" else None
        value = value or f"{args.param(index)}[{_offset(ir.shapes[index], ir.strides[index], at.space, at.idx)}]"  # noqa: E501
        k = f"(long long)({value})"
        k = f"({k} < 0 ? {k} + {size} : {k})"
        k = f"min(max({k}, 0LL), {size - 1}LL)"
        return f"{args.param(src)}[{at.base(src, {dim})} + {k} * {at.stride(src, dim)}]"

    def _indexed_index(
        self, node: OpNode, at: _Position, args: _Args, env: dict[str, str]
    ) -> str:
        """Advanced indexing by one index tensor: its value (wrapped, clamped) replaces the
        coordinate along the indexed dim; the index's dims take the place of that dim."""
        ir = self.ir
        src: Ref = node.args["input"]
        d, index = index_position(ir, node) or (0, node.args["input"])
        rshape, rstrides = ir.shapes[src], ir.strides[src]
        k = len(ir.shapes[index])
        offset = " + ".join(
            [f"{at.coord(d + m)} * {s_}" for m, s_ in enumerate(ir.strides[index]) if ir.shapes[index][m] != 1]  # noqa: E501
        ) or "0"
        computed = env.get(index.name) if index in own_position_operands(ir, node) else None
        i = f"(long long)({computed or f'{args.param(index)}[{offset}]'})"
        i = f"min(max(({i} < 0 ? {i} + {rshape[d]} : {i}), 0LL), {rshape[d] - 1}LL)"
        terms = [f"{i} * {rstrides[d]}"]
        for j in range(len(rshape)):
            if j != d and rshape[j] != 1:
                terms.append(f"{at.coord(j if j < d else j + k - 1)} * {rstrides[j]}")
        return f"{args.param(src)}[{' + '.join(terms)}]"

    def _indexed_roll(
        self, node: OpNode, at: _Position, args: _Args, env: dict[str, str]
    ) -> str:
        """The operand with the coordinate shifted cyclically along each of ``dims``."""
        src: Ref = node.args["input"]
        shifts, dims = node.args["shifts"], node.args["dims"]
        shifts = list(shifts) if isinstance(shifts, list | tuple) else [shifts]
        if dims is None or dims == []:  # the flattened (contiguous) tensor rolled
            n = numel(at.shape)
            flat = " + ".join(
                f"{at.coord(d)} * {numel(at.shape[d + 1 :])}" for d in range(len(at.shape))
            )
            start = at.base(src, set(range(len(at.shape))))
            return f"{args.param(src)}[{start} + (({flat or 0}) + {(-int(shifts[0])) % n}) % {n}]"
        dims = [int(v) % at.nd for v in (dims if isinstance(dims, list | tuple) else [dims])]
        coords = [
            (f"(({at.coord(d)} + {(-int(shift)) % at.shape[d]}) % {at.shape[d]})", d)
            for shift, d in zip(shifts, dims, strict=True)
        ]
        return self._read(src, args, lambda ref: _moved(at, ref, coords))

    def _indexed_bucketize(
        self, node: OpNode, at: _Position, args: _Args, env: dict[str, str]
    ) -> str:
        """The count of boundaries below the operand's element (``right``: at or below it),
        by binary search of the sorted boundaries (``sg_bucket``): one row, or its own row."""
        src: Ref = node.args["input"]
        edges: Ref = node.args["boundaries"]
        value = (env.get(src.name) if src.kind == "node" else None) or self._read(
            src, args, lambda ref: at.base(ref, set())
        )
        n, stride = self.ir.shapes[edges][-1], self.ir.strides[edges][-1]
        right = "true" if node.args.get("right") else "false"
        row = f" + {at.base(edges, {len(at.shape) - 1})}" if len(self.ir.shapes[edges]) > 1 else ""
        return f"sg_bucket({args.param(edges)}{row}, {n}, {stride}, {value}, {right})"

    def _indexed_pad(
        self, node: OpNode, at: _Position, args: _Args, env: dict[str, str]
    ) -> str:
        """The operand shifted by the leading pads: outside it the fill value (``constant``),
        or the element mirrored at the edge (``reflect``), the edge's (``replicate``) or the
        other side's (``circular``)."""
        src: Ref = node.args["input"]
        pads = [int(v) for v in node.args["pad"]]
        rshape = self.ir.shapes[src]
        fill = node.args.get("value")
        mode = node.args.get("mode") or "constant"
        inside: list[str] = []
        coords: list[tuple[str, int]] = []
        for j in range(len(pads) // 2):
            d = len(at.shape) - 1 - j
            before = pads[2 * j]
            if before == 0 and pads[2 * j + 1] == 0:
                continue
            c = f"({at.coord(d)} - {before})"
            n = rshape[d]
            if mode == "reflect":
                c = f"({c} < 0 ? -{c} : ({c} >= {n} ? {2 * (n - 1)} - {c} : {c}))"
            elif mode == "replicate":
                c = f"min(max({c}, 0), {n - 1})"
            elif mode == "circular":
                c = f"({c} < 0 ? {c} + {n} : ({c} >= {n} ? {c} - {n} : {c}))"
            else:
                inside.append(f"{c} >= 0 && {c} < {n}")
            coords.append((c, d))
        load = self._read(src, args, lambda ref: _moved(at, ref, coords))
        if not inside:
            return load
        return f"(({' && '.join(inside)}) ? {load} : {_literal(float(fill or 0.0))})"

    def _indexed_triangle(
        self, node: OpNode, at: _Position, args: _Args, env: dict[str, str]
    ) -> str:
        """``triu`` / ``tril``: the value where the column minus the row is on the kept side of
        ``diagonal``, else zero."""
        src = node.args["input"]
        diagonal = int(node.args.get("diagonal", 0) or 0)
        row, col = at.coord(len(at.shape) - 2), at.coord(len(at.shape) - 1)
        value = self.value_of(src, at.space, at.idx, env, args)
        keep = f"{col} - {row} >= {diagonal}" if node.op == "triu" else (
            f"{col} - {row} <= {diagonal}"
        )
        return f"(({keep}) ? {value} : 0.f)"

    def _indexed_setitem(
        self, node: OpNode, at: _Position, args: _Args, env: dict[str, str]
    ) -> str:
        """``y[index] = value``: inside the region (every dim's coordinate on its slice or equal
        to its int) the value at the region's coordinate, broadcast as PyTorch broadcasts it;
        elsewhere ``y``."""
        base: Ref = node.args["input"]
        value = node.args["value"]
        inside: list[str] = []
        rel: list[str] = []  # the region's coordinates, int dims dropped
        for d, spec in enumerate(node.args["index"]):
            c = at.coord(d)
            if spec[0] == "int":
                inside.append(f"{c} == {spec[1]}")
            elif spec[0] == "slice":
                _, start, stop, step = spec
                inside.append(f"{c} >= {start} && {c} < {stop}")
                if step > 1:
                    inside.append(f"({c} - {start}) % {step} == 0")
                rel.append(f"(({c} - {start}) / {step})" if step > 1 else f"({c} - {start})")
            else:
                rel.append(c)
        if isinstance(value, Ref):
            vshape, vstrides = self.ir.shapes[value], self.ir.strides[value]
            lead = len(rel) - len(vshape)
            terms = [
                f"{rel[lead + j]} * {s_}"
                for j, (n, s_) in enumerate(zip(vshape, vstrides, strict=True))
                if n != 1
            ]
            new = f"{args.param(value)}[{' + '.join(terms) or '0'}]"
        elif node.dtype == "int64":
            new = f"{int(value)}LL"
        else:
            new = _literal(value if isinstance(value, bool) else float(value))
        old = self.value_of(base, at.space, at.idx, env, args)
        return f"(({' && '.join(inside) or 'true'}) ? {new} : {old})"

    def value_of(
        self, ref: Any, space: tuple[int, ...], idx: str, env: dict[str, str], args: _Args
    ) -> str:
        if isinstance(ref, Ref):
            if ref.kind == "node" and ref.name in env:
                return env[ref.name]
            return args.load(ref, space, idx)
        return _literal(ref)

    def stored_beside(self, members: list[str], out: OpNode) -> list[OpNode]:
        """The members besides ``out`` that something outside the kernel reads: stored too."""
        if self._users is None:
            self._users = self.ir.users()
        inside = set(members)
        return [
            self.ir.node(m) for m in members
            if m != out.name and any(u not in inside for u in self._users.get(m, []))
        ]

    # ---- pointwise -----------------------------------------------------------------------------
    def pointwise(
        self,
        gid: str,
        kernel: str,
        members: list[str],
        out: OpNode,
        tun: KernelTuning,
        anchor_line: Callable[[_Args, str], tuple[str, str]] | None = None,
    ) -> list[str]:
        """Emit a pointwise kernel (and its float4 twin); return the host launch lines. Members
        that kernels after this one read (or the program returns) are stored too, each into
        its own buffer of the output's shape (``_fusion_passes.joins_storing``)."""
        space = out.shape
        n = numel(space)
        dest = self.cat_slices.get(out.name)  # a concatenation's operand: stored in its slice
        index = "long long" if max(n, dest.total if dest else 0) >= 2**31 else "int"
        block = tun.block_size
        otype = _CTYPE.get(out.dtype, "float")
        store = dest.element("i") if dest else "i"
        target = dest.buffer if dest else out.name

        stored = self.stored_beside(members, out)
        outs = [f"{_CTYPE.get(m.dtype, 'float')}* __restrict__ out{k}" for k, m in enumerate(stored)]
        outs.append(f"{otype}* __restrict__ out")

        def body(args: _Args, idx: str) -> tuple[list[str], str, list[str]]:
            """The kernel's lines, its result's value, and the values stored beside it."""
            env: dict[str, str] = {}
            lines: list[str] = []
            if anchor_line is not None:
                name, line = anchor_line(args, idx)
                lines.append(line)
                env[name] = f"v_{name}"
            lines += self.exprs(members, space, idx, env, args)
            return lines, env[out.name], [env[m.name] for m in stored]

        if dest is not None:
            self.written_in_place.add(out.name)
        alloc = [
            f"{m.name} = torch.empty({list(space)}, device=_dev, "
            f"dtype={_TORCH_DTYPE.get(m.dtype, 'torch.float32')})"
            for m in [*stored, *([] if dest else [out])]
        ]
        args = _Args(self.ir)
        lines, result, beside = body(args, "i")
        tiled = tun.transpose_tile and not stored
        tile = plan_tile(self.ir, args.refs, tuple(space)) if tiled else None
        if tile is not None:
            targs = _Args(self.ir)
            loads = [targs.load(ref, space, "i") for ref in tile.refs]
            targs.tiles = {ref: tile_read(k) for k, ref in enumerate(tile.refs)}
            targs.tile_space = tuple(space)
            tlines, tresult, _ = body(targs, "i")
            if not targs.tile_missed and out.dtype == "float32":
                signature = targs.signature([f"{otype}* __restrict__ out"])
                self.kernels.append(
                    tile_kernel(tile, kernel, signature, index, loads, tlines, store, tresult)
                )
                py_args = ", ".join([*(_py(r) for r in targs.refs), target])
                return [*alloc, f"KERNELS.{kernel}({tile.tiles}, {TILE_THREADS}, {py_args})"]
        unroll = f"#pragma unroll {tun.unroll}\n  " if tun.unroll > 1 else ""
        src = [
            f'extern "C" __global__ __launch_bounds__({block}) void {kernel}('
            f"{args.signature(outs)}) {{",
            f"  {unroll}for ({index} i = ({index})blockIdx.x * {block} + threadIdx.x; i < {n}; "
            f"i += ({index})gridDim.x * {block}) {{",
            *(f"    {line}" for line in lines),
            *(f"    out{k}[i] = {value};" for k, value in enumerate(beside)),
            f"    out[{store}] = {result};",
            "  }",
            "}",
        ]
        self.kernels.append("\n".join(src))
        grid = _grid_stride_blocks(n, block, tun.grid_waves)
        py_args = ", ".join([*(_py(r) for r in args.refs), *(m.name for m in stored), target])
        scalar_launch = f"KERNELS.{kernel}({grid}, {block}, {py_args})"
        vector_ok = tun.vector_width == 4 and n % 4 == 0 and n >= 4 and all(
            m.dtype == "float32" for m in [*stored, out]
        )
        if not vector_ok or (dest is not None and not dest.vector_ok):
            return [*alloc, scalar_launch]
        vargs = _Args(self.ir, vector=True)
        vlines, vresult, vbeside = body(vargs, "i")
        if vargs.refs != args.refs:
            return [*alloc, scalar_launch]
        n4 = n // 4
        vsrc = [
            f'extern "C" __global__ __launch_bounds__({block}) void {kernel}_v4('
            f"{vargs.signature(outs)}) {{",
            f"  for ({index} j = ({index})blockIdx.x * {block} + threadIdx.x; j < {n4}; "
            f"j += ({index})gridDim.x * {block}) {{",
            *(
                f"    const float4 a{args.refs.index(r)}v = "
                f"reinterpret_cast<const float4*>(a{args.refs.index(r)})[j];"
                for r in vargs.vec_refs
            ),
            "    float r[4];",
            *(f"    float r{k}[4];" for k in range(len(stored))),
            "#pragma unroll",
            "    for (int l = 0; l < 4; ++l) {",
            f"      const {index} i = j * 4 + l;",
            *(f"      {line}" for line in vlines),
            *(f"      r{k}[l] = {value};" for k, value in enumerate(vbeside)),
            f"      r[l] = {vresult};",
            "    }",
            *(
                f"    reinterpret_cast<float4*>(out{k})[j] = "
                f"make_float4(r{k}[0], r{k}[1], r{k}[2], r{k}[3]);"
                for k in range(len(stored))
            ),
            f"    reinterpret_cast<float4*>(out)[{dest.element('j', 4) if dest else 'j'}] = "
            "make_float4(r[0], r[1], r[2], r[3]);",
            "  }",
            "}",
        ]
        self.kernels.append("\n".join(vsrc))
        vgrid = _grid_stride_blocks(n4, block, tun.grid_waves)
        aligned = [*(_py(r) for r in vargs.vec_refs), *(m.name for m in stored), target]
        return [*alloc, *_aligned_launch(aligned, kernel, (vgrid, block), py_args, scalar_launch)]

    def copy_into_slices(
        self, kernel: str, copied: list[tuple[Ref, CatSlice]], tun: KernelTuning
    ) -> list[str]:
        """One kernel that copies each operand of a concatenation written in place which no
        kernel of its own stores (an input, a view of one) into its slice; its launch line."""
        args = _Args(self.ir)
        block = min(tun.block_size, 1024)
        longest = max(numel(self.ir.shapes[ref]) for ref, _ in copied)
        index = "long long" if copied[0][1].total >= 2**31 else "int"
        loops: list[str] = []
        for ref, where in copied:
            n = numel(self.ir.shapes[ref])
            value = args.load(ref, tuple(self.ir.shapes[ref]), "i")
            loops += [
                f"  for ({index} i = ({index})blockIdx.x * {block} + threadIdx.x; i < {n}; "
                f"i += ({index})gridDim.x * {block}) {{",
                f"    out[{where.element('i')}] = {value};",
                "  }",
            ]
        self.kernels.append("\n".join([
            "// cat: the operands no kernel of theirs stores, copied into their slices",
            f'extern "C" __global__ __launch_bounds__({block}) void {kernel}('
            f"{args.signature(['float* __restrict__ out'])}) {{",
            *loops,
            "}",
        ]))
        grid = max(1, min(math.ceil(longest / block), _MAX_GRID))
        py_args = ", ".join([*(_py(r) for r in args.refs), copied[0][1].buffer])
        return [f"KERNELS.{kernel}({grid}, {block}, {py_args})"]

    def _add_kernel(
        self, src_lines: list[str], kernel: str, grid: int, block: int, args: _Args, out: OpNode
    ) -> list[str]:
        """Keep a kernel's source; return the host lines that allocate its output and launch it.

        A concatenation's operand is stored into its slice instead when the kernel stores only
        as ``out[i] = `` (``i`` being the element's index in the contiguous result)."""
        text = "\n".join(src_lines)
        dest = self.cat_slices.get(out.name)
        stores = len(_ELEMENT_STORE.findall(text))
        if (
            dest is not None
            and len(_ANY_STORE.findall(text)) == stores > 0
            and (dest.total < 2**31 or "long long i" in text)
        ):
            self.kernels.append(_ELEMENT_STORE.sub(f"out[{dest.element('i')}] = ", text))
            self.written_in_place.add(out.name)
            py_args = ", ".join([*(_py(r) for r in args.refs), dest.buffer])
            return [f"KERNELS.{kernel}({grid}, {block}, {py_args})"]
        self.kernels.append(text)
        py_args = ", ".join([*(_py(r) for r in args.refs), out.name])
        return [
            f"{out.name} = torch.empty({list(out.shape)}, device=_dev, "
            f"dtype={_TORCH_DTYPE.get(out.dtype, 'torch.float32')})",
            f"KERNELS.{kernel}({grid}, {block}, {py_args})",
        ]
