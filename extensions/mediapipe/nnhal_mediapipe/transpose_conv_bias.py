"""Convolution2DTransposeBias: TFLite's reference TRANSPOSE_CONV plus a bias, as MediaPipe runs it.

Semantics: mediapipe/util/tflite/operations/transpose_conv_bias.cc (selfie / hair segmentation
decoders carry it). Float32 only.
- Inputs: 0 data [n, h, w, ci], 1 filter OHWI [co, fh, fw, ci], 2 bias [co]; output [n, oh, ow, co].
- custom_options: the raw ``TfLiteTransposeConvParams`` struct {TfLitePadding padding;
  int stride_width, stride_height; ...} - not a FlexBuffer. Only the first three ints are read;
  newer TFLite headers append an activation and a bias type, which MediaPipe's kernel ignores too.
- Shape: SAME (padding 1) has total padding ``max(0, f - (in - 1) % s - 1)`` per axis, VALID none;
  ``out = s * (in - 1) + f - total`` and the top/left padding is ``total // 2``.
- Arithmetic: every output starts at its channel's bias; each input pixel adds ``x * filter`` to the
  ``fh x fw`` outputs at ``in * s - pad + k`` (those outside the output are dropped).

NNAPI operation CONV_2D_TRANSPOSE_BIAS (type 0 of com.google.mediapipe): inputs 0-2 TENSOR_FLOAT32
as above, 3 INT32 padding scheme (NNAPI SAME=1 / VALID=2: TfLitePadding's values), 4-5 INT32 stride
w/h; output 0 TENSOR_FLOAT32.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np
from nnhal.hal.operations.common import F32, INT32, padding_scheme, param
from nnhal.hal.types import PaddingScheme

CODE = "Convolution2DTransposeBias"
VERSIONS = (1,)
#: TfLiteTransposeConvParams: padding, stride_width, stride_height (+ activation, quantized_bias_type
#: in TFLite >= 2.11 headers, ignored as MediaPipe's kernel ignores them).
_PARAMS = struct.Struct("<3i")
_PARAMS_SIZES = (12, 16, 20)


@dataclass
class ConvData:
    stride_h: int
    stride_w: int
    pad_top: int
    pad_left: int
    out_h: int
    out_w: int


def output_size(in_size: int, filter_size: int, stride: int, same: bool) -> tuple[int, int]:
    """(output size, head padding) of one spatial axis, as MediaPipe's Prepare / Eval compute them."""
    total = max(0, filter_size - (in_size - 1) % stride - 1) if same else 0
    return stride * (in_size - 1) + filter_size - total, total // 2


def _strides(ctx) -> tuple[int | None, int | None]:
    values = []
    for i in (4, 5):
        v = param(ctx, i, INT32)
        ctx.check(v is None or v >= 1, f"input {i}: stride must be >= 1, got {v}")
        values.append(v)
    return values[0], values[1]


def validate(ctx) -> None:
    ctx.expect_num_inputs(6)
    ctx.expect_num_outputs(1)
    for i, rank in ((0, 4), (1, 4), (2, 1)):
        ctx.expect_input_type(i, F32)
        ctx.expect_input_rank(i, rank)
    ctx.expect_input_type(3, INT32)
    padding_scheme(ctx, 3)
    _strides(ctx)
    ctx.expect_output_type(0, F32)


def prepare(ctx) -> ConvData:
    n, h, w, ci = ctx.input_shape(0)
    co, fh, fw, fci = ctx.input_shape(1)
    (nb,) = ctx.input_shape(2)
    ctx.check(fci == ci, f"filter input depth {fci} must equal the input depth {ci}")
    ctx.check(nb == co, f"bias size {nb} must equal the filter's output depth {co}")
    ctx.check(min(h, w, fh, fw) >= 1, f"input {[n, h, w, ci]} and filter {[co, fh, fw, fci]} need spatial sizes >= 1")
    same = padding_scheme(ctx, 3) == PaddingScheme.SAME
    sw, sh = _strides(ctx)
    oh, top = output_size(h, fh, sh, same)
    ow, left = output_size(w, fw, sw, same)
    ctx.set_output_shape(0, (n, oh, ow, co))
    return ConvData(sh, sw, top, left, oh, ow)


def execute(ctx, inputs):
    """All taps in one GEMM, then each tap's contributions added on a strided grid of the uncropped
    output ``(in - 1) * s + f``, which is cropped to the padded window."""
    d: ConvData = ctx.data
    x, filt, bias = inputs[:3]
    n, h, w, ci = x.shape
    co, fh, fw, _ = filt.shape
    taps = (x.reshape(-1, ci) @ filt.reshape(-1, ci).T).reshape(n, h, w, co, fh, fw)
    full = np.zeros((n, (h - 1) * d.stride_h + fh, (w - 1) * d.stride_w + fw, co), np.float32)
    for ky in range(fh):
        for kx in range(fw):
            full[:, ky:ky + (h - 1) * d.stride_h + 1:d.stride_h, kx:kx + (w - 1) * d.stride_w + 1:d.stride_w] += \
                taps[..., ky, kx]
    out = full[:, d.pad_top:d.pad_top + d.out_h, d.pad_left:d.pad_left + d.out_w] + bias
    return [out.astype(np.float32, copy=False)]


def parse_options(data: bytes | None) -> dict:
    """TfLiteTransposeConvParams -> {padding, stride_width, stride_height} (CustomOptionsError if bad)."""
    from nnhal.extensions.options import TFLITE_PADDING, CustomOptionsError
    data = bytes(data or b"")
    if len(data) not in _PARAMS_SIZES:
        raise CustomOptionsError(f"{CODE}: custom options must be a TfLiteTransposeConvParams struct "
                                 f"({' / '.join(map(str, _PARAMS_SIZES))} bytes), got {len(data)} bytes")
    padding, stride_w, stride_h = _PARAMS.unpack_from(data)
    if padding not in TFLITE_PADDING:
        raise CustomOptionsError(f"{CODE}: padding must be 1 (SAME) or 2 (VALID), got {padding}")
    if stride_w < 1 or stride_h < 1:
        raise CustomOptionsError(f"{CODE}: strides must be >= 1, got {stride_w}x{stride_h}")
    return {"padding": padding, "stride_width": stride_w, "stride_height": stride_h}


def pack_options(padding: int, stride_w: int, stride_h: int) -> bytes:
    """The 12 bytes TensorFlow's converter writes (for tests and model builders)."""
    return _PARAMS.pack(padding, stride_w, stride_h)


def map_tflite(ctx, node, code: int) -> None:
    """CUSTOM(Convolution2DTransposeBias) + TfLiteTransposeConvParams -> CONV_2D_TRANSPOSE_BIAS."""
    from nnhal.delegate.tfl.schema import TensorType
    from nnhal.extensions.options import CustomOptionsError

    from nnhal_mediapipe._tflite import expect_node, mapping_error
    expect_node(node, CODE, VERSIONS, 3)
    try:
        p = parse_options(node.custom_options)
    except CustomOptionsError as e:
        raise mapping_error(str(e)) from None
    for k in range(3):
        if ctx.input_tensor(k).type != TensorType.FLOAT32:
            raise mapping_error(f"{CODE}: MediaPipe's kernel runs float32 only (input {k})")
    ins = [ctx.tensor(t) for t in node.inputs]
    ins += [ctx.int32(p["padding"]), ctx.int32(p["stride_width"]), ctx.int32(p["stride_height"])]
    ctx.operation(code, ins, [ctx.tensor(node.outputs[0])])
