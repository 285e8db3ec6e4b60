"""The numba backend's 16-lane requantization of the float32 BLAS path (numba_kernels/requant_rows.py,
conv.py's path where the CPU has no AVX-512 VNNI): the bytes of conv.py's scalar loop, which
fixedpoint's TFLite arithmetic defines, over random sums, biases that wrap the int32 accumulator,
QuantizeMultiplier's multipliers, right shifts up to 31, both 8-bit types and rows whose last
block is partial; and the layers that take it (tests/ops/test_conv.py holds them to TFLite)."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("hal.backends.numba_kernels")

from hal.backends.numba_kernels import conv, requant_rows  # noqa: E402


@pytest.mark.parametrize("rows,n", [(64, 96), (33, 24), (7, 37), (3, 8), (1, 1), (5, 16)])
@pytest.mark.parametrize("dtype,zp,lo,hi", [(np.int8, -3, -128, 127), (np.int8, -128, -128, 127),
                                            (np.uint8, 128, 0, 255), (np.uint8, 0, 0, 6)])
def test_the_lanes_give_the_scalar_loops_bytes(rows, n, dtype, zp, lo, hi):
    rng = np.random.default_rng(rows * 100 + n)
    acc = rng.integers(-(1 << 24), 1 << 24, (rows, n)).astype(np.float32)
    edges = [(1 << 24) - 1, -(1 << 24) + 1, 0, -1]
    acc.reshape(-1)[:len(edges)] = edges[:acc.size]
    bias = rng.integers(-(1 << 33), 1 << 33, n).astype(np.int64)  # wraps the int32 accumulator
    mult = rng.integers(1 << 30, 1 << 31, n).astype(np.int64)
    shift = -rng.integers(0, 32, n).astype(np.int64)
    want, got = np.empty((rows, n), dtype), np.full((rows + 1, n), 77, dtype)
    conv._requantize_right(acc, bias, mult, shift, zp, lo, hi, want)
    requant_rows.requantize(acc.reshape(-1), rows, n, *requant_rows.lanes(bias, mult, shift), zp, lo, hi,
                            got.reshape(-1))
    np.testing.assert_array_equal(got[:rows], want)
    assert (got[rows] == 77).all()  # nothing past the rows written


def test_a_right_shift_only_layer_carries_its_lanes_and_another_does_not():
    rng = np.random.default_rng(0)
    bias = rng.integers(-1000, 1000, 20).astype(np.int64)
    mult = rng.integers(1 << 30, 1 << 31, 20).astype(np.int64)
    d = conv.GemmData(np.zeros((4, 20), np.float32), bias, np.array([0, 4]), 0, 0.0, mult, -np.ones(20, np.int64),
                      0, -128, 127)
    assert conv._with_lanes(d).lanes is not None and d.right_only
    d.shifts = np.ones(20, np.int64)  # a left shift: the scalar loop's general form
    assert conv._with_lanes(d).lanes is None and not d.right_only
