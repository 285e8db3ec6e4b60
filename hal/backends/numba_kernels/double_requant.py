"""com.nnhal.litert's FULLY_CONNECTED_DOUBLE_REQUANT (LiteRT's 8-bit FULLY_CONNECTED, requantized in
double; extensions/litert_compat.py defines it and is its fallback) with native accumulators.

The extension's kernel gets the int32 sums from float32 BLAS GEMMs over float32 copies of the
weights (4 bytes a weight, read cold from memory on every invocation: a classifier's 1280 x 1000
layer is 5 MB). Here the weights are kept as int16 (filter minus its zero point) and one native loop
per unit sums (x - x_zp)·(w - w_zp) in int32, exact when K·max|x − x_zp|·max|w − w_zp| < 2^31
(checked at plan; larger layers stay with the extension's kernel). Where the CPU has AVX-512 VNNI
and the filter minus its zero point fits int8, the sums come from ``vnni.row_sums`` over int8
weights packed like the GEMM's (a quarter of the float32 copy's bytes), the inputs' zero point and
int8 shift folded into one term per unit. The bias, the double requantization, the clamp and
their int32 corner cases are the extension's steps, computed per sum in the same native pass (no
[batch, num_units] intermediates in numpy). hal does not import the extension: the parameters
are read from the operation's prepared params (``DoubleRequantData``) by name.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numba
import numpy as np

from hal import quant
from hal.backends.numba_kernels import BACKEND, vnni
from hal.backends.numba_kernels.fixedpoint import ro, rw
from hal.backends.numba_kernels.gemm import in_order
from hal.backends.numba_kernels.lazy import njit
from hal.registry import OperationContext

EXTENSION = "com.nnhal.litert"
FULLY_CONNECTED_DOUBLE_REQUANT = 0
INPUT, WEIGHTS, BIAS = 0, 1, 2


@dataclass
class DoubleRequantGemv:
    weights: np.ndarray  # int16 [num_units, input_size]: filter minus its zero point
    batch: int
    input_size: int
    num_units: int
    input_zero_point: int
    output_zero_point: int
    scales: np.ndarray  # float64 [num_units]: the extension's, in LiteRT's evaluation order
    act_min: int
    act_max: int
    signed: bool  # int8 (else uint8) input and output
    #: Where the CPU has AVX-512 VNNI and the weights minus their zero point fit int8: the weights
    #: packed as gemm.GemmPlan's (``vnni.row_sums``), and per unit the int64 term that turns its
    #: sums over the unsigned (XORed) inputs into Σ (x − x_zp)·w. Else None (the int16 loop).
    packed: np.ndarray | None = None
    unit_terms: np.ndarray | None = None


def supports(ctx: OperationContext) -> str | None:
    w = ctx.input(WEIGHTS)
    if not w.is_constant:
        return "weights are not constant"
    return None


def plan(ctx: OperationContext) -> DoubleRequantGemv | None:
    p = ctx.params  # extensions.litert_compat.DoubleRequantData
    if not ctx.packing:
        return None
    w = ctx.constant(WEIGHTS).astype(np.int64).reshape(p.num_units, p.input_size) - p.weights_zero_point
    info = np.iinfo(ctx.input(INPUT).dtype)
    x_max = max(abs(int(info.min) - p.input_zero_point), abs(int(info.max) - p.input_zero_point))  # |x − x_zp|
    if p.input_size * x_max * max(1, int(np.abs(w).max(initial=0))) >= 1 << 31:
        raise ctx.fail("the int32 sums could overflow; the extension's kernel sums in int64")
    signed = ctx.input(INPUT).dtype == np.int8
    d = DoubleRequantGemv(np.ascontiguousarray(w, dtype=np.int16), p.batch, p.input_size, p.num_units,
                          p.input_zero_point, p.output_zero_point, np.asarray(p.scales, np.float64),
                          p.act_min, p.act_max, signed)
    if vnni.AVAILABLE and w.size and -128 <= w.min() and w.max() <= 127:
        kq, panels = -(-p.input_size // vnni.KSTEP), -(-p.num_units // vnni.PANEL)
        wpad = np.zeros((kq * vnni.KSTEP, panels * vnni.PANEL), dtype=np.int8)
        wpad[:p.input_size, :p.num_units] = w.T
        blocks = wpad.reshape(kq, vnni.KSTEP, panels, vnni.PANEL).transpose(2, 0, 3, 1)  # [panel, q, column, k]
        d.packed = np.ascontiguousarray(blocks).reshape(-1)
        # int8 inputs are summed as x + 128 (XOR 0x80): Σ (x − x_zp)·w = Σ x'·w − (x_zp + 128)·Σw
        d.unit_terms = -(p.input_zero_point + (128 if signed else 0)) * w.sum(axis=1)
    return d


_SIGS = [numba.void(ro(t, 2), numba.int64, ro(np.int16, 2), rw(np.int64, 2)) for t in (np.int8, np.uint8)]


@njit(_SIGS, cache=True, nogil=True)
def _sums(x, x_zp, w, out):
    """out[b, c] = Σ_k (x[b, k] − x_zp)·w[c, k], int32 sums (plan bounds them) widened to int64."""
    batch, k = x.shape
    xs = np.empty(k, dtype=np.int16)
    for b in range(batch):
        for j in range(k):
            xs[j] = np.int16(np.int32(x[b, j]) - np.int32(x_zp))
        for c in range(w.shape[0]):
            s = np.int32(0)
            for j in range(k):  # int32 arithmetic throughout (numba would widen to int64): pmaddwd
                s = np.int32(s + np.int32(np.int32(xs[j]) * np.int32(w[c, j])))
            out[b, c] = s


_I32_MIN = quant.INT32_MIN
_INT32_MIN, _INT32_MAX = float(quant.INT32_MIN), float(quant.INT32_MAX)
_SIG_REQ = numba.void(ro(np.int64, 2), ro(np.int32, 1), ro(np.float64, 1), numba.int64, numba.int64, numba.int64,
                      rw(np.uint8, 2))


@numba.njit(inline="always")
def _requantize_one(v, scale, zp, lo, hi):
    """The extension's requantize of one int64 sum (bias added): int32(std::round(double(v) ·
    scale)) + zero point, clamped. A rounded value outside int32 becomes INT32_MIN (the x86
    cast's result) and the zero point's add wraps, as in LiteRT's int32 arithmetic."""
    f = np.float64(v) * scale
    whole = np.trunc(f)
    if abs(f - whole) >= 0.5:  # half away from zero, exact (no floor(|f| + 0.5) misrounding)
        whole += 1.0 if f > 0 else -1.0
    r = np.int64(whole) if _INT32_MIN <= whole <= _INT32_MAX else np.int64(_I32_MIN)
    y = ((r + zp + 0x80000000) & 0xFFFFFFFF) - 0x80000000
    return lo if y < lo else (hi if y > hi else y)


@njit(_SIG_REQ, cache=True, nogil=True)
def _requantize(acc, bias, scales, zp, lo, hi, out):
    """out[b, c] (raw bytes) = requantized acc[b, c] + bias[c] (``bias`` empty: none)."""
    with_bias = bias.shape[0] > 0
    for b in range(acc.shape[0]):
        for c in range(acc.shape[1]):
            v = acc[b, c] + (np.int64(bias[c]) if with_bias else np.int64(0))
            out[b, c] = np.uint8(_requantize_one(v, scales[c], zp, lo, hi) & 0xFF)


_SIG_VNNI = numba.void(ro(np.uint8, 2), numba.int64, ro(np.int8, 1), ro(np.int64, 1), ro(np.int32, 1),
                       ro(np.float64, 1), numba.int64, numba.int64, numba.int64, rw(np.uint8, 2))
if vnni.AVAILABLE:
    from hal.backends.numba_kernels.vnni import row_sums

    @njit(_SIG_VNNI, cache=True, nogil=True)
    def _fc_vnni(x, xor, w, unit_terms, bias, scales, zp, lo, hi, out):
        """out[b, :] (raw bytes): row b of ``x`` (bytes, 4·kq a row) against the packed ``w``, its
        int32 sums plus ``unit_terms`` wrapped to int32 (exact: plan bounds Σ (x − x_zp)·w),
        the bias added and requantized, in one pass."""
        kq = x.shape[1] // 4
        n = out.shape[1]
        panels = (n + 15) // 16
        sums = np.empty(panels * 16, dtype=np.int32)
        with_bias = bias.shape[0] > 0
        for b in range(x.shape[0]):
            row_sums(x[b], 0, xor, w, kq, panels, sums)
            for c in range(n):
                s = ((np.int64(sums[c]) + unit_terms[c] + 0x80000000) & 0xFFFFFFFF) - 0x80000000
                v = s + (np.int64(bias[c]) if with_bias else np.int64(0))
                out[b, c] = np.uint8(_requantize_one(v, scales[c], zp, lo, hi) & 0xFF)


_NO_BIAS = np.zeros(0, dtype=np.int32)


def execute(ctx: OperationContext, inputs: list) -> list:
    d: DoubleRequantGemv = ctx.data
    x = np.ascontiguousarray(inputs[INPUT]).reshape(d.batch, d.input_size)
    bias = inputs[BIAS]
    bias = _NO_BIAS if bias is None or not bias.size else np.ascontiguousarray(bias, dtype=np.int32)
    y = np.empty((d.batch, d.num_units), dtype=np.int8 if d.signed else np.uint8)
    if getattr(d, "packed", None) is not None:
        a = x.view(np.uint8)
        if d.input_size % vnni.KSTEP:  # whole 4-byte steps (the padded weights are 0 there)
            a = np.zeros((d.batch, -(-d.input_size // vnni.KSTEP) * vnni.KSTEP), dtype=np.uint8)
            a[:, :d.input_size] = x.view(np.uint8)
        _fc_vnni(a, 0x80808080 if d.signed else 0, d.packed, d.unit_terms, bias, d.scales, d.output_zero_point,
                 d.act_min, d.act_max, y.view(np.uint8))
    else:
        acc = np.empty((d.batch, d.num_units), dtype=np.int64)
        _sums(x, d.input_zero_point, d.weights, acc)
        _requantize(acc, bias, d.scales, d.output_zero_point, d.act_min, d.act_max, y.view(np.uint8))
    return [y]


def bind(ctx: OperationContext, inputs: list, outputs: list):
    """``execute`` of the fixed contiguous input into the fixed ``outputs[0]`` as a zero-argument
    runner: the bias converted and the zero-padded rows allocated once (the bias is a constant)."""
    d: DoubleRequantGemv = ctx.data
    x, bias, y = inputs[INPUT], inputs[BIAS], outputs[0].view(np.uint8)
    if x is None or not x.flags.c_contiguous or (bias is not None and not ctx.inputs[BIAS].is_constant):
        return None
    x = x.reshape(d.batch, d.input_size)
    bias = _NO_BIAS if bias is None or not bias.size else np.ascontiguousarray(bias, dtype=np.int32)
    if getattr(d, "packed", None) is None:
        acc = np.empty((d.batch, d.num_units), dtype=np.int64)
        return in_order(functools.partial(_sums, x, d.input_zero_point, d.weights, acc),
                        functools.partial(_requantize, acc, bias, d.scales, d.output_zero_point, d.act_min,
                                          d.act_max, y))
    a = x.view(np.uint8)
    gemv = functools.partial(_fc_vnni, a, 0x80808080 if d.signed else 0, d.packed, d.unit_terms, bias, d.scales,
                             d.output_zero_point, d.act_min, d.act_max, y)
    if d.input_size % vnni.KSTEP == 0:
        return gemv
    padded = np.zeros((d.batch, -(-d.input_size // vnni.KSTEP) * vnni.KSTEP), dtype=np.uint8)
    gemv = functools.partial(_fc_vnni, padded, *gemv.args[1:])
    return in_order(functools.partial(np.copyto, padded[:, :d.input_size], a), gemv)


BACKEND.register_extension_kernel(EXTENSION, FULLY_CONNECTED_DOUBLE_REQUANT, plan=plan, execute=execute,
                                  supports=supports, prepacked_inputs=(WEIGHTS,), bind=bind)
