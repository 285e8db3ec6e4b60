"""The numba backend's byte moves (numba_kernels/simd.py's ``copy_bytes`` and ``fill_copy``), in both
of their forms whatever the machine: 64-byte masked moves (the form on AVX-512BW) and the C
library's memmove and memset (the form elsewhere). Each is compared with numpy's slicing over run
lengths across the 64-byte blocks, at odd offsets, with the bytes around both runs checked
untouched; an overlapping move (a ring buffer's rows moved to its start) as numpy's copy of it."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("hal.backends.numba_kernels")

import numba  # noqa: E402

from hal.backends.numba_kernels import simd  # noqa: E402

LENGTHS = [0, 1, 9, 36, 63, 64, 65, 127, 128, 200, 4096 + 5]
FORMS = [pytest.param(True, id="masked"), pytest.param(False, id="memmove")]


def _movers(masked: bool):
    copy, fill = simd._copy_bytes_of(masked), simd._fill_copy_of(masked)

    @numba.njit
    def copy_bytes(dst, dst_off, src, src_off, n):
        copy(dst, dst_off, src, src_off, n)

    @numba.njit
    def fill_copy(dst, dst_off, src, src_off, n_src, n, value):
        fill(dst, dst_off, src, src_off, n_src, n, value)
    return copy_bytes, fill_copy


def test_the_machine_takes_the_form_its_cpu_masks():
    assert simd.BYTE_MASKS == ("avx512bw" in simd.cpu_features())


@pytest.mark.parametrize("masked", FORMS)
def test_copy_bytes_moves_the_run_and_nothing_else(masked):
    copy_bytes, _ = _movers(masked)
    rng = np.random.default_rng(0)
    src = rng.integers(0, 256, 10_000).astype(np.uint8)
    for n in LENGTHS:
        for dst_off, src_off in ((0, 0), (3, 17), (61, 5)):
            dst = np.full(10_000, 0xA5, np.uint8)
            want = dst.copy()
            want[dst_off:dst_off + n] = src[src_off:src_off + n]
            copy_bytes(dst, dst_off, src, src_off, n)
            np.testing.assert_array_equal(dst, want, err_msg=f"n={n} dst_off={dst_off} src_off={src_off}")


@pytest.mark.parametrize("masked", FORMS)
def test_copy_bytes_moves_a_buffers_later_rows_to_its_start(masked):
    copy_bytes, _ = _movers(masked)
    rng = np.random.default_rng(1)
    for n, distance in ((1000, 96), (4096, 4096), (200, 64)):
        ring = rng.integers(0, 256, n + distance + 50).astype(np.uint8)
        want = ring.copy()
        want[:n] = ring[distance:distance + n].copy()
        copy_bytes(ring, 0, ring, distance, n)
        np.testing.assert_array_equal(ring, want, err_msg=f"n={n} distance={distance}")


@pytest.mark.parametrize("masked", FORMS)
def test_fill_copy_writes_the_run_then_the_value(masked):
    _, fill_copy = _movers(masked)
    rng = np.random.default_rng(2)
    src = rng.integers(0, 256, 10_000).astype(np.uint8)
    for n in LENGTHS:
        for n_src in sorted({0, n // 3, n}):
            for dst_off, src_off, value in ((0, 0, 0), (5, 11, 0x80), (64, 3, 0xFF)):
                dst = np.full(10_000, 0x5A, np.uint8)
                want = dst.copy()
                want[dst_off:dst_off + n_src] = src[src_off:src_off + n_src]
                want[dst_off + n_src:dst_off + n] = value
                fill_copy(dst, dst_off, src, src_off, n_src, n, value)
                np.testing.assert_array_equal(dst, want, err_msg=f"n={n} n_src={n_src} dst_off={dst_off}")
