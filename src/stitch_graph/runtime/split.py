"""Split a kernel source into translation units that build apart, in parallel and cached apart.

A whole model's program holds a hundred kernels or more in one source, and NVRTC builds one
source on one core: DenseNet201's 124 kernels took 49 s (`nvcc -cubin` on two cores, 20 s in
cicc, 29 s in ptxas). Tuning builds a variant per setting, and a variant differs from the
program in one kernel. Split into parts, the parts build on all cores at once, and a variant
rebuilds only the part its kernel sits in (CuPy caches builds on disk by their source).

Only sources of one shape are split: a preamble (macros, device helpers, structs) followed by
nothing but ``extern "C" __global__`` kernels, which is what the generator emits. Every part
gets the whole preamble; a kernel goes to the part its name hashes to, so a kernel's part does
not move when other kernels change. Anything else at file scope after the first kernel (a
macro, a helper, a global) could be used by the kernels after it, so such a source stays whole.
"""

from __future__ import annotations

import hashlib
import os
import re

__all__ = ["default_parts", "split_kernels"]

_MAX_PARTS = 16


def default_parts() -> int:
    """How many parts to build at once: this machine's cores, at most 16."""
    return min(os.cpu_count() or 1, _MAX_PARTS)

_KERNEL_HEAD = re.compile(r'extern\s+"C"\s+__global__\b[^{;]*?\bvoid\s+(\w+)\s*\(')


def split_kernels(
    source: str, parts: int, *, min_kernels: int = 16, line_file: str | None = None
) -> list[str]:
    """The source as up to ``parts`` sources, or as ``[source]`` when it should stay whole.

    Args:
        source: A CUDA C++ source.
        parts: How many units at most (the cores that will build them).
        min_kernels: Below this many kernels the source stays whole: a part's build pays for
            the preamble again, which only many kernels repay.
        line_file: When given, each kernel is preceded by a ``#line`` directive naming this
            file and the kernel's line in ``source``, so a compiler's diagnostics point into
            the whole source. Left out where parts are cached by their text (NVRTC): a kernel's
            line moves whenever a kernel above it changes.

    Returns:
        Sources that together define every kernel once, each with the whole preamble; the
        list holds one element when the source is not split.
    """
    items = _top_level_kernels(source)
    if items is None or parts < 2 or len(items[1]) < min_kernels:
        return [source]
    preamble, kernels = items
    buckets: list[list[str]] = [[] for _ in range(parts)]
    for name, text, offset in kernels:
        if line_file is not None:
            text = f'#line {source.count(chr(10), 0, offset) + 1} "{line_file}"\n{text}'
        buckets[int(hashlib.sha256(name.encode()).hexdigest(), 16) % parts].append(text)
    return [preamble + "".join(texts) for texts in buckets if texts]


def _top_level_kernels(source: str) -> tuple[str, list[tuple[str, str, int]]] | None:
    """The preamble and each kernel's (name, text with its leading comments, offset in
    ``source``), or ``None`` when something other than kernels, comments and blank lines
    follows the first kernel."""
    first = _KERNEL_HEAD.search(source)
    if first is None:
        return None
    start = source.rfind("\n", 0, first.start()) + 1
    while True:  # comment lines right above the first kernel travel with it
        above = source.rfind("\n", 0, max(start - 1, 0)) + 1
        if start == 0 or not source[above:start].lstrip().startswith("//"):
            break
        start = above
    preamble, rest = source[:start], source[start:]
    kernels: list[tuple[str, str, int]] = []
    position = 0
    while position < len(rest):
        gap = _skip_comments(rest, position)
        if gap == len(rest):
            if kernels:
                name, text, offset = kernels[-1]
                kernels[-1] = (name, text + rest[position:], offset)
            break
        head = _KERNEL_HEAD.match(rest, gap)
        if head is None:
            return None
        end = _body_end(rest, head.end())
        if end is None:
            return None
        end = rest.find("\n", end)
        end = len(rest) if end < 0 else end + 1
        kernels.append((head.group(1), rest[position:end], start + position))
        position = end
    return preamble, kernels


def _skip_comments(text: str, position: int) -> int:
    """The first position at or after ``position`` that is not blank or inside a comment."""
    while position < len(text):
        if text[position].isspace():
            position += 1
        elif text.startswith("//", position):
            newline = text.find("\n", position)
            position = len(text) if newline < 0 else newline + 1
        elif text.startswith("/*", position):
            close = text.find("*/", position + 2)
            position = len(text) if close < 0 else close + 2
        else:
            break
    return position


def _body_end(text: str, position: int) -> int | None:
    """The index just past the brace that closes the body after ``position`` (comments, string
    and character literals skipped), or ``None`` when it never closes."""
    depth = 0
    i = position
    while i < len(text):
        char = text[i]
        if text.startswith("//", i) or text.startswith("/*", i):
            i = _skip_comments(text, i)
            continue
        if char in "\"'":
            i += 1
            while i < len(text) and text[i] != char:
                i += 2 if text[i] == "\\" else 1
        elif char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return i + 1
        elif char == ";" and depth == 0:
            return None  # a declaration, not a definition
        i += 1
    return None
