"""The numba backend's float32 ADD, MUL, PRELU (numba_kernels/f32_elementwise.py) and MAX_POOL_2D,
AVERAGE_POOL_2D, PAD, PAD_V2, CONCATENATION, RESHAPE, STRIDED_SLICE (f32_layout.py) against the reference backend
with NNAPI CTS's float criteria: every float32 CTS case of these operations they take (and the
CTS's own judgement), randomized shapes and parameters (broadcast forms, channel counts off the
16-float vector, batch 2, fused activations, inf and NaN), the bound form (fixed arrays, steps
chained natively) giving the bytes ``execute`` gives, and the forms declined to the reference."""
from __future__ import annotations

import logging

import numpy as np
import pytest

pytest.importorskip("hal.backends.numba_kernels")

from hal.backends.numba_kernels.native_chain import NativeRun, chain  # noqa: E402
from hal.bound_program import BoundProgram, _nothing  # noqa: E402
from hal.compiler import compile_model  # noqa: E402
from hal.executor import OperationTiming, execute  # noqa: E402
from hal.executor import bind as hal_bind  # noqa: E402
from hal.model import ModelBuilder  # noqa: E402
from hal.serialize import dump_compiled, load_compiled  # noqa: E402
from hal.types import OperandType, OperationType  # noqa: E402
from tests.backends.differential import assert_matches_reference, float_cts_examples_on  # noqa: E402

F32, I32 = OperandType.TENSOR_FLOAT32, OperandType.TENSOR_INT32
Op = OperationType
ORDER = ["numba", "reference"]


# ---- (a) the CTS -------------------------------------------------------------------------------

@pytest.mark.parametrize("name,minimum", [("ADD", 4), ("MUL", 8), ("PRELU", 8), ("MAX_POOL_2D", 32),
                                          ("AVERAGE_POOL_2D", 40), ("PAD", 28), ("PAD_V2", 20),
                                          ("CONCATENATION", 14), ("RESHAPE", 16), ("STRIDED_SLICE", 8)])
def test_cts_float32_cases_meet_the_cts_and_the_reference(name, minimum):
    ran = float_cts_examples_on("numba", name, Op[name], ORDER)
    assert ran >= minimum, f"only {ran} float32 CTS examples of {name} ran on the numba kernels"


# ---- models ------------------------------------------------------------------------------------

def _model(op, in_shapes, out_shape, scalars=(), consts=None):
    """One ``op`` of float32 inputs ``in_shapes`` (input k constant where ``consts[k]`` is given),
    then ``scalars`` ((kind, value): "i" INT32, "f" FLOAT32, "b" BOOL, "t" an int32 tensor)."""
    mb = ModelBuilder()
    consts = consts or {}
    ins, model_inputs = [], []
    for k, shape in enumerate(in_shapes):
        if k in consts:
            ins.append(mb.add_constant(F32, np.asarray(consts[k], np.float32)))
        else:
            ins.append(mb.add_operand(F32, shape))
            model_inputs.append(ins[-1])
    for kind, v in scalars:
        ins.append({"i": mb.add_int32, "f": mb.add_float32, "b": mb.add_bool,
                    "t": lambda a: mb.add_constant(I32, np.asarray(a, np.int32))}[kind](v))
    y = mb.add_operand(F32, out_shape)
    mb.add_operation(op, ins, [y])
    mb.identify_inputs_and_outputs(model_inputs, [y])
    return mb.finish()


def _inputs(model, rng, special=False):
    sg = model.main
    xs = [rng.uniform(-3, 3, sg.operands[i].dimensions).astype(np.float32) for i in sg.input_indexes]
    if special:  # inf, -inf and NaN in every input, at a few places
        for x in xs:
            flat = x.reshape(-1)
            for v in (np.inf, -np.inf, np.nan):
                flat[rng.integers(0, flat.size, max(1, flat.size // 50))] = v
    return xs


def _on_numba(model) -> list[str]:
    return [s.backend for s in compile_model(model, backend_order=ORDER).static_plan.steps]


def _check(model, rng, rounds=2):
    assert _on_numba(model) == ["numba"]
    for k in range(rounds + 1):
        assert_matches_reference(model, _inputs(model, rng, special=k == rounds), "numba")


# ---- (b) randomized, against the reference -----------------------------------------------------

BROADCASTS = [  # (input 0 shape, input 1 shape, output shape)
    ((1, 32, 32, 64), (1, 32, 32, 64), (1, 32, 32, 64)),
    ((2, 5, 7, 37), (37,), (2, 5, 7, 37)),
    ((1, 9, 9, 24), (1, 1, 1, 24), (1, 9, 9, 24)),
    ((1, 1, 1, 24), (1, 9, 9, 24), (1, 9, 9, 24)),  # the broadcast input first: swapped
    ((2, 6, 6, 3), (1,), (2, 6, 6, 3)),
    ((1,), (3, 17), (3, 17)),
    ((1, 1, 1, 1), (2, 4, 4, 20), (2, 4, 4, 20)),
    ((1, 8, 8, 1), (1, 8, 8, 40), (1, 8, 8, 40)),  # constant over the channels: blocks
    ((2, 3, 1, 1), (2, 3, 4, 5), (2, 3, 4, 5)),
    ((4, 13), (4, 13), (4, 13)),
    ((6, 1, 19), (6, 5, 19), (6, 5, 19)),  # varying along batch and channels, rows between: declined
    ((3, 100), (100,), (3, 100)),
    ((1, 1, 1000), (7, 9, 1000), (7, 9, 1000)),
    ((2, 1, 1, 16), (2, 3, 3, 16), (2, 3, 3, 16)),  # separate dimensions: declined
]


@pytest.mark.parametrize("op", [Op.ADD, Op.MUL])
@pytest.mark.parametrize("shapes", BROADCASTS, ids=lambda s: f"{list(s[0])}x{list(s[1])}")
def test_add_mul_broadcast_forms_and_activations(op, shapes):
    a, b, out = shapes
    rng = np.random.default_rng([int(op), len(a), len(b), out[-1]])
    for act in (0, 1, 2, 3):
        model = _model(op, [a, b], out, [("i", act)])
        if shapes[0] in ((6, 1, 19), (2, 1, 1, 16)):
            assert _on_numba(model) == ["reference"]
            assert_matches_reference(model, _inputs(model, rng), "numba", require_assigned=False)
        else:
            _check(model, rng, rounds=1)


@pytest.mark.parametrize("op", [Op.ADD, Op.MUL])
def test_add_mul_with_a_constant_operand(op):
    rng = np.random.default_rng(4)
    for shape, const_shape in (((1, 10, 10, 48), (48,)), ((2, 4, 4, 21), (1, 1, 1, 21)), ((3, 7), (1,))):
        model = _model(op, [shape, const_shape], shape, [("i", 1)], consts={1: rng.uniform(-1, 1, const_shape)})
        _check(model, rng)


@pytest.mark.parametrize("alpha_shape", ["C", "11C", "111C", "full", "scalar"])
def test_prelu_alpha_forms(alpha_shape):
    rng = np.random.default_rng(len(alpha_shape))
    for shape in ((1, 16, 16, 64), (2, 5, 3, 24), (1, 7, 9, 3), (2, 4, 4, 70)):
        c = shape[-1]
        a = {"C": (c,), "11C": (1, 1, c), "111C": (1, 1, 1, c), "full": shape, "scalar": (1,)}[alpha_shape]
        _check(_model(Op.PRELU, [shape, a], shape), rng, rounds=1)
        _check(_model(Op.PRELU, [shape, a], shape, consts={1: rng.uniform(-1, 1, a)}), rng, rounds=0)


def _pool_model(op, in_shape, pads, strides, filt, act, layout=None):
    """Explicit-padding signature: pads (left, right, top, bottom), strides (w, h), filter (w, h)."""
    n, h, w, c = in_shape
    oh = (h + pads[2] + pads[3] - filt[1]) // strides[1] + 1
    ow = (w + pads[0] + pads[1] - filt[0]) // strides[0] + 1
    scalars = [("i", v) for v in (*pads, *strides, *filt, act)] + ([("b", layout)] if layout is not None else [])
    return _model(op, [in_shape], (n, oh, ow, c), scalars)


@pytest.mark.parametrize("op", [Op.MAX_POOL_2D, Op.AVERAGE_POOL_2D])
def test_pools_random_geometries(op):
    rng = np.random.default_rng(int(op))
    cases = [((1, 32, 32, 64), (0, 0, 0, 0), (2, 2), (2, 2), 0), ((2, 7, 9, 24), (1, 1, 1, 1), (1, 1), (3, 3), 1),
             ((1, 56, 56, 3), (0, 1, 0, 1), (2, 2), (3, 3), 3), ((1, 7, 7, 1280), (0, 0, 0, 0), (1, 1), (7, 7), 0)]
    for _ in range(16):
        h, w = (int(v) for v in rng.integers(1, 14, 2))
        fw, fh = int(rng.integers(1, min(w, 5) + 1)), int(rng.integers(1, min(h, 5) + 1))
        pads = (int(rng.integers(0, fw)), int(rng.integers(0, fw)), int(rng.integers(0, fh)), int(rng.integers(0, fh)))
        c = int(rng.choice([1, 3, 16, 17, 24, 33, 40, 64, 70, 150]))
        cases.append(((int(rng.integers(1, 3)), h, w, c), pads, tuple(int(v) for v in rng.integers(1, 4, 2)),
                      (fw, fh), int(rng.integers(0, 4))))
    for shape, pads, strides, filt, act in cases:
        _check(_pool_model(op, shape, pads, strides, filt, act), rng, rounds=1)


@pytest.mark.parametrize("op", [Op.PAD, Op.PAD_V2])
def test_pad_random_ranks_and_paddings(op):
    rng = np.random.default_rng(int(op))
    cases = [((1, 16, 16, 64), [[0, 0], [0, 0], [0, 0], [0, 64]]), ((2, 5, 5, 24), [[0, 0], [1, 1], [1, 1], [0, 0]]),
             ((1, 8, 8, 3), [[0, 0], [2, 1], [0, 3], [5, 8]]), ((3, 17), [[1, 0], [0, 15]]), ((10,), [[3, 4]])]
    for _ in range(12):
        rank = int(rng.integers(1, 5))
        shape = tuple(int(v) for v in rng.integers(1, 9, rank))
        pads = rng.integers(0, 4, (rank, 2)) * (rng.random((rank, 1)) < 0.6)
        cases.append((shape, pads.tolist()))
    for shape, pads in cases:
        out = tuple(d + b + a for d, (b, a) in zip(shape, pads))
        scalars = [("t", pads)] + ([("f", float(rng.uniform(-2, 2)))] if op == Op.PAD_V2 else [])
        _check(_model(op, [shape], out, scalars), rng, rounds=0)
    if op == Op.PAD_V2:  # infinite and NaN pad values
        for value in (np.inf, -np.inf, np.nan):
            _check(_model(op, [(1, 3, 4, 5)], (1, 4, 6, 7), [("t", [[0, 0], [1, 0], [1, 1], [0, 2]]), ("f", value)]),
                   rng, rounds=0)


def test_concatenation_every_axis():
    rng = np.random.default_rng(7)
    cases = [([(1, 8, 8, 24), (1, 8, 8, 40)], 3), ([(2, 4, 4, 3), (2, 4, 4, 1), (2, 4, 4, 17)], 3),
             ([(1, 5, 6, 8), (1, 2, 6, 8)], 1), ([(2, 3, 5), (1, 3, 5), (4, 3, 5)], 0), ([(3, 7), (3, 9)], 1),
             ([(100,), (28,)], 0)]
    for _ in range(10):
        rank = int(rng.integers(1, 5))
        base = [int(v) for v in rng.integers(1, 6, rank)]
        axis = int(rng.integers(0, rank))
        shapes = []
        for _ in range(int(rng.integers(2, 5))):
            s = list(base)
            s[axis] = int(rng.integers(1, 20))
            shapes.append(tuple(s))
        cases.append((shapes, axis))
    for shapes, axis in cases:
        out = list(shapes[0])
        out[axis] = sum(s[axis] for s in shapes)
        _check(_model(Op.CONCATENATION, shapes, tuple(out), [("i", axis)]), rng, rounds=0)
    # a constant input among them
    model = _model(Op.CONCATENATION, [(1, 4, 4, 8), (1, 4, 4, 5)], (1, 4, 4, 13), [("i", 3)],
                   consts={1: rng.uniform(-1, 1, (1, 4, 4, 5))})
    _check(model, rng, rounds=0)


def test_reshape():
    rng = np.random.default_rng(8)
    for shape, target in (((1, 16, 16, 64), (1, 256, 64)), ((2, 3, 5), (-1,)), ((1, 1, 1, 1280), (1, 1280)),
                          ((4, 33), (2, 2, 33))):
        out = tuple(int(np.prod(shape)) if t == -1 else t for t in target)
        _check(_model(Op.RESHAPE, [shape], out, [("t", list(target))]), rng, rounds=0)


SLICES = [  # (input shape, begin, end, strides, begin mask, end mask, shrink mask, output shape)
    ((1, 49, 32), [0, -1, 0], [1, 49, 32], [1, 1, 1], 0, 0, 2, (1, 32)),  # a sequence's last step
    ((2, 7, 9, 5), [1, 6, -2, 0], [2, 0, 0, 5], [1, -2, -3, 1], 0, 0, 0, (1, 3, 3, 5)),  # negative strides
    ((3, 10), [0, 1], [3, 10], [2, 3], 0, 0, 0, (2, 3)),  # strided innermost axis
    ((4, 6, 8), [1, 0, 2], [0, 0, 7], [1, 1, 1], 1, 3, 0, (4, 6, 5)),  # masks: whole ranges
    ((5,), [2], [3], [1], 0, 0, 1, (1,)),  # every axis shrunk: shape [1]
]


@pytest.mark.parametrize("shape,begin,end,strides,bm,em,sm,out", SLICES)
def test_strided_slices(shape, begin, end, strides, bm, em, sm, out):
    model = _model(Op.STRIDED_SLICE, [shape], out, [("t", begin), ("t", end), ("t", strides), ("i", bm), ("i", em),
                                                    ("i", sm)])
    _check(model, np.random.default_rng(len(shape)), rounds=0)
    _bound_equals_executed(model, np.random.default_rng(1))


# ---- (c) bound to fixed arrays: execute's bytes -----------------------------------------------

def _bound_equals_executed(model, rng, rounds=2):
    compiled = compile_model(model, backend_order=ORDER)
    sg = model.main
    xs = [np.zeros(sg.operands[i].dimensions, np.float32) for i in sg.input_indexes]
    outs = [np.zeros(sg.operands[o].dimensions, np.float32) for o in sg.output_indexes]
    runner = hal_bind(compiled, xs, outs)
    assert runner is not None
    for k in range(rounds):
        for x, v in zip(xs, _inputs(model, rng, special=k == rounds - 1), strict=True):
            x[...] = v
        timings: list[OperationTiming] = []
        runner(timings)
        assert {t.backend for t in timings} == {"numba"}
        runner()
        for got, want in zip(outs, execute(compiled, [x.copy() for x in xs]), strict=True):
            assert got.tobytes() == want.tobytes()
    return runner


@pytest.mark.parametrize("model", [
    lambda: _model(Op.ADD, [(1, 9, 9, 24), (24,)], (1, 9, 9, 24), [("i", 3)]),
    lambda: _model(Op.MUL, [(1, 8, 8, 1), (1, 8, 8, 40)], (1, 8, 8, 40), [("i", 0)]),
    lambda: _model(Op.MUL, [(2, 6, 6, 3), (1,)], (2, 6, 6, 3), [("i", 1)]),
    lambda: _model(Op.PRELU, [(1, 16, 16, 64), (1, 1, 64)], (1, 16, 16, 64)),
    lambda: _pool_model(Op.MAX_POOL_2D, (2, 9, 9, 17), (1, 1, 1, 1), (2, 2), (3, 3), 2),
    lambda: _pool_model(Op.AVERAGE_POOL_2D, (1, 7, 7, 70), (1, 0, 1, 0), (2, 2), (2, 2), 0),
    lambda: _model(Op.PAD_V2, [(1, 6, 6, 20)], (1, 7, 8, 32), [("t", [[0, 0], [1, 0], [1, 1], [0, 12]]), ("f", -1.5)]),
    lambda: _model(Op.CONCATENATION, [(1, 4, 4, 8), (1, 4, 4, 5)], (1, 4, 4, 13), [("i", 3)]),
    lambda: _model(Op.RESHAPE, [(1, 4, 4, 8)], (16, 8), [("t", [16, 8])]),
], ids=["add", "mul-blocks", "mul-scalar", "prelu", "max-pool", "avg-pool", "pad-v2", "concat", "reshape"])
def test_bound_one_op_gives_executes_bytes(model):
    _bound_equals_executed(model(), np.random.default_rng(3))


def test_a_float_cnn_tail_binds_as_one_native_chain():
    """PAD (channels) -> MAX_POOL -> ADD (residual) -> PRELU -> MUL (per-channel) -> CONCATENATION ->
    AVERAGE_POOL -> RESHAPE: every step on numba, bound as one native run of calls giving execute's
    bytes; the plans survive the compilation cache."""
    rng = np.random.default_rng(5)
    mb = ModelBuilder()
    x = mb.add_operand(F32, (1, 16, 16, 24))
    r = mb.add_operand(F32, (1, 8, 8, 32))

    def op(kind, ins, shape):
        y = mb.add_operand(F32, shape)
        mb.add_operation(kind, ins, [y])
        return y

    def const(a):
        return mb.add_constant(F32, np.asarray(a, np.float32))
    p = op(Op.PAD, [x, mb.add_constant(I32, np.array([[0, 0], [0, 0], [0, 0], [0, 8]], np.int32))], (1, 16, 16, 32))
    m = op(Op.MAX_POOL_2D, [p, *(mb.add_int32(v) for v in (0, 0, 0, 0, 2, 2, 2, 2, 0))], (1, 8, 8, 32))
    s = op(Op.ADD, [m, r, mb.add_int32(0)], (1, 8, 8, 32))
    a = op(Op.PRELU, [s, const(rng.uniform(0, 0.5, (1, 1, 32)))], (1, 8, 8, 32))
    g = op(Op.MUL, [a, const(rng.uniform(0.5, 1.5, (32,))), mb.add_int32(3)], (1, 8, 8, 32))
    c = op(Op.CONCATENATION, [g, s, mb.add_int32(3)], (1, 8, 8, 64))
    v = op(Op.AVERAGE_POOL_2D, [c, *(mb.add_int32(v) for v in (0, 0, 0, 0, 1, 1, 8, 8, 0))], (1, 1, 1, 64))
    out = op(Op.RESHAPE, [v, mb.add_constant(I32, np.array([1, 64], np.int32))], (1, 64))
    mb.identify_inputs_and_outputs([x, r], [out, c])
    model = mb.finish()
    assert set(_on_numba(model)) == {"numba"}
    runner = _bound_equals_executed(model, rng, rounds=3)
    assert isinstance(runner, BoundProgram) and runner.chained
    calls = [c for c in runner.calls if c is not _nothing]  # every step one native call of one run
    assert [type(r) for r in chain(calls)] == [NativeRun]
    assert_matches_reference(model, _inputs(model, rng), "numba")
    loaded = load_compiled(*dump_compiled(compile_model(model, backend_order=ORDER)), backend_order=ORDER)
    assert set(_on_numba(model)) == {s.backend for s in loaded.static_plan.steps}
    args = _inputs(model, rng, special=True)
    for got, want in zip(execute(loaded, args), execute(compile_model(model, backend_order=ORDER), args), strict=True):
        assert got.tobytes() == want.tobytes()


# ---- (d) declined forms ------------------------------------------------------------------------

@pytest.mark.parametrize("model,reason", [
    (lambda: _pool_model(Op.MAX_POOL_2D, (1, 4, 6, 5), (1, 1, 1, 1), (1, 1), (3, 3), 0, layout=True), "NCHW"),
    (lambda: _pool_model(Op.AVERAGE_POOL_2D, (1, 4, 6, 5), (0, 1, 0, 1), (1, 1), (2, 2), 0, layout=True), "NCHW"),
    (lambda: _model(Op.ADD, [(3, 1), (1, 4)], (3, 4), [("i", 0)]), "both inputs broadcast"),
    (lambda: _model(Op.MUL, [(2, 3, 3, 16), (2, 1, 1, 16)], (2, 3, 3, 16), [("i", 0)]), "separate dimensions"),
    (lambda: _model(Op.PRELU, [(1, 1, 5), (4, 3, 5)], (4, 3, 5)), "broadcast to the output"),
], ids=["max-pool-nchw", "avg-pool-nchw", "add-both-broadcast", "mul-separate-dims", "prelu-input-broadcast"])
def test_declined_forms_fall_to_the_reference_with_a_reason(model, reason, caplog):
    model = model()
    with caplog.at_level(logging.INFO, logger="hal.compiler"):
        assert _on_numba(model) == ["reference"]
    assert any("backend numba declined" in r.getMessage() and reason in r.getMessage() for r in caplog.records), \
        [r.getMessage() for r in caplog.records]
    assert_matches_reference(model, _inputs(model, np.random.default_rng(0)), "numba", require_assigned=False)


def test_quantized_operations_keep_their_kernels():
    """The float registrations sit beside the quantized ones: an 8-bit ADD still runs on numba's."""
    from hal.backends.numba_kernels import BACKEND, f32_elementwise, lut
    kernel = BACKEND.kernel(Op.ADD)
    assert kernel.runs_type(OperandType.TENSOR_QUANT8_ASYMM) and kernel.runs_type(F32)
    mb = ModelBuilder()
    a = mb.add_operand(OperandType.TENSOR_QUANT8_ASYMM, (1, 4, 4, 8), 0.5, 3)
    b = mb.add_operand(OperandType.TENSOR_QUANT8_ASYMM, (1, 4, 4, 8), 0.25, 1)
    y = mb.add_operand(OperandType.TENSOR_QUANT8_ASYMM, (1, 4, 4, 8), 0.5, 2)
    mb.add_operation(Op.ADD, [a, b, mb.add_int32(0)], [y])
    mb.identify_inputs_and_outputs([a, b], [y])
    model = mb.finish()
    compiled = compile_model(model, backend_order=ORDER)
    step = compiled.static_plan.steps[0]
    assert step.backend == "numba" and isinstance(step.ctx.data, lut.TableData)
    assert not isinstance(step.ctx.data, f32_elementwise.F32Binary)
    rng = np.random.default_rng(1)
    assert_matches_reference(model, [rng.integers(0, 256, (1, 4, 4, 8)).astype(np.uint8) for _ in range(2)], "numba")
