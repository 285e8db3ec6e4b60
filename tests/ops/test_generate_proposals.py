"""GENERATE_PROPOSALS against a float64 formulation with textbook greedy NMS, NHWC and NCHW, with
random anchors, deltas and scores; its data-dependent output count, declared or unknown, feeding a
later operation; and NNAPI's rules."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hal.compiler import compile_model
from hal.errors import HalError
from hal.executor import execute
from hal.model import ModelBuilder
from hal.types import ErrorStatus, OperandType, OperationType

F32, I32 = OperandType.TENSOR_FLOAT32, OperandType.TENSOR_INT32
OP = OperationType.GENERATE_PROPOSALS
DEFAULTS = {"strides": (4.0, 4.0), "pre": -1, "post": -1, "iou": 0.5, "min_size": 1.0, "nchw": False}


def _add_op(b, batches, h, w, a, delta_shape=None, anchor_shape=None, out_n=0, **kw):
    p = DEFAULTS | kw
    nchw = p["nchw"]
    ins = [b.add_operand(F32, (batches, a, h, w) if nchw else (batches, h, w, a)),
           b.add_operand(F32, delta_shape or ((batches, a * 4, h, w) if nchw else (batches, h, w, a * 4))),
           b.add_operand(F32, anchor_shape or (a, 4)), b.add_operand(F32, (batches, 2))]
    scalars = [b.add_float32(p["strides"][0]), b.add_float32(p["strides"][1]), b.add_int32(p["pre"]),
               b.add_int32(p["post"]), b.add_float32(p["iou"]), b.add_float32(p["min_size"]), b.add_bool(nchw)]
    outs = [b.add_operand(F32, (out_n,)), b.add_operand(F32, (out_n, 4)), b.add_operand(I32, (out_n,))]
    b.add_operation(OP, ins + scalars, outs)
    return ins, outs


def _model(*args, **kw):
    b = ModelBuilder()
    ins, outs = _add_op(b, *args, **kw)
    b.identify_inputs_and_outputs(ins, outs)
    return b.finish()


def _iou(a, b):
    inter = max(min(a[2], b[2]) - max(a[0], b[0]), 0) * max(min(a[3], b[3]) - max(a[1], b[1]), 0)
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)


def _reference(scores, deltas, anchors, info, p):
    """(scores, boxes, batches) in float64; scores [b, h, w, a], deltas [b, h, w, a, 4]."""
    out_s, out_b, out_i = [], [], []
    batches, h, w, a = scores.shape
    for b in range(batches):
        height, width = info[b]
        cand = []
        for y in range(h):
            for x in range(w):
                for k in range(a):
                    x1, y1, x2, y2 = anchors[k] + [x * p["strides"][1], y * p["strides"][0]] * 2
                    dx, dy, dw, dh = deltas[b, y, x, k]
                    bw, bh = x2 - x1, y2 - y1
                    cx, cy, nw, nh = x1 + bw / 2 + dx * bw, y1 + bh / 2 + dy * bh, bw * np.exp(dw), bh * np.exp(dh)
                    box = np.clip([cx - nw / 2, cy - nh / 2, cx + nw / 2, cy + nh / 2], 0, [width, height] * 2)
                    cand.append((scores[b, y, x, k], box))
        order = sorted(range(len(cand)), key=lambda i: -cand[i][0])
        if 0 < p["pre"] < len(order):
            order = order[:p["pre"]]
        limit = p["post"] if p["post"] > 0 else len(order)
        kept = []
        for i in order:
            box = cand[i][1]
            bw, bh = box[2] - box[0], box[3] - box[1]
            if not (bw > p["min_size"] and bh > p["min_size"] and box[0] + bw / 2 < width and box[1] + bh / 2 < height):
                continue
            if len(kept) < limit and all(_iou(box, cand[k][1]) < p["iou"] for k in kept):
                kept.append(i)
        out_s += [cand[i][0] for i in kept]
        out_b += [cand[i][1] for i in kept]
        out_i += [b] * len(kept)
    return np.array(out_s), np.array(out_b).reshape(-1, 4), np.array(out_i)


def _inputs(rng, batches, h, w, a):
    scores = rng.uniform(0, 1, (batches, h, w, a))
    deltas = rng.normal(0, 0.5, (batches, h, w, a, 4))
    xy = rng.uniform(-4, 8, (a, 2))
    anchors = np.concatenate([xy, xy + rng.uniform(1, 12, (a, 2))], axis=1)
    info = rng.uniform(8, 24, (batches, 2))
    return scores, deltas, anchors, info


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), batches=st.integers(1, 2), h=st.integers(1, 3), w=st.integers(1, 3),
       a=st.integers(1, 3), pre=st.integers(-1, 6), post=st.integers(-1, 4), iou=st.sampled_from([0.2, 0.5, 0.8]),
       nchw=st.booleans())
def test_matches_greedy_formulation(seed, batches, h, w, a, pre, post, iou, nchw):
    rng = np.random.default_rng(seed)
    scores, deltas, anchors, info = (x.astype(np.float32) for x in _inputs(rng, batches, h, w, a))
    p = DEFAULTS | {"pre": pre, "post": post, "iou": iou, "nchw": nchw}
    s_in, d_in = scores, deltas.reshape(batches, h, w, a * 4)
    if nchw:
        s_in, d_in = s_in.transpose(0, 3, 1, 2).copy(), d_in.transpose(0, 3, 1, 2).copy()
    out_s, out_b, out_i = execute(compile_model(_model(batches, h, w, a, **p)), [s_in, d_in, anchors, info])
    want_s, want_b, want_i = _reference(scores, deltas, anchors, info, p)
    np.testing.assert_allclose(out_s, want_s, rtol=1e-6)
    np.testing.assert_allclose(out_b, want_b, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(out_i, want_i)


def test_proposals_feed_a_later_operation():
    """The unknown count reaches AXIS_ALIGNED_BBOX_TRANSFORM, which zero deltas leave unchanged."""
    rng = np.random.default_rng(7)
    b = ModelBuilder()
    ins, (scores, rois, batches) = _add_op(b, 1, 3, 3, 2)
    deltas = b.add_operand(F32, (0, 4))
    b.add_operation(OperationType.MUL, [rois, b.add_constant(F32, [0.0]), b.add_int32(0)], [deltas])
    moved = b.add_operand(F32, (0, 4))
    b.add_operation(OperationType.AXIS_ALIGNED_BBOX_TRANSFORM, [rois, deltas, batches, ins[3]], [moved])
    b.identify_inputs_and_outputs(ins, [rois, moved])
    s, d, a, info = (x.astype(np.float32) for x in _inputs(rng, 1, 3, 3, 2))
    got_rois, got_moved = execute(compile_model(b.finish()), [s, d.reshape(1, 3, 3, 8), a, info])
    assert got_rois.shape[0] > 0
    np.testing.assert_allclose(got_moved, got_rois, rtol=1e-6, atol=1e-5)


def test_declared_count_must_match():
    rng = np.random.default_rng(8)
    s, d, a, info = (x.astype(np.float32) for x in _inputs(rng, 1, 2, 2, 1))
    args = [s, d.reshape(1, 2, 2, 4), a, info]
    n = len(execute(compile_model(_model(1, 2, 2, 1)), args)[0])
    assert len(execute(compile_model(_model(1, 2, 2, 1, out_n=n)), args)[0]) == n
    with pytest.raises(HalError):
        execute(compile_model(_model(1, 2, 2, 1, out_n=n + 1)), args)


@pytest.mark.parametrize("kwargs, match", [
    ({"delta_shape": (1, 2, 2, 7)}, "deltas must be"),
    ({"anchor_shape": (3, 4)}, r"anchors must be \[2, 4\]"),
    ({"anchor_shape": (2, 4, 1)}, "must be rank 2"),
])
def test_rejects(kwargs, match):
    with pytest.raises(HalError, match=match) as e:
        compile_model(_model(1, 2, 2, 2, **kwargs))
    assert e.value.status == ErrorStatus.INVALID_ARGUMENT


QU8, QS8 = OperandType.TENSOR_QUANT8_ASYMM, OperandType.TENSOR_QUANT8_ASYMM_SIGNED
COVERED = {(OP, QS8)}  # NNAPI 1.3: not in the 1.0-1.2 CTS


def _quant_model(t, shift):
    b = ModelBuilder()
    ins = [b.add_operand(t, (2, 2, 2, 2), 0.01, 100 - shift), b.add_operand(t, (2, 2, 2, 8), 0.05, 128 - shift),
           b.add_operand(OperandType.TENSOR_QUANT16_SYMM, (2, 4), 0.125, 0),
           b.add_operand(OperandType.TENSOR_QUANT16_ASYMM, (2, 2), 0.125, 0)]
    scalars = [b.add_float32(4.0), b.add_float32(4.0), b.add_int32(-1), b.add_int32(-1), b.add_float32(0.3),
               b.add_float32(1.0), b.add_bool(False)]
    outs = [b.add_operand(t, (0,), 0.01, 100 - shift),
            b.add_operand(OperandType.TENSOR_QUANT16_ASYMM, (0, 4), 0.125, 0), b.add_operand(I32, (0,))]
    b.add_operation(OP, ins + scalars, outs)
    b.identify_inputs_and_outputs(ins, outs)
    return compile_model(b.finish())


def test_signed_matches_unsigned():
    """TENSOR_QUANT8_ASYMM_SIGNED values q - 128 with zero point z - 128 are the same reals as the
    (CTS-tested) TENSOR_QUANT8_ASYMM q, z: the same proposals, scores shifted by 128."""
    rng = np.random.default_rng(12)
    scores = rng.integers(0, 256, (2, 2, 2, 2)).astype(np.uint8)
    deltas = rng.integers(108, 148, (2, 2, 2, 8)).astype(np.uint8)
    anchors = np.array([[0, 8, 32, 24], [8, 0, 24, 32]], np.int16)
    info = np.array([[256, 256], [128, 200]], np.uint16)
    u = execute(_quant_model(QU8, 0), [scores, deltas, anchors, info])
    s = execute(_quant_model(QS8, 128), [(scores.astype(np.int16) - 128).astype(np.int8),
                                         (deltas.astype(np.int16) - 128).astype(np.int8), anchors, info])
    assert len(u[0]) > 0
    np.testing.assert_array_equal(s[0].astype(np.int16) + 128, u[0])
    np.testing.assert_array_equal(s[1], u[1])
    np.testing.assert_array_equal(s[2], u[2])
