"""CUSTOM TFLite_Detection_PostProcess through the delegate (-> NNAPI DETECTION_POSTPROCESSING)
in the real TFLite interpreter, against TFLite's own CPU kernel.

An SSD-style head: image -> two CONV_2D (box encodings, class logits) -> RESHAPE -> LOGISTIC ->
TFLite_Detection_PostProcess with constant anchors. Labels and counts must be equal; scores
(copies of the LOGISTIC's output, which hal and TFLite may round differently) and boxes (TFLite
decodes in double, NNAPI in float32: see delegate/mapping/detection_postprocess.py) within float
tolerance. Rows past the number of detections are compared only where TFLite writes them
(regular NMS: zeros).
"""
from __future__ import annotations

import numpy as np
import pytest
from flatbuffers import flexbuffers

from delegate import load_delegate
from delegate.mapping import MappingError, convert_partition
from delegate.mapping.detection_postprocess import read_options
from delegate.tfl import TfLiteModelBuilder, read_model
from hal.types import OperandType, OperationType
from tests.delegate.helpers import interpreter, run
from tests.harness import assert_float_close

COVERED = {(OperationType.DETECTION_POSTPROCESSING, OperandType.TENSOR_FLOAT32)}

H = W = 4
PER_CELL = 2  # anchors per cell
A = H * W * PER_CELL
CHANNELS = 3


def options(**kw) -> bytes:
    o = dict(max_detections=5, max_classes_per_detection=1, detections_per_class=3, use_regular_nms=False,
             nms_score_threshold=0.3, nms_iou_threshold=0.5, num_classes=4, y_scale=10.0, x_scale=10.0,
             h_scale=5.0, w_scale=5.0)
    o.update(kw)
    fbb = flexbuffers.Builder()
    with fbb.Map():
        for k, v in o.items():
            if v is None:
                continue
            if isinstance(v, bool):
                fbb.Bool(k, v)
            elif isinstance(v, int):
                fbb.Int(k, v)
            else:
                fbb.Float(k, v)
    return bytes(fbb.Finish())


def anchors() -> np.ndarray:
    """A grid of centre-size anchors (two sizes per cell), as SSD's anchor generator makes them."""
    rows = []
    for i in range(H):
        for j in range(W):
            for s in (0.3, 0.5):
                rows.append(((i + 0.5) / H, (j + 0.5) / W, s, s * 0.8))
    return np.array(rows, np.float32)


def ssd_model(seed: int = 0, background: bool = True, logistic: bool = True, columns: int | None = None,
              **opts) -> bytes:
    rng = np.random.default_rng(seed)
    num_classes = opts.get("num_classes", 4)
    columns = columns or num_classes + (1 if background else 0)
    o = options(**opts)
    k = (opts.get("max_detections") or 5) * opts.get("max_classes_per_detection", 1)
    b = TfLiteModelBuilder()
    x = b.add_input("image", [1, H, W, CHANNELS])
    conv = ("Conv2DOptions", {"padding": 0, "stride_w": 1, "stride_h": 1, "fused_activation_function": 0})

    def head(name, depth, per_anchor, spread):
        w = b.add_constant(f"{name}_w", rng.normal(0, spread, (depth, 3, 3, CHANNELS)).astype(np.float32))
        bias = b.add_constant(f"{name}_b", rng.normal(0, spread, depth).astype(np.float32))
        y = b.add_tensor(f"{name}_conv", [1, H, W, depth])
        b.add_operator("CONV_2D", [x, w, bias], [y], conv)
        r = b.add_tensor(name, [1, A, per_anchor])
        shape = b.add_constant(f"{name}_shape", np.array([1, A, per_anchor], np.int32))
        b.add_operator("RESHAPE", [y, shape], [r], ("ReshapeOptions", {"new_shape": [1, A, per_anchor]}))
        return r

    boxes = head("box_encodings", PER_CELL * 4, 4, 0.5)
    scores = head("class_logits", PER_CELL * columns, columns, 0.3)
    if logistic:
        s = b.add_tensor("class_scores", [1, A, columns])
        b.add_operator("LOGISTIC", [scores], [s])
        scores = s
    anc = b.add_constant("anchors", anchors())
    outs = [b.add_tensor("detection_boxes", [1, k, 4]), b.add_tensor("detection_classes", [1, k]),
            b.add_tensor("detection_scores", [1, k]), b.add_tensor("num_detections", [1])]
    b.add_operator("CUSTOM", [boxes, scores, anc], outs, custom_code="TFLite_Detection_PostProcess",
                   custom_options=o)
    b.set_outputs(outs)
    return b.build()


def assert_same_detections(got, want, regular: bool, k: int = 1) -> None:
    g_boxes, g_classes, g_scores, g_num = got
    w_boxes, w_classes, w_scores, w_num = want
    for g, w in zip(got, want):
        assert g.dtype == w.dtype == np.float32 and g.shape == w.shape
    np.testing.assert_array_equal(g_num, w_num)
    # TFLite's fast NMS leaves the rows past its detections unwritten; regular NMS zeroes them
    n = g_classes.shape[1] if regular else int(w_num[0]) * k
    np.testing.assert_array_equal(g_classes[:, :n], w_classes[:, :n])
    assert_float_close(g_scores[:, :n], w_scores[:, :n])
    assert_float_close(g_boxes[:, :n], w_boxes[:, :n])


def _compare(server, model: bytes, regular: bool, k: int = 1, runs: int = 4, seed: int = 0):
    d = load_delegate(server.address)
    it, ref = interpreter(model, d), interpreter(model)
    rng = np.random.default_rng(seed)
    counts = []
    for _ in range(runs):
        x = rng.normal(0, 1, (1, H, W, CHANNELS)).astype(np.float32)
        got, want = run(it, [x]), run(ref, [x])
        assert_same_detections(got, want, regular, k)
        counts.append(int(want[3][0]))
    return d.report, counts


@pytest.mark.parametrize("regular", [False, True], ids=["fast_nms", "regular_nms"])
def test_ssd_head_delegated_whole_matches_tflite(server, regular):
    model = ssd_model(use_regular_nms=regular)
    rep, counts = _compare(server, model, regular)
    assert rep.delegated == len(rep.nodes) and len(rep.partitions) == 1, [(n.op, n.reason) for n in rep.nodes]
    assert any(0 < c for c in counts), counts  # the test exercises detections, not empty outputs


def test_fast_nms_several_classes_per_detection(server):
    """k = 3 classes per anchor: NNAPI's count (anchors * k) divided back to TFLite's (anchors)."""
    rep, counts = _compare(server, ssd_model(seed=1, max_classes_per_detection=3, num_classes=4), False, k=3)
    assert rep.delegated == len(rep.nodes) and len(rep.partitions) == 1
    assert any(0 < c for c in counts)


def test_predictions_without_background_column(server):
    """num_classes == prediction columns: NNAPI's background column is added as zeros."""
    for regular in (False, True):
        rep, counts = _compare(server, ssd_model(seed=2, background=False, use_regular_nms=regular), regular)
        assert rep.delegated == len(rep.nodes) and len(rep.partitions) == 1
        assert any(0 < c for c in counts)


def direct_model(**opts) -> bytes:
    """Box encodings and scores as model inputs, two anchors: (0.5, 0.5, 1, 1) and (0.5, 0.25, 1, 0.5)."""
    o = options(**opts)
    k = read_options(o)["max_detections"] * read_options(o)["max_classes_per_detection"]
    b = TfLiteModelBuilder()
    boxes = b.add_input("box_encodings", [1, 2, 4])
    scores = b.add_input("scores", [1, 2, 2])
    anc = b.add_constant("anchors", np.array([[0.5, 0.5, 1, 1], [0.5, 0.25, 1, 0.5]], np.float32))
    outs = [b.add_tensor("detection_boxes", [1, k, 4]), b.add_tensor("detection_classes", [1, k]),
            b.add_tensor("detection_scores", [1, k]), b.add_tensor("num_detections", [1])]
    b.add_operator("CUSTOM", [boxes, scores, anc], outs, custom_code="TFLite_Detection_PostProcess",
                   custom_options=o)
    b.set_outputs(outs)
    return b.build()


@pytest.mark.parametrize("regular", [False, True], ids=["fast_nms", "regular_nms"])
def test_thresholds_compare_as_tflite(server, regular):
    """A score equal to the score threshold is kept, boxes whose IoU equals the IoU threshold
    (exactly 0.5 here: [0, 0, 1, 1] and [0, 0, 1, 0.5]) both survive, as in TFLite (>= and >;
    NNAPI's > and >= are given the neighbouring float32 thresholds)."""
    model = direct_model(num_classes=1, max_detections=2, nms_score_threshold=0.25, nms_iou_threshold=0.5,
                         use_regular_nms=regular)
    d = load_delegate(server.address)
    it, ref = interpreter(model, d), interpreter(model)
    deltas = np.zeros((1, 2, 4), np.float32)
    for second in (0.25, np.nextafter(np.float32(0.25), np.float32(0)), 0.5):
        scores = np.array([[[0, 0.75], [0, second]]], np.float32)
        got, want = run(it, [deltas, scores]), run(ref, [deltas, scores])
        assert want[3][0] == (1 if second < 0.25 else 2)
        assert_same_detections(got, want, regular)
    assert d.report.delegated == len(d.report.nodes) == 1


def test_refused_variant_stays_on_cpu(server):
    """Regular NMS with max_classes_per_detection 2: TFLite's outputs have twice the rows it writes,
    NNAPI's only those; the node stays with TFLite, the convolutions are still delegated
    (largest-first: whatever their estimated cost)."""
    model = ssd_model(use_regular_nms=True, max_classes_per_detection=2)
    d = load_delegate(server.address, partitioning="largest")
    it, ref = interpreter(model, d), interpreter(model)
    x = np.random.default_rng(5).normal(0, 1, (1, H, W, CHANNELS)).astype(np.float32)
    got, want = run(it, [x]), run(ref, [x])
    n = int(want[3][0])
    np.testing.assert_array_equal(got[3], want[3])
    np.testing.assert_array_equal(got[1][:, :n], want[1][:, :n])
    assert_float_close(got[2][:, :n], want[2][:, :n])
    assert_float_close(got[0][:, :n], want[0][:, :n])
    placement = {n.op: (n.placement, n.reason) for n in d.report.nodes}
    place, why = placement["CUSTOM(TFLite_Detection_PostProcess)"]
    assert place == "CPU" and "max_classes_per_detection 2" in why, why
    assert d.report.delegated == len(d.report.nodes) - 1


@pytest.mark.parametrize("opts, why", [
    ({"nms_score_threshold": 0.0}, "nms_score_threshold"),
    ({"nms_iou_threshold": 1.5}, "nms_iou_threshold"),
    ({"max_classes_per_detection": 5}, "max_classes_per_detection 5 > num_classes 4"),
    ({"num_classes": 2, "columns": 5}, "num_classes 2 with 5"),
    ({"y_scale": 0.0}, "y_scale"),
    ({"max_detections": 0}, "max_detections 0"),
    ({"max_detections": None}, "lack max_detections"),
])
def test_refusals_name_the_reason(opts, why):
    graph = read_model(ssd_model(**opts))
    with pytest.raises(MappingError, match=why):
        convert_partition(graph)


def quantized_model(**opts) -> bytes:
    """uint8 box encodings and class predictions (model inputs) and uint8 anchors, as quantized SSD
    models have them; 12 anchors, 3 classes + background."""
    o = options(num_classes=3, **opts)
    k = (opts.get("max_detections") or 5) * opts.get("max_classes_per_detection", 1)
    b = TfLiteModelBuilder()
    boxes = b.add_input("box_encodings", [1, 12, 4], np.uint8, scale=0.05, zero_point=128)
    scores = b.add_input("scores", [1, 12, 4], np.uint8, scale=1 / 255, zero_point=0)
    q = np.round(anchors()[:12] / 0.01).astype(np.uint8)
    anc = b.add_constant("anchors", q, scale=0.01, zero_point=0)
    outs = [b.add_tensor("detection_boxes", [1, k, 4]), b.add_tensor("detection_classes", [1, k]),
            b.add_tensor("detection_scores", [1, k]), b.add_tensor("num_detections", [1])]
    b.add_operator("CUSTOM", [boxes, scores, anc], outs, custom_code="TFLite_Detection_PostProcess",
                   custom_options=o)
    b.set_outputs(outs)
    return b.build()


@pytest.mark.parametrize("regular", [False, True], ids=["fast_nms", "regular_nms"])
def test_quantized_inputs_dequantized_exactly(server, regular):
    """uint8 inputs: DEQUANTIZE in front, anchors dequantized at mapping time; scores are then
    equal (distinct score values: TFLite's and NNAPI's orders among equal scores differ)."""
    model = quantized_model(use_regular_nms=regular)
    d = load_delegate(server.address)
    it, ref = interpreter(model, d), interpreter(model)
    rng = np.random.default_rng(7)
    counts = []
    for _ in range(4):
        deltas = rng.integers(108, 148, (1, 12, 4)).astype(np.uint8)
        scores = rng.permutation(256)[:48].reshape(1, 12, 4).astype(np.uint8)
        got, want = run(it, [deltas, scores]), run(ref, [deltas, scores])
        assert_same_detections(got, want, regular)
        n = int(want[3][0])
        np.testing.assert_array_equal(got[2][:, :n], want[2][:, :n])
        counts.append(n)
    assert any(counts) and d.report.delegated == len(d.report.nodes) == 1, [n.reason for n in d.report.nodes]
