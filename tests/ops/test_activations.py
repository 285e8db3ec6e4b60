"""RELU, RELU1, RELU6, LOGISTIC, TANH, HARD_SWISH vs TFLite (float within tolerance, 8-bit
bit-exact with the reference kernels; float16 against TFLite's float32 kernels on the same values,
rounded to half once as NNAPI's CPU path does), plus NNAPI signature checks and mapping refusals."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from delegate.mapping import MappingError, convert_partition
from delegate.tfl import TfLiteModelBuilder, read_model
from hal.compiler import compile_model
from hal.errors import HalError
from hal.executor import execute
from hal.model import ModelBuilder
from hal.types import OperandType, OperationType
from tests.harness import (
    OP_SETTINGS,
    assert_float_close,
    assert_matches_tflite,
    random_quant_params,
    random_tensor,
    tflite_run,
)

F32 = OperandType.TENSOR_FLOAT32
F16 = OperandType.TENSOR_FLOAT16
QU8 = OperandType.TENSOR_QUANT8_ASYMM
QS8 = OperandType.TENSOR_QUANT8_ASYMM_SIGNED

#: TFLite builtin -> NNAPI operation.
OPS = {"RELU": OperationType.RELU, "RELU_N1_TO_1": OperationType.RELU1,
       "RELU6": OperationType.RELU6, "LOGISTIC": OperationType.LOGISTIC,
       "TANH": OperationType.TANH, "HARD_SWISH": OperationType.HARD_SWISH}
RELUS = ["RELU", "RELU_N1_TO_1", "RELU6"]
#: NNAPI's fixed output quantization for LOGISTIC / TANH.
FIXED_OUT = {("LOGISTIC", np.uint8): (1 / 256, 0), ("LOGISTIC", np.int8): (1 / 256, -128),
             ("TANH", np.uint8): (1 / 128, 128), ("TANH", np.int8): (1 / 128, 0)}

COVERED = {(op, t) for op in OPS.values() for t in (F32, F16, QU8, QS8)}

shapes = st.lists(st.integers(1, 6), min_size=1, max_size=4)


def _model(op, dtype, shape, qi=None, qo=None):
    m = TfLiteModelBuilder()
    x = m.add_input("x", shape, dtype, **(qi or {}))
    y = m.add_tensor("y", shape, dtype, **(qo or {}))
    m.add_operator(op, [x], [y])
    m.set_outputs([y])
    return m.build()


@OP_SETTINGS
@given(op=st.sampled_from(list(OPS)), shape=shapes, seed=st.integers(0, 2**32 - 1))
def test_activation_float32(op, shape, seed):
    rng = np.random.default_rng(seed)
    assert_matches_tflite(_model(op, np.float32, shape),
                          [random_tensor(rng, shape, np.float32, -8, 8)])


@OP_SETTINGS
@given(op=st.sampled_from(RELUS), shape=shapes, dtype=st.sampled_from([np.uint8, np.int8]),
       seed=st.integers(0, 2**32 - 1))
def test_relu_family_quant8(op, shape, dtype, seed):
    """NNAPI keeps the input quantization on the output."""
    rng = np.random.default_rng(seed)
    q = random_quant_params(rng, dtype, (0.001, 0.5))
    assert_matches_tflite(_model(op, dtype, shape, q, q), [random_tensor(rng, shape, dtype)])


@OP_SETTINGS
@given(op=st.sampled_from(["LOGISTIC", "TANH"]), shape=shapes,
       dtype=st.sampled_from([np.uint8, np.int8]), seed=st.integers(0, 2**32 - 1))
def test_logistic_tanh_quant8(op, shape, dtype, seed):
    rng = np.random.default_rng(seed)
    qi = random_quant_params(rng, dtype, (0.001, 1.0))
    scale, zp = FIXED_OUT[(op, dtype)]
    model = _model(op, dtype, shape, qi, {"scale": scale, "zero_point": zp})
    assert_matches_tflite(model, [random_tensor(rng, shape, dtype)])


@pytest.mark.parametrize("op", ["LOGISTIC", "TANH"])
@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_logistic_tanh_quant8_every_input_value(op, dtype):
    """The whole 256-entry table, over input scales from tiny to saturating."""
    info = np.iinfo(dtype)
    x = np.arange(info.min, info.max + 1, dtype=dtype)
    scale, zp = FIXED_OUT[(op, dtype)]
    for in_scale in (1e-4, 0.00390625, 0.02, 0.0625, 0.1, 0.37, 1.5):
        qi = {"scale": in_scale, "zero_point": int(info.min + 100)}
        model = _model(op, dtype, [256], qi, {"scale": scale, "zero_point": zp})
        assert_matches_tflite(model, [x])


@OP_SETTINGS
@given(shape=st.lists(st.integers(1, 6), min_size=1, max_size=5),
       dtype=st.sampled_from([np.uint8, np.int8]), seed=st.integers(0, 2**32 - 1))
def test_hard_swish_quant8(shape, dtype, seed):
    """Output scale from 1/100 to 5000 times the input scale: the large ratios reach
    TFLite's int16 RoundingDivideByPOT with shifts >= 16, reproduced as TFLite computes it."""
    rng = np.random.default_rng(seed)
    qi = random_quant_params(rng, dtype, (0.0005, 0.5))
    out_scale = float(np.float32(qi["scale"] * np.exp(rng.uniform(np.log(0.01), np.log(5000)))))
    qo = {"scale": out_scale, "zero_point": random_quant_params(rng, dtype)["zero_point"]}
    assert_matches_tflite(_model("HARD_SWISH", dtype, shape, qi, qo),
                          [random_tensor(rng, shape, dtype)])


def test_hard_swish_quant8_every_input_value():
    for dtype in (np.uint8, np.int8):
        info = np.iinfo(dtype)
        x = np.arange(info.min, info.max + 1, dtype=dtype)
        for in_scale, out_scale, zo in ((0.05, 0.03, 10), (0.02, 0.02, -5), (0.1, 0.0008, 0),
                                        (1e-5, 0.3, 3), (0.5, 0.01, 100)):
            qi = {"scale": in_scale, "zero_point": int(info.min + 128)}
            qo = {"scale": out_scale, "zero_point": int(np.clip(zo, info.min, info.max))}
            assert_matches_tflite(_model("HARD_SWISH", dtype, [256], qi, qo), [x])


@OP_SETTINGS
@given(op=st.sampled_from(list(OPS)), shape=shapes, seed=st.integers(0, 2**32 - 1))
def test_activation_float16(op, shape, seed):
    """TFLite has no float16 kernels: its float32 result on the same (half) values, rounded to half,
    is what a float16 operation computed in float32 and rounded once gives (within one half ulp)."""
    rng = np.random.default_rng(seed)
    x = random_tensor(rng, shape, np.float32, -8, 8).astype(np.float16)
    want = tflite_run(_model(op, np.float32, shape), [x.astype(np.float32)])[0].astype(np.float16)
    got = execute(compile_model(_nnapi(OPS[op], F16, tuple(shape))), [x])[0]
    assert got.dtype == np.float16 and got.shape == want.shape
    assert_float_close(got.astype(np.float32), want.astype(np.float32), rtol=2**-10)


def _zero_sized_model(op, dtype, q=None, qo=None):
    """x [2, 3] -> STRIDED_SLICE -> z [0, 3] -> op -> y [0, 3]."""
    m = TfLiteModelBuilder()
    x, z = m.add_input("x", [2, 3], dtype, **(q or {})), m.add_tensor("z", [0, 3], dtype, **(q or {}))
    ends = [m.add_constant(n, np.array(v, np.int32)) for n, v in (("b", [1, 0]), ("e", [1, 3]), ("s", [1, 1]))]
    m.add_operator("STRIDED_SLICE", [x, *ends], [z], ("StridedSliceOptions", {}))
    y = m.add_tensor("y", [0, 3], dtype, **(qo or q or {}))
    m.add_operator(op, [z], [y])
    m.set_outputs([y])
    return m.build()


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("dtype", [np.float32, np.uint8, np.int8])
def test_zero_sized_input(op, dtype):
    """NNAPI 1.2: every activation takes a zero-sized input (and gives a zero-sized output)."""
    q = qo = None if dtype == np.float32 else {"scale": 0.05, "zero_point": 2}
    if (op, dtype) in FIXED_OUT:
        qo = dict(zip(("scale", "zero_point"), FIXED_OUT[(op, dtype)]))
    x = random_tensor(np.random.default_rng(0), [2, 3], dtype)
    assert assert_matches_tflite(_zero_sized_model(op, dtype, q, qo), [x])[0].shape == (0, 3)


# ---- NNAPI signature checks --------------------------------------------------

def _nnapi(op, in_type=F32, shape=(2, 3), out_type=None, in_q=(0.0, 0), out_q=None,
           extra_inputs=0):
    b = ModelBuilder()
    x = b.add_operand(in_type, shape, *in_q)
    out_q = in_q if out_q is None else out_q
    y = b.add_operand(in_type if out_type is None else out_type, shape, *out_q)
    extra = [b.add_int32(0) for _ in range(extra_inputs)]
    b.add_operation(op, [x, *extra], [y])
    b.identify_inputs_and_outputs([x], [y])
    return b.finish()


def _fails(model, text):
    with pytest.raises(HalError, match=text):
        compile_model(model)


@pytest.mark.parametrize("op", list(OPS.values()))
def test_wrong_input_count(op):
    _fails(_nnapi(op, extra_inputs=1), r"\(.*\): expected 1 inputs, got 2")


@pytest.mark.parametrize("op", list(OPS.values()))
def test_wrong_input_type(op):
    _fails(_nnapi(op, in_type=OperandType.TENSOR_INT32), "input 0 must be of type TENSOR_FLOAT32, TENSOR_FLOAT16, "
                                                          "TENSOR_QUANT8_ASYMM, TENSOR_QUANT8_ASYMM_SIGNED, got")


@pytest.mark.parametrize("op", list(OPS.values()))
def test_float16_output_type_must_match(op):
    _fails(_nnapi(op, in_type=F16, out_type=F32), "output 0 must be of type TENSOR_FLOAT16, got TENSOR_FLOAT32")


@pytest.mark.parametrize("op", list(OPS.values()))
def test_output_type_must_match(op):
    _fails(_nnapi(op, out_type=QU8, out_q=(0.5, 0)), "output 0 must be of type TENSOR_FLOAT32")


@pytest.mark.parametrize("op", [OperationType.RELU, OperationType.RELU1, OperationType.RELU6,
                                OperationType.LOGISTIC, OperationType.TANH])
def test_rank_above_four(op):
    _fails(_nnapi(op, shape=(1, 2, 1, 2, 2)), "rank <= 4, got 5")


@pytest.mark.parametrize("op", [OperationType.RELU, OperationType.RELU1, OperationType.RELU6])
def test_relu_quantization_must_match(op):
    _fails(_nnapi(op, QS8, in_q=(0.5, 1), out_q=(0.25, 1)),
           "RELU.*output 0 quantization .* must equal input 0 quantization")


@pytest.mark.parametrize("op,t,bad", [
    (OperationType.LOGISTIC, QU8, (1 / 128, 0)), (OperationType.LOGISTIC, QS8, (1 / 256, 0)),
    (OperationType.TANH, QU8, (1 / 128, 0)), (OperationType.TANH, QS8, (1 / 256, 0))])
def test_fixed_output_quantization(op, t, bad):
    _fails(_nnapi(op, t, in_q=(0.1, 0), out_q=bad), "output 0 quantization must be scale=")


def test_hard_swish_rejects_output_scale_too_small():
    _fails(_nnapi(OperationType.HARD_SWISH, QU8, in_q=(1.0, 0), out_q=(0.001, 0)),
           "HARD_SWISH.*too large for output scale")


# ---- TFLite variants NNAPI cannot express ------------------------------------

def _convert(model):
    return convert_partition(read_model(model))


def test_relu_with_requantization_is_not_nnapi_relu():
    """It maps to nnhal's com.nnhal.tflite:RELU_REQUANTIZED instead (tests/ops/test_relu_requantized.py)."""
    q1, q2 = {"scale": 0.1, "zero_point": 3}, {"scale": 0.2, "zero_point": 3}
    (op,) = _convert(_model("RELU", np.int8, [4], q1, q2)).model.main.operations
    assert op.type >> 16 != 0


def test_mapping_refuses_other_logistic_output_quantization():
    q1, q2 = {"scale": 0.1, "zero_point": 3}, {"scale": 1 / 256, "zero_point": 0}
    with pytest.raises(MappingError, match="NNAPI LOGISTIC rejects it: output 0 quantization must be scale="):
        _convert(_model("LOGISTIC", np.int8, [4], q1, q2))


def test_mapping_refuses_rank_five():
    with pytest.raises(MappingError, match="rank <= 4"):
        _convert(_model("TANH", np.float32, [1, 1, 2, 1, 2]))
