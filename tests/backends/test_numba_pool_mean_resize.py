"""The numba backend's quantized AVERAGE_POOL_2D / MAX_POOL_2D, MEAN, RESIZE_BILINEAR and
RESIZE_NEAREST_NEIGHBOR against the reference backend, bit for bit: padding (explicit and
implicit), strides, windows larger than strides, fused activations, every zero point, extreme
inputs, uint8 and int8; MEAN over spatial, last and other contiguous axis runs; every corner mode
of the resizes, up- and down-sampling; and the forms the kernels decline (NCHW, scattered axes)."""
from __future__ import annotations

import numpy as np
import pytest

numba_kernels = pytest.importorskip("hal.backends.numba_kernels")

from delegate.mapping import convert_partition  # noqa: E402
from delegate.tfl import TfLiteModelBuilder, read_model  # noqa: E402
from delegate.tfl.schema import Padding  # noqa: E402
from hal.compiler import compile_model  # noqa: E402
from hal.model import ModelBuilder  # noqa: E402
from hal.types import OperandType, OperationType  # noqa: E402
from tests.backends.differential import assert_matches_reference  # noqa: E402

QU8, QS8 = OperandType.TENSOR_QUANT8_ASYMM, OperandType.TENSOR_QUANT8_ASYMM_SIGNED
DTYPES = [np.uint8, np.int8]
MODES = [(False, False), (True, False), (False, True)]  # (align_corners, half_pixel_centers)


def _values(rng, shape, dtype, fill=None):
    info = np.iinfo(dtype)
    if fill == "min":
        return np.full(shape, info.min, dtype)
    if fill == "max":
        return np.full(shape, info.max, dtype)
    return rng.integers(info.min, int(info.max) + 1, shape).astype(dtype)


def _zero_points(dtype):
    info = np.iinfo(dtype)
    return [int(info.min), int(info.min) + 1, 0, 1, int(info.max) - 1, int(info.max)]


def _numba_ran(model) -> bool:
    steps = compile_model(model, backend_order=["numba", "reference"]).static_plan.steps
    return all(s.backend == "numba" for s in steps)


# ---- pooling -------------------------------------------------------------------------------------

def _pool(op, dtype, in_shape, padding, stride, filt, act, q):
    def size(n, f, s):
        return (n + s - 1) // s if padding == Padding.SAME else (n - f + s) // s
    out_shape = [in_shape[0], size(in_shape[1], filt[0], stride[0]), size(in_shape[2], filt[1], stride[1]), in_shape[3]]
    m = TfLiteModelBuilder()
    x = m.add_input("x", in_shape, dtype, **q)
    y = m.add_tensor("y", out_shape, dtype, **q)
    m.add_operator(op, [x], [y], ("Pool2DOptions", {"padding": padding, "stride_h": stride[0], "stride_w": stride[1],
                                                    "filter_height": filt[0], "filter_width": filt[1],
                                                    "fused_activation_function": act}))
    m.set_outputs([y])
    return convert_partition(read_model(m.build())).model


@pytest.mark.parametrize("op", ["AVERAGE_POOL_2D", "MAX_POOL_2D"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("padding", [Padding.SAME, Padding.VALID])
@pytest.mark.parametrize("act", [0, 1, 2, 3])
def test_pools_random_geometries(op, dtype, padding, act):
    rng = np.random.default_rng([len(op), act, int(padding), dtype == np.int8])
    for k in range(12):
        h, w = (int(v) for v in rng.integers(1, 14, 2))
        c = int(rng.integers(1, 40)) if k % 4 != 3 else int(rng.integers(60, 150))  # past 64: whole steps
        filt = (int(rng.integers(1, min(h, 6) + 1)), int(rng.integers(1, min(w, 6) + 1)))
        stride = tuple(int(v) for v in rng.integers(1, 4, 2))
        zp = _zero_points(dtype)[k % 6]
        shape = [int(rng.integers(1, 3)), h, w, c]
        model = _pool(op, dtype, shape, padding, stride, filt, act,
                      {"scale": float(rng.uniform(0.005, 0.2)), "zero_point": zp})
        assert _numba_ran(model)
        for fill in (None, "min", "max"):
            assert_matches_reference(model, [_values(rng, shape, dtype, fill)], "numba")


@pytest.mark.parametrize("dtype", DTYPES)
def test_average_pool_rounding_ties_and_large_windows(dtype):
    """Sums that are exact halves round away from zero (negative ones for int8); large global
    windows take the float64 quotient path with big sums."""
    rng = np.random.default_rng(3)
    q = {"scale": 0.1, "zero_point": 0}
    for shape, filt in (([1, 2, 2, 6], (2, 2)), ([1, 1, 4, 5], (1, 4)), ([1, 64, 64, 33], (64, 64)),
                        ([2, 31, 17, 3], (31, 17))):
        model = _pool("AVERAGE_POOL_2D", dtype, shape, Padding.VALID, (1, 1), filt, 0, q)
        info = np.iinfo(dtype)
        ties = rng.choice(np.array([info.min, info.min + 1, -1 if dtype == np.int8 else 1, info.max], dtype), shape)
        for x in (ties, *(_values(rng, shape, dtype, fill) for fill in ("min", "max", None))):
            assert_matches_reference(model, [x], "numba")


def _nnapi_pool(op, t, in_shape, scalars, out_shape, zp=3):
    """An NNAPI pool with explicit signature inputs (pads, strides, filter, activation[, layout])."""
    mb = ModelBuilder()
    x = mb.add_operand(t, in_shape, scale=0.05, zero_point=zp)
    ins = [x]
    for v in scalars:
        ins.append(mb.add_bool(v) if isinstance(v, bool) else mb.add_int32(v))
    y = mb.add_operand(t, out_shape, scale=0.05, zero_point=zp)
    mb.add_operation(op, ins, [y])
    mb.identify_inputs_and_outputs([x], [y])
    return mb.finish()


@pytest.mark.parametrize("op", [OperationType.AVERAGE_POOL_2D, OperationType.MAX_POOL_2D])
@pytest.mark.parametrize("t,dtype", [(QU8, np.uint8), (QS8, np.int8)])
def test_pools_explicit_asymmetric_padding(op, t, dtype):
    rng = np.random.default_rng(11)
    # left, right, top, bottom, stride w, stride h, filter w, filter h, activation
    for scalars, in_shape, out_hw in (((0, 2, 1, 0, 2, 1, 3, 2, 0), [1, 5, 7, 4], (5, 4)),
                                      ((2, 2, 2, 2, 1, 1, 3, 3, 1), [2, 4, 4, 9], (6, 6)),
                                      ((1, 0, 0, 3, 3, 2, 2, 4, 3), [1, 9, 8, 5], (5, 3))):
        model = _nnapi_pool(op, t, in_shape, scalars, [in_shape[0], *out_hw, in_shape[3]])
        assert _numba_ran(model)
        for fill in (None, "min", "max"):
            assert_matches_reference(model, [_values(rng, in_shape, dtype, fill)], "numba")


@pytest.mark.parametrize("op", [OperationType.AVERAGE_POOL_2D, OperationType.MAX_POOL_2D])
def test_pools_decline_nchw(op):
    model = _nnapi_pool(op, QU8, [1, 4, 5, 6], (1, 1, 1, 1, 1, 1, 3, 3, 0, True), [1, 4, 5, 6])
    compiled = compile_model(model, backend_order=["numba", "reference"])
    assert [s.backend for s in compiled.static_plan.steps] == ["reference"]
    assert_matches_reference(model, [_values(np.random.default_rng(0), [1, 4, 5, 6], np.uint8)], "numba",
                             require_assigned=False)


# ---- MEAN ----------------------------------------------------------------------------------------

def _mean(dtype, shape, axes, keep, q):
    red = {a % len(shape) for a in axes}
    out = [1 if i in red else d for i, d in enumerate(shape) if keep or i not in red]
    m = TfLiteModelBuilder()
    x = m.add_input("x", shape, dtype, **q)
    a = m.add_constant("axes", np.asarray(axes, np.int32))
    y = m.add_tensor("y", out, dtype, **q)
    m.add_operator("MEAN", [x, a], [y], ("ReducerOptions", {"keep_dims": keep}))
    m.set_outputs([y])
    return convert_partition(read_model(m.build())).model


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,axes,keep", [
    ([1, 7, 7, 13], [1, 2], True), ([2, 5, 3, 40], [2, 1], True), ([3, 1, 9, 2], [1, 2], False),
    ([1, 112, 112, 3], [1, 2], True), ([4, 6, 33], [-1], False), ([2, 3, 4, 5], [3], True), ([257], [0], True),
    ([2, 3, 4, 5], [1], False), ([2, 3, 4, 5], [1, 2, 3], True), ([2, 3, 4, 5], [0, 1], False),
    ([3, 4], [0], True), ([6, 1, 1, 7], [1, 2], True), ([1, 9, 9, 150], [1, 2], True), ([2, 4, 70], [1], False),
])
def test_mean_contiguous_axes(dtype, shape, axes, keep):
    rng = np.random.default_rng(len(shape) * 100 + sum(shape))
    for zp in _zero_points(dtype):
        model = _mean(dtype, shape, axes, keep, {"scale": float(rng.uniform(0.01, 0.3)), "zero_point": zp})
        assert _numba_ran(model)
        for fill in (None, "min", "max"):
            assert_matches_reference(model, [_values(rng, shape, dtype, fill)], "numba")


@pytest.mark.parametrize("dtype", DTYPES)
def test_mean_declines_scattered_axes(dtype):
    model = _mean(dtype, [2, 3, 4, 5], [0, 2], True, {"scale": 0.1, "zero_point": 1})
    assert not _numba_ran(model)
    assert_matches_reference(model, [_values(np.random.default_rng(1), [2, 3, 4, 5], dtype)], "numba",
                             require_assigned=False)


# ---- RESIZE --------------------------------------------------------------------------------------

def _resize(op, dtype, in_shape, size, mode, q):
    options = {"RESIZE_BILINEAR": "ResizeBilinearOptions", "RESIZE_NEAREST_NEIGHBOR": "ResizeNearestNeighborOptions"}
    m = TfLiteModelBuilder()
    x = m.add_input("x", in_shape, dtype, **q)
    s = m.add_constant("size", np.asarray(size, np.int32))
    y = m.add_tensor("y", [in_shape[0], size[0], size[1], in_shape[3]], dtype, **q)
    m.add_operator(op, [x, s], [y], (options[op], {"align_corners": mode[0], "half_pixel_centers": mode[1]}))
    m.set_outputs([y])
    return convert_partition(read_model(m.build())).model


@pytest.mark.parametrize("op", ["RESIZE_BILINEAR", "RESIZE_NEAREST_NEIGHBOR"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", MODES)
def test_resize_every_corner_mode(op, dtype, mode):
    rng = np.random.default_rng([len(op), int(mode[0]), int(mode[1]), dtype == np.int8])
    cases = [([1, 56, 56, 32], [112, 112]), ([1, 1, 1, 3], [5, 7]), ([2, 2, 3, 5], [65, 9]), ([1, 1, 2, 4], [55, 1]),
             ([1, 9, 7, 17], [4, 3]), ([1, 5, 5, 8], [5, 5]), ([1, 3, 4, 1], [1, 1])]
    for _ in range(8):
        cases.append(([int(rng.integers(1, 3)), *(int(v) for v in rng.integers(1, 12, 2)), int(rng.integers(1, 40))],
                      [int(v) for v in rng.integers(1, 30, 2)]))
    for k, (shape, size) in enumerate(cases):
        model = _resize(op, dtype, shape, size, mode, {"scale": 0.05, "zero_point": _zero_points(dtype)[k % 6]})
        assert _numba_ran(model)
        for fill in (None, "min", "max"):
            assert_matches_reference(model, [_values(rng, shape, dtype, fill)], "numba")


@pytest.mark.parametrize("op", [OperationType.RESIZE_BILINEAR, OperationType.RESIZE_NEAREST_NEIGHBOR])
def test_resize_declines_nchw(op):
    mb = ModelBuilder()
    x = mb.add_operand(QS8, [1, 3, 4, 5], scale=0.05, zero_point=0)
    ins = [x, mb.add_int32(8), mb.add_int32(6), mb.add_bool(True)]
    y = mb.add_operand(QS8, [1, 3, 6, 8], scale=0.05, zero_point=0)
    mb.add_operation(op, ins, [y])
    mb.identify_inputs_and_outputs([x], [y])
    model = mb.finish()
    assert [s.backend for s in compile_model(model, backend_order=["numba", "reference"]).static_plan.steps] \
        == ["reference"]
