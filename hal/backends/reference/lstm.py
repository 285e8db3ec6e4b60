"""The float LSTM cell on numpy, and LSTM (one step) on it. The sequence LSTMs loop the same cell
(``sequence_lstm.py``).

One step, per NNAPI (and AOSP's LSTMStep): each gate's pre-activation is
``x · W_xᵀ (+ aux · W_auxᵀ) + h_prev · W_hᵀ (+ peephole ⊙ c)`` plus its bias — or, with layer
normalisation, the sum normalised over the cell units (mean 0, variance 1, epsilon 1e-8), times
the layer norm weights, plus the bias. Then
``i = σ(·)`` (``1 − f`` with CIFG), ``f = σ(·)``, ``c = clip(f ⊙ c_prev + i ⊙ act(g))``,
``o = σ(·)`` (its peephole reads the new c), ``h = o ⊙ act(c)`` and, with a projection,
``h = clip(h · W_projᵀ + b_proj)``. The arithmetic is float64, and h and c are rounded to float32
at the end of every step: that is the state AOSP's float32 kernel hands to the next step.
float16 operations reach this kernel widened to float32 (``hal.backends.via_float32``), as in
AOSP's LSTMEvalFloat16.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hal.backends.reference import BACKEND
from hal.operations.lstm import INPUT, LSTM, CellConfig, LstmActivation, LstmParams
from hal.registry import OperationContext

LAYER_NORM_EPSILON = 1e-8


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))  # no overflow for large |x|


def activation(x: np.ndarray, act: int) -> np.ndarray:
    """The LSTM activation (TFLite's codes; LSTM allows tanh and sigmoid besides the fused ones)."""
    if act == LstmActivation.NONE:
        return x
    if act == LstmActivation.RELU:
        return np.maximum(x, 0.0)
    if act == LstmActivation.RELU1:
        return np.clip(x, -1.0, 1.0)
    if act == LstmActivation.RELU6:
        return np.clip(x, 0.0, 6.0)
    if act == LstmActivation.TANH:
        return np.tanh(x)
    return _sigmoid(x)


def _layer_norm(x: np.ndarray, weights: np.ndarray) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    variance = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(variance + LAYER_NORM_EPSILON) * weights


@dataclass
class CellWeights:
    """One cell's tensors in float64; gates in NNAPI's order (input, forget, cell, output), None
    where the cell has no such tensor (input gate with CIFG, peepholes, layer norm, aux...)."""

    input_weights: list
    recurrent_weights: list
    aux_weights: list
    biases: list
    peepholes: list  # input, forget, output
    layer_norms: list
    projection_weights: np.ndarray | None
    projection_bias: np.ndarray | None
    #: the present gates' recurrent weights stacked [gates·num_units, output_size]: one product
    #: per step instead of one per gate (a step is a handful of small matrices: calls dominate)
    recurrent_stacked: np.ndarray | None = None
    recurrent_slices: tuple = ()  # each gate's columns of that product (None: no such gate)

    def __post_init__(self) -> None:
        present = [r for r in self.recurrent_weights if r is not None]
        self.recurrent_stacked = np.concatenate(present, axis=0).T.copy()
        slices, start = [], 0
        for r in self.recurrent_weights:
            slices.append(None if r is None else slice(start, start + r.shape[0]))
            start += 0 if r is None else r.shape[0]
        self.recurrent_slices = tuple(slices)

    @staticmethod
    def gather(cell: CellConfig, inputs: list) -> "CellWeights":
        def get(i: int, used: bool = True):
            return inputs[i].astype(np.float64) if used and i >= 0 and inputs[i] is not None else None

        t = cell.tensors
        return CellWeights(
            [get(i) for i in t.input_weights], [get(i) for i in t.recurrent_weights],
            [get(i, cell.use_aux) for i in t.aux_weights], [get(i) for i in t.biases],
            [get(i, cell.use_peephole) for i in t.peepholes], [get(i, cell.use_layer_norm) for i in t.layer_norms],
            get(t.projection_weights, cell.use_projection), get(t.projection_bias, cell.use_projection_bias))


def input_contributions(cell: CellConfig, w: CellWeights, xs: np.ndarray,
                        aux: np.ndarray | None = None) -> list:
    """``x · W_xᵀ (+ aux · W_auxᵀ)`` of every gate for inputs [..., input_size] (all time steps at
    once: they do not depend on the state). None for the input gate with CIFG."""
    xs = xs.astype(np.float64)
    aux = None if aux is None or not cell.use_aux else aux.astype(np.float64)
    out = []
    for g in range(4):
        if g == 0 and cell.use_cifg:
            out.append(None)
            continue
        acc = xs @ w.input_weights[g].T
        if aux is not None:
            acc = acc + aux @ w.aux_weights[g].T
        out.append(acc)
    return out


def lstm_step(cell: CellConfig, w: CellWeights, p: LstmParams, contributions: list, h_prev: np.ndarray,
              c_prev: np.ndarray, scratch: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """One step from the gates' input contributions [batch, num_units] and the previous state:
    (output [batch, output_size], new cell state [batch, num_units], scratch [batch, k·num_units]
    or None when not ``scratch``), all float32."""
    h_prev = h_prev.astype(np.float64)
    c_prev = c_prev.astype(np.float64)
    products = h_prev @ w.recurrent_stacked
    recurrent = [None if sl is None else products[:, sl] for sl in w.recurrent_slices]

    def pre_activation(g: int, c: np.ndarray, peephole: np.ndarray | None) -> np.ndarray:
        acc = contributions[g] + recurrent[g]
        if peephole is not None:
            acc = acc + peephole * c
        if cell.use_layer_norm:
            return _layer_norm(acc, w.layer_norms[g]) + w.biases[g]
        return acc + w.biases[g]

    peep_i, peep_f, peep_o = w.peepholes
    f = _sigmoid(pre_activation(1, c_prev, peep_f))
    i = 1.0 - f if cell.use_cifg else _sigmoid(pre_activation(0, c_prev, peep_i))
    g = activation(pre_activation(2, c_prev, None), p.activation)
    c = f * c_prev + i * g
    if p.cell_clip > 0:
        c = np.clip(c, -p.cell_clip, p.cell_clip)
    c = c.astype(np.float32).astype(np.float64)  # the state is float32
    o = _sigmoid(pre_activation(3, c, peep_o))
    h = o * activation(c, p.activation)
    if cell.use_projection:
        h = h @ w.projection_weights.T
        if w.projection_bias is not None:
            h = h + w.projection_bias
        if p.proj_clip > 0:
            h = np.clip(h, -p.proj_clip, p.proj_clip)
    if not scratch:
        return h.astype(np.float32), c.astype(np.float32), None
    # Scratch: the gate values, gate by gate (AOSP's layout; NNAPI leaves its content unspecified).
    gates = [f, g, o] if cell.use_cifg else [i, f, g, o]
    return h.astype(np.float32), c.astype(np.float32), np.stack(gates).astype(np.float32).reshape(c.shape[0], -1)


def lstm_sequence(cell: CellConfig, w: CellWeights, p: LstmParams, xs: np.ndarray, h: np.ndarray, c: np.ndarray,
                  aux: np.ndarray | None = None, reverse: bool = False):
    """The cell along a time-major sequence [max_time, batch, input_size], from its end when
    ``reverse``: (outputs [max_time, batch, output_size], final h, final c, last scratch)."""
    contributions = input_contributions(cell, w, xs, aux)
    out = np.empty((xs.shape[0], xs.shape[1], cell.output_size), np.float32)
    scratch = None
    h = h.astype(np.float32)
    c = c.astype(np.float32)
    steps = range(xs.shape[0] - 1, -1, -1) if reverse else range(xs.shape[0])
    for n, t in enumerate(steps):
        last = n == len(steps) - 1  # only the last step's scratch is returned
        h, c, scratch = lstm_step(cell, w, p, [None if a is None else a[t] for a in contributions], h, c,
                                  scratch=last)
        out[t] = h
    return out, h, c, scratch


def plan(ctx: OperationContext) -> LstmParams:
    return ctx.params


def check_runnable(ctx: OperationContext, p: LstmParams) -> None:
    """A cell compiled with a broken all-or-none rule among omittable model inputs runs only if
    the request omitted inputs (the operation is then prepared again from what it got)."""
    for cell in p.cells:
        if cell.deferred:
            raise ctx.fail(cell.deferred)


def execute_lstm(ctx: OperationContext, inputs: list) -> list:
    p: LstmParams = ctx.data
    check_runnable(ctx, p)
    cell = p.cells[0]
    w = CellWeights.gather(cell, inputs)
    t = cell.tensors
    h, c, scratch = lstm_step(cell, w, p, input_contributions(cell, w, inputs[INPUT]),
                              inputs[t.output_state_in], inputs[t.cell_state_in])
    return [scratch, h, c, h.copy()]


BACKEND.register(LSTM, plan=plan, execute=execute_lstm)
