"""TRANSPOSE_CONV_2D vs TFLite's TRANSPOSE_CONV (BUILTIN_REF): float32 within tolerance, uint8 and
int8 (per-tensor, per-channel) bit-exact, with output sizes NNAPI's implicit signature reproduces
and ones that need explicit paddings (a negative tail). NCHW, the explicit signature and uint8
with per-channel filters are checked against TFLite on equivalent models; then NNAPI's validation
rules, zero-sized inputs and the TFLite variants the mapping refuses."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from delegate.mapping import MappingError, convert_partition
from delegate.tfl import TfLiteModelBuilder, read_model
from delegate.tfl.schema import ActivationFunctionType as Act
from delegate.tfl.schema import Padding
from hal.compiler import compile_model
from hal.errors import HalError
from hal.model import ModelBuilder, SymmPerChannelQuantParams
from hal.types import OperandType, OperationType
from tests.harness import OP_SETTINGS, assert_matches_tflite, random_tensor, tflite_run
from tests.ops._conv_util import assert_live_options_match, assert_runs_like, run_zero_batch, uint8_twin

F32 = OperandType.TENSOR_FLOAT32
F16 = OperandType.TENSOR_FLOAT16
I32 = OperandType.TENSOR_INT32
QU8 = OperandType.TENSOR_QUANT8_ASYMM
QS8 = OperandType.TENSOR_QUANT8_ASYMM_SIGNED
QPC = OperandType.TENSOR_QUANT8_SYMM_PER_CHANNEL
TC = OperationType.TRANSPOSE_CONV_2D

COVERED = {(TC, t) for t in (F32, QU8, QS8)}

ACTS = [Act.NONE, Act.RELU, Act.RELU_N1_TO_1, Act.RELU6]
SEEDS = st.integers(0, 2**32 - 1)


def _implied(size, stride, filt, padding):
    """The output size NNAPI's implicit signature gives for an input size (the natural one)."""
    return size * stride if padding == Padding.SAME else (size - 1) * stride + filt


@st.composite
def cases(draw):
    padding = draw(st.sampled_from([Padding.SAME, Padding.VALID]))
    n, h, w = draw(st.integers(1, 2)), draw(st.integers(1, 6)), draw(st.integers(1, 6))
    c, oc = draw(st.integers(1, 5)), draw(st.integers(1, 5))
    fh, fw, sh, sw = (draw(st.integers(1, 4)) for _ in range(4))
    out = []
    for size, s, f in ((h, sh, fh), (w, sw, fw)):
        # Every output size the input follows from (TFLite's check since 2.15, which LiteRT makes:
        # a convolution of the output, stride s, gives the input back): SAME, ceil(out / s) == in,
        # sizes up to s - 1 below the natural one; VALID, sizes up to s - 1 above it (a negative
        # tail padding in NNAPI's explicit signature).
        natural, extra = _implied(size, s, f, padding), draw(st.integers(0, s - 1))
        out.append(natural - extra if padding == Padding.SAME else natural + extra)
    return {"x_shape": [n, h, w, c], "w_shape": [oc, fh, fw, c], "oc": oc, "y_shape": [n, out[0], out[1], oc],
            "padding": padding, "stride": (sh, sw), "act": draw(st.sampled_from(ACTS)), "bias": draw(st.booleans()),
            "const_w": draw(st.booleans())}


def _tfl_model(case, dtype, w, bias, qx=None, qw=None, qb=None, qy=None, act=None, const_w=None):
    m = TfLiteModelBuilder()
    shape = m.add_constant("shape", np.array(case["y_shape"], np.int32))
    const_w = case["const_w"] if const_w is None else const_w
    wt = m.add_constant("w", w, **(qw or {})) if const_w else m.add_input("w", w.shape, w.dtype, **(qw or {}))
    x = m.add_input("x", case["x_shape"], dtype, **(qx or {}))
    ins = [shape, wt, x] + ([] if bias is None else [m.add_constant("b", bias, **(qb or {}))])
    y = m.add_tensor("y", case["y_shape"], dtype, **(qy or {}))
    sh, sw = case["stride"]
    m.add_operator("TRANSPOSE_CONV", ins, [y], ("TransposeConvOptions", {
        "padding": case["padding"], "stride_w": sw, "stride_h": sh,
        "fused_activation_function": case["act"] if act is None else act}))
    m.set_outputs([y])
    return m.build()


def _inputs(case, x, w):
    return [w, x] if not case["const_w"] else [x]


@OP_SETTINGS
@given(case=cases(), seed=SEEDS)
def test_float32(case, seed):
    rng = np.random.default_rng(seed)
    x = random_tensor(rng, case["x_shape"], np.float32, -2, 2)
    w = random_tensor(rng, case["w_shape"], np.float32, -1, 1)
    bias = random_tensor(rng, [case["oc"]], np.float32, -2, 2) if case["bias"] else None
    assert_matches_tflite(_tfl_model(case, np.float32, w, bias), _inputs(case, x, w))


def _quant_filter(rng, case, dtype, per_channel):
    if dtype == np.uint8:
        return random_tensor(rng, case["w_shape"], np.uint8), {
            "scale": float(np.float32(rng.uniform(0.002, 0.05))), "zero_point": int(rng.integers(0, 255))}
    w = rng.integers(-127, 127, size=case["w_shape"], endpoint=True).astype(np.int8)
    if per_channel:
        scales = [float(s) for s in rng.uniform(0.002, 0.05, size=case["oc"]).astype(np.float32)]
        return w, {"scale": scales, "zero_point": [0] * case["oc"], "quantized_dimension": 0}
    return w, {"scale": float(np.float32(rng.uniform(0.002, 0.05))), "zero_point": 0}


def _quantized(case, dtype, per_channel, seed):
    """(model pieces) with an output quantization covering the real result (from TFLite's float kernel)."""
    rng = np.random.default_rng(seed)
    info = np.iinfo(dtype)
    qx = {"scale": float(np.float32(rng.uniform(0.005, 0.1))),
          "zero_point": int(rng.integers(info.min, info.max, endpoint=True))}
    x = random_tensor(rng, case["x_shape"], dtype)
    w, qw = _quant_filter(rng, case, dtype, per_channel)
    scales = np.broadcast_to(np.asarray(qw["scale"], np.float64), (case["oc"],))
    bias, qb = None, None
    if case["bias"]:
        bias = rng.integers(-30000, 30000, size=case["oc"], endpoint=True).astype(np.int32)
        bscale = [qx["scale"] * float(s) for s in scales]
        qb = {"scale": bscale if per_channel else bscale[0], "zero_point": [0] * case["oc"] if per_channel else 0}
    xr = (x.astype(np.float32) - qx["zero_point"]) * np.float32(qx["scale"])
    wr = ((w.astype(np.float32) - np.float32(qw["zero_point"] if not per_channel else 0))
          * scales.astype(np.float32).reshape(-1, 1, 1, 1))
    br = None if bias is None else (bias * np.asarray(qb["scale"], np.float64)).astype(np.float32)
    real = tflite_run(_tfl_model(case, np.float32, wr, br, act=Act.NONE, const_w=True), [xr])[0]
    lo, hi = float(min(real.min(), 0.0)), float(max(real.max(), 0.0))
    scale = float(np.float32(max(hi - lo, 1e-3) * rng.uniform(0.6, 1.4) / 255))
    zp = int(np.clip(round(info.min - lo / scale * rng.uniform(0.8, 1.0)), info.min, info.max))
    return x, w, bias, qx, qw, qb, {"scale": scale, "zero_point": zp}


@OP_SETTINGS
@given(case=cases(), dtype=st.sampled_from([np.uint8, np.int8]), seed=SEEDS)
def test_quant8_per_tensor(case, dtype, seed):
    x, w, bias, qx, qw, qb, qy = _quantized(case, dtype, False, seed)
    assert_matches_tflite(_tfl_model(case, dtype, w, bias, qx, qw, qb, qy), _inputs(case, x, w))


@OP_SETTINGS
@given(case=cases(), seed=SEEDS)
def test_int8_per_channel(case, seed):
    case["const_w"] = True
    x, w, bias, qx, qw, qb, qy = _quantized(case, np.int8, True, seed)
    assert_matches_tflite(_tfl_model(case, np.int8, w, bias, qx, qw, qb, qy), [x])


def test_both_signatures_are_used():
    """Output sizes the implicit signature reproduces map to it (9 inputs); others to explicit paddings."""
    w = np.ones((2, 3, 3, 1), np.float32)
    natural = {"x_shape": [1, 3, 3, 1], "w_shape": [2, 3, 3, 1], "oc": 2, "y_shape": [1, 6, 6, 2],
               "padding": Padding.SAME, "stride": (2, 2), "act": Act.NONE, "bias": False, "const_w": True}
    wider = dict(natural, padding=Padding.VALID, y_shape=[1, 8, 8, 2])  # VALID's 7 + 1: a negative tail
    for case, count in ((natural, 9), (wider, 11)):
        ops = convert_partition(read_model(_tfl_model(case, np.float32, w, None))).model.main.operations
        assert [(op.type, len(op.inputs)) for op in ops] == [(TC, count)]
        x = np.arange(9, dtype=np.float32).reshape(1, 3, 3, 1)
        assert_matches_tflite(_tfl_model(case, np.float32, w, np.ones(2, np.float32)), [x])


def test_options_read_from_the_live_interpreter():
    case = {"x_shape": [1, 3, 3, 1], "w_shape": [2, 3, 3, 1], "oc": 2, "y_shape": [1, 10, 8, 2],
            "padding": Padding.VALID, "stride": (3, 2), "act": Act.RELU6, "bias": True, "const_w": True}
    assert_live_options_match(_tfl_model(case, np.float32, np.ones((2, 3, 3, 1), np.float32), np.ones(2, np.float32)))


# ---- NCHW, explicit signature and uint8 with per-channel filters ----------------------

def _pads(case):
    """TFLite's paddings as NNAPI explicit ones (left, right, top, bottom)."""
    (sh, sw), (_, fh, fw, _), (_, h, w, _), (_, oh, ow, _) = (case["stride"], case["w_shape"], case["x_shape"],
                                                              case["y_shape"])
    heads = []
    for out, s, f in ((oh, sh, fh), (ow, sw, fw)):
        n = (out + s - 1) // s if case["padding"] == Padding.SAME else (out - f + s) // s
        heads.append(max((n - 1) * s + f - out, 0) // 2)
    top, left = heads
    return [left, (w - 1) * sw + fw - left - ow, top, (h - 1) * sh + fh - top - oh]


def _nnapi(case, x_type, qx, w, w_type, qw, bias, bias_scale, qy, nchw, explicit):
    mb = ModelBuilder()
    perm = (0, 3, 1, 2) if nchw else (0, 1, 2, 3)
    x = mb.add_operand(x_type, [case["x_shape"][i] for i in perm], **qx)
    if w_type == QPC:
        wi = mb.add_constant(QPC, w, channel_quant=SymmPerChannelQuantParams(tuple(qw["scale"]), 0))
    else:
        wi = mb.add_constant(w_type, w, scale=qw.get("scale", 0.0), zero_point=qw.get("zero_point", 0))
    bi = mb.add_constant(F32 if x_type == F32 else I32, bias, scale=bias_scale)
    y = mb.add_operand(x_type, (), **qy)
    sh, sw = case["stride"]
    if explicit:
        params = [mb.add_int32(v) for v in _pads(case)]
    else:
        params = [mb.add_constant(I32, np.array([case["y_shape"][i] for i in perm], np.int32)),
                  mb.add_int32(1 if case["padding"] == Padding.SAME else 2)]
    params += [mb.add_int32(sw), mb.add_int32(sh), mb.add_int32(int(case["act"])), mb.add_bool(nchw)]
    mb.add_operation(TC, [x, wi, bi, *params], [y])
    mb.identify_inputs_and_outputs([x], [y])
    return mb.finish()


@OP_SETTINGS
@given(case=cases(), kind=st.sampled_from(["f32", "u8", "s8pc", "u8pc"]), nchw=st.booleans(), seed=SEEDS)
def test_layout_and_signatures(case, kind, nchw, seed):
    """The NNAPI model (explicit signature, or implicit where it gives TFLite's size) vs TFLite."""
    case = dict(case, const_w=True, bias=True)
    explicit = _pads(case)[1::2] != [0, 0] if case["padding"] == Padding.VALID else \
        [(o + s - 1) // s for o, s in zip(case["y_shape"][1:3], case["stride"])] != case["x_shape"][1:3]
    explicit = explicit or seed % 2 == 0
    if kind == "f32":
        rng = np.random.default_rng(seed)
        x = random_tensor(rng, case["x_shape"], np.float32, -2, 2)
        w = random_tensor(rng, case["w_shape"], np.float32, -1, 1)
        bias = random_tensor(rng, [case["oc"]], np.float32, -2, 2)
        expected = tflite_run(_tfl_model(case, np.float32, w, bias), [x])[0]
        model = _nnapi(case, F32, {}, w, F32, {}, bias, 0.0, {}, nchw, explicit)
    else:
        dtype = np.uint8 if kind == "u8" else np.int8
        x, w, bias, qx, qw, qb, qy = _quantized(case, dtype, kind != "u8", seed)
        expected = tflite_run(_tfl_model(case, dtype, w, bias, qx, qw, qb, qy), [x])[0]
        if kind == "u8pc":  # the same computation on uint8 data
            x, expected, qx, qy = uint8_twin(x, expected, qx, qy)
        bias_scale = qb["scale"] if kind == "u8" else 0.0
        model = _nnapi(case, QS8 if kind == "s8pc" else QU8, qx, w, QU8 if kind == "u8" else QPC, qw, bias,
                       bias_scale, qy, nchw, explicit)
    assert_runs_like(model, x, expected, nchw, exact=kind != "f32")


# ---- NNAPI validation ----------------------------------------------------------------

def _nnapi_model(t=F32, x_shape=(1, 3, 3, 2), w_shape=(4, 3, 3, 2), w_type=None, b_type=None, b_scale=None,
                 b_shape=None, scalars=None, out_shape=(1, 6, 6, 4), channel_dim=0):
    """Implicit signature by default: (output shape, scheme SAME, strides 2, 2, activation, layout)."""
    mb = ModelBuilder()
    quant = t not in (F32, F16)
    x = mb.add_operand(t, x_shape, **({"scale": 0.5, "zero_point": 0} if quant else {}))
    w_type = w_type or t
    if w_type == QPC:
        w = mb.add_constant(QPC, np.zeros(w_shape), channel_quant=SymmPerChannelQuantParams(
            tuple([0.25] * w_shape[channel_dim]), channel_dim))
    else:
        w = mb.add_constant(w_type, np.zeros(w_shape), **({"scale": 0.25} if w_type in (QU8, QS8) else {}))
    b_type = b_type or (I32 if quant else t)
    if b_scale is None:
        b_scale = 0.125 if b_type == I32 and w_type != QPC else 0.0
    b = mb.add_constant(b_type, np.zeros(b_shape or (w_shape[0],)), scale=b_scale)
    y = mb.add_operand(t, (), **({"scale": 1.0, "zero_point": 0} if quant else {}))
    if scalars is None:
        scalars = (1, 2, 2, 0, False)
        ins = [mb.add_constant(I32, np.array(out_shape, np.int32))]
    else:
        ins = []
    ins += [mb.add_bool(v) if isinstance(v, bool) else mb.add_int32(v) for v in scalars]
    mb.add_operation(TC, [x, w, b, *ins], [y])
    mb.identify_inputs_and_outputs([x], [y])
    return mb.finish()


@pytest.mark.parametrize("kwargs, message", [
    ({"scalars": (0, 0, 0, 0, 2, 2, 0)}, "expected 9 or 11 inputs, got 10"),
    ({"t": I32}, "input 0 must be of type"),
    ({"t": F16, "w_type": F32}, "input 1 must be of type TENSOR_FLOAT16, got TENSOR_FLOAT32"),
    ({"t": F32, "b_type": I32}, "input 2 must be of type TENSOR_FLOAT32, got TENSOR_INT32"),
    ({"t": QU8, "w_type": QS8}, "input 1 must be of type TENSOR_QUANT8_ASYMM, TENSOR_QUANT8_SYMM_PER_CHANNEL"),
    ({"t": QS8, "w_type": QPC, "channel_dim": 3}, "per-channel quantization must be along dimension 0, got 3"),
    ({"t": QU8, "b_scale": 0.2}, "bias scale 0.2 must equal input scale * filter scale = 0.125"),
    ({"x_shape": (3, 3, 2)}, "input 0 must be rank 4"),
    ({"w_shape": (4, 3, 3, 3)}, "filter has 3 input channels but the input has 2"),
    ({"b_shape": (3,)}, "bias has 3 elements but the filter has 4 output channels"),
    ({"scalars": (-1, 0, 0, 0, 2, 2, 0, False)}, "left and top paddings must be >= 0"),
    ({"scalars": (0, 0, 0, 0, 0, 2, 0, False)}, "strides must be >= 1"),
    ({"scalars": (0, 0, 0, 0, 2, 2, 7, False)}, "unknown fused activation 7"),
    ({"scalars": (0, 0, 0, 0, 2, 2, 0, 1)}, "input 10 must be of type BOOL"),
    ({"scalars": (0, 9, 0, 0, 1, 1, 0, False)}, "the output would be 5x-4"),
    ({"out_shape": (1, 6, 6)}, "output shape) must have 4 elements, got 3"),
    ({"out_shape": (1, 0, 6, 4)}, "output shape) [1, 0, 6, 4] must have a height and width > 0"),
])
def test_validation_errors(kwargs, message):
    with pytest.raises(HalError) as e:
        compile_model(_nnapi_model(**kwargs))
    assert "operation 0 (TRANSPOSE_CONV_2D)" in str(e.value)
    assert message in str(e.value)


@pytest.mark.parametrize("t, w_type", [(F32, F32), (F16, F16), (QU8, QU8), (QU8, QPC), (QS8, QS8), (QS8, QPC)])
def test_valid_models_compile_and_take_zero_batches(t, w_type):
    for scalars in (None, (1, 0, 2, 1, 2, 1, 3, False), (0, -2, 0, -1, 1, 1, 0, True)):
        nchw = scalars is not None and scalars[-1]
        model = _nnapi_model(t, x_shape=(1, 2, 3, 3) if nchw else (1, 3, 3, 2), w_type=w_type, scalars=scalars)
        compile_model(model)
        out = run_zero_batch(model)
        assert out.shape[0] == 0


# ---- TFLite variants -----------------------------------------------------------------

def _mapping_error(model: bytes) -> str:
    with pytest.raises(MappingError) as e:
        convert_partition(read_model(model))
    return str(e.value)


def test_mapping_refuses_unsupported_variants():
    base = {"x_shape": [1, 2, 2, 2], "w_shape": [3, 2, 2, 2], "oc": 3, "y_shape": [1, 4, 4, 3],
            "padding": Padding.SAME, "stride": (2, 2), "act": Act.NONE, "bias": False, "const_w": True}
    q = {"scale": 0.5, "zero_point": 0}
    w8 = np.ones((3, 2, 2, 2), np.int8)
    assert "hybrid" in _mapping_error(_tfl_model(base, np.float32, w8, None, qw=q))
    assert "non-zero zero point" in _mapping_error(
        _tfl_model(base, np.int8, w8, None, qx=q, qw={"scale": 0.5, "zero_point": 1}, qy=q))
    m = TfLiteModelBuilder()
    shape = m.add_input("shape", [4], np.int32)
    x = m.add_input("x", [1, 2, 2, 2])
    y = m.add_tensor("y", [1, 4, 4, 3])
    m.add_operator("TRANSPOSE_CONV", [shape, m.add_constant("w", np.ones((3, 2, 2, 2), np.float32)), x], [y],
                   ("TransposeConvOptions", {"padding": Padding.SAME, "stride_w": 2, "stride_h": 2}))
    m.set_outputs([y])
    assert "output shape is computed" in _mapping_error(m.build())
