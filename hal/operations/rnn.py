"""RNN, UNIDIRECTIONAL_SEQUENCE_RNN and BIDIRECTIONAL_SEQUENCE_RNN: one basic RNN cell,
``state = output = activation(input · weightsᵀ + aux_input · aux_weightsᵀ + state · recurrentᵀ + bias)``,
run once (RNN) or along a sequence, forwards (UNIDIRECTIONAL) or both ways (BIDIRECTIONAL).
Types: TENSOR_FLOAT32 (RNN since NNAPI 1.0) and TENSOR_FLOAT16 (1.2); every tensor has input 0's type.

RNN (1.0): 0 input [batch, input_size], 1 weights [num_units, input_size], 2 recurrent_weights
[num_units, num_units], 3 bias [num_units], 4 hidden_state_in [batch, num_units], 5 the fused
activation (INT32). Outputs: 0 hidden_state_out and 1 output, both [batch, num_units] (equal).

UNIDIRECTIONAL_SEQUENCE_RNN (1.2): 0 input [max_time, batch, input_size] if time_major else
[batch, max_time, input_size], 1 weights, 2 recurrent_weights, 3 bias, 4 hidden_state (the
initial state), 5 activation (INT32), 6 time_major (INT32, 0 or 1). Outputs: 0 the output of every
step, [max_time, batch, num_units] or [batch, max_time, num_units]; 1 (optional, 1.3) the final state.

BIDIRECTIONAL_SEQUENCE_RNN (1.2): 0 input, 1-4 the forward cell (weights, recurrent_weights, bias,
hidden_state), 5-8 the backward cell, 9 aux_input, 10 fw_aux_weights, 11 bw_aux_weights (9-11
optional), 12 activation (INT32), 13 time_major (BOOL), 14 merge_outputs (BOOL). The auxiliary
tensors link the cells: none of them (no linking); aux_input alone (parallel linking, 1.3: the
backward cell reads aux_input instead of input); all three (cross linking: each cell also adds
aux_input times its aux weights). Outputs: fw_output, then bw_output unless merge_outputs (which
concatenates the two along the last dimension), then optionally (1.3) the final forward and
backward states. The backward cell walks the sequence from its end; its output at step t stays at t.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

from hal.operations.common import BOOL, F16, F32, INT32, fused_activation, param, sequence_output_shape, sequence_shape
from hal.registry import OperationContext, register
from hal.types import FeatureLevel, OperationType

RNN = OperationType.RNN
UNIDIRECTIONAL_SEQUENCE_RNN = OperationType.UNIDIRECTIONAL_SEQUENCE_RNN
BIDIRECTIONAL_SEQUENCE_RNN = OperationType.BIDIRECTIONAL_SEQUENCE_RNN
TYPES = (F32, F16)

# RNN
INPUT, WEIGHTS, RECURRENT_WEIGHTS, BIAS, HIDDEN_STATE_IN, ACTIVATION = 0, 1, 2, 3, 4, 5
HIDDEN_STATE_OUT, OUTPUT = 0, 1
# UNIDIRECTIONAL_SEQUENCE_RNN (0-5 as RNN, 4 the initial hidden state)
HIDDEN_STATE, TIME_MAJOR = 4, 6
SEQUENCE_OUTPUT, STATE_OUTPUT = 0, 1
# BIDIRECTIONAL_SEQUENCE_RNN
FW_WEIGHTS, FW_RECURRENT_WEIGHTS, FW_BIAS, FW_HIDDEN_STATE = 1, 2, 3, 4
BW_WEIGHTS, BW_RECURRENT_WEIGHTS, BW_BIAS, BW_HIDDEN_STATE = 5, 6, 7, 8
AUX_INPUT, FW_AUX_WEIGHTS, BW_AUX_WEIGHTS = 9, 10, 11
BIDI_ACTIVATION, BIDI_TIME_MAJOR, MERGE_OUTPUTS = 12, 13, 14
FW_OUTPUT, BW_OUTPUT = 0, 1


class Linking(enum.IntEnum):
    """How BIDIRECTIONAL_SEQUENCE_RNN's auxiliary tensors feed its cells."""

    NONE = 0
    PARALLEL = 1  # aux_input is the backward cell's input
    CROSS = 2  # aux_input times each cell's aux weights is added to both cells


@dataclass
class RnnParams:
    """Shapes (time-major: [max_time, batch, ...]) and options of the three operations."""

    act: int
    batch: int
    num_units: int
    max_time: int = 1
    time_major: bool = True
    bw_num_units: int = 0
    merge_outputs: bool = False
    linking: Linking = Linking.NONE
    state_outputs: bool = False  # the sequence ops' optional final-state outputs


def _dims_match(a: int, b: int) -> bool:
    """Equal, or one of them not known yet (0, while answering a support query)."""
    return a == b or a == 0 or b == 0


def _check_types(ctx: OperationContext, inputs, num_outputs: int) -> int:
    t = ctx.input_type(INPUT)
    for i in inputs:
        if ctx.has_input(i):
            ctx.expect_input_type(i, t)
    for o in range(num_outputs):
        ctx.expect_output_type(o, t)
    return t


def _check_cell(ctx: OperationContext, weights: int, recurrent: int, bias: int, state: int,
                input_size: int, batch: int, what: str = "") -> int:
    """Ranks and shapes of one cell's tensors: its num_units."""
    w, r, b, h = (ctx.input_shape(i) for i in (weights, recurrent, bias, state))
    ctx.check(len(w) == 2 and len(r) == 2 and len(b) == 1 and len(h) == 2,
              f"{what}weights, recurrent weights, bias and state must have ranks 2, 2, 1, 2; got "
              f"{len(w)}, {len(r)}, {len(b)}, {len(h)}")
    units = w[0]
    ctx.check(_dims_match(w[1], input_size), f"{what}weights {list(w)} do not match input size {input_size}")
    ctx.check(_dims_match(b[0], units), f"{what}bias {list(b)} does not match num_units {units}")
    ctx.check(_dims_match(r[0], units) and _dims_match(r[1], units),
              f"{what}recurrent weights {list(r)} must be [{units}, {units}]")
    ctx.check(_dims_match(h[0], batch) and _dims_match(h[1], units),
              f"{what}hidden state {list(h)} must be [{batch}, {units}]")
    return units


# ---- RNN ----------------------------------------------------------------------------------------

def validate_rnn(ctx: OperationContext) -> None:
    _check_types(ctx, range(1, 5), 2)
    ctx.expect_input_rank(INPUT, 2)
    for i, rank in ((WEIGHTS, 2), (RECURRENT_WEIGHTS, 2), (BIAS, 1), (HIDDEN_STATE_IN, 2)):
        ctx.expect_input_rank(i, rank)
    fused_activation(ctx, ACTIVATION)


def prepare_rnn(ctx: OperationContext) -> RnnParams:
    x = ctx.input_shape(INPUT)
    ctx.check(len(x) == 2, f"input must be rank 2 [batch, input_size], got {list(x)}")
    batch, input_size = x
    units = _check_cell(ctx, WEIGHTS, RECURRENT_WEIGHTS, BIAS, HIDDEN_STATE_IN, input_size, batch)
    ctx.set_output_shape(HIDDEN_STATE_OUT, (batch, units))
    ctx.set_output_shape(OUTPUT, (batch, units))
    return RnnParams(act=int(fused_activation(ctx, ACTIVATION)), batch=batch, num_units=units)


register(RNN, validate=validate_rnn, prepare=prepare_rnn, input_types=TYPES, num_inputs=(6,),
         num_outputs=(2,), min_feature_level=FeatureLevel.FL1, type_feature_levels={F16: FeatureLevel.FL3})


# ---- sequences ----------------------------------------------------------------------------------

def validate_unidirectional(ctx: OperationContext) -> None:
    _check_types(ctx, range(1, 5), ctx.num_outputs)
    ctx.expect_input_rank(INPUT, 3)
    for i, rank in ((WEIGHTS, 2), (RECURRENT_WEIGHTS, 2), (BIAS, 1), (HIDDEN_STATE, 2)):
        ctx.expect_input_rank(i, rank)
    fused_activation(ctx, ACTIVATION)
    tm = param(ctx, TIME_MAJOR, INT32)
    ctx.check(tm in (None, 0, 1), f"time_major must be 0 or 1, got {tm}")


def prepare_unidirectional(ctx: OperationContext) -> RnnParams:
    time_major = ctx.scalar(TIME_MAJOR, INT32)
    ctx.check(time_major in (0, 1), f"time_major must be 0 or 1, got {time_major}")
    max_time, batch, input_size = sequence_shape(ctx, INPUT, bool(time_major))
    units = _check_cell(ctx, WEIGHTS, RECURRENT_WEIGHTS, BIAS, HIDDEN_STATE, input_size, batch)
    ctx.set_output_shape(SEQUENCE_OUTPUT, sequence_output_shape(max_time, batch, units, bool(time_major)))
    if ctx.num_outputs == 2:
        ctx.set_output_shape(STATE_OUTPUT, (batch, units))
    return RnnParams(act=int(fused_activation(ctx, ACTIVATION)), batch=batch, num_units=units,
                     max_time=max_time, time_major=bool(time_major), state_outputs=ctx.num_outputs == 2)


register(UNIDIRECTIONAL_SEQUENCE_RNN, validate=validate_unidirectional, prepare=prepare_unidirectional,
         input_types=TYPES, num_inputs=(7,), num_outputs=(1, 2), min_feature_level=FeatureLevel.FL3)


def _known(ctx: OperationContext, i: int) -> bool:
    """An optional tensor whose shape is declared (a support query may see [0]: not known yet)."""
    return ctx.has_input(i) and ctx.input(i).fully_specified


def linking_mode(ctx: OperationContext) -> Linking:
    aux, fw, bw = (ctx.has_input(i) for i in (AUX_INPUT, FW_AUX_WEIGHTS, BW_AUX_WEIGHTS))
    if not (aux or fw or bw):
        return Linking.NONE
    if aux and not fw and not bw:
        return Linking.PARALLEL
    if aux and fw and bw:
        return Linking.CROSS
    raise ctx.fail("aux_input, fw_aux_weights and bw_aux_weights must be all present, all omitted, "
                   "or aux_input alone")


def _expected_outputs(merge: bool, state: bool) -> int:
    return (1 if merge else 2) + (2 if state else 0)


def validate_bidirectional(ctx: OperationContext) -> None:
    _check_types(ctx, range(1, 12), ctx.num_outputs)
    ctx.expect_input_rank(INPUT, 3)
    for i, rank in ((FW_WEIGHTS, 2), (FW_RECURRENT_WEIGHTS, 2), (FW_BIAS, 1), (FW_HIDDEN_STATE, 2),
                    (BW_WEIGHTS, 2), (BW_RECURRENT_WEIGHTS, 2), (BW_BIAS, 1), (BW_HIDDEN_STATE, 2)):
        ctx.expect_input_rank(i, rank)
    for i, rank in ((AUX_INPUT, 3), (FW_AUX_WEIGHTS, 2), (BW_AUX_WEIGHTS, 2)):
        if _known(ctx, i):
            ctx.expect_input_rank(i, rank)
    linking_mode(ctx)
    fused_activation(ctx, BIDI_ACTIVATION)
    param(ctx, BIDI_TIME_MAJOR, BOOL)
    merge = param(ctx, MERGE_OUTPUTS, BOOL)
    if merge is not None:
        ctx.check(ctx.num_outputs in (_expected_outputs(merge, False), _expected_outputs(merge, True)),
                  f"with merge_outputs {bool(merge)} the operation has {_expected_outputs(merge, False)} or "
                  f"{_expected_outputs(merge, True)} outputs, got {ctx.num_outputs}")


def prepare_bidirectional(ctx: OperationContext) -> RnnParams:
    time_major = bool(ctx.scalar(BIDI_TIME_MAJOR, BOOL))
    merge = bool(ctx.scalar(MERGE_OUTPUTS, BOOL))
    state = ctx.num_outputs == _expected_outputs(merge, True)
    ctx.check(state or ctx.num_outputs == _expected_outputs(merge, False),
              f"with merge_outputs {merge} the operation has {_expected_outputs(merge, False)} or "
              f"{_expected_outputs(merge, True)} outputs, got {ctx.num_outputs}")
    linking = linking_mode(ctx)
    max_time, batch, input_size = sequence_shape(ctx, INPUT, time_major)
    fw_units = _check_cell(ctx, FW_WEIGHTS, FW_RECURRENT_WEIGHTS, FW_BIAS, FW_HIDDEN_STATE, input_size, batch,
                           "forward ")
    bw_input_size = input_size
    if linking != Linking.NONE and _known(ctx, AUX_INPUT):
        aux_time, aux_batch, aux_size = sequence_shape(ctx, AUX_INPUT, time_major)
        ctx.check(_dims_match(aux_time, max_time) and _dims_match(aux_batch, batch),
                  f"aux_input {list(ctx.input_shape(AUX_INPUT))} must have input 0's time and batch sizes")
        if linking == Linking.PARALLEL:
            bw_input_size = aux_size
        else:
            for i, units in ((FW_AUX_WEIGHTS, fw_units), (BW_AUX_WEIGHTS, 0)):
                if _known(ctx, i):
                    s = ctx.input_shape(i)
                    ctx.check(len(s) == 2 and _dims_match(s[0], units) and _dims_match(s[1], aux_size),
                              f"input {i} (aux weights) {list(s)} must be [num_units, {aux_size}]")
    elif linking == Linking.PARALLEL:
        bw_input_size = 0  # not known yet
    bw_units = _check_cell(ctx, BW_WEIGHTS, BW_RECURRENT_WEIGHTS, BW_BIAS, BW_HIDDEN_STATE, bw_input_size, batch,
                           "backward ")
    if linking == Linking.CROSS and _known(ctx, BW_AUX_WEIGHTS):
        ctx.check(_dims_match(ctx.input_shape(BW_AUX_WEIGHTS)[0], bw_units),
                  f"bw_aux_weights {list(ctx.input_shape(BW_AUX_WEIGHTS))} must have {bw_units} rows")
    if merge:
        ctx.set_output_shape(FW_OUTPUT, sequence_output_shape(max_time, batch, fw_units + bw_units, time_major))
    else:
        ctx.set_output_shape(FW_OUTPUT, sequence_output_shape(max_time, batch, fw_units, time_major))
        ctx.set_output_shape(BW_OUTPUT, sequence_output_shape(max_time, batch, bw_units, time_major))
    if state:
        first = 1 if merge else 2
        ctx.set_output_shape(first, (batch, fw_units))
        ctx.set_output_shape(first + 1, (batch, bw_units))
    return RnnParams(act=int(fused_activation(ctx, BIDI_ACTIVATION)), batch=batch, num_units=fw_units,
                     max_time=max_time, time_major=time_major, bw_num_units=bw_units, merge_outputs=merge,
                     linking=linking, state_outputs=state)


register(BIDIRECTIONAL_SEQUENCE_RNN, validate=validate_bidirectional, prepare=prepare_bidirectional,
         input_types=TYPES, num_inputs=(15,), num_outputs=(1, 2, 3, 4),
         optional_inputs=(AUX_INPUT, FW_AUX_WEIGHTS, BW_AUX_WEIGHTS), min_feature_level=FeatureLevel.FL3)
