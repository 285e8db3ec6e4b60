"""ROI_ALIGN and ROI_POOLING beyond CTS: properties with an independent answer (bilinear sampling
is exact on a linear map, so ROI_ALIGN's bins average to the map at their centres; ROI_POOLING over
the whole map is the global maximum, or the map itself at full size), NCHW = NHWC transposed, the
signed quantized type through CTS's own vectors shifted, and NNAPI's rules."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hal.compiler import compile_model
from hal.errors import HalError
from hal.executor import execute
from hal.model import ModelBuilder
from hal.types import ErrorStatus, OperandType, OperationType
from tests.ops._cts_signed import quant8_cases, run_signed

F32 = OperandType.TENSOR_FLOAT32
QU8 = OperandType.TENSOR_QUANT8_ASYMM
QS8 = OperandType.TENSOR_QUANT8_ASYMM_SIGNED
QU16 = OperandType.TENSOR_QUANT16_ASYMM
I32 = OperandType.TENSOR_INT32
ALIGN, POOL = OperationType.ROI_ALIGN, OperationType.ROI_POOLING
#: QS8 (NNAPI 1.3, not in the 1.2 corpus): CTS's quant8 vectors shifted (test_signed_matches_cts).
COVERED = {(ALIGN, QS8), (POOL, QS8)}


def _model(op, in_shape, num_rois, out_hw=(2, 2), strides=(1.0, 1.0), sampling=(0, 0), nchw=False,
           t=F32, roi_scale=0.125, out_size_param=None, rois_rank=2):
    b = ModelBuilder()
    q = dict(scale=0.5, zero_point=3) if t in (QU8, QS8) else {}
    x = b.add_operand(t, in_shape, **q)
    roi_t, roi_q = (QU16, dict(scale=roi_scale, zero_point=0)) if t in (QU8, QS8) else (t, {})
    rois = b.add_operand(roi_t, (num_rois, 4) if rois_rank == 2 else (num_rois * 4,), **roi_q)
    batches = b.add_operand(I32, (num_rois,))
    oh, ow = out_hw if out_size_param is None else out_size_param
    params = [b.add_int32(oh), b.add_int32(ow), b.add_float32(strides[0]), b.add_float32(strides[1])]
    if op == ALIGN:
        params += [b.add_int32(sampling[0]), b.add_int32(sampling[1])]
    params.append(b.add_bool(nchw))
    out = b.add_operand(t, (), **q)
    b.add_operation(op, [x, rois, batches, *params], [out])
    b.identify_inputs_and_outputs([x, rois, batches], [out])
    return b.finish()


@st.composite
def linear_align_cases(draw):
    h, w, c = draw(st.integers(3, 8)), draw(st.integers(3, 8)), draw(st.integers(1, 3))
    stride = draw(st.sampled_from([0.5, 1.0, 2.0]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    coeffs = rng.uniform(-2, 2, 2).astype(np.float32)
    bias = rng.uniform(-1, 1, c).astype(np.float32)
    rois = []
    for _ in range(draw(st.integers(1, 3))):  # regions whose samples stay below the last row/column
        y1, x1 = rng.uniform(0, h - 2.2), rng.uniform(0, w - 2.2)
        y2, x2 = rng.uniform(y1, h - 1.1 - 1), rng.uniform(x1, w - 1.1 - 1)
        y2, x2 = max(y2, y1), max(x2, x1)
        rois.append([x1 * stride, y1 * stride, x2 * stride, y2 * stride])
    out_hw = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    sampling = (draw(st.integers(0, 3)), draw(st.integers(0, 3)))
    return h, w, c, stride, coeffs, bias, np.array(rois, np.float32), out_hw, sampling


@settings(max_examples=40, deadline=None)
@given(linear_align_cases())
def test_align_on_a_linear_map_gives_the_bin_centres(case):
    h, w, c, stride, (a, b), bias, rois, out_hw, sampling = case
    ys, xs = np.meshgrid(np.arange(h, dtype=np.float32), np.arange(w, dtype=np.float32), indexing="ij")
    fmap = (a * ys + b * xs)[None, :, :, None] + bias[None, None, None, :]
    model = _model(ALIGN, (1, h, w, c), len(rois), out_hw, (stride, stride), sampling)
    got = execute(compile_model(model), [fmap.astype(np.float32), rois, np.zeros(len(rois), np.int32)])[0]
    for r, (x1, y1, x2, y2) in enumerate(rois.astype(np.float64) / stride):
        hstep, wstep = max(y2 - y1, 1) / out_hw[0], max(x2 - x1, 1) / out_hw[1]
        cy = y1 + hstep * (np.arange(out_hw[0]) + 0.5)
        cx = x1 + wstep * (np.arange(out_hw[1]) + 0.5)
        want = (a * cy[:, None] + b * cx[None, :])[:, :, None] + bias
        np.testing.assert_allclose(got[r], want, rtol=1e-4, atol=1e-4)


def test_pooling_over_the_whole_map():
    rng = np.random.default_rng(5)
    fmap = rng.normal(size=(2, 5, 4, 3)).astype(np.float32)
    rois = np.array([[0, 0, 3, 4], [0, 0, 6, 8]], np.float32)  # the second at stride 2
    batches = np.array([1, 0], np.int32)
    pooled = execute(compile_model(_model(POOL, fmap.shape, 1, (1, 1), (1.0, 1.0))), [fmap, rois[:1], batches[:1]])[0]
    np.testing.assert_array_equal(pooled[0, 0, 0], fmap[1].max(axis=(0, 1)))
    full = execute(compile_model(_model(POOL, fmap.shape, 1, (5, 4), (2.0, 2.0))), [fmap, rois[1:], batches[1:]])[0]
    np.testing.assert_array_equal(full[0], fmap[0])


@pytest.mark.parametrize("op", [ALIGN, POOL])
def test_nchw_is_nhwc_transposed(op):
    rng = np.random.default_rng(1)
    fmap = rng.normal(size=(2, 6, 5, 3)).astype(np.float32)
    rois = np.array([[0.5, 1, 4, 5.5], [1, 0, 2, 2], [0, 0, 4, 5]], np.float32)
    batches = np.array([0, 1, 1], np.int32)
    nhwc = execute(compile_model(_model(op, fmap.shape, 3, (3, 2))), [fmap, rois, batches])[0]
    nchw = execute(compile_model(_model(op, (2, 3, 6, 5), 3, (3, 2), nchw=True)),
                   [fmap.transpose(0, 3, 1, 2).copy(), rois, batches])[0]
    np.testing.assert_array_equal(nchw, nhwc.transpose(0, 3, 1, 2))


@pytest.mark.parametrize("op, spec", [("ROI_ALIGN", "roi_align"), ("ROI_POOLING", "roi_pooling")])
def test_signed_matches_cts(op, spec):
    assert not run_signed(quant8_cases(op, spec))


def _refused(model, fragment: str) -> None:
    with pytest.raises(HalError) as e:
        compile_model(model)
    assert e.value.status == ErrorStatus.INVALID_ARGUMENT and fragment in e.value.message, e.value.message


@pytest.mark.parametrize("op", [ALIGN, POOL])
def test_validation_errors(op):
    _refused(_model(op, (1, 4, 4, 1), 1, out_size_param=(0, 2)), "output size) must be > 0")
    _refused(_model(op, (1, 4, 4, 1), 1, strides=(0.0, 1.0)), "(stride) must be > 0")
    _refused(_model(op, (1, 4, 4), 1), "rank 4")
    _refused(_model(op, (1, 4, 4, 1), 1, rois_rank=1), "rank 2")
    _refused(_model(op, (1, 4, 4, 1), 1, t=QU8, roi_scale=0.25), "scale 0.125")
    if op == ALIGN:
        _refused(_model(op, (1, 4, 4, 1), 1, sampling=(-1, 0)), "(sampling ratio) must be >= 0")


@pytest.mark.parametrize("op", [ALIGN, POOL])
@pytest.mark.parametrize("roi, batch, fragment", [
    ([0, 0, 9, 2], 0, "outside the 4x4"), ([3, 0, 1, 2], 0, "malformed"), ([-1, 0, 1, 2], 0, "malformed"),
    ([0, 0, 1, 1], 2, "batch index 2 is not in [0, 1)"),
])
def test_bad_regions_are_execution_errors_not_crashes(op, roi, batch, fragment):
    compiled = compile_model(_model(op, (1, 4, 4, 1), 1))
    with pytest.raises(HalError) as e:
        execute(compiled, [np.zeros((1, 4, 4, 1), np.float32), np.array([roi], np.float32),
                           np.array([batch], np.int32)])
    assert e.value.status == ErrorStatus.INVALID_ARGUMENT and fragment in e.value.message, e.value.message


def test_pooling_does_not_take_zero_sized_regions():
    """NNAPI 1.2 lets ROI_ALIGN take 0 regions (after BOX_WITH_NMS_LIMIT), not ROI_POOLING."""
    from hal.registry import lookup
    assert lookup(ALIGN).allow_zero_sized_inputs and not lookup(POOL).allow_zero_sized_inputs
