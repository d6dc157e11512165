"""Candidates stored as files: a folder with ``kernel.cu``, ``host.py`` and ``candidate.json``.

Hand-written candidates (examples, test fixtures, benchmarks) are easier to read and edit as real
``.cu``/``.py``/``.cpp`` files than as strings inside JSON. ``candidate.json`` holds the rest: the
form, link libraries, the problem it solves, and for fixtures what verifying it should give.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from stitch_graph.artifacts import Candidate

__all__ = ["load_candidate_dir"]


def load_candidate_dir(folder: str | Path) -> tuple[Candidate, dict[str, Any]]:
    """Read a candidate folder.

    Args:
        folder: Holds ``host.py``, ``candidate.json`` and optionally ``kernel.cu``, ``host.cpp``.

    Returns:
        The candidate and the JSON metadata (``problem`` is resolved to an absolute path).
    """
    root = Path(folder)
    meta: dict[str, Any] = json.loads((root / "candidate.json").read_text())
    kernel = root / "kernel.cu"
    host_cpp = root / "host.cpp"
    candidate = Candidate(
        kernel_source=kernel.read_text() if kernel.exists() else "",
        host_source=(root / "host.py").read_text(),
        form=meta.get("form", "nvrtc"),
        host_cpp=host_cpp.read_text() if host_cpp.exists() else None,
        link_libraries=list(meta.get("link_libraries", [])),
        author="hand",
        notes=meta.get("notes", ""),
    )
    if "problem" in meta:
        meta["problem"] = str((root / meta["problem"]).resolve())
    return candidate, meta
