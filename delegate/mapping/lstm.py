"""LSTM, UNIDIRECTIONAL_SEQUENCE_LSTM, BIDIRECTIONAL_SEQUENCE_LSTM (float32): TFLite -> NNAPI.

TFLite and NNAPI order a cell's tensors alike: input 0, then 1-4 input weights, 5-8 recurrent
weights, 9-11 peepholes, 12-15 gate biases, 16-17 projection, 18-19 output and cell state; an
absent optional tensor (CIFG, no peephole, no projection) is TFLite's -1 and NNAPI's omitted
operand. Only the tail differs: TFLite's LSTM / UNIDIRECTIONAL_SEQUENCE_LSTM put the layer norm
weights at 20-23 and the options (activation, clips, time_major) in a struct; NNAPI puts those
scalars at 20-22 (23: time_major), then the layer norm weights. TFLite's BIDIRECTIONAL_SEQUENCE_LSTM
has NNAPI's first 48 inputs exactly (two cells, four states, aux input and aux weights) and no
layer norm.

The states are TFLite variable tensors updated in place and kept across invokes; NNAPI reads them
as inputs and writes their new values as outputs (``MappingContext.state_output``: the delegate
kernel copies them back, so reset_all_variables still works). NNAPI's scratch buffer is a
temporary nobody reads. The fully integer LSTM (one step) becomes QUANTIZED_LSTM
(``lstm_integer``).

Not delegated, with the reason: the hybrid kernels (int8 weights, float activations: NNAPI has no
such LSTM), TFLite's 5-input basic kernel, diagonal (1-D) recurrent weights, the integer sequence
LSTM; and two BIDIRECTIONAL_SEQUENCE_LSTM cases where TFLite's own kernel (lstm_eval.cc) reads past
its buffers, so there is no result to reproduce: batch-major merge_outputs with batch > 1 (the
state rows are offset by the merged output width) and an aux_input narrower or wider than the input
(it is stepped through by the input's width).
"""
from __future__ import annotations

from delegate.mapping.core import MappingContext, MappingError, mapper
from delegate.mapping.lstm_integer import map_integer_lstm, map_integer_sequence_lstm
from delegate.mapping.options import OptionsReader, bools, c_float, ints
from delegate.tfl.graph import TfLiteNode
from delegate.tfl.schema import BuiltinOperator, TensorType, tensor_type_name
from hal.types import OperandType, OperationType

F32 = OperandType.TENSOR_FLOAT32
_KERNEL_FULL = 0  # TfLiteLSTMKernelType: kTfLiteLSTMFullKernel, kTfLiteLSTMBasicKernel

# TFLite positions (LSTM, UNIDIRECTIONAL_SEQUENCE_LSTM)
CELL = range(1, 18)  # weights, peepholes, biases, projection: the same position in NNAPI
OUTPUT_STATE, CELL_STATE = 18, 19
LAYER_NORM = range(20, 24)
CIFG_GAP = (1, 5)  # input-gate weights: absent with CIFG (no input gate)

# TFLite BIDIRECTIONAL_SEQUENCE_LSTM: 0-47 are NNAPI's 0-47
BIDI_INPUTS = 48
FW_STATES, BW_STATES = (35, 36), (37, 38)
AUX_INPUT = 39


# ---- options: TFLite 2.14's builtin_op_data.h ----------------------------------------------------

def _clips(a: int) -> dict:
    """The three leading fields all three structs share: activation, cell_clip, proj_clip."""
    return {"fused_activation_function": ints(a, 1)[0], "cell_clip": c_float(a + 4), "proj_clip": c_float(a + 8)}


def _read_lstm(a: int) -> dict:
    return {**_clips(a), "kernel_type": ints(a + 12, 1)[0]}  # TfLiteLSTMParams


def _read_unidirectional(a: int) -> dict:
    # TfLiteUnidirectionalSequenceLSTMParams: ..., bool time_major, asymmetric_quantize_inputs,
    # diagonal_recurrent_tensors
    time_major, _, diagonal = bools(a + 12, 3)
    return {**_clips(a), "time_major": time_major, "diagonal_recurrent_tensors": diagonal}


def _read_bidirectional(a: int) -> dict:
    merge, time_major = bools(a + 12, 2)  # TfLiteBidirectionalSequenceLSTMParams
    return {**_clips(a), "merge_outputs": merge, "time_major": time_major}


# ---- shared ---------------------------------------------------------------------------------------

def _float_type(ctx: MappingContext) -> OperandType:
    x = ctx.input_tensor(0)
    if x.type != TensorType.FLOAT32:
        raise MappingError(f"{tensor_type_name(x.type)} input: only the float32 kernels and the fully integer "
                           f"(int8 weights) LSTM and sequence LSTM are mapped (TFLite has no float16 LSTM)")
    return F32


def _operand(ctx: MappingContext, t: int, what: str) -> int:
    """A cell tensor's operand, or an omitted one for TFLite's absent optional tensor (-1)."""
    if t < 0:
        idx = ctx.builder.add_operand(F32, ())
        ctx.builder.set_no_value(idx)
        return idx
    info = ctx.tensor_info(t)
    if info.type != TensorType.FLOAT32:
        raise MappingError(f"{what} {info.name!r} is {tensor_type_name(info.type)} while the input is float32: "
                           f"the hybrid LSTM kernel has no NNAPI equivalent")
    if info.is_variable:
        raise MappingError(f"{what} {info.name!r} is a variable tensor")
    return ctx.tensor(t)


def _cell(ctx: MappingContext, inputs, positions, what: str = "") -> list[int]:
    return [_operand(ctx, inputs[k], f"{what}input {k}") for k in positions]


def _scalars(ctx: MappingContext) -> list[int]:
    """Activation, cell_clip, proj_clip: the same codes and meaning (0: no clip) in both."""
    return [ctx.int32(ctx.option("fused_activation_function", 0)), ctx.float32(ctx.option("cell_clip", 0.0)),
            ctx.float32(ctx.option("proj_clip", 0.0))]


def _state(ctx: MappingContext, t: int, what: str) -> tuple[int, int]:
    """(operand read, operand written) of a state variable tensor."""
    if t < 0:
        raise MappingError(f"{what} is missing")
    info = ctx.tensor_info(t)
    if not info.is_variable:
        raise MappingError(f"{what} {info.name!r} is not a variable tensor")
    if info.type != TensorType.FLOAT32:
        raise MappingError(f"{what} {info.name!r} is {tensor_type_name(info.type)}, not float32")
    return ctx.tensor(t), ctx.state_output(t)


def _layer_norm(ctx: MappingContext, inputs) -> list[int]:
    """TFLite's layer norm weights 20-23 (a 20-input node has none)."""
    return [_operand(ctx, inputs[k] if k < len(inputs) else -1, f"layer norm input {k}") for k in LAYER_NORM]


def _check_inputs(node: TfLiteNode, counts: tuple[int, ...]) -> list[int]:
    if len(node.inputs) not in counts:
        raise MappingError(f"expected {' or '.join(map(str, counts))} inputs, got {len(node.inputs)}")
    return list(node.inputs)


def _num_units(ctx: MappingContext, inputs) -> int:
    w = ctx.tensor_info(inputs[4])  # input_to_output_weights [num_units, input_size]: never absent
    if len(w.shape) != 2:
        raise MappingError(f"input_to_output_weights has shape {list(w.shape)}, expected rank 2")
    return w.shape[0]


def _check_recurrent(ctx: MappingContext, inputs, what: str = "") -> None:
    w = ctx.tensor_info(inputs[8]) if inputs[8] >= 0 else None
    if w is not None and len(w.shape) == 1:
        raise MappingError(f"{what}diagonal (1-D) recurrent weights have no NNAPI equivalent")


# ---- LSTM: one step --------------------------------------------------------------------------------

@mapper(BuiltinOperator.LSTM, options=OptionsReader("LSTMOptions", _read_lstm))
def map_lstm(ctx: MappingContext, node: TfLiteNode) -> None:
    if ctx.option("kernel_type", _KERNEL_FULL) != _KERNEL_FULL:
        raise MappingError("TFLite's basic LSTM kernel (5 inputs, 4 outputs) has no NNAPI mapping here")
    inputs = _check_inputs(node, (20, 24))
    if len(node.outputs) != 1:
        raise MappingError(f"expected 1 output, got {len(node.outputs)}")
    if ctx.input_tensor(0).type == TensorType.INT8 and ctx.tensor_info(inputs[2]).type == TensorType.INT8:
        map_integer_lstm(ctx, node)  # the fully integer kernel: NNAPI's QUANTIZED_LSTM
        return
    _float_type(ctx)
    _check_recurrent(ctx, inputs)
    x = ctx.tensor(inputs[0])
    cell = _cell(ctx, inputs, CELL)
    h_in, h_out = _state(ctx, inputs[OUTPUT_STATE], "output state (input 18)")
    c_in, c_out = _state(ctx, inputs[CELL_STATE], "cell state (input 19)")
    norms = _layer_norm(ctx, inputs)
    batch = ctx.tensor_info(inputs[0]).shape[0]
    gates = 3 if inputs[1] < 0 else 4
    scratch = ctx.builder.add_operand(F32, (batch, gates * _num_units(ctx, inputs)))
    ctx.operation(OperationType.LSTM, [x, *cell, h_in, c_in, *_scalars(ctx), *norms],
                  [scratch, h_out, c_out, ctx.tensor(node.outputs[0])])


# ---- UNIDIRECTIONAL_SEQUENCE_LSTM ------------------------------------------------------------------

@mapper(BuiltinOperator.UNIDIRECTIONAL_SEQUENCE_LSTM,
        options=OptionsReader("UnidirectionalSequenceLSTMOptions", _read_unidirectional))
def map_unidirectional_sequence_lstm(ctx: MappingContext, node: TfLiteNode) -> None:
    inputs = _check_inputs(node, (20, 24))
    if ctx.option("diagonal_recurrent_tensors", False):
        raise MappingError("diagonal recurrent weights have no NNAPI equivalent")
    if ctx.input_tensor(0).type == TensorType.INT8 and inputs[2] >= 0 \
            and ctx.tensor_info(inputs[2]).type == TensorType.INT8:
        # the fully integer kernel: unrolled into one QUANTIZED_LSTM a step
        map_integer_sequence_lstm(ctx, node, bool(ctx.option("time_major", False)))
        return
    _float_type(ctx)
    _check_recurrent(ctx, inputs)
    if len(node.outputs) != 1:
        raise MappingError(f"expected 1 output, got {len(node.outputs)}")
    x = ctx.tensor(inputs[0])
    cell = _cell(ctx, inputs, CELL)
    h_in, h_out = _state(ctx, inputs[OUTPUT_STATE], "output state (input 18)")
    c_in, c_out = _state(ctx, inputs[CELL_STATE], "cell state (input 19)")
    norms = _layer_norm(ctx, inputs)
    time_major = ctx.bool(ctx.option("time_major", False))
    ctx.operation(OperationType.UNIDIRECTIONAL_SEQUENCE_LSTM,
                  [x, *cell, h_in, c_in, *_scalars(ctx), time_major, *norms],
                  [ctx.tensor(node.outputs[0]), h_out, c_out])  # NNAPI 1.3's final states


# ---- BIDIRECTIONAL_SEQUENCE_LSTM -------------------------------------------------------------------

@mapper(BuiltinOperator.BIDIRECTIONAL_SEQUENCE_LSTM,
        options=OptionsReader("BidirectionalSequenceLSTMOptions", _read_bidirectional))
def map_bidirectional_sequence_lstm(ctx: MappingContext, node: TfLiteNode) -> None:
    inputs = _check_inputs(node, (BIDI_INPUTS,))
    _float_type(ctx)
    _check_recurrent(ctx, inputs, "forward cell: ")
    _check_recurrent(ctx, inputs[17:], "backward cell: ")
    merge = bool(ctx.option("merge_outputs", False))
    if len(node.outputs) != (1 if merge else 2):
        raise MappingError(f"expected {1 if merge else 2} outputs with merge_outputs {merge}, "
                           f"got {len(node.outputs)}")
    x_info = ctx.input_tensor(0)
    time_major = bool(ctx.option("time_major", True))
    if merge and not time_major and len(x_info.shape) == 3 and x_info.shape[0] > 1:
        # lstm_eval.cc offsets a batch row's output state by the output's row width, which merging
        # doubles: from the second batch row on, TFLite's CPU kernel reads and writes past the state.
        raise MappingError("batch-major merge_outputs with batch > 1: TFLite's kernel offsets the state rows by "
                           "the merged output width, so its results cannot be reproduced")
    if inputs[AUX_INPUT] >= 0:
        aux = ctx.tensor_info(inputs[AUX_INPUT])
        if aux.shape[-1:] != x_info.shape[-1:]:
            # lstm_eval.cc steps through aux_input by input 0's row width.
            raise MappingError(f"aux_input is {list(aux.shape)} and input {list(x_info.shape)}: TFLite's kernel "
                               f"reads aux_input with the input's width, so its results cannot be reproduced")
    x = ctx.tensor(inputs[0])
    fw = _cell(ctx, inputs, range(1, 18), "forward cell ")
    bw = _cell(ctx, inputs, range(18, 35), "backward cell ")
    states = [_state(ctx, inputs[k], f"state input {k}") for k in (*FW_STATES, *BW_STATES)]
    aux = _cell(ctx, inputs, range(AUX_INPUT, BIDI_INPUTS), "aux ")
    no_layer_norm = [_operand(ctx, -1, "") for _ in range(8)]
    flags = [ctx.bool(merge), ctx.bool(time_major)]
    outputs = [ctx.tensor(t) for t in node.outputs]
    ctx.operation(OperationType.BIDIRECTIONAL_SEQUENCE_LSTM,
                  [x, *fw, *bw, *(s[0] for s in states), *aux, *_scalars(ctx), *flags, *no_layer_norm],
                  [*outputs, *(s[1] for s in states)])
