"""TFLite QUANTIZE between 8-bit types (requantization) vs TFLite (BUILTIN_REF), bit-exact: uint8 <->
int8 and uint8 -> uint8 / int8 -> int8 with any scales and zero points, every input value. Equal
scales map to NNAPI DEQUANTIZE + QUANTIZE, different scales (or rank 5) to
com.nnhal.tflite:REQUANTIZE (extensions/tflite_compat.py); see delegate/mapping/quantization.py.
Also: the extension's validation errors, and what stays unmapped."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from delegate.mapping import MappingError, convert_partition
from delegate.tfl import TfLiteModelBuilder, read_model
from extensions import tflite_compat
from hal.compiler import compile_model
from hal.errors import HalError
from hal.model import ExtensionNameAndPrefix, ModelBuilder
from hal.types import OperandType, OperationType
from tests.harness import OP_SETTINGS, assert_matches_tflite, random_tensor
from tests.ops._tflite_compat_util import every_value, is_compat_operation, operation_types, quant

QU8 = OperandType.TENSOR_QUANT8_ASYMM
QS8 = OperandType.TENSOR_QUANT8_ASYMM_SIGNED
dtypes = st.sampled_from([np.uint8, np.int8])
seeds = st.integers(0, 2**32 - 1)


def _model(shape, in_dtype, out_dtype, qx: dict, qy: dict) -> bytes:
    m = TfLiteModelBuilder()
    x = m.add_input("x", shape, in_dtype, **qx)
    y = m.add_tensor("y", shape, out_dtype, **qy)
    m.add_operator("QUANTIZE", [x], [y])
    m.set_outputs([y])
    return m.build()


def _is_requantize(code: int) -> bool:
    return is_compat_operation(code, tflite_compat.REQUANTIZE)


@OP_SETTINGS
@given(data=st.data(), in_dtype=dtypes, out_dtype=dtypes)
def test_different_scales_every_value(data, in_dtype, out_dtype):
    qx, qy = data.draw(quant(in_dtype)), data.draw(quant(out_dtype))
    if np.float32(qx["scale"]) == np.float32(qy["scale"]):
        qy["scale"] *= 1.5
    model = _model([2, 128], in_dtype, out_dtype, qx, qy)
    (code,) = operation_types(model)
    assert _is_requantize(code)
    assert_matches_tflite(model, [every_value(in_dtype)])


@OP_SETTINGS
@given(data=st.data(), in_dtype=dtypes, out_dtype=dtypes, log_scale=st.floats(-100, 100))
def test_equal_scales_every_value(data, in_dtype, out_dtype, log_scale):
    """The converter's uint8 <-> int8 edges (zero points 128 apart, TFLite's q ^ 0x80 fast path)
    and any other zero points, over scales 2^-100 .. 2^100."""
    scale = float(np.float32(2.0 ** log_scale))
    qx = data.draw(quant(in_dtype, scale))
    if in_dtype != out_dtype and data.draw(st.booleans()):
        qy = {"scale": scale, "zero_point": qx["zero_point"] + (128 if in_dtype == np.int8 else -128)}
    else:
        qy = data.draw(quant(out_dtype, scale))
    model = _model([2, 128], in_dtype, out_dtype, qx, qy)
    assert operation_types(model) == [OperationType.DEQUANTIZE, OperationType.QUANTIZE]
    assert_matches_tflite(model, [every_value(in_dtype)])


@OP_SETTINGS
@given(shape=st.lists(st.integers(1, 4), min_size=1, max_size=6), in_dtype=dtypes, out_dtype=dtypes,
       equal=st.booleans(), seed=seeds)
def test_any_rank(shape, in_dtype, out_dtype, equal, seed):
    """Ranks 1 to 6: DEQUANTIZE takes rank <= 4 only, so rank 5 and 6 use the extension even with
    equal scales (its arithmetic then equals TFLite's fast path)."""
    rng = np.random.default_rng(seed)
    qx = {"scale": 0.05, "zero_point": int(rng.integers(-20, 20)) + (128 if in_dtype == np.uint8 else 0)}
    qy = {"scale": 0.05 if equal else float(np.float32(rng.uniform(0.01, 0.2))),
          "zero_point": int(rng.integers(-20, 20)) + (128 if out_dtype == np.uint8 else 0)}
    if equal and in_dtype != out_dtype:  # the converter's form, TFLite's q ^ 0x80 fast path
        qy["zero_point"] = qx["zero_point"] + (128 if out_dtype == np.uint8 else -128)
    model = _model(shape, in_dtype, out_dtype, qx, qy)
    codes = operation_types(model)
    if equal and len(shape) <= 4:
        assert codes == [OperationType.DEQUANTIZE, OperationType.QUANTIZE]
    else:
        assert len(codes) == 1 and _is_requantize(codes[0])
    assert_matches_tflite(model, [random_tensor(rng, shape, in_dtype)])


@pytest.mark.parametrize("ratio", [0.5, 0.25, 2.0, 3.0, 1 / 3, 0.999, 1.001, 100.0, 1 / 256])
@pytest.mark.parametrize("in_dtype, out_dtype", [(np.uint8, np.int8), (np.int8, np.uint8), (np.int8, np.int8)])
def test_rounding_ties_and_saturation(ratio, in_dtype, out_dtype):
    """Exact halves (ratios 1/2, 1/4, 3), where TFLite's fixed-point rounding differs from float's,
    and outputs that saturate both ways."""
    zx = 128 if in_dtype == np.uint8 else 0
    zy = 128 if out_dtype == np.uint8 else 0
    qx = {"scale": 0.03, "zero_point": zx + 3}
    qy = {"scale": float(np.float32(0.03) / np.float32(ratio)), "zero_point": zy - 5}
    model = _model([2, 128], in_dtype, out_dtype, qx, qy)
    assert_matches_tflite(model, [every_value(in_dtype)])


def test_nnapi_rewrite_only_with_normal_scales():
    """A subnormal scale would lose DEQUANTIZE's precision: the extension takes it."""
    q = {"scale": 1e-40, "zero_point": 0}
    model = _model([2, 128], np.int8, np.int8, q, dict(q, zero_point=7))
    (code,) = operation_types(model)
    assert _is_requantize(code)


@pytest.mark.parametrize("in_dtype, out_dtype", [(np.int16, np.int8), (np.int8, np.int16)])
def test_16_bit_quantize_is_not_mapped(in_dtype, out_dtype):
    q16 = {"scale": 0.01, "zero_point": 0}
    q8 = {"scale": 0.02, "zero_point": 0}
    model = _model([4], in_dtype, out_dtype, q16 if in_dtype == np.int16 else q8,
                   q16 if out_dtype == np.int16 else q8)
    with pytest.raises(MappingError, match="QUANTIZE from TFLite type"):
        convert_partition(read_model(model))


def test_per_channel_input_is_not_mapped():
    m = TfLiteModelBuilder()
    w = m.add_constant("w", np.ones((2, 3), np.int8), scale=[0.1, 0.2], zero_point=[0, 0], quantized_dimension=0)
    y = m.add_tensor("y", [2, 3], np.int8, scale=0.1, zero_point=0)
    m.add_operator("QUANTIZE", [w], [y])
    m.set_outputs([y])
    with pytest.raises(MappingError, match="per-channel"):
        convert_partition(read_model(m.build()))


def _nnapi(in_type=QS8, out_type=QU8, n_inputs=1, n_outputs=1):
    mb = ModelBuilder()
    mb.model.extension_name_to_prefix.append(ExtensionNameAndPrefix(tflite_compat.NAME, 1))

    def operand(t):
        return mb.add_operand(t, (2, 3), **({"scale": 0.5, "zero_point": 1} if t in (QU8, QS8) else {}))

    xs = [operand(in_type) for _ in range(n_inputs)]
    ys = [operand(out_type) for _ in range(n_outputs)]
    mb.add_operation((1 << 16) | tflite_compat.REQUANTIZE, xs, ys)
    mb.identify_inputs_and_outputs(xs, ys)
    return mb.finish()


@pytest.mark.parametrize("kwargs, message", [
    ({"n_inputs": 2}, "expected 1 inputs, got 2"),
    ({"n_outputs": 2}, "expected 1 outputs, got 2"),
    ({"in_type": OperandType.TENSOR_FLOAT32}, "input 0 must be of type"),
    ({"out_type": OperandType.TENSOR_INT32}, "output 0 must be of type"),
])
def test_validation_errors(kwargs, message):
    tflite_compat.ensure_registered()
    with pytest.raises(HalError) as e:
        compile_model(_nnapi(**kwargs))
    assert "operation 0" in str(e.value) and message in str(e.value)
