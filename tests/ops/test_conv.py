"""CONV_2D and DEPTHWISE_CONV_2D vs TFLite (BUILTIN_REF): float32 within tolerance, uint8
per-tensor and int8 per-tensor / per-channel bit-exact. Explicit padding, NCHW and uint8 with
per-channel filters (which TFLite cannot express) are checked against TFLite on equivalent
models. Then NNAPI validation errors and the TFLite variants the mapping refuses."""
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
from hal.executor import execute
from hal.model import ModelBuilder, SymmPerChannelQuantParams
from hal.types import OperandType, OperationType
from hal.validation import validate_model
from tests.harness import (
    OP_SETTINGS,
    assert_float_close,
    assert_matches_tflite,
    hal_run,
    per_operation_order,
    random_tensor,
    tflite_run,
)
from tests.ops._conv_util import assert_runs_like, run_zero_batch, uint8_twin

F32 = OperandType.TENSOR_FLOAT32
F16 = OperandType.TENSOR_FLOAT16
I32 = OperandType.TENSOR_INT32
QU8 = OperandType.TENSOR_QUANT8_ASYMM
QS8 = OperandType.TENSOR_QUANT8_ASYMM_SIGNED
QPC = OperandType.TENSOR_QUANT8_SYMM_PER_CHANNEL
CONV, DW = OperationType.CONV_2D, OperationType.DEPTHWISE_CONV_2D

COVERED = {(op, t) for op in (CONV, DW) for t in (F32, QU8, QS8)}

ACTS = [Act.NONE, Act.RELU, Act.RELU_N1_TO_1, Act.RELU6]
OPS = ["CONV_2D", "DEPTHWISE_CONV_2D"]
SEEDS = st.integers(0, 2**32 - 1)


def _out_size(size, filt, stride, dilation, padding):
    eff = (filt - 1) * dilation + 1
    if padding == Padding.SAME:
        return (size + stride - 1) // stride
    return (size - eff + stride) // stride


@st.composite
def conv_cases(draw, op):
    """Shapes and options with a non-empty output (tensors small enough for a fast test)."""
    depthwise = op == "DEPTHWISE_CONV_2D"
    padding = draw(st.sampled_from([Padding.SAME, Padding.VALID]))
    n, h, w = draw(st.integers(1, 2)), draw(st.integers(1, 10)), draw(st.integers(1, 10))
    if depthwise:
        c, mult = draw(st.integers(1, 6)), draw(st.integers(1, 3))
        oc = c * mult
    else:
        c, mult, oc = draw(st.integers(1, 8)), 1, draw(st.integers(1, 8))
    dh, dw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    max_fh = 4 if padding == Padding.SAME else min(4, (h - 1) // dh + 1)
    max_fw = 4 if padding == Padding.SAME else min(4, (w - 1) // dw + 1)
    fh, fw = draw(st.integers(1, max_fh)), draw(st.integers(1, max_fw))
    sh, sw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    return {"op": op, "x_shape": [n, h, w, c], "oc": oc, "mult": mult,
            "w_shape": [1, fh, fw, oc] if depthwise else [oc, fh, fw, c],
            "y_shape": [n, _out_size(h, fh, sh, dh, padding), _out_size(w, fw, sw, dw, padding), oc],
            "padding": padding, "stride": (sh, sw), "dilation": (dh, dw),
            # TFLite 2.14's CONV_2D requires a bias; DEPTHWISE_CONV_2D may omit it.
            "act": draw(st.sampled_from(ACTS)), "bias": not depthwise or draw(st.booleans()),
            "const_w": draw(st.booleans())}


def _tfl_model(case, dtype, w, bias, qx=None, qw=None, qb=None, qy=None, act=None,
               const_w=None):
    m = TfLiteModelBuilder()
    x = m.add_input("x", case["x_shape"], dtype, **(qx or {}))
    const_w = case["const_w"] if const_w is None else const_w
    wt = m.add_constant("w", w, **(qw or {})) if const_w else m.add_input("w", w.shape, w.dtype, **(qw or {}))
    # TFLite's conv kernels take an omitted bias as a 2-input node (not a -1 input).
    ins = [x, wt] if bias is None else [x, wt, m.add_constant("b", bias, **(qb or {}))]
    y = m.add_tensor("y", case["y_shape"], dtype, **(qy or {}))
    (sh, sw), (dh, dw) = case["stride"], case["dilation"]
    opts = {"padding": case["padding"], "stride_w": sw, "stride_h": sh, "dilation_w_factor": dw,
            "dilation_h_factor": dh,
            "fused_activation_function": case["act"] if act is None else act}
    if case["op"] == "CONV_2D":
        m.add_operator("CONV_2D", ins, [y], ("Conv2DOptions", opts))
    else:
        opts["depth_multiplier"] = case["mult"]
        m.add_operator("DEPTHWISE_CONV_2D", ins, [y], ("DepthwiseConv2DOptions", opts))
    m.set_outputs([y])
    return m.build()


def _inputs(case, x, w):
    return [x] if case["const_w"] else [x, w]


@OP_SETTINGS
@pytest.mark.parametrize("op", OPS)
@given(data=st.data(), seed=SEEDS)
def test_float32(op, data, seed):
    case = data.draw(conv_cases(op))
    rng = np.random.default_rng(seed)
    x = random_tensor(rng, case["x_shape"], np.float32, -2, 2)
    w = random_tensor(rng, case["w_shape"], np.float32, -1, 1)
    bias = random_tensor(rng, [case["oc"]], np.float32, -2, 2) if case["bias"] else None
    assert_matches_tflite(_tfl_model(case, np.float32, w, bias), _inputs(case, x, w))


# ---- quantized -----------------------------------------------------------------

def _filter_axis(case):
    return 3 if case["op"] == "DEPTHWISE_CONV_2D" else 0


def _quant_filter(rng, case, dtype, per_channel):
    """Filter values and quantization: uint8 asymmetric, int8 symmetric (per-tensor or per-channel)."""
    oc = case["oc"]
    if dtype == np.uint8:
        w = random_tensor(rng, case["w_shape"], np.uint8)
        return w, {"scale": float(np.float32(rng.uniform(0.002, 0.05))),
                   "zero_point": int(rng.integers(0, 255, endpoint=True))}
    w = rng.integers(-127, 127, size=case["w_shape"], endpoint=True).astype(np.int8)
    if per_channel:
        scales = [float(s) for s in rng.uniform(0.002, 0.05, size=oc).astype(np.float32)]
        return w, {"scale": scales, "zero_point": [0] * oc, "quantized_dimension": _filter_axis(case)}
    return w, {"scale": float(np.float32(rng.uniform(0.002, 0.05))), "zero_point": 0}


def _filter_scales(case, qw):
    s = np.asarray(qw["scale"], dtype=np.float64)
    return s if s.size > 1 else np.full(case["oc"], s.item())


def _output_quant(rng, case, dtype, x, w, bias, qx, qw, qb):
    """Output scale/zero point covering the real result range, found by running the dequantized
    model through TFLite's float kernel (so outputs are neither all saturated nor all equal)."""
    xr = (x.astype(np.float32) - qx["zero_point"]) * np.float32(qx["scale"])
    axis_shape = [-1 if a == _filter_axis(case) else 1 for a in range(4)]
    w_zp = np.asarray(qw["zero_point"], dtype=np.float32)
    w_zp = w_zp.reshape(axis_shape) if w_zp.size > 1 else w_zp.reshape(())
    wr = (w.astype(np.float32) - w_zp) * _filter_scales(case, qw).astype(np.float32).reshape(axis_shape)
    br = None if bias is None else (bias * np.asarray(qb["scale"], np.float64)).astype(np.float32)
    real = tflite_run(_tfl_model(case, np.float32, wr, br, act=Act.NONE, const_w=True), [xr])[0]
    lo, hi = float(min(real.min(), 0.0)), float(max(real.max(), 0.0))
    span = max(hi - lo, 1e-3) * rng.uniform(0.6, 1.4)
    info = np.iinfo(dtype)
    scale = float(np.float32(span / 255))
    zp = int(np.clip(round(info.min - lo / scale * rng.uniform(0.8, 1.0)), info.min, info.max))
    return {"scale": scale, "zero_point": zp}


def _check_quantized(case, dtype, per_channel, seed):
    rng = np.random.default_rng(seed)
    qx = {"scale": float(np.float32(rng.uniform(0.005, 0.1))),
          "zero_point": int(rng.integers(np.iinfo(dtype).min, np.iinfo(dtype).max, endpoint=True))}
    x = random_tensor(rng, case["x_shape"], dtype)
    w, qw = _quant_filter(rng, case, dtype, per_channel)
    bias, qb = None, None
    if case["bias"]:
        bias = rng.integers(-30000, 30000, size=case["oc"], endpoint=True).astype(np.int32)
        bscale = [qx["scale"] * s for s in _filter_scales(case, qw)]
        qb = {"scale": bscale if per_channel else bscale[0],
              "zero_point": [0] * case["oc"] if per_channel else 0}
    qy = _output_quant(rng, case, dtype, x, w, bias, qx, qw, qb)
    assert_matches_tflite(_tfl_model(case, dtype, w, bias, qx, qw, qb, qy), _inputs(case, x, w))


@OP_SETTINGS
@pytest.mark.parametrize("op", OPS)
@given(data=st.data(), seed=SEEDS)
def test_uint8(op, data, seed):
    _check_quantized(data.draw(conv_cases(op)), np.uint8, False, seed)


@OP_SETTINGS
@pytest.mark.parametrize("op", OPS)
@given(data=st.data(), seed=SEEDS)
def test_int8_per_tensor(op, data, seed):
    _check_quantized(data.draw(conv_cases(op)), np.int8, False, seed)


@OP_SETTINGS
@pytest.mark.parametrize("op", OPS)
@given(data=st.data(), seed=SEEDS)
def test_int8_per_channel(op, data, seed):
    case = data.draw(conv_cases(op))
    case["const_w"] = True  # TFLite needs per-channel filters to be constants
    _check_quantized(case, np.int8, True, seed)


# ---- explicit padding, NCHW and uint8 with per-channel filters ---------------------

def _nnapi_explicit(case, x_type, x_shape, q_x, w, w_type, q_w, bias, q_bias_scale, q_y,
                    pads, nchw):
    """A one-op NNAPI model with the explicit-padding signature (layout flag and dilation)."""
    mb = ModelBuilder()
    shape = [x_shape[i] for i in (0, 3, 1, 2)] if nchw else x_shape
    x = mb.add_operand(x_type, shape, **q_x)
    cq = None
    if w_type == QPC:
        cq = SymmPerChannelQuantParams(tuple(q_w["scale"]), _filter_axis(case))
        wq = {}
    else:
        wq = q_w
    wi = mb.add_constant(w_type, w, scale=wq.get("scale", 0.0), zero_point=wq.get("zero_point", 0),
                         channel_quant=cq)
    b_type = F32 if x_type == F32 else I32
    bi = mb.add_constant(b_type, bias, scale=q_bias_scale)
    y = mb.add_operand(x_type, (), **q_y)
    (sh, sw), (dh, dw) = case["stride"], case["dilation"]
    scalars = [*pads, sw, sh]
    if case["op"] == "DEPTHWISE_CONV_2D":
        scalars.append(case["mult"])
    ins = [x, wi, bi, *(mb.add_int32(v) for v in scalars), mb.add_int32(int(case["act"])),
           mb.add_bool(nchw), mb.add_int32(dw), mb.add_int32(dh)]
    mb.add_operation(CONV if case["op"] == "CONV_2D" else DW, ins, [y])
    mb.identify_inputs_and_outputs([x], [y])
    return mb.finish()


@OP_SETTINGS
@pytest.mark.parametrize("op", OPS)
@given(data=st.data(), kind=st.sampled_from(["f32", "u8", "s8pc", "u8pc"]), nchw=st.booleans(),
       seed=SEEDS)
def test_explicit_padding_and_layout(op, data, kind, nchw, seed):
    """Explicit pads (l, r, t, b) equal TFLite VALID on an input padded with the zero point.
    uint8 with a per-channel filter is int8 per-channel shifted by 128 on input and output."""
    case = data.draw(conv_cases(op))
    _, fh, fw, _ = case["w_shape"]
    (sh, sw), (dh, dw) = case["stride"], case["dilation"]
    n, h, wd, c = case["x_shape"]
    eff_h, eff_w = (fh - 1) * dh + 1, (fw - 1) * dw + 1
    pads = [data.draw(st.integers(0, e - 1)) for e in (eff_w, eff_w, eff_h, eff_h)]
    ph, pw = h + pads[2] + pads[3], wd + pads[0] + pads[1]
    if ph < eff_h or pw < eff_w:
        pads = [eff_w - 1, eff_w - 1, eff_h - 1, eff_h - 1]
        ph, pw = h + 2 * eff_h - 2, wd + 2 * eff_w - 2
    padded = dict(case, x_shape=[n, ph, pw, c], padding=Padding.VALID, const_w=True)
    padded["y_shape"] = [n, _out_size(ph, fh, sh, dh, Padding.VALID),
                         _out_size(pw, fw, sw, dw, Padding.VALID), case["oc"]]
    rng = np.random.default_rng(seed)
    np_pads = ((0, 0), (pads[2], pads[3]), (pads[0], pads[1]), (0, 0))
    if kind == "f32":
        x = random_tensor(rng, case["x_shape"], np.float32, -2, 2)
        w = random_tensor(rng, case["w_shape"], np.float32, -1, 1)
        bias = random_tensor(rng, [case["oc"]], np.float32, -2, 2)
        expected = tflite_run(_tfl_model(padded, np.float32, w, bias), [np.pad(x, np_pads)])[0]
        model = _nnapi_explicit(case, F32, case["x_shape"], {}, w, F32, {}, bias, 0.0, {}, pads, nchw)
    else:
        dtype = np.uint8 if kind == "u8" else np.int8
        qx = {"scale": float(np.float32(rng.uniform(0.005, 0.1))),
              "zero_point": int(rng.integers(np.iinfo(dtype).min, np.iinfo(dtype).max, endpoint=True))}
        x = random_tensor(rng, case["x_shape"], dtype)
        w, qw = _quant_filter(rng, case, dtype, per_channel=kind != "u8")
        bias = rng.integers(-30000, 30000, size=case["oc"], endpoint=True).astype(np.int32)
        bscale = [qx["scale"] * s for s in _filter_scales(case, qw)]
        qb = {"scale": bscale if kind != "u8" else bscale[0],
              "zero_point": [0] * case["oc"] if kind != "u8" else 0}
        qy = _output_quant(rng, case, dtype, x, w, bias, qx, qw, qb)
        xp = np.pad(x, np_pads, constant_values=qx["zero_point"])
        expected = tflite_run(_tfl_model(padded, dtype, w, bias, qx, qw, qb, qy), [xp])[0]
        w_type = QU8 if kind == "u8" else QPC
        x_type = QS8 if kind == "s8pc" else QU8
        if kind == "u8pc":  # the same computation on uint8 data
            x, expected, qx, qy = uint8_twin(x, expected, qx, qy)
        model = _nnapi_explicit(case, x_type, case["x_shape"], qx, w, w_type, qw, bias,
                                bscale[0] if kind == "u8" else 0.0, qy, pads, nchw)
    assert_runs_like(model, x, expected, nchw, exact=kind != "f32")


# ---- NNAPI validation ----------------------------------------------------------------

_DEFAULT_SCALARS = {CONV: [1, 1, 1, 0], DW: [1, 1, 1, 2, 0]}  # implicit: SAME, strides, (mult), act


def _nnapi(op=CONV, t=F32, x_shape=(1, 5, 5, 2), w_shape=None, w_type=None, b_type=None,
           b_shape=None, b_scale=None, out_type=None, scalars=None, channel_dim=None):
    """A one-op model; ``scalars`` are ints (INT32) and bools (BOOL) after the three tensors."""
    floats = (F32, F16, I32)
    w_shape = w_shape or ((3, 2, 2, 2) if op == CONV else (1, 2, 2, 4))
    w_type = w_type or t
    oc = w_shape[0] if op == CONV else w_shape[-1]
    mb = ModelBuilder()
    x = mb.add_operand(t, x_shape, **({} if t in floats else {"scale": 0.5, "zero_point": 0}))
    if w_type == QPC:
        dim = channel_dim if channel_dim is not None else (0 if op == CONV else 3)
        cq = SymmPerChannelQuantParams(tuple([0.25] * w_shape[dim]), dim)
        w = mb.add_constant(QPC, np.zeros(w_shape), channel_quant=cq)
    else:
        wq = {} if w_type in floats else {"scale": 0.25, "zero_point": 0}
        w = mb.add_constant(w_type, np.zeros(w_shape), **wq)
    b_type = b_type or (t if t in (F32, F16) else I32)
    if b_scale is None:
        b_scale = 0.0 if b_type != I32 or w_type == QPC else 0.125
    b = mb.add_constant(b_type, np.zeros(b_shape or (oc,)), scale=b_scale)
    out_type = out_type or t
    y = mb.add_operand(out_type, (), **({} if out_type in floats else {"scale": 1.0, "zero_point": 0}))
    ins, model_inputs = [x, w, b], [x]
    for v in _DEFAULT_SCALARS[op] if scalars is None else scalars:
        ins.append(mb.add_bool(v) if isinstance(v, bool) else mb.add_int32(v))
    mb.add_operation(op, ins, [y])
    mb.identify_inputs_and_outputs(model_inputs, [y])
    return mb.finish()


@pytest.mark.parametrize("kwargs, message", [
    ({"scalars": [1, 1]}, "expected 7 or 8 or 10 or 11 or 13 inputs, got 5"),
    ({"scalars": [1, 1, 1, 0, False, 1, 1, 1]},
     "implicit padding signature takes 7 or 8 or 10 inputs, got 11"),
    ({"t": I32}, "input 0 must be of type"),
    ({"t": QU8, "w_type": QS8},
     "input 1 must be of type TENSOR_QUANT8_ASYMM, TENSOR_QUANT8_SYMM_PER_CHANNEL"),
    ({"w_type": QU8}, "input 1 must be of type TENSOR_FLOAT32"),
    ({"t": QS8, "b_type": F32}, "input 2 must be of type TENSOR_INT32"),
    ({"out_type": QU8}, "output 0 must be of type TENSOR_FLOAT32"),
    ({"x_shape": (5, 5, 2)}, "input 0 must be rank 4"),
    ({"w_shape": (3, 2, 2)}, "input 1 must be rank 4"),
    ({"b_shape": (3, 1)}, "input 2 must be rank 1"),
    ({"b_shape": (4,)}, "bias has 4 elements but the filter has 3 output channels"),
    ({"w_shape": (3, 2, 2, 5)}, "filter has 5 input channels but the input has 2"),
    ({"t": QS8, "w_type": QPC, "channel_dim": 3, "w_shape": (3, 2, 2, 3), "x_shape": (1, 5, 5, 3)},
     "per-channel quantization must be along dimension 0, got 3"),
    ({"t": QU8, "b_scale": 0.2}, "bias scale 0.2 must equal input scale * filter scale = 0.125"),
    ({"scalars": [1, 0, 1, 0]}, "strides must be >= 1"),
    ({"scalars": [1, 1, 1, 9]}, "unknown fused activation 9"),
    ({"scalars": [7, 1, 1, 0]}, "unknown implicit padding scheme 7"),
    ({"scalars": [1, 1, 1, 0, 3]}, "input 7 must be of type BOOL"),
    ({"scalars": [1, 1, 1, 0, False, 0, 1]}, "dilation factors must be >= 1"),
    ({"scalars": [-1, 0, 0, 0, 1, 1, 0]}, "paddings must be >= 0"),
    ({"scalars": [2, 0, 0, 0, 1, 1, 0]}, "must be smaller than the dilated filter 2x2"),
    ({"scalars": [2, 1, 1, 0], "x_shape": (1, 1, 1, 2)}, "does not fit the padded input 1x1"),
    ({"op": DW, "scalars": [1, 1, 1, 2]}, "expected 8 or 9 or 11 or 12 or 14 inputs, got 7"),
    ({"op": DW, "w_shape": (2, 2, 2, 4)}, "filter dimension 0 must be 1, got 2"),
    ({"op": DW, "scalars": [1, 1, 1, 3, 0]},
     "output channels 4 must equal input channels 2 * depth multiplier 3"),
    ({"op": DW, "scalars": [1, 1, 1, 0, 0]}, "input 6: depth multiplier must be >= 1, got 0"),
    ({"op": DW, "t": QS8, "w_type": QPC, "channel_dim": 0, "w_shape": (1, 2, 2, 4)},
     "per-channel quantization must be along dimension 3, got 0"),
    ({"op": DW, "t": QU8, "b_scale": 0.5}, "bias scale 0.5 must equal input scale * filter scale"),
    ({"t": F16, "w_type": F32}, "input 1 must be of type TENSOR_FLOAT16, got TENSOR_FLOAT32"),
    ({"op": DW, "t": F16, "b_type": F32}, "input 2 must be of type TENSOR_FLOAT16, got TENSOR_FLOAT32"),
    ({"t": F16, "out_type": F32}, "output 0 must be of type TENSOR_FLOAT16"),
])
def test_validation_errors(kwargs, message):
    op = kwargs.get("op", CONV)
    with pytest.raises(HalError) as e:
        compile_model(_nnapi(**kwargs))
    assert f"operation 0 ({op.name})" in str(e.value)
    assert message in str(e.value)


def test_depthwise_filter_with_more_than_one_row_is_an_invalid_model():
    """NNAPI's depthwise filter is [1, H, W, C*m]: validateModel refuses another first dimension (CTS
    depthwise_conv2d_invalid_filter_dims expects the model to fail)."""
    with pytest.raises(HalError) as e:
        validate_model(_nnapi(DW, w_shape=(2, 2, 2, 4)))
    assert "operation 0 (DEPTHWISE_CONV_2D): filter dimension 0 must be 1, got 2" in str(e.value)


@pytest.mark.parametrize("op, channels", [(CONV, 3), (DW, 4)])
@pytest.mark.parametrize("t", [F32, F16, QU8, QS8])
def test_zero_sized_input(op, channels, t):
    """NNAPI 1.2: a zero-sized input (0 batches, from an operation like BOX_WITH_NMS_LIMIT) gives an
    output with 0 batches."""
    assert run_zero_batch(_nnapi(op, t=t)).shape == (0, 5, 5, channels)


def test_runtime_scalar_parameter():
    """A stride given as a model input is read at execution; the result equals the constant model's."""
    rng = np.random.default_rng(3)
    x = random_tensor(rng, [1, 5, 5, 2], np.float32)
    w = random_tensor(rng, [3, 2, 2, 2], np.float32)
    b = random_tensor(rng, [3], np.float32)

    def model(runtime: bool):
        mb = ModelBuilder()
        xi, y = mb.add_operand(F32, (1, 5, 5, 2)), mb.add_operand(F32, ())
        stride = mb.add_operand(OperandType.INT32) if runtime else mb.add_int32(2)
        ins = [xi, mb.add_constant(F32, w), mb.add_constant(F32, b), mb.add_int32(1), stride, mb.add_int32(2),
               mb.add_int32(0)]
        mb.add_operation(CONV, ins, [y])
        mb.identify_inputs_and_outputs([xi, stride] if runtime else [xi], [y])
        return mb.finish()

    got = execute(compile_model(model(True)), [x, np.array(2, np.int32)])[0]
    static = compile_model(model(False), backend_order=per_operation_order())
    np.testing.assert_array_equal(got, execute(static, [x])[0])


@pytest.mark.parametrize("op, scalars", [
    (CONV, [1, 1, 1, 0]), (CONV, [2, 2, 1, 1, True]), (CONV, [1, 1, 2, 3, False, 2, 1]),
    (CONV, [1, 0, 0, 1, 1, 1, 0]), (CONV, [1, 0, 0, 1, 1, 1, 0, True]),
    (CONV, [0, 1, 1, 0, 2, 1, 0, False, 1, 2]),
    (DW, [1, 1, 1, 2, 0]), (DW, [1, 1, 1, 2, 0, True]), (DW, [2, 2, 1, 2, 1, False, 2, 2]),
    (DW, [1, 1, 0, 0, 1, 1, 2, 0]), (DW, [0, 1, 1, 0, 2, 2, 2, 0, True, 1, 1]),
])
def test_valid_signatures_compile(op, scalars):
    nchw = any(v is True for v in scalars)
    compile_model(_nnapi(op, x_shape=(1, 2, 5, 5) if nchw else (1, 5, 5, 2), scalars=scalars))
    compile_model(_nnapi(op, t=QS8, w_type=QPC, x_shape=(1, 2, 5, 5) if nchw else (1, 5, 5, 2),
                         scalars=scalars))
    compile_model(_nnapi(op, t=F16, x_shape=(1, 2, 5, 5) if nchw else (1, 5, 5, 2), scalars=scalars))


# ---- TFLite variants -----------------------------------------------------------------

def _mapping_error(model: bytes) -> str:
    with pytest.raises(MappingError) as e:
        convert_partition(read_model(model))
    return str(e.value)


def _one_conv(x_shape, w, w_q=None, x_dtype=np.float32, x_q=None, y_shape=None, op="CONV_2D",
              bias=None, b_q=None, opts=None):
    m = TfLiteModelBuilder()
    x = m.add_input("x", x_shape, x_dtype, **(x_q or {}))
    ins = [x, m.add_constant("w", w, **(w_q or {}))]
    if bias is not None:
        ins.append(m.add_constant("b", bias, **(b_q or {})))
    y = m.add_tensor("y", y_shape, x_dtype, **(x_q or {}))
    name = "Conv2DOptions" if op == "CONV_2D" else "DepthwiseConv2DOptions"
    m.add_operator(op, ins, [y], (name, {"padding": Padding.VALID, "stride_w": 1, "stride_h": 1,
                                         **(opts or {})}))
    m.set_outputs([y])
    return m.build()


def test_mapping_refuses_unsupported_variants():
    q = {"scale": 0.5, "zero_point": 0}
    w8 = np.ones((2, 1, 1, 2), np.int8)
    assert "hybrid" in _mapping_error(_one_conv([1, 3, 3, 2], w8, q, y_shape=[1, 3, 3, 2]))
    assert "GROUPED_CONV_2D has none" in _mapping_error(_one_conv(
        [1, 3, 3, 4], np.ones((2, 1, 1, 2), np.float32), y_shape=[1, 3, 3, 2], opts={"dilation_h_factor": 2}))
    assert "does not divide input depth 4" in _mapping_error(_one_conv(
        [1, 3, 3, 4], np.ones((2, 1, 1, 3), np.float32), y_shape=[1, 3, 3, 2]))
    assert "non-zero zero point" in _mapping_error(_one_conv(
        [1, 3, 3, 2], w8, {"scale": 0.5, "zero_point": 3}, np.int8, q, [1, 3, 3, 2]))
    pc = {"scale": [0.5, 0.25], "zero_point": [0, 0], "quantized_dimension": 3}
    assert "NNAPI CONV_2D rejects it: input 1: per-channel quantization must be along dimension 0, got 3" \
        in _mapping_error(_one_conv([1, 3, 3, 2], w8, pc, np.int8, q, [1, 3, 3, 2]))
    assert "is not [1, h, w, k * 3]" in _mapping_error(_one_conv(
        [1, 3, 3, 3], np.ones((1, 1, 1, 4), np.float32), y_shape=[1, 3, 3, 4], op="DEPTHWISE_CONV_2D"))


def test_missing_bias_and_inconsistent_depth_multiplier():
    """CONV_2D without a bias gets a zero bias; DEPTHWISE_CONV_2D takes its multiplier from the
    shapes, not from the (redundant) option."""
    rng = np.random.default_rng(7)
    x = random_tensor(rng, [1, 4, 4, 2], np.float32)
    w = random_tensor(rng, [3, 2, 2, 2], np.float32)
    no_bias = _one_conv([1, 4, 4, 2], w, y_shape=[1, 3, 3, 3])
    zero_bias = _one_conv([1, 4, 4, 2], w, y_shape=[1, 3, 3, 3], bias=np.zeros(3, np.float32))
    assert_float_close(hal_run(no_bias, [x])[0], tflite_run(zero_bias, [x])[0])
    wd = random_tensor(rng, [1, 2, 2, 4], np.float32)
    args = ([1, 4, 4, 2], wd)
    kw = {"y_shape": [1, 3, 3, 4], "op": "DEPTHWISE_CONV_2D", "bias": np.ones(4, np.float32)}
    wrong = _one_conv(*args, **kw, opts={"depth_multiplier": 5})
    right = _one_conv(*args, **kw, opts={"depth_multiplier": 2})
    assert_float_close(hal_run(wrong, [x])[0], tflite_run(right, [x])[0])
