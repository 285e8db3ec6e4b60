"""HEATMAP_MAX_KEYPOINT on heatmaps that are exact quadratics (the quadratic fit must then find
their peak and peak value exactly), NCHW against NHWC, malformed boxes and NNAPI's rules."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hal.compiler import compile_model
from hal.errors import HalError
from hal.executor import execute
from hal.model import ModelBuilder
from hal.types import ErrorStatus, OperandType, OperationType

F32, QU8, QU16 = OperandType.TENSOR_FLOAT32, OperandType.TENSOR_QUANT8_ASYMM, OperandType.TENSOR_QUANT16_ASYMM
OP = OperationType.HEATMAP_MAX_KEYPOINT


def _model(shape, boxes_shape, nchw=False, t=F32, box_t=None, heat_q=(0.0, 0), box_q=(0.0, 0), out_shapes=None):
    b = ModelBuilder()
    heat = b.add_operand(t, shape, *heat_q)
    boxes = b.add_operand(box_t or t, boxes_shape, *box_q)
    n = shape[0]
    k = shape[1] if nchw else shape[-1]
    s_shape, k_shape = out_shapes or ((n, k), (n, k, 2))
    score = b.add_operand(t, s_shape, *heat_q)
    kp = b.add_operand(box_t or t, k_shape, *box_q)
    b.add_operation(OP, [heat, boxes, b.add_bool(nchw)], [score, kp])
    b.identify_inputs_and_outputs([heat, boxes], [score, kp])
    return b.finish()


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 3), k=st.integers(1, 3), size=st.integers(3, 8))
def test_finds_the_peak_of_a_quadratic(seed, n, k, size):
    rng = np.random.default_rng(seed)
    # peak (x0, y0) strictly inside, so its nearest cell (the maximum) is not on the border
    x0, y0 = (rng.uniform(1, size - 2, (n, k)) for _ in range(2))
    a, c = rng.uniform(0.5, 2, (n, k, 2)), rng.uniform(-5, 5, (n, k))
    ys, xs = np.mgrid[0:size, 0:size]
    heat = (c[:, :, None, None] - a[..., 0, None, None] * (xs - x0[..., None, None]) ** 2
            - a[..., 1, None, None] * (ys - y0[..., None, None]) ** 2).transpose(0, 2, 3, 1)
    xy = rng.uniform(0, 20, (n, 2))
    boxes = np.concatenate([xy, xy + rng.uniform(1, 20, (n, 2))], axis=1)
    score, kp = execute(compile_model(_model((n, size, size, k), (n, 4))),
                        [heat.astype(np.float32), boxes.astype(np.float32)])
    np.testing.assert_allclose(score, c, atol=2e-3)
    w, h = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
    want_x = (x0 + 0.5) / size * w[:, None] + boxes[:, 0:1]
    want_y = (y0 + 0.5) / size * h[:, None] + boxes[:, 1:2]
    np.testing.assert_allclose(kp[..., 0], want_x, atol=1e-3)
    np.testing.assert_allclose(kp[..., 1], want_y, atol=1e-3)


def test_nchw_matches_nhwc():
    rng = np.random.default_rng(3)
    heat = rng.normal(size=(2, 5, 5, 3)).astype(np.float32)
    boxes = np.array([[0, 0, 4, 8], [1, 2, 3, 4]], np.float32)
    nhwc = execute(compile_model(_model((2, 5, 5, 3), (2, 4))), [heat, boxes])
    nchw = execute(compile_model(_model((2, 3, 5, 5), (2, 4), nchw=True)), [heat.transpose(0, 3, 1, 2).copy(), boxes])
    for a, b in zip(nhwc, nchw):
        np.testing.assert_array_equal(a, b)


def test_malformed_box_fails_cleanly():
    compiled = compile_model(_model((1, 4, 4, 1), (1, 4)))
    with pytest.raises(HalError, match="x2 < x1") as e:
        execute(compiled, [np.zeros((1, 4, 4, 1), np.float32), np.array([[5, 0, 1, 1]], np.float32)])
    assert e.value.status == ErrorStatus.INVALID_ARGUMENT


@pytest.mark.parametrize("args, kwargs, match", [
    (((1, 1, 1, 2), (1, 4)), {}, "heatmap size must be >= 2"),
    (((1, 4, 5, 2), (1, 4)), {}, "must be square"),
    (((2, 4, 4, 2), (1, 4)), {}, r"boxes must be \[2, 4\]"),
    (((1, 4, 4), (1, 4)), {"out_shapes": ((1, 4), (1, 4, 2))}, "must be rank 4"),
    (((1, 4, 4, 1), (1, 4)), {"t": QU8, "box_t": QU16, "heat_q": (0.5, 0), "box_q": (0.25, 0)}, "scale 0.125"),
    (((1, 4, 4, 1), (1, 4)), {"t": QU8, "box_t": QU8, "heat_q": (0.5, 0), "box_q": (0.125, 0)},
     "input 1 must be of type"),
])
def test_rejects(args, kwargs, match):
    with pytest.raises(HalError, match=match) as e:
        compile_model(_model(*args, **kwargs))
    assert e.value.status == ErrorStatus.INVALID_ARGUMENT


COVERED = {(OP, OperandType.TENSOR_QUANT8_ASYMM_SIGNED)}  # NNAPI 1.3: not in the 1.0-1.2 CTS


def test_signed_matches_unsigned():
    """TENSOR_QUANT8_ASYMM_SIGNED values q - 128 with zero point z - 128 are the same reals as the
    (CTS-tested) TENSOR_QUANT8_ASYMM q, z: every result must be the same, scores shifted by 128."""
    rng = np.random.default_rng(11)
    heat = rng.integers(0, 256, (3, 5, 5, 2)).astype(np.uint8)
    xy = rng.integers(0, 100, (3, 2))
    boxes = np.concatenate([xy, xy + rng.integers(0, 100, (3, 2))], axis=1).astype(np.uint16)
    QS8 = OperandType.TENSOR_QUANT8_ASYMM_SIGNED
    u = execute(compile_model(_model((3, 5, 5, 2), (3, 4), t=QU8, box_t=QU16, heat_q=(0.5, 130), box_q=(0.125, 0))),
                [heat, boxes])
    s = execute(compile_model(_model((3, 5, 5, 2), (3, 4), t=QS8, box_t=QU16, heat_q=(0.5, 2), box_q=(0.125, 0))),
                [(heat.astype(np.int16) - 128).astype(np.int8), boxes])
    np.testing.assert_array_equal(s[0].astype(np.int16) + 128, u[0])
    np.testing.assert_array_equal(s[1], u[1])
