"""GENERATE_PROPOSALS (NNAPI 1.2): region proposals from anchors, box deltas and objectness
scores (Faster R-CNN's RPN). How many proposals survive depends on the values: the operation opts
in to ``data_dependent_outputs`` (see ``hal.compiler.make_plan``).

Inputs:
 0 scores [batches, height, width, num_anchors] (NHWC) or [batches, num_anchors, height, width]
   (NCHW): TENSOR_FLOAT32, TENSOR_FLOAT16, TENSOR_QUANT8_ASYMM, TENSOR_QUANT8_ASYMM_SIGNED (1.3).
 1 bboxDeltas [batches, height, width, num_anchors * 4] (NHWC, NCHW alike), (dx, dy, dw, dh) per
   anchor: input 0's type (its own quantization).
 2 anchors [num_anchors, 4], (x1, y1, x2, y2): input 0's float type, or TENSOR_QUANT16_SYMM
   (scale 0.125) for quantized scores.
 3 imageInfo [batches, 2], (height, width): input 0's float type, or TENSOR_QUANT16_ASYMM (scale
   0.125, zero point 0).
 4 height_stride, 5 width_stride: FLOAT32 (FLOAT16 for float16 scores), the anchors' step on the
   image per feature-map cell.
 6 pre_nms_top_n, 7 post_nms_top_n: INT32, how many best boxes go into / come out of NMS
   (<= 0: no limit).
 8 iou_threshold, 9 min_size: FLOAT32 (FLOAT16 for float16 scores).
 10 layout: BOOL, true for NCHW.
Outputs [num_output_rois]: 0 scores (input 0's type and quantization), 1 rois [num_output_rois,
4] (x1, y1, x2, y2; input 3's type, quantized: scale 0.125, zero point 0), 2 batch index
(TENSOR_INT32). Per image, in NMS selection order (best first).
"""
from __future__ import annotations

from dataclasses import dataclass

from hal.operations.bbox import QU16, check_box_quantization
from hal.operations.common import BOOL, F16, F32, I32, INT32, QS8, QU8, QUANT8, param
from hal.registry import OperationContext, register
from hal.types import FeatureLevel, OperandType, OperationType

GENERATE_PROPOSALS = OperationType.GENERATE_PROPOSALS
QS16 = OperandType.TENSOR_QUANT16_SYMM
FLOAT16, FLOAT32 = OperandType.FLOAT16, OperandType.FLOAT32
TYPES = (F32, F16, QU8, QS8)

(SCORES, BBOX_DELTAS, ANCHORS, IMAGE_INFO, HEIGHT_STRIDE, WIDTH_STRIDE, PRE_NMS_TOP_N, POST_NMS_TOP_N,
 IOU_THRESHOLD, MIN_SIZE, LAYOUT) = range(11)
OUT_SCORES, OUT_ROIS, OUT_BATCHES = range(3)

FLOAT_PARAMS = (HEIGHT_STRIDE, WIDTH_STRIDE, IOU_THRESHOLD, MIN_SIZE)


@dataclass
class GenerateProposalsParams:
    nchw: bool
    batches: int
    height: int
    width: int
    num_anchors: int
    height_stride: float
    width_stride: float
    pre_nms_top_n: int  # <= 0: no limit
    post_nms_top_n: int  # <= 0: no limit
    iou_threshold: float
    min_size: float


def validate(ctx: OperationContext) -> None:
    t = ctx.input_type(SCORES)
    quantized = t in QUANT8
    scalar_t = FLOAT16 if t == F16 else FLOAT32
    ctx.expect_input_type(BBOX_DELTAS, t)
    ctx.expect_input_type(ANCHORS, QS16 if quantized else t)
    ctx.expect_input_type(IMAGE_INFO, QU16 if quantized else t)
    for i in FLOAT_PARAMS:
        ctx.expect_input_type(i, scalar_t)
    ctx.expect_input_type(PRE_NMS_TOP_N, INT32)
    ctx.expect_input_type(POST_NMS_TOP_N, INT32)
    ctx.expect_input_type(LAYOUT, BOOL)
    ctx.expect_output_type(OUT_SCORES, t)
    ctx.expect_output_type(OUT_ROIS, QU16 if quantized else t)
    ctx.expect_output_type(OUT_BATCHES, I32)
    for i, rank in ((SCORES, 4), (BBOX_DELTAS, 4), (ANCHORS, 2), (IMAGE_INFO, 2)):
        ctx.expect_input_rank(i, rank)
    param(ctx, LAYOUT, BOOL)
    if quantized:
        ctx.expect_same_quantization(SCORES, OUT_SCORES)
        a = ctx.input(ANCHORS)
        ctx.check(a.scale == 0.125 and a.zero_point == 0,
                  f"input 2 (TENSOR_QUANT16_SYMM anchors) must have scale 0.125, got {a.scale}")
        check_box_quantization(ctx, ctx.input(IMAGE_INFO), "input 3")
        check_box_quantization(ctx, ctx.output(OUT_ROIS), "output 1")


def _count(ctx: OperationContext, out: int) -> int:
    """The output count as the model declares it, or 0: known only once the kernel has run."""
    declared = ctx.output(out).shape
    return declared[0] if declared else 0


def prepare(ctx: OperationContext) -> GenerateProposalsParams:
    nchw = bool(ctx.scalar(LAYOUT, BOOL))
    scores, deltas, anchors, info = (ctx.input_shape(i) for i in (SCORES, BBOX_DELTAS, ANCHORS, IMAGE_INFO))
    ctx.check(len(scores) == 4 and len(deltas) == 4 and len(anchors) == 2 and len(info) == 2,
              f"scores, deltas, anchors and image info must be rank 4, 4, 2 and 2, got {list(scores)}, "
              f"{list(deltas)}, {list(anchors)}, {list(info)}")
    if nchw:
        batches, num_anchors, height, width = scores
        want = (batches, num_anchors * 4, height, width)
    else:
        batches, height, width, num_anchors = scores
        want = (batches, height, width, num_anchors * 4)
    ctx.check(deltas == want, f"deltas must be {list(want)} (4 per anchor), got {list(deltas)}")
    ctx.check(anchors == (num_anchors, 4), f"anchors must be [{num_anchors}, 4], got {list(anchors)}")
    ctx.check(info == (batches, 2), f"image info must be [{batches}, 2], got {list(info)}")
    ctx.set_output_shape(OUT_SCORES, (_count(ctx, OUT_SCORES),))
    ctx.set_output_shape(OUT_ROIS, (_count(ctx, OUT_ROIS), 4))
    ctx.set_output_shape(OUT_BATCHES, (_count(ctx, OUT_BATCHES),))
    hs, ws, iou, min_size = (float(ctx.scalar(i)) for i in FLOAT_PARAMS)
    return GenerateProposalsParams(nchw, batches, height, width, num_anchors, hs, ws,
                                   int(ctx.scalar(PRE_NMS_TOP_N, INT32)), int(ctx.scalar(POST_NMS_TOP_N, INT32)),
                                   iou, min_size)


register(GENERATE_PROPOSALS, validate=validate, prepare=prepare, input_types=TYPES, num_inputs=(11,),
         num_outputs=(3,), min_feature_level=FeatureLevel.FL3, type_feature_levels={QS8: FeatureLevel.FL4},
         data_dependent_outputs=True)
