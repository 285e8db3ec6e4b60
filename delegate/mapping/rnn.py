"""RNN, UNIDIRECTIONAL_SEQUENCE_RNN, BIDIRECTIONAL_SEQUENCE_RNN and SVDF: TFLite -> NNAPI.

TFLite keeps these ops' state in variable tensors that the kernel overwrites in place; NNAPI has
no variable operands, so the state is an input of the NNAPI operation and its new value the
operation's state output, which becomes an extra model output the delegate kernel copies back
into the variable tensor (MappingContext.state_output). TFLite still owns the state, so it
persists across invokes and ``reset_all_variables()`` clears it as on TFLite's CPU.

NNAPI's versions are float only (TFLite's cells are float32 too, or hybrid: int8 weights with
float activations, quantized on the fly; SVDF also has a full-integer variant): hybrid and
integer variants stay on TFLite. asymmetric_quantize_inputs only steers the hybrid kernel; TFLite's
float kernel ignores it, and so does this mapping.

NNAPI's fused activations are NONE/RELU/RELU1/RELU6. TFLite's TANH, common in RNNs (Keras
SimpleRNN's default), is expressible as a separate TANH where it does not feed the recurrence
NNAPI computes inside the operation: RNN (one step: its state *is* the activated output, so both
NNAPI outputs go through a TANH) and SVDF (the activation only touches the output). In a sequence
op it feeds every next step, so a TANH sequence is unrolled over its (static) time steps: the
input cut into steps (RESHAPE to 2-D, SPLIT), per step an NNAPI RNN with activation NONE from the
previous state then a TANH giving the new state, the steps' states put back together
(CONCATENATION, RESHAPE) as the output; the last state is the state output. That is TFLite's
float arithmetic (kernel_utils.cc RnnBatchStep: output = bias + W·x (+ W_aux·aux) + R·h summed
in full, then the activation applied element-wise, and the activated output copied into the
state), up to float rounding in the order of the sums. Unrolling costs two operations a step
per direction, so it stops at sequence_steps.MAX_UNROLLED_STEPS; longer sequences, and SIGN_BIT (no NNAPI
equivalent at all), stay on TFLite.
"""
from __future__ import annotations

from delegate.mapping.core import MappingContext, MappingError, mapper
from delegate.mapping.options import OptionsReader, bools, ints
from delegate.mapping.sequence_steps import join_steps, split_steps, time_steps
from delegate.mapping.shape import omitted
from delegate.tfl.graph import TfLiteNode
from delegate.tfl.schema import ActivationFunctionType, BuiltinOperator, TensorType, tensor_type_name
from hal.types import FusedActivationFunc, OperandType, OperationType

#: TFLite activations NNAPI lacks as a fused activation, applied as a separate operation after it.
_SEPARATE = {ActivationFunctionType.TANH: OperationType.TANH}



# ---- TFLite 2.14 builtin_op_data.h structs --------------------------------------------------------

def _read_rnn(a: int) -> dict:
    act, = ints(a, 1)  # TfLiteRNNParams: activation; bool asymmetric_quantize_inputs
    asym, = bools(a + 4, 1)
    return {"fused_activation_function": act, "asymmetric_quantize_inputs": asym}


def _read_sequence_rnn(a: int) -> dict:
    time_major, = bools(a, 1)  # TfLiteSequenceRNNParams: bool time_major; activation; bool asymmetric...
    act, = ints(a + 4, 1)
    asym, = bools(a + 8, 1)
    return {"time_major": time_major, "fused_activation_function": act, "asymmetric_quantize_inputs": asym}


def _read_bidirectional_rnn(a: int) -> dict:
    time_major, = bools(a, 1)  # TfLiteBidirectionalSequenceRNNParams: bool time_major; activation;
    act, = ints(a + 4, 1)      # bool merge_outputs; bool asymmetric_quantize_inputs
    merge, asym = bools(a + 8, 2)
    return {"time_major": time_major, "fused_activation_function": act, "merge_outputs": merge,
            "asymmetric_quantize_inputs": asym}


def _read_svdf(a: int) -> dict:
    rank, act = ints(a, 2)  # TfLiteSVDFParams: int rank; activation; bool asymmetric_quantize_inputs
    asym, = bools(a + 8, 1)
    return {"rank": rank, "fused_activation_function": act, "asymmetric_quantize_inputs": asym}


# ---- shared checks ------------------------------------------------------------------------------

def _float_only(ctx: MappingContext, node: TfLiteNode, what: str) -> None:
    """Every present input float32 (NNAPI's cells have no hybrid or integer variant)."""
    x = ctx.input_tensor(0)
    if x.type != TensorType.FLOAT32:
        raise MappingError(f"{what} with a {tensor_type_name(x.type)} input: NNAPI's {what} is float only")
    for k, t in enumerate(node.inputs):
        if t >= 0 and ctx.tensor_info(t).type != TensorType.FLOAT32:
            raise MappingError(f"input {k} ({ctx.tensor_info(t).name!r}) is not float32: hybrid {what} "
                               f"(quantized weights, float activations) has no NNAPI equivalent")


def _activation(ctx: MappingContext) -> tuple[int, OperationType | None]:
    """(NNAPI fused activation operand, the operation to apply after it or None)."""
    act = ctx.option("fused_activation_function", ActivationFunctionType.NONE)
    if act in _SEPARATE:
        return ctx.int32(FusedActivationFunc.NONE), _SEPARATE[act]
    if act == ActivationFunctionType.SIGN_BIT:
        raise MappingError(f"fused activation {act} (SIGN_BIT) has no NNAPI equivalent")
    return ctx.fused_activation(), None  # NONE, RELU, RELU1, RELU6 (else its MappingError)


def _state(ctx: MappingContext, k: int) -> tuple[int, int]:
    """(input operand, new-value operand) of the variable tensor at input ``k``."""
    t = ctx.node.inputs[k] if k < len(ctx.node.inputs) else -1
    if t < 0:
        raise MappingError(f"input {k} (the state) is missing")
    return ctx.tensor(t), ctx.state_output(t)


def _outputs(ctx: MappingContext, node: TfLiteNode, n: int) -> list[int]:
    if len(node.outputs) != n:
        raise MappingError(f"expected {n} output(s), got {len(node.outputs)}")
    return [ctx.tensor(t) for t in node.outputs]


def _with_activation(ctx: MappingContext, op: OperationType, inputs: list[int], outputs: list[int],
                     then: OperationType | None, activated: tuple[int, ...]) -> None:
    """Emit ``op``; with ``then`` (TANH), the outputs in ``activated`` are first written
    to temporaries that ``then`` carries to them."""
    if then is None:
        ctx.operation(op, inputs, outputs)
        return
    raw = {o: ctx.new_temporary(o) for o in activated}
    ctx.operation(op, inputs, [raw.get(o, o) for o in outputs])
    for o, tmp in raw.items():
        ctx.operation(then, [tmp], [o])


# ---- TANH sequences, unrolled over their time steps ---------------------------------------------

def _unrolls(ctx: MappingContext) -> bool:
    """Whether this sequence op is unrolled: TANH, which NNAPI's sequence operations cannot apply."""
    return ctx.option("fused_activation_function", ActivationFunctionType.NONE) == ActivationFunctionType.TANH


def _unroll_cell(ctx: MappingContext, steps: list[int], w: int, r: int, b: int, h_in: int, h_out: int,
                 backward: bool = False) -> list[int]:
    """h_t = TANH(RNN(x_t, h_{t-1}) with activation NONE) along the steps (from the last with
    ``backward``), from ``h_in``; the last state computed is written into ``h_out``. Returns every
    step's state (its output) in time order."""
    none = ctx.int32(FusedActivationFunc.NONE)
    order = range(len(steps) - 1, -1, -1) if backward else range(len(steps))
    states: list[int] = [-1] * len(steps)
    h = h_in
    for n, t in enumerate(order):
        raw_state, raw = ctx.new_temporary(h_out), ctx.new_temporary(h_out)  # NNAPI RNN's two (equal) outputs
        ctx.operation(OperationType.RNN, [steps[t], w, r, b, h, none], [raw_state, raw])
        h = h_out if n == len(steps) - 1 else ctx.new_temporary(h_out)
        ctx.operation(OperationType.TANH, [raw], [h])
        states[t] = h
    return states


def _unroll_unidirectional(ctx: MappingContext, node: TfLiteNode) -> None:
    time_major = bool(ctx.option("time_major", False))
    time_steps(ctx, time_major, "TANH sequence", "NNAPI's sequence operations have no TANH")
    x, w, r, b = (ctx.tensor(node.inputs[k]) for k in range(4))
    h_in, h_out = _state(ctx, 4)
    out, = _outputs(ctx, node, 1)
    join_steps(ctx, _unroll_cell(ctx, split_steps(ctx, x, time_major), w, r, b, h_in, h_out), out, time_major)


def _unroll_bidirectional(ctx: MappingContext, node: TfLiteNode, present: list[bool]) -> None:
    """No linking: both cells read input 0. Parallel (aux_input alone): the backward cell reads
    aux_input. Cross (aux_input and both aux weights): each cell reads input 0 and aux_input
    concatenated along the features, with its weights and aux weights concatenated alike."""
    time_major = bool(ctx.option("time_major", False))
    merge = bool(ctx.option("merge_outputs", False))
    time_steps(ctx, time_major, "TANH sequence", "NNAPI's sequence operations have no TANH")
    if present[10] != present[11]:
        raise MappingError("only one of the forward and backward aux weights is given")
    x = ctx.tensor(node.inputs[0])
    cells = []
    for first, state in ((1, 4), (5, 8)):  # forward, backward: weights, recurrent_weights, bias, hidden_state
        cells.append([ctx.tensor(node.inputs[first + k]) for k in range(3)] + list(_state(ctx, state)))
    fw_in = bw_in = x
    if present[9] and present[10]:  # cross linking
        aux = ctx.tensor(node.inputs[9])
        fw_in = _concat_last(ctx, [x, aux])
        bw_in = fw_in
        for cell, k in ((cells[0], 10), (cells[1], 11)):
            cell[0] = _concat_last(ctx, [cell[0], ctx.tensor(node.inputs[k])])
    elif present[9]:  # parallel linking (time-major: batch-major was refused before)
        bw_in = ctx.tensor(node.inputs[9])
    fw_steps = split_steps(ctx, fw_in, time_major)
    bw_steps = fw_steps if bw_in == fw_in else split_steps(ctx, bw_in, time_major)
    fw_states = _unroll_cell(ctx, fw_steps, *cells[0])
    bw_states = _unroll_cell(ctx, bw_steps, *cells[1], backward=True)
    outs = _outputs(ctx, node, 1 if merge else 2)
    if not merge:
        join_steps(ctx, fw_states, outs[0], time_major)
        join_steps(ctx, bw_states, outs[1], time_major)
        return
    y = ctx.builder.operands[outs[0]].dimensions
    halves = []
    for states in (fw_states, bw_states):
        units = ctx.builder.operands[states[0]].dimensions[1]
        half = ctx.new_temporary(outs[0], [*y[:2], units])
        join_steps(ctx, states, half, time_major)
        halves.append(half)
    ctx.operation(OperationType.CONCATENATION, [*halves, ctx.int32(2)], [outs[0]])


def _concat_last(ctx: MappingContext, parts: list[int]) -> int:
    """CONCATENATION of ``parts`` along their last dimension, into a new temporary."""
    dims = [ctx.builder.operands[p].dimensions for p in parts]
    joined = ctx.new_temporary(parts[0], [*dims[0][:-1], sum(d[-1] for d in dims)])
    ctx.operation(OperationType.CONCATENATION, [*parts, ctx.int32(len(dims[0]) - 1)], [joined])
    return joined


# ---- mappers ------------------------------------------------------------------------------------

@mapper(BuiltinOperator.RNN, options=OptionsReader("RNNOptions", _read_rnn))
def map_rnn(ctx: MappingContext, node: TfLiteNode) -> None:
    """TFLite: input, weights, recurrent_weights, bias, hidden_state (variable) -> output."""
    _float_only(ctx, node, "RNN")
    act, then = _activation(ctx)
    x, w, r, b = (ctx.tensor(node.inputs[k]) for k in range(4))
    h_in, h_out = _state(ctx, 4)
    out, = _outputs(ctx, node, 1)
    # NNAPI's outputs: the new state and the output, equal; TFLite's state is the activated output.
    _with_activation(ctx, OperationType.RNN, [x, w, r, b, h_in, act], [h_out, out], then, (h_out, out))


@mapper(BuiltinOperator.UNIDIRECTIONAL_SEQUENCE_RNN, options=OptionsReader("SequenceRNNOptions", _read_sequence_rnn))
def map_unidirectional_rnn(ctx: MappingContext, node: TfLiteNode) -> None:
    """TFLite: input, weights, recurrent_weights, bias, hidden_state (variable) -> output; NNAPI 1.3's
    optional final-state output carries the new state."""
    _float_only(ctx, node, "UNIDIRECTIONAL_SEQUENCE_RNN")
    if _unrolls(ctx):
        _unroll_unidirectional(ctx, node)
        return
    act, _ = _activation(ctx)  # not TANH here
    x, w, r, b = (ctx.tensor(node.inputs[k]) for k in range(4))
    h_in, h_out = _state(ctx, 4)
    out, = _outputs(ctx, node, 1)
    tm = ctx.int32(1 if ctx.option("time_major", False) else 0)
    ctx.operation(OperationType.UNIDIRECTIONAL_SEQUENCE_RNN, [x, w, r, b, h_in, act, tm], [out, h_out])


@mapper(BuiltinOperator.BIDIRECTIONAL_SEQUENCE_RNN,
        options=OptionsReader("BidirectionalSequenceRNNOptions", _read_bidirectional_rnn))
def map_bidirectional_rnn(ctx: MappingContext, node: TfLiteNode) -> None:
    """TFLite's inputs are NNAPI's 0-11 in the same order (hidden states 4 and 8 variable; aux
    input and weights 9-11 optional, linking the cells the same way); outputs fw_output and, without
    merge_outputs, bw_output; NNAPI's final-state outputs carry the new states.

    TFLite 2.14's float kernel departs from that in two places, which are not delegated (they
    would give other results than TFLite's CPU): batch-major with aux_input alone (parallel
    linking) its backward cell reads input 0, not aux_input; time-major with aux weights (cross
    linking) it steps through aux_input by input 0's size. With TANH both cells are unrolled
    (_unroll_bidirectional), under the same two exclusions.
    """
    _float_only(ctx, node, "BIDIRECTIONAL_SEQUENCE_RNN")
    merge = bool(ctx.option("merge_outputs", False))
    time_major = bool(ctx.option("time_major", False))
    present = [k < len(node.inputs) and node.inputs[k] >= 0 for k in range(12)]
    if present[9] and not present[10] and not time_major:
        raise MappingError("batch-major with aux_input alone (parallel linking): TFLite's kernel feeds its "
                           "backward cell input 0, NNAPI feeds it aux_input")
    if present[9] and present[10] and time_major and \
            ctx.input_tensor(9).shape[-1:] != ctx.input_tensor(0).shape[-1:]:
        raise MappingError("time-major with aux weights (cross linking) and an aux_input size other than "
                           "input 0's: TFLite's kernel steps through aux_input by input 0's size")
    if _unrolls(ctx):
        _unroll_bidirectional(ctx, node, present)
        return
    act, _ = _activation(ctx)  # not TANH here
    ins, new_states = [], []
    for k in range(12):
        if k in (4, 8):  # forward, backward hidden state
            h_in, h_out = _state(ctx, k)
            ins.append(h_in)
            new_states.append(h_out)
        elif present[k]:
            ins.append(ctx.tensor(node.inputs[k]))
        elif k >= 9:
            ins.append(omitted(ctx, OperandType.TENSOR_FLOAT32))
        else:
            raise MappingError(f"input {k} is missing")
    outs = _outputs(ctx, node, 1 if merge else 2)
    ins += [act, ctx.bool(time_major), ctx.bool(merge)]
    ctx.operation(OperationType.BIDIRECTIONAL_SEQUENCE_RNN, ins, [*outs, *new_states])


@mapper(BuiltinOperator.SVDF, options=OptionsReader("SVDFOptions", _read_svdf))
def map_svdf(ctx: MappingContext, node: TfLiteNode) -> None:
    """TFLite: input, weights_feature, weights_time, bias (optional), state (variable) -> output;
    the state holds each filter's last memory_size activations, oldest first, in both."""
    _float_only(ctx, node, "SVDF")
    act, then = _activation(ctx)
    x, wf, wt = (ctx.tensor(node.inputs[k]) for k in range(3))
    b = ctx.tensor(node.inputs[3]) if node.inputs[3] >= 0 else omitted(ctx, OperandType.TENSOR_FLOAT32)
    s_in, s_out = _state(ctx, 4)
    out, = _outputs(ctx, node, 1)
    rank = ctx.int32(ctx.option("rank", 1))
    _with_activation(ctx, OperationType.SVDF, [x, wf, wt, b, s_in, rank, act], [s_out, out], then, (out,))
