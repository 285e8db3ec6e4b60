"""UNIDIRECTIONAL_SEQUENCE_LSTM and BIDIRECTIONAL_SEQUENCE_LSTM on numpy: the float LSTM cell of
``lstm.py`` looped over time (batch-major sequences are transposed to time-major and back)."""
from __future__ import annotations

import numpy as np

from hal.backends.reference import BACKEND
from hal.backends.reference.lstm import CellWeights, check_runnable, lstm_sequence, plan
from hal.operations.lstm import INPUT, LstmParams
from hal.operations.sequence_lstm import BIDIRECTIONAL_SEQUENCE_LSTM, UNIDIRECTIONAL_SEQUENCE_LSTM
from hal.registry import OperationContext


def _time_major(x: np.ndarray, time_major: bool) -> np.ndarray:
    return x if time_major else np.swapaxes(x, 0, 1)


def _run_cell(p: LstmParams, k: int, inputs: list, xs: np.ndarray, aux: np.ndarray | None, reverse: bool = False):
    cell = p.cells[k]
    w = CellWeights.gather(cell, inputs)
    t = cell.tensors
    return lstm_sequence(cell, w, p, xs, inputs[t.output_state_in], inputs[t.cell_state_in], aux, reverse)


def execute_unidirectional(ctx: OperationContext, inputs: list) -> list:
    p: LstmParams = ctx.data
    check_runnable(ctx, p)
    out, h, c, _ = _run_cell(p, 0, inputs, _time_major(inputs[INPUT], p.time_major), None)
    outs = [np.ascontiguousarray(_time_major(out, p.time_major))]
    return outs + [h, c] if p.state_outputs else outs


def execute_bidirectional(ctx: OperationContext, inputs: list) -> list:
    p: LstmParams = ctx.data
    check_runnable(ctx, p)
    xs = _time_major(inputs[INPUT], p.time_major)
    aux = None if p.aux_input < 0 else _time_major(inputs[p.aux_input], p.time_major)
    fw_out, fw_h, fw_c, _ = _run_cell(p, 0, inputs, xs, aux)
    if p.parallel_linking:
        bw_out, bw_h, bw_c, _ = _run_cell(p, 1, inputs, aux, None, reverse=True)
    else:
        bw_out, bw_h, bw_c, _ = _run_cell(p, 1, inputs, xs, aux, reverse=True)
    outs = [np.concatenate([fw_out, bw_out], axis=-1)] if p.merge_outputs else [fw_out, bw_out]
    outs = [np.ascontiguousarray(_time_major(o, p.time_major)) for o in outs]
    return outs + [fw_h, fw_c, bw_h, bw_c] if p.state_outputs else outs


BACKEND.register(UNIDIRECTIONAL_SEQUENCE_LSTM, plan=plan, execute=execute_unidirectional)
BACKEND.register(BIDIRECTIONAL_SEQUENCE_LSTM, plan=plan, execute=execute_bidirectional)
