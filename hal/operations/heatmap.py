"""HEATMAP_MAX_KEYPOINT (NNAPI 1.2): the most likely keypoint location of each heatmap, refined to
sub-pixel precision and mapped into its box.

Inputs:
 0 heatmap [num_boxes, heatmap_size, heatmap_size, num_keypoints] (NHWC) or
   [num_boxes, num_keypoints, heatmap_size, heatmap_size] (NCHW): TENSOR_FLOAT32, TENSOR_FLOAT16,
   TENSOR_QUANT8_ASYMM, TENSOR_QUANT8_ASYMM_SIGNED (1.3). heatmap_size >= 2.
 1 boxes [num_boxes, 4], (x1, y1, x2, y2): input 0's float type, or TENSOR_QUANT16_ASYMM (scale
   0.125, zero point 0) for quantized heatmaps.
 2 layout: BOOL, true for NCHW.
Outputs: 0 scores [num_boxes, num_keypoints], input 0's type (quantized: its own scale and zero
point); 1 keypoints [num_boxes, num_keypoints, 2], (x, y), input 1's type (quantized: scale 0.125,
zero point 0).

The maximum's 3x3 neighbourhood (mirrored at the border) is fitted with a quadratic (second-order
Taylor expansion); its peak, at most 1.5 cells away, gives the position and the score.
"""
from __future__ import annotations

from dataclasses import dataclass

from hal.operations.bbox import QU16, check_box_quantization
from hal.operations.common import BOOL, F16, F32, QS8, QU8, QUANT8, param
from hal.registry import OperationContext, register
from hal.types import FeatureLevel, OperationType

HEATMAP_MAX_KEYPOINT = OperationType.HEATMAP_MAX_KEYPOINT
TYPES = (F32, F16, QU8, QS8)

HEATMAP, BOXES, LAYOUT = range(3)
OUT_SCORE, OUT_KEYPOINT = range(2)


@dataclass
class HeatmapParams:
    nchw: bool
    num_boxes: int
    heatmap_size: int
    num_keypoints: int
    #: tolerances of the "is the Hessian singular" test: AOSP's float16 path uses looser ones.
    fp_atol: float
    fp_rtol: float


def validate(ctx: OperationContext) -> None:
    t = ctx.input_type(HEATMAP)
    box_t = QU16 if t in QUANT8 else t
    ctx.expect_input_type(BOXES, box_t)
    ctx.expect_input_type(LAYOUT, BOOL)
    ctx.expect_output_type(OUT_SCORE, t)
    ctx.expect_output_type(OUT_KEYPOINT, box_t)
    ctx.expect_input_rank(HEATMAP, 4)
    ctx.expect_input_rank(BOXES, 2)
    param(ctx, LAYOUT, BOOL)
    if t in QUANT8:
        check_box_quantization(ctx, ctx.input(BOXES), "input 1")
        check_box_quantization(ctx, ctx.output(OUT_KEYPOINT), "output 1")


def prepare(ctx: OperationContext) -> HeatmapParams:
    nchw = bool(ctx.scalar(LAYOUT, BOOL))
    heatmap, boxes = ctx.input_shape(HEATMAP), ctx.input_shape(BOXES)
    ctx.check(len(heatmap) == 4, f"heatmap must be rank 4, got {list(heatmap)}")
    ctx.check(len(boxes) == 2, f"boxes must be rank 2, got {list(boxes)}")
    num_boxes = heatmap[0]
    size, other = (heatmap[2], heatmap[3]) if nchw else (heatmap[1], heatmap[2])
    keypoints = heatmap[1] if nchw else heatmap[3]
    ctx.check(size == other, f"heatmaps must be square, got {list(heatmap)} ({'NCHW' if nchw else 'NHWC'})")
    ctx.check(size >= 2, f"heatmap size must be >= 2, got {size}")
    ctx.check(boxes == (num_boxes, 4), f"boxes must be [{num_boxes}, 4], got {list(boxes)}")
    ctx.set_output_shape(OUT_SCORE, (num_boxes, keypoints))
    ctx.set_output_shape(OUT_KEYPOINT, (num_boxes, keypoints, 2))
    tol = 1e-3 if ctx.input_type(HEATMAP) == F16 else 1e-5
    return HeatmapParams(nchw, num_boxes, size, keypoints, tol, tol)


register(HEATMAP_MAX_KEYPOINT, validate=validate, prepare=prepare, input_types=TYPES, num_inputs=(3,),
         num_outputs=(2,), min_feature_level=FeatureLevel.FL3, type_feature_levels={QS8: FeatureLevel.FL4})
