"""BOX_WITH_NMS_LIMIT beyond CTS: its data-dependent output count through hal's per-execution
planning (and a real service), hard NMS against a textbook greedy NMS written independently,
the signed quantized type through CTS's own vectors shifted, and NNAPI's rules."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hal.compiler import compile_model
from hal.errors import HalError
from hal.executor import execute, execute_request
from hal.model import DataLocation, ModelBuilder, Request, RequestArgument
from hal.support import support_reasons
from hal.types import ErrorStatus, OperandType, OperationType
from tests.ops._cts_signed import quant8_cases, run_signed

F32 = OperandType.TENSOR_FLOAT32
F16 = OperandType.TENSOR_FLOAT16
QU8 = OperandType.TENSOR_QUANT8_ASYMM
QS8 = OperandType.TENSOR_QUANT8_ASYMM_SIGNED
QU16 = OperandType.TENSOR_QUANT16_ASYMM
I32 = OperandType.TENSOR_INT32
NMS = OperationType.BOX_WITH_NMS_LIMIT
#: QS8 (NNAPI 1.3, not in the 1.2 corpus): CTS's quant8 vectors shifted (test_signed_matches_cts).
COVERED = {(NMS, QS8)}


def _nms_model(num_rois=4, num_classes=3, *, kernel=0, max_det=-1, iou=0.5, score_thr=0.05, nms_thr=0.01,
               sigma=0.5, t=F32, follow_with_roi_align=False, out_dims=(0,), scores_rank=2):
    """scores, boxes and batch indexes as model inputs; outputs of unknown size (0)."""
    b = ModelBuilder()
    q = dict(scale=0.01, zero_point=0) if t in (QU8, QS8) else {}
    roi_t, roi_q = (QU16, dict(scale=0.125, zero_point=0)) if t in (QU8, QS8) else (t, {})
    scores = b.add_operand(t, (num_rois, num_classes) if scores_rank == 2 else (num_rois,), **q)
    rois = b.add_operand(roi_t, (num_rois, num_classes * 4), **roi_q)
    batches = b.add_operand(I32, (num_rois,))
    scalar = OperandType.FLOAT16 if t == F16 else OperandType.FLOAT32
    params = [b.add_scalar(scalar, score_thr), b.add_int32(max_det), b.add_int32(kernel),
              b.add_scalar(scalar, iou), b.add_scalar(scalar, sigma), b.add_scalar(scalar, nms_thr)]
    outs = [b.add_operand(t, out_dims, **q), b.add_operand(roi_t, (*out_dims, 4), **roi_q),
            b.add_operand(I32, out_dims), b.add_operand(I32, out_dims)]
    b.add_operation(NMS, [scores, rois, batches, *params], outs)
    model_outs = outs
    inputs = [scores, rois, batches]
    if follow_with_roi_align:  # the detections feed ROI_ALIGN: its shape comes from the kernel's result
        fmap = b.add_operand(t, (1, 4, 4, 1), **q)
        pooled = b.add_operand(t, (0, 2, 2, 1), **q)
        b.add_operation(OperationType.ROI_ALIGN,
                        [fmap, outs[1], outs[3], b.add_int32(2), b.add_int32(2), b.add_scalar(scalar, 1.0),
                         b.add_scalar(scalar, 1.0), b.add_int32(2), b.add_int32(2), b.add_bool(False)], [pooled])
        inputs.append(fmap)
        model_outs = [outs[0], outs[2], pooled]
    b.identify_inputs_and_outputs(inputs, model_outs)
    return b.finish()


def _greedy_nms(scores, boxes, batches, score_thr, iou_thr, max_det):
    """Textbook hard NMS, per image and class (not the background), then the image's best max_det,
    ordered by class then score. Distinct scores assumed (no ties to break)."""
    def iou(a, b):
        w = max(min(a[2], b[2]) - max(a[0], b[0]), 0.0)
        h = max(min(a[3], b[3]) - max(a[1], b[1]), 0.0)
        inter = w * h
        union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
        return inter / union if union > 0 else float("nan")

    out = []
    n, c = scores.shape
    for image in dict.fromkeys(batches.tolist()):
        rows = [r for r in range(n) if batches[r] == image]
        found = []
        for cls in range(1, c):
            kept = []
            for r in sorted((r for r in rows if scores[r, cls] > score_thr), key=lambda r: -scores[r, cls]):
                box = boxes[r, 4 * cls:4 * cls + 4]
                if all(not iou(box, boxes[k, 4 * cls:4 * cls + 4]) >= iou_thr for k in kept):
                    kept.append(r)
            found += [(scores[r, cls], cls, r) for r in kept]
        found.sort(key=lambda f: -f[0])
        if max_det >= 0:
            found = found[:max_det]
        found.sort(key=lambda f: (f[1], -f[0]))
        out += [(s, boxes[r, 4 * cls:4 * cls + 4], cls, image) for s, cls, r in found]
    return out


@st.composite
def detections(draw):
    n = draw(st.integers(1, 8))
    c = draw(st.integers(2, 4))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    scores = rng.permutation(np.linspace(0.06, 0.99, n * c)).astype(np.float32).reshape(n, c)  # distinct
    xy = rng.uniform(0, 10, (n, c, 2)).astype(np.float32)
    wh = rng.uniform(0.5, 6, (n, c, 2)).astype(np.float32)
    boxes = np.concatenate([xy, xy + wh], axis=2).reshape(n, c * 4).astype(np.float32)
    split = draw(st.integers(0, n))
    batches = np.array([0] * split + [1] * (n - split), np.int32)
    return scores, boxes, batches, draw(st.sampled_from([-1, 1, 3])), draw(st.sampled_from([0.3, 0.5, 0.7]))


@settings(max_examples=40, deadline=None)
@given(detections())
def test_hard_nms_matches_textbook_greedy_nms(case):
    scores, boxes, batches, max_det, iou = case
    n, c = scores.shape
    compiled = compile_model(_nms_model(n, c, max_det=max_det, iou=iou))
    got_scores, got_boxes, got_classes, got_batches = execute(compiled, [scores, boxes, batches])
    want = _greedy_nms(scores, boxes, batches, 0.05, iou, max_det)
    assert len(got_scores) == len(want)
    for k, (s, box, cls, image) in enumerate(want):
        assert (got_scores[k], got_classes[k], got_batches[k]) == (s, cls, image)
        np.testing.assert_array_equal(got_boxes[k], box)


def test_output_count_depends_on_the_values_and_feeds_the_next_operation():
    """One compiled model, three executions: 2, 0 and 1 detections; ROI_ALIGN after it is planned
    with each actual count (0: a zero-sized output, the operation skipped as AOSP does)."""
    compiled = compile_model(_nms_model(2, 2, follow_with_roi_align=True))
    assert compiled.static_plan is None and compiled.runtime_values
    assert support_reasons(compiled.model) == [None, None]
    boxes = np.array([[0, 0, 0, 0, 0, 0, 1, 1], [0, 0, 0, 0, 2, 2, 3, 3]], np.float32)
    fmap = np.arange(16, dtype=np.float32).reshape(1, 4, 4, 1)
    batches = np.zeros(2, np.int32)
    for class1_scores, count in (([0.9, 0.8], 2), ([0.01, 0.02], 0), ([0.9, 0.01], 1)):
        scores = np.array([[0.5, class1_scores[0]], [0.5, class1_scores[1]]], np.float32)
        out_scores, classes, pooled = execute(compiled, [scores, boxes, batches, fmap])
        assert out_scores.shape == (count,) and classes.shape == (count,) and pooled.shape == (count, 2, 2, 1)
        assert (classes == 1).all()


def test_declared_output_count_must_match_the_result():
    compiled = compile_model(_nms_model(2, 2, out_dims=(1,)))
    scores = np.array([[0.5, 0.9], [0.5, 0.8]], np.float32)
    boxes = np.array([[0, 0, 0, 0, 0, 0, 1, 1], [0, 0, 0, 0, 2, 2, 3, 3]], np.float32)
    with pytest.raises(HalError) as e:
        execute(compiled, [scores, boxes, np.zeros(2, np.int32)])
    assert "output 0 came out" in e.value.message


def test_request_with_unknown_output_size_gets_the_count_back():
    compiled = compile_model(_nms_model(2, 2))
    scores = np.array([[0.5, 0.9], [0.5, 0.8]], np.float32)
    boxes = np.array([[0, 0, 0, 0, 0, 0, 1, 1], [0, 0, 0, 0, 2, 2, 3, 3]], np.float32)
    args = [scores.tobytes(), boxes.tobytes(), np.zeros(2, np.int32).tobytes()]
    pool = bytearray(b"".join(args))
    offsets = np.cumsum([0] + [len(a) for a in args])
    inputs = [RequestArgument(location=DataLocation(0, int(o), len(a))) for o, a in zip(offsets, args)]
    outputs = [RequestArgument(location=DataLocation(k + 1, 0, 4)) for k in range(4)]
    request = Request(inputs=inputs, outputs=outputs, pools=[pool] + [bytearray(4) for _ in range(4)])
    with pytest.raises(HalError) as e:
        execute_request(compiled, request)
    assert e.value.status == ErrorStatus.OUTPUT_INSUFFICIENT_SIZE
    assert [s.dimensions for s in e.value.output_shapes] == [(2,), (2, 4), (2,), (2,)]


def test_through_a_real_service(server):
    """Outputs of unknown size through `nnhal serve`: the client retries with the reported sizes."""
    from service.client import Client
    model = _nms_model(2, 2, follow_with_roi_align=True)
    boxes = np.array([[0, 0, 0, 0, 0, 0, 1, 1], [0, 0, 0, 0, 2, 2, 3, 3]], np.float32)
    fmap = np.arange(16, dtype=np.float32).reshape(1, 4, 4, 1)
    local = compile_model(model)
    with Client.connect(server.address) as client:
        assert client.get_supported_operations(model) == [True, True]
        prepared = client.prepare_model(model)
        for class1 in ([0.9, 0.8], [0.01, 0.02]):
            args = [np.array([[0.5, class1[0]], [0.5, class1[1]]], np.float32), boxes, np.zeros(2, np.int32), fmap]
            got = prepared.execute(args).outputs
            for g, w in zip(got, execute(local, args)):
                np.testing.assert_array_equal(g, w)


def test_signed_matches_cts():
    assert not run_signed(quant8_cases("BOX_WITH_NMS_LIMIT", "box_with_nms_limit"))


def _refused(model, fragment: str) -> None:
    with pytest.raises(HalError) as e:
        compile_model(model)
    assert e.value.status == ErrorStatus.INVALID_ARGUMENT and fragment in e.value.message, e.value.message


def test_validation_errors():
    _refused(_nms_model(kernel=3), "NMS kernel must be 0")
    _refused(_nms_model(num_classes=1), "at least 2 classes")
    _refused(_nms_model(scores_rank=1), "rank 2")
    b = ModelBuilder()  # boxes of the wrong width
    scores = b.add_operand(F32, (2, 3))
    rois = b.add_operand(F32, (2, 8))
    batches = b.add_operand(I32, (2,))
    params = [b.add_float32(0.1), b.add_int32(-1), b.add_int32(0), b.add_float32(0.5), b.add_float32(0.5),
              b.add_float32(0.1)]
    outs = [b.add_operand(F32, (0,)), b.add_operand(F32, (0, 4)), b.add_operand(I32, (0,)), b.add_operand(I32, (0,))]
    b.add_operation(NMS, [scores, rois, batches, *params], outs)
    b.identify_inputs_and_outputs([scores, rois, batches], outs)
    _refused(b.finish(), "boxes must be [2, 12]")


def test_quantized_boxes_need_nnapi_quantization():
    model = _nms_model(t=QU8)
    model.main.operands[model.main.operations[0].inputs[1]].scale = 0.25
    with pytest.raises(HalError) as e:
        compile_model(model)
    assert "scale 0.125" in e.value.message


def test_malformed_box_is_an_execution_error_not_a_crash():
    compiled = compile_model(_nms_model(2, 2))
    scores = np.array([[0.5, 0.9], [0.5, 0.8]], np.float32)
    boxes = np.array([[0, 0, 0, 0, 5, 0, 1, 1], [0, 0, 0, 0, 2, 2, 3, 3]], np.float32)  # x2 < x1
    with pytest.raises(HalError) as e:
        execute(compiled, [scores, boxes, np.zeros(2, np.int32)])
    assert e.value.status == ErrorStatus.INVALID_ARGUMENT and "x2 < x1" in e.value.message
