"""com.nnhal.tflite:QUANTIZED_MEAN (extensions/tflite_compat.py) vs TFLite (BUILTIN_REF): TFLite
MEAN on uint8/int8 whose output scale or zero point differs from the input's, bit-exact, for
spatial means and arbitrary axis sets; the mapper emits it only for such nodes; its validation
errors."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from extensions import tflite_compat
from hal.compiler import compile_model
from hal.errors import HalError
from hal.model import ModelBuilder
from hal.types import OperandType, OperationType
from tests.harness import OP_SETTINGS, assert_matches_tflite, random_quant_params, random_tensor
from tests.ops._tflite_compat_util import is_compat_operation, operation_types
from tests.ops.test_mean import _model, mean_cases

QU8 = OperandType.TENSOR_QUANT8_ASYMM
QS8 = OperandType.TENSOR_QUANT8_ASYMM_SIGNED


def _is_extension_mean(code: int) -> bool:
    return is_compat_operation(code, tflite_compat.QUANTIZED_MEAN)


@OP_SETTINGS
@given(case=mean_cases(), dtype=st.sampled_from([np.uint8, np.int8]), seed=st.integers(0, 2**32 - 1))
def test_requantizing_mean_matches_tflite(case, dtype, seed):
    rng = np.random.default_rng(seed)
    shape, axes, keep = case
    qx, qy = random_quant_params(rng, dtype), random_quant_params(rng, dtype)
    model = _model(dtype, shape, axes, keep, qx, qy)
    (code,) = operation_types(model)
    assert _is_extension_mean(code)
    assert_matches_tflite(model, [random_tensor(rng, shape, dtype)])


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("qy", [{"scale": 0.02, "zero_point": 5}, {"scale": 0.05, "zero_point": 9},
                                {"scale": 0.004, "zero_point": 0}, {"scale": 0.5, "zero_point": -3}])
def test_requantizing_mean_rounding_and_saturation(dtype, qy):
    """Only the zero point differs, or the scale grows / shrinks 10x (outputs saturate): the pooling
    head and SE-block shapes (7x7, 14x14 windows)."""
    info = np.iinfo(dtype)
    qy = dict(qy, zero_point=int(np.clip(qy["zero_point"] + (128 if dtype == np.uint8 else 0), info.min, info.max)))
    rng = np.random.default_rng(7)
    for hw in (7, 14):
        shape = [1, hw, hw, 6]
        model = _model(dtype, shape, [1, 2], True, {"scale": 0.05, "zero_point": int(info.min) + 130}, qy)
        assert_matches_tflite(model, [random_tensor(rng, shape, dtype)])


def test_same_quantization_stays_nnapi_mean():
    model = _model(np.int8, [1, 3, 3, 2], [1, 2], True, {"scale": 0.1, "zero_point": 4})
    assert operation_types(model) == [OperationType.MEAN]


def _nnapi(in_type=QS8, out_type=QS8, n_inputs=3, keep_type=OperandType.INT32, shape=(1, 2, 2, 3)):
    mb = ModelBuilder()
    mb.model.extension_name_to_prefix.append(_prefix())
    quantized = in_type in (QU8, QS8)
    x = mb.add_operand(in_type, shape, **({"scale": 0.5, "zero_point": 1} if quantized else {}))
    a = mb.add_constant(OperandType.TENSOR_INT32, np.array([1, 2], np.int32))
    keep = mb.add_int32(1) if keep_type == OperandType.INT32 else mb.add_bool(True)
    y = mb.add_operand(out_type, (), **({"scale": 0.25, "zero_point": 3} if out_type in (QU8, QS8) else {}))
    mb.add_operation((1 << 16) | tflite_compat.QUANTIZED_MEAN, [x, a, keep][:n_inputs], [y])
    mb.identify_inputs_and_outputs([x], [y])
    return mb.finish()


def _prefix():
    from hal.model import ExtensionNameAndPrefix
    return ExtensionNameAndPrefix(tflite_compat.NAME, 1)


@pytest.mark.parametrize("kwargs, message", [
    ({"n_inputs": 2}, "expected 3 inputs, got 2"),
    ({"in_type": OperandType.TENSOR_FLOAT32, "out_type": OperandType.TENSOR_FLOAT32}, "input 0 must be of type"),
    ({"out_type": QU8}, "output 0 must be of type"),
    ({"keep_type": OperandType.BOOL}, "input 2"),
    ({"shape": (1, 2, 2, 3, 1)}, "rank 1 to 4"),
])
def test_validation_errors(kwargs, message):
    tflite_compat.ensure_registered()
    with pytest.raises(HalError) as e:
        compile_model(_nnapi(**kwargs))
    assert "operation 0" in str(e.value) and message in str(e.value)
