"""MEAN vs TFLite (BUILTIN_REF): float32 within tolerance, uint8/int8 bit-exact (spatial [1, 2]
means as in pooling heads, and arbitrary axis sets); axes given at execution; the variants that are
not delegated; NNAPI validation errors. (float16 is covered by CTS.)"""
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
from tests.harness import OP_SETTINGS, assert_matches_tflite, random_quant_params, random_tensor, tflite_run

F32 = OperandType.TENSOR_FLOAT32
I32 = OperandType.TENSOR_INT32
QU8 = OperandType.TENSOR_QUANT8_ASYMM
QS8 = OperandType.TENSOR_QUANT8_ASYMM_SIGNED
MEAN = OperationType.MEAN

COVERED = {(MEAN, F32), (MEAN, QU8), (MEAN, QS8)}


@st.composite
def mean_cases(draw):
    """(input shape, raw axis list, keep_dims); a third are 4-D spatial means (larger counts)."""
    if draw(st.integers(0, 2)) == 0:
        shape = [draw(st.integers(1, 3)), draw(st.integers(1, 9)), draw(st.integers(1, 9)),
                 draw(st.integers(1, 5))]
        return shape, draw(st.sampled_from([[1, 2], [2, 1]])), True
    shape = draw(st.lists(st.integers(1, 6), min_size=1, max_size=4))
    rank = len(shape)
    picked = draw(st.lists(st.integers(0, rank - 1), min_size=1, max_size=rank + 1))  # dups allowed
    axes = [a - rank if draw(st.booleans()) else a for a in picked]
    keep = draw(st.booleans())
    if not keep and len(set(picked)) == rank:
        keep = True  # a full reduction without keep_dims is a TFLite scalar (not mapped)
    return shape, axes, keep


def _out_shape(shape, axes, keep):
    red = {a % len(shape) for a in axes}
    if keep:
        return [1 if i in red else d for i, d in enumerate(shape)]
    return [d for i, d in enumerate(shape) if i not in red]


def _model(dtype, shape, axes, keep, qx=None, qy=None):
    m = TfLiteModelBuilder()
    x = m.add_input("x", shape, dtype, **(qx or {}))
    a = m.add_constant("axis", np.asarray(axes, np.int32))
    y = m.add_tensor("y", _out_shape(shape, axes, keep), dtype, **(qy or qx or {}))
    m.add_operator("MEAN", [x, a], [y], ("ReducerOptions", {"keep_dims": keep}))
    m.set_outputs([y])
    return m.build()


@OP_SETTINGS
@given(case=mean_cases(), seed=st.integers(0, 2**32 - 1))
def test_mean_float32(case, seed):
    rng = np.random.default_rng(seed)
    shape, axes, keep = case
    assert_matches_tflite(_model(np.float32, shape, axes, keep),
                          [random_tensor(rng, shape, np.float32, -4, 4)])


@OP_SETTINGS
@given(case=mean_cases(), dtype=st.sampled_from([np.uint8, np.int8]), seed=st.integers(0, 2**32 - 1))
def test_mean_quant8(case, dtype, seed):
    rng = np.random.default_rng(seed)
    shape, axes, keep = case
    q = random_quant_params(rng, dtype)
    assert_matches_tflite(_model(dtype, shape, axes, keep, q), [random_tensor(rng, shape, dtype)])


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("axes", [[1, 2], [-3, -2], [2]])
def test_mean_quant8_rounding(dtype, axes):
    """Means that are exact halves or quarters, above and below the zero point."""
    info = np.iinfo(dtype)
    x = np.array([info.min, info.min + 1, info.max, info.max - 2, 3, 4, 0, 1],
                 dtype).reshape(1, 2, 2, 2).repeat(3, axis=3)
    for zp in (info.min, 0, 7, info.max):
        q = {"scale": 0.02, "zero_point": zp}
        assert_matches_tflite(_model(dtype, [1, 2, 2, 6], axes, True, q), [x])


# ---- TFLite variants that are not delegated --------------------------------------------------

def _mapping_error(model: bytes) -> str:
    with pytest.raises(MappingError) as e:
        convert_partition(read_model(model))
    return str(e.value)


def test_different_output_quantization_is_not_nnapi_mean():
    """It maps to nnhal's com.nnhal.tflite:QUANTIZED_MEAN instead (tests/ops/test_mean_requantized.py)."""
    model = _model(np.int8, [1, 3, 3, 2], [1, 2], True, {"scale": 0.1, "zero_point": 0},
                   {"scale": 0.05, "zero_point": 1})
    (op,) = convert_partition(read_model(model)).model.main.operations
    assert op.type >> 16 != 0


def test_full_reduction_without_keep_dims_not_mapped():
    m = TfLiteModelBuilder()
    x = m.add_input("x", [2, 3])
    a = m.add_constant("axis", np.array([0, 1], np.int32))
    y = m.add_tensor("y", [])
    m.add_operator("MEAN", [x, a], [y], ("ReducerOptions", {"keep_dims": False}))
    m.set_outputs([y])
    assert "scalar" in _mapping_error(m.build())


def test_empty_axis_not_mapped():
    """An empty axis list (read back as a tensor without data) is never delegated."""
    model = _model(np.float32, [2, 3], [], True)
    assert "axis" in _mapping_error(model)


# ---- NNAPI semantics and validation ----------------------------------------------------------

def _nnapi_mean(shape=(2, 3, 4), axes=(1,), keep=0, t=F32, axes_type=I32, n_inputs=3,
                out_q=None, out_type=None):
    q = {"scale": 0.5, "zero_point": 3} if t in (QU8, QS8) else {}
    mb = ModelBuilder()
    x = mb.add_operand(t, shape, **q)
    a = mb.add_constant(axes_type, np.asarray(axes), dimensions=(len(axes),) if axes else (1,))
    out_type = out_type or t
    y = mb.add_operand(out_type, (), **(out_q or ({} if out_type in (F32, I32) else q)))
    mb.add_operation(MEAN, [x, a, mb.add_int32(keep)][:n_inputs], [y])
    mb.identify_inputs_and_outputs([x], [y])
    return mb.finish()


def test_runtime_axes_match_tflite():
    """Axes given at execution (a model input, not a constant) reduce as the same constant axes do."""
    rng = np.random.default_rng(3)
    x = random_tensor(rng, (2, 3, 4), np.float32, -4, 4)
    (want,) = tflite_run(_model(np.float32, [2, 3, 4], [-1, 0], False), [x])
    mb = ModelBuilder()
    xi, ai = mb.add_operand(F32, (2, 3, 4)), mb.add_operand(I32, (2,))
    y = mb.add_operand(F32, ())
    mb.add_operation(MEAN, [xi, ai, mb.add_int32(0)], [y])
    mb.identify_inputs_and_outputs([xi, ai], [y])
    (got,) = execute(compile_model(mb.finish()), [x, np.array([-1, 0], np.int32)])
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_full_reduction_gives_shape_1():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    (y,) = execute(compile_model(_nnapi_mean(shape=(2, 3), axes=(0, -1, 1))), [x])
    assert y.shape == (1,) and y[0] == np.float32(2.5)


@pytest.mark.parametrize("kwargs, message", [
    ({"n_inputs": 2}, "expected 3 inputs, got 2"),
    ({"t": I32}, "input 0 must be of type"),
    ({"out_type": QU8, "out_q": {"scale": 0.5, "zero_point": 3}}, "output 0 must be of type"),
    ({"shape": (1, 2, 3, 4, 5)}, "input 0 must have rank 1 to 4, got 5"),
    ({"axes_type": F32}, "input 1 must be of type TENSOR_INT32"),
    ({"axes": (3,)}, "axis 3 is out of range for an input of rank 3"),
    ({"axes": (-4,)}, "axis -4 is out of range"),
    ({"t": QS8, "out_q": {"scale": 0.25, "zero_point": 3}}, "quantization (scale=0.25"),
])
def test_validation_errors(kwargs, message):
    with pytest.raises(HalError) as e:
        compile_model(_nnapi_mean(**kwargs))
    assert "operation 0 (MEAN)" in str(e.value)
    assert message in str(e.value)


@pytest.mark.parametrize("dtype, q", [(np.float32, {}), (np.int8, {"scale": 0.5, "zero_point": 3}),
                                      (np.uint8, {"scale": 0.5, "zero_point": 3})])
def test_empty_reduction_matches_tflite(dtype, q):
    """MEAN accepts a zero-sized input (here a STRIDED_SLICE's empty result): NaN, or 0 when
    quantized, as TFLite gives."""
    b = TfLiteModelBuilder()
    x = b.add_input("x", [2, 3], dtype, **q)
    vec = [b.add_constant(name, np.array(v, np.int32)) for name, v in (("b", [0, 0]), ("e", [0, 3]), ("s", [1, 1]))]
    sl = b.add_tensor("sl", [0, 3], dtype, **q)
    b.add_operator("STRIDED_SLICE", [x, *vec], [sl], ("StridedSliceOptions", {
        "begin_mask": 0, "end_mask": 0, "ellipsis_mask": 0, "new_axis_mask": 0, "shrink_axis_mask": 0}))
    y = b.add_tensor("y", [1, 3], dtype, **q)
    b.add_operator("MEAN", [sl, b.add_constant("ax", np.array([0], np.int32))], [y],
                   ("ReducerOptions", {"keep_dims": True}))
    b.set_outputs([y])
    assert_matches_tflite(b.build(), [np.ones((2, 3), dtype)])
