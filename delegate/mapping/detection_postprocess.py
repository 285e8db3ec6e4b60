"""CUSTOM TFLite_Detection_PostProcess (the SSD head's last op) -> NNAPI DETECTION_POSTPROCESSING.

TFLite's op: inputs box encodings [1, A, >= 4], class predictions [1, A, num_classes (+1 for the
background)], anchors [A, 4]; FlexBuffer options; outputs boxes [1, N, 4], classes [1, N],
scores [1, N], number of detections [1], all float32, N = max_detections * max_classes_per_detection.
NNAPI's has the same decoding and NMS (it was written after TFLite's), with these differences,
each made exact here or refused:
- outputs come in another order (scores, boxes, classes, number), classes and number as int32:
  CAST to float32 (exact: small integers);
- NNAPI keeps scores > threshold, TFLite >= threshold: NNAPI gets the float32 just below
  TFLite's (the same set of float32 scores); a threshold <= 0 cannot be expressed (NNAPI's must
  be >= 0) and is refused;
- NNAPI suppresses IoU >= threshold, TFLite IoU > threshold: NNAPI gets the float32 just above;
- class 0 of NNAPI's scores is always the background: predictions without a background column
  get a zero column in front (CONCATENATION), and is_bg_in_label=false gives TFLite's labels;
- fast NMS with max_classes_per_detection k > 1: NNAPI counts detections (anchors * k), TFLite
  anchors, so the count is divided by k (DIV, exact); k > num_classes leaves TFLite rows it never
  writes between anchors (NNAPI packs them): refused;
- regular NMS writes max_detections rows, but TFLite's outputs have max_detections *
  max_classes_per_detection: refused unless max_classes_per_detection is 1.
Rows past the number of detections: TFLite's regular NMS writes zeros as NNAPI does; its fast NMS
leaves them unwritten (whatever the arena held), NNAPI writes zeros.
Box decoding: TFLite computes the centre and half sizes in double, NNAPI (AOSP, hal) in float32:
boxes may differ in the last bit or so; labels, scores (copied from the input) and counts agree
unless an IoU falls within that rounding of the threshold, or scores tie (TFLite's and AOSP's
orders among equal scores differ).
Quantized (uint8) box encodings and class predictions go through DEQUANTIZE (exact: a float32
scale times a 9-bit integer, rounded once, in both), uint8 anchors are dequantized here the same way.
Refused (the node stays with TFLite): int8 inputs (TFLite's kernel takes float32 or uint8),
uint8 box encodings with float anchors or the reverse (TFLite reads them as its encodings' type),
non-constant or invalid anchors, batch != 1, parameters TFLite or NNAPI would reject at run time.
"""
from __future__ import annotations

import numpy as np

from delegate.mapping.core import MappingContext, MappingError, custom_mapper
from delegate.tfl.graph import TfLiteNode
from delegate.tfl.schema import TensorType, tensor_type_name
from extensions.options import CustomOptionsError, flexbuffer_map
from hal.types import FusedActivationFunc, OperandType, OperationType

CUSTOM_CODE = "TFLite_Detection_PostProcess"
BOX_ENCODINGS, CLASS_PREDICTIONS, ANCHORS = range(3)
OUT_BOXES, OUT_CLASSES, OUT_SCORES, OUT_NUM = range(4)
#: TFLite's default when the options give no detections_per_class.
DEFAULT_DETECTIONS_PER_CLASS = 100
F32 = np.float32


def read_options(data: bytes | None) -> dict:
    """The op's options as TFLite's kernel reads them (missing optional ones at its defaults)."""
    try:
        m = flexbuffer_map(data, CUSTOM_CODE, required=(
            "max_detections", "max_classes_per_detection", "nms_score_threshold", "nms_iou_threshold",
            "num_classes", "y_scale", "x_scale", "h_scale", "w_scale"))
        o = {k: int(m[k]) for k in ("max_detections", "max_classes_per_detection", "num_classes")}
        o["detections_per_class"] = int(m.get("detections_per_class", DEFAULT_DETECTIONS_PER_CLASS))
        o["use_regular_nms"] = bool(m.get("use_regular_nms", False))
        for k in ("nms_score_threshold", "nms_iou_threshold", "y_scale", "x_scale", "h_scale", "w_scale"):
            o[k] = F32(m[k])  # TFLite reads them AsFloat
    except CustomOptionsError as e:
        raise MappingError(str(e)) from None
    except (TypeError, ValueError, OverflowError) as e:
        raise MappingError(f"{CUSTOM_CODE}: unreadable custom options ({e})") from None
    return o


def _check_options(o: dict, num_anchors: int, num_columns: int) -> None:
    regular = o["use_regular_nms"]
    k, nc = o["max_classes_per_detection"], o["num_classes"]
    if o["max_detections"] <= 0:
        raise MappingError(f"max_detections {o['max_detections']}: NNAPI needs > 0")
    if not 0 <= num_columns - nc <= 1 or nc < 1:
        raise MappingError(f"num_classes {nc} with {num_columns} class prediction columns (TFLite needs "
                           f"num_classes or num_classes + 1)")
    if regular:
        if k != 1:
            raise MappingError(f"regular NMS with max_classes_per_detection {k}: TFLite's outputs then have "
                               f"{k} times more rows than it writes, NNAPI's only those")
        if o["detections_per_class"] <= 0:
            raise MappingError(f"detections_per_class {o['detections_per_class']}: must be > 0")
    else:
        if k <= 0:
            raise MappingError(f"max_classes_per_detection {k}: must be > 0")
        if k > nc:
            raise MappingError(f"max_classes_per_detection {k} > num_classes {nc}: TFLite leaves unwritten "
                               f"rows between detections, NNAPI packs them")
    t = o["nms_score_threshold"]
    if not t > 0:
        raise MappingError(f"nms_score_threshold {t}: TFLite keeps scores >= it, NNAPI scores > a threshold "
                           f">= 0, so only a threshold > 0 can be made to agree")
    iou = o["nms_iou_threshold"]
    if not 0 < iou <= 1:
        raise MappingError(f"nms_iou_threshold {iou}: TFLite fails outside (0, 1]")
    for s in ("y_scale", "x_scale", "h_scale", "w_scale"):
        if not o[s] > 0 or not np.isfinite(o[s]):
            raise MappingError(f"{s} {o[s]}: NNAPI needs a finite scale > 0")


def _dequantized(t) -> np.ndarray:
    """A constant uint8 tensor's float32 values, as TFLite computes them: (q - zp) * scale, rounded once."""
    q = np.asarray(t.data, dtype=np.uint8).astype(np.float64)
    return ((q - t.zero_points[0]) * np.float64(F32(t.scales[0]))).astype(F32)


def _anchors(ctx: MappingContext, node: TfLiteNode, num_anchors: int, quantized_boxes: bool) -> int:
    """The anchors operand (float32), after the checks TFLite's kernel makes at run time."""
    a = ctx.input_tensor(ANCHORS)
    if not a.is_constant:
        raise MappingError("anchors are not constant (TFLite fails on anchors giving inverted boxes; only "
                           "constant ones can be checked here)")
    want = TensorType.UINT8 if quantized_boxes else TensorType.FLOAT32
    if a.type != want or (quantized_boxes and (not a.is_quantized or a.per_channel)):
        raise MappingError(f"anchors of type {tensor_type_name(a.type)} with box encodings of type "
                           f"{tensor_type_name(want)}: TFLite reads both as the encodings' type")
    if list(a.shape) != [num_anchors, 4]:
        raise MappingError(f"anchors of shape {list(a.shape)}: NNAPI needs [{num_anchors}, 4]")
    values = _dequantized(a) if quantized_boxes else np.asarray(a.data, dtype=F32).reshape(num_anchors, 4)
    if np.any(values.reshape(num_anchors, 4)[:, 2:] < 0):
        raise MappingError("anchors with a negative height or width (TFLite fails on the inverted boxes)")
    if not quantized_boxes:
        return ctx.tensor(node.inputs[ANCHORS])
    return ctx.constant(OperandType.TENSOR_FLOAT32, values.reshape(num_anchors, 4))


def _float_input(ctx: MappingContext, t: int) -> int:
    """A float32 operand for TFLite input tensor ``t``: DEQUANTIZE of a uint8 one."""
    x = ctx.tensor(t)
    if ctx.tensor_info(t).type != TensorType.UINT8:
        return x
    y = ctx.builder.add_operand(OperandType.TENSOR_FLOAT32, ctx.tensor_info(t).shape)
    ctx.operation(OperationType.DEQUANTIZE, [x], [y])
    return y


@custom_mapper(CUSTOM_CODE)
def map_detection_postprocess(ctx: MappingContext, node: TfLiteNode) -> None:
    if len(node.inputs) != 3 or len(node.outputs) != 4:
        raise MappingError(f"expected 3 inputs and 4 outputs, got {len(node.inputs)} and {len(node.outputs)}")
    boxes_in, classes_in = ctx.input_tensor(BOX_ENCODINGS), ctx.input_tensor(CLASS_PREDICTIONS)
    for name, t in (("box encodings", boxes_in), ("class predictions", classes_in)):
        if t.type not in (TensorType.FLOAT32, TensorType.UINT8):
            raise MappingError(f"{name} of type {tensor_type_name(t.type)}: TFLite's op takes float32 or uint8")
        if t.type == TensorType.UINT8 and (not t.is_quantized or t.per_channel):
            raise MappingError(f"{name}: uint8 without per-tensor quantization")
        if len(t.shape) != 3 or t.shape[0] != 1:
            raise MappingError(f"{name} of shape {list(t.shape)}: TFLite's op takes [1, anchors, n]")
    num_anchors, num_columns = boxes_in.shape[1], classes_in.shape[2]
    if classes_in.shape[1] != num_anchors or boxes_in.shape[2] < 4:
        raise MappingError(f"box encodings {list(boxes_in.shape)} and class predictions "
                           f"{list(classes_in.shape)} do not fit")
    o = read_options(node.custom_options)
    _check_options(o, num_anchors, num_columns)
    k = 1 if o["use_regular_nms"] else o["max_classes_per_detection"]
    rows = o["max_detections"] * o["max_classes_per_detection"]
    want = {OUT_BOXES: [1, rows, 4], OUT_CLASSES: [1, rows], OUT_SCORES: [1, rows], OUT_NUM: [1]}
    for i, shape in want.items():
        t = ctx.output_tensor(i)
        if t.type != TensorType.FLOAT32 or list(t.shape) != shape:
            raise MappingError(f"output {i} is {tensor_type_name(t.type)} {list(t.shape)}; TFLite makes it "
                               f"float32 {shape}")

    scores = _float_input(ctx, node.inputs[CLASS_PREDICTIONS])
    if num_columns == o["num_classes"]:  # no background column: NNAPI's class 0 is one, add it
        zeros = ctx.constant(OperandType.TENSOR_FLOAT32, np.zeros((1, num_anchors, 1), F32))
        with_bg = ctx.builder.add_operand(OperandType.TENSOR_FLOAT32, (1, num_anchors, num_columns + 1))
        ctx.operation(OperationType.CONCATENATION, [zeros, scores, ctx.int32(2)], [with_bg])
        scores = with_bg
    f32 = lambda v: float(F32(v))  # noqa: E731
    inputs = [scores, _float_input(ctx, node.inputs[BOX_ENCODINGS]),
              _anchors(ctx, node, num_anchors, boxes_in.type == TensorType.UINT8),
              *(ctx.float32(f32(o[s])) for s in ("y_scale", "x_scale", "h_scale", "w_scale")),
              ctx.bool(o["use_regular_nms"]), ctx.int32(o["max_detections"]),
              ctx.int32(o["max_classes_per_detection"]), ctx.int32(o["detections_per_class"]),
              # TFLite's >= t and > iou, as NNAPI's > and >= on the neighbouring float32s
              ctx.float32(f32(np.nextafter(o["nms_score_threshold"], F32(-np.inf)))),
              ctx.float32(f32(np.nextafter(o["nms_iou_threshold"], F32(np.inf)))),
              ctx.bool(False)]
    b = ctx.builder
    classes = b.add_operand(OperandType.TENSOR_INT32, (1, rows))
    count = b.add_operand(OperandType.TENSOR_INT32, (1,))
    ctx.operation(OperationType.DETECTION_POSTPROCESSING, inputs,
                  [ctx.tensor(node.outputs[OUT_SCORES]), ctx.tensor(node.outputs[OUT_BOXES]), classes, count])
    ctx.operation(OperationType.CAST, [classes], [ctx.tensor(node.outputs[OUT_CLASSES])])
    if k > 1:  # NNAPI counts detections (anchors * k), TFLite anchors
        anchors_kept = b.add_operand(OperandType.TENSOR_INT32, (1,))
        ctx.operation(OperationType.DIV, [count, ctx.constant(OperandType.TENSOR_INT32, np.array([k], np.int32)),
                                          ctx.int32(FusedActivationFunc.NONE)], [anchors_kept])
        count = anchors_kept
    ctx.operation(OperationType.CAST, [count], [ctx.tensor(node.outputs[OUT_NUM])])
