"""The kernel launcher's argument packing (the ctypes path that skips CuPy's marshalling)."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from stitch_graph.runtime.kernels import _ArgumentBlock, _dims, kernel_signatures


class _FakeTensor:
    def __init__(self, address: int) -> None:
        self.address = address

    def data_ptr(self) -> int:
        return self.address


def _read(block: _ArgumentBlock, index: int, ctype: type) -> object:
    return ctypes.cast(block.array[index], ctypes.POINTER(ctype)).contents.value


def test_arguments_are_stored_where_the_parameter_array_points() -> None:
    source = (
        'extern "C" __global__ void k(const float* __restrict__ x, float* out, float alpha, '
        "int n, long long big, unsigned int flags) {}"
    )
    block = _ArgumentBlock(kernel_signatures(source)["k"])
    block.store((_FakeTensor(0x7F0000001000), None, 0.5, 7, 2**40, 3))
    assert _read(block, 0, ctypes.c_uint64) == 0x7F0000001000
    assert _read(block, 1, ctypes.c_uint64) == 0
    assert _read(block, 2, ctypes.c_float) == 0.5
    assert _read(block, 3, ctypes.c_int32) == 7
    assert _read(block, 4, ctypes.c_int64) == 2**40
    assert _read(block, 5, ctypes.c_uint32) == 3
    block.store((_FakeTensor(16), 32, -1.25, -2, -(2**40), 0))  # a second launch reuses it
    assert _read(block, 0, ctypes.c_uint64) == 16
    assert _read(block, 1, ctypes.c_uint64) == 32
    assert _read(block, 2, ctypes.c_float) == -1.25
    assert _read(block, 3, ctypes.c_int32) == -2
    assert _read(block, 4, ctypes.c_int64) == -(2**40)


def test_a_float_for_an_int_parameter_is_a_clear_error() -> None:
    block = _ArgumentBlock(["ptr", "int"])
    with pytest.raises(TypeError, match=r"argument 1 \(float\)"):
        block.store((None, 2.5))


def test_unsupported_scalar_types_are_refused() -> None:
    with pytest.raises(TypeError, match="__half"):
        _ArgumentBlock(["ptr", "__half"])


def test_grid_and_block_shapes() -> None:
    assert _dims(5) == (5, 1, 1)
    assert _dims(np.int64(7)) == (7, 1, 1)
    assert _dims((4, 2)) == (4, 2, 1)
    assert _dims([1, 2, 3]) == (1, 2, 3)
