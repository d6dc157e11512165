"""Complex tensors as pairs of floats: ``view_as_complex``, ``polar``, products, sums and views
of complex64 tensors, ``real``/``imag``/``abs``/``conj`` and ``view_as_real`` lowered to float32
tensors whose last dim of 2 holds (real, imaginary).

Rotary embeddings in the LLaMA form (``view_as_real(view_as_complex(x) * freqs_cis)``) are then
pointwise ops of the pair's shape, which the scheduler fuses with their neighbours. A complex value keeps a
``view_as_complex`` node of its pair, so a consumer this module does not lower still gets the
complex tensor from PyTorch; the view is dropped where nothing reads it. A product is
``(ac - bd, bc + ad)``, as PyTorch's complex multiply computes it.
"""

from __future__ import annotations

import builtins
import operator
from typing import Any

import torch
import torch.fx

from stitch_graph.codegen._capture_base import _subst
from stitch_graph.codegen._capture_builder import _Builder
from stitch_graph.codegen._capture_names import _canonical_name
from stitch_graph.codegen.ir import ProgramIR, Ref

_VIEWS = frozenset({"view", "getitem", "unsqueeze", "squeeze", "narrow", "select", "flatten"})
_SAME = frozenset({"contiguous", "clone", "to"})


def lower_complex(
    ir: ProgramIR, fx_node: torch.fx.Node, env: dict[str, Any], ours: dict[Ref, Any], value: Any
) -> Ref | None:
    """The Ref a call on complex tensors lowers to, or ``None`` (nothing appended) when the call
    involves none or is outside what the pairs reproduce."""
    if fx_node.op not in ("call_function", "call_method") or not torch.is_tensor(value):
        return None
    name = _canonical_name(fx_node)
    if fx_node.target is builtins.getattr:
        name = str(fx_node.args[1])
    args = list(_subst(fx_node.args, env))
    kwargs = dict(_subst(fx_node.kwargs, env))
    operands = [a for a in args if isinstance(a, Ref)]
    involved = value.is_complex() or any(ir.dtypes.get(a) == "complex64" for a in operands)
    if not (involved or name == "view_as_complex") or value.dtype == torch.complex128:
        return None
    b = _Builder(ir, ours, fx_node.name)
    try:
        return _lower(ir, b, name, args, kwargs, value)
    except (TypeError, ValueError, IndexError, RuntimeError):
        return None  # an argument form the pairs do not take: the call stays in PyTorch


def _lower(
    ir: ProgramIR, b: _Builder, name: str, args: list[Any], kwargs: dict[str, Any], value: Any
) -> Ref | None:
    x = args[0] if args else None
    if name == "view_as_complex":
        ok = isinstance(x, Ref) and ir.dtypes[x] == "float32" and ir.shapes[x][-1:] == (2,)
        return _complex(ir, b, x) if ok else None
    if name == "polar" and all(ir.dtypes.get(a) == "float32" for a in args[:2]):
        size, angle = args[0], args[1]
        real = b("mul", torch.mul, size, b("cos", torch.cos, angle))
        imag = b("mul", torch.mul, size, b("sin", torch.sin, angle))
        return _complex(ir, b, b("stack", torch.stack, [real, imag], -1))
    pair = _pair(ir, b, x) if isinstance(x, Ref) and ir.dtypes[x] == "complex64" else None
    if name in ("view_as_real", "real", "imag", "abs", "conj", *_VIEWS, *_SAME) and pair is None:
        return None
    if name == "view_as_real":
        return pair
    if name in ("real", "imag"):
        return b("select", torch.select, pair, -1, 0 if name == "real" else 1)
    if name == "abs":
        real, imag = _parts(b, pair)
        return b("hypot", torch.hypot, real, imag)
    if name == "conj":
        real, imag = _parts(b, pair)
        return _complex(ir, b, b("stack", torch.stack, [real, b("neg", torch.neg, imag)], -1))
    if name in _SAME:
        return x if name != "to" or value.dtype == torch.complex64 else None
    if name in _VIEWS:
        return _complex(ir, b, _view(b, name, pair, args[1:], kwargs))
    if name in ("mul", "add", "sub") and len(args) == 2 and not kwargs:
        return _arithmetic(ir, b, name, args[0], args[1])
    return None


def _complex(ir: ProgramIR, b: _Builder, pair: Ref) -> Ref:
    """A complex view of ``pair`` whose node remembers the pair (for the calls that follow)."""
    view = b("view_as_complex", torch.view_as_complex, pair)
    ir.node(view.name).attrs["pair"] = pair
    return view


def _pair(ir: ProgramIR, b: _Builder, c: Ref) -> Ref:
    """The (real, imaginary) floats of complex ``c``: the pair it was made from, or a view."""
    if c.kind == "node" and "pair" in ir.node(c.name).attrs:
        return ir.node(c.name).attrs["pair"]
    return b("view_as_real", torch.view_as_real, c)


def _parts(b: _Builder, pair: Ref) -> tuple[Ref, Ref]:
    return b("select", torch.select, pair, -1, 0), b("select", torch.select, pair, -1, 1)


def _view(b: _Builder, name: str, pair: Ref, rest: list[Any], kwargs: dict[str, Any]) -> Ref:
    """The view of the complex tensor, taken of its pair (whose last dim stays last)."""
    if kwargs:
        raise TypeError(name)
    if name == "view":
        shape = list(rest[0]) if len(rest) == 1 and isinstance(rest[0], list | tuple) else rest
        return b("view", "view", pair, *shape, 2)
    if name == "getitem":
        index = rest[0] if isinstance(rest[0], tuple) else (rest[0],)
        if any(isinstance(i, Ref) or i is Ellipsis for i in index):
            raise TypeError(name)  # a tensor index, or an Ellipsis that would take the pair's dim
        return b("getitem", operator.getitem, pair, (*index, slice(None)))
    if name == "flatten":
        start, end = (list(rest) + [0, -1])[:2]
        end = end - 1 if end < 0 else end
        return b("flatten", torch.flatten, pair, start - 1 if start < 0 else start, end)
    dims = [d - 1 if isinstance(d, int) and d < 0 else d for d in rest[:1]]
    fn = {"unsqueeze": torch.unsqueeze, "squeeze": torch.squeeze, "narrow": torch.narrow,
          "select": torch.select}[name]
    if name == "squeeze" and not dims:
        raise TypeError(name)  # every size-1 dim: the pair's own dims are not
    return b(name, fn, pair, *dims, *rest[1:])


def _arithmetic(ir: ProgramIR, b: _Builder, name: str, left: Any, right: Any) -> Ref | None:
    """A product, sum or difference with a complex operand: the other may be complex, a float
    tensor (broadcast over the pair) or a real number."""
    def kind(v: Any) -> str:
        if isinstance(v, Ref):
            return {"complex64": "complex", "float32": "real"}.get(ir.dtypes[v], "")
        return "number" if isinstance(v, int | float) and not isinstance(v, bool) else ""

    kinds = (kind(left), kind(right))
    if "" in kinds or "complex" not in kinds:
        return None
    fn = {"mul": torch.mul, "add": torch.add, "sub": torch.sub}[name]

    def operand(v: Any, k: str) -> Any:
        if k == "complex":
            return _pair(ir, b, v)
        return b("unsqueeze", torch.unsqueeze, v, -1) if k == "real" else v

    if kinds == ("complex", "complex") and name == "mul":
        return _complex(ir, b, _product(b, _pair(ir, b, left), _pair(ir, b, right)))
    if name == "mul" or kinds == ("complex", "complex"):
        pair = b(name, fn, operand(left, kinds[0]), operand(right, kinds[1]))
        return _complex(ir, b, pair)
    return None  # a real added to a complex changes only its real part: left to PyTorch


def _product(b: _Builder, p: Ref, q: Ref) -> Ref:
    """The pair of (a + bi)(c + di) from pairs ``p`` and ``q``: ``p * c + flip(p) * d * (-1, 1)``
    is (ac - bd, bc + ad), each element from pointwise ops of the pair's shape (one kernel)."""
    c = b("narrow", torch.narrow, q, -1, 0, 1)
    d = b("narrow", torch.narrow, q, -1, 1, 1)
    signs = b.constant(torch.tensor([-1.0, 1.0]))
    turned = b("mul", torch.mul, b("mul", torch.mul, b("flip", torch.flip, p, [-1]), d), signs)
    return b("add", torch.add, b("mul", torch.mul, p, c), turned)
