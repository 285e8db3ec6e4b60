"""The numba backend's AMX-INT8 paths against the reference backend, bit for bit: amx_conv's
convolutions read in place from a padded copy (output rows of 16 pixels or more, each row's last
block recomputing pixels of the one before, filter rows of 1 to 5 tile steps, strides, dilation
along y), and gemm's blocks of 16 / 32 rows on the tiles (rows read in place, a block of rows
flipped into L1, a convolution's rows gathered from its indirection table, a row term, panel
counts that leave a half pair). Skipped where the CPU or the OS has no AMX; the same shapes run
on the VNNI tiles there (tests/backends/test_numba_int_kernels.py covers those)."""
from __future__ import annotations

import numpy as np
import pytest

numba_kernels = pytest.importorskip("hal.backends.numba_kernels")

from hal.backends.numba_kernels import amx, conv, gemm  # noqa: E402
from tests.backends.test_numba_int_kernels import QPC, QS8, QU8, _check, _conv_model, _data, _fc_model  # noqa: E402

pytestmark = pytest.mark.skipif(not amx.AVAILABLE, reason="no AMX-INT8 (CPU, OS permission or NNHAL_AMX=0)")


@pytest.mark.parametrize("x_type,w_type,w_zp", [(QS8, QPC, 0), (QS8, QS8, 0), (QU8, QU8, 128), (QU8, QPC, 0)])
@pytest.mark.parametrize("case", [
    dict(x_shape=(1, 20, 40, 32), out_c=32, k=3, pads=(1, 1, 1, 1), act=1),  # 2 steps per filter row, blocks 32 + 16
    dict(x_shape=(2, 9, 35, 3), out_c=20, k=3, stride=2, pads=(0, 1, 0, 1)),  # an image's first layer: 1 step
    dict(x_shape=(1, 7, 19, 48), out_c=72, k=3, pads=(1, 1, 1, 1)),  # 144-byte runs: 3 steps; 5 panels
    dict(x_shape=(1, 6, 16, 96), out_c=40, k=2, pads=(0, 1, 1, 0)),  # exactly one 16-pixel block per row
    dict(x_shape=(1, 11, 36, 20), out_c=16, k=5, stride=2, pads=(2, 2, 2, 2), act=1),
    dict(x_shape=(1, 12, 33, 16), out_c=24, k=3, pads=(2, 2, 1, 1), dilation=(1, 2)),  # (w, h): along y only
])
def test_convolutions_on_the_padded_copy(x_type, w_type, w_zp, case):
    model = _conv_model(x_type, w_type, **case, w_zp=w_zp)
    d = _data(model)
    assert isinstance(d, conv.IntGemm) and d.amx is not None
    _check(model, case["x_shape"], x_type)


def test_a_row_term_or_narrow_rows_keep_gemms_paths():
    """A uint8 filter whose zero point is not 128 needs each row's own byte sum (gemm's paths
    compute it); output rows under 16 pixels fill no tile; dilation along x breaks the runs."""
    assert _data(_conv_model(QU8, QU8, (1, 9, 20, 8), 16, 3, pads=(1, 1, 1, 1), w_zp=119)).amx is None
    assert _data(_conv_model(QS8, QPC, (1, 9, 15, 8), 16, 3, pads=(1, 1, 1, 1))).amx is None
    assert _data(_conv_model(QS8, QPC, (1, 9, 40, 8), 16, 3, pads=(2, 2, 2, 2), dilation=2)).amx is None


def test_a_plan_with_amx_runs_where_amx_is_off(monkeypatch):
    """A compilation cache entry planned on a machine with AMX, run where the tiles are off
    ($NNHAL_AMX=0, or another machine with AVX-512 VNNI only): the VNNI path computes it."""
    case = dict(x_shape=(1, 9, 20, 8), out_c=16, k=3, pads=(1, 1, 1, 1))
    model = _conv_model(QS8, QPC, **case)
    assert _data(model).amx is not None
    monkeypatch.setattr(amx, "AVAILABLE", False)
    _check(model, case["x_shape"], QS8, seeds=(0,))


@pytest.mark.parametrize("x_type", [QU8, QS8])
@pytest.mark.parametrize("batch,k,n", [(16, 64, 16), (50, 100, 40), (47, 200, 129), (33, 576, 64)])
def test_fully_connected_blocks(x_type, batch, k, n):
    """Rows in blocks of 32 and 16 on the tiles, the rest (under 16) on the VNNI tiles; K not a
    multiple of 64 (the tile rows read into the next row, times zero weights); uint8 with a row
    term (_fc_model's filter zero point)."""
    model = _fc_model(x_type, batch, k, n, seed=k + n)
    assert _data(model).groups[0].amx_args[1] == -(-k // 64)
    _check(model, (batch, k), x_type)


@pytest.mark.parametrize("x_type,w_type", [(QS8, QPC), (QU8, QU8)])
@pytest.mark.parametrize("case", [
    dict(x_shape=(1, 9, 9, 96), out_c=40, k=1),  # 1x1 read in place (uint8) or flipped a block at a time
    dict(x_shape=(1, 8, 8, 32), out_c=48, k=3, pads=(1, 1, 1, 1)),  # rows gathered from the indirection table
    dict(x_shape=(2, 7, 7, 24), out_c=20, k=3, stride=2, pads=(1, 1, 1, 1)),
    dict(x_shape=(1, 9, 12, 22), out_c=33, k=3, pads=(1, 1, 1, 1), dilation=2),  # row segments, gathered
])
def test_gemm_rows_on_the_tiles(x_type, w_type, case):
    model = _conv_model(x_type, w_type, **case)
    d = _data(model)
    assert d.amx is None
    plans = [d.rows.plan] if d.rows is not None else d.groups
    assert all(p.amx_args[1] > 0 for p in plans)
    _check(model, case["x_shape"], x_type)


def test_short_rows_stay_on_the_vnni_tiles():
    """K under one tile row, or mostly padding in its last one: amx.worth_it says no."""
    rng = np.random.default_rng(0)
    for k, used in ((24, False), (32, False), (64, True), (80, False), (144, True), (200, True)):
        w = rng.integers(-127, 128, (k, 16)).astype(np.int8)
        p = gemm.make_plan(w, 0, np.zeros(16, np.int32), np.int8, 0, np.full(16, 1 << 30), np.full(16, -5), 0,
                           -128, 127)
        assert (p.amx_args[1] > 0) == used, k


def test_threads_split_the_output_rows(monkeypatch):
    """``--threads``: amx_conv's output rows and gemm's tile blocks split over workers (each
    thread configures its own tiles) give the reference's bytes."""
    from hal import backends
    monkeypatch.setattr(backends, "compute_threads", lambda: 3)
    monkeypatch.setattr(gemm, "PARALLEL_MACS", 0)
    for case in (dict(x_shape=(1, 19, 40, 16), out_c=24, k=3, pads=(1, 1, 1, 1)),
                 dict(x_shape=(1, 9, 9, 96), out_c=40, k=1)):
        model = _conv_model(QS8, QPC, **case)
        assert (_data(model).amx is not None) == (case["k"] == 3)
        _check(model, case["x_shape"], QS8, seeds=(0,))


def test_a_cached_plan_loads_and_runs_on_the_tiles():
    """amx_conv's plan goes into a compilation cache entry and back (hal.serialize), and the loaded
    model computes the same bytes."""
    from hal.compiler import compile_model
    from hal.executor import execute
    from hal.serialize import dump_compiled, load_compiled
    case = dict(x_shape=(1, 9, 20, 8), out_c=16, k=3, pads=(1, 1, 1, 1))
    compiled = compile_model(_conv_model(QS8, QPC, **case), backend_order=["numba", "reference"])
    payload, arrays = dump_compiled(compiled)
    loaded = load_compiled(payload, [a.copy() for a in arrays], backend_order=["numba", "reference"])
    assert loaded.static_plan.steps[0].ctx.data.amx is not None
    x = np.random.default_rng(1).integers(-128, 128, case["x_shape"]).astype(np.int8)
    np.testing.assert_array_equal(execute(loaded, [x])[0], execute(compiled, [x])[0])
