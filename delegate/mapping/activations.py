"""RELU, RELU_N1_TO_1, RELU6, LOGISTIC, TANH, HARD_SWISH: TFLite -> NNAPI.

NNAPI is stricter than TFLite about quantization: the RELU family must keep the
input quantization, LOGISTIC/TANH have a fixed output quantization. Other TFLite
variants are not delegated.
"""
from __future__ import annotations

import numpy as np

from delegate.mapping.core import MappingContext, MappingError, mapper
from delegate.mapping.options import no_options
from delegate.tfl.graph import TfLiteNode, TfLiteTensor
from delegate.tfl.schema import BuiltinOperator
from hal.operations.activations import FIXED_OUTPUT_QUANT, hard_swish_params
from hal.types import OperandType, OperationType

_RELU = {
    BuiltinOperator.RELU: OperationType.RELU,
    BuiltinOperator.RELU_N1_TO_1: OperationType.RELU1,
    BuiltinOperator.RELU6: OperationType.RELU6,
}
_QUANT8 = (OperandType.TENSOR_QUANT8_ASYMM, OperandType.TENSOR_QUANT8_ASYMM_SIGNED)


def _io(ctx: MappingContext, node: TfLiteNode, max_rank: int | None = 4):
    """Input/output tensor infos after the checks every unary activation needs."""
    if len(node.inputs) != 1 or len(node.outputs) != 1:
        raise MappingError(f"expected 1 input and 1 output, got {len(node.inputs)} and "
                           f"{len(node.outputs)}")
    x, y = ctx.input_tensor(0), ctx.output_tensor(0)
    if max_rank is not None and len(x.shape) > max_rank:
        raise MappingError(f"NNAPI supports rank <= {max_rank}, input has rank {len(x.shape)}")
    if x.type != y.type:
        raise MappingError("input and output types differ")
    return x, y


def _quant(t: TfLiteTensor) -> tuple[np.float32, int]:
    if not t.is_quantized:
        raise MappingError(f"tensor {t.name!r} is not quantized")
    return np.float32(t.scales[0]), int(t.zero_points[0])


def _emit(ctx: MappingContext, node: TfLiteNode, op: OperationType) -> None:
    ctx.operation(op, [ctx.tensor(node.inputs[0])], [ctx.tensor(node.outputs[0])])



@mapper(*_RELU, options=no_options())
def map_relu(ctx: MappingContext, node: TfLiteNode) -> None:
    x, y = _io(ctx, node)
    if ctx.operand_type(x) in _QUANT8 and _quant(x) != _quant(y):
        raise MappingError("NNAPI requires the output quantization to equal the input's")
    _emit(ctx, node, _RELU[node.builtin_code])


def _map_fixed_output(ctx: MappingContext, node: TfLiteNode, op: OperationType) -> None:
    x, y = _io(ctx, node)
    t = ctx.operand_type(x)
    if t in _QUANT8:
        scale, zp = FIXED_OUTPUT_QUANT[(op, t)]
        if _quant(y) != (np.float32(scale), zp):
            raise MappingError(f"NNAPI {op.name} requires output scale {scale} and zero point "
                               f"{zp}, got {y.scales[0]} and {y.zero_points[0]}")
    _emit(ctx, node, op)


@mapper(BuiltinOperator.LOGISTIC, options=no_options())
def map_logistic(ctx: MappingContext, node: TfLiteNode) -> None:
    _map_fixed_output(ctx, node, OperationType.LOGISTIC)


@mapper(BuiltinOperator.TANH, options=no_options())
def map_tanh(ctx: MappingContext, node: TfLiteNode) -> None:
    _map_fixed_output(ctx, node, OperationType.TANH)


@mapper(BuiltinOperator.HARD_SWISH, options=no_options())
def map_hard_swish(ctx: MappingContext, node: TfLiteNode) -> None:
    x, y = _io(ctx, node, max_rank=None)
    if len(x.shape) < 1:
        raise MappingError("NNAPI HARD_SWISH needs an input of rank >= 1")
    if ctx.operand_type(x) in _QUANT8:
        (si, zi), (so, zo) = _quant(x), _quant(y)
        if hard_swish_params(si, zi, so, zo).output_multiplier_exponent > 0:
            raise MappingError("input scale / 128 must be below the output scale")
    _emit(ctx, node, OperationType.HARD_SWISH)
