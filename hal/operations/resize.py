"""RESIZE_BILINEAR (NNAPI 1.0) and RESIZE_NEAREST_NEIGHBOR (NNAPI 1.2).

Inputs: 0 a 4-D tensor (NHWC, or NCHW with the layout flag); 1 and 2 the output width and height
(INT32), or width and height scale factors (FLOAT32, NNAPI 1.2: output size floor(size * scale)),
both of one type; 3 the NCHW layout flag (BOOL; optional for RESIZE_BILINEAR, which NNAPI 1.0
defined with inputs 0-2 only); 4 align_corners and 5 half_pixel_centers (optional BOOLs, NNAPI
1.3, not both true). The output has input 0's type and quantization.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hal.operations.common import BOOL, F32, FLOAT32, INT32, QS8, QU8, QUANT8, optional_param, param
from hal.registry import OperationContext, register
from hal.types import FeatureLevel, OperationType

BILINEAR, NEAREST = OperationType.RESIZE_BILINEAR, OperationType.RESIZE_NEAREST_NEIGHBOR
TYPES = (F32, QU8, QS8)

INPUT = 0
WIDTH, HEIGHT = 1, 2  # output size (INT32) or scale factors (FLOAT32)
LAYOUT, ALIGN_CORNERS, HALF_PIXEL_CENTERS = 3, 4, 5


@dataclass
class ResizeParams:
    """Resolved geometry (NHWC terms) of one resize: every backend computes from this."""

    kind: OperationType
    nchw: bool
    align_corners: bool
    half_pixel_centers: bool
    in_h: int
    in_w: int
    out_h: int
    out_w: int


def _flags(ctx: OperationContext) -> tuple[bool | None, bool | None, bool | None]:
    """(nchw, align_corners, half_pixel_centers); None for a flag validate cannot read."""
    nchw = optional_param(ctx, LAYOUT, False, BOOL)
    align = optional_param(ctx, ALIGN_CORNERS, False, BOOL)
    half = optional_param(ctx, HALF_PIXEL_CENTERS, False, BOOL)
    ctx.check(not (align and half), "align_corners and half_pixel_centers cannot both be true")
    return tuple(None if v is None else bool(v) for v in (nchw, align, half))


def validate(ctx: OperationContext) -> None:
    t = ctx.input_type(INPUT)
    ctx.expect_output_type(0, t)
    ctx.expect_input_rank(INPUT, 4)
    if t in QUANT8:
        ctx.expect_same_quantization(INPUT)
    ctx.expect_input_type(HEIGHT, INT32, FLOAT32)
    ctx.expect_input_type(WIDTH, ctx.input_type(HEIGHT))
    w, h = param(ctx, WIDTH), param(ctx, HEIGHT)
    what = "output width/height" if ctx.input_type(HEIGHT) == INT32 else "width/height scales"
    ctx.check(all(v is None or v > 0 for v in (w, h)), f"{what} must be > 0, got {w}, {h}")
    _flags(ctx)


def _output_size(ctx: OperationContext, in_h: int, in_w: int) -> tuple[int, int]:
    """INT32 sizes, or FLOAT32 scales: floor(float(size) * scale) in float32 as AOSP does."""
    if ctx.input_type(HEIGHT) == INT32:
        return int(ctx.scalar(HEIGHT)), int(ctx.scalar(WIDTH))
    h = int(np.floor(np.float32(in_h) * np.float32(ctx.scalar(HEIGHT))))
    w = int(np.floor(np.float32(in_w) * np.float32(ctx.scalar(WIDTH))))
    ctx.check(h > 0 and w > 0, f"scaled output size must be > 0, got {h}x{w}")
    return h, w


def prepare(ctx: OperationContext) -> ResizeParams:
    nchw, align, half = _flags(ctx)
    shape = ctx.input_shape(INPUT)
    n, c, in_h, in_w = shape if nchw else (shape[0], shape[3], shape[1], shape[2])
    ctx.check(in_h > 0 and in_w > 0 and c > 0,
              f"input height, width and depth must be > 0, got {in_h}x{in_w}x{c}")
    out_h, out_w = _output_size(ctx, in_h, in_w)
    ctx.set_output_shape(0, (n, c, out_h, out_w) if nchw else (n, out_h, out_w, c))
    return ResizeParams(OperationType(ctx.op_type), nchw, align, half, in_h, in_w, out_h, out_w)


register(BILINEAR, validate=validate, prepare=prepare, input_types=TYPES, num_inputs=(3, 4, 5, 6),
         min_feature_level=FeatureLevel.FL1, type_feature_levels={QU8: FeatureLevel.FL3, QS8: FeatureLevel.FL4})
# The layout operand is mandatory for RESIZE_NEAREST_NEIGHBOR (it arrived with it, in NNAPI 1.2).
register(NEAREST, validate=validate, prepare=prepare, input_types=TYPES, num_inputs=(4, 5, 6),
         min_feature_level=FeatureLevel.FL3, type_feature_levels={QS8: FeatureLevel.FL4})
