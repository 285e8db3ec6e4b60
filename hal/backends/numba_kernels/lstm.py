"""Float UNIDIRECTIONAL_SEQUENCE_LSTM and BIDIRECTIONAL_SEQUENCE_LSTM: each cell's whole sequence
in one compiled loop, instead of the reference backend's numpy calls per gate and time step.

The arithmetic is the reference cell's (hal/backends/reference/lstm.py), in the same order where
it matters: float64 throughout, per step the input, auxiliary and recurrent products (the float32
weights widened exactly as they are read), peepholes, layer normalisation, biases, the gates
(sigmoid as 0.5·(1 + tanh(x/2))), the cell clip, the cell state rounded to float32, the output
gate on the new state, the projection and its clip, and the output state rounded to float32
before the next step reads it. Results differ from the reference backend's only by float64
summation order, far inside NNAPI's float32 tolerance (tests/backends compare). Sequences are read
and written in the operation's layout (a batch-major one through a time-major view): no copies.
The operations' wiring (time order, auxiliary linking, merged and state outputs) is the
reference backend's (``reference.sequence_lstm.unidirectional`` / ``bidirectional``).
Weights given as constants are packed once at plan time; weights that are model inputs each run.
"""
from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np

from hal.backends.numba_kernels import BACKEND
from hal.backends.numba_kernels.fixedpoint import ro, rw
from hal.backends.numba_kernels.lazy import njit
from hal.backends.reference.lstm import LAYER_NORM_EPSILON, check_runnable
from hal.backends.reference.sequence_lstm import bidirectional, unidirectional
from hal.operations.common import F16, F32
from hal.operations.lstm import CellConfig, LstmActivation, LstmParams
from hal.operations.sequence_lstm import BIDIRECTIONAL_SEQUENCE_LSTM, UNIDIRECTIONAL_SEQUENCE_LSTM
from hal.registry import OperationContext


@dataclass
class PackedCell:
    """One cell's weights, gates stacked in NNAPI's order (input, forget, cell, output), each matrix
    laid out [rows read, 4·units] so a step adds one row per input element; an absent gate,
    peephole or layer norm is zeros and its flag off. Matrices stay float32 (the model's values:
    widening them is exact, the kernel does it as it reads, and half the bytes stay in cache)."""

    input_weights: np.ndarray      # [input_size, 4·units] float32
    aux_weights: np.ndarray        # [aux_size, 4·units] float32 ([0, 4·units] without an aux input)
    recurrent: np.ndarray          # [output_size, 4·units] float32
    bias: np.ndarray               # [4, units]
    peephole: np.ndarray           # [3, units]: input, forget, output
    layer_norm: np.ndarray         # [4, units]
    projection: np.ndarray         # [units, output_size] float32 ([units, 0] without a projection)
    projection_bias: np.ndarray    # [output_size]


@dataclass
class LstmData:
    params: LstmParams
    cells: tuple  # PackedCell per cell, or None where a weight is a model input (packed each run)


def _pack(cell: CellConfig, get) -> PackedCell:
    """``get(i, used)``: operand i as float64, or None when absent or unused."""
    t, u = cell.tensors, cell.num_units

    def stacked(indices, cols: int) -> np.ndarray:
        out = np.zeros((cols, 4 * u), np.float32)
        for g, i in enumerate(indices):
            w = get(i, not (g == 0 and cell.use_cifg))
            if w is not None:
                out[:, g * u:(g + 1) * u] = w.T
        return out

    def rows(indices, used: bool, n: int) -> np.ndarray:
        out = np.zeros((n, u))
        for g, i in enumerate(indices):
            v = get(i, used and not (g == 0 and cell.use_cifg))
            if v is not None:
                out[g] = v
        return out

    aux_size = get(t.aux_input_to_forget, True).shape[1] if cell.use_aux else 0
    proj = get(t.projection_weights, cell.use_projection)
    proj_bias = get(t.projection_bias, cell.use_projection_bias)
    return PackedCell(stacked(t.input_weights, cell.input_size),
                      stacked(t.aux_weights, aux_size) if cell.use_aux else np.zeros((0, 4 * u), np.float32),
                      stacked(t.recurrent_weights, cell.output_size), rows(t.biases, True, 4),
                      rows(t.peepholes, cell.use_peephole, 3),
                      rows(t.layer_norms, cell.use_layer_norm, 4),
                      np.zeros((u, 0), np.float32) if proj is None else np.ascontiguousarray(proj.T, np.float32),
                      np.zeros(cell.output_size) if proj_bias is None else np.ascontiguousarray(proj_bias))


def _getter(values):
    def get(i: int, used: bool = True):
        v = values(i) if used and i >= 0 else None
        return None if v is None else np.asarray(v, np.float64)
    return get


def _constant_getter(ctx: OperationContext):
    def value(i: int):
        if not ctx.has_input(i):
            return None
        v = ctx.input(i).value
        if v is None:
            raise LookupError(i)  # a model input: packed at execution
        return v
    return _getter(value)


def plan(ctx: OperationContext) -> LstmData:
    p: LstmParams = ctx.params
    cells = []
    for cell in p.cells:
        try:
            cells.append(None if cell.deferred else _pack(cell, _constant_getter(ctx)))
        except LookupError:
            cells.append(None)
    return LstmData(p, tuple(cells))


F64, I64 = numba.float64, numba.int64
SIGMOID, TANH = int(LstmActivation.SIGMOID), int(LstmActivation.TANH)
#: Sequences and outputs may be strided views (a batch-major tensor read or written time-major).
_SEQ_IN, _SEQ_OUT = numba.types.Array(numba.float32, 3, "A", readonly=True), numba.types.Array(numba.float32, 3, "A")
_SIG = numba.void(_SEQ_IN, _SEQ_IN, ro(np.float32, 2), ro(np.float32, 2), ro(np.float32, 2), ro(np.float64, 2),
                  ro(np.float64, 2), ro(np.float64, 2), ro(np.float32, 2), ro(np.float64, 1), I64, I64, I64, I64,
                  I64, I64, F64, F64, ro(np.float32, 2), ro(np.float32, 2), _SEQ_OUT, rw(np.float32, 2),
                  rw(np.float32, 2))


_LOG2E = 1.4426950408889634
_LN2_HI, _LN2_LO = 6.93147180369123816490e-01, 1.90821492927058770002e-10


@numba.njit(inline="always", fastmath=True, error_model="numpy")
def _exp_parts(x):
    """exp(x) as e^r (the polynomial) and the int64 bits of the float64 2^n it is to be multiplied
    by: Cody-Waite reduction to |r| <= ln2/2, degree-11 Taylor polynomial, 2^n from the exponent
    bits; x clamped to +-700."""
    x = min(max(x, -700.0), 700.0)
    m = np.floor(x * _LOG2E + 0.5)
    r = x - m * _LN2_HI - m * _LN2_LO
    poly = 1.0 + r * (1.0 + r * (1 / 2 + r * (1 / 6 + r * (1 / 24 + r * (1 / 120 + r * (
        1 / 720 + r * (1 / 5040 + r * (1 / 40320 + r * (1 / 362880 + r * (1 / 3628800 + r / 39916800))))))))))
    return poly, (np.int64(m) + 1023) << 52


@numba.njit(inline="always", fastmath=True, error_model="numpy")
def _exp_into(src, scale, dst, lo, hi, bits):
    """dst[lo:hi] = exp(scale · src[lo:hi]) within a few float64 ulps (``_exp_parts``): a loop LLVM
    vectorises, where libm's exp and tanh are a call per element."""
    for k in range(lo, hi):
        dst[k], bits[k] = _exp_parts(scale * src[k])
    powers = bits.view(np.float64)
    for k in range(lo, hi):
        dst[k] *= powers[k]


@numba.njit(inline="always", fastmath=True, error_model="numpy")
def _exp_scaled_into(src, scales, dst, n, bits):
    """dst[:n] = exp(scales[k] · src[k]): ``_exp_into`` with a scale per element, so the gates of
    several activations run through one loop."""
    for k in range(n):
        dst[k], bits[k] = _exp_parts(scales[k] * src[k])
    powers = bits.view(np.float64)
    for k in range(n):
        dst[k] *= powers[k]


@numba.njit(inline="always", fastmath=True, error_model="numpy")
def _activate(a, lo, hi, act, tmp, bits):
    """a[lo:hi] = the LSTM activation ``act`` of a[lo:hi] (TFLite's codes, LstmActivation):
    sigmoid as 1 / (1 + e^-x), tanh as 1 - 2 / (e^2x + 1), equal to the reference backend's forms
    within float64 rounding."""
    if act == 0:
        return
    if act == 1:
        for k in range(lo, hi):
            a[k] = max(a[k], 0.0)
    elif act == 2:
        for k in range(lo, hi):
            a[k] = min(max(a[k], -1.0), 1.0)
    elif act == 3:
        for k in range(lo, hi):
            a[k] = min(max(a[k], 0.0), 6.0)
    elif act == 4:
        _exp_into(a, 2.0, tmp, lo, hi, bits)
        for k in range(lo, hi):
            a[k] = 1.0 - 2.0 / (tmp[k] + 1.0)
    else:
        _exp_into(a, -1.0, tmp, lo, hi, bits)
        for k in range(lo, hi):
            a[k] = 1.0 / (1.0 + tmp[k])


@numba.njit(inline="always", fastmath=True, error_model="numpy")
def _normalize(acc, base, units, weights, g):
    mean = 0.0
    for u in range(units):
        mean += acc[base + u]
    mean /= units
    var = 0.0
    for u in range(units):
        d = acc[base + u] - mean
        var += d * d
    inv = 1.0 / np.sqrt(var / units + LAYER_NORM_EPSILON)
    for u in range(units):
        acc[base + u] = (acc[base + u] - mean) * inv * weights[g, u]


@numba.njit(inline="always", fastmath=True, error_model="numpy")
def _add_rows(acc, v, w, n):
    """acc += v[:n] @ w[:n] (w float32, widened exactly as read), four rows a pass: acc is loaded
    and stored once per four rows instead of once per row."""
    cols = acc.shape[0]
    k = 0
    while k + 4 <= n:
        a0, a1, a2, a3 = v[k], v[k + 1], v[k + 2], v[k + 3]
        for j in range(cols):
            acc[j] += (a0 * np.float64(w[k, j]) + a1 * np.float64(w[k + 1, j])
                       + a2 * np.float64(w[k + 2, j]) + a3 * np.float64(w[k + 3, j]))
        k += 4
    while k < n:
        a0 = v[k]
        for j in range(cols):
            acc[j] += a0 * np.float64(w[k, j])
        k += 1


@njit(_SIG, cache=True, nogil=True, fastmath=True, error_model="numpy")
def _sequence(xs, aux, w_in, w_aux, recurrent, bias, peep, layer_norm, proj, proj_bias, cifg, peephole, use_ln, act,
              reverse, projection, cell_clip, proj_clip, h0, c0, out, h_out, c_out):
    steps, batch, n_in = xs.shape
    n_aux = aux.shape[2]
    gates = recurrent.shape[1]
    units = gates // 4
    size = recurrent.shape[0]
    acc = np.empty(gates)
    xin = np.empty(max(n_in, n_aux))
    tmp = np.empty(gates)
    bits = np.empty(gates, np.int64)
    h = np.empty(units)
    # Without peepholes and layer normalisation every gate is ready after the products: with a
    # tanh cell, one exponential pass over all four (sigmoid's e^-x, tanh's e^2x) instead of a
    # pass per gate, each too short to keep the vector units busy.
    together = not peephole and not use_ln and act == TANH
    scales = np.full(gates, -1.0)
    scales[2 * units:3 * units] = 2.0
    hp = np.empty(size)
    cp = np.empty(units)
    for b in range(batch):
        for k in range(size):
            hp[k] = h0[b, k]
        for u in range(units):
            cp[u] = c0[b, u]
        for n in range(steps):
            t = steps - 1 - n if reverse else n
            acc[:] = 0.0
            for i in range(n_in):
                xin[i] = xs[t, b, i]
            _add_rows(acc, xin, w_in, n_in)
            if n_aux:
                for i in range(n_aux):
                    xin[i] = aux[t, b, i]
                _add_rows(acc, xin, w_aux, n_aux)
            _add_rows(acc, hp, recurrent, size)
            if together:
                for g in range(4):
                    for u in range(units):
                        acc[g * units + u] += bias[g, u]
                _exp_scaled_into(acc, scales, tmp, gates, bits)
                for k in range(2 * units):
                    acc[k] = 1.0 / (1.0 + tmp[k])
                for k in range(2 * units, 3 * units):
                    acc[k] = 1.0 - 2.0 / (tmp[k] + 1.0)
                for k in range(3 * units, gates):
                    acc[k] = 1.0 / (1.0 + tmp[k])
            for g in range(3 if not together else 0):  # input, forget, cell: they read the previous cell state
                if g == 0 and cifg:
                    continue
                base = g * units
                if peephole and g < 2:
                    for u in range(units):
                        acc[base + u] += peep[g, u] * cp[u]
                if use_ln:
                    _normalize(acc, base, units, layer_norm, g)
                for u in range(units):
                    acc[base + u] += bias[g, u]
            if not cifg and not together:
                _activate(acc, 0, units, SIGMOID, tmp, bits)
            if not together:
                _activate(acc, units, 2 * units, SIGMOID, tmp, bits)
                _activate(acc, 2 * units, 3 * units, act, tmp, bits)
            for u in range(units):
                f = acc[units + u]
                i = 1.0 - f if cifg else acc[u]
                c = f * cp[u] + i * acc[2 * units + u]
                if cell_clip > 0:
                    c = min(max(c, -cell_clip), cell_clip)
                cp[u] = np.float64(np.float32(c))  # the state is float32
            base = 3 * units
            if peephole:
                for u in range(units):
                    acc[base + u] += peep[2, u] * cp[u]
            if use_ln:
                _normalize(acc, base, units, layer_norm, 3)
            for u in range(units):
                if not together:
                    acc[base + u] += bias[3, u]
                h[u] = cp[u]
            if not together:
                _activate(acc, base, gates, SIGMOID, tmp, bits)
            _activate(h, 0, units, act, tmp, bits)
            for u in range(units):
                h[u] *= acc[base + u]
            if projection:
                for k in range(size):
                    hp[k] = 0.0
                _add_rows(hp, h, proj, units)
                for k in range(size):
                    s = hp[k] + proj_bias[k]
                    if proj_clip > 0:
                        s = min(max(s, -proj_clip), proj_clip)
                    hp[k] = np.float64(np.float32(s))
            else:
                for k in range(size):
                    hp[k] = np.float64(np.float32(h[k]))
            for k in range(size):
                out[t, b, k] = np.float32(hp[k])
        for k in range(size):
            h_out[b, k] = np.float32(hp[k])
        for u in range(units):
            c_out[b, u] = np.float32(cp[u])


def _float32(x: np.ndarray) -> np.ndarray:
    return x if x.dtype == np.float32 else x.astype(np.float32)


def _cell_runner(data: LstmData):
    p = data.params

    def run(k: int, inputs: list, xs: np.ndarray, aux: np.ndarray | None, reverse: bool) -> tuple:
        cell = p.cells[k]
        w = data.cells[k] or _pack(cell, _getter(lambda i: inputs[i]))
        steps, batch = xs.shape[0], xs.shape[1]
        if aux is None or not w.aux_weights.shape[0]:
            aux = np.empty((steps, batch, 0), np.float32)
        t = cell.tensors
        h0 = np.ascontiguousarray(inputs[t.output_state_in], np.float32)
        c0 = np.ascontiguousarray(inputs[t.cell_state_in], np.float32)
        # written time-major into the operation's layout: batch-major needs no transposing copy after
        out = np.empty((steps, batch, cell.output_size), np.float32) if p.time_major else \
            np.empty((batch, steps, cell.output_size), np.float32).swapaxes(0, 1)
        h, c = np.empty_like(h0), np.empty_like(c0)
        _sequence(_float32(xs), _float32(aux), w.input_weights, w.aux_weights, w.recurrent, w.bias, w.peephole,
                  w.layer_norm, w.projection, w.projection_bias, int(cell.use_cifg), int(cell.use_peephole),
                  int(cell.use_layer_norm), int(p.activation), int(reverse), int(cell.use_projection),
                  float(p.cell_clip), float(p.proj_clip), h0, c0, out, h, c)
        return out, h, c
    return run


def execute_unidirectional(ctx: OperationContext, inputs: list) -> list:
    data: LstmData = ctx.data
    check_runnable(ctx, data.params)
    return unidirectional(data.params, inputs, _cell_runner(data))


def execute_bidirectional(ctx: OperationContext, inputs: list) -> list:
    data: LstmData = ctx.data
    check_runnable(ctx, data.params)
    return bidirectional(data.params, inputs, _cell_runner(data))


BACKEND.register(UNIDIRECTIONAL_SEQUENCE_LSTM, plan=plan, execute=execute_unidirectional, types=(F32, F16))
BACKEND.register(BIDIRECTIONAL_SEQUENCE_LSTM, plan=plan, execute=execute_bidirectional, types=(F32, F16))
