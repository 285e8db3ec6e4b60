"""MaxPoolingWithArgmax2D and MaxUnpooling2D: the argmax pooling pair real TFLite models carry.

Segmentation models (SegNet-style; MediaPipe's hair segmentation) carry them as CUSTOM ops with
codes "MaxPoolingWithArgmax2D" / "MaxUnpooling2D", as TensorFlow's converter emits them
(``tfl.max_pooling_with_argmax_2d`` / ``tfl.max_unpooling_2d`` with ``-emit-custom-ops``) and as
MediaPipe's kernels (mediapipe/util/tflite/operations/) run them:

- custom_options: the raw 40-byte ``TfLitePoolParams`` struct (padding, stride w/h, filter w/h,
  fused activation, 4 computed ints) - not a FlexBuffer.
- MaxPoolingWithArgmax2D: outputs are both float32: the maxima (fused activation applied) and the
  argmax as the index *within the pooling window*, ``ky * filter_width + kx + 0.1`` (the 0.1 makes
  the float -> int truncation safe). The first maximum in row-major window order wins; padding never
  wins; a window whose values are all -inf/NaN reports index 0 and value float32 lowest, as the
  MediaPipe kernel does. (TF's tf.nn.max_pool_with_argmax flattens (y * W + x) * C + c into int64
  instead: that op reaches TFLite only as a Flex op, not as this custom op.)
- MaxUnpooling2D: input values and window indices of the same shape; output
  [n, h * filter_h, w * filter_w, c], zeros except where an index points; out-of-range indices are
  skipped; the later input element wins when two point to the same place.

NNAPI operations of extension com.nnhal.maxpool_argmax (scalar order as NNAPI's MAX_POOL_2D):
- MAX_POOL_WITH_ARGMAX (type 0): inputs 0 TENSOR_FLOAT32 [n, h, w, c], 1 INT32 padding scheme,
  2-3 INT32 stride w/h, 4-5 INT32 filter w/h, 6 INT32 fused activation;
  outputs 0 TENSOR_FLOAT32 maxima, 1 TENSOR_FLOAT32 window indices.
- MAX_UNPOOLING (type 1): inputs 0 TENSOR_FLOAT32 values, 1 TENSOR_FLOAT32 indices,
  2-3 INT32 stride w/h, 4-5 INT32 filter w/h; output 0 TENSOR_FLOAT32.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from nnhal.extensions import Extension, ExtensionOperation
from nnhal.hal.operations.common import F32, INT32, fused_activation, implicit_padding, padding_scheme, param
from nnhal.hal.types import FusedActivationFunc, PaddingScheme

NAME = "com.nnhal.maxpool_argmax"
MAX_POOL_WITH_ARGMAX = 0
MAX_UNPOOLING = 1
POOL_CODE = "MaxPoolingWithArgmax2D"
UNPOOL_CODE = "MaxUnpooling2D"

_CLAMP = {FusedActivationFunc.NONE: (None, None), FusedActivationFunc.RELU: (0.0, None),
          FusedActivationFunc.RELU1: (-1.0, 1.0), FusedActivationFunc.RELU6: (0.0, 6.0)}


@dataclass
class PoolData:
    fh: int
    fw: int
    sh: int
    sw: int
    pad_top: int
    pad_left: int
    out_h: int
    out_w: int
    activation: int = 0


def _window_params(ctx, first: int) -> tuple[int, int, int, int]:
    """(stride w, stride h, filter w, filter h) at inputs first..first+3, each >= 1 (while validating,
    a non-constant one reads as None: NNAPI allows it, prepare then needs it constant)."""
    values = []
    for i in range(first, first + 4):
        v = param(ctx, i, INT32)
        ctx.check(v is None or v >= 1, f"input {i} must be >= 1, got {v}")
        values.append(None if v is None else int(v))
    return tuple(values)


def pool_validate(ctx) -> None:
    ctx.expect_num_inputs(7)
    ctx.expect_num_outputs(2)
    ctx.expect_input_type(0, F32)
    ctx.expect_input_rank(0, 4)
    ctx.expect_input_type(1, INT32)
    padding_scheme(ctx, 1)
    _window_params(ctx, 2)
    ctx.expect_input_type(6, INT32)
    act = fused_activation(ctx, 6)  # None while validating a non-constant one: prepare needs it constant
    ctx.check(act is None or act in _CLAMP, "input 6: fused activation must be NONE, RELU, RELU1 or RELU6")
    ctx.expect_output_type(0, F32)
    ctx.expect_output_type(1, F32)


def pool_prepare(ctx) -> PoolData:
    n, h, w, c = ctx.input_shape(0)
    scheme = padding_scheme(ctx, 1)
    sw, sh, fw, fh = _window_params(ctx, 2)
    if scheme == PaddingScheme.SAME:  # MediaPipe: TF's GetWindowedOutputSize
        oh, ow = (h + sh - 1) // sh, (w + sw - 1) // sw
    else:
        oh, ow = (h - fh + sh) // sh, (w - fw + sw) // sw
    ctx.check(oh > 0 and ow > 0, f"a {fh}x{fw} window does not fit a {h}x{w} input")
    top, _ = implicit_padding(h, sh, fh, 1, scheme)
    left, _ = implicit_padding(w, sw, fw, 1, scheme)
    ctx.set_output_shape(0, (n, oh, ow, c))
    ctx.set_output_shape(1, (n, oh, ow, c))
    return PoolData(fh, fw, sh, sw, top, left, oh, ow, int(fused_activation(ctx, 6)))


def pool_execute(ctx, inputs):
    d: PoolData = ctx.data
    x = inputs[0]
    n, h, w, c = x.shape
    best = np.full((n, d.out_h, d.out_w, c), np.finfo(np.float32).min, np.float32)
    arg = np.zeros((n, d.out_h, d.out_w, c), np.int32)
    oy = np.arange(d.out_h) * d.sh - d.pad_top
    ox = np.arange(d.out_w) * d.sw - d.pad_left
    for ky in range(d.fh):  # window taps in row-major order: strict '>' keeps the first maximum
        ys = oy + ky
        for kx in range(d.fw):
            xs = ox + kx
            valid = ((ys >= 0) & (ys < h))[:, None] & ((xs >= 0) & (xs < w))[None, :]
            vals = x[:, np.clip(ys, 0, h - 1)][:, :, np.clip(xs, 0, w - 1)]
            better = (vals > best) & valid[None, :, :, None]
            best = np.where(better, vals, best)
            arg = np.where(better, ky * d.fw + kx, arg)
    lo, hi = _CLAMP[FusedActivationFunc(d.activation)]
    if lo is not None or hi is not None:
        best = np.clip(best, lo, hi)
    return [best.astype(np.float32), arg.astype(np.float32) + np.float32(0.1)]


def unpool_validate(ctx) -> None:
    ctx.expect_num_inputs(6)
    ctx.expect_num_outputs(1)
    ctx.expect_input_type(0, F32)
    ctx.expect_input_type(1, F32)
    ctx.expect_input_rank(0, 4)
    ctx.expect_input_rank(1, 4)
    _window_params(ctx, 2)
    ctx.expect_output_type(0, F32)


def unpool_prepare(ctx) -> PoolData:
    n, h, w, c = ctx.input_shape(0)
    ctx.check(tuple(ctx.input_shape(1)) == (n, h, w, c),
              f"indices shape {list(ctx.input_shape(1))} must equal the values shape {[n, h, w, c]}")
    sw, sh, fw, fh = _window_params(ctx, 2)
    oh, ow = h * fh, w * fw
    top = max(0, ((h - 1) * sh + fh - oh) // 2)  # TFLite ComputePadding(in = output size, out = input size)
    left = max(0, ((w - 1) * sw + fw - ow) // 2)
    ctx.set_output_shape(0, (n, oh, ow, c))
    return PoolData(fh, fw, sh, sw, top, left, oh, ow)


def unpool_execute(ctx, inputs):
    d: PoolData = ctx.data
    vals, ind = inputs[0], inputs[1]
    n, h, w, c = vals.shape
    finite = np.isfinite(ind) & (np.abs(ind) < 2.0 ** 31)  # others are undefined in C: skipped here
    k = np.where(finite, np.trunc(ind), 0).astype(np.int64)  # C float -> int truncates toward zero
    mx = np.fmod(k, d.fw)  # C's % and / truncate toward zero too
    my = (k - mx) // d.fw
    out_y = (np.arange(h) * d.sh - d.pad_top)[None, :, None, None] + my
    out_x = (np.arange(w) * d.sw - d.pad_left)[None, None, :, None] + mx
    ok = finite & (out_y >= 0) & (out_y < d.out_h) & (out_x >= 0) & (out_x < d.out_w)
    flat = ((np.arange(n)[:, None, None, None] * d.out_h + out_y) * d.out_w + out_x) * c + np.arange(c)
    targets, values = flat[ok], vals[ok]  # row-major input order, as the C loops
    _, first_from_end = np.unique(targets[::-1], return_index=True)  # the last write wins
    keep = len(targets) - 1 - first_from_end
    out = np.zeros((n, d.out_h, d.out_w, c), np.float32)
    out.reshape(-1)[targets[keep]] = values[keep]
    return [out]


def _pool_params(node, op: str) -> dict:
    from nnhal.delegate.mapping import MappingError
    from nnhal.extensions.options import tflite_pool_params
    try:
        return tflite_pool_params(node.custom_options, op)
    except ValueError as e:
        raise MappingError(str(e)) from None


def map_pool(ctx, node, code: int) -> None:
    """CUSTOM(MaxPoolingWithArgmax2D) + TfLitePoolParams -> MAX_POOL_WITH_ARGMAX."""
    from nnhal.delegate.mapping import MappingError
    p = _pool_params(node, POOL_CODE)
    if len(node.inputs) != 1 or len(node.outputs) != 2:
        raise MappingError(f"{POOL_CODE}: expected 1 input and 2 outputs")
    ins = [ctx.tensor(node.inputs[0]), ctx.int32(p["padding"]), ctx.int32(p["stride_width"]),
           ctx.int32(p["stride_height"]), ctx.int32(p["filter_width"]), ctx.int32(p["filter_height"]),
           ctx.int32(p["activation"])]  # TfLiteFusedActivation 0-3 == NNAPI FusedActivationFunc 0-3
    ctx.operation(code, ins, [ctx.tensor(node.outputs[0]), ctx.tensor(node.outputs[1])])


def map_unpool(ctx, node, code: int) -> None:
    """CUSTOM(MaxUnpooling2D) + TfLitePoolParams -> MAX_UNPOOLING (padding and activation unused, as in
    MediaPipe's kernel)."""
    from nnhal.delegate.mapping import MappingError
    p = _pool_params(node, UNPOOL_CODE)
    if len(node.inputs) != 2 or len(node.outputs) != 1:
        raise MappingError(f"{UNPOOL_CODE}: expected 2 inputs and 1 output")
    ins = [ctx.tensor(node.inputs[0]), ctx.tensor(node.inputs[1]), ctx.int32(p["stride_width"]),
           ctx.int32(p["stride_height"]), ctx.int32(p["filter_width"]), ctx.int32(p["filter_height"])]
    ctx.operation(code, ins, [ctx.tensor(node.outputs[0])])


EXTENSION = Extension(
    name=NAME, version="2.0",
    operations=(
        ExtensionOperation(MAX_POOL_WITH_ARGMAX, "MAX_POOL_WITH_ARGMAX", pool_validate, pool_prepare, pool_execute,
                           custom_codes=(POOL_CODE,), map_tflite=map_pool),
        ExtensionOperation(MAX_UNPOOLING, "MAX_UNPOOLING", unpool_validate, unpool_prepare, unpool_execute,
                           custom_codes=(UNPOOL_CODE,), map_tflite=map_unpool)),
    description="argmax pooling and unpooling as TensorFlow's converter and MediaPipe define them")
