"""Find a CUDA toolkit executable the same way for every tool.

An explicit ``$STITCH_<NAME>`` wins and is the only candidate (a wrong explicit setting is reported
rather than silently replaced); otherwise ``PATH``, ``$CUDA_HOME/bin`` and ``/usr/local/cuda/bin``,
then any extra places the tool names.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable

__all__ = ["find_cuda_tool", "is_executable"]


def is_executable(path: str) -> bool:
    """Whether ``path`` is a file this process may run."""
    return os.path.isfile(path) and os.access(path, os.X_OK)


def find_cuda_tool(name: str, *, extra: Iterable[str] = ()) -> str | None:
    """The path of CUDA tool ``name`` (``nvcc``, ``ncu``, ...), or None when there is none."""
    explicit = os.environ.get(f"STITCH_{name.upper()}")
    if explicit:
        return explicit if is_executable(explicit) else None
    on_path = shutil.which(name)
    if on_path:
        return on_path
    candidates = []
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if cuda_home:
        candidates.append(os.path.join(cuda_home, "bin", name))
    candidates.append(os.path.join(os.sep, "usr", "local", "cuda", "bin", name))
    candidates += list(extra)
    return next((c for c in candidates if is_executable(c)), None)
