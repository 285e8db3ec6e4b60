"""ROI_ALIGN and ROI_POOLING (NNAPI 1.2): one fixed-size feature map per region of interest.

Inputs (both):
 0 the feature maps, 4-D (NHWC, or NCHW with the layout flag): TENSOR_FLOAT32, TENSOR_FLOAT16,
   TENSOR_QUANT8_ASYMM, TENSOR_QUANT8_ASYMM_SIGNED (1.3).
 1 the regions [num_rois, 4], (x1, y1, x2, y2) in the original image's coordinates: input 0's float
   type, or TENSOR_QUANT16_ASYMM (scale 0.125, zero point 0) for quantized maps.
 2 the batch index of each region [num_rois]: TENSOR_INT32.
 3 output height, 4 output width: INT32 > 0.
 5 height stride, 6 width stride (original image size / feature map size): FLOAT32 (FLOAT16 for
   float16 maps) > 0.
ROI_ALIGN then has 7 height and 8 width sampling ratios (INT32 >= 0, 0: adaptive, ceil of the bin
size) and 9 the layout (BOOL, true: NCHW); ROI_POOLING has 7 the layout.
Output 0: [num_rois, out_h, out_w, depth] (NCHW: [num_rois, depth, out_h, out_w]) of input 0's type.
ROI_ALIGN averages bilinear samples per bin and may requantize (any output scale and zero point);
ROI_POOLING takes each bin's maximum, so a quantized output keeps input 0's quantization. num_rois
may be 0 (zero-sized regions, after BOX_WITH_NMS_LIMIT found nothing; ROI_ALIGN only).
"""
from __future__ import annotations

from dataclasses import dataclass

from hal.operations.common import BOOL, F16, F32, I32, INT32, QS8, QU8, QUANT8, param
from hal.registry import OperationContext, register
from hal.types import FeatureLevel, OperandType, OperationType

ROI_ALIGN = OperationType.ROI_ALIGN
ROI_POOLING = OperationType.ROI_POOLING
QU16 = OperandType.TENSOR_QUANT16_ASYMM
FLOAT16, FLOAT32 = OperandType.FLOAT16, OperandType.FLOAT32
TYPES = (F32, F16, QU8, QS8)
ROI_SCALE = 0.125  # NNAPI's fixed quantization of TENSOR_QUANT16_ASYMM regions

INPUT, ROIS, BATCHES, OUTPUT_HEIGHT, OUTPUT_WIDTH, HEIGHT_STRIDE, WIDTH_STRIDE = range(7)
HEIGHT_SAMPLING_RATIO, WIDTH_SAMPLING_RATIO, ALIGN_LAYOUT = 7, 8, 9  # ROI_ALIGN
POOLING_LAYOUT = 7  # ROI_POOLING


@dataclass
class RoiParams:
    nchw: bool
    out_h: int
    out_w: int
    height_stride: float
    width_stride: float
    sampling_h: int  # ROI_ALIGN only (0: adaptive)
    sampling_w: int


def _layout_index(ctx: OperationContext) -> int:
    return ALIGN_LAYOUT if ctx.op_type == ROI_ALIGN else POOLING_LAYOUT


def validate(ctx: OperationContext) -> None:
    t = ctx.input_type(INPUT)
    quantized = t in QUANT8
    scalar_t = FLOAT16 if t == F16 else FLOAT32
    ctx.expect_input_type(ROIS, QU16 if quantized else t)
    ctx.expect_input_type(BATCHES, I32)
    ints = [OUTPUT_HEIGHT, OUTPUT_WIDTH]
    if ctx.op_type == ROI_ALIGN:
        ints += [HEIGHT_SAMPLING_RATIO, WIDTH_SAMPLING_RATIO]
    for i in ints:
        ctx.expect_input_type(i, INT32)
    for i in (HEIGHT_STRIDE, WIDTH_STRIDE):
        ctx.expect_input_type(i, scalar_t)
    ctx.expect_input_type(_layout_index(ctx), BOOL)
    ctx.expect_output_type(0, t)
    ctx.expect_input_rank(INPUT, 4)
    ctx.expect_input_rank(ROIS, 2)
    ctx.expect_input_rank(BATCHES, 1)
    for i in (OUTPUT_HEIGHT, OUTPUT_WIDTH):
        v = param(ctx, i, INT32)
        ctx.check(v is None or v > 0, f"input {i} (output size) must be > 0, got {v}")
    for i in (HEIGHT_STRIDE, WIDTH_STRIDE):
        v = param(ctx, i, scalar_t)
        ctx.check(v is None or v > 0, f"input {i} (stride) must be > 0, got {v}")
    if ctx.op_type == ROI_ALIGN:
        for i in (HEIGHT_SAMPLING_RATIO, WIDTH_SAMPLING_RATIO):
            v = param(ctx, i, INT32)
            ctx.check(v is None or v >= 0, f"input {i} (sampling ratio) must be >= 0, got {v}")
    if quantized:
        rois = ctx.input(ROIS)
        ctx.check(rois.scale == ROI_SCALE and rois.zero_point == 0,
                  f"input 1 (TENSOR_QUANT16_ASYMM regions) must have scale 0.125 and zero point 0, "
                  f"got scale {rois.scale}, zero point {rois.zero_point}")
        if ctx.op_type == ROI_POOLING:
            ctx.expect_same_quantization(INPUT, 0)


def prepare(ctx: OperationContext) -> RoiParams:
    nchw = bool(ctx.scalar(_layout_index(ctx), BOOL))
    shape, rois, batches = (ctx.input_shape(i) for i in (INPUT, ROIS, BATCHES))
    ctx.check(len(shape) == 4 and len(rois) == 2 and len(batches) == 1,
              f"input, regions and batch indexes must be rank 4, 2 and 1, got {list(shape)}, {list(rois)}, "
              f"{list(batches)}")
    n, c, h, w = shape if nchw else (shape[0], shape[3], shape[1], shape[2])
    ctx.check(min(n, c, h, w) > 0, f"input 0 {list(shape)} must have no zero dimension")
    num_rois = rois[0]
    ctx.check(rois[1] == 4, f"regions must be [num_rois, 4], got {list(rois)}")
    ctx.check(batches == (num_rois,), f"batch indexes must be [{num_rois}], got {list(batches)}")
    out_h, out_w = ctx.scalar(OUTPUT_HEIGHT, INT32), ctx.scalar(OUTPUT_WIDTH, INT32)
    ctx.check(out_h > 0 and out_w > 0, f"output size must be > 0, got {out_h} x {out_w}")
    hs, ws = float(ctx.scalar(HEIGHT_STRIDE)), float(ctx.scalar(WIDTH_STRIDE))
    ctx.check(hs > 0 and ws > 0, f"strides must be > 0, got height {hs}, width {ws}")
    sh = sw = 0
    if ctx.op_type == ROI_ALIGN:
        sh, sw = ctx.scalar(HEIGHT_SAMPLING_RATIO, INT32), ctx.scalar(WIDTH_SAMPLING_RATIO, INT32)
        ctx.check(sh >= 0 and sw >= 0, f"sampling ratios must be >= 0, got height {sh}, width {sw}")
    ctx.set_output_shape(0, (num_rois, c, out_h, out_w) if nchw else (num_rois, out_h, out_w, c))
    return RoiParams(nchw, out_h, out_w, hs, ws, sh, sw)


_COMMON = dict(validate=validate, prepare=prepare, input_types=TYPES, min_feature_level=FeatureLevel.FL3,
               type_feature_levels={QS8: FeatureLevel.FL4})
register(ROI_ALIGN, num_inputs=(10,), allow_zero_sized_inputs=True, **_COMMON)
register(ROI_POOLING, num_inputs=(8,), **_COMMON)
