"""AXIS_ALIGNED_BBOX_TRANSFORM (NNAPI 1.2): apply class-wise box regression deltas to regions of
interest, clipping the results to their image.

Inputs:
 0 roi [num_rois, 4], boxes (x1, y1, x2, y2): TENSOR_FLOAT32, TENSOR_FLOAT16, or
   TENSOR_QUANT16_ASYMM (scale 0.125, zero point 0).
 1 bboxDeltas [num_rois, num_classes * 4], (dx, dy, dw, dh) per class: input 0's float type, or
   TENSOR_QUANT8_ASYMM / TENSOR_QUANT8_ASYMM_SIGNED (1.3) for quantized boxes.
 2 batchSplit [num_rois]: TENSOR_INT32, the image of each box.
 3 imageInfo [num_batches, 2], (height, width) of each image: input 0's type (quantized: scale
   0.125, zero point 0).
Output 0 [num_rois, num_classes * 4]: the boxes, input 0's type (quantized: scale 0.125, zero
point 0). num_rois may be 0 (the operation is then not run).

The box centre moves by (dx, dy) times its size and its size scales by (exp(dw), exp(dh)); the
corners are then clipped to [0, width] x [0, height] of the box's image.
"""
from __future__ import annotations

from dataclasses import dataclass

from hal.operations.common import F16, F32, I32, QS8, QU8
from hal.registry import OperationContext, register
from hal.types import FeatureLevel, OperandType, OperationType

AXIS_ALIGNED_BBOX_TRANSFORM = OperationType.AXIS_ALIGNED_BBOX_TRANSFORM
QU16 = OperandType.TENSOR_QUANT16_ASYMM
TYPES = (F32, F16, QU16)

ROI, BBOX_DELTAS, BATCH_SPLIT, IMAGE_INFO = range(4)
OUTPUT = 0

BOX_SCALE = 0.125  # NNAPI's fixed quantization of TENSOR_QUANT16_ASYMM boxes and image sizes


@dataclass
class BboxTransformParams:
    num_rois: int
    num_classes: int
    num_batches: int


def check_box_quantization(ctx: OperationContext, info, what: str) -> None:
    """NNAPI fixes quantized boxes (and image sizes) at scale 0.125, zero point 0."""
    ctx.check(info.scale == BOX_SCALE and info.zero_point == 0,
              f"{what} must have scale 0.125 and zero point 0 (quantized boxes), got scale "
              f"{info.scale}, zero point {info.zero_point}")


def validate(ctx: OperationContext) -> None:
    t = ctx.input_type(ROI)
    if t == QU16:
        ctx.expect_input_type(BBOX_DELTAS, QU8, QS8)
        check_box_quantization(ctx, ctx.input(ROI), "input 0")
        check_box_quantization(ctx, ctx.input(IMAGE_INFO), "input 3")
        check_box_quantization(ctx, ctx.output(OUTPUT), "output 0")
    else:
        ctx.expect_input_type(BBOX_DELTAS, t)
    ctx.expect_input_type(BATCH_SPLIT, I32)
    ctx.expect_input_type(IMAGE_INFO, t)
    ctx.expect_output_type(OUTPUT, t)
    for i, rank in ((ROI, 2), (BBOX_DELTAS, 2), (BATCH_SPLIT, 1), (IMAGE_INFO, 2)):
        ctx.expect_input_rank(i, rank)


def prepare(ctx: OperationContext) -> BboxTransformParams:
    roi, deltas, batches, info = (ctx.input_shape(i) for i in (ROI, BBOX_DELTAS, BATCH_SPLIT, IMAGE_INFO))
    ctx.check(len(roi) == 2 and len(deltas) == 2 and len(batches) == 1 and len(info) == 2,
              f"roi, deltas, batch split and image info must be rank 2, 2, 1 and 2, got {list(roi)}, "
              f"{list(deltas)}, {list(batches)}, {list(info)}")
    num_rois = roi[0]
    ctx.check(roi[1] == 4, f"roi must be [num_rois, 4], got {list(roi)}")
    ctx.check(deltas[1] > 0 and deltas[1] % 4 == 0,
              f"deltas must be [num_rois, num_classes * 4] with num_classes > 0, got {list(deltas)}")
    ctx.check(deltas[0] == num_rois, f"deltas must have {num_rois} rows (one per roi), got {list(deltas)}")
    ctx.check(batches == (num_rois,), f"batch split must be [{num_rois}], got {list(batches)}")
    ctx.check(info[0] > 0 and info[1] == 2, f"image info must be [num_batches > 0, 2], got {list(info)}")
    ctx.set_output_shape(OUTPUT, (num_rois, deltas[1]))
    return BboxTransformParams(num_rois, deltas[1] // 4, info[0])


register(AXIS_ALIGNED_BBOX_TRANSFORM, validate=validate, prepare=prepare, input_types=TYPES, num_inputs=(4,),
         num_outputs=(1,), allow_zero_sized_inputs=True, min_feature_level=FeatureLevel.FL3)
