"""FULLY_CONNECTED: TFLite -> NNAPI.

NNAPI's FULLY_CONNECTED always has a bias and a 2-D output, and no hybrid, shuffled or per-channel
variants. Hybrid and shuffled TFLite variants are not delegated (NNAPI's own rules are checked by
hal's spec). How 8-bit nodes map depends on the runtime the delegate runs in
(delegate/mapping/host_runtime.py), whose reference kernels nnhal equals:

LiteRT >= 1.3 requantizes every 8-bit FULLY_CONNECTED (uint8, int8, per-tensor or per-channel
weights) in double, a rounding no NNAPI operation has: such nodes become
com.nnhal.litert:FULLY_CONNECTED_DOUBLE_REQUANT (extensions/litert_compat.py), with
NNAPI FULLY_CONNECTED's operands and the weights as they are (per-channel ones as
TENSOR_QUANT8_SYMM_PER_CHANNEL along dimension 0).

tflite-runtime 2.14 (and LiteRT < 1.3) requantizes in fixed point, as NNAPI does: per-tensor
weights map to NNAPI's FULLY_CONNECTED, and per-channel int8 weights (what the TFLite converter
writes for int8 models: one scale per output unit) to an exact NNAPI rewrite with a 1x1 CONV_2D,
which has per-channel filters:

    RESHAPE  x [.., K] -> [B, 1, 1, K]                (B = elements / K, TFLite's flattening)
    CONV_2D  filter [N, 1, 1, K] TENSOR_QUANT8_SYMM_PER_CHANNEL (channelDim 0, TFLite's scales),
             int32 bias (NNAPI's per-channel bias scale 0: input_scale * filter_scale[c] implied),
             VALID, stride 1, the node's fused activation          -> [B, 1, 1, N]
    RESHAPE  -> the TFLite output's shape [B, N]

(keep_num_dims with an input of rank > 2 stays on the CPU for 8-bit types: TFLite 2.14's reference
kernels compute only dims(0) x dims(1) of such an output; other outputs are 2-D either way.)

Why the rewrite is bit-exact (TFLite 2.14, BUILTIN_REF): fully_connected.cc's per-channel Prepare
and conv.cc's PopulateConvolutionQuantizationParams both compute each channel's multiplier as
QuantizeMultiplier(double(input_scale) * double(filter_scale[c]) / double(output_scale)), and both
take the activation range from CalculateActivationRangeQuantized. The kernels then agree term by
term: reference_integer_ops::FullyConnectedPerChannel computes, per batch row b and unit c,
acc = sum_k filter[c][k] * (input[b][k] + input_offset) + bias[c];
MultiplyByQuantizedMultiplier(acc, output_multiplier[c], output_shift[c]) + output_offset, clamped
to [act_min, act_max]; reference_integer_ops::ConvPerChannel on a 1x1 filter over a 1x1 image sums
exactly the same K products (int32, order irrelevant for integers), adds the same bias, and applies
the same multiplier, offset and clamp per output channel. The filter zero point is 0 in both (the
per-channel spec; other zero points are refused). Checked against both runtimes in
tests/delegate/test_quantized_rewrites.py and tests/delegate/test_fully_connected_runtimes.py.
"""
from __future__ import annotations

import math

import numpy as np

from delegate.mapping.core import MappingContext, MappingError, mapper
from delegate.mapping.host_runtime import requantizes_fully_connected_in_double
from delegate.mapping.options import OptionsReader, bools, ints
from delegate.tfl.graph import TfLiteNode, TfLiteTensor
from delegate.tfl.schema import BuiltinOperator, TensorType
from extensions import litert_compat
from hal.model import SymmPerChannelQuantParams
from hal.types import OperandType, OperationType, PaddingScheme

_WEIGHTS_FORMAT_DEFAULT = 0


def _read_fully_connected(a: int) -> dict:
    act, fmt = ints(a, 2)  # TfLiteFullyConnectedParams
    keep, asym = bools(a + 8, 2)
    return {"fused_activation_function": act, "weights_format": fmt, "keep_num_dims": keep,
            "asymmetric_quantize_inputs": asym}


@mapper(BuiltinOperator.FULLY_CONNECTED, options=OptionsReader("FullyConnectedOptions", _read_fully_connected))
def map_fully_connected(ctx: MappingContext, node: TfLiteNode) -> None:
    x, w = ctx.input_tensor(0), ctx.input_tensor(1)
    if ctx.option("weights_format", _WEIGHTS_FORMAT_DEFAULT) != _WEIGHTS_FORMAT_DEFAULT:
        raise MappingError("shuffled FULLY_CONNECTED weights have no NNAPI equivalent")
    if w.type != x.type:
        raise MappingError(f"weights type {w.type} differs from input type {x.type} "
                           f"(hybrid FULLY_CONNECTED is not supported)")
    if len(node.outputs) != 1:
        raise MappingError(f"expected 1 output, got {len(node.outputs)}")
    quantized = x.type in (TensorType.UINT8, TensorType.INT8)
    if quantized and requantizes_fully_connected_in_double(ctx.runtime):
        _map_double_requant(ctx, node, x, w)
        return
    if w.per_channel:
        _map_per_channel(ctx, node, x, w)
        return
    reshape_after = _reshape_after(ctx, x, w)

    act = ctx.fused_activation()
    x_op = ctx.tensor(node.inputs[0])
    w_op = ctx.tensor(node.inputs[1])
    bias_scale = x.scales[0] * w.scales[0] if quantized else None
    if len(node.inputs) > 2 and node.inputs[2] >= 0:
        b_op = ctx.tensor(node.inputs[2], scale=bias_scale)
    else:
        units = w.shape[0] if w.shape else 0
        if quantized:
            b_op = ctx.constant(OperandType.TENSOR_INT32, np.zeros(units, np.int32),
                                scale=bias_scale)
        else:
            b_op = ctx.constant(OperandType.TENSOR_FLOAT32, np.zeros(units, np.float32))
    y = ctx.tensor(node.outputs[0])
    if reshape_after:
        out = ctx.output_tensor(0)
        rows = int(np.prod(out.shape[:-1]))
        flat = ctx.new_temporary(y, shape=(rows, out.shape[-1]))
        ctx.operation(OperationType.FULLY_CONNECTED, [x_op, w_op, b_op, act], [flat])
        shape = ctx.constant(OperandType.TENSOR_INT32, np.asarray(out.shape, np.int32))
        ctx.operation(OperationType.RESHAPE, [flat, shape], [y])
        return
    ctx.operation(OperationType.FULLY_CONNECTED, [x_op, w_op, b_op, act], [y])


def _reshape_after(ctx: MappingContext, x: TfLiteTensor, w: TfLiteTensor) -> bool:
    """Whether the [batch, num_units] result is RESHAPEd to the output's shape (keep_num_dims, float).

    keep_num_dims on a rank > 2 input: TFLite's output is the input's shape with the last dimension
    num_units; NNAPI's FC gives [batch, num_units], RESHAPEd to it. Float only: TFLite 2.14's float
    kernels (reference and optimized) compute all FlatSizeSkipDim(output) rows, the quantized
    reference kernels only dims(0) (nothing to be exact with)."""
    keep = ctx.option("keep_num_dims", False)
    out = ctx.output_tensor(0)
    reshape_after = keep and len(x.shape) > 2 and x.type == TensorType.FLOAT32 and len(out.shape) == len(x.shape)
    if keep and not reshape_after and (len(x.shape) > 2 or (
            len(x.shape) == 2 and len(w.shape) == 2 and x.shape[-1] != w.shape[1])):
        raise MappingError("keep_num_dims with a quantized input of rank > 2 or whose last dimension is "
                           "not input_size (NNAPI output is [batch, num_units])")
    return reshape_after


def _check_per_channel(w: TfLiteTensor) -> None:
    if w.type != TensorType.INT8 or any(z != 0 for z in w.zero_points):
        raise MappingError("per-channel weights must be int8 with zero points 0")
    if len(w.shape) != 2 or w.quantized_dimension != 0 or len(w.scales) != w.shape[0]:
        raise MappingError(f"per-channel weights {list(w.shape)} must be 2-D with one scale per output unit "
                           f"(quantized_dimension 0, got {w.quantized_dimension}, {len(w.scales)} scales)")


def _batch(x: TfLiteTensor, out: TfLiteTensor, n: int, k: int) -> int:
    """Rows of the per-channel product; its output must be TFLite's 2-D [batch, units]."""
    elements = math.prod(x.shape)
    if k <= 0 or not x.shape or elements % k:
        raise MappingError(f"input {list(x.shape)} does not flatten into rows of input_size {k}")
    batch = elements // k
    if len(out.shape) != 2 or out.shape[0] * out.shape[1] != batch * n:
        # keep_num_dims with an input of rank > 2: TFLite 2.14's FullyConnectedPerChannel reads the
        # output as 2-D [dims(0), dims(1)] and leaves the rest unwritten; nothing to be exact with.
        raise MappingError(f"per-channel FULLY_CONNECTED with output {list(out.shape)} (TFLite's reference kernel "
                           f"computes only a 2-D [batch, units] output)")
    return batch


def _bias(ctx: MappingContext, node: TfLiteNode, n: int, scale: float | None) -> int:
    """The int32 bias operand (zeros when the node has none); ``scale`` overrides its scale."""
    if len(node.inputs) > 2 and node.inputs[2] >= 0:
        if ctx.input_tensor(2).type != TensorType.INT32:
            raise MappingError(f"bias type {ctx.input_tensor(2).type} is not int32")
        return ctx.tensor(node.inputs[2], scale=scale)
    return ctx.constant(OperandType.TENSOR_INT32, np.zeros(n, np.int32), scale=scale or 0.0)


def _map_double_requant(ctx: MappingContext, node: TfLiteNode, x: TfLiteTensor, w: TfLiteTensor) -> None:
    """An 8-bit node for a runtime that requantizes in double: com.nnhal.litert's operation."""
    out = ctx.output_tensor(0)
    if w.per_channel:
        if x.type != TensorType.INT8:
            raise MappingError("per-channel FULLY_CONNECTED weights with a non-int8 input")
        _check_per_channel(w)
        _batch(x, out, *w.shape)
    else:
        _reshape_after(ctx, x, w)  # False for 8-bit types: refuses the keep_num_dims outputs NNAPI's cannot give
    if len(w.shape) != 2:
        raise MappingError(f"weights of rank {len(w.shape)} (NNAPI's are [num_units, input_size])")
    act = ctx.fused_activation()
    ins = [ctx.tensor(node.inputs[0]), ctx.tensor(node.inputs[1], per_channel_ok=True),
           _bias(ctx, node, w.shape[0], None), act]
    litert_compat.ensure_registered()
    code = ctx.extension_code(litert_compat.NAME, litert_compat.FULLY_CONNECTED_DOUBLE_REQUANT)
    ctx.operation(code, ins, [ctx.tensor(node.outputs[0])])


def _per_channel_filter(ctx: MappingContext, w: TfLiteTensor) -> int:
    """The TFLite [N, K] per-channel weights as a constant NNAPI [N, 1, 1, K] per-channel filter."""
    _check_per_channel(w)
    if not w.is_constant or w.sparse:
        raise MappingError("per-channel weights must be a dense constant (NNAPI cannot reshape them)")
    n, k = w.shape
    cq = SymmPerChannelQuantParams(tuple(float(s) for s in w.scales), 0)
    return ctx.constant(OperandType.TENSOR_QUANT8_SYMM_PER_CHANNEL,
                        np.asarray(w.data, np.int8).reshape(n, 1, 1, k), channel_quant=cq)


def _map_per_channel(ctx: MappingContext, node: TfLiteNode, x: TfLiteTensor, w: TfLiteTensor) -> None:
    """RESHAPE -> 1x1 CONV_2D with the per-channel filter -> RESHAPE (see the module docstring)."""
    out = ctx.output_tensor(0)
    if x.type != TensorType.INT8:
        raise MappingError("per-channel FULLY_CONNECTED weights with a non-int8 input")
    filt = _per_channel_filter(ctx, w)
    n, k = w.shape
    batch = _batch(x, out, n, k)
    act = ctx.fused_activation()
    x_op, y_op = ctx.tensor(node.inputs[0]), ctx.tensor(node.outputs[0])
    b_op = _bias(ctx, node, n, 0.0)  # NNAPI: per-channel bias scales are implied
    rows = ctx.new_temporary(x_op, [batch, 1, 1, k])
    ctx.operation(OperationType.RESHAPE,
                  [x_op, ctx.constant(OperandType.TENSOR_INT32, np.array([batch, 1, 1, k], np.int32))], [rows])
    conv = ctx.new_temporary(y_op, [batch, 1, 1, n])
    one = ctx.int32(1)
    ctx.operation(OperationType.CONV_2D, [rows, filt, b_op, ctx.int32(PaddingScheme.VALID), one, one, act],
                  [conv])
    shape = ctx.constant(OperandType.TENSOR_INT32, np.array(out.shape, np.int32))
    ctx.operation(OperationType.RESHAPE, [conv, shape], [y_op])
