"""MEAN, SUM, REDUCE_PROD, REDUCE_MAX, REDUCE_MIN, REDUCE_ANY, REDUCE_ALL: TFLite -> NNAPI
MEAN / REDUCE_*. Both read the same axis lists (negative counting from the end, duplicates once)
and keep_dims; NNAPI's keep_dims is an INT32 for MEAN and a BOOL for REDUCE_*.

Not delegated: non-constant or empty axis lists (the axes are needed here to tell the output's
rank; an empty list is never stored as constant data) and reducing everything without keep_dims
(TFLite gives a scalar, NNAPI shape [1]). NNAPI's own rules (ranks 1 to 4, the types each op takes:
no quantized SUM or PROD, no integer tensors; a quantized output with the input's scale and zero
point) are hal's validate's.

Quantized MEAN whose output scale or zero point differs from the input's (TFLite allows it, and the
converter writes it in squeeze-excitation blocks and pooling heads; NNAPI's MEAN does not) becomes
com.nnhal.tflite:QUANTIZED_MEAN, nnhal's extension operation with TFLite 2.14's reference arithmetic
(reduce.cc EvalMean -> reference_ops::QuantizedMeanOrSum: acc = sum(q) - count * in_zp, then
MultiplyByQuantizedMultiplier(acc, M', shift') + out_zp, where (M, shift) = QuantizeMultiplier(
in_scale / out_scale) and M' = (M << k) / count, shift' = shift - k, k = min(floor(log2(count)), 32,
31 + shift)). Why not an NNAPI rewrite: every NNAPI operation that can change the quantization
derives its multiplier with QuantizeMultiplier from float32 scales, which gives a normalized
M in [2^30, 2^31), while TFLite's M' comes from an integer division and is often below 2^30: the
closest candidate, a DEPTHWISE_CONV_2D over the reduced window with a constant filter of value v
and a free float32 filter scale, multiplies the same sum, but its (multiplier, shift) pair rounds
at other bits (SaturatingRoundingDoublingHighMul, then RoundingDivideByPOT). Checked exhaustively
over every accumulator value an 8-bit input can produce: for 195 of 300 random (scales, zero
points, count) cases none of the 50 best (v, filter scale) pairs reproduced TFLite's outputs, so no
exact rewrite exists in general; MEAN then requantizing rounds twice, and NNAPI has no integer
requantize. The extension is registered in this process on first use; a service without it refuses
the operation (the node stays on the CPU, with hal's reason).
"""
from __future__ import annotations

import numpy as np

from delegate.mapping.core import MappingContext, MappingError, mapper
from delegate.mapping.options import OptionsReader, bools
from delegate.tfl.graph import TfLiteNode, TfLiteTensor
from delegate.tfl.schema import BuiltinOperator, TensorType
from hal.types import OperandType, OperationType

#: TFLite builtin -> the NNAPI operation it maps to.
_OPS = {
    BuiltinOperator.MEAN: OperationType.MEAN,
    BuiltinOperator.SUM: OperationType.REDUCE_SUM,
    BuiltinOperator.REDUCE_PROD: OperationType.REDUCE_PROD,
    BuiltinOperator.REDUCE_MAX: OperationType.REDUCE_MAX,
    BuiltinOperator.REDUCE_MIN: OperationType.REDUCE_MIN,
    BuiltinOperator.REDUCE_ANY: OperationType.REDUCE_ANY,
    BuiltinOperator.REDUCE_ALL: OperationType.REDUCE_ALL,
}


def _read_reducer(a: int) -> dict:
    return {"keep_dims": bools(a, 1)[0]}  # TfLiteReducerParams


def _axes(ctx: MappingContext, rank: int, keep: bool) -> np.ndarray:
    """The constant axis list, as NNAPI's 1-D TENSOR_INT32 values."""
    axis = ctx.input_tensor(1)
    if axis.type != TensorType.INT32 or not axis.is_constant:
        raise MappingError("the axis tensor must be a constant int32 tensor")
    axes = np.asarray(axis.data, dtype=np.int32).reshape(-1)
    if axes.size == 0:
        raise MappingError("an empty axis list (reduce nothing) is not delegated")
    if np.any((axes < -rank) | (axes >= rank)):
        raise MappingError(f"axis {axes.tolist()} out of range for rank {rank}")
    if not keep and len({int(a) % rank for a in axes}) == rank:
        raise MappingError("reducing every dimension without keep_dims gives a TFLite scalar "
                           "(NNAPI gives shape [1])")
    return axes


@mapper(*_OPS, options=OptionsReader("ReducerOptions", _read_reducer))
def map_reduce(ctx: MappingContext, node: TfLiteNode) -> None:
    if len(node.inputs) != 2 or len(node.outputs) != 1:
        raise MappingError(f"expected 2 inputs and 1 output, got {len(node.inputs)} and {len(node.outputs)}")
    op = _OPS[node.builtin_code]
    x = ctx.input_tensor(0)
    if op == OperationType.MEAN and _requantizes(x, ctx.output_tensor(0)):
        op = _quantized_mean_code(ctx)
    keep = bool(ctx.option("keep_dims", False))
    axes = _axes(ctx, len(x.shape), keep)
    axes_op = ctx.constant(OperandType.TENSOR_INT32, axes)  # 1-D even if TFLite's axis is 0-D
    keep_op = ctx.int32(1 if keep else 0) if node.builtin_code == BuiltinOperator.MEAN else ctx.bool(keep)
    ctx.operation(op, [ctx.tensor(node.inputs[0]), axes_op, keep_op], [ctx.tensor(node.outputs[0])])


def _requantizes(x: TfLiteTensor, y: TfLiteTensor) -> bool:
    """An 8-bit MEAN whose output has another (per-tensor) scale or zero point than its input."""
    if x.type not in (TensorType.UINT8, TensorType.INT8) or y.type != x.type:
        return False
    if not x.is_quantized or not y.is_quantized or x.per_channel or y.per_channel:
        return False  # operand_type refuses these with its own reason
    return (np.float32(x.scales[0]) != np.float32(y.scales[0])) or x.zero_points[0] != y.zero_points[0]


def _quantized_mean_code(ctx: MappingContext) -> int:
    from extensions import tflite_compat
    tflite_compat.ensure_registered()
    return ctx.extension_code(tflite_compat.NAME, tflite_compat.QUANTIZED_MEAN)
