"""DETECTION_POSTPROCESSING against a float64 formulation with textbook greedy NMS (sort by score,
keep a box unless it overlaps a kept one), regular and fast, with random anchors, deltas and
scores; and NNAPI's parameter rules."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hal.compiler import compile_model
from hal.errors import HalError
from hal.executor import execute
from hal.model import ModelBuilder
from hal.types import ErrorStatus, OperandType, OperationType

F32, F16 = OperandType.TENSOR_FLOAT32, OperandType.TENSOR_FLOAT16
OP = OperationType.DETECTION_POSTPROCESSING
DEFAULTS = {"scales": (10.0, 10.0, 5.0, 5.0), "regular": True, "max_det": 3, "max_cls": 1, "per_cls": 2,
            "score_thr": 0.1, "iou_thr": 0.5, "bg": False}


def _model(batches, anchors, classes, box_len=4, t=F32, scalar_t=OperandType.FLOAT32, **kw):
    p = DEFAULTS | kw
    b = ModelBuilder()
    ins = [b.add_operand(t, (batches, anchors, classes)), b.add_operand(t, (batches, anchors, box_len)),
           b.add_operand(t, (anchors, 4))]
    scalars = [b.add_scalar(scalar_t, v) for v in p["scales"]]
    scalars += [b.add_bool(p["regular"]), b.add_int32(p["max_det"]), b.add_int32(p["max_cls"]),
                b.add_int32(p["per_cls"]), b.add_scalar(scalar_t, p["score_thr"]),
                b.add_scalar(scalar_t, p["iou_thr"]), b.add_bool(p["bg"])]
    n = max(p["max_det"], 0) * (1 if p["regular"] else max(p["max_cls"], 0))
    outs = [b.add_operand(t, (batches, n)), b.add_operand(t, (batches, n, 4)),
            b.add_operand(OperandType.TENSOR_INT32, (batches, n)), b.add_operand(OperandType.TENSOR_INT32, (batches,))]
    b.add_operation(OP, ins + scalars, outs)
    b.identify_inputs_and_outputs(ins, outs)
    return b.finish()


def _iou(a, b):
    inter = max(min(a[2], b[2]) - max(a[0], b[0]), 0) * max(min(a[3], b[3]) - max(a[1], b[1]), 0)
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)


def _greedy(cands, score, box, limit, thr):
    kept = []
    for i in sorted(cands, key=lambda i: -score(i)):
        if len(kept) < limit and all(_iou(box(i), box(k)) < thr for k in kept):
            kept.append(i)
    return kept


def _reference(scores, deltas, anchors, p):
    """(score, box, class) detections of one image, in output order, in float64."""
    sy, sx, sh, sw = p["scales"]
    s, d, a = (x.astype(np.float64) for x in (scores, deltas, anchors))
    yc, xc = a[:, 0] + a[:, 2] * d[:, 0] / sy, a[:, 1] + a[:, 3] * d[:, 1] / sx
    hh, hw = a[:, 2] * np.exp(d[:, 2] / sh) / 2, a[:, 3] * np.exp(d[:, 3] / sw) / 2
    boxes = np.stack([yc - hh, xc - hw, yc + hh, xc + hw], axis=1)
    shift = 0 if p["bg"] else 1
    if p["regular"]:
        out = []
        for c in range(1, s.shape[1]):
            cands = [i for i in range(len(s)) if s[i, c] > p["score_thr"]]
            kept = _greedy(cands, lambda i, c=c: s[i, c], lambda i: boxes[i], p["per_cls"], p["iou_thr"])
            out += [(s[i, c], boxes[i], c - shift) for i in kept]
        return sorted(out, key=lambda o: -o[0])[:p["max_det"]]
    best = s[:, 1:].max(axis=1)
    cands = [i for i in range(len(s)) if best[i] > p["score_thr"]]
    out = []
    for i in _greedy(cands, lambda i: best[i], lambda i: boxes[i], p["max_det"], p["iou_thr"]):
        for c in (1 + np.argsort(-s[i, 1:]))[:min(s.shape[1] - 1, p["max_cls"])]:
            out.append((s[i, c], boxes[i], c - shift))
    return out


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), batches=st.integers(1, 2), anchors=st.integers(1, 8),
       classes=st.integers(2, 4), regular=st.booleans(), bg=st.booleans(), max_det=st.integers(1, 5),
       max_cls=st.integers(1, 3), per_cls=st.integers(1, 3), iou_thr=st.sampled_from([0.1, 0.3, 0.5, 0.9]))
def test_matches_greedy_formulation(seed, batches, anchors, classes, regular, bg, max_det, max_cls, per_cls, iou_thr):
    rng = np.random.default_rng(seed)
    p = DEFAULTS | {"regular": regular, "bg": bg, "max_det": max_det, "max_cls": max_cls, "per_cls": per_cls,
                    "iou_thr": iou_thr}
    scores = rng.uniform(0, 1, (batches, anchors, classes)).astype(np.float32)
    deltas = rng.normal(0, 2, (batches, anchors, 4)).astype(np.float32)
    anc = np.concatenate([rng.uniform(0, 3, (anchors, 2)), rng.uniform(0.5, 2, (anchors, 2))], 1).astype(np.float32)
    out_s, out_b, out_c, counts = execute(compile_model(_model(batches, anchors, classes, **p)), [scores, deltas, anc])
    for b in range(batches):
        want = _reference(scores[b], deltas[b], anc, p)
        n = len(want)
        assert counts[b] == n
        np.testing.assert_allclose(out_s[b, :n], [w[0] for w in want], rtol=1e-6)
        np.testing.assert_allclose(out_b[b, :n].reshape(n, 4), np.array([w[1] for w in want]).reshape(n, 4),
                                   rtol=1e-4, atol=1e-4)
        np.testing.assert_array_equal(out_c[b, :n], [w[2] for w in want])
        assert not out_s[b, n:].any() and not out_b[b, n:].any() and not out_c[b, n:].any()


def test_float16():
    rng = np.random.default_rng(5)
    scores = rng.uniform(0, 1, (1, 6, 3)).astype(np.float16)
    deltas = rng.normal(0, 1, (1, 6, 4)).astype(np.float16)
    anc = np.concatenate([rng.uniform(0, 3, (6, 2)), rng.uniform(0.5, 2, (6, 2))], 1).astype(np.float16)
    half = execute(compile_model(_model(1, 6, 3, t=F16, scalar_t=OperandType.FLOAT16)), [scores, deltas, anc])
    full = execute(compile_model(_model(1, 6, 3)), [x.astype(np.float32) for x in (scores, deltas, anc)])
    for h, f in zip(half, full):
        np.testing.assert_allclose(h.astype(np.float32), f, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("args, kwargs, match", [
    ((1, 4, 3), {"max_det": 0}, "max_num_detections must be > 0"),
    ((1, 4, 3), {"scales": (10.0, 0.0, 5.0, 5.0)}, "box scale"),
    ((1, 4, 3), {"iou_thr": -0.5}, "threshold"),
    ((1, 4, 3), {"regular": False, "max_cls": 0}, "max_classes_per_detection must be > 0"),
    ((1, 4, 3), {"per_cls": 0}, "max_num_detections_per_class must be > 0"),
    ((1, 4, 1), {}, "at least 2 classes"),
    ((1, 4, 3, 3), {}, "deltas must be"),
    ((1, 4, 3), {"t": F16}, "must be of type FLOAT16"),
])
def test_rejects(args, kwargs, match):
    with pytest.raises(HalError, match=match) as e:
        compile_model(_model(*args, **kwargs))
    assert e.value.status == ErrorStatus.INVALID_ARGUMENT
