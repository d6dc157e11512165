"""GPU tests: skipped unless CUDA and CuPy are present; run with ``pytest -m gpu tests/gpu``.

Execution needs only torch, CuPy and pydantic; the package's top level imports lazily, so these
tests run on a GPU machine without the LangChain stack.
"""

from __future__ import annotations

import importlib.util

import pytest


def _gpu_ready() -> bool:
    if importlib.util.find_spec("cupy") is None:
        return False
    import torch

    return torch.cuda.is_available()


@pytest.fixture(autouse=True)
def _needs_gpu() -> None:
    if not _gpu_ready():
        pytest.skip("needs an NVIDIA GPU with CUDA and CuPy")
