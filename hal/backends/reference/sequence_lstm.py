"""UNIDIRECTIONAL_SEQUENCE_LSTM and BIDIRECTIONAL_SEQUENCE_LSTM on numpy: the float LSTM cell of
``lstm.py`` looped over time (batch-major sequences are transposed to time-major and back).

``unidirectional`` and ``bidirectional`` wire cells to the operation's inputs and outputs (time
order, auxiliary linking, merged outputs, state outputs) around any ``RunCell``: a faster backend
passes its own whole-sequence cell and keeps this wiring (hal.backends.numba_kernels.lstm)."""
from __future__ import annotations

from typing import Callable

import numpy as np

from hal.backends.reference import BACKEND
from hal.backends.reference.lstm import CellWeights, check_runnable, lstm_sequence, plan
from hal.operations.lstm import INPUT, LstmParams
from hal.operations.sequence_lstm import BIDIRECTIONAL_SEQUENCE_LSTM, UNIDIRECTIONAL_SEQUENCE_LSTM
from hal.registry import OperationContext

#: (cell index, inputs, time-major sequence, time-major aux input or None, reverse) ->
#: (outputs [max_time, batch, output_size] float32, final h, final c)
RunCell = Callable[[int, list, np.ndarray, "np.ndarray | None", bool], tuple]


def _time_major(x: np.ndarray, time_major: bool) -> np.ndarray:
    return x if time_major else np.swapaxes(x, 0, 1)


def unidirectional(p: LstmParams, inputs: list, run_cell: RunCell) -> list:
    out, h, c = run_cell(0, inputs, _time_major(inputs[INPUT], p.time_major), None, False)
    outs = [np.ascontiguousarray(_time_major(out, p.time_major))]
    return outs + [h, c] if p.state_outputs else outs


def bidirectional(p: LstmParams, inputs: list, run_cell: RunCell) -> list:
    xs = _time_major(inputs[INPUT], p.time_major)
    aux = None if p.aux_input < 0 else _time_major(inputs[p.aux_input], p.time_major)
    fw_out, fw_h, fw_c = run_cell(0, inputs, xs, aux, False)
    if p.parallel_linking:
        bw_out, bw_h, bw_c = run_cell(1, inputs, aux, None, True)
    else:
        bw_out, bw_h, bw_c = run_cell(1, inputs, xs, aux, True)
    outs = [np.concatenate([fw_out, bw_out], axis=-1)] if p.merge_outputs else [fw_out, bw_out]
    outs = [np.ascontiguousarray(_time_major(o, p.time_major)) for o in outs]
    return outs + [fw_h, fw_c, bw_h, bw_c] if p.state_outputs else outs


def _numpy_cell(p: LstmParams):
    def run(k: int, inputs: list, xs: np.ndarray, aux: np.ndarray | None, reverse: bool) -> tuple:
        cell = p.cells[k]
        w = CellWeights.gather(cell, inputs)
        t = cell.tensors
        out, h, c, _ = lstm_sequence(cell, w, p, xs, inputs[t.output_state_in], inputs[t.cell_state_in], aux,
                                     reverse)
        return out, h, c
    return run


def execute_unidirectional(ctx: OperationContext, inputs: list) -> list:
    p: LstmParams = ctx.data
    check_runnable(ctx, p)
    return unidirectional(p, inputs, _numpy_cell(p))


def execute_bidirectional(ctx: OperationContext, inputs: list) -> list:
    p: LstmParams = ctx.data
    check_runnable(ctx, p)
    return bidirectional(p, inputs, _numpy_cell(p))


BACKEND.register(UNIDIRECTIONAL_SEQUENCE_LSTM, plan=plan, execute=execute_unidirectional)
BACKEND.register(BIDIRECTIONAL_SEQUENCE_LSTM, plan=plan, execute=execute_bidirectional)
