"""com.nnhal.tflite: TFLite quantized semantics that no NNAPI operation has, as nnhal's own extension.

QUANTIZED_MEAN (type 0): TFLite's MEAN on TENSOR_QUANT8_ASYMM / TENSOR_QUANT8_ASYMM_SIGNED whose
output quantization differs from the input's (NNAPI's MEAN requires them equal). Signature as
NNAPI's MEAN: 0 input (rank 1-4), 1 axes (TENSOR_INT32, 1-D, negative counting from the end,
duplicates once), 2 keep_dims (INT32, positive = keep); output of the input's type, any scale and
zero point. Arithmetic: TFLite 2.14's reference kernel (reduce.cc EvalMean, BUILTIN_REF ->
EvalQuantizedMean -> reference_ops::QuantizedMeanOrSum, for every axis set), which hal's MEAN
kernel already implements (hal.backends.reference.reduce: in_scale / out_scale as
QuantizeMultiplier, 1/count folded in by integer division, then
MultiplyByQuantizedMultiplier(sum - count * in_zp) + out_zp, saturated). The delegate maps TFLite
MEAN here only when the quantizations differ (delegate/mapping/reduce.py says why no NNAPI rewrite
is exact).

REQUANTIZE (type 1): TFLite's QUANTIZE from an 8-bit tensor to an 8-bit tensor, the one NNAPI
lacks (NNAPI's QUANTIZE takes float input only): input 0 TENSOR_QUANT8_ASYMM or
TENSOR_QUANT8_ASYMM_SIGNED, any rank; output of either type (uint8 <-> int8 or the same type), any
scale and zero point, the input's shape. Arithmetic: TFLite 2.14's reference kernel (quantize.cc
Prepare + Eval<kReference> -> reference_ops::Requantize, what BUILTIN_REF registers): (M, shift) =
QuantizeMultiplier(double(in_scale) / double(out_scale)), then
clamp(MultiplyByQuantizedMultiplier(q - in_zp, M, shift) + out_zp) to the output type. Its fast
path (equal scales, zero points 128 apart across uint8/int8: q ^ 0x80) gives the same values, since
M = 2^30, shift = 1 multiplies exactly by one. The delegate uses it only where the scales differ
(delegate/mapping/quantization.py: with equal scales an exact NNAPI-only rewrite exists).

RELU_REQUANTIZED (type 2): TFLite's RELU, RELU6 and RELU_N1_TO_1 on TENSOR_QUANT8_ASYMM /
TENSOR_QUANT8_ASYMM_SIGNED whose output quantization differs from the input's (NNAPI's RELU, RELU6
and RELU1 require them equal). Input 0 the tensor (any rank), input 1 an INT32 scalar naming the
clamp as NNAPI's fused activation codes (1 RELU, 2 RELU1 = RELU_N1_TO_1, 3 RELU6); output of the
input's type (TFLite requires it), any scale and zero point, the input's shape. Arithmetic: TFLite
2.14's kernel (activations.cc ReluPrepare + Relu/Relu1/Relu6Eval -> QuantizedReluX ->
optimized_ops::ReluX; RELU has no reference variant, so BUILTIN_REF runs this too): (M, shift) =
QuantizeMultiplier(in_scale / out_scale), the division in float32 before the promotion to double
(unlike QUANTIZE's), then min(hi, max(lo, MultiplyByQuantizedMultiplier(q - in_zp, M, shift) +
out_zp)), where [lo, hi] is the activation range in the output's units: out_zp +
roundf(act / out_scale) within the type's range (RELU's upper bound: the type's maximum), as
hal.quant.activation_range_quantized computes it. The delegate uses it where the quantizations
differ, or the rank exceeds NNAPI's 4 (delegate/mapping/activations.py).

nnhal ships and registers it itself (extensions.plugins.load_plugins, and the MEAN and QUANTIZE mappers
in the client's process): it is not a vendor plugin, and needs no installation. Its companion
com.nnhal.litert (extensions/litert_compat.py: LiteRT's FULLY_CONNECTED, requantized in double) is
registered with it, so a service knows both.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from extensions import litert_compat
from extensions.registry import Extension, ExtensionOperation, lookup, register
from hal import quant
from hal.backends.reference.reduce import MeanData, execute_mean, plan_mean
from hal.operations import reduce as reduce_spec
from hal.operations.common import I32, INT32, QS8, QU8, param
from hal.operations.reduce import MAX_RANK
from hal.types import FusedActivationFunc

NAME = "com.nnhal.tflite"
QUANTIZED_MEAN = 0
REQUANTIZE = 1
RELU_REQUANTIZED = 2
INPUT, AXES, KEEP_DIMS = 0, 1, 2
ACTIVATION = 1  # RELU_REQUANTIZED's clamp: an NNAPI fused activation code
_RELU_CLAMPS = (FusedActivationFunc.RELU, FusedActivationFunc.RELU1, FusedActivationFunc.RELU6)


def validate(ctx) -> None:
    ctx.expect_num_inputs(3)
    ctx.expect_num_outputs(1)
    ctx.expect_input_type(INPUT, QU8, QS8)
    ctx.expect_output_type(0, ctx.input_type(INPUT))
    ctx.expect_input_rank_between(INPUT, 1, MAX_RANK)
    ctx.expect_input_type(AXES, I32)
    ctx.expect_input_rank(AXES, 1)
    param(ctx, KEEP_DIMS, INT32)


def prepare(ctx) -> MeanData:
    """NNAPI MEAN's shapes and hal's reference MEAN plan: TFLite's QuantizedMeanOrSum multiplier
    (scales divided in double, 1/count folded in) is what that plan computes for any two
    quantizations. Its execute is registered as this operation's own, so the extension's identity
    hashes that module and the compilation cache admits its MeanData."""
    return plan_mean(ctx, reduce_spec.resolve(ctx, INT32))


@dataclass
class RequantizeData:
    """Prepare's integer parameters (plan data: a type of this module, which the compilation cache admits)."""

    multiplier: int
    shift: int
    input_zero_point: int
    output_zero_point: int
    out_type: int  # NNAPI operand type code of the output (its range and numpy dtype)


def validate_requantize(ctx) -> None:
    ctx.expect_num_inputs(1)
    ctx.expect_num_outputs(1)
    ctx.expect_input_type(INPUT, QU8, QS8)
    ctx.expect_output_type(0, QU8, QS8)


def prepare_requantize(ctx) -> RequantizeData:
    ctx.set_output_shape(0, ctx.input_shape(INPUT))
    x, out = ctx.input(INPUT), ctx.output(0)
    # quantize.cc Prepare: the float32 scales promoted to double before dividing.
    m, shift = quant.quantize_multiplier(float(np.float32(x.scale)) / float(np.float32(out.scale)))
    return RequantizeData(m, shift, x.zero_point, out.zero_point, int(out.type))


def execute_requantize(ctx, inputs: list) -> list:
    d: RequantizeData = ctx.data
    lo, hi = quant.quant_range(d.out_type)
    v = quant.multiply_by_quantized_multiplier(inputs[0].astype(np.int64) - d.input_zero_point,
                                               d.multiplier, d.shift) + d.output_zero_point
    return [np.clip(v, lo, hi).astype(np.uint8 if d.out_type == QU8 else np.int8)]


@dataclass
class ReluRequantizedData:
    """Prepare's integer parameters (plan data: a type of this module, which the compilation cache admits)."""

    multiplier: int
    shift: int
    input_zero_point: int
    output_zero_point: int
    low: int  # the activation range in the output's quantized units, within its type's range
    high: int
    out_type: int  # NNAPI operand type code of the output (its numpy dtype)


def _relu_clamp(ctx, value) -> None:
    ctx.check(value is None or value in _RELU_CLAMPS,
              f"input {ACTIVATION} (activation) must be 1 (RELU), 2 (RELU1) or 3 (RELU6), got {value}")


def validate_relu_requantized(ctx) -> None:
    ctx.expect_num_inputs(2)
    ctx.expect_num_outputs(1)
    ctx.expect_input_type(INPUT, QU8, QS8)
    ctx.expect_output_type(0, ctx.input_type(INPUT))
    _relu_clamp(ctx, param(ctx, ACTIVATION, INT32))


def prepare_relu_requantized(ctx) -> ReluRequantizedData:
    act = ctx.scalar(ACTIVATION, INT32)
    _relu_clamp(ctx, act)
    ctx.set_output_shape(0, ctx.input_shape(INPUT))
    x, out = ctx.input(INPUT), ctx.output(0)
    # ReluPrepare: `input->params.scale / output->params.scale` is a float division, then double.
    m, shift = quant.quantize_multiplier(float(np.float32(x.scale) / np.float32(out.scale)))
    lo, hi = quant.activation_range_quantized(act, out.type, out.scale, out.zero_point)
    return ReluRequantizedData(m, shift, x.zero_point, out.zero_point, lo, hi, int(out.type))


def execute_relu_requantized(ctx, inputs: list) -> list:
    d: ReluRequantizedData = ctx.data
    v = quant.multiply_by_quantized_multiplier(inputs[0].astype(np.int64) - d.input_zero_point,
                                               d.multiplier, d.shift) + d.output_zero_point
    v = np.minimum(np.maximum(v, d.low), d.high)  # ReluX's order: lower bound first
    return [v.astype(np.uint8 if d.out_type == QU8 else np.int8)]


EXTENSION = Extension(
    name=NAME, version="1.2",
    operations=(ExtensionOperation(QUANTIZED_MEAN, "QUANTIZED_MEAN", validate, prepare, execute_mean),
                ExtensionOperation(REQUANTIZE, "REQUANTIZE", validate_requantize, prepare_requantize,
                                   execute_requantize),
                ExtensionOperation(RELU_REQUANTIZED, "RELU_REQUANTIZED", validate_relu_requantized,
                                   prepare_relu_requantized, execute_relu_requantized)),
    description="TFLite quantized semantics NNAPI lacks (MEAN with a different output quantization, "
                "QUANTIZE between 8-bit types, RELU/RELU6/RELU_N1_TO_1 with a different output "
                "quantization)")


def ensure_registered() -> None:
    """Register the extension, and com.nnhal.litert, in this process unless they are (the delegate's
    mappers and extensions.plugins.load_plugins call this)."""
    if lookup(NAME) is None:
        register(EXTENSION)
    litert_compat.ensure_registered()
