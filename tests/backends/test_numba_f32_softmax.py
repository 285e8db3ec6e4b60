"""The numba backend's float32 SOFTMAX (numba_kernels/f32_softmax.py) against the reference backend
and the CTS: every float32 SOFTMAX case of the corpus (axes, betas), a NaN row, and the bound form."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("hal.backends.numba_kernels")

from hal.compiler import compile_model  # noqa: E402
from hal.executor import bind as hal_bind  # noqa: E402
from hal.executor import execute  # noqa: E402
from hal.model import ModelBuilder  # noqa: E402
from hal.types import OperandType, OperationType  # noqa: E402
from tests.backends.differential import compare, float_cts_examples_on  # noqa: E402

F32 = OperandType.TENSOR_FLOAT32


def test_cts_float_cases_meet_the_cts_and_the_reference():
    ran = float_cts_examples_on("numba", "SOFTMAX", OperationType.SOFTMAX, ["numba", "reference"])
    assert ran >= 10, f"only {ran} float CTS examples ran on the numba kernel"


def test_a_nan_makes_its_row_nan_and_the_bound_form_writes_the_same_bytes():
    b = ModelBuilder()
    x = b.add_operand(F32, (3, 1000))
    y = b.add_operand(F32, (3, 1000))
    b.add_operation(OperationType.SOFTMAX, [x, b.add_float32(0.7)], [y])
    b.identify_inputs_and_outputs([x], [y])
    model = b.finish()
    args = [np.random.default_rng(0).uniform(-20, 20, (3, 1000)).astype(np.float32)]
    args[0][1, 17] = np.nan
    compiled = compile_model(model, backend_order=["numba", "reference"])
    got = execute(compiled, args)[0]
    want = execute(compile_model(model, backend_order=["reference"]), args)[0]
    assert compare(got, want) is None and np.isnan(got[1]).all() and not np.isnan(got[[0, 2]]).any()
    out = np.empty_like(got)
    hal_bind(compiled, [args[0].copy()], [out])(None, None, None)
    assert np.array_equal(out, got, equal_nan=True)


@pytest.mark.parametrize("shape,axis", [((2, 1), -1), ((4, 5), -1), ((1, 16), -1), ((3, 17), -1), ((1, 1001), -1),
                                        ((2, 7, 3), 1), ((2, 1, 1, 1000), 3)])
def test_row_lengths_off_the_vectors_and_other_axes(shape, axis):
    """The last axis in 16-lane vectors (whole ones, a masked last one, or only that), another axis
    in the scalar loop: values across exp's range (underflowing ones, infinities) against the
    reference and CTS's float criteria."""
    b = ModelBuilder()
    x, y = b.add_operand(F32, shape), b.add_operand(F32, shape)
    b.add_operation(OperationType.SOFTMAX, [x, b.add_float32(1.0), b.add_int32(axis)], [y])
    b.identify_inputs_and_outputs([x], [y])
    model = b.finish()
    rng = np.random.default_rng(shape[-1])
    args = [rng.uniform(-120, 30, shape).astype(np.float32)]
    args[0].reshape(-1)[::7] = -np.inf
    compiled = compile_model(model, backend_order=["numba", "reference"])
    assert [s.backend for s in compiled.static_plan.program] == ["numba"]
    got = execute(compiled, args)[0]
    want = execute(compile_model(model, backend_order=["reference"]), args)[0]
    assert compare(got, want) is None
    rows = ~np.isnan(want.sum(axis=axis))  # a row of -inf only is NaN in both
    assert rows.any() and np.allclose(got.sum(axis=axis)[rows], 1, atol=1e-5)
