"""TFLite's fully integer LSTM (int8 input and weights, int16 cell state: the "8x8_16" kernel) ->
NNAPI QUANTIZED_LSTM (1.3), one step. Called by ``lstm.map_lstm`` for an int8 input.

The tables agree on inputs 0-23 (weights, peepholes, biases, projection, the two states, the
layer norm weights); NNAPI then takes as scalars what TFLite keeps in the options and in the
operator's 5 intermediate tensors: 24 cell_clip, 25 proj_clip, 26-29 the scale of each gate's
matmul sum (the intermediates' with layer norm; without, TFLite's kernel uses Q3.12, 2^-12),
30 and 31 the hidden state's zero point and scale (intermediate 4). Outputs: the new output
state, the new cell state (both written back into TFLite's variable tensors) and the output.
See hal/operations/quantized_lstm_int8.py.

The fully integer UNIDIRECTIONAL_SEQUENCE_LSTM has no NNAPI counterpart, but TFLite's kernel
(unidirectional_sequence_lstm.cc -> lstm_eval EvalInteger8x8_16) runs the same integer step as
the LSTM builtin once per time step, the state carried from one step to the next. So it is
unrolled (``sequence_steps``): the input cut into steps, one QUANTIZED_LSTM a step with the same
constants and scalars, the steps' outputs put back together; the last step's states are the
state outputs. Same arithmetic, so bit-exact.
"""
from __future__ import annotations

from delegate.mapping.core import MappingContext, MappingError
from delegate.mapping.sequence_steps import join_steps, split_steps, time_steps
from delegate.tfl.graph import TfLiteNode
from delegate.tfl.schema import TensorType, tensor_type_name
from hal.types import OperandType, OperationType

QS8 = OperandType.TENSOR_QUANT8_ASYMM_SIGNED
Q8_SYMM = OperandType.TENSOR_QUANT8_SYMM
Q16 = OperandType.TENSOR_QUANT16_SYMM
I32 = OperandType.TENSOR_INT32

#: TFLite input position -> (TFLite type, NNAPI type) of the int8 LSTM's constant tensors.
_WEIGHTS = {k: (TensorType.INT8, Q8_SYMM) for k in (*range(1, 9), 16)}
_INT16 = {k: (TensorType.INT16, Q16) for k in (9, 10, 11, 20, 21, 22, 23)}  # peepholes, layer norm
_BIASES = {k: (TensorType.INT32, I32) for k in (*range(12, 16), 17)}
TENSORS = {**_WEIGHTS, **_INT16, **_BIASES}
LAYER_NORM_FORGET = 21
Q3_12 = 2.0 ** -12


def _omitted(ctx: MappingContext, otype: OperandType) -> int:
    idx = ctx.builder.add_operand(otype, (0,), 0.0 if otype == I32 else 1.0)
    ctx.builder.set_no_value(idx)
    return idx


def _constant(ctx: MappingContext, k: int, want: tuple[int, OperandType]) -> int:
    t = ctx.node.inputs[k] if k < len(ctx.node.inputs) else -1
    ttype, otype = want
    if t < 0:
        return _omitted(ctx, otype)
    info = ctx.tensor_info(t)
    if info.type != ttype:
        raise MappingError(f"input {k} {info.name!r} is {tensor_type_name(info.type)}, the integer LSTM wants "
                           f"{tensor_type_name(ttype)}")
    if info.per_channel or (ttype != TensorType.INT32 and (not info.is_quantized or any(info.zero_points))):
        raise MappingError(f"input {k} {info.name!r} must be quantized per tensor, symmetric (zero point 0)")
    return ctx.tensor(t, type=otype, scale=info.scales[0] if info.is_quantized else None)


def _state(ctx: MappingContext, k: int, ttype: int, otype: OperandType) -> tuple[int, int]:
    t = ctx.node.inputs[k]
    info = ctx.tensor_info(t)
    if not info.is_variable or info.type != ttype or not info.is_quantized:
        raise MappingError(f"state input {k} {info.name!r} must be a quantized {tensor_type_name(ttype)} "
                           f"variable tensor")
    return ctx.tensor(t, type=otype), ctx.state_output(t)


def _cell(ctx: MappingContext, node: TfLiteNode) -> tuple[dict[int, int], list[int]]:
    """The cell's constant operands by TFLite input position, and NNAPI's scalars 24-31."""
    inputs = list(node.inputs)
    if len(inputs) != 24:
        raise MappingError(f"the integer LSTM has 24 inputs, got {len(inputs)}")
    if len(node.intermediates) != 5:
        raise MappingError(f"the integer LSTM needs its 5 intermediate tensors (internal scales), got "
                           f"{len(node.intermediates)}")
    inter = [ctx.tensor_info(t) for t in node.intermediates]
    if not all(i.is_quantized for i in inter):
        raise MappingError("the integer LSTM's intermediate tensors carry no quantization")
    consts = {k: _constant(ctx, k, want) for k, want in TENSORS.items()}
    layer_norm = inputs[LAYER_NORM_FORGET] >= 0
    gate_scales = [i.scales[0] if layer_norm else Q3_12 for i in inter[:4]]
    scalars = [ctx.float32(ctx.option("cell_clip", 0.0)), ctx.float32(ctx.option("proj_clip", 0.0)),
               *map(ctx.float32, gate_scales), ctx.int32(inter[4].zero_points[0]), ctx.float32(inter[4].scales[0])]
    return consts, scalars


def _step(ctx: MappingContext, consts: dict[int, int], scalars: list[int], x: int, h: int, c: int,
          outputs: list[int]) -> None:
    ins = [x, *(consts[k] for k in range(1, 18)), h, c, *(consts[k] for k in range(20, 24)), *scalars]
    ctx.operation(OperationType.QUANTIZED_LSTM, ins, outputs)  # output state, cell state, output


def map_integer_lstm(ctx: MappingContext, node: TfLiteNode) -> None:
    consts, scalars = _cell(ctx, node)
    x = ctx.tensor(node.inputs[0])  # TENSOR_QUANT8_ASYMM_SIGNED
    h_in, h_out = _state(ctx, 18, TensorType.INT8, QS8)
    c_in, c_out = _state(ctx, 19, TensorType.INT16, Q16)
    _step(ctx, consts, scalars, x, h_in, c_in, [h_out, c_out, ctx.tensor(node.outputs[0])])


def map_integer_sequence_lstm(ctx: MappingContext, node: TfLiteNode, time_major: bool) -> None:
    """UNIDIRECTIONAL_SEQUENCE_LSTM, fully integer: one QUANTIZED_LSTM per time step."""
    time_steps(ctx, time_major, "integer sequence LSTM", "NNAPI has no integer sequence LSTM")
    consts, scalars = _cell(ctx, node)
    x = ctx.tensor(node.inputs[0])
    h, h_out = _state(ctx, 18, TensorType.INT8, QS8)
    c, c_out = _state(ctx, 19, TensorType.INT16, Q16)
    y = ctx.tensor(node.outputs[0])
    steps = split_steps(ctx, x, time_major)
    outputs = []
    for n, x_t in enumerate(steps):
        last = n == len(steps) - 1
        h_next = h_out if last else ctx.new_temporary(h_out)
        c_next = c_out if last else ctx.new_temporary(c_out)
        y_t = ctx.new_temporary(y, ctx.builder.operands[h_out].dimensions)
        _step(ctx, consts, scalars, x_t, h, c, [h_next, c_next, y_t])
        h, c = h_next, c_next
        outputs.append(y_t)
    join_steps(ctx, outputs, y, time_major)
