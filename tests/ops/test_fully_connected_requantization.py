"""hal's two requantizations of an 8-bit FULLY_CONNECTED, on NNAPI models (no TFLite involved):

- NNAPI's FULLY_CONNECTED: the multiplier of GetQuantizedConvolutionMultipler (TFLite's kernel_util.cc
  and AOSP's OperationsUtils.cpp), the scales' product in float32 and the quotient in double, then
  fixed point; on the reference backend and, where numba is installed, the numba backend;
- com.nnhal.litert:FULLY_CONNECTED_DOUBLE_REQUANT (extensions/litert_compat.py):
  LiteRT's double requantization, against a loop over Python numbers, and its validation errors.
Against the TFLite runtimes themselves: tests/delegate/test_fully_connected_runtimes.py."""
from __future__ import annotations

import numpy as np
import pytest

from extensions import litert_compat
from hal import backends, quant
from hal.compiler import compile_model
from hal.errors import HalError
from hal.executor import execute
from hal.model import ExtensionNameAndPrefix, ModelBuilder, SymmPerChannelQuantParams
from hal.serialize import dump_compiled, load_compiled
from hal.types import OperandType, OperationType
from tests.backends.differential import assert_matches_reference

QU8 = OperandType.TENSOR_QUANT8_ASYMM
QS8 = OperandType.TENSOR_QUANT8_ASYMM_SIGNED
QPC = OperandType.TENSOR_QUANT8_SYMM_PER_CHANNEL
I32 = OperandType.TENSOR_INT32
DOUBLE_FC = (1 << 16) | litert_compat.FULLY_CONNECTED_DOUBLE_REQUANT


def _model(op: int, t: int, x_q: tuple, w: np.ndarray, w_q, b: np.ndarray, y_q: tuple, act: int = 0, *,
           batch: int = 1, w_type: int | None = None, const_w: bool = True, n_inputs: int = 4, channel_dim: int = 0):
    """x [batch, k] -> op -> y [batch, n]; ``w_q`` (scale, zero point), or a scale per unit for QPC."""
    mb = ModelBuilder()
    if op == DOUBLE_FC:
        mb.model.extension_name_to_prefix.append(ExtensionNameAndPrefix(litert_compat.NAME, 1))
    n, k = w.shape
    x = mb.add_operand(t, (batch, k), scale=x_q[0], zero_point=x_q[1])
    w_type = w_type or t
    if w_type == QPC:
        wq = {"channel_quant": SymmPerChannelQuantParams(tuple(float(s) for s in w_q), channel_dim)}
    else:
        wq = {"scale": w_q[0], "zero_point": w_q[1]}
    if const_w:
        wt = mb.add_constant(w_type, w, **wq)
    else:
        wt = mb.add_operand(w_type, w.shape, **wq)
    bias_scale = 0.0 if w_type == QPC else float(np.float32(x_q[0]) * np.float32(w_q[0]))
    bt = mb.add_constant(I32, b.astype(np.int32), scale=bias_scale)
    y = mb.add_operand(t, (), scale=y_q[0], zero_point=y_q[1])
    mb.add_operation(op, [x, wt, bt, mb.add_int32(act)][:n_inputs], [y])
    mb.identify_inputs_and_outputs([x] if const_w else [x, wt], [y])
    return mb.finish()


# ---- NNAPI FULLY_CONNECTED: the multiplier's float32 product ---------------------------------

def _disagreeing_multiplier_case(rng):
    """Scales whose float32 product and double product give different multipliers, and the int8
    accumulators (acc = x[0] + 127 * x[1], weights [1, 127]) where the outputs differ."""
    accs = np.arange(-16000, 16000)
    while True:
        x_s, w_s, y_s = (float(np.float32(v)) for v in rng.uniform([0.005, 0.002, 0.05], [0.2, 0.03, 0.3]))
        by_float = quant.quantize_multiplier(float(np.float32(x_s) * np.float32(w_s)) / y_s)
        by_double = quant.quantize_multiplier(x_s * w_s / y_s)
        a = quant.multiply_by_quantized_multiplier(accs, *by_float)
        b = quant.multiply_by_quantized_multiplier(accs, *by_double)
        picks = accs[(a != b) & (np.abs(a) < 120)]
        if picks.size:
            return (x_s, w_s, y_s), picks, by_float


def test_nnapi_fully_connected_multiplier_has_the_float32_product():
    rng = np.random.default_rng(5)
    backend_order = ["numba", "reference"] if backends.get("numba") is not None else ["reference"]
    for _ in range(5):
        (x_s, w_s, y_s), accs, by_float = _disagreeing_multiplier_case(rng)
        x1 = np.floor((accs + 64) / 127).astype(np.int64)
        x = np.stack([accs - 127 * x1, x1], 1).astype(np.int8)
        model = _model(OperationType.FULLY_CONNECTED, QS8, (x_s, 0), np.array([[1, 127]], np.int8), (w_s, 0),
                       np.zeros(1), (y_s, 0), batch=len(accs))
        want = np.clip(quant.multiply_by_quantized_multiplier(accs, *by_float), -128, 127).astype(np.int8)
        for order in {("reference",), tuple(backend_order)}:
            got = execute(compile_model(model, backend_order=list(order)), [x])[0]
            np.testing.assert_array_equal(got[:, 0], want, err_msg=f"backends {order}")
        if "numba" in backend_order:
            assert_matches_reference(model, [x], "numba")


# ---- com.nnhal.litert:FULLY_CONNECTED_DOUBLE_REQUANT -------------------------------------------

def _loop_reference(x, x_q, w, w_zp, w_scales, b, y_q, t, act) -> np.ndarray:
    """LiteRT's reference kernel, one output at a time over Python ints and floats (double)."""
    lo, hi = quant.activation_range_quantized(act, t, y_q[0], y_q[1])
    out = np.zeros((x.shape[0], w.shape[0]), np.int64)
    for r in range(x.shape[0]):
        for c in range(w.shape[0]):
            acc = sum((int(w[c, j]) - w_zp) * (int(x[r, j]) - x_q[1]) for j in range(x.shape[1])) + int(b[c])
            v = float(acc) * (float(np.float32(x_q[0])) * float(np.float32(w_scales[c])) / float(np.float32(y_q[0])))
            q = int(v)  # truncates toward zero; v - q is exact
            q += (1 if v > 0 else -1) if abs(v - q) >= 0.5 else 0
            q = q if -2 ** 31 <= q < 2 ** 31 else -2 ** 31  # x86-64's conversion of an out-of-range double
            out[r, c] = min(hi, max(lo, int(quant.wrap_int32(q + y_q[1]))))
    return out


@pytest.mark.parametrize("t, w_type", [(QU8, QU8), (QS8, QS8), (QS8, QPC)])
@pytest.mark.parametrize("const_w", [True, False])
def test_double_requant_matches_a_loop(t, w_type, const_w):
    litert_compat.ensure_registered()
    rng = np.random.default_rng([t, w_type, const_w])
    dtype = np.uint8 if t == QU8 else np.int8
    info = np.iinfo(dtype)
    for case in range(12):
        batch, k, n = int(rng.integers(1, 5)), int(rng.integers(1, 30)), int(rng.integers(1, 9))
        x_q = (float(np.float32(rng.uniform(0.005, 0.2))), int(rng.integers(info.min, info.max)))
        y_q = (float(np.float32(rng.uniform(0.02, 0.3) if case % 4 else 1e-6)), int(rng.integers(info.min, info.max)))
        w_scales = rng.uniform(0.002, 0.03, n).astype(np.float32)
        if w_type == QPC:
            w_zp, w_q = 0, w_scales
        else:
            w_zp = int(rng.integers(info.min, info.max)) if t == QU8 or case % 2 else 0
            w_scales[:] = w_scales[0]
            w_q = (float(w_scales[0]), w_zp)
        w = rng.integers(-127 if w_type == QPC else info.min, info.max, (n, k), endpoint=True).astype(dtype)
        b = rng.integers(-20000, 20000, n)
        act = int(rng.choice([0, 1, 2, 3]))
        x = rng.integers(info.min, info.max, (batch, k), endpoint=True).astype(dtype)
        model = _model(DOUBLE_FC, t, x_q, w, w_q, b, y_q, act, batch=batch, w_type=w_type, const_w=const_w)
        compiled = compile_model(model)
        args = [x] if const_w else [x, w]
        got = execute(compiled, args)[0]
        assert got.dtype == dtype and got.shape == (batch, n)
        want = _loop_reference(x, x_q, w, w_zp, w_scales, b, y_q, t, act)
        np.testing.assert_array_equal(got, want, err_msg=f"case {case}")
        if compiled.static_plan is not None:  # the compilation cache's copy computes the same
            np.testing.assert_array_equal(execute(load_compiled(*dump_compiled(compiled)), args)[0], got)


@pytest.mark.parametrize("t, w_type, k", [(QS8, QPC, 20000), (QS8, QS8, 3000), (QU8, QU8, 10000)])
def test_double_requant_long_reductions_are_exact(t, w_type, k):
    """K beyond what one float32 GEMM sums exactly. Row 0 sums odd products (127 x 127 or 127 x 255)
    far past 2^24 (BLAS sums in several lanes), where float32 rounds; the bias cancels all but a
    few units of it, and an effective scale of about 1 shows every unit of the accumulator."""
    litert_compat.ensure_registered()
    dtype = np.uint8 if t == QU8 else np.int8
    info = np.iinfo(dtype)
    rng = np.random.default_rng(k)
    w_zp = 0 if w_type == QPC else int(info.min)
    w = np.stack([np.full(k, 127 if w_type == QPC else info.max), rng.integers(info.min, info.max, k),
                  rng.integers(-127 if w_type == QPC else info.min, info.max, k)]).astype(dtype)
    x = np.stack([np.full(k, info.max), rng.integers(info.min, info.max, k)]).astype(dtype)
    x_zp = int(info.min) + 3
    x_s, w_s = 0.05, 0.003
    y_q = (float(np.float32(x_s) * np.float32(w_s)), 0 if t == QS8 else 128)
    row0 = (w.astype(np.int64) - w_zp) @ (x[0].astype(np.int64) - x_zp)
    bias = -row0 + np.array([5, -17, 60])
    w_scales = np.full(3, w_s, np.float32)
    w_q = w_scales if w_type == QPC else (w_s, w_zp)
    model = _model(DOUBLE_FC, t, (x_s, x_zp), w, w_q, bias, y_q, batch=2, w_type=w_type)
    got = execute(compile_model(model), [x])[0]
    np.testing.assert_array_equal(got, _loop_reference(x, (x_s, x_zp), w, w_zp, w_scales, bias, y_q, t, 0))
    np.testing.assert_array_equal(got[0].astype(np.int64) - y_q[1], [5, -17, 60])


def test_double_requant_rounds_ties_away_from_zero():
    """Power-of-two scales make exact halves: 2.5 -> 3 and -2.5 -> -3 (fixed point's single rounding
    would give -2, its double rounding other values)."""
    litert_compat.ensure_registered()
    x = np.arange(-12, 13, dtype=np.int8).reshape(-1, 1)
    model = _model(DOUBLE_FC, QS8, (0.5, 0), np.array([[1]], np.int8), (0.5, 0), np.zeros(1), (1.0, 0),
                   batch=len(x))
    got = execute(compile_model(model), [x])[0][:, 0].astype(np.int64)
    v = x[:, 0].astype(np.float64) / 4
    np.testing.assert_array_equal(got, np.sign(v) * np.floor(np.abs(v) + 0.5))


def _nnapi(**kw):
    defaults = dict(op=DOUBLE_FC, t=QS8, x_q=(0.5, 0), w=np.ones((3, 4), np.int8), w_q=(0.25, 0),
                    b=np.zeros(3), y_q=(1.0, 0))
    defaults.update(kw)
    return _model(**defaults)


@pytest.mark.parametrize("kwargs, message", [
    ({"n_inputs": 3}, "expected 4 inputs, got 3"),
    ({"t": OperandType.TENSOR_QUANT16_SYMM, "w_type": QS8}, "input 0 must be of type"),
    ({"w_type": QU8}, "input 1 must be of type"),
    ({"t": QU8, "w": np.ones((3, 4), np.uint8), "w_type": QPC, "w_q": [0.1, 0.2, 0.3]}, "input 1 must be of type"),
    ({"w_type": QPC, "w_q": [0.1, 0.2, 0.3, 0.4], "channel_dim": 1}, "along dimension 0"),
    ({"act": 9}, "unknown fused activation 9"),
])
def test_double_requant_validation_errors(kwargs, message):
    litert_compat.ensure_registered()
    with pytest.raises(HalError) as e:
        compile_model(_nnapi(**kwargs))
    assert "operation 0" in str(e.value) and message in str(e.value), str(e.value)


@pytest.mark.skipif(backends.get("numba") is None, reason="numba backend not installed")
@pytest.mark.parametrize("t, w_type", [(QU8, QU8), (QS8, QS8), (QS8, QPC)])
def test_double_requant_on_the_numba_backend_equals_the_extension(t, w_type):
    """The numba backend's kernel for the extension's operation (native int32 sums) gives the
    extension's own kernel's outputs; a layer whose int32 sums could overflow stays with the
    extension."""
    litert_compat.ensure_registered()
    rng = np.random.default_rng([t, w_type, 1])
    dtype = np.uint8 if t == QU8 else np.int8
    info = np.iinfo(dtype)
    for batch, k, n in ((1, 1280, 1000), (3, 37, 17), (2, 4, 1), (2, 70, 90)):
        w_scales = rng.uniform(0.002, 0.03, n).astype(np.float32)
        w_zp = 0 if w_type == QPC or k == 70 else int(rng.integers(info.min, info.max))
        w_q = w_scales if w_type == QPC else (float(w_scales[0]), w_zp)
        w = rng.integers(-127 if w_type == QPC else info.min, info.max, (n, k), endpoint=True).astype(dtype)
        if k == 70:  # weights within int8 of their zero point (uint8: 128): VNNI's row sums
            w_zp = 128 if t == QU8 else 0
            w = (rng.integers(-128, 128, (n, k)) + w_zp).astype(dtype)
            w_q = w_scales if w_type == QPC else (float(w_scales[0]), w_zp)
        b = rng.integers(-(1 << 31), 1 << 31, n) if k == 4 else rng.integers(-20000, 20000, n)  # k 4: int32 edges
        x = rng.integers(info.min, info.max, (batch, k), endpoint=True).astype(dtype)
        model = _model(DOUBLE_FC, t, (0.05, int(rng.integers(info.min, info.max))), w, w_q, b,
                       (0.5 if k > 4 else 1e-6, int(rng.integers(info.min, info.max))), int(rng.choice([0, 1, 3])),
                       batch=batch, w_type=w_type)
        fast = compile_model(model, backend_order=["numba", "reference"])
        own = compile_model(model, backend_order=["reference"])
        assert [s.backend for s in fast.static_plan.program] == ["numba"]
        assert [s.backend for s in own.static_plan.program] == [litert_compat.NAME]
        from hal.backends.numba_kernels import vnni
        fits = -128 <= int(w.astype(np.int64).min()) - w_zp and int(w.astype(np.int64).max()) - w_zp <= 127
        assert (fast.static_plan.program[0].ctx.data.packed is not None) == (vnni.AVAILABLE and fits)  # row_sums
        np.testing.assert_array_equal(execute(fast, [x])[0], execute(own, [x])[0])
        np.testing.assert_array_equal(execute(load_compiled(*dump_compiled(fast), backend_order=("numba", "reference")),
                                              [x])[0], execute(own, [x])[0])
    k = 40000  # 40000 * 255 * 255 > 2^31: the extension's int64 sums
    model = _model(DOUBLE_FC, QU8, (0.05, 0), np.full((2, k), 255, np.uint8), (0.01, 0), np.zeros(2), (1.0, 0))
    assert [s.backend for s in compile_model(model, backend_order=["numba", "reference"]).static_plan.program] \
        == [litert_compat.NAME]
