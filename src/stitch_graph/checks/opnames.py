"""Normalise operator names so that different spellings of one op compare equal.

Plans, declarations and static checks name the same operator in many ways:
``"conv2d"``, ``"torch.nn.functional.conv2d"``, ``"aten.convolution"``, ``"nn.Conv2d"``. The hack
checks and the rubric both need to decide whether two of these are the same op, so the rule lives
here, once.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ["bare_op_name", "op_key", "op_keys"]

_CAMEL_BOUNDARY = re.compile(r"(?<=[a-z0-9])(?=[A-Z][a-z])|(?<=[a-z])(?=[A-Z])")
_OVERLOAD = re.compile(r"\.(default|tensor|scalar|out|int|self|input)$", re.I)
_DIM_SUFFIX = re.compile(r"(\d+d|\d+)$")

# Different names of one operator family, after lower-casing and dropping "_" and dimension
# suffixes. Keys map to the family name the rest of the code compares.
_FAMILIES: dict[str, str] = {
    "convolution": "conv",
    "cudnnconvolution": "conv",
    "convolutionoverrideable": "conv",
    "convtransposenn": "convtranspose",
    "addmm": "linear",
    "batchnorm": "batchnorm",
    "nativebatchnorm": "batchnorm",
    "cudnnbatchnorm": "batchnorm",
    "nativelayernorm": "layernorm",
    "nativegroupnorm": "groupnorm",
    "softmax": "softmax",
    "softmaxint": "softmax",
    "scaleddotproductattention": "sdpa",
    "scaleddotproductflashattention": "sdpa",
    "scaleddotproductefficientattention": "sdpa",
}


def bare_op_name(name: str) -> str:
    """The last component of an op name, in snake case.

    Args:
        name: Any spelling, e.g. ``"torch.nn.functional.conv2d"``, ``"aten::relu.default"`` or
            ``"nn.BatchNorm2d"``.

    Returns:
        ``"conv2d"``, ``"relu"``, ``"batch_norm2d"`` for the examples above.
    """
    text = name.strip().replace("::", ".")
    text = _OVERLOAD.sub("", text)
    last = text.rsplit(".", 1)[-1]
    last = _CAMEL_BOUNDARY.sub("_", last).lower()
    return last.strip("_") or last


def op_key(name: str) -> str:
    """A comparison key: equal keys mean the same operator family.

    Lower-cases, drops underscores, in-place markers and dimension suffixes, and folds known
    aliases (``convolution`` and ``conv2d`` both give ``"conv"``).

    Args:
        name: Any spelling of an op name.

    Returns:
        The key, e.g. ``"conv"`` for ``"aten.convolution"`` and ``"torch.conv2d"``.
    """
    bare = bare_op_name(name).replace("_", "")
    if bare.endswith("inplace"):
        bare = bare[: -len("inplace")]
    stripped = _DIM_SUFFIX.sub("", bare) or bare
    return _FAMILIES.get(stripped, _FAMILIES.get(bare, stripped))


def op_keys(names: Iterable[str]) -> set[str]:
    """The set of :func:`op_key` values of ``names``."""
    return {op_key(n) for n in names if n and n.strip()}
