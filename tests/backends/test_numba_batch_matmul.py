"""The numba backend's int8 BATCH_MATMUL (the GEMM tiles: VNNI, AMX where the CPU has it) against
the reference backend, bit for bit: constant and computed right-hand sides, adj_x / adj_y, batch
dimensions, depths that are and are not whole 4-byte blocks, blocks of rows the AMX tiles take,
zero points at both ends of int8 (both operands' folded into the tiles' bias and row term), the
bound path and the compilation cache. tests/ops/test_batch_matmul.py compares the same backend
with TFLite's reference kernel on random shapes (its default backend order runs numba first)."""
from __future__ import annotations

import numpy as np
import pytest

numba_kernels = pytest.importorskip("hal.backends.numba_kernels")

from hal.backends.numba_kernels import batch_matmul, vnni  # noqa: E402
from hal.compiler import compile_model  # noqa: E402
from hal.executor import bind, execute  # noqa: E402
from hal.model import ModelBuilder  # noqa: E402
from hal.serialize import dump_compiled, load_compiled  # noqa: E402
from hal.types import OperandType, OperationType  # noqa: E402
from tests.backends.differential import assert_matches_reference  # noqa: E402

QS8 = OperandType.TENSOR_QUANT8_ASYMM_SIGNED
pytestmark = pytest.mark.skipif(not vnni.AVAILABLE, reason="no AVX-512 VNNI: the reference backend runs it")


def _model(batch, rows, depth, cols, adj_x, adj_y, rhs_value=None, zps=(3, -7, 11), out_scale=None):
    """BATCH_MATMUL of [*batch, rows, depth] by [*batch, depth, cols] (stored transposed under adj);
    ``rhs_value``: a constant right-hand side, else a model input."""
    x_zp, y_zp, o_zp = zps
    lhs = [*batch, depth, rows] if adj_x else [*batch, rows, depth]
    rhs = [*batch, cols, depth] if adj_y else [*batch, depth, cols]
    mb = ModelBuilder()
    x = mb.add_operand(QS8, lhs, scale=0.05, zero_point=x_zp)
    if rhs_value is None:
        y = mb.add_operand(QS8, rhs, scale=0.02, zero_point=y_zp)
    else:
        y = mb.add_constant(QS8, rhs_value.reshape(rhs), scale=0.02, zero_point=y_zp)
    # an output scale that spreads the sums over int8, saturating some of them
    scale = out_scale if out_scale is not None else 0.05 * 0.02 * 40 * np.sqrt(depth)
    out = mb.add_operand(QS8, (), scale=float(scale), zero_point=o_zp)
    mb.add_operation(OperationType.BATCH_MATMUL, [x, y, mb.add_bool(adj_x), mb.add_bool(adj_y)], [out])
    mb.identify_inputs_and_outputs([x] if rhs_value is not None else [x, y], [out])
    return mb.finish(), lhs, rhs


def _data(model):
    steps = compile_model(model, backend_order=["numba", "reference"]).static_plan.steps
    assert steps[0].backend == "numba"
    return steps[0].ctx.data


def _check(model, lhs, rhs, constant: bool, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.integers(-128, 128, lhs).astype(np.int8)
    inputs = [x] if constant else [x, rng.integers(-128, 128, rhs).astype(np.int8)]
    assert_matches_reference(model, inputs, "numba")
    for v in (-128, 127):  # the largest sums either way
        assert_matches_reference(model, [np.full(a.shape, v, np.int8) for a in inputs], "numba")


@pytest.mark.parametrize("constant", [True, False])
@pytest.mark.parametrize("adj_x,adj_y", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("batch,rows,depth,cols", [
    ((), 1, 1, 1),
    ((), 5, 7, 3),  # a depth that is not whole 4-byte blocks: rows copied and padded
    ((2,), 6, 16, 17),  # read in place (not adj_x); a column past one panel
    ((2, 3), 9, 12, 40),  # rank 4: six slices
    ((), 40, 70, 33),  # blocks of 32 rows and a depth of two 64-byte tile rows (the AMX tiles where present)
    ((3,), 33, 128, 64),
])
def test_matches_the_reference(batch, rows, depth, cols, adj_x, adj_y, constant):
    rng = np.random.default_rng(rows * depth + cols)
    shape_y = [*batch, cols, depth] if adj_y else [*batch, depth, cols]
    value = rng.integers(-128, 128, shape_y).astype(np.int8) if constant else None
    model, lhs, rhs = _model(batch, rows, depth, cols, adj_x, adj_y, value)
    d = _data(model)
    assert isinstance(d, batch_matmul.IntBatchMatmul) and (d.plans is not None) == constant
    _check(model, lhs, rhs, constant)


@pytest.mark.parametrize("zps", [(-128, -128, -128), (127, 127, 127), (-128, 127, 0), (0, 0, 0)])
def test_zero_points_at_both_ends(zps):
    """Each zero point folds into the bias (the left-hand side's) or the row term (the right-hand
    side's); 0 for the right-hand side leaves no row term."""
    for constant in (True, False):
        value = np.random.default_rng(5).integers(-128, 128, (2, 20, 24)).astype(np.int8) if constant else None
        model, lhs, rhs = _model((2,), 13, 20, 24, False, False, value, zps=zps)
        _check(model, lhs, rhs, constant, seed=sum(zps) & 0xFF)


def test_multipliers_above_one():
    """An output scale below the inputs' product: a multiplier of 1 or more (a left shift)."""
    model, lhs, rhs = _model((), 7, 9, 5, False, True, out_scale=0.0004)
    _check(model, lhs, rhs, constant=False)


@pytest.mark.parametrize("constant", [True, False])
def test_the_bound_path_reads_the_inputs_at_each_run(constant):
    rng = np.random.default_rng(3)
    value = rng.integers(-128, 128, (2, 48, 36)).astype(np.int8) if constant else None
    model, lhs, rhs = _model((2,), 35, 36, 48, False, True, value)
    compiled = compile_model(model, backend_order=["numba", "reference"])
    reference = compile_model(model, backend_order=["reference"])
    x = np.empty(lhs, np.int8)
    ins = [x] if constant else [x, np.empty(rhs, np.int8)]
    out = np.empty((2, 35, 48), np.int8)
    runner = bind(compiled, ins, [out])
    assert runner is not None
    for seed in range(3):
        r = np.random.default_rng(seed)
        for a in ins:
            a[...] = r.integers(-128, 128, a.shape)
        runner(None, None, None)
        np.testing.assert_array_equal(out, execute(reference, ins)[0])


def test_a_cached_plan_loads_and_runs():
    value = np.random.default_rng(9).integers(-128, 128, (3, 30, 22)).astype(np.int8)
    model, lhs, _ = _model((3,), 11, 30, 22, True, False, value)
    compiled = compile_model(model, backend_order=["numba", "reference"])
    payload, arrays = dump_compiled(compiled)
    loaded = load_compiled(payload, [a.copy() for a in arrays], backend_order=["numba", "reference"])
    assert isinstance(loaded.static_plan.steps[0].ctx.data, batch_matmul.IntBatchMatmul)
    x = np.random.default_rng(1).integers(-128, 128, lhs).astype(np.int8)
    np.testing.assert_array_equal(execute(loaded, [x])[0], execute(compiled, [x])[0])


def test_without_vnni_the_reference_backend_runs_it(monkeypatch):
    monkeypatch.setattr(vnni, "AVAILABLE", False)
    model, _, _ = _model((), 4, 8, 4, False, False)
    steps = compile_model(model, backend_order=["numba", "reference"]).static_plan.steps
    assert steps[0].backend == "reference"


@pytest.mark.parametrize("constant", [True, False])
def test_threads_split_each_slices_rows(monkeypatch, constant):
    """``--threads``: a slice large enough to split runs its rows on several workers (a computed
    right-hand side then packs slice by slice in Python, not in the one native call)."""
    from hal import backends
    monkeypatch.setattr(backends, "compute_threads", lambda: 3)
    value = np.random.default_rng(4).integers(-128, 128, (2, 128, 160)).astype(np.int8)
    model, lhs, rhs = _model((2,), 100, 128, 160, False, False, value if constant else None)
    _check(model, lhs, rhs, constant)
