"""The numba backend's float32 FULLY_CONNECTED (numba_kernels/fc_float.py) and its ``fc_chain``
step against the reference backend, with NNAPI CTS's float criteria: every CTS case of float
FULLY_CONNECTED it takes, perceptrons of several shapes, activations and batches (one fused step,
also after the compilation cache and when bound to fixed arrays), and the rule that hands a graph
backend's run of chained FULLY_CONNECTED layers to it (and the runs it leaves alone)."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("hal.backends.numba_kernels")
pytest.importorskip("hal.backends.ort")

from hal.backends.numba_kernels import fc_float  # noqa: E402
from hal.backends.numba_kernels.conv import FC  # noqa: E402
from hal.compiler import compile_model  # noqa: E402
from hal.executor import bind as hal_bind  # noqa: E402
from hal.executor import execute  # noqa: E402
from hal.fusion import FC_CHAIN, FusedContext  # noqa: E402
from hal.model import ModelBuilder  # noqa: E402
from hal.plan import PartitionContext  # noqa: E402
from hal.registry import OperationContext  # noqa: E402
from hal.serialize import dump_compiled, load_compiled  # noqa: E402
from hal.types import ExecutionPreference, OperandType, OperationType, Priority  # noqa: E402
from service.execution import PreparedModel  # noqa: E402
from tests.backends.differential import compare, float_cts_examples_on  # noqa: E402

F32 = OperandType.TENSOR_FLOAT32
ORDER = ["onnxruntime", "numba", "reference"]


def test_cts_float_cases_it_takes_meet_the_cts_and_the_reference():
    ran = float_cts_examples_on("numba", "FULLY_CONNECTED", FC, ["numba", "reference"])
    assert ran >= 5, f"only {ran} float CTS examples ran on the numba kernel"


def _mlp(sizes, acts, batch=1, rng=None, *, tail=None, middle_out=False, weight_input=False):
    """x [batch, sizes[0]] through FULLY_CONNECTED layers of sizes[1:] units (activations ``acts``);
    ``tail``: an operation after the last layer (SOFTMAX); ``middle_out``: the first layer's
    output is a model output too; ``weight_input``: the last layer's weights are a model input."""
    rng = rng or np.random.default_rng(0)
    mb = ModelBuilder()
    x = cur = mb.add_operand(F32, (batch, sizes[0]))
    inputs, outputs = [x], []
    for n, (k, units, act) in enumerate(zip(sizes, sizes[1:], acts)):
        w = (rng.standard_normal((units, k)) / np.sqrt(k)).astype(np.float32)
        if weight_input and n == len(acts) - 1:
            wi = mb.add_operand(F32, (units, k))
            inputs.append(wi)
        else:
            wi = mb.add_constant(F32, w)
        b = mb.add_constant(F32, rng.uniform(-0.5, 0.5, units).astype(np.float32))
        y = mb.add_operand(F32, (batch, units))
        mb.add_operation(OperationType.FULLY_CONNECTED, [cur, wi, b, mb.add_int32(act)], [y])
        if middle_out and n == 0:
            outputs.append(y)
        cur = y
    if tail is not None:
        z = mb.add_operand(F32, (batch, sizes[-1]))
        mb.add_operation(tail, [cur, mb.add_float32(1.0)], [z])
        cur = z
    mb.identify_inputs_and_outputs(inputs, [*outputs, cur])
    return mb.finish()


def _inputs(model, rng):
    sg = model.main
    return [rng.uniform(-2, 2, sg.operands[i].dimensions).astype(np.float32) for i in sg.input_indexes]


def _assert_matches_reference(model, compiled, args):
    got = execute(compiled, args)
    want = execute(compile_model(model, backend_order=["reference"]), args)
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        why = compare(g, w)
        assert why is None, f"output {k}: {why}"
    return got


@pytest.mark.parametrize("sizes,acts,batch", [
    ((256, 512, 512, 10), (1, 1, 0), 1),
    ((37, 33, 70, 5), (3, 2, 1), 1),   # widths off the 32-unit tile, RELU6 / RELU1 / RELU
    ((16, 16), (0,), 1),
    ((64, 40, 3), (1, 0), 4),
    ((9, 100, 31, 1), (0, 3, 0), 2),
    ((48, 96, 130, 7), (1, 3, 0), 3),  # tiles in pairs, a single one left, a narrow last tile
    ((20, 128, 50), (2, 1), 4),        # pairs only; 50 units: a whole tile and a wide partial one
    ((24, 224, 40), (1, 0), 2),        # 7 whole tiles: a quad, a pair and a single one
    ((30, 300, 12), (3, 0), 1),        # 9 whole tiles: two quads and a single one, then a narrow one
])
def test_a_perceptron_is_one_numba_step_that_matches_the_reference(sizes, acts, batch):
    rng = np.random.default_rng(len(sizes) * 7 + batch)
    model = _mlp(sizes, acts, batch, rng)
    compiled = compile_model(model, backend_order=ORDER)
    program = compiled.static_plan.program
    if len(acts) == 1:  # a single layer is not a chain: one numba step (hal.compiler's
        # ``_whole_run_instead``, at one compute thread), else the graph backend's partition
        assert [s.backend for s in program] == (["numba"] if _numba_takes_runs() else ["onnxruntime"])
        assert type(program[0].ctx) is (OperationContext if _numba_takes_runs() else PartitionContext)
        _assert_matches_reference(model, compiled, _inputs(model, rng))
        return
    assert len(program) == 1 and isinstance(program[0].ctx, FusedContext), program
    assert program[0].ctx.pattern == FC_CHAIN and program[0].backend == "numba"
    assert program[0].operations == tuple(range(len(acts)))
    for _ in range(3):
        _assert_matches_reference(model, compiled, _inputs(model, rng))


def test_nan_and_infinity_propagate_as_in_the_reference():
    rng = np.random.default_rng(3)
    model = _mlp((8, 40, 6), (1, 0), 1, rng)
    compiled = compile_model(model, backend_order=ORDER)
    x = _inputs(model, rng)
    x[0][0, 2] = np.nan
    got = _assert_matches_reference(model, compiled, x)
    assert np.isnan(got[0]).all()
    x[0][0, 2] = np.inf  # inf times weights of both signs: NaN after the sum, as in the reference
    _assert_matches_reference(model, compiled, x)


@pytest.mark.parametrize("kind", ["batch", "weight_input"])
def test_runs_numba_does_not_take_whole_stay_with_the_graph_backend(kind):
    rng = np.random.default_rng(11)
    model = {"batch": lambda: _mlp((32, 48, 8), (1, 0), fc_float.MAX_BATCH + 1, rng),
             "weight_input": lambda: _mlp((32, 48, 8), (1, 0), 1, rng, weight_input=True)}[kind]()
    compiled = compile_model(model, backend_order=ORDER)
    assert not any(isinstance(s.ctx, FusedContext) for s in compiled.static_plan.program)
    assert {s.backend for s in compiled.static_plan.steps} == {"onnxruntime"}
    _assert_matches_reference(model, compiled, _inputs(model, rng))


@pytest.mark.parametrize("kind", ["tail", "middle_out"])
def test_a_chain_with_a_softmax_tail_or_a_middle_output(kind):
    """Every layer on numba (its float SOFTMAX too): a chain whose last layer feeds a SOFTMAX is
    fused and the SOFTMAX follows; a middle layer that is also an output breaks the chain. With
    $NNHAL_NUMBA_FLOAT_RUNS=0 onnxruntime keeps the run, unfused."""
    rng = np.random.default_rng(11)
    model = _mlp((32, 48, 8), (1, 0), 1, rng, **({"tail": OperationType.SOFTMAX} if kind == "tail"
                                                 else {"middle_out": True}))
    compiled = compile_model(model, backend_order=ORDER)
    program = compiled.static_plan.program
    if not _numba_takes_runs():
        assert {s.backend for s in program} == {"onnxruntime"}
    elif kind == "tail":
        assert [getattr(s.ctx, "pattern", None) for s in program] == [FC_CHAIN, None]
        assert {s.backend for s in program} == {"numba"}
    else:
        assert {s.backend for s in program} == {"numba"}
        assert not any(isinstance(s.ctx, FusedContext) for s in program)
    _assert_matches_reference(model, compiled, _inputs(model, rng))


def _numba_takes_runs() -> bool:
    """numba plans onnxruntime's float runs it covers (the default, at one compute thread)."""
    from hal import backends
    return bool(backends.get("numba").takes_runs) and backends.compute_threads() <= 1


def test_without_the_graph_backend_the_layers_are_chained_on_numba():
    rng = np.random.default_rng(5)
    model = _mlp((20, 30, 40, 7), (1, 1, 0), 1, rng)
    compiled = compile_model(model, backend_order=["numba", "reference"])
    assert [s.ctx.pattern for s in compiled.static_plan.program] == [FC_CHAIN]
    _assert_matches_reference(model, compiled, _inputs(model, rng))


def test_the_chain_survives_the_compilation_cache():
    rng = np.random.default_rng(9)
    model = _mlp((50, 64, 10), (1, 0), 2, rng)
    compiled = compile_model(model, backend_order=ORDER)
    loaded = load_compiled(*dump_compiled(compiled), backend_order=ORDER)
    assert [s.ctx.pattern for s in loaded.static_plan.program] == [FC_CHAIN]
    args = _inputs(model, rng)
    np.testing.assert_array_equal(execute(loaded, args)[0], execute(compiled, args)[0])


def test_bound_to_fixed_arrays_it_computes_into_them_with_one_perf_record():
    rng = np.random.default_rng(13)
    model = _mlp((64, 96, 96, 10), (1, 1, 0), 1, rng)
    compiled = compile_model(model, backend_order=ORDER)
    x = np.zeros((1, 64), np.float32)
    out = np.zeros((1, 10), np.float32)
    assert hal_bind(compiled, [x], [out]) is not None  # the fused step binds: no copy per execution
    pm = PreparedModel("m", compiled, ExecutionPreference.FAST_SINGLE_ANSWER, Priority.MEDIUM)
    bound = pm.bind([x], [out])
    for _ in range(3):
        x[...] = rng.uniform(-2, 2, x.shape)
        result = bound(None, 0)
        want = execute(compile_model(model, backend_order=["reference"]), [x.copy()])[0]
        assert compare(out, want) is None
        assert [(t.backend, t.count) for t in result.timings] == [("numba", 3)]
    executions, records = pm.perf.snapshot()
    assert executions == 3 and [(r.backend, r.count, r.executions) for r in records] == [("numba", 3, 3)]


def test_packed_weights_start_on_a_cache_line_and_narrow_last_tiles_take_sixteen_columns():
    rng = np.random.default_rng(17)
    model = _mlp((40, 70, 10), (1, 0), 1, rng)  # 70 = 2 tiles of 32 + 6; 10 < 16
    compiled = compile_model(model, backend_order=ORDER)
    loaded = load_compiled(*dump_compiled(compiled), backend_order=ORDER)
    for c in (compiled, loaded):
        d = c.static_plan.program[0].ctx.data
        assert d.weights.ctypes.data % 64 == 0
        assert d.weights.size == 40 * (2 * fc_float.TILE + 16) + 70 * 16
        _assert_matches_reference(model, c, _inputs(model, rng))


@pytest.mark.parametrize("rows,columns,budget", [(8, 2, 16), (8, 2, 6), (8, 1, 6), (7, 2, 6), (2, 8, 6), (1, 8, 6),
                                                  (4, 4, 6), (3, 1, 2), (1, 1, 1)])
def test_tile_parts_cover_every_sum_once_within_the_register_budget(rows, columns, budget):
    parts = fc_float.tile_passes(rows, columns, budget)
    covered = [(r, c) for part_rows, part_columns in parts for r in part_rows for c in part_columns]
    assert sorted(covered) == [(r, c) for r in range(rows) for c in range(columns)]
    assert all(len(r) * len(c) <= budget for r, c in parts)
    assert len(parts) == 1 if rows * columns <= budget else len(parts) > 1


def _tile_runner(rows: int, vectors: int, streams: int, budget: int):
    import numba
    tile = fc_float._tile_of(vectors, streams, budget)

    @numba.njit
    def run(w, x, k, b, lo, hi, out, n_out, count):
        tile(rows, w, 0, x, 0, k, b, 0, lo, hi, out, 0, n_out, count, 1)
    return run


@pytest.mark.parametrize("rows,vectors,streams,count", [(8, 2, 1, 32), (8, 2, 1, 21), (6, 2, 1, 24), (5, 2, 1, 16),
                                                         (7, 1, 1, 16), (6, 1, 1, 9), (4, 1, 1, 3),
                                                         (2, 2, 4, 32), (1, 2, 2, 32)])
def test_a_tile_run_in_parts_computes_what_one_part_computes(rows, vectors, streams, count):
    """A tile with more sums than AVX2's registers keep (budget 6) runs as several K loops; on any
    CPU it gives the bytes of the one-loop tile (the same fused multiply-adds in K order) and
    leaves the columns past ``count`` alone; both within CTS's float32 criteria of the float64
    product, as the reference computes it."""
    rng = np.random.default_rng(rows * 100 + vectors * 10 + streams)
    k, width = 37, vectors * fc_float.LANES
    n = streams * width
    weights = rng.standard_normal((n, k)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    x = rng.standard_normal((rows, k)).astype(np.float32)
    packed = fc_float.pack(weights)
    outs = []
    for budget in (6, 64):
        out = np.full((rows, n), np.nan, np.float32)
        _tile_runner(rows, vectors, streams, budget)(packed, x.reshape(-1), k, bias, np.float32(-2.5),
                                                     np.float32(3.0), out.reshape(-1), n, count)
        outs.append(out)
    np.testing.assert_array_equal(outs[0], outs[1])
    want = np.clip(x.astype(np.float64) @ weights.T.astype(np.float64) + bias, -2.5, 3.0)
    stored = np.zeros(n, bool)
    for s in range(streams):
        stored[s * width:s * width + count] = True
    got = outs[0]
    assert np.isnan(got[:, ~stored]).all()
    np.testing.assert_allclose(got[:, stored], want[:, stored], rtol=5 * 2.0 ** -23, atol=1e-5)
