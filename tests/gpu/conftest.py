"""GPU tests: skipped unless CUDA and CuPy are present; run with ``pytest -m gpu tests/gpu``.

The GPU machine's image has torch and CuPy but not the LangChain stack that the package's top level
imports. Execution needs none of it, so when that import fails a bare ``stitch_graph`` package (its
folder, without ``__init__``) is registered and the execution modules load on their own.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import pytest


def _ensure_importable() -> None:
    try:
        import stitch_graph  # noqa: F401
    except ImportError:
        spec = importlib.util.find_spec("stitch_graph")
        if spec is None or not spec.submodule_search_locations:
            raise
        folder = Path(next(iter(spec.submodule_search_locations)))
        bare = types.ModuleType("stitch_graph")
        bare.__path__ = [str(folder)]
        bare.__file__ = str(folder / "__init__.py")
        sys.modules["stitch_graph"] = bare


_ensure_importable()


def _gpu_ready() -> bool:
    if importlib.util.find_spec("cupy") is None:
        return False
    import torch

    return torch.cuda.is_available()


@pytest.fixture(autouse=True)
def _needs_gpu() -> None:
    if not _gpu_ready():
        pytest.skip("needs an NVIDIA GPU with CUDA and CuPy")
