"""AVERAGE_POOL_2D / MAX_POOL_2D / L2_POOL_2D vs TFLite (BUILTIN_REF), plus NNAPI validation
(float16 pools are judged by the CTS vectors: TFLite has no float16 pooling kernels)."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from delegate.tfl import TfLiteModelBuilder
from delegate.tfl.schema import ActivationFunctionType as Act
from delegate.tfl.schema import Padding
from hal.compiler import compile_model
from hal.errors import HalError
from hal.executor import execute
from hal.types import OperandType, OperationType
from tests.backends.differential import compare
from tests.harness import OP_SETTINGS, assert_matches_tflite, nnapi_one_op, random_quant_params, random_tensor

F32 = OperandType.TENSOR_FLOAT32
F16 = OperandType.TENSOR_FLOAT16
QU8 = OperandType.TENSOR_QUANT8_ASYMM
QS8 = OperandType.TENSOR_QUANT8_ASYMM_SIGNED
AVG, MAX, L2 = OperationType.AVERAGE_POOL_2D, OperationType.MAX_POOL_2D, OperationType.L2_POOL_2D

COVERED = {(AVG, F32), (AVG, QU8), (AVG, QS8), (MAX, F32), (MAX, QU8), (MAX, QS8), (L2, F32)}

ACTS = [Act.NONE, Act.RELU, Act.RELU_N1_TO_1, Act.RELU6]
TFL_NAME = {AVG: "AVERAGE_POOL_2D", MAX: "MAX_POOL_2D", L2: "L2_POOL_2D"}


def _out_size(size, filt, stride, padding):
    if padding == Padding.SAME:
        return (size + stride - 1) // stride
    return (size - filt + stride) // stride


@st.composite
def pool_cases(draw):
    """Input shape and Pool2DOptions whose output is non-empty (filters may exceed strides)."""
    padding = draw(st.sampled_from([Padding.SAME, Padding.VALID]))
    n, c = draw(st.integers(1, 2)), draw(st.integers(1, 5))
    h, w = draw(st.integers(1, 12)), draw(st.integers(1, 12))
    fh, fw = draw(st.integers(1, min(h, 5))), draw(st.integers(1, min(w, 5)))
    sh, sw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    opts = {"padding": padding, "stride_w": sw, "stride_h": sh, "filter_width": fw,
            "filter_height": fh, "fused_activation_function": draw(st.sampled_from(ACTS))}
    out = [n, _out_size(h, fh, sh, padding), _out_size(w, fw, sw, padding), c]
    return [n, h, w, c], out, opts


def _model(op, dtype, in_shape, out_shape, opts, q=None):
    m = TfLiteModelBuilder()
    x = m.add_input("x", in_shape, dtype, **(q or {}))
    y = m.add_tensor("y", out_shape, dtype, **(q or {}))
    m.add_operator(TFL_NAME[op], [x], [y], ("Pool2DOptions", opts))
    m.set_outputs([y])
    return m.build()


@OP_SETTINGS
@given(case=pool_cases(), op=st.sampled_from([AVG, MAX, L2]), seed=st.integers(0, 2**32 - 1))
def test_pool_float32(case, op, seed):
    rng = np.random.default_rng(seed)
    in_shape, out_shape, opts = case
    assert_matches_tflite(_model(op, np.float32, in_shape, out_shape, opts),
                          [random_tensor(rng, in_shape, np.float32, -4, 4)])


@OP_SETTINGS
@given(case=pool_cases(), op=st.sampled_from([AVG, MAX]), dtype=st.sampled_from([np.uint8, np.int8]),
       seed=st.integers(0, 2**32 - 1))
def test_pool_quant8(case, op, dtype, seed):
    rng = np.random.default_rng(seed)
    in_shape, out_shape, opts = case
    q = random_quant_params(rng, dtype, scale_range=(0.005, 0.1))
    assert_matches_tflite(_model(op, dtype, in_shape, out_shape, opts, q),
                          [random_tensor(rng, in_shape, dtype)])


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_average_pool_quant8_rounding_ties(dtype):
    """Sums that are exact halves (and negative ones for int8) round away from zero like TFLite."""
    lo = -128 if dtype == np.int8 else 0
    x = (np.arange(2 * 6 * 6 * 3) % 7 + lo).reshape(2, 6, 6, 3).astype(dtype)
    x[0, :2, :2, 0] = [[lo, lo + 1], [lo + 1, lo]]
    q = {"scale": 0.05, "zero_point": int(lo + 100)}
    opts = {"padding": Padding.SAME, "stride_w": 2, "stride_h": 2, "filter_width": 2,
            "filter_height": 2, "fused_activation_function": Act.NONE}
    assert_matches_tflite(_model(AVG, dtype, [2, 6, 6, 3], [2, 3, 3, 3], opts, q), [x])


def test_global_average_pool_float32():
    rng = np.random.default_rng(0)
    opts = {"padding": Padding.VALID, "stride_w": 1, "stride_h": 1, "filter_width": 16,
            "filter_height": 16, "fused_activation_function": Act.NONE}
    assert_matches_tflite(_model(AVG, np.float32, [1, 16, 16, 8], [1, 1, 1, 8], opts),
                          [random_tensor(rng, [1, 16, 16, 8], np.float32)])


@pytest.mark.parametrize("op,dtype", [(AVG, np.float32), (MAX, np.float32), (L2, np.float32), (AVG, np.uint8),
                                      (MAX, np.int8)])
def test_zero_sized_batch(op, dtype):
    """NNAPI 1.2: a zero-sized batch (here a STRIDED_SLICE's empty result) pools to an empty output."""
    q = {} if dtype == np.float32 else {"scale": 0.5, "zero_point": 1}
    m = TfLiteModelBuilder()
    x, z = m.add_input("x", [2, 4, 4, 2], dtype, **q), m.add_tensor("z", [0, 4, 4, 2], dtype, **q)
    ends = [m.add_constant(n, np.array(v, np.int32)) for n, v in (("b", [1, 0, 0, 0]), ("e", [1, 4, 4, 2]),
                                                                  ("s", [1, 1, 1, 1]))]
    m.add_operator("STRIDED_SLICE", [x, *ends], [z], ("StridedSliceOptions", {}))
    y = m.add_tensor("y", [0, 2, 2, 2], dtype, **q)
    opts = {"padding": Padding.SAME, "stride_w": 2, "stride_h": 2, "filter_width": 3, "filter_height": 3,
            "fused_activation_function": Act.RELU}
    m.add_operator(TFL_NAME[op], [z], [y], ("Pool2DOptions", opts))
    m.set_outputs([y])
    x_val = random_tensor(np.random.default_rng(0), [2, 4, 4, 2], dtype)
    assert assert_matches_tflite(m.build(), [x_val])[0].shape == (0, 2, 2, 2)


# ---- hal directly: explicit padding, NCHW, validation --------------------------------------

_nnapi_pool = nnapi_one_op


def _i(*vals):
    return [(OperandType.INT32, v) for v in vals]


def test_explicit_padding_nchw_matches_nhwc():
    """Explicit padding (asymmetric) in NCHW equals the NHWC result transposed."""
    rng = np.random.default_rng(1)
    x = random_tensor(rng, [2, 7, 6, 3], np.float32)
    explicit = _i(1, 2, 0, 1, 2, 1, 3, 2, 0)  # pads l r t b, stride w h, filter w h, act
    for op in (AVG, MAX, L2):
        nhwc = execute(compile_model(_nnapi_pool(op, F32, [2, 7, 6, 3], explicit)), [x])[0]
        nchw_model = _nnapi_pool(op, F32, [2, 3, 7, 6], explicit + [(OperandType.BOOL, True)])
        nchw = execute(compile_model(nchw_model), [np.ascontiguousarray(x.transpose(0, 3, 1, 2))])[0]
        # the two layouts may run on different kernels (numba's NHWC pools, onnxruntime's NCHW):
        # equal within CTS's float criteria, as each is to the reference
        assert compare(nchw, nhwc.transpose(0, 3, 1, 2)) is None
        assert nhwc.shape == (2, (7 + 1 - 2) // 1 + 1, (6 + 3 - 3) // 2 + 1, 3)
    # the average excludes padded cells: a corner window of a constant input stays constant
    ones = np.ones([1, 4, 4, 1], np.float32)
    out = execute(compile_model(_nnapi_pool(AVG, F32, [1, 4, 4, 1], _i(1, 1, 1, 1, 1, 1, 3, 3, 0))),
                  [ones])[0]
    np.testing.assert_array_equal(out, np.ones([1, 4, 4, 1], np.float32))


IMPLICIT_OK = _i(1, 1, 1, 2, 2, 0)  # SAME, stride 1x1, filter 2x2, no activation


@pytest.mark.parametrize("op, in_type, in_shape, scalars, kw, message", [
    (AVG, F32, [1, 4, 4, 1], _i(1, 1, 1, 2, 2), {}, "expected 7 or 8 or 10 or 11 inputs, got 6"),
    (MAX, OperandType.TENSOR_INT32, [1, 4, 4, 1], IMPLICIT_OK, {}, "input 0 must be of type"),
    (L2, QU8, [1, 4, 4, 1], IMPLICIT_OK, {}, "input 0 must be of type TENSOR_FLOAT32, TENSOR_FLOAT16, got"),
    (L2, F16, [1, 4, 4, 1], IMPLICIT_OK, {"out_type": F32}, "output 0 must be of type TENSOR_FLOAT16"),
    (AVG, F32, [4, 4, 1], IMPLICIT_OK, {}, "input 0 must be rank 4, got 3"),
    (AVG, F32, [1, 4, 4, 1], IMPLICIT_OK, {"out_type": QU8, "out_q": (0.5, 3)}, "output 0 must be of type"),
    (MAX, QS8, [1, 4, 4, 1], IMPLICIT_OK, {"out_q": (0.25, 3)}, "quantization"),
    (AVG, F32, [1, 4, 4, 1], _i(3, 1, 1, 2, 2, 0), {}, "unknown implicit padding scheme 3"),
    (AVG, F32, [1, 4, 4, 1], _i(1, 0, 1, 2, 2, 0), {}, "strides must be >= 1"),
    (MAX, F32, [1, 4, 4, 1], _i(1, 1, 1, 2, 0, 0), {}, "filter size must be >= 1"),
    (AVG, F32, [1, 4, 4, 1], _i(1, 1, 1, 2, 2, 9), {}, "unknown fused activation 9"),
    (AVG, F32, [1, 4, 4, 1], _i(-1, 0, 0, 0, 1, 1, 2, 2, 0), {}, "paddings must be >= 0"),
    (AVG, F32, [1, 4, 4, 1], IMPLICIT_OK + _i(1), {}, "input 7 must be of type BOOL"),
    (MAX, F32, [1, 4, 4, 1], _i(2, 1, 1, 5, 5, 0), {}, "does not fit the padded input"),
    (AVG, F32, [1, 4, 4, 1], _i(3, 3, 0, 0, 1, 1, 2, 2, 0), {}, "entirely in the padding"),
    (AVG, F32, [1, 4, 4, 1], _i(1, 1, 1, 2, 2, 0), {"out_shape": [1, 3, 3, 1]}, "incompatible"),
])
def test_validation_errors(op, in_type, in_shape, scalars, kw, message):
    model = _nnapi_pool(op, in_type, in_shape, scalars, **kw)
    with pytest.raises(HalError) as e:
        compile_model(model)
    assert message in str(e.value)
    assert f"({op.name})" in str(e.value)


def test_mapping_rejects_quantized_l2_and_requantizing_pool():
    from delegate.mapping import MappingError, convert_partition
    from delegate.tfl import read_model

    opts = {"padding": Padding.VALID, "stride_w": 1, "stride_h": 1, "filter_width": 2,
            "filter_height": 2, "fused_activation_function": Act.NONE}
    q = {"scale": 0.5, "zero_point": 1}
    with pytest.raises(MappingError, match="NNAPI L2_POOL_2D rejects it: input 0 must be of type TENSOR_FLOAT32"):
        convert_partition(read_model(_model(L2, np.uint8, [1, 3, 3, 1], [1, 2, 2, 1], opts, q)))
    m = TfLiteModelBuilder()
    x = m.add_input("x", [1, 3, 3, 1], np.int8, scale=0.5, zero_point=1)
    y = m.add_tensor("y", [1, 2, 2, 1], np.int8, scale=0.25, zero_point=1)
    m.add_operator("MAX_POOL_2D", [x], [y], ("Pool2DOptions", opts))
    m.set_outputs([y])
    with pytest.raises(MappingError, match=r"NNAPI MAX_POOL_2D rejects it: output 0 quantization \(scale=0.25"):
        convert_partition(read_model(m.build()))
