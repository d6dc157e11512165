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


def _missing(space, loaded):  # noqa: ANN001, ANN202
    raise OSError("libcublasLt could not be loaded")


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
    monkeypatch.setattr(cublas, "CublasLt", _missing)
    _call(library, 1)
    assert library._lt_handle is False and len(library._blas_handle.calls) == 1


def test_cublaslt_structures_and_alignment_match_the_header() -> None:
    import ctypes

    # cublasLtMatmulAlgo_t is 8 uint64; the heuristic result adds size_t, status, float, int[4]
    assert ctypes.sizeof(cublas._LtAlgo) == 64 and ctypes.sizeof(cublas._LtHeuristic) == 96
    assert cublas._pointer_alignment(0x1000, 0x2000, 0x3000) == 256
    assert cublas._pointer_alignment(0x1000, 0x1010, 0x2000) == 16
    assert cublas._pointer_alignment(0x1004, 0x2000, 0) == 4  # a null C counts as aligned


class _LtWithEpilogue(_Lt):
    def matmul(self, stream, index, shape, a, b, c, bias=0, epilogue="") -> bool:  # noqa: ANN001
        if index >= self.offered:
            return False
        self.calls.append((index, epilogue, bias))
        return True


def test_a_bias_goes_to_cublaslt_epilogue(
    library: KernelLibrary, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    monkeypatch.setattr(cublas, "CublasLt", _LtWithEpilogue)
    bias, c = torch.ones(8), torch.zeros(4, 8)
    library.sgemm(0, 1, 8, 4, 2, 100, 8, 0, 200, 4, 0, c, 8, 0, 1, 0, bias)
    library.sgemm(0, 1, 8, 4, 2, 100, 8, 0, 200, 4, 0, c, 8, 0, 1, 1, bias, True)
    lt = library._lt_handle  # with a bias, algo N is cuBLASLt's (N+1)-th: no two alike
    assert lt.calls == [(0, "bias", bias.data_ptr()), (1, "relu_bias", bias.data_ptr())]
    assert library._blas_handle.calls == [] and float(c.abs().sum()) == 0  # nothing added twice


def test_without_cublaslt_the_bias_and_relu_follow_cublas(
    library: KernelLibrary, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    monkeypatch.setattr(cublas, "CublasLt", _missing)
    c = torch.tensor([[1.0, -3.0, 0.5], [-1.0, 2.0, -0.25]])  # what "cuBLAS" left in C
    library.sgemm(0, 1, 3, 2, 2, 100, 3, 0, 200, 2, 0, c, 3, 0, 1, 0, torch.tensor([1.0, 1, -1]))
    assert len(library._blas_handle.calls) == 1
    torch.testing.assert_close(c, torch.tensor([[2.0, -2.0, -0.5], [0.0, 3.0, -1.25]]))
    library.sgemm(0, 1, 3, 2, 2, 100, 3, 0, 200, 2, 0, c, 3, 0, 1, 0, torch.zeros(3), True)
    torch.testing.assert_close(c, torch.tensor([[2.0, 0.0, 0.0], [0.0, 3.0, 0.0]]))
