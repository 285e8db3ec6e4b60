"""QUANTIZE, DEQUANTIZE, CAST vs TFLite (reference kernels): 8-bit results bit-exact, float
results exact too (each is one correctly rounded operation in both).

NNAPI variants a TFLite model cannot express (QUANTIZE of float16, DEQUANTIZE of
TENSOR_QUANT8_SYMM, CAST of quantized or 1.3 identity-only types) are NNAPI models built
directly and compared with the TFLite op that computes the same values. Where NNAPI and
TFLite legitimately differ (out-of-range conversions, which are undefined behaviour in
TFLite's C++), the expected values are AOSP's reference semantics, as each test says.
"""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from delegate.mapping import MappingError, convert_partition
from delegate.tfl import TfLiteModelBuilder, read_model
from delegate.tfl.schema import TensorType
from hal.compiler import compile_model
from hal.errors import HalError
from hal.executor import execute
from hal.model import ModelBuilder, SymmPerChannelQuantParams
from hal.types import OperandType as T
from hal.types import OperationType as O
from tests.harness import OP_SETTINGS, assert_matches_tflite, random_quant_params, random_tensor, tflite_run

COVERED = ({(O.QUANTIZE, T.TENSOR_FLOAT32), (O.QUANTIZE, T.TENSOR_FLOAT16)}
           | {(O.DEQUANTIZE, t) for t in (T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM_SIGNED,
                                          T.TENSOR_QUANT8_SYMM, T.TENSOR_QUANT8_SYMM_PER_CHANNEL)}
           | {(O.CAST, t) for t in (T.TENSOR_FLOAT32, T.TENSOR_FLOAT16, T.TENSOR_INT32, T.TENSOR_QUANT8_ASYMM,
                                    T.TENSOR_BOOL8, T.TENSOR_QUANT16_ASYMM, T.TENSOR_QUANT16_SYMM,
                                    T.TENSOR_QUANT8_ASYMM_SIGNED, T.TENSOR_QUANT8_SYMM)})

shapes = st.lists(st.integers(1, 6), min_size=1, max_size=4)
seeds = st.integers(0, 2**32 - 1)

#: NNAPI type -> (numpy dtype, TFLite tensor type) of its raw values.
RAW = {T.TENSOR_FLOAT32: (np.float32, TensorType.FLOAT32), T.TENSOR_FLOAT16: (np.float16, TensorType.FLOAT16),
       T.TENSOR_INT32: (np.int32, TensorType.INT32), T.TENSOR_QUANT8_ASYMM: (np.uint8, TensorType.UINT8),
       T.TENSOR_BOOL8: (np.bool_, TensorType.BOOL), T.TENSOR_QUANT16_ASYMM: (np.uint16, TensorType.UINT16),
       T.TENSOR_QUANT16_SYMM: (np.int16, TensorType.INT16), T.TENSOR_QUANT8_ASYMM_SIGNED: (np.int8, TensorType.INT8),
       T.TENSOR_QUANT8_SYMM: (np.int8, TensorType.INT8)}
#: Quantization NNAPI requires of each type (CAST ignores it).
QPARAMS = {T.TENSOR_QUANT8_ASYMM: {"scale": 0.5, "zero_point": 3}, T.TENSOR_QUANT16_ASYMM: {"scale": 0.25},
           T.TENSOR_QUANT16_SYMM: {"scale": 0.125}, T.TENSOR_QUANT8_ASYMM_SIGNED: {"scale": 2.0, "zero_point": -7},
           T.TENSOR_QUANT8_SYMM: {"scale": 0.75}}


def one_op(op, shape, in_dtype, out_dtype, qin=None, qout=None, const_input=None):
    b = TfLiteModelBuilder()
    if const_input is None:
        x = b.add_input("x", shape, in_dtype, **(qin or {}))
    else:  # a constant input: TFLite's DEQUANTIZE(weights) pattern, fed to an ADD to have an input
        x = b.add_tensor("w", shape, in_dtype, data=const_input, **(qin or {}))
    y = b.add_tensor("y", shape, out_dtype, **(qout or {}))
    b.add_operator(op, [x], [y])
    out = y
    if const_input is not None:
        z = b.add_input("z", shape, out_dtype)
        out = b.add_tensor("out", shape, out_dtype)
        b.add_operator("ADD", [y, z], [out], ("AddOptions", {"fused_activation_function": 0}))
    b.set_outputs([out])
    return b.build()


def nnapi_unary(op, in_type, out_type, dims, in_q=None, out_q=None, channel_quant=None):
    b = ModelBuilder()
    x = b.add_operand(in_type, dims, channel_quant=channel_quant, **(in_q or {}))
    y = b.add_operand(out_type, dims, **(out_q or {}))
    b.add_operation(op, [x], [y])
    b.identify_inputs_and_outputs([x], [y])
    return b.finish()


def run_nnapi(op, in_type, out_type, x, **kw):
    return execute(compile_model(nnapi_unary(op, in_type, out_type, x.shape, **kw)), [x])[0]


def assert_same(got, expected):
    assert got.dtype == expected.dtype and got.shape == expected.shape
    np.testing.assert_array_equal(got, expected)


# ---- QUANTIZE -------------------------------------------------------------------------

def _quantize_input(rng, shape, q, spread):
    x = (rng.standard_normal(shape) * spread * q["scale"]).astype(np.float32)
    x.flat[0] = q["scale"] * 2.5  # an exact tie: std::round rounds away from zero
    return x


@OP_SETTINGS
@given(shape=shapes, dtype=st.sampled_from([np.uint8, np.int8]), seed=seeds, spread=st.floats(0.5, 300))
def test_quantize_float32(shape, dtype, seed, spread):
    rng = np.random.default_rng(seed)
    q = random_quant_params(rng, dtype)
    x = _quantize_input(rng, shape, q, spread)
    assert_matches_tflite(one_op("QUANTIZE", shape, np.float32, dtype, qout=q), [x])


@OP_SETTINGS
@given(shape=shapes, out_type=st.sampled_from([T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM_SIGNED]), seed=seeds,
       spread=st.floats(0.5, 300))
def test_quantize_float16(shape, out_type, seed, spread):
    """NNAPI QUANTIZE of float16 (AOSP: the half is widened to float, then the float path) ==
    TFLite QUANTIZE of the same values as float32."""
    rng = np.random.default_rng(seed)
    dtype = RAW[out_type][0]
    q = random_quant_params(rng, dtype)
    x = _quantize_input(rng, shape, q, spread).astype(np.float16)
    expected = tflite_run(one_op("QUANTIZE", shape, np.float32, dtype, qout=q), [x.astype(np.float32)])[0]
    assert_same(run_nnapi(O.QUANTIZE, T.TENSOR_FLOAT16, out_type, x, out_q=q), expected)


def test_quantize_saturates():
    """Beyond the int32 range TFLite's static_cast is undefined (x86 gives INT32_MIN, hence 0);
    hal saturates as AOSP's float clamps do. NaN gives the zero point (TFLite on Arm)."""
    x = np.array([1e10, -1e10, np.inf, -np.inf, np.nan, 3e38, 1.25], np.float32)
    got = run_nnapi(O.QUANTIZE, T.TENSOR_FLOAT32, T.TENSOR_QUANT8_ASYMM, x, out_q={"scale": 1e-3, "zero_point": 3})
    np.testing.assert_array_equal(got, [255, 0, 255, 0, 3, 255, 255])
    got = run_nnapi(O.QUANTIZE, T.TENSOR_FLOAT32, T.TENSOR_QUANT8_ASYMM_SIGNED, x,
                    out_q={"scale": 0.5, "zero_point": -3})
    np.testing.assert_array_equal(got, [127, -128, 127, -128, -3, 127, 0])


# ---- DEQUANTIZE ----------------------------------------------------------------------

@OP_SETTINGS
@given(shape=shapes, dtype=st.sampled_from([np.uint8, np.int8]), seed=seeds)
def test_dequantize_8bit(shape, dtype, seed):
    rng = np.random.default_rng(seed)
    q = random_quant_params(rng, dtype)
    assert_matches_tflite(one_op("DEQUANTIZE", shape, dtype, np.float32, qin=q),
                          [random_tensor(rng, shape, dtype)], rtol=0, atol=0)


@OP_SETTINGS
@given(shape=shapes, seed=seeds)
def test_dequantize_quant8_symm(shape, seed):
    """TENSOR_QUANT8_SYMM is TFLite's int8 with zero point 0."""
    rng = np.random.default_rng(seed)
    q = {"scale": random_quant_params(rng, np.int8)["scale"]}
    x = random_tensor(rng, shape, np.int8)
    x[x == -128] = -127  # the symmetric range
    expected = tflite_run(one_op("DEQUANTIZE", shape, np.int8, np.float32, qin={**q, "zero_point": 0}), [x])[0]
    assert_same(run_nnapi(O.DEQUANTIZE, T.TENSOR_QUANT8_SYMM, T.TENSOR_FLOAT32, x, in_q=q), expected)


@OP_SETTINGS
@given(shape=st.lists(st.integers(1, 5), min_size=2, max_size=4), seed=seeds)
def test_dequantize_per_channel_constant(shape, seed):
    rng = np.random.default_rng(seed)
    axis = int(rng.integers(0, len(shape)))
    scales = rng.uniform(0.001, 0.2, shape[axis]).astype(np.float32)
    w = rng.integers(-127, 128, shape).astype(np.int8)
    model = one_op("DEQUANTIZE", shape, np.int8, np.float32,
                   qin={"scale": scales, "zero_point": [0] * len(scales), "quantized_dimension": axis}, const_input=w)
    assert_matches_tflite(model, [np.zeros(shape, np.float32)], rtol=0, atol=0)


@OP_SETTINGS
@given(shape=shapes, in_type=st.sampled_from([T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM_SIGNED,
                                              T.TENSOR_QUANT8_SYMM_PER_CHANNEL]), seed=seeds)
def test_dequantize_to_float16(shape, in_type, seed):
    """TFLite has no float16 DEQUANTIZE: expected is TFLite's float32 result rounded to half,
    AOSP's static_cast<_Float16> of the float product."""
    rng = np.random.default_rng(seed)
    dtype = np.uint8 if in_type == T.TENSOR_QUANT8_ASYMM else np.int8
    x = random_tensor(rng, shape, dtype)
    if in_type == T.TENSOR_QUANT8_SYMM_PER_CHANNEL:
        x[x == -128] = -127
        axis = int(rng.integers(0, len(shape)))
        scales = rng.uniform(0.001, 2.0, shape[axis]).astype(np.float32)
        qin = {"scale": scales, "zero_point": [0] * len(scales), "quantized_dimension": axis}
        tfl = one_op("DEQUANTIZE", shape, dtype, np.float32, qin=qin, const_input=x)
        expected = tflite_run(tfl, [np.zeros(shape, np.float32)])[0]
        got = run_nnapi(O.DEQUANTIZE, in_type, T.TENSOR_FLOAT16, x,
                        channel_quant=SymmPerChannelQuantParams(tuple(float(s) for s in scales), axis))
    else:
        q = random_quant_params(rng, dtype, scale_range=(0.005, 50))
        expected = tflite_run(one_op("DEQUANTIZE", shape, dtype, np.float32, qin=q), [x])[0]
        got = run_nnapi(O.DEQUANTIZE, in_type, T.TENSOR_FLOAT16, x, in_q=q)
    assert_same(got, expected.astype(np.float16))


@OP_SETTINGS
@given(shape=shapes, seed=seeds)
def test_dequantize_float16_is_cast(shape, seed):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * 100).astype(np.float16)
    model = one_op("DEQUANTIZE", shape, np.float16, np.float32)
    assert_matches_tflite(model, [x], rtol=0, atol=0)
    ops = convert_partition(read_model(model)).model.main.operations
    assert [op.type for op in ops] == [O.CAST]


@OP_SETTINGS
@given(shape=shapes, seed=seeds)
def test_dequantize_float16_constant_is_cast(shape, seed):
    """The fp16-weight pattern: DEQUANTIZE(float16 constant) feeding a float32 op."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal(shape) * 10).astype(np.float16)
    model = one_op("DEQUANTIZE", shape, np.float16, np.float32, const_input=w)
    assert_matches_tflite(model, [random_tensor(rng, shape, np.float32)])


# ---- CAST ------------------------------------------------------------------------------

def _cast_values(rng, shape, src):
    if src == np.int32:
        return rng.integers(-(2**24), 2**24, shape).astype(np.int32)
    return (rng.standard_normal(shape) * 1000).astype(src)


@OP_SETTINGS
@given(shape=shapes, pair=st.sampled_from([(np.float32, np.int32), (np.int32, np.float32), (np.float32, np.float16),
                                            (np.float16, np.float32), (np.float16, np.int32), (np.int32, np.float16),
                                            (np.float32, np.float32), (np.int32, np.int32)]), seed=seeds)
def test_cast(shape, pair, seed):
    src, dst = pair
    x = _cast_values(np.random.default_rng(seed), shape, src)
    assert_matches_tflite(one_op("CAST", shape, src, dst), [x], rtol=0, atol=0)


@OP_SETTINGS
@given(shape=shapes, other=st.sampled_from([T.TENSOR_FLOAT32, T.TENSOR_FLOAT16, T.TENSOR_INT32,
                                            T.TENSOR_QUANT8_ASYMM]), to_uint8=st.booleans(), seed=seeds)
def test_cast_quant8_asymm(shape, other, to_uint8, seed):
    """TENSOR_QUANT8_ASYMM casts as raw uint8 values (scale and zero point ignored) == TFLite
    CAST of uint8 tensors; values to uint8 stay in [0, 255] (see test_cast_saturates_to_uint8)."""
    rng = np.random.default_rng(seed)
    src, dst = (other, T.TENSOR_QUANT8_ASYMM) if to_uint8 else (T.TENSOR_QUANT8_ASYMM, other)
    if src == T.TENSOR_INT32:
        x = rng.integers(0, 256, shape).astype(np.int32)
    else:  # floats below 255 (a float16 near 255.9 rounds to 256)
        x = random_tensor(rng, shape, RAW[src][0], 0, 255)
    expected = tflite_run(one_op("CAST", shape, RAW[src][1], RAW[dst][1]), [x])[0]
    got = run_nnapi(O.CAST, src, dst, x, in_q=QPARAMS.get(src), out_q=QPARAMS.get(dst))
    assert_same(got, expected)


def test_cast_saturates_to_uint8():
    """AOSP's reference CAST clamps to [0, 255] before converting; TFLite's static_cast wraps
    (int32 300 -> 44), so the delegate does not map TFLite CASTs to uint8."""
    for src, x, expected in ((T.TENSOR_INT32, [300, -1, 255, 256, 7, -300], [255, 0, 255, 255, 7, 0]),
                             (T.TENSOR_FLOAT32, [300, -1.5, 255.9, np.nan, 1e10, 2.7], [255, 0, 255, 0, 255, 2])):
        x = np.array(x, RAW[src][0])
        got = run_nnapi(O.CAST, src, T.TENSOR_QUANT8_ASYMM, x, out_q=QPARAMS[T.TENSOR_QUANT8_ASYMM])
        assert_same(got, np.array(expected, np.uint8))


def test_cast_float_to_int32_saturates():
    """Out of range, TFLite's static_cast is undefined (x86: INT32_MIN); hal saturates, NaN -> 0."""
    x = np.array([3e9, -3e9, np.inf, -np.inf, np.nan, -2.7, 2.7], np.float32)
    got = run_nnapi(O.CAST, T.TENSOR_FLOAT32, T.TENSOR_INT32, x)
    np.testing.assert_array_equal(got, [2**31 - 1, -(2**31), 2**31 - 1, -(2**31), 0, -2, 2])


@pytest.mark.parametrize("t", [T.TENSOR_BOOL8, T.TENSOR_QUANT16_ASYMM, T.TENSOR_QUANT16_SYMM,
                               T.TENSOR_QUANT8_ASYMM_SIGNED, T.TENSOR_QUANT8_SYMM])
def test_cast_identity_only_types(t):
    """NNAPI 1.3 casts these only to their own type: a copy of the raw values, == TFLite CAST of
    the same tensor type (uint16, which tflite_runtime cannot feed, as a constant cast to int32)."""
    rng = np.random.default_rng(int(t))
    dtype, ttype = RAW[t]
    x = random_tensor(rng, (3, 5), np.uint8).astype(dtype) if dtype == np.bool_ else random_tensor(rng, (3, 5), dtype)
    if t == T.TENSOR_QUANT8_SYMM:
        x[x == -128] = -127
    got = run_nnapi(O.CAST, t, t, x, in_q=QPARAMS.get(t), out_q=QPARAMS.get(t))
    if t == T.TENSOR_QUANT16_ASYMM:
        expected = tflite_run(one_op("CAST", [3, 5], ttype, np.int32, const_input=x), [np.zeros((3, 5), np.int32)])[0]
        got = got.astype(np.int32)
    else:
        expected = tflite_run(one_op("CAST", [3, 5], ttype, ttype), [x])[0]
    assert_same(got, expected)


# ---- signatures and mapping --------------------------------------------------------------

def _fails(model, op, message):
    with pytest.raises(HalError, match=message) as e:
        compile_model(model)
    assert str(e.value.message).startswith(f"operation 0 ({op.name})")


@pytest.mark.parametrize("op, in_type, out_type, in_q, out_q, message", [
    (O.QUANTIZE, T.TENSOR_INT32, T.TENSOR_QUANT8_ASYMM, None, {"scale": 0.1},
     "input 0 must be of type TENSOR_FLOAT32, TENSOR_FLOAT16, got TENSOR_INT32"),
    (O.QUANTIZE, T.TENSOR_FLOAT32, T.TENSOR_FLOAT32, None, None, "output 0 must be of type"),
    (O.QUANTIZE, T.TENSOR_FLOAT32, T.TENSOR_QUANT8_SYMM, None, {"scale": 0.1}, "got TENSOR_QUANT8_SYMM"),
    (O.DEQUANTIZE, T.TENSOR_FLOAT32, T.TENSOR_FLOAT32, None, None, "input 0 must be of type"),
    (O.DEQUANTIZE, T.TENSOR_QUANT8_ASYMM, T.TENSOR_INT32, {"scale": 0.1}, None, "output 0 must be of type"),
    (O.CAST, T.TENSOR_FLOAT32, T.TENSOR_BOOL8, None, None, "output 0 must be of type TENSOR_FLOAT16"),
    (O.CAST, T.TENSOR_BOOL8, T.TENSOR_FLOAT32, None, None, "output 0 must be of type TENSOR_BOOL8, got TENSOR_FLOAT32"),
    (O.CAST, T.TENSOR_QUANT8_ASYMM_SIGNED, T.TENSOR_QUANT8_ASYMM, {"scale": 0.1}, {"scale": 0.1},
     "output 0 must be of type TENSOR_QUANT8_ASYMM_SIGNED"),
    (O.CAST, T.TENSOR_QUANT16_SYMM, T.TENSOR_INT32, {"scale": 0.1}, None,
     "output 0 must be of type TENSOR_QUANT16_SYMM"),
])
def test_validation_messages(op, in_type, out_type, in_q, out_q, message):
    _fails(nnapi_unary(op, in_type, out_type, (2, 3), in_q, out_q), op, message)


def test_cast_rejects_per_channel_input():
    model = nnapi_unary(O.CAST, T.TENSOR_QUANT8_SYMM_PER_CHANNEL, T.TENSOR_FLOAT32, (2, 3),
                        channel_quant=SymmPerChannelQuantParams((0.5, 0.5, 0.5), 1))
    _fails(model, O.CAST, "input 0 must be of type")


@pytest.mark.parametrize("op", [O.QUANTIZE, O.DEQUANTIZE, O.CAST])
def test_input_and_output_counts(op):
    in_type = T.TENSOR_QUANT8_ASYMM if op == O.DEQUANTIZE else T.TENSOR_FLOAT32
    out_type = T.TENSOR_QUANT8_ASYMM if op == O.QUANTIZE else T.TENSOR_FLOAT32
    qi = {"scale": 0.5} if op == O.DEQUANTIZE else {}
    qo = {"scale": 0.5} if op == O.QUANTIZE else {}
    b = ModelBuilder()
    x, x2 = (b.add_operand(in_type, (2, 3), **qi) for _ in range(2))
    y = b.add_operand(out_type, (2, 3), **qo)
    b.add_operation(op, [x, x2], [y])
    b.identify_inputs_and_outputs([x, x2], [y])
    _fails(b.finish(), op, "expected 1 inputs, got 2")
    y2 = b.add_operand(out_type, (2, 3), **qo)
    b.model.main.operations[0].inputs = (x,)
    b.model.main.operations[0].outputs = (y, y2)
    b.identify_inputs_and_outputs([x, x2], [y, y2])  # an unused model input is valid
    _fails(b.finish(), op, "expected 1 outputs, got 2")


def test_dequantize_rank_over_4():
    _fails(nnapi_unary(O.DEQUANTIZE, T.TENSOR_QUANT8_ASYMM, T.TENSOR_FLOAT32, (1, 2, 1, 2, 2), {"scale": 0.5}),
           O.DEQUANTIZE, "input 0 must have rank <= 4, got 5")


def test_output_shape_must_match_input():
    b = ModelBuilder()
    x = b.add_operand(T.TENSOR_FLOAT32, (2, 3))
    y = b.add_operand(T.TENSOR_INT32, (3, 2))
    b.add_operation(O.CAST, [x], [y])
    b.identify_inputs_and_outputs([x], [y])
    _fails(b.finish(), O.CAST, r"output 0 shape \[3, 2\] is incompatible with the computed shape \[2, 3\]")


@pytest.mark.parametrize("src, dst", [(np.int32, np.uint8), (np.float32, np.int8), (np.bool_, np.float32)])
def test_cast_without_nnapi_equivalent_is_not_mapped(src, dst):
    """TFLite CAST wraps out-of-range values into 8 bits; NNAPI saturates or has no such cast."""
    with pytest.raises(MappingError, match="CAST is supported between float32, float16 and int32"):
        convert_partition(read_model(one_op("CAST", [4], src, dst)))


def test_dequantize_of_int16_is_not_mapped():
    model = one_op("DEQUANTIZE", [4], np.int16, np.float32, qin={"scale": 0.1, "zero_point": 0},
                   const_input=np.arange(4, dtype=np.int16))
    with pytest.raises(MappingError, match="DEQUANTIZE of TFLite type"):
        convert_partition(read_model(model))


# ---- zero-sized inputs (NNAPI 1.2: QUANTIZE and DEQUANTIZE, not CAST) ---------------------

def _zero_sized(op, in_dtype, out_dtype, qin=None, qout=None, options=None):
    """x [2, 3] -> STRIDED_SLICE -> z [0, 3] -> op -> y [0, 3]."""
    b = TfLiteModelBuilder()
    x, z = b.add_input("x", [2, 3], in_dtype, **(qin or {})), b.add_tensor("z", [0, 3], in_dtype, **(qin or {}))
    ends = [b.add_constant(n, np.array(v, np.int32)) for n, v in (("b", [1, 0]), ("e", [1, 3]), ("s", [1, 1]))]
    b.add_operator("STRIDED_SLICE", [x, *ends], [z], ("StridedSliceOptions", {}))
    y = b.add_tensor("y", [0, 3], out_dtype, **(qout or {}))
    b.add_operator(op, [z], [y], options)
    b.set_outputs([y])
    return b.build()


@pytest.mark.parametrize("op, in_dtype, out_dtype", [("QUANTIZE", np.float32, np.uint8),
                                                     ("QUANTIZE", np.float32, np.int8),
                                                     ("DEQUANTIZE", np.uint8, np.float32),
                                                     ("DEQUANTIZE", np.int8, np.float32)])
def test_zero_sized_input(op, in_dtype, out_dtype):
    q = {"scale": 0.5, "zero_point": 3}
    model = _zero_sized(op, in_dtype, out_dtype, None if op == "QUANTIZE" else q, q if op == "QUANTIZE" else None)
    x = random_tensor(np.random.default_rng(0), [2, 3], in_dtype)
    assert assert_matches_tflite(model, [x])[0].shape == (0, 3)


def test_cast_refuses_zero_sized_input():
    """AOSP's CPU driver runs CAST only on non-empty tensors (no allowZeroSizedInput)."""
    model = _zero_sized("CAST", np.float32, np.int32, options=("CastOptions", {"in_data_type": TensorType.FLOAT32,
                                                                               "out_data_type": TensorType.INT32}))
    with pytest.raises(HalError, match=r"CAST\): input 0 is zero-sized"):
        compile_model(convert_partition(read_model(model)).model)
