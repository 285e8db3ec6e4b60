"""UNIDIRECTIONAL_SEQUENCE_LSTM and BIDIRECTIONAL_SEQUENCE_LSTM: LSTM's cell (see ``lstm.py``)
along a sequence, forwards, or both ways. Types: TENSOR_FLOAT32 and TENSOR_FLOAT16 (NNAPI 1.2).

UNIDIRECTIONAL_SEQUENCE_LSTM (28 inputs): 0 input [max_time, batch, input_size] if time_major else
[batch, max_time, input_size]; 1-19 the cell as LSTM's inputs 1-19 (18, 19: the initial states);
20 activation, 21 cell_clip, 22 proj_clip, 23 time_major (BOOL); 24-27 the layer norm weights
(optional). Outputs: 0 output [max_time, batch, output_size] (batch-major when not time_major);
optionally (NNAPI 1.3) 1 output_state_out [batch, output_size] and 2 cell_state_out
[batch, num_units], the final states.

BIDIRECTIONAL_SEQUENCE_LSTM (61 inputs): 0 input; 1-17 the forward cell (LSTM's 1-17); 18-34 the
backward cell (same order); 35, 36 the forward initial output and cell states; 37, 38 the backward
ones; 39 aux_input (optional, input's time and batch sizes); 40-43 fw_aux_input_to_{input,forget,
cell,output}_weights and 44-47 the backward ones (optional); 48 activation, 49 cell_clip,
50 proj_clip, 51 merge_outputs (BOOL), 52 time_major (BOOL); 53-56 forward and 57-60 backward
layer norm weights (optional). The auxiliary tensors link the cells: none of them; aux_input
alone (parallel linking: the backward cell reads aux_input instead of input); aux_input and the
aux weights (cross linking: each cell adds aux_input times its aux weights to every gate).
Outputs: fw_output [max_time, batch, fw_output_size] and bw_output (or, with merge_outputs, one
output with both concatenated on the last dimension); optionally (1.3) the final forward output
and cell states, then the backward ones. The backward cell walks the sequence from its end; its
output at step t stays at t.
"""
from __future__ import annotations

from hal.operations.common import BOOL, F16, F32, param, sequence_output_shape, sequence_shape
from hal.operations.lstm import (
    INPUT,
    CellTensors,
    LstmParams,
    check_cell,
    check_cell_ranks,
    check_float_types,
    dims_match,
    maybe_omitted,
    present,
    read_activation,
    read_clip,
)
from hal.registry import OperationContext, register
from hal.types import FeatureLevel, OperationType

UNIDIRECTIONAL_SEQUENCE_LSTM = OperationType.UNIDIRECTIONAL_SEQUENCE_LSTM
BIDIRECTIONAL_SEQUENCE_LSTM = OperationType.BIDIRECTIONAL_SEQUENCE_LSTM
TYPES = (F32, F16)

# UNIDIRECTIONAL_SEQUENCE_LSTM
ACTIVATION, CELL_CLIP, PROJ_CLIP, TIME_MAJOR = 20, 21, 22, 23
UNI_CELL = CellTensors(*range(1, 20), *range(24, 28))
OUTPUT, OUTPUT_STATE_OUT, CELL_STATE_OUT = 0, 1, 2

# BIDIRECTIONAL_SEQUENCE_LSTM
FW_CELL = CellTensors(*range(1, 18), 35, 36, *range(53, 57), *range(40, 44))
BW_CELL = CellTensors(*range(18, 35), 37, 38, *range(57, 61), *range(44, 48))
AUX_INPUT = 39
BIDI_ACTIVATION, BIDI_CELL_CLIP, BIDI_PROJ_CLIP, MERGE_OUTPUTS, BIDI_TIME_MAJOR = 48, 49, 50, 51, 52
FW_OUTPUT, BW_OUTPUT = 0, 1


# ---- UNIDIRECTIONAL_SEQUENCE_LSTM -----------------------------------------------------------------

def validate_unidirectional(ctx: OperationContext) -> None:
    check_float_types(ctx, list(range(0, 20)) + list(range(24, 28)), (CELL_CLIP, PROJ_CLIP), ctx.num_outputs)
    ctx.expect_input_rank(INPUT, 3)
    check_cell_ranks(ctx, UNI_CELL)
    read_activation(ctx, ACTIVATION)
    read_clip(ctx, CELL_CLIP, "cell_clip")
    read_clip(ctx, PROJ_CLIP, "proj_clip")
    param(ctx, TIME_MAJOR, BOOL)


def prepare_unidirectional(ctx: OperationContext) -> LstmParams:
    time_major = bool(param(ctx, TIME_MAJOR, BOOL))
    max_time, batch, input_size = sequence_shape(ctx, INPUT, time_major)
    cell = check_cell(ctx, UNI_CELL, batch, input_size)
    ctx.set_output_shape(OUTPUT, sequence_output_shape(max_time, batch, cell.output_size, time_major))
    state = ctx.num_outputs == 3
    if state:
        ctx.set_output_shape(OUTPUT_STATE_OUT, (batch, cell.output_size))
        ctx.set_output_shape(CELL_STATE_OUT, (batch, cell.num_units))
    return LstmParams((cell,), read_activation(ctx, ACTIVATION), read_clip(ctx, CELL_CLIP, "cell_clip"),
                      read_clip(ctx, PROJ_CLIP, "proj_clip"), batch, max_time, time_major, state_outputs=state)


_UNI_OPTIONAL = (1, 5, 9, 10, 11, 12, 16, 17, 24, 25, 26, 27)

register(UNIDIRECTIONAL_SEQUENCE_LSTM, validate=validate_unidirectional, prepare=prepare_unidirectional,
         input_types=TYPES, num_inputs=(28,), num_outputs=(1, 3), optional_inputs=_UNI_OPTIONAL,
         min_feature_level=FeatureLevel.FL3)


# ---- BIDIRECTIONAL_SEQUENCE_LSTM ------------------------------------------------------------------

def _expected_outputs(merge: bool, state: bool) -> int:
    return (1 if merge else 2) + (4 if state else 0)


def validate_bidirectional(ctx: OperationContext) -> None:
    check_float_types(ctx, list(range(0, 48)) + list(range(53, 61)), (BIDI_CELL_CLIP, BIDI_PROJ_CLIP),
                      ctx.num_outputs)
    ctx.expect_input_rank(INPUT, 3)
    if present(ctx, AUX_INPUT):
        ctx.expect_input_rank(AUX_INPUT, 3)
    check_cell_ranks(ctx, FW_CELL)
    check_cell_ranks(ctx, BW_CELL)
    read_activation(ctx, BIDI_ACTIVATION)
    read_clip(ctx, BIDI_CELL_CLIP, "cell_clip")
    read_clip(ctx, BIDI_PROJ_CLIP, "proj_clip")
    param(ctx, BIDI_TIME_MAJOR, BOOL)
    merge = param(ctx, MERGE_OUTPUTS, BOOL)
    if merge is not None:
        counts = (_expected_outputs(bool(merge), False), _expected_outputs(bool(merge), True))
        ctx.check(ctx.num_outputs in counts, f"with merge_outputs {bool(merge)} the operation has {counts[0]} or "
                                             f"{counts[1]} outputs, got {ctx.num_outputs}")


def prepare_bidirectional(ctx: OperationContext) -> LstmParams:
    time_major = bool(param(ctx, BIDI_TIME_MAJOR, BOOL))
    merge = bool(param(ctx, MERGE_OUTPUTS, BOOL))
    state = ctx.num_outputs == _expected_outputs(merge, True)
    ctx.check(state or ctx.num_outputs == _expected_outputs(merge, False),
              f"with merge_outputs {merge} the operation has {_expected_outputs(merge, False)} or "
              f"{_expected_outputs(merge, True)} outputs, got {ctx.num_outputs}")
    max_time, batch, input_size = sequence_shape(ctx, INPUT, time_major)

    has_aux_input = present(ctx, AUX_INPUT)
    has_aux_weights = present(ctx, FW_CELL.aux_input_to_forget) or present(ctx, BW_CELL.aux_input_to_forget)
    aux_size = 0
    if has_aux_input:
        aux_time, aux_batch, aux_size = sequence_shape(ctx, AUX_INPUT, time_major)
        ctx.check(dims_match(aux_time, max_time) and dims_match(aux_batch, batch),
                  f"aux_input {list(ctx.input_shape(AUX_INPUT))} must have input 0's time and batch sizes")
    elif has_aux_weights:
        members = (AUX_INPUT, *FW_CELL.aux_weights, *BW_CELL.aux_weights)
        ctx.check(any(maybe_omitted(ctx, i) for i in members), "aux weights need aux_input")
        has_aux_weights = False  # an execution must omit them (checked then)
    parallel = has_aux_input and not has_aux_weights
    fw = check_cell(ctx, FW_CELL, batch, input_size, aux_size if has_aux_weights else 0, "forward cell: ")
    bw = check_cell(ctx, BW_CELL, batch, aux_size if parallel else input_size,
                    aux_size if has_aux_weights else 0, "backward cell: ")
    ctx.check(fw.use_aux == bw.use_aux or fw.deferred or bw.deferred,
              "fw and bw aux weights must be both given or both omitted")

    if merge:
        merged = fw.output_size + bw.output_size
        ctx.set_output_shape(FW_OUTPUT, sequence_output_shape(max_time, batch, merged, time_major))
    else:
        ctx.set_output_shape(FW_OUTPUT, sequence_output_shape(max_time, batch, fw.output_size, time_major))
        ctx.set_output_shape(BW_OUTPUT, sequence_output_shape(max_time, batch, bw.output_size, time_major))
    if state:
        first = 1 if merge else 2
        for k, shape in enumerate(((batch, fw.output_size), (batch, fw.num_units),
                                   (batch, bw.output_size), (batch, bw.num_units))):
            ctx.set_output_shape(first + k, shape)
    return LstmParams((fw, bw), read_activation(ctx, BIDI_ACTIVATION), read_clip(ctx, BIDI_CELL_CLIP, "cell_clip"),
                      read_clip(ctx, BIDI_PROJ_CLIP, "proj_clip"), batch, max_time, time_major, merge, state,
                      AUX_INPUT if has_aux_input else -1, parallel)


_BIDI_OPTIONAL = (1, 5, 9, 10, 11, 12, 16, 17, 18, 22, 26, 27, 28, 29, 33, 34, *range(39, 48), *range(53, 61))

register(BIDIRECTIONAL_SEQUENCE_LSTM, validate=validate_bidirectional, prepare=prepare_bidirectional,
         input_types=TYPES, num_inputs=(61,), num_outputs=(1, 2, 5, 6), optional_inputs=_BIDI_OPTIONAL,
         min_feature_level=FeatureLevel.FL3)
