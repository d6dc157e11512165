"""Which library a ``KERNELS.sgemm`` call reaches: cuBLAS for algo 0, cuBLASLt's ranked
algorithms for algo N > 0, and cuBLAS again where cuBLASLt offers fewer or cannot load."""

from __future__ import annotations

import pytest

from stitch_graph.runtime import cublas
from stitch_graph.runtime.kernels import KernelLibrary


class _Blas:
    space = object()

    def __init__(self, loaded) -> None:  # noqa: ANN001
        self.calls: list[tuple] = []

    def sgemm(self, stream, *args) -> None:  # noqa: ANN001
        self.calls.append(("sgemm", stream, args))


class _Lt:
    offered = 2  # algorithms the heuristic "ranks" for every shape

    def __init__(self, space, loaded) -> None:  # noqa: ANN001
        assert space is _Blas.space  # shares cuBLAS's workspace
        self.calls: list[tuple] = []

    def matmul(self, stream, index, shape, a, b, c) -> bool:  # noqa: ANN001
        if index >= self.offered:
            return False
        self.calls.append((index, shape, (a, b, c)))
        return True


@pytest.fixture
def library(monkeypatch: pytest.MonkeyPatch) -> KernelLibrary:
    monkeypatch.setattr(cublas, "Cublas", _Blas)
    monkeypatch.setattr(cublas, "CublasLt", _Lt)
    made = object.__new__(KernelLibrary)  # no GPU: only the routing is under test
    made.__dict__.update(_raw_stream=lambda device: 77, _device=0)
    return made


def _call(library: KernelLibrary, algo: int) -> None:
    library.sgemm(0, 1, 8, 4, 2, 100, 8, 0, 200, 4, 0, 300, 8, 0, 1, algo)


def test_algo_0_is_cublas_and_algo_n_is_cublaslt_rank_n_minus_1(library: KernelLibrary) -> None:
    _call(library, 0)
    _call(library, 2)
    blas, lt = library._blas_handle, library._lt_handle
    assert [c[0] for c in blas.calls] == ["sgemm"] and blas.calls[0][1] == 77
    assert lt.calls == [(1, (0, 1, 8, 4, 2, 8, 0, 4, 0, 8, 0, 1), (100, 200, 300))]


def test_ranks_past_the_heuristic_fall_back_to_cublas(library: KernelLibrary) -> None:
    _call(library, 3)  # cuBLASLt offers two
    assert len(library._blas_handle.calls) == 1 and library._lt_handle.calls == []


def test_without_cublaslt_every_algo_runs_as_cublas(
    library: KernelLibrary, monkeypatch: pytest.MonkeyPatch
) -> None:
    def missing(space, loaded):  # noqa: ANN001, ANN202
        raise OSError("libcublasLt could not be loaded")

    monkeypatch.setattr(cublas, "CublasLt", missing)
    _call(library, 1)
    assert library._lt_handle is False and len(library._blas_handle.calls) == 1


def test_cublaslt_structures_and_alignment_match_the_header() -> None:
    import ctypes

    # cublasLtMatmulAlgo_t is 8 uint64; the heuristic result adds size_t, status, float, int[4]
    assert ctypes.sizeof(cublas._LtAlgo) == 64 and ctypes.sizeof(cublas._LtHeuristic) == 96
    assert cublas._pointer_alignment(0x1000, 0x2000, 0x3000) == 256
    assert cublas._pointer_alignment(0x1000, 0x1010, 0x2000) == 16
    assert cublas._pointer_alignment(0x1004, 0x2000, 0) == 4  # a null C counts as aligned
