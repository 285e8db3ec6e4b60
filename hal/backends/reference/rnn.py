"""RNN, UNIDIRECTIONAL_SEQUENCE_RNN and BIDIRECTIONAL_SEQUENCE_RNN on numpy: one cell, looped.

The cell sums in float64 and rounds to float32 once per step, before the activation (as the
float32 state a step hands to the next is what NNAPI's kernels keep). The input projection of
every step (input · weightsᵀ + bias, plus the auxiliary term) does not depend on the state, so it
is computed for the whole sequence at once; only ``state · recurrentᵀ`` runs step by step.
float16 operations run through the float32 kernel (widened, rounded once at the end)."""
from __future__ import annotations

import numpy as np

from hal import quant
from hal.backends.reference import BACKEND
from hal.operations.rnn import (
    AUX_INPUT,
    BIAS,
    BIDIRECTIONAL_SEQUENCE_RNN,
    BW_AUX_WEIGHTS,
    BW_BIAS,
    BW_HIDDEN_STATE,
    BW_RECURRENT_WEIGHTS,
    BW_WEIGHTS,
    FW_AUX_WEIGHTS,
    FW_BIAS,
    FW_HIDDEN_STATE,
    FW_RECURRENT_WEIGHTS,
    FW_WEIGHTS,
    HIDDEN_STATE,
    INPUT,
    RECURRENT_WEIGHTS,
    RNN,
    UNIDIRECTIONAL_SEQUENCE_RNN,
    WEIGHTS,
    Linking,
    RnnParams,
)
from hal.registry import OperationContext


def input_projection(xs: np.ndarray, weights: np.ndarray, bias: np.ndarray,
                     aux: np.ndarray | None = None, aux_weights: np.ndarray | None = None) -> np.ndarray:
    """``xs · weightsᵀ + bias (+ aux · aux_weightsᵀ)`` in float64 for inputs [..., input_size]."""
    with np.errstate(all="ignore"):  # non-finite inputs give non-finite outputs, as IEEE says
        acc = xs.astype(np.float64) @ weights.astype(np.float64).T + bias.astype(np.float64)
        if aux is not None:
            acc += aux.astype(np.float64) @ aux_weights.astype(np.float64).T
    return acc


def rnn_cell(projected: np.ndarray, state: np.ndarray, recurrent: np.ndarray, act: int) -> np.ndarray:
    """One step from its input projection [batch, units] and the previous state: the new state
    (which is also the step's output), float32."""
    with np.errstate(all="ignore"):
        acc = (projected + state.astype(np.float64) @ recurrent.astype(np.float64).T).astype(np.float32)
    return quant.apply_activation_float(acc, act)


def rnn_sequence(projected: np.ndarray, state: np.ndarray, recurrent: np.ndarray, act: int,
                 reverse: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """The cell along a time-major sequence of projections [max_time, batch, units], from the end
    when ``reverse``: (every step's output [max_time, batch, units], the final state)."""
    out = np.empty(projected.shape, np.float32)
    state = state.astype(np.float32)
    steps = range(projected.shape[0] - 1, -1, -1) if reverse else range(projected.shape[0])
    for t in steps:
        state = rnn_cell(projected[t], state, recurrent, act)
        out[t] = state
    return out, state


def _time_major(x: np.ndarray, time_major: bool) -> np.ndarray:
    return x if time_major else np.swapaxes(x, 0, 1)


def plan(ctx: OperationContext) -> RnnParams:
    return ctx.params


def execute_rnn(ctx: OperationContext, inputs: list) -> list:
    p: RnnParams = ctx.data
    projected = input_projection(inputs[INPUT], inputs[WEIGHTS], inputs[BIAS])
    state = rnn_cell(projected, inputs[HIDDEN_STATE], inputs[RECURRENT_WEIGHTS], p.act)
    return [state, state.copy()]


def execute_unidirectional(ctx: OperationContext, inputs: list) -> list:
    p: RnnParams = ctx.data
    xs = _time_major(inputs[INPUT], p.time_major)
    projected = input_projection(xs, inputs[WEIGHTS], inputs[BIAS])
    out, state = rnn_sequence(projected, inputs[HIDDEN_STATE], inputs[RECURRENT_WEIGHTS], p.act)
    outs = [np.ascontiguousarray(_time_major(out, p.time_major))]
    return outs + [state] if p.state_outputs else outs


def execute_bidirectional(ctx: OperationContext, inputs: list) -> list:
    p: RnnParams = ctx.data
    xs = _time_major(inputs[INPUT], p.time_major)
    aux = None if p.linking == Linking.NONE else _time_major(inputs[AUX_INPUT], p.time_major)
    cross = p.linking == Linking.CROSS
    fw_proj = input_projection(xs, inputs[FW_WEIGHTS], inputs[FW_BIAS],
                               aux if cross else None, inputs[FW_AUX_WEIGHTS] if cross else None)
    bw_xs = aux if p.linking == Linking.PARALLEL else xs
    bw_proj = input_projection(bw_xs, inputs[BW_WEIGHTS], inputs[BW_BIAS],
                               aux if cross else None, inputs[BW_AUX_WEIGHTS] if cross else None)
    fw_out, fw_state = rnn_sequence(fw_proj, inputs[FW_HIDDEN_STATE], inputs[FW_RECURRENT_WEIGHTS], p.act)
    bw_out, bw_state = rnn_sequence(bw_proj, inputs[BW_HIDDEN_STATE], inputs[BW_RECURRENT_WEIGHTS], p.act,
                                    reverse=True)
    if p.merge_outputs:
        outs = [np.concatenate([fw_out, bw_out], axis=-1)]
    else:
        outs = [fw_out, bw_out]
    outs = [np.ascontiguousarray(_time_major(o, p.time_major)) for o in outs]
    return outs + [fw_state, bw_state] if p.state_outputs else outs


BACKEND.register(RNN, plan=plan, execute=execute_rnn)
BACKEND.register(UNIDIRECTIONAL_SEQUENCE_RNN, plan=plan, execute=execute_unidirectional)
BACKEND.register(BIDIRECTIONAL_SEQUENCE_RNN, plan=plan, execute=execute_bidirectional)
