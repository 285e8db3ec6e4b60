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
