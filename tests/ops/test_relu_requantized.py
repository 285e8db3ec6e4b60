"""Quantized RELU, RELU6, RELU_N1_TO_1 with an output quantization other than the input's vs TFLite
(BUILTIN_REF), bit-exact, every input value: uint8 and int8, any scales and zero points. They map
to com.nnhal.tflite:RELU_REQUANTIZED (extensions/tflite_compat.py); equal quantization (rank <= 4)
still maps to NNAPI's RELU / RELU6 / RELU1 (delegate/mapping/activations.py). Also: the extension's
validation errors."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from delegate.tfl import TfLiteModelBuilder
from extensions import tflite_compat
from hal.compiler import compile_model
from hal.errors import HalError
from hal.model import ExtensionNameAndPrefix, ModelBuilder
from hal.types import OperandType, OperationType
from tests.harness import OP_SETTINGS, assert_matches_tflite, random_tensor
from tests.ops._tflite_compat_util import every_value, is_compat_operation, operation_types, quant

QU8 = OperandType.TENSOR_QUANT8_ASYMM
QS8 = OperandType.TENSOR_QUANT8_ASYMM_SIGNED
NNAPI_OP = {"RELU": OperationType.RELU, "RELU6": OperationType.RELU6, "RELU_N1_TO_1": OperationType.RELU1}
ops = st.sampled_from(sorted(NNAPI_OP))
dtypes = st.sampled_from([np.uint8, np.int8])


def _model(op: str, shape, dtype, qx: dict, qy: dict) -> bytes:
    m = TfLiteModelBuilder()
    x = m.add_input("x", shape, dtype, **qx)
    y = m.add_tensor("y", shape, dtype, **qy)
    m.add_operator(op, [x], [y])
    m.set_outputs([y])
    return m.build()


def _is_relu_requantized(code: int) -> bool:
    return is_compat_operation(code, tflite_compat.RELU_REQUANTIZED)


def _assert_requantized_matches_tflite(op: str, dtype, qx: dict, qy: dict) -> None:
    """The node maps to RELU_REQUANTIZED and equals TFLite on every input value."""
    model = _model(op, [2, 128], dtype, qx, qy)
    (code,) = operation_types(model)
    assert _is_relu_requantized(code)
    assert_matches_tflite(model, [every_value(dtype)])


@OP_SETTINGS
@given(data=st.data(), op=ops, dtype=dtypes)
def test_different_quantization_every_value(data, op, dtype):
    qx, qy = data.draw(quant(dtype)), data.draw(quant(dtype))
    if qx == qy:
        qy["scale"] *= 1.5
    _assert_requantized_matches_tflite(op, dtype, qx, qy)


@OP_SETTINGS
@given(data=st.data(), op=ops, dtype=dtypes)
def test_only_zero_point_differs(data, op, dtype):
    """Equal scales: the multiplier is exactly one, only the offset and the clamp move."""
    qx = data.draw(quant(dtype))
    qy = data.draw(quant(dtype, qx["scale"]))
    if qx == qy:
        qy["zero_point"] += 1 if qy["zero_point"] < np.iinfo(dtype).max else -1
    _assert_requantized_matches_tflite(op, dtype, qx, qy)


@OP_SETTINGS
@given(data=st.data(), op=ops, dtype=dtypes)
def test_equal_quantization_stays_nnapi(data, op, dtype):
    q = data.draw(quant(dtype))
    model = _model(op, [2, 128], dtype, q, dict(q))
    assert operation_types(model) == [NNAPI_OP[op]]
    assert_matches_tflite(model, [every_value(dtype)])


@pytest.mark.parametrize("op", sorted(NNAPI_OP))
@pytest.mark.parametrize("ratio", [0.5, 0.25, 2.0, 3.0, 1 / 3, 1.001, 100.0, 1 / 256])
@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_rounding_ties_and_saturation(op, ratio, dtype):
    """Exact halves (ratios 1/2, 1/4, 3), where fixed-point rounding differs from float's, clamps
    that fall outside the type's range, and outputs that saturate."""
    z = 128 if dtype == np.uint8 else 0
    qx = {"scale": 0.03, "zero_point": z + 3}
    qy = {"scale": float(np.float32(0.03) / np.float32(ratio)), "zero_point": z - 5}
    model = _model(op, [2, 128], dtype, qx, qy)
    assert_matches_tflite(model, [every_value(dtype)])


@OP_SETTINGS
@given(shape=st.lists(st.integers(1, 3), min_size=5, max_size=6), op=ops, dtype=dtypes,
       equal=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_rank_over_4(shape, op, dtype, equal, seed):
    """NNAPI's RELU* take rank <= 4: higher ranks use the extension even with equal quantization."""
    rng = np.random.default_rng(seed)
    z = 128 if dtype == np.uint8 else 0
    qx = {"scale": 0.05, "zero_point": z + int(rng.integers(-20, 20))}
    qy = dict(qx) if equal else {"scale": float(np.float32(rng.uniform(0.005, 0.2))),
                                 "zero_point": z + int(rng.integers(-20, 20))}
    model = _model(op, shape, dtype, qx, qy)
    (code,) = operation_types(model)
    assert _is_relu_requantized(code)
    assert_matches_tflite(model, [random_tensor(rng, shape, dtype)])


def _nnapi(in_type=QS8, out_type=QS8, act=OperandType.INT32, act_value=3, n_inputs=2, n_outputs=1):
    mb = ModelBuilder()
    mb.model.extension_name_to_prefix.append(ExtensionNameAndPrefix(tflite_compat.NAME, 1))

    def operand(t):
        return mb.add_operand(t, (2, 3), **({"scale": 0.5, "zero_point": 1} if t in (QU8, QS8) else {}))

    x = operand(in_type)
    a = mb.add_int32(act_value) if act == OperandType.INT32 else mb.add_float32(float(act_value))
    ys = [operand(out_type) for _ in range(n_outputs)]
    mb.add_operation((1 << 16) | tflite_compat.RELU_REQUANTIZED, [x, a, a][:n_inputs], ys)
    mb.identify_inputs_and_outputs([x], ys)
    return mb.finish()


@pytest.mark.parametrize("kwargs, message", [
    ({"n_inputs": 1}, "expected 2 inputs, got 1"),
    ({"n_inputs": 3}, "expected 2 inputs, got 3"),
    ({"n_outputs": 2}, "expected 1 outputs, got 2"),
    ({"in_type": OperandType.TENSOR_FLOAT32, "out_type": OperandType.TENSOR_FLOAT32}, "input 0 must be of type"),
    ({"out_type": QU8}, "output 0 must be of type"),
    ({"act": OperandType.FLOAT32}, "input 1"),
    ({"act_value": 0}, "must be 1 (RELU), 2 (RELU1) or 3 (RELU6), got 0"),
    ({"act_value": 4}, "must be 1 (RELU), 2 (RELU1) or 3 (RELU6), got 4"),
])
def test_validation_errors(kwargs, message):
    tflite_compat.ensure_registered()
    with pytest.raises(HalError) as e:
        compile_model(_nnapi(**kwargs))
    assert "operation 0" in str(e.value) and message in str(e.value)


def _float_vs_double_ratio_pairs(n: int) -> list[tuple[float, float]]:
    """Scale pairs where ReluPrepare's float32 division in_scale / out_scale gives another
    multiplier than the division in double would (QUANTIZE's), and that changes an unclamped
    RELU output (input zero point 0, output zero point -128)."""
    from hal import quant
    rng, pairs, x = np.random.default_rng(17), [], np.arange(0, 128, dtype=np.int64)
    while len(pairs) < n:
        a, b = np.float32(rng.uniform(0.01, 0.1)), np.float32(rng.uniform(0.01, 0.1))
        m32 = quant.quantize_multiplier(float(a / b))
        m64 = quant.quantize_multiplier(float(a) / float(b))
        v32, v64 = (np.clip(quant.multiply_by_quantized_multiplier(x, *m), -128, 255) for m in (m32, m64))
        if m32 != m64 and (v32 != v64).any():
            pairs.append((float(a), float(b)))
    return pairs


@pytest.mark.parametrize("in_scale, out_scale", _float_vs_double_ratio_pairs(4))
def test_multiplier_from_float32_division(in_scale, out_scale):
    model = _model("RELU", [2, 128], np.int8, {"scale": in_scale, "zero_point": 0},
                   {"scale": out_scale, "zero_point": -128})
    assert_matches_tflite(model, [every_value(np.int8)])
