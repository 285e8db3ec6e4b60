"""LSH_PROJECTION vs TFLite's LSH_PROJECTION (the same FarmHash Fingerprint64 of seed + row bytes):
rows of many byte lengths, so every length class of FarmHash (0-16, 17-32, 33-64 and the 64-byte
block loop) is exercised, not only the 12-byte keys of the CTS vectors. Plus the two sparse types'
relation, the omitted weight, and NNAPI's rules."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tflite.LSHProjectionType import LSHProjectionType

from delegate.tfl import TfLiteModelBuilder
from hal.compiler import compile_model
from hal.errors import HalError
from hal.executor import execute
from hal.model import ModelBuilder
from hal.types import ErrorStatus, OperandType, OperationType
from tests.harness import tflite_run

F32 = OperandType.TENSOR_FLOAT32
LSH = OperationType.LSH_PROJECTION
SPARSE_DEPRECATED, DENSE, SPARSE = 1, 2, 3
NUMPY_TYPES = {np.uint8: OperandType.TENSOR_QUANT8_ASYMM, np.int32: OperandType.TENSOR_INT32,
               np.float32: OperandType.TENSOR_FLOAT32}


def _tflite(seeds, x, w, kind):
    m = TfLiteModelBuilder()
    h = m.add_constant("hash", seeds, np.float32)
    xi = m.add_input("x", list(x.shape), x.dtype, **({"scale": 1.0, "zero_point": 0} if x.dtype == np.uint8 else {}))
    wi = m.add_input("w", [x.shape[0]], np.float32)
    n = seeds.size if kind == DENSE else seeds.shape[0]
    y = m.add_tensor("y", [n], np.int32)
    tfl_kind = LSHProjectionType.DENSE if kind == DENSE else LSHProjectionType.SPARSE
    m.add_operator("LSH_PROJECTION", [h, xi, wi], [y], ("LSHProjectionOptions", {"type": tfl_kind}))
    m.set_outputs([y])
    return tflite_run(m.build(), [x, w])[0]


def _hal(seeds, x, w, kind, out_len=None):
    b = ModelBuilder()
    h = b.add_constant(F32, seeds)
    xi = b.add_operand(NUMPY_TYPES[x.dtype.type], x.shape, **({"scale": 1.0} if x.dtype == np.uint8 else {}))
    wi = b.add_operand(F32, (x.shape[0],))
    if w is None:
        b.set_no_value(wi)
    n = out_len or (seeds.size if kind == DENSE else seeds.shape[0])
    y = b.add_operand(OperandType.TENSOR_INT32, (n,))
    b.add_operation(LSH, [h, xi, wi, b.add_int32(kind)], [y])
    b.identify_inputs_and_outputs([xi] + ([] if w is None else [wi]), [y])
    return execute(compile_model(b.finish()), [x] + ([] if w is None else [w]))[0]


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), rows=st.integers(1, 4), row_bytes=st.integers(1, 150),
       num_hash=st.integers(1, 4), num_bits=st.integers(1, 8), dense=st.booleans(),
       dtype=st.sampled_from([np.uint8, np.int32, np.float32]))
def test_matches_tflite(seed, rows, row_bytes, num_hash, num_bits, dense, dtype):
    rng = np.random.default_rng(seed)
    width = max(1, row_bytes // np.dtype(dtype).itemsize)
    x = (rng.integers(0, 256, (rows, width)) if dtype == np.uint8 else
         rng.integers(-10**6, 10**6, (rows, width)) if dtype == np.int32 else
         rng.normal(size=(rows, width))).astype(dtype)
    seeds = rng.normal(size=(num_hash, num_bits)).astype(np.float32)
    w = rng.normal(size=rows).astype(np.float32)
    kind = DENSE if dense else SPARSE
    np.testing.assert_array_equal(_hal(seeds, x, w, kind), _tflite(seeds, x, w, kind))


def test_omitted_weight_is_weight_one_and_deprecated_sparse_has_no_offsets():
    rng = np.random.default_rng(7)
    x = rng.integers(-1000, 1000, (3, 5)).astype(np.int32)
    seeds = rng.normal(size=(4, 3)).astype(np.float32)
    ones = np.ones(3, np.float32)
    for kind in (SPARSE_DEPRECATED, DENSE, SPARSE):
        np.testing.assert_array_equal(_hal(seeds, x, None, kind), _hal(seeds, x, ones, kind))
    offsets = np.arange(4) << 3
    np.testing.assert_array_equal(_hal(seeds, x, None, SPARSE) - offsets, _hal(seeds, x, None, SPARSE_DEPRECATED))


@pytest.mark.parametrize("seeds_shape, kind, match", [
    ((2, 33), DENSE, "num_bits"),
    ((2, 3), 4, "type must be"),
    ((6,), SPARSE, "rank"),
])
def test_rejects(seeds_shape, kind, match):
    seeds = np.zeros(seeds_shape, np.float32)
    x = np.zeros((3, 2), np.int32)
    with pytest.raises(HalError, match=match) as e:
        _hal(seeds, x, None, kind, out_len=2)
    assert e.value.status == ErrorStatus.INVALID_ARGUMENT


def test_rejects_weight_of_another_length():
    b = ModelBuilder()
    h = b.add_constant(F32, np.zeros((2, 2), np.float32))
    xi, wi = b.add_operand(OperandType.TENSOR_INT32, (3, 2)), b.add_operand(F32, (4,))
    y = b.add_operand(OperandType.TENSOR_INT32, (4,))
    b.add_operation(LSH, [h, xi, wi, b.add_int32(DENSE)], [y])
    b.identify_inputs_and_outputs([xi, wi], [y])
    with pytest.raises(HalError, match="weight") as e:
        compile_model(b.finish())
    assert e.value.status == ErrorStatus.INVALID_ARGUMENT
