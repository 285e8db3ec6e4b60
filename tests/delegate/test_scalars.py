"""Rank-0 (scalar) TFLite activations delegated as NNAPI [1] tensors (delegate.mapping.scalars):
the operations listed there, loops counting with scalars, and the operations not listed, which keep
the node on TFLite's CPU with the reason. Judged against TFLite's CPU (reference kernels) on the
same model; the delegated runs go through the nnhal service, so a rank-0 partition input and output
are copied by the delegate kernel."""
from __future__ import annotations

import re

import numpy as np
import pytest

import hal
from delegate import load_delegate
from delegate.mapping import MappingError, convert_partition
from delegate.mapping.core import lookup_mapper
from delegate.mapping.scalars import SCALAR_AS_ONE
from delegate.support_probe import supported_nodes
from delegate.tfl import read_model
from delegate.tfl.builder import TfLiteModelBuilder
from delegate.tfl.schema import builtin_code, builtin_name
from tests.delegate.control_flow_models import (
    SHAPE,
    TRIPS,
    add_counter_cond,
    add_while,
    counter_loop_model,
    loop_feeds,
)
from tests.delegate.helpers import assert_outputs_equal, interpreter, run

NONE = {"fused_activation_function": 0}
NOT_LISTED = "is not among the operations that take it as a [1] tensor"


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    """One `nnhal serve` for the module (tests.service.conftest.ServerProcess, as the `server` fixture)."""
    from tests.service.conftest import ServerProcess
    s = ServerProcess(tmp_path_factory.mktemp("scalars"))
    yield s
    s.stop()


def _delegated(service, model: bytes, feeds):
    """Run ``model`` with the delegate and on TFLite's CPU on every feed; the delegation report.
    Largest-first: a partly supported model's nnhal partition runs whatever its estimated cost."""
    d = load_delegate(service.address, partitioning="largest")
    it, ref = interpreter(model, d), interpreter(model)
    for xs in feeds:
        got, want = run(it, xs), run(ref, xs)
        assert [g.shape for g in got] == [w.shape for w in want]  # a scalar output stays rank 0
        assert_outputs_equal(got, want)
    assert [k.fallbacks for k in d.impl.kernels] == [0] * len(d.impl.kernels)  # the service ran it
    return d.report


# ---- one operation with scalar operands ---------------------------------------------------------

#: An operand: (shape, dtype, constant value or None for a model input).
F32, I32, BOOL = np.float32, np.int32, np.bool_


def _op_model(op: str, operands, out_shape, out_dtype, options=None) -> bytes:
    b = TfLiteModelBuilder()
    ins = []
    for k, (shape, dtype, value) in enumerate(operands):
        ins.append(b.add_input(f"in{k}", list(shape), dtype) if value is None
                   else b.add_constant(f"c{k}", np.asarray(value, dtype).reshape(shape)))
    y = b.add_tensor("y", list(out_shape), out_dtype)
    b.add_operator(op, ins, [y], options)
    b.set_outputs([y])
    return b.build()


def _feed(rng, shape, dtype, positive: bool = False, nonzero: bool = False):
    if dtype == BOOL:
        return rng.random(shape) < 0.5
    if dtype == I32:
        x = rng.integers(-5, 6, size=shape).astype(I32)
        return np.where(x == 0, 3, x).astype(I32) if nonzero or positive else x
    x = (rng.standard_normal(shape) * 2).astype(F32)
    return np.abs(x) + F32(0.5) if positive or nonzero else x


#: Shapes of the two inputs of a broadcasting operation (None: a rank-0 constant) and the output's.
_BINARY_SHAPES = [((), (), ()), ((), (3,), (3,)), ((2, 3), (), (2, 3)), ((), None, ()), ((1,), (), (1,))]

_ARITH = {"ADD": ("AddOptions", NONE), "SUB": ("SubOptions", NONE), "MUL": ("MulOptions", NONE),
          "DIV": ("DivOptions", NONE), "MAXIMUM": None, "MINIMUM": None, "SQUARED_DIFFERENCE": None,
          "POW": None}
_COMPARE = ("EQUAL", "NOT_EQUAL", "GREATER", "GREATER_EQUAL", "LESS", "LESS_EQUAL")
_UNARY = ("ABS", "NEG", "EXP", "LOG", "SQRT", "RSQRT", "SIN", "FLOOR")
#: op -> (input dtype, output dtype, options, inputs must be positive / non-zero)
_BINARY_CASES = {
    **{op: (F32, F32, opts, op == "POW") for op, opts in _ARITH.items()},
    "ADD_INT32": (I32, I32, ("AddOptions", NONE), False),
    "FLOOR_DIV": (I32, I32, None, True),
    **{op: (F32, BOOL, None, False) for op in _COMPARE},
    "LESS_INT32": (I32, BOOL, None, False),
    "LOGICAL_AND": (BOOL, BOOL, None, False),
    "LOGICAL_OR": (BOOL, BOOL, None, False),
}


@pytest.mark.parametrize("shapes", _BINARY_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("case", sorted(_BINARY_CASES))
def test_broadcasting_operation_with_scalars_matches_cpu(service, case, shapes):
    op = case.split("_INT32")[0]
    dtype, out_dtype, options, positive = _BINARY_CASES[case]
    a, b, out = shapes
    rng = np.random.default_rng(sum(map(ord, case)))
    const = None if b is not None else _feed(rng, (), dtype, positive, nonzero=True)
    model = _op_model(op, [(a, dtype, None), (() if b is None else b, dtype, const)], out, out_dtype, options)
    feeds = [[_feed(rng, a, dtype, positive)] + ([] if b is None else [_feed(rng, b, dtype, positive, True)])
             for _ in range(3)]
    rep = _delegated(service, model, feeds)
    assert [(n.op, n.placement) for n in rep.nodes] == [(op, "nnhal")], [n.reason for n in rep.nodes]


@pytest.mark.parametrize("op", _UNARY + ("LOGICAL_NOT", "CAST"))
def test_elementwise_unary_operation_of_a_scalar_matches_cpu(service, op):
    dtype, out_dtype = {"LOGICAL_NOT": (BOOL, BOOL), "CAST": (I32, F32)}.get(op, (F32, F32))
    model = _op_model(op, [((), dtype, None)], (), out_dtype)
    rng = np.random.default_rng(sum(map(ord, op)))
    rep = _delegated(service, model, [[_feed(rng, (), dtype, positive=op in ("LOG", "SQRT", "RSQRT"))]
                                      for _ in range(3)])
    assert [(n.op, n.placement) for n in rep.nodes] == [(op, "nnhal")], [n.reason for n in rep.nodes]


@pytest.mark.parametrize("op", ["SELECT", "SELECT_V2"])
def test_select_of_scalars_matches_cpu(service, op):
    model = _op_model(op, [((), BOOL, None), ((), F32, None), ((), F32, None)], (), F32)
    rng = np.random.default_rng(5)
    feeds = [[np.array(c), _feed(rng, (), F32), _feed(rng, (), F32)] for c in (True, False)]
    rep = _delegated(service, model, feeds)
    assert [(n.op, n.placement) for n in rep.nodes] == [(op, "nnhal")], [n.reason for n in rep.nodes]


@pytest.mark.parametrize("x_shape, axis", [((4, 3), 0), ((2, 5), 1), ((5,), 0), ((2, 3, 4), -2)])
def test_gather_at_a_computed_scalar_index_matches_cpu(service, x_shape, axis):
    """GATHER with a rank-0 index drops the axis: a [1] index, then a RESHAPE (or the [1] output itself
    for a rank-1 x, whose TFLite output is a scalar)."""
    out_shape = tuple(d for k, d in enumerate(x_shape) if k != axis % len(x_shape))
    model = _op_model("GATHER", [(x_shape, F32, None), ((), I32, None)], out_shape, F32,
                      ("GatherOptions", {"axis": axis}))
    rng = np.random.default_rng(len(x_shape))
    feeds = [[_feed(rng, x_shape, F32), np.int32(i)] for i in range(x_shape[axis])]
    rep = _delegated(service, model, feeds)
    assert [(n.op, n.placement) for n in rep.nodes] == [("GATHER", "nnhal")], [n.reason for n in rep.nodes]


def test_every_listed_builtin_has_a_mapper_and_a_test_here():
    """The table lists what is proven here: a builtin added to SCALAR_AS_ONE needs its case above."""
    tested = {builtin_code(c.split("_INT32")[0]) for c in _BINARY_CASES} | {builtin_code(op) for op in _UNARY}
    tested |= {builtin_code(op) for op in ("LOGICAL_NOT", "CAST", "SELECT", "SELECT_V2", "GATHER", "IF", "WHILE")}
    assert {builtin_name(c) for c in SCALAR_AS_ONE if lookup_mapper(c) is None} == set()
    assert {builtin_name(c) for c in set(SCALAR_AS_ONE) - tested} == set()


# ---- loops counting with scalars ----------------------------------------------------------------

def test_scalar_counter_loop_runs_in_hal_as_tflite():
    """In-process (no delegate): the WHILE with rank-0 counters converts with [1] counters on both
    sides (the constant start as a [1] constant) and computes TFLite's values."""
    model = counter_loop_model(scalar_counter=True)
    graph = read_model(model)
    loop = graph.nodes[1]
    assert [graph.tensors[t].shape for t in loop.inputs] == [(), SHAPE, ()]
    part = convert_partition(graph)
    compiled, ref = hal.compile_model(part.model), interpreter(model)
    for xs in loop_feeds(np.random.default_rng(8), scalar_counter=True):
        got = hal.execute(compiled, [x.reshape(-1) if x.ndim == 0 else x for x in xs])  # as the kernel feeds it
        want = run(ref, xs)
        assert_outputs_equal([g.reshape(w.shape) for g, w in zip(got, want)], want)


def test_scalar_counter_loop_delegated_whole_matches_cpu(service):
    model = counter_loop_model(scalar_counter=True)
    rep = _delegated(service, model, loop_feeds(np.random.default_rng(1), scalar_counter=True))
    assert [(n.op, n.placement) for n in rep.nodes] == [("ADD", "nnhal"), ("WHILE", "nnhal"), ("MUL", "nnhal")]
    assert rep.partitions == [[0, 1, 2]] and rep.subgraphs == {}


def _sequence_loop_model(steps: int = 5, width: int = 3) -> bytes:
    """seq: [steps, width] -> WHILE i < steps: acc = acc * 0.5 + GATHER(seq, i), i + 1 (Keras 3's LSTM
    loop shape: a scalar counter, a step count constant, a GATHER at the counter); outputs (acc, i)."""
    root = TfLiteModelBuilder()
    seq = root.add_input("seq", [steps, width])
    zero, acc0 = root.add_constant("zero", np.int32(0)), root.add_constant("acc0", np.zeros([width], F32))

    def signature(g):
        return g.add_input("i", [], I32), g.add_input("acc", [width]), g.add_input("seq", [steps, width])

    cond = root.add_subgraph("cond")
    i, _, _ = signature(cond)
    less = cond.add_tensor("less", [], BOOL)
    cond.add_operator("LESS", [i, cond.add_constant("steps", np.int32(steps))], [less])
    cond.set_outputs([less])
    body = root.add_subgraph("body")
    i, acc, s = signature(body)
    row, half, i2 = body.add_tensor("row", [width]), body.add_tensor("half", [width]), body.add_tensor("i2", [], I32)
    acc2 = body.add_tensor("acc2", [width])
    body.add_operator("GATHER", [s, i], [row], ("GatherOptions", {"axis": 0}))
    body.add_operator("MUL", [acc, body.add_constant("k", np.float32(0.5))], [half], ("MulOptions", NONE))
    body.add_operator("ADD", [half, row], [acc2], ("AddOptions", NONE))
    body.add_operator("ADD", [i, body.add_constant("one", np.int32(1))], [i2], ("AddOptions", NONE))
    body.set_outputs([i2, acc2, s])
    outs = [root.add_tensor("i_out", [], I32), root.add_tensor("acc_out", [width]),
            root.add_tensor("seq_out", [steps, width])]
    root.add_operator("WHILE", [zero, acc0, seq], outs,
                      ("WhileOptions", {"cond_subgraph_index": cond.index, "body_subgraph_index": body.index}))
    root.set_outputs([outs[1], outs[0]])
    return root.build()


def test_loop_gathering_at_its_scalar_counter_delegated_matches_cpu(service):
    rng = np.random.default_rng(2)
    rep = _delegated(service, _sequence_loop_model(), [[_feed(rng, (5, 3), F32)] for _ in range(2)])
    assert [(n.op, n.placement) for n in rep.nodes] == [("WHILE", "nnhal")] and rep.subgraphs == {}


def _scalar_if_model() -> bytes:
    """a, b: [] float32, x: [2, 3] -> IF a < b: x + a else x * b (a computed scalar condition)."""
    root = TfLiteModelBuilder()
    a, b, x = root.add_input("a", [], F32), root.add_input("b", [], F32), root.add_input("x", list(SHAPE))
    c = root.add_tensor("c", [], BOOL)
    root.add_operator("LESS", [a, b], [c])
    branches = []
    for name, op, opts in (("then", "ADD", "AddOptions"), ("else", "MUL", "MulOptions")):
        g = root.add_subgraph(name)
        ga, gb, gx = g.add_input("a", [], F32), g.add_input("b", [], F32), g.add_input("x", list(SHAPE))
        y = g.add_tensor("y", list(SHAPE))
        g.add_operator(op, [gx, ga if name == "then" else gb], [y], (opts, NONE))
        g.set_outputs([y])
        branches.append(g)
    out = root.add_tensor("out", list(SHAPE))
    root.add_operator("IF", [c, a, b, x], [out],
                      ("IfOptions", {"then_subgraph_index": branches[0].index,
                                     "else_subgraph_index": branches[1].index}))
    root.set_outputs([out])
    return root.build()


def test_if_on_a_computed_scalar_condition_delegated_matches_cpu(service):
    rng = np.random.default_rng(3)
    feeds = [[F32(a), F32(b), _feed(rng, SHAPE, F32)] for a, b in ((1, 2), (2, 1), (0.5, -3))]
    rep = _delegated(service, _scalar_if_model(), feeds)
    assert [(n.op, n.placement) for n in rep.nodes] == [("LESS", "nnhal"), ("IF", "nnhal")]


# ---- not listed: the node stays on TFLite's CPU, with the reason ---------------------------------

def _scalar_then(op: str, extra_inputs, out_shape, options=None) -> bytes:
    """x: [] -> s = x + 1 (a scalar made [1] by ADD) -> ``op``(s, *extra_inputs)."""
    b = TfLiteModelBuilder()
    x = b.add_input("x", [], F32)
    s, y = b.add_tensor("s", [], F32), b.add_tensor("y", list(out_shape))
    b.add_operator("ADD", [x, b.add_constant("one", np.float32(1))], [s], ("AddOptions", NONE))
    ins = [s] + [s if e == "s" else b.add_constant(f"c{k}", e) for k, e in enumerate(extra_inputs)]
    b.add_operator(op, ins, [y], options)
    b.set_outputs([y])
    return b.build()


_SCALAR = "is a rank-0 (scalar) tensor, which NNAPI has only as a constant"
#: op -> (its other inputs ("s": the scalar again), output shape, options, the reason it gives)
_UNLISTED = {
    "EXPAND_DIMS": ([np.int32(0)], [1], None, f"{_SCALAR} (EXPAND_DIMS {NOT_LISTED}"),
    "RESHAPE": ([np.int32([1])], [1], None, "NNAPI has no rank-0 tensor for TFLite's scalar input"),  # shape.py
    "PACK": (["s"], [2], ("PackOptions", {"values_count": 2, "axis": 0}),
             "NNAPI PACK packs tensors of rank >= 1; input 0 is a TFLite scalar"),  # its mapper's own check
    "HARD_SWISH": ([], [], None, f"tensor 'y' {_SCALAR} (HARD_SWISH {NOT_LISTED}"),  # its output, made here
}


@pytest.mark.parametrize("op", sorted(_UNLISTED))
def test_unlisted_operation_reading_a_scalar_stays_on_cpu(op):
    """ADD makes the scalar a [1] operand; a reader not in SCALAR_AS_ONE (which would compute another
    rank from [1], e.g. EXPAND_DIMS: [1, 1] for TFLite's [1]) is refused, with the reason."""
    extra, out_shape, options, why = _UNLISTED[op]
    reasons = supported_nodes(read_model(_scalar_then(op, extra, out_shape, options)), None)
    assert reasons[0] is None
    assert why in reasons[1]


def test_unlisted_consumer_of_a_scalar_runs_on_cpu_with_the_delegate(service):
    model = _scalar_then("EXPAND_DIMS", [np.int32(0)], [1])
    rep = _delegated(service, model, [[F32(v)] for v in (0.5, -2.0)])
    assert [(n.op, n.placement) for n in rep.nodes] == [("ADD", "nnhal"), ("EXPAND_DIMS", "CPU")]
    assert NOT_LISTED in rep.nodes[1].reason


def test_unlisted_operation_making_a_scalar_keeps_refusing():
    """STRIDED_SLICE shrinking to a scalar: the rank changes with [1], so it stays refused."""
    b = TfLiteModelBuilder()
    x = b.add_input("x", [3])
    y = b.add_tensor("y", [])
    b.add_operator("STRIDED_SLICE", [x, b.add_constant("b", np.int32([1])), b.add_constant("e", np.int32([2])),
                                     b.add_constant("s", np.int32([1]))], [y],
                   ("StridedSliceOptions", {"shrink_axis_mask": 1}))
    b.set_outputs([y])
    assert "NNAPI has no rank-0 tensor for TFLite's scalar output" in supported_nodes(read_model(b.build()), None)[0]


def test_listed_operation_whose_rule_fails_is_refused():
    """SELECT needs one shape: a scalar condition as [1] and a rank-0 constant (an NNAPI rank-0
    constant) differ, so it stays on the CPU with the rule's reason."""
    model = _op_model("SELECT", [((), BOOL, None), ((), F32, None), ((), F32, 2.0)], (), F32)
    reason = supported_nodes(read_model(model), None)[0]
    assert "SELECT with a rank-0 (scalar) tensor as NNAPI [1]: NNAPI needs one shape" in reason


def test_loop_body_with_an_unlisted_scalar_operation_stays_on_cpu():
    """The body's counter (a [1] subgraph input) goes through EXPAND_DIMS (not listed): the WHILE is
    refused naming that node."""
    root = TfLiteModelBuilder()
    x = root.add_input("x", list(SHAPE))
    cond = add_counter_cond(root, counter=())
    body = root.add_subgraph("body")
    i, bx, n = body.add_input("i", [], I32), body.add_input("x", list(SHAPE)), body.add_input("n", [], I32)
    e, r, i2 = body.add_tensor("e", [1], I32), body.add_tensor("r", [], I32), body.add_tensor("i2", [], I32)
    body.add_operator("EXPAND_DIMS", [i, body.add_constant("axis", np.int32(0))], [e])
    body.add_operator("RESHAPE", [e, body.add_constant("to", np.zeros([0], I32))], [r])
    body.add_operator("ADD", [r, body.add_constant("one", np.int32(1))], [i2], ("AddOptions", NONE))
    body.set_outputs([i2, bx, n])
    outs = add_while(root, cond, body, [root.add_constant("zero", np.int32(0)), x,
                                        root.add_constant("n", np.int32(TRIPS[-1]))], counter=())
    root.set_outputs([outs[1]])
    why = f"subgraph 2 node 0 (EXPAND_DIMS): tensor 'i' {_SCALAR} (EXPAND_DIMS {NOT_LISTED}"
    with pytest.raises(MappingError, match=re.escape(why)):
        convert_partition(read_model(root.build()))


def test_scalar_partition_output_stays_rank_0_after_a_resize(service):
    """x: [-1, 3], s: [] -> t = s * s (a scalar partition output), y = x + t. A resize converts the
    partition again with hal's inferred shapes ([1] for t: not stale) and the kernel does not resize
    TFLite's scalar to [1]."""
    b = TfLiteModelBuilder()
    x = b.add_input("x", [1, 3], F32, shape_signature=[-1, 3])
    s = b.add_input("s", [], F32)
    t, y = b.add_tensor("t", [], F32), b.add_tensor("y", [1, 3], F32, shape_signature=[-1, 3])
    b.add_operator("MUL", [s, s], [t], ("MulOptions", NONE))
    b.add_operator("ADD", [x, t], [y], ("AddOptions", NONE))
    b.set_outputs([y, t])
    model = b.build()
    d = load_delegate(service.address)
    it, ref = interpreter(model, d), interpreter(model)
    rng = np.random.default_rng(4)
    for batch in (1, 4, 2):
        for i in (it, ref):
            i.resize_tensor_input(i.get_input_details()[0]["index"], [batch, 3])
            i.allocate_tensors()
        xs = [_feed(rng, (batch, 3), F32), _feed(rng, (), F32)]
        got, want = run(it, xs), run(ref, xs)
        assert [g.shape for g in got] == [(batch, 3), ()]
        assert_outputs_equal(got, want)
    assert d.report.partitions == [[0, 1]]
    (kernel,) = [k for k in d.impl.kernels if not k.freed]
    assert kernel.fallbacks == 0


def test_scalar_partition_input_runs_in_process_when_the_service_is_gone(server):
    """The in-process fallback (hal's executor, which takes an input only at its operand's shape)
    gets a rank-0 partition input as [1]: the kernel reshapes it."""
    model = _op_model("ADD", [((), F32, None), ((3,), F32, None)], (3,), F32, ("AddOptions", NONE))
    d = load_delegate(server.address)
    it, ref = interpreter(model, d), interpreter(model)
    xs = [F32(1.5), np.float32([1, -2, 3])]
    assert_outputs_equal(run(it, xs), run(ref, xs))
    server.stop()
    assert_outputs_equal(run(it, xs), run(ref, xs))
    assert [k.fallbacks for k in d.impl.kernels] == [1]
