"""QUANTIZE, DEQUANTIZE, CAST: TFLite -> NNAPI.

TFLite DEQUANTIZE of a float16 tensor (fp16-weight models) is NNAPI CAST; of an
8-bit tensor it is NNAPI DEQUANTIZE. TFLite CAST maps only between float32, float16 and
int32: to 8 bits TFLite's static_cast wraps (int32 300 -> 44) where NNAPI CAST
saturates, and NNAPI casts bool and int8/int16 only to themselves. NNAPI's own type rules
(QUANTIZE's uint8/int8 outputs, DEQUANTIZE's rank <= 4) are hal's validate's.

TFLite QUANTIZE from float32 is NNAPI QUANTIZE. From an 8-bit tensor to an 8-bit tensor
(requantization: the converter's uint8 <-> int8 edges of uint8-I/O models) TFLite 2.14's reference
kernel computes clamp(MultiplyByQuantizedMultiplier(q - in_zp, M, shift) + out_zp) with (M, shift) =
QuantizeMultiplier(in_scale / out_scale); NNAPI's QUANTIZE takes float input only, so:
- equal scales (what the converter writes: zero points 128 apart): NNAPI DEQUANTIZE to a float32
  temporary, then QUANTIZE. Exact: TFLite's multiplier is then exactly one (M = 2^30, shift 1), so it
  gives clamp(k + out_zp), k = q - in_zp; DEQUANTIZE gives fl(k * s) and QUANTIZE round(fl(fl(k * s) / s))
  + out_zp, and two float32 roundings move k (|k| <= 255) by at most 255 * 2^-23 < 0.5. The scale must
  be a normal float32 with 255 * s finite (else the extension below). NNAPI-only, so the model
  stays whole on any NNAPI 1.3 driver, not only nnhal.
- different scales: com.nnhal.tflite:REQUANTIZE, nnhal's extension operation with that arithmetic.
  Through float the same pair rounds differently: TFLite's fixed-point rounding is not float's
  round-half-away (scale ratio 0.5, k = -1: TFLite gives 0, DEQUANTIZE + QUANTIZE -1).
"""
from __future__ import annotations

import numpy as np

from delegate.mapping.core import MappingContext, MappingError, mapper
from delegate.mapping.options import OptionsReader, ints, no_options
from delegate.tfl.graph import TfLiteNode, TfLiteTensor
from delegate.tfl.schema import BuiltinOperator, TensorType
from hal.operations.quantization import DEQUANTIZE_MAX_RANK
from hal.types import OperandType, OperationType

_CASTABLE = (TensorType.FLOAT32, TensorType.FLOAT16, TensorType.INT32)
_EIGHT_BIT = (TensorType.UINT8, TensorType.INT8)
_F32 = np.finfo(np.float32)


def _unary(ctx: MappingContext, node: TfLiteNode, op: OperationType, per_channel_ok: bool = False) -> None:
    if len(node.inputs) != 1 or len(node.outputs) != 1:
        raise MappingError(f"expected 1 input and 1 output, got {len(node.inputs)} and {len(node.outputs)}")
    x = ctx.tensor(node.inputs[0], per_channel_ok=per_channel_ok)
    ctx.operation(op, [x], [ctx.tensor(node.outputs[0])])


def _read_cast(a: int) -> dict:
    from delegate.capi import TFLITE_TYPE_TO_SCHEMA
    i, o = ints(a, 2)  # TfLiteCastParams: TfLiteType codes, not the schema's
    return {"in_data_type": TFLITE_TYPE_TO_SCHEMA.get(i, -1), "out_data_type": TFLITE_TYPE_TO_SCHEMA.get(o, -1)}


@mapper(BuiltinOperator.QUANTIZE, options=no_options("QuantizeOptions"))
def map_quantize(ctx: MappingContext, node: TfLiteNode) -> None:
    src, dst = ctx.input_tensor(0), ctx.output_tensor(0)
    if src.type == TensorType.FLOAT32:
        _unary(ctx, node, OperationType.QUANTIZE)
    elif src.type in _EIGHT_BIT and dst.type in _EIGHT_BIT:
        _requantize(ctx, node, src, dst)
    else:
        raise MappingError(f"QUANTIZE from TFLite type {src.type} to {dst.type} is not supported "
                           f"(float32 or 8-bit to 8-bit only)")


def _requantize(ctx: MappingContext, node: TfLiteNode, src: TfLiteTensor, dst: TfLiteTensor) -> None:
    if len(node.inputs) != 1 or len(node.outputs) != 1:
        raise MappingError(f"expected 1 input and 1 output, got {len(node.inputs)} and {len(node.outputs)}")
    x, y = ctx.tensor(node.inputs[0]), ctx.tensor(node.outputs[0])  # per-tensor 8-bit, or MappingError
    s = np.float32(src.scales[0])
    if s == np.float32(dst.scales[0]) and _F32.tiny <= s <= _F32.max / 256 and len(src.shape) <= DEQUANTIZE_MAX_RANK:
        real = ctx.builder.add_operand(OperandType.TENSOR_FLOAT32, src.shape)
        ctx.operation(OperationType.DEQUANTIZE, [x], [real])
        ctx.operation(OperationType.QUANTIZE, [real], [y])
        return
    from extensions import tflite_compat
    tflite_compat.ensure_registered()
    ctx.operation(ctx.extension_code(tflite_compat.NAME, tflite_compat.REQUANTIZE), [x], [y])


@mapper(BuiltinOperator.DEQUANTIZE, options=no_options("DequantizeOptions"))
def map_dequantize(ctx: MappingContext, node: TfLiteNode) -> None:
    src, dst = ctx.input_tensor(0), ctx.output_tensor(0)
    if dst.type != TensorType.FLOAT32:
        raise MappingError("DEQUANTIZE must produce float32")
    if src.type == TensorType.FLOAT16:
        _unary(ctx, node, OperationType.CAST)
    elif src.type in (TensorType.UINT8, TensorType.INT8):
        _unary(ctx, node, OperationType.DEQUANTIZE, per_channel_ok=True)
    else:
        raise MappingError(f"DEQUANTIZE of TFLite type {src.type} is not supported")


@mapper(BuiltinOperator.CAST, options=OptionsReader("CastOptions", _read_cast))
def map_cast(ctx: MappingContext, node: TfLiteNode) -> None:
    src, dst = ctx.input_tensor(0), ctx.output_tensor(0)
    if src.type not in _CASTABLE or dst.type not in _CASTABLE:
        raise MappingError("CAST is supported between float32, float16 and int32")
    _unary(ctx, node, OperationType.CAST)
