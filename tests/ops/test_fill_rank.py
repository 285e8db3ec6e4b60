"""FILL and RANK vs TFLite (no arithmetic: every type exact), NNAPI's rules and the mapping's
refusals. float16 FILL (no TFLite float16 kernel) is checked against TFLite's float32 FILL of a value
float16 holds exactly; RANK of the operand types TFLite cannot hand over (float16, 16-bit and
symmetric 8-bit quantized) against TFLite's RANK of a float32 tensor of the same shape. RANK's
output is an INT32 scalar: also checked through the real delegate and service."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from delegate import load_delegate
from delegate.mapping import MappingError, convert_partition
from delegate.tfl import TfLiteModelBuilder, read_model
from hal.compiler import compile_model
from hal.errors import HalError
from hal.executor import execute
from hal.model import ModelBuilder, SymmPerChannelQuantParams
from hal.types import OperandType, OperationType
from tests.delegate.helpers import interpreter, run
from tests.harness import OP_SETTINGS, assert_matches_tflite, random_quant_params, random_tensor, tflite_run

F16 = OperandType.TENSOR_FLOAT16
F32 = OperandType.TENSOR_FLOAT32
QU8 = OperandType.TENSOR_QUANT8_ASYMM
QS8 = OperandType.TENSOR_QUANT8_ASYMM_SIGNED
I32 = OperandType.TENSOR_INT32
BOOL8 = OperandType.TENSOR_BOOL8
INT32 = OperandType.INT32
#: TFLite-checked RANK inputs, and those checked against TFLite's RANK of a same-shaped float32 tensor.
RANK_TFLITE = {F32: np.float32, I32: np.int32, QU8: np.uint8, QS8: np.int8, BOOL8: np.bool_}
RANK_OTHER = {F16: (0.0, 0), OperandType.TENSOR_QUANT16_SYMM: (0.25, 0), OperandType.TENSOR_QUANT16_ASYMM: (0.5, 7),
              OperandType.TENSOR_QUANT8_SYMM: (0.125, 0), OperandType.TENSOR_QUANT8_SYMM_PER_CHANNEL: None}
#: FILL's input 0 is its TENSOR_INT32 dims (the tests below fill float32, float16 and int32 outputs).
COVERED = {(OperationType.FILL, I32)} | {(OperationType.RANK, t) for t in (*RANK_TFLITE, *RANK_OTHER)}
SEEDS = st.integers(0, 2**32 - 1)
shapes = st.lists(st.integers(1, 4), min_size=1, max_size=6)


# ---- FILL ------------------------------------------------------------------------------

def _fill_model(shape, value: np.ndarray, dims_dtype=np.int32):
    m = TfLiteModelBuilder()
    d = m.add_constant("d", np.array(shape, dims_dtype))
    v = m.add_constant("v", value)
    y = m.add_tensor("y", shape, value.dtype)
    m.add_operator("FILL", [d, v], [y])
    m.set_outputs([y])
    return m.build()


@pytest.mark.parametrize("dtype", [np.float32, np.int32])
@OP_SETTINGS
@given(shape=shapes, int64_dims=st.booleans(), seed=SEEDS)
def test_fill(dtype, shape, int64_dims, seed):
    """TFLite's value is a 0-D tensor, NNAPI's a scalar of the output type; dims int32 or int64."""
    value = random_tensor(np.random.default_rng(seed), [], dtype, -100, 100)
    assert_matches_tflite(_fill_model(shape, value, np.int64 if int64_dims else np.int32), [])


def _nnapi_fill(out_type, value_type, value, dims, out_shape=(), dims_as_input=False):
    m = ModelBuilder()
    d = np.array(dims, np.int32)
    di = m.add_operand(I32, [0]) if dims_as_input else m.add_constant(I32, d)  # [0]: length not known
    y = m.add_operand(out_type, out_shape)
    m.add_operation(OperationType.FILL, [di, m.add_constant(value_type, value)], [y])
    m.identify_inputs_and_outputs([di] if dims_as_input else [], [y])
    return m.finish()


@OP_SETTINGS
@given(shape=shapes, seed=SEEDS)
def test_fill_float16_is_tflites_float32_result(shape, seed):
    value = np.float16(np.random.default_rng(seed).uniform(-100, 100))
    want = tflite_run(_fill_model(shape, np.array(value, np.float32)), [])[0]
    got = execute(compile_model(_nnapi_fill(F16, OperandType.FLOAT16, value, shape)), [])[0]
    assert got.dtype == np.float16
    np.testing.assert_array_equal(got, want.astype(np.float16))


def test_fill_dims_given_as_a_model_input():
    """The oracle is the same operation with constant dims (the path TFLite checks)."""
    compiled = compile_model(_nnapi_fill(I32, INT32, 7, [1], dims_as_input=True))
    for dims in ([2, 3], [4], [1, 2, 1, 3]):
        want = execute(compile_model(_nnapi_fill(I32, INT32, 7, dims)), [])[0]
        np.testing.assert_array_equal(execute(compiled, [np.array(dims, np.int32)])[0], want)


def _fails(model, text):
    with pytest.raises(HalError, match=text):
        compile_model(model)


def test_fill_rules():
    _fails(_nnapi_fill(F32, INT32, 1, [2]), "input 1 must be of type FLOAT32, got INT32")
    _fails(_nnapi_fill(F16, OperandType.FLOAT32, 1.0, [2]), "input 1 must be of type FLOAT16, got FLOAT32")
    _fails(_nnapi_fill(I32, OperandType.FLOAT32, 1.0, [2]), "input 1 must be of type INT32, got FLOAT32")
    _fails(_nnapi_fill(BOOL8, INT32, 1, [2]), "output 0 must be of type TENSOR_FLOAT16, TENSOR_FLOAT32, TENSOR_INT32")
    _fails(_nnapi_fill(F32, OperandType.FLOAT32, 1.0, [2, -1]), r"input 0 \(dims\) must be non-negative")
    _fails(_nnapi_fill(F32, OperandType.FLOAT32, 1.0, [[2]]), r"input 0 \(dims\) must be 1-D")
    _fails(_nnapi_fill(F32, OperandType.FLOAT32, 1.0, [2], out_shape=[3]), "incompatible with the computed shape")


# ---- RANK ------------------------------------------------------------------------------

def _rank_model(shape, dtype, q):
    m = TfLiteModelBuilder()
    x = m.add_input("x", shape, dtype, **q)
    y = m.add_tensor("y", [], np.int32)
    m.add_operator("RANK", [x], [y])
    m.set_outputs([y])
    return m.build()


@pytest.mark.parametrize("t", list(RANK_TFLITE), ids=lambda t: t.name)
@OP_SETTINGS
@given(shape=shapes, seed=SEEDS)
def test_rank(t, shape, seed):
    """TFLite's output is a 0-D int32 tensor; NNAPI's an INT32 scalar: the same 0-d array."""
    rng = np.random.default_rng(seed)
    dtype = RANK_TFLITE[t]
    q = random_quant_params(rng, dtype) if t in (QU8, QS8) else {}
    x = rng.integers(0, 2, size=shape).astype(np.bool_) if t == BOOL8 else random_tensor(rng, shape, dtype)
    assert assert_matches_tflite(_rank_model(shape, dtype, q), [x])[0].shape == ()


def _nnapi_rank(t, shape, out_type=INT32):
    m = ModelBuilder()
    q = RANK_OTHER.get(t) or (0.0, 0)
    cq = SymmPerChannelQuantParams((0.5,) * shape[0], 0) if t == OperandType.TENSOR_QUANT8_SYMM_PER_CHANNEL else None
    x = m.add_operand(t, shape, *q, channel_quant=cq)
    y = m.add_operand(out_type, ())
    m.add_operation(OperationType.RANK, [x], [y])
    m.identify_inputs_and_outputs([x], [y])
    return m.finish()


@pytest.mark.parametrize("t", list(RANK_OTHER), ids=lambda t: t.name)
@OP_SETTINGS
@given(shape=shapes, seed=SEEDS)
def test_rank_of_other_types_is_tflites_float32_rank(t, shape, seed):
    from hal.types import NUMPY_DTYPE
    want = tflite_run(_rank_model(shape, np.float32, {}), [np.zeros(shape, np.float32)])[0]
    x = random_tensor(np.random.default_rng(seed), shape, NUMPY_DTYPE[t])
    got = execute(compile_model(_nnapi_rank(t, shape)), [x])[0]
    assert got.shape == () and got.dtype == np.int32 and got == want


def test_rank_rules():
    _fails(_nnapi_rank(F32, [2], out_type=I32), "output 0 must be of type INT32, got TENSOR_INT32")
    _fails(_nnapi_rank(OperandType.TENSOR_QUANT8_SYMM_PER_CHANNEL, [2], out_type=OperandType.FLOAT32),
           "output 0 must be of type INT32")


def test_rank_through_the_delegate(server):
    """The scalar output travels as NNAPI's INT32 model output and lands in TFLite's 0-D tensor."""
    m = TfLiteModelBuilder()
    x = m.add_input("x", [2, 3, 4], np.float32)
    t = m.add_tensor("t", [4, 3, 2], np.float32)
    m.add_operator("TRANSPOSE", [x, m.add_constant("p", np.array([2, 1, 0], np.int32))], [t])
    y = m.add_tensor("y", [], np.int32)
    m.add_operator("RANK", [t], [y])
    m.set_outputs([y, t])
    model = m.build()
    d = load_delegate(server.address)
    it, ref = interpreter(model, d), interpreter(model)
    xs = [random_tensor(np.random.default_rng(0), [2, 3, 4], np.float32)]
    for g, w in zip(run(it, xs), run(ref, xs), strict=True):
        assert np.shape(g) == np.shape(w) and np.asarray(g).dtype == np.asarray(w).dtype
        np.testing.assert_array_equal(g, w)
    assert d.report.delegated == 2 and d.report.partitions == [[0, 1]]


# ---- TFLite variants NNAPI cannot express ----------------------------------------------

def _refused(model, text):
    with pytest.raises(MappingError, match=text):
        convert_partition(read_model(model))


def test_mapping_refusals():
    m = TfLiteModelBuilder()
    d = m.add_constant("d", np.array([2], np.int32))
    v = m.add_input("v", [], np.float32)
    y = m.add_tensor("y", [2], np.float32)
    m.add_operator("FILL", [d, v], [y])
    m.set_outputs([y])
    # a non-constant scalar value: NNAPI's FILL takes it as a scalar operand, so it must be a constant
    _refused(m.build(), r"value \(input 1\) must be a constant: NNAPI takes it as a scalar operand")
    _refused(_fill_model([], np.array(1.0, np.float32)), "NNAPI has no rank-0 tensor")
    m = TfLiteModelBuilder()
    d = m.add_constant("d", np.array([2], np.int32))
    v = m.add_constant("v", np.array(1, np.int8), scale=0.5, zero_point=0)
    y = m.add_tensor("y", [2], np.int8, scale=0.5, zero_point=0)
    m.add_operator("FILL", [d, v], [y])
    m.set_outputs([y])
    _refused(m.build(), "NNAPI FILL outputs TENSOR_FLOAT32, TENSOR_FLOAT16 or TENSOR_INT32")
