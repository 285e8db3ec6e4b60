"""PAD vs TFLite (values are copied, padding is 0.0 or the zero point: every type bit-exact),
plus NNAPI signature checks and mapping refusals."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from delegate.mapping import MappingError, convert_partition
from delegate.tfl import TfLiteModelBuilder, read_model
from hal.compiler import compile_model
from hal.errors import HalError
from hal.model import ModelBuilder
from hal.types import OperandType, OperationType
from tests.harness import OP_SETTINGS, assert_matches_tflite, random_quant_params, random_tensor

F32 = OperandType.TENSOR_FLOAT32
QU8 = OperandType.TENSOR_QUANT8_ASYMM
QS8 = OperandType.TENSOR_QUANT8_ASYMM_SIGNED
I32 = OperandType.TENSOR_INT32
COVERED = {(OperationType.PAD, t) for t in (F32, QU8, QS8)}
SEEDS = st.integers(0, 2**32 - 1)


@st.composite
def pad_cases(draw):
    shape = draw(st.lists(st.integers(1, 4), min_size=1, max_size=4))
    pads = [[draw(st.integers(0, 3)), draw(st.integers(0, 3))] for _ in shape]
    return shape, pads


def _model(dtype, shape, pads, q=None, q_out=None, pad_dtype=np.int32, pads_as_input=False):
    m = TfLiteModelBuilder()
    x = m.add_input("x", shape, dtype, **(q or {}))
    p = np.array(pads, dtype=pad_dtype)
    pp = m.add_input("p", p.shape, pad_dtype) if pads_as_input else m.add_constant("p", p)
    out = [d + max(a, 0) + max(b, 0) for d, (a, b) in zip(shape, pads, strict=True)]
    y = m.add_tensor("y", out, dtype, **(q_out or q or {}))
    m.add_operator("PAD", [x, pp], [y])
    m.set_outputs([y])
    return m.build()


@pytest.mark.parametrize("dtype", [np.float32, np.uint8, np.int8])
@OP_SETTINGS
@given(case=pad_cases(), int64_pads=st.booleans(), seed=SEEDS)
def test_pad(dtype, case, int64_pads, seed):
    """Quantized tensors pad with their zero point; TFLite's paddings may be int32 or int64."""
    rng = np.random.default_rng(seed)
    shape, pads = case
    q = None if dtype == np.float32 else random_quant_params(rng, dtype)
    model = _model(dtype, shape, pads, q, pad_dtype=np.int64 if int64_pads else np.int32)
    assert_matches_tflite(model, [random_tensor(rng, shape, dtype, -4, 4)])


def _nnapi(t, shape, out_shape, pads, q=(0.0, 0), out_q=None, out_type=None, extra=0):
    m = ModelBuilder()
    x = m.add_operand(t, shape, *q)
    p = pads(m) if callable(pads) else m.add_constant(I32, np.array(pads, np.int32))
    y = m.add_operand(t if out_type is None else out_type, out_shape, *(out_q or q))
    m.add_operation(OperationType.PAD, [x, p] + [m.add_int32(0) for _ in range(extra)], [y])
    m.identify_inputs_and_outputs([x], [y])
    return m.finish()


def _fails(model, text):
    with pytest.raises(HalError, match=text):
        compile_model(model)


def test_signature():
    _fails(_nnapi(F32, [2, 3], [4, 3], [[1, 1], [0, 0]], extra=1), r"PAD\): expected 2 inputs, got 3")
    _fails(_nnapi(OperandType.TENSOR_INT32, [2], [4], [[1, 1]]), "input 0 must be of type TENSOR_FLOAT32")
    _fails(_nnapi(F32, [2, 3], [4, 3], [[1, 1]]), r"paddings\) must have shape \[2, 2\], got \[1, 2\]")
    _fails(_nnapi(F32, [2, 3], [4, 3], [[1, 1, 0], [0, 0, 0]]), r"must have shape \[2, 2\], got \[2, 3\]")
    _fails(_nnapi(F32, [2, 3], [1, 3], [[-1, 0], [0, 0]]), "must be non-negative")
    _fails(_nnapi(F32, [2], [4], lambda m: m.add_int32(1)), "input 1 must be of type TENSOR_INT32, got INT32")
    _fails(_nnapi(F32, [1, 1, 1, 1, 2], [1, 1, 1, 1, 2], [[0, 0]] * 5), "rank <= 4, got 5")
    _fails(_nnapi(QS8, [2], [4], [[1, 1]], q=(0.5, 3), out_q=(0.5, 4)),
           r"output 0 quantization \(scale=0.5, zero_point=4\) must equal input 0")
    _fails(_nnapi(F32, [2], [5], [[1, 1]]),
           r"output 0 shape \[5\] is incompatible with the computed shape \[4\]")


def test_paddings_must_be_constant():
    m = ModelBuilder()
    x = m.add_operand(F32, [2])
    p = m.add_operand(I32, [1, 2])
    y = m.add_operand(F32, [4])
    m.add_operation(OperationType.PAD, [x, p], [y])
    m.identify_inputs_and_outputs([x, p], [y])
    _fails(m.finish(), r"input 1 \(paddings\) must be a constant operand")


def _refused(model, text):
    with pytest.raises(MappingError, match=text):
        convert_partition(read_model(model))


def test_mapping_refusals():
    _refused(_model(np.float32, [2, 3], [[1, 1], [0, 0]], pads_as_input=True), "must be a constant tensor")
    _refused(_model(np.float32, [1, 1, 1, 1, 2], [[0, 0]] * 5),
             "NNAPI PAD rejects it: input 0 must have rank <= 4, got 5")
    q1, q2 = {"scale": 0.5, "zero_point": 1}, {"scale": 0.5, "zero_point": 2}
    _refused(_model(np.uint8, [2], [[1, 1]], q1, q2),
             r"NNAPI PAD rejects it: output 0 quantization \(scale=0.5, zero_point=2\) must equal input 0")
