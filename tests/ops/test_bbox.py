"""AXIS_ALIGNED_BBOX_TRANSFORM against a per-box float64 formulation (random boxes, deltas and
images, several classes; quantized too), malformed data at execution and NNAPI's rules. Zero rois
(an empty intermediate) are CTS's bbox_graph_zero_sized."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hal.compiler import compile_model
from hal.errors import HalError
from hal.executor import execute
from hal.model import ModelBuilder
from hal.types import ErrorStatus, OperandType, OperationType

F32, F16, I32 = OperandType.TENSOR_FLOAT32, OperandType.TENSOR_FLOAT16, OperandType.TENSOR_INT32
QU8, QU16 = OperandType.TENSOR_QUANT8_ASYMM, OperandType.TENSOR_QUANT16_ASYMM
OP = OperationType.AXIS_ALIGNED_BBOX_TRANSFORM


def _model(n, classes, batches, t=F32, delta_t=None, roi_q=(0.0, 0), delta_q=(0.0, 0), info_q=(0.0, 0),
           out_q=(0.0, 0), roi_shape=None, out_shape=None):
    b = ModelBuilder()
    roi = b.add_operand(t, roi_shape or (n, 4), *roi_q)
    deltas = b.add_operand(delta_t or t, (n, classes * 4), *delta_q)
    split = b.add_operand(I32, (n,))
    info = b.add_operand(t, (batches, 2), *info_q)
    out = b.add_operand(t, out_shape or (n, classes * 4), *out_q)
    b.add_operation(OP, [roi, deltas, split, info], [out])
    b.identify_inputs_and_outputs([roi, deltas, split, info], [out])
    return b.finish()


def _reference(rois, deltas, split, info):
    """Per box and class, in float64: centre/size form, move, scale, back to corners, clip."""
    out = np.zeros(deltas.shape, np.float64)
    for i, (x1, y1, x2, y2) in enumerate(rois.astype(np.float64)):
        height, width = info[split[i]].astype(np.float64)
        w, h = x2 - x1, y2 - y1
        cx, cy = x1 + w / 2, y1 + h / 2
        for c in range(deltas.shape[1] // 4):
            dx, dy, dw, dh = deltas[i, 4 * c:4 * c + 4].astype(np.float64)
            nx, ny, nw, nh = cx + dx * w, cy + dy * h, w * np.exp(dw), h * np.exp(dh)
            box = [nx - nw / 2, ny - nh / 2, nx + nw / 2, ny + nh / 2]
            out[i, 4 * c:4 * c + 4] = [min(max(v, 0), lim) for v, lim in zip(box, (width, height) * 2)]
    return out


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 6), classes=st.integers(1, 3),
       batches=st.integers(1, 3))
def test_matches_float64_formulation(seed, n, classes, batches):
    rng = np.random.default_rng(seed)
    xy = rng.uniform(0, 50, (n, 2)).astype(np.float32)
    rois = np.concatenate([xy, xy + rng.uniform(0, 30, (n, 2)).astype(np.float32)], axis=1)
    deltas = rng.uniform(-1, 1, (n, classes * 4)).astype(np.float32)
    split = rng.integers(0, batches, n).astype(np.int32)
    info = rng.uniform(10, 80, (batches, 2)).astype(np.float32)
    out = execute(compile_model(_model(n, classes, batches)), [rois, deltas, split, info])[0]
    np.testing.assert_allclose(out, _reference(rois, deltas, split, info), rtol=1e-5, atol=1e-4)


def test_quantized_matches_dequantized_float():
    rng = np.random.default_rng(1)
    rois = np.sort(rng.integers(0, 400, (5, 2, 2)), axis=1).transpose(0, 2, 1).reshape(5, 4).astype(np.uint16)
    rois = rois[:, [0, 2, 1, 3]]  # (x1, y1, x2, y2) with x1 <= x2, y1 <= y2
    deltas = rng.integers(100, 156, (5, 8)).astype(np.uint8)
    split = np.array([0, 1, 0, 1, 1], np.int32)
    info = np.array([[400, 300], [200, 500]], np.uint16)
    q = _model(5, 2, 2, QU16, QU8, (0.125, 0), (0.05, 128), (0.125, 0), (0.125, 0))
    out = execute(compile_model(q), [rois, deltas, split, info])[0]
    want = _reference(rois * 0.125, (deltas.astype(np.float64) - 128) * 0.05, split, info * 0.125)
    assert out.dtype == np.uint16
    assert np.abs(out.astype(np.float64) - want / 0.125).max() <= 0.5 + 1e-3


@pytest.mark.parametrize("split, rois, match", [
    ([0, 2], [[0, 0, 1, 1], [0, 0, 1, 1]], "batch index 2"),
    ([0, -1], [[0, 0, 1, 1], [0, 0, 1, 1]], "batch index -1"),
    ([0, 0], [[0, 0, 1, 1], [2, 0, 1, 1]], "x2 < x1"),
])
def test_malformed_data_fails_cleanly(split, rois, match):
    compiled = compile_model(_model(2, 1, 2))
    with pytest.raises(HalError, match=match) as e:
        execute(compiled, [np.array(rois, np.float32), np.zeros((2, 4), np.float32), np.array(split, np.int32),
                           np.ones((2, 2), np.float32)])
    assert e.value.status == ErrorStatus.INVALID_ARGUMENT


@pytest.mark.parametrize("kwargs, match", [
    ({"delta_t": F16}, "input 1 must be of type"),
    ({"t": QU16, "delta_t": QU8, "roi_q": (0.25, 0), "delta_q": (0.1, 0), "info_q": (0.125, 0),
      "out_q": (0.125, 0)}, "scale 0.125"),
    ({"t": QU16, "delta_t": QU16, "roi_q": (0.125, 0), "delta_q": (0.125, 0), "info_q": (0.125, 0),
      "out_q": (0.125, 0)},
     "input 1 must be of type"),
    ({"roi_shape": (2, 5)}, r"roi must be \[num_rois, 4\]"),
    ({"roi_shape": (2, 4, 1)}, "must be rank 2"),
    ({"out_shape": (2, 5)}, "incompatible"),
])
def test_rejects(kwargs, match):
    with pytest.raises(HalError, match=match) as e:
        compile_model(_model(2, 1, 1, **kwargs))
    assert e.value.status == ErrorStatus.INVALID_ARGUMENT


def test_signed_deltas_match_unsigned():
    """QUANT8_ASYMM_SIGNED deltas q - 128 with zero point z - 128 are the same reals as the
    (CTS-tested) QUANT8_ASYMM q, z: the boxes must be identical."""
    rng = np.random.default_rng(2)
    rois = np.array([[8, 16, 80, 96], [0, 0, 40, 40], [100, 60, 300, 200]], np.uint16)
    deltas = rng.integers(0, 256, (3, 8)).astype(np.uint8)
    split, info = np.array([0, 0, 1], np.int32), np.array([[400, 300], [200, 500]], np.uint16)
    common = {"roi_q": (0.125, 0), "info_q": (0.125, 0), "out_q": (0.125, 0)}
    u = execute(compile_model(_model(3, 2, 2, QU16, QU8, delta_q=(0.02, 128), **common)), [rois, deltas, split, info])
    signed = _model(3, 2, 2, QU16, OperandType.TENSOR_QUANT8_ASYMM_SIGNED, delta_q=(0.02, 0), **common)
    s = execute(compile_model(signed), [rois, (deltas.astype(np.int16) - 128).astype(np.int8), split, info])
    np.testing.assert_array_equal(s[0], u[0])
