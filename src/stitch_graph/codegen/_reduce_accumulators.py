"""The accumulator table of reductions: which prelude struct each reduction op accumulates in
(``SgSum``, ``SgWelford``, ``SgLse``, ... or a pair or triple of them for siblings), how its
result is read from that state, and which of them take four elements at once.

Held apart from ``_emit_reduce``'s kernel layouts: every reduction layout reads the same table.
"""

from __future__ import annotations

import re
from typing import Any

from stitch_graph.codegen._emit_base import EmitError

_ACC = {
    "sum": "SgSum",
    "mean": "SgSum",
    "norm": "SgSum",
    "prod": "SgProd",
    "amax": "SgMax",
    "max": "SgMax",
    "amin": "SgMin",
    "min": "SgMin",
    "argmax": "SgArgMax",
    "argmin": "SgArgMin",
    "var": "SgWelford",
    "std": "SgWelford",
    "logsumexp": "SgLse",
}

_INTEGER_EXTREMES = {"amax": "SgMaxI", "max": "SgMaxI", "amin": "SgMinI", "min": "SgMinI"}
# the position of the largest or smallest integer (CLIP's ``text.argmax(-1)`` for the end of a
# token sequence): ids past 2**24 are not exact in the float accumulator
_INTEGER_ARG_EXTREMES = {"argmax": "SgArgMaxI", "argmin": "SgArgMinI"}


def _accumulator(anchors: list[Any], dtypes: dict[Any, str]) -> tuple[str, str, list[str]]:
    """The accumulator type of one reduction or of siblings (``dtypes``: the program's, for
    their inputs'), the value type one element gives it, and the field of each reduction's
    state."""
    ops = [a.op for a in anchors]
    if len(ops) == 1 and ops[0] == "sum" and anchors[0].dtype == "int64":
        return "SgSumI", "long long", [""]  # a count: exact in int64
    if len(ops) == 1 and ops[0] in _INTEGER_ARG_EXTREMES and dtypes.get(
        anchors[0].args.get("input")
    ) in ("int64", "int32"):
        return _INTEGER_ARG_EXTREMES[ops[0]], "long long", [""]
    integer = [a for a in anchors if a.op in _INTEGER_EXTREMES and a.dtype in ("int64", "int32")]
    if len(ops) == 1 and integer:
        return _INTEGER_EXTREMES[ops[0]], "long long", [""]
    if integer:
        msg = "an integer max or min has no sibling reductions"
        raise EmitError(msg)
    if len(ops) == 1:
        return _ACC[ops[0]], "float", [""]
    if len(ops) > 3:
        msg = f"at most three sibling reductions in one pass, not {len(ops)}"
        raise EmitError(msg)
    template = "SgPair" if len(ops) == 2 else "SgTriple"
    acc = f"{template}<{', '.join(_ACC[op] for op in ops)}>"
    return acc, f"float{len(ops)}", [".a", ".b", ".c"][: len(ops)]


def _reduced(op: str, args: dict[str, Any], a: str, length: int) -> str:
    """A reduction's result from its accumulator state ``a``."""
    if op in ("var", "std"):
        corr = args.get("correction")
        if corr is None:
            corr = 1 if args.get("unbiased", True) else 0
        var = f"{a}.m2 / fmaxf({a}.n - {float(corr)!r}f, 0.f)"
        return f"sqrtf({var})" if op == "std" else var
    return {
        "sum": f"{a}.s",
        "mean": f"{a}.s / {float(length)!r}f",
        "norm": f"sqrtf({a}.s)",
        "prod": f"{a}.p",
        "amax": f"{a}.m",
        "max": f"{a}.m",
        "amin": f"{a}.m",
        "min": f"{a}.m",
        "argmax": f"{a}.i",
        "argmin": f"{a}.i",
        "logsumexp": f"({a}.m == -SG_INF ? -SG_INF : {a}.m + logf({a}.s))",
    }[op]


def _takes_fours(acc: str) -> bool:
    """Whether every accumulator of ``acc`` takes four elements at once, in any order
    (``update4``: one Welford division, one log-sum-exp rescale per four)."""
    parts = [p for p in re.findall(r"Sg\w+", acc) if p not in ("SgPair", "SgTriple")]
    return all(p in ("SgSum", "SgWelford", "SgLse") for p in parts)
