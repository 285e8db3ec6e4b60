"""QUANTIZE, DEQUANTIZE, CAST: TFLite -> NNAPI.

TFLite DEQUANTIZE of a float16 tensor (fp16-weight models) is NNAPI CAST; of an
8-bit tensor it is NNAPI DEQUANTIZE. TFLite QUANTIZE from 8 bits (requantize)
has no NNAPI 1.3 equivalent. TFLite CAST maps only between float32, float16 and
int32: to 8 bits TFLite's static_cast wraps (int32 300 -> 44) where NNAPI CAST
saturates, and NNAPI casts bool and int8/int16 only to themselves. NNAPI's own type rules
(QUANTIZE's uint8/int8 outputs, DEQUANTIZE's rank <= 4) are hal's validate's.
"""
from __future__ import annotations

from delegate.mapping.core import MappingContext, MappingError, mapper
from delegate.mapping.options import OptionsReader, ints, no_options
from delegate.tfl.graph import TfLiteNode
from delegate.tfl.schema import BuiltinOperator, TensorType
from hal.types import OperationType

_CASTABLE = (TensorType.FLOAT32, TensorType.FLOAT16, TensorType.INT32)


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
    src = ctx.input_tensor(0)
    if src.type != TensorType.FLOAT32:
        raise MappingError("QUANTIZE from a quantized tensor (requantization) has no NNAPI 1.3 equivalent")
    _unary(ctx, node, OperationType.QUANTIZE)


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
