"""One kernel for every set of kernels that differ only in their names.

Repeated layers of one shape emit the same kernel again under new names, with locals named
after their nodes: ResNet101's 123 kernels are 28 distinct ones, a vision transformer's 138 are
30, an RNN unrolled over 256 steps emits 1538 kernels of 8 kinds. The build compiles every
copy, and the autotuner rebuilds the whole source for each setting it times, so copies cost
build time over and over. Kernels are compared with their names, comments and node-named locals
(``v_<node>``) canonicalised; each repeat is dropped and its launches call the first.
"""

from __future__ import annotations

import re

_DEFINED = re.compile(r"__global__\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?void\s+(\w+)\s*\(")
_COMMENT = re.compile(r"//[^\n]*")
_LOCAL = re.compile(r"\bv_\w+")
_LAUNCH = re.compile(r"\bKERNELS\.(\w+)\(")


def _canonical(text: str, names: list[str]) -> str:
    for k, name in enumerate(names):
        text = re.sub(rf"\b{re.escape(name)}\b", f"@K{k}", text)
    text = _COMMENT.sub("", text)
    seen: dict[str, str] = {}
    return _LOCAL.sub(lambda m: seen.setdefault(m.group(0), f"v@{len(seen)}"), text)


def merge_identical(kernels: list[str]) -> tuple[list[str], dict[str, str]]:
    """The kernels with repeats dropped, and the name each dropped kernel is launched as."""
    first: dict[str, list[str]] = {}
    kept: list[str] = []
    renamed: dict[str, str] = {}
    for text in kernels:
        names = _DEFINED.findall(text)
        key = _canonical(text, names)
        if names and key in first:
            renamed.update(zip(names, first[key], strict=True))
            continue
        first.setdefault(key, names)
        kept.append(text)
    return kept, renamed


def relaunch(host: str, renamed: dict[str, str]) -> str:
    """Host code whose launches of dropped kernels call the kept ones."""
    if not renamed:
        return host
    return _LAUNCH.sub(lambda m: f"KERNELS.{renamed.get(m.group(1), m.group(1))}(", host)
