"""FULLY_CONNECTED vs TFLite (BUILTIN_REF): float32 within tolerance, uint8/int8 bit-exact;
plus the TFLite variants that must not be delegated and NNAPI validation errors."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from delegate.mapping import MappingError, convert_partition
from delegate.tfl import TfLiteModelBuilder, read_model
from delegate.tfl.schema import ActivationFunctionType as Act
from hal.compiler import compile_model
from hal.errors import HalError
from hal.model import ModelBuilder
from hal.types import OperandType, OperationType
from tests.harness import OP_SETTINGS, assert_matches_tflite, random_quant_params, random_tensor
from tests.ops._conv_util import run_zero_batch

F32 = OperandType.TENSOR_FLOAT32
F16 = OperandType.TENSOR_FLOAT16
I32 = OperandType.TENSOR_INT32
QU8 = OperandType.TENSOR_QUANT8_ASYMM
QS8 = OperandType.TENSOR_QUANT8_ASYMM_SIGNED
FC = OperationType.FULLY_CONNECTED

COVERED = {(FC, F32), (FC, QU8), (FC, QS8)}

ACTS = [Act.NONE, Act.RELU, Act.RELU_N1_TO_1, Act.RELU6]


@st.composite
def fc_cases(draw):
    """(input shape, batch, input_size, num_units, keep_num_dims, bias?, constant weights?, act)."""
    batch, k, units = draw(st.integers(1, 6)), draw(st.integers(1, 40)), draw(st.integers(1, 12))
    lead = draw(st.sampled_from([[batch], [1, batch], [batch, 1, 1]]))
    in_shape = lead + [k]
    if len(in_shape) == 2 and batch * k % 2 == 0 and draw(st.booleans()):
        in_shape = [2, batch * k // 2]  # flattened by input_size, not by the last dimension
    keep = len(in_shape) == 2 and in_shape[1] == k and draw(st.booleans())
    return (in_shape, batch, k, units, keep, draw(st.booleans()), draw(st.booleans()),
            draw(st.sampled_from(ACTS)))


def _model(dtype, case, w, bias, qx=None, qw=None, qb=None, qy=None):
    in_shape, batch, k, units, keep, _, const_w, act = case
    m = TfLiteModelBuilder()
    x = m.add_input("x", in_shape, dtype, **(qx or {}))
    wt = m.add_constant("w", w, **(qw or {})) if const_w else m.add_input("w", w.shape, dtype, **(qw or {}))
    b = -1 if bias is None else m.add_constant("b", bias, **(qb or {}))
    y = m.add_tensor("y", [batch, units], dtype, **(qy or {}))
    m.add_operator("FULLY_CONNECTED", [x, wt, b], [y],
                   ("FullyConnectedOptions", {"fused_activation_function": act, "keep_num_dims": keep}))
    m.set_outputs([y])
    return m.build()


def _inputs(x, w, const_w):
    return [x] if const_w else [x, w]


@OP_SETTINGS
@given(case=fc_cases(), seed=st.integers(0, 2**32 - 1))
def test_fully_connected_float32(case, seed):
    rng = np.random.default_rng(seed)
    in_shape, _, k, units, _, has_bias, const_w, _ = case
    x = random_tensor(rng, in_shape, np.float32, -2, 2)
    w = random_tensor(rng, [units, k], np.float32, -1, 1)
    bias = random_tensor(rng, [units], np.float32, -2, 2) if has_bias else None
    assert_matches_tflite(_model(np.float32, case, w, bias), _inputs(x, w, const_w))


def _output_quant(rng, dtype, x, w, bias, qx, qw):
    """Output scale covering the real accumulator range (so results are not all saturated)."""
    k = w.shape[1]
    xr = x.reshape(-1, k).astype(np.float64) - qx["zero_point"]
    wr = w.astype(np.float64) - qw["zero_point"]
    real = (xr @ wr.T + (0 if bias is None else bias)) * qx["scale"] * qw["scale"]
    span = max(float(real.max() - real.min()), 1e-3) * rng.uniform(0.3, 1.5)
    info = np.iinfo(dtype)
    scale = float(np.float32(span / 255))
    zp = int(np.clip(round(info.min - real.min() / scale * rng.uniform(0.6, 1.0)), info.min, info.max))
    return {"scale": scale, "zero_point": zp}


@OP_SETTINGS
@given(case=fc_cases(), dtype=st.sampled_from([np.uint8, np.int8]), seed=st.integers(0, 2**32 - 1))
def test_fully_connected_quant8(case, dtype, seed):
    rng = np.random.default_rng(seed)
    in_shape, _, k, units, _, has_bias, const_w, _ = case
    qx = random_quant_params(rng, dtype)
    qw = random_quant_params(rng, dtype, scale_range=(0.001, 0.05))
    x, w = random_tensor(rng, in_shape, dtype), random_tensor(rng, [units, k], dtype)
    bias = rng.integers(-20000, 20000, size=units, endpoint=True).astype(np.int32) if has_bias else None
    # TFLite checks bias_scale against input_scale * weights_scale (product in double).
    qb = {"scale": qx["scale"] * qw["scale"], "zero_point": 0}
    qy = _output_quant(rng, dtype, x, w, bias, qx, qw)
    assert_matches_tflite(_model(dtype, case, w, bias, qx, qw, qb, qy), _inputs(x, w, const_w))


# ---- TFLite variants that are not delegated --------------------------------------------------

def _mapping_error(model: bytes) -> str:
    with pytest.raises(MappingError) as e:
        convert_partition(read_model(model))
    return str(e.value)


@pytest.mark.parametrize("in_shape", [[2, 3, 4], [1, 1, 1, 4], [2, 1, 3, 4]])
@pytest.mark.parametrize("act", [Act.NONE, Act.RELU6])
def test_keep_num_dims_of_a_float_rank_n_input(in_shape, act):
    """TFLite keeps the leading dimensions (Keras' Dense on a 4-D tensor): FC + RESHAPE."""
    rng = np.random.default_rng(len(in_shape))
    m = TfLiteModelBuilder()
    x = m.add_input("x", in_shape)
    w = m.add_constant("w", random_tensor(rng, [5, in_shape[-1]], np.float32, -1, 1))
    b = m.add_constant("b", random_tensor(rng, [5], np.float32, -1, 1))
    y = m.add_tensor("y", in_shape[:-1] + [5])
    m.add_operator("FULLY_CONNECTED", [x, w, b], [y],
                   ("FullyConnectedOptions", {"keep_num_dims": True, "fused_activation_function": act}))
    m.set_outputs([y])
    ops = [op.type for op in convert_partition(read_model(m.build())).model.main.operations]
    assert ops == [FC, OperationType.RESHAPE]
    assert_matches_tflite(m.build(), [random_tensor(rng, in_shape, np.float32, -2, 2)])


def test_keep_num_dims_quantized_rank3_not_mapped():
    """TFLite 2.14's quantized reference kernels compute only dims(0) rows of such an output."""
    m = TfLiteModelBuilder()
    q = {"scale": 0.1, "zero_point": 0}
    x = m.add_input("x", [2, 3, 4], np.int8, **q)
    w = m.add_constant("w", np.ones((5, 4), np.int8), **q)
    y = m.add_tensor("y", [2, 3, 5], np.int8, **q)
    m.add_operator("FULLY_CONNECTED", [x, w, -1], [y], ("FullyConnectedOptions", {"keep_num_dims": True}))
    m.set_outputs([y])
    assert "keep_num_dims" in _mapping_error(m.build())


def test_per_channel_weights_are_mapped():
    """Mapped as RESHAPE + 1x1 CONV_2D + RESHAPE, or in LiteRT to com.nnhal.litert's double
    requantization (tests/delegate/test_quantized_rewrites.py)."""
    m = TfLiteModelBuilder()
    x = m.add_input("x", [2, 4], np.int8, scale=0.1, zero_point=0)
    w = m.add_constant("w", np.ones((3, 4), np.int8), scale=[0.1, 0.2, 0.3], zero_point=[0, 0, 0])
    b = m.add_constant("b", np.zeros(3, np.int32), scale=[0.01, 0.02, 0.03], zero_point=[0, 0, 0])
    y = m.add_tensor("y", [2, 3], np.int8, scale=0.5, zero_point=0)
    m.add_operator("FULLY_CONNECTED", [x, w, b], [y], ("FullyConnectedOptions", {}))
    m.set_outputs([y])
    assert_matches_tflite(m.build(), [np.arange(-4, 4, dtype=np.int8).reshape(2, 4) * 9])


def test_hybrid_not_mapped():
    m = TfLiteModelBuilder()
    x = m.add_input("x", [2, 4])
    w = m.add_constant("w", np.ones((3, 4), np.int8), scale=0.1, zero_point=0)
    y = m.add_tensor("y", [2, 3])
    m.add_operator("FULLY_CONNECTED", [x, w, -1], [y], ("FullyConnectedOptions", {}))
    m.set_outputs([y])
    assert "hybrid" in _mapping_error(m.build())


# ---- NNAPI validation ------------------------------------------------------------------------

def _nnapi_fc(x_shape=(2, 4), w_shape=(3, 4), b_shape=(3,), t=F32, w_type=None, b_type=None,
              act=0, n_inputs=4, b_scale=None, out_type=None):
    floats = (F32, F16, I32)
    q = {} if t in floats else {"scale": 0.5, "zero_point": 0}
    mb = ModelBuilder()
    x = mb.add_operand(t, x_shape, **q)
    w_type = w_type or t
    wq = {} if w_type in floats else {"scale": 0.25, "zero_point": 0}
    w = mb.add_constant(w_type, np.zeros(w_shape), **wq)
    b_type = b_type or (t if t in (F32, F16) else I32)
    bq = {} if b_type != I32 else {"scale": 0.125 if b_scale is None else b_scale}
    b = mb.add_constant(b_type, np.zeros(b_shape), **bq)
    out_type = out_type or t
    y = mb.add_operand(out_type, (), **({} if out_type in floats else {"scale": 1.0, "zero_point": 0}))
    ins = [x, w, b, mb.add_int32(act)][:n_inputs]
    mb.add_operation(FC, ins, [y])
    mb.identify_inputs_and_outputs([x], [y])
    return mb.finish()


@pytest.mark.parametrize("kwargs, message", [
    ({"n_inputs": 3}, "expected 4 inputs, got 3"),
    ({"t": I32}, "input 0 must be of type"),
    ({"w_type": QU8}, "input 1 must be of type TENSOR_FLOAT32"),
    ({"t": QU8, "b_type": F32}, "input 2 must be of type TENSOR_INT32"),
    ({"out_type": QU8}, "output 0 must be of type TENSOR_FLOAT32"),
    ({"x_shape": (8,)}, "input 0 must have rank >= 2"),
    ({"w_shape": (3, 4, 1)}, "input 1 must be rank 2"),
    ({"b_shape": (3, 1)}, "input 2 must be rank 1"),
    ({"b_shape": (5,)}, "bias has 5 elements but weights have 3 units"),
    ({"x_shape": (2, 5)}, "not a multiple of input_size 4"),
    ({"act": 7}, "unknown fused activation 7"),
    ({"t": QS8, "b_scale": 0.2}, "bias scale 0.2 must equal input scale * weights scale"),
    ({"t": F16, "w_type": F32}, "input 1 must be of type TENSOR_FLOAT16, got TENSOR_FLOAT32"),
    ({"t": F16, "b_type": F32}, "input 2 must be of type TENSOR_FLOAT16, got TENSOR_FLOAT32"),
])
def test_validation_errors(kwargs, message):
    with pytest.raises(HalError) as e:
        compile_model(_nnapi_fc(**kwargs))
    assert "operation 0 (FULLY_CONNECTED)" in str(e.value)
    assert message in str(e.value)


def test_valid_models_compile():
    compile_model(_nnapi_fc())
    compile_model(_nnapi_fc(t=F16))
    compile_model(_nnapi_fc(t=QU8))
    compile_model(_nnapi_fc(t=QS8, x_shape=(1, 2, 6), w_shape=(3, 12)))


@pytest.mark.parametrize("t", [F32, F16, QU8, QS8])
def test_zero_sized_input(t):
    """NNAPI 1.2: a zero-sized input (0 batches, from an operation like BOX_WITH_NMS_LIMIT) gives a
    [0, num_units] output."""
    out = run_zero_batch(_nnapi_fc(t=t, x_shape=(2, 2, 6), w_shape=(3, 12)))
    assert out.shape == (0, 3)
