"""TFLite IF / WHILE through the nnhal delegate: mapped to NNAPI IF / WHILE over referenced
subgraphs, judged against TFLite's CPU kernels (reference kernels) on the same model."""
from __future__ import annotations

import ctypes as C

import numpy as np
import pytest

import hal
from delegate import load_delegate
from delegate.mapping import MappingError, convert_partition
from delegate.simple import PythonDelegate, SimpleDelegateInterface, absorbed_subgraphs
from delegate.subgraphs import LAYOUTS, AcquireFn, LiveSubgraphs, ReleaseFn, SubgraphAccess, layout
from delegate.tfl import read_model
from delegate.tfl.builder import TfLiteModelBuilder
from tests.delegate.control_flow_models import (
    SHAPE,
    add_counter_cond,
    add_while,
    counter_loop_model,
    if_feeds,
    if_model,
    loop_feeds,
    recurrent_loop_model,
)
from tests.delegate.helpers import assert_outputs_equal, interpreter, run

#: Reading another subgraph's inputs/outputs needs the runtime's tflite::Subgraph layout
#: (delegate.subgraphs.LAYOUTS), known for both runtimes nnhal supports: the tests below hold each to
#: delegating IF / WHILE (test_the_runtime_in_use_has_a_known_layout says which is missing). Where a
#: layout is not known, IF / WHILE stay on TFLite's CPU: test_unknown_runtime_keeps_control_flow_on_cpu.


# ---- mapping, run in-process by hal (no TFLite delegate); the plain cases: tests/ops/test_control_flow.py

@pytest.mark.parametrize("value", [True, False])
def test_if_with_a_constant_scalar_condition(value):
    model = if_model(constant_cond=value)
    graph = read_model(model)
    assert graph.tensors[graph.nodes[0].inputs[0]].shape == ()
    part = convert_partition(graph)
    compiled, ref = hal.compile_model(part.model), interpreter(model)
    for xs in if_feeds(np.random.default_rng(7)):
        assert_outputs_equal(hal.execute(compiled, xs[1:]), run(ref, xs[1:]))


def test_while_output_nobody_reads_may_be_omitted():
    """LiteRT sets a WHILE output nobody reads to -1: NNAPI still gets an operand for it."""
    model = counter_loop_model()
    graph = read_model(model)
    loop = graph.nodes[1]
    loop.outputs = (*loop.outputs[:2], -1)  # n's final value: read by no one
    part = convert_partition(graph)
    compiled, ref = hal.compile_model(part.model), interpreter(model)
    for xs in loop_feeds(np.random.default_rng(6)):
        got = hal.execute(compiled, xs)
        assert_outputs_equal([got[part.output_tensors.index(t)] for t in graph.outputs], run(ref, xs))


def test_builder_and_reader_carry_every_subgraph():
    graph = read_model(if_model(nested_while=True))
    names = [len(g.nodes) for g in graph.subgraphs]
    assert len(graph.subgraphs) == 5 and graph.subgraph(0) is graph and names == [1, 2, 1, 3, 2]
    assert graph.nodes[0].options == {"then_subgraph_index": 1, "else_subgraph_index": 4}
    assert graph.subgraph(1).nodes[1].options == {"cond_subgraph_index": 2, "body_subgraph_index": 3}
    with pytest.raises(LookupError):
        graph.subgraph(5)


def test_file_verification_checks_every_subgraph(tmp_path):
    from delegate.tfl.reader import ModelFormatError, verify_model_file
    good = tmp_path / "good.tflite"
    good.write_bytes(if_model(nested_while=True))
    verify_model_file(good)
    b = TfLiteModelBuilder()
    x = b.add_input("x", list(SHAPE))
    n = b.add_input("n", [1], np.int32)
    cond = add_counter_cond(b)
    body = b.add_subgraph("body")
    i, bx, bn = body.add_input("i", [1], np.int32), body.add_input("x", list(SHAPE)), body.add_input("n", [1], np.int32)
    w = body.add_constant("w", np.ones(SHAPE, np.float32))
    body.add_operator("ADD", [bx, bx], [w], ("AddOptions", {"fused_activation_function": 0}))  # writes a constant
    body.set_outputs([i, w, bn])
    outs = add_while(b, cond, body, [b.add_constant("zero", np.int32([0])), x, n])
    b.set_outputs([outs[1]])
    bad = tmp_path / "bad.tflite"
    bad.write_bytes(b.build())
    with pytest.raises(ModelFormatError, match=r"writes constant tensor 3 \(subgraph 2\)"):
        verify_model_file(bad)


def test_subgraph_naming_itself_is_refused():
    """A body that runs a WHILE over itself would recurse forever: the node stays on CPU."""
    b = TfLiteModelBuilder()
    x = b.add_input("x", list(SHAPE))
    n = b.add_input("n", [1], np.int32)
    zero = b.add_constant("zero", np.int32([0]))
    cond = add_counter_cond(b)
    body = b.add_subgraph("body")
    i, bx, bn = body.add_input("i", [1], np.int32), body.add_input("x", list(SHAPE)), body.add_input("n", [1], np.int32)
    outs = add_while(body, cond, body, [i, bx, bn])
    body.set_outputs(list(outs))
    add_while(b, cond, body, [zero, x, n])
    b.set_outputs([b._operators[-1].outputs[1]])
    with pytest.raises(MappingError, match="subgraph 2 contains itself"):
        convert_partition(read_model(b.build()))


def test_absorbed_subgraphs_exclude_those_a_cpu_node_reaches():
    graph = read_model(if_model(nested_while=True))
    assert absorbed_subgraphs(graph, [0]) == {1, 2, 3, 4}  # the IF, and the WHILE nested in its then-branch
    assert absorbed_subgraphs(graph, []) == set()


# ---- the live interpreter: subgraph access through the C API -----------------------------------

class _Probe(SimpleDelegateInterface):
    """Reads every subgraph during Prepare (as the nnhal delegate does) and claims nothing."""

    def __init__(self):
        self.seen: list[tuple[int, dict]] = []

    def initialize(self, context):
        subgraphs = context.graph.subgraphs
        assert isinstance(subgraphs, LiveSubgraphs)
        read = {k: (subgraphs[k].inputs, subgraphs[k].outputs, [n.builtin_code for n in subgraphs[k].nodes])
                for k in range(1, len(subgraphs))}
        self.seen.append((context.subgraph, read))
        return False


def test_live_subgraphs_read_as_the_file_says():
    """Each subgraph's nodes, inputs and outputs, read through AcquireSubgraphContext and the
    runtime's Subgraph layout, are the file's (TFLite drops the cond's unused input: -1)."""
    model = counter_loop_model()
    probe = _Probe()
    it = interpreter(model, PythonDelegate(probe))
    file = read_model(model)
    # Without a claimed WHILE, TFLite prepares the delegate on every subgraph, the primary first.
    assert [k for k, _ in probe.seen] == [0, 1, 2]
    _, read = probe.seen[0]
    for k in (1, 2):
        ins, outs, codes = read[k]
        want = file.subgraph(k)
        assert outs == want.outputs and codes == [n.builtin_code for n in want.nodes]
        assert [t if t in ins else -1 for t in want.inputs] == ins
    assert read[1][0] == [0, -1, 2]  # x: unused by the cond
    assert list(it._interpreter.InputIndices()) == file.inputs


def test_subgraph_access_checks_its_context():
    seen = []

    class Check(SimpleDelegateInterface):
        def initialize(self, context):
            access = SubgraphAccess(context.ctx_p, lambda a, n: True)
            seen.append((access.index, len(access.all), access.io(context.ctx_p)))
            return False

    it = interpreter(counter_loop_model(), PythonDelegate(Check()))
    assert seen[0] == (0, 3, (list(it._interpreter.InputIndices()), list(it._interpreter.OutputIndices())))
    with pytest.raises(LookupError):
        SubgraphAccess(C.addressof(C.create_string_buffer(512)), lambda a, n: True)


def test_live_graph_reads_only_during_prepare():
    kept = []

    class Keep(SimpleDelegateInterface):
        def initialize(self, context):
            if context.subgraph == 0:
                context.graph.subgraph(2)
                kept.append(context.graph)
            return False

    interpreter(counter_loop_model(), PythonDelegate(Keep()))
    graph = kept[0]
    assert graph.subgraph(2).nodes  # read during Prepare: kept
    with pytest.raises(LookupError, match="not read while the delegate prepared"):
        graph.subgraph(1)


def test_the_runtime_in_use_has_a_known_layout():
    """Both supported runtimes (pyproject's pins) delegate control flow: a new runtime version needs
    its Subgraph layout derived from its build (delegate/subgraphs.py says how)."""
    from delegate.runtime import label
    assert layout() is not None, f"{label()}: no tflite::Subgraph layout in delegate.subgraphs.LAYOUTS"
    assert {("tflite_runtime", "2.14.0"), ("ai_edge_litert", "2.3.0")} <= set(LAYOUTS)


def test_acquiring_a_subgraph_switches_its_context():
    """The layout's switch count, read on another Subgraph: TFLite bumps it while that subgraph's
    context is acquired, and drops it back on release."""
    counts = []

    class Acquire(SimpleDelegateInterface):
        def initialize(self, context):
            if context.subgraph == 0:
                access = SubgraphAccess(context.ctx_p, lambda a, n: True)
                count = C.c_int.from_address(access.all[2] + access.layout.switches)
                ctx = context.ctx
                got = C.c_void_p()
                counts.append(count.value)
                assert AcquireFn(ctx.AcquireSubgraphContext)(context.ctx_p, 2, C.byref(got)) == 0
                counts.append(count.value)
                assert got.value == access.all[2] + access.layout.context
                assert ReleaseFn(ctx.ReleaseSubgraphContext)(context.ctx_p, 2) == 0
                counts.append(count.value)
            return False

    interpreter(counter_loop_model(), PythonDelegate(Acquire()))
    assert counts == [0, 1, 0]


def test_a_subgraph_marked_skippable_is_not_prepared():
    """Marking the body (subgraph 2) while the primary subgraph is prepared: TFLite then prepares
    the delegate on the primary and the cond only. The primary and out-of-range indexes are refused."""
    seen, marked = [], []

    class Mark(SimpleDelegateInterface):
        def initialize(self, context):
            seen.append(context.subgraph)
            if context.subgraph == 0:
                access = context.graph.subgraphs.access
                marked.append([access.mark_skippable(k) for k in (0, 2, 3, -1)])
                marked.append([access.skippable(k) for k in range(3)])
            return False

    interpreter(counter_loop_model(), PythonDelegate(Mark()))
    assert marked == [[False, True, False, False], [False, False, True]]
    assert seen == [0, 1]


# ---- end to end: the nnhal service --------------------------------------------------------------

@pytest.mark.parametrize("scalar_cond", [False, True])
def test_while_loop_delegated_whole_matches_cpu(server, scalar_cond):
    model = counter_loop_model(scalar_cond=scalar_cond)
    d = load_delegate(server.address)
    it, ref = interpreter(model, d), interpreter(model)
    for xs in loop_feeds(np.random.default_rng(1)):
        assert_outputs_equal(run(it, xs), run(ref, xs))
    rep = d.report
    assert [(n.op, n.placement) for n in rep.nodes] == [("ADD", "nnhal"), ("WHILE", "nnhal"), ("MUL", "nnhal")]
    assert rep.partitions == [[0, 1, 2]] and len(d.impl.kernels) == 1
    assert rep.subgraphs == {}  # cond and body were marked skippable: TFLite did not prepare them again
    assert [k.fallbacks for k in d.impl.kernels] == [0]  # the service ran it


def test_recurrent_while_of_the_bench_delegated_whole_matches_cpu(server):
    """bench/float_models.py's WHILE row: a tanh recurrence with its trip count an input."""
    model = recurrent_loop_model()
    d = load_delegate(server.address, max_delegated_partitions=0)
    it, ref = interpreter(model, d), interpreter(model)
    rng = np.random.default_rng(4)
    for trips in (0, 1, 16, 40):
        xs = [rng.uniform(-1, 1, (1, 64)).astype(np.float32), np.int32([trips])]
        assert_outputs_equal(run(it, xs), run(ref, xs))
    assert [(n.op, n.placement) for n in d.report.nodes] == [
        ("WHILE", "nnhal"), ("FULLY_CONNECTED", "nnhal"), ("SOFTMAX", "nnhal")]
    assert [k.fallbacks for k in d.impl.kernels] == [0]


@pytest.mark.parametrize("local_burst", [True, False])
def test_delegated_while_obeys_loop_timeout_ms(server, local_burst):
    """A delegated WHILE longer than loop_timeout_ms fails the invoke with MISSED_DEADLINE (NNAPI's
    semantics) instead of hanging or falling back; the next, shorter run is right."""
    model = counter_loop_model()
    d = load_delegate(server.address, loop_timeout_ms=50, local_burst=local_burst)
    it, ref = interpreter(model, d), interpreter(model)
    x = np.ones(SHAPE, np.float32)
    with pytest.raises(RuntimeError, match="failed to invoke"):
        run(it, [x, np.int32([2 ** 31 - 1])])
    assert "MISSED_DEADLINE_TRANSIENT: operation 1 (WHILE): the loop ran longer than the loop timeout (0.05 s)" \
        in d.last_error
    assert_outputs_equal(run(it, [x, np.int32([3])]), run(ref, [x, np.int32([3])]))
    assert [k.fallbacks for k in d.impl.kernels] == [0]


def test_if_both_branches_delegated_match_cpu(server):
    model = if_model()
    d = load_delegate(server.address)
    it, ref = interpreter(model, d), interpreter(model)
    for xs in if_feeds(np.random.default_rng(2)):
        assert_outputs_equal(run(it, xs), run(ref, xs))
    assert [(n.op, n.placement) for n in d.report.nodes] == [("IF", "nnhal")] and d.report.subgraphs == {}


def test_while_nested_in_if_delegated_matches_cpu(server):
    model = if_model(nested_while=True)
    d = load_delegate(server.address)
    it, ref = interpreter(model, d), interpreter(model)
    for xs in if_feeds(np.random.default_rng(3)):
        assert_outputs_equal(run(it, xs), run(ref, xs))
    assert d.report.delegated == 1 and d.report.subgraphs == {}
    assert [k.fallbacks for k in d.impl.kernels] == [0]


def test_while_with_unmappable_body_stays_on_cpu(server):
    """FLOOR_MOD has no NNAPI mapping: the WHILE runs on TFLite's CPU with a reason naming the body's
    node; TFLite then prepares the delegate on cond and body, which are delegated in part."""
    model = counter_loop_model(unmappable_body=True)
    d = load_delegate(server.address, max_delegated_partitions=0, partitioning="largest")
    it, ref = interpreter(model, d), interpreter(model)
    for xs in loop_feeds(np.random.default_rng(4)):
        assert_outputs_equal(run(it, xs), run(ref, xs))
    rep = d.report
    loop = next(n for n in rep.nodes if n.op == "WHILE")
    assert loop.placement == "CPU" and "subgraph 2 node 1 (FLOOR_MOD): no NNAPI mapping for FLOOR_MOD" in loop.reason
    assert [n.op for n in rep.nodes if n.placement == "nnhal"] == ["ADD", "MUL"]
    assert sorted(rep.subgraphs) == [1, 2]
    body = rep.subgraphs[2]
    assert [(n.op, n.placement) for n in body.nodes] == [
        ("ADD", "nnhal"), ("FLOOR_MOD", "CPU"), ("MUL", "nnhal"), ("ADD", "nnhal")]
    assert [(n.op, n.placement) for n in rep.subgraphs[1].nodes] == [("LESS", "nnhal")]
    d.impl.fetch_backends()  # each kernel's backends land on its own subgraph's nodes
    for r in (rep, *rep.subgraphs.values()):
        assert all((n.backend is not None) == (n.placement == "nnhal") for n in r.nodes), \
            [(n.op, n.placement, n.backend) for n in r.nodes]


def test_unknown_runtime_keeps_control_flow_on_cpu(server, monkeypatch):
    """Where the Subgraph layout is not known, nothing is read from it: the WHILE stays on TFLite's CPU
    with the reason, the rest is delegated, and the results are TFLite's."""
    import delegate.subgraphs
    from delegate.runtime import RUNTIME
    runtime = __import__(RUNTIME)
    monkeypatch.delitem(delegate.subgraphs.LAYOUTS, (RUNTIME, runtime.__version__))
    monkeypatch.setattr(delegate.subgraphs, "_LAYOUT", False)  # looked up again, and not found
    assert layout() is None
    model = counter_loop_model()
    d = load_delegate(server.address, max_delegated_partitions=0, partitioning="largest")
    it, ref = interpreter(model, d), interpreter(model)
    for xs in loop_feeds(np.random.default_rng(5)):
        assert_outputs_equal(run(it, xs), run(ref, xs))
    loop = next(n for n in d.report.nodes if n.op == "WHILE")
    assert loop.placement == "CPU" and "subgraph layout is not known" in loop.reason
    assert [n.op for n in d.report.nodes if n.placement == "nnhal"] == ["ADD", "MUL"]
