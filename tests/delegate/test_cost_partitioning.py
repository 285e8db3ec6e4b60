"""Cost-aware partitioning (issue 17, item 4): the op-cost function, the "cost" rules of
choose_partitions, the speeds a service states (hal.performance), and real `nnhal serve`
services behind the delegate: the default one and one with --relative-speed."""
from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest

from delegate import load_delegate, runtime
from delegate.cost import (
    ANCHOR,
    CPU_RATES,
    DISPATCH_US_PER_NODE,
    GRPC_INVOKE_US,
    CostModel,
    boundary_tensors,
    node_work,
)
from delegate.options import NnhalOptions
from delegate.partition import PartitionOptions, choose_partitions, parse_node_ranges
from delegate.report import format_report, report_json
from delegate.tfl import TfLiteModelBuilder, read_model
from delegate.tfl.schema import ActivationFunctionType as Act
from delegate.tfl.schema import Padding
from hal import backends, performance
from hal.types import OperandType
from service.proto import nnhal_pb2 as pb
from tests.delegate.helpers import assert_outputs_equal, interpreter, random_inputs, run
from tests.service.conftest import HANG_LIMIT_S, ServerProcess

RNG = np.random.default_rng(17)


def _tflite_shapes(model: bytes) -> dict[int, tuple[int, ...]]:
    """Every tensor's shape as TFLite itself allocated it: the formulas below read these, not the
    shapes the builder was given."""
    return {d["index"]: tuple(int(x) for x in d["shape"]) for d in interpreter(model).get_tensor_details()}


def _weights(shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


# ---- the op-cost function ------------------------------------------------------------------------

def _conv(stride: int, padding: int, ic: int, oc: int, k: int, size: int) -> tuple[bytes, int, int]:
    b = TfLiteModelBuilder()
    x = b.add_input("x", [1, size, size, ic])
    w = b.add_constant("w", _weights((oc, k, k, ic)))
    bias = b.add_constant("b", _weights(oc))
    o = (size + stride - 1) // stride if padding == Padding.SAME else (size - k) // stride + 1
    y = b.add_tensor("y", [1, o, o, oc])
    b.add_operator("CONV_2D", [x, w, bias], [y], ("Conv2DOptions", {
        "padding": padding, "stride_w": stride, "stride_h": stride, "fused_activation_function": Act.NONE}))
    b.set_outputs([y])
    return b.build(), w, y


@pytest.mark.parametrize("stride,padding,ic,oc,k,size", [(1, Padding.SAME, 3, 8, 3, 9), (2, Padding.VALID, 4, 6, 3, 11),
                                                         (2, Padding.SAME, 5, 2, 1, 7)])
def test_conv_macs_are_output_elements_times_filter_taps(stride, padding, ic, oc, k, size):
    model, w, y = _conv(stride, padding, ic, oc, k, size)
    shapes = _tflite_shapes(model)
    oc_, kh, kw, ic_ = shapes[w]
    assert node_work(read_model(model), read_model(model).nodes[0]) == ("macs", math.prod(shapes[y]) * kh * kw * ic_)


def test_depthwise_fc_batch_matmul_and_transpose_conv_macs():
    b = TfLiteModelBuilder()
    x = b.add_input("x", [1, 8, 8, 4])
    dw = b.add_constant("dw", _weights((1, 3, 3, 8)))
    d = b.add_tensor("d", [1, 6, 6, 8])
    b.add_operator("DEPTHWISE_CONV_2D", [x, dw, b.add_constant("db", _weights(8))], [d], ("DepthwiseConv2DOptions", {
        "padding": Padding.VALID, "stride_w": 1, "stride_h": 1, "depth_multiplier": 2,
        "fused_activation_function": Act.NONE}))
    f_in = b.add_input("f", [3, 10])
    fw = b.add_constant("fw", _weights((5, 10)))
    f = b.add_tensor("fc", [3, 5])
    b.add_operator("FULLY_CONNECTED", [f_in, fw, b.add_constant("fb", _weights(5))], [f],
                   ("FullyConnectedOptions", {"fused_activation_function": Act.NONE}))
    lhs, rhs = b.add_input("lhs", [2, 4, 3]), b.add_input("rhs", [2, 4, 5])
    mm = b.add_tensor("mm", [2, 3, 5])
    b.add_operator("BATCH_MATMUL", [lhs, rhs], [mm], ("BatchMatMulOptions", {"adj_x": True, "adj_y": False}))
    t_in = b.add_input("t", [1, 4, 4, 3])
    tw = b.add_constant("tw", _weights((2, 3, 3, 3)))
    t = b.add_tensor("tc", [1, 8, 8, 2])
    b.add_operator("TRANSPOSE_CONV", [b.add_constant("os", np.array([1, 8, 8, 2], np.int32)), tw, t_in], [t],
                   ("TransposeConvOptions", {"padding": Padding.SAME, "stride_w": 2, "stride_h": 2}))
    b.set_outputs([d, f, mm, t])
    model = b.build()
    s = _tflite_shapes(model)
    g = read_model(model)
    works = [node_work(g, n) for n in g.nodes]
    _, dkh, dkw, _ = s[dw]
    assert works[0] == ("macs", math.prod(s[d]) * dkh * dkw)
    assert works[1] == ("macs", math.prod(s[f]) * s[fw][1])
    assert works[2] == ("macs", math.prod(s[mm]) * s[lhs][-2])  # adj_x: K is the lhs's second last
    toc, tkh, tkw, _ = s[tw]
    assert works[3] == ("macs", math.prod(s[t_in]) * tkh * tkw * toc)


def test_other_ops_count_elements_touched_and_a_constant_table_only_as_far_as_read():
    b = TfLiteModelBuilder()
    x, y = b.add_input("x", [2, 6]), b.add_input("y", [2, 6])
    s = b.add_tensor("s", [2, 6])
    b.add_operator("ADD", [x, y], [s], ("AddOptions", {"fused_activation_function": 0}))
    table = b.add_constant("table", _weights((1000, 4)))
    ids = b.add_input("ids", [3], np.int32)
    rows = b.add_tensor("rows", [3, 4])
    b.add_operator("GATHER", [table, ids], [rows], ("GatherOptions", {"axis": 0}))
    b.set_outputs([s, rows])
    model = b.build()
    sh, g = _tflite_shapes(model), read_model(model)
    assert node_work(g, g.nodes[0]) == ("elements", math.prod(sh[x]) + math.prod(sh[y]) + math.prod(sh[s]))
    out = math.prod(sh[rows])
    assert node_work(g, g.nodes[1]) == ("elements", out + min(math.prod(sh[table]), out) + math.prod(sh[ids]))


def _int8_conv(size: int, channels: int) -> bytes:
    """One int8 CONV_2D 3x3, SAME, [1, size, size, channels] -> the same shape."""
    b = TfLiteModelBuilder()
    x = b.add_input("x", [1, size, size, channels], np.int8, scale=0.5, zero_point=1)
    w = b.add_constant("w", RNG.integers(-9, 9, (channels, 3, 3, channels)).astype(np.int8),
                       scale=[0.1] * channels, zero_point=[0] * channels)
    c = b.add_tensor("c", [1, size, size, channels], np.int8, scale=0.3, zero_point=-2)
    b.add_operator("CONV_2D", [x, w, b.add_constant("b", np.zeros(channels, np.int32), scale=[0.05] * channels)],
                   [c], ("Conv2DOptions", {"padding": Padding.SAME, "stride_w": 1, "stride_h": 1,
                                           "fused_activation_function": Act.NONE}))
    b.set_outputs([c])
    return b.build()


def test_cpu_cost_uses_the_rate_of_the_node_type():
    q = read_model(_int8_conv(5, 6))
    f = read_model(_conv(1, Padding.SAME, 4, 6, 3, 5)[0])
    m = CostModel()
    assert m.node_cpu_us(q, q.nodes[0]) == node_work(q, q.nodes[0])[1] / m.cpu.quant_macs_per_us
    assert m.node_cpu_us(f, f.nodes[0]) == node_work(f, f.nodes[0])[1] / m.cpu.float_macs_per_us


def test_the_cpu_is_the_runtime_in_use_and_exec_time_is_relative_to_litert():
    """The CPU side of an estimate runs at the rates of the runtime this process runs TFLite in; the
    service's side is exec_time times the anchor's time (LiteRT 1 thread, hal.performance), so a
    service states one set of figures whatever runtime its clients use."""
    assert ANCHOR == "ai_edge_litert" and set(CPU_RATES) == set(runtime.RUNTIMES)
    assert CostModel().cpu == CPU_RATES[runtime.RUNTIME] and CostModel().anchor == CPU_RATES[ANCHOR]
    g = read_model(_int8_conv(8, 16))
    macs = node_work(g, g.nodes[0])[1]
    for name, rates in CPU_RATES.items():
        e = CostModel.uniform(2.0, cpu=rates).estimate(g, [0])
        assert e.cpu_us == macs / rates.quant_macs_per_us, name
        assert e.compute_us == pytest.approx(2.0 * macs / CPU_RATES[ANCHOR].quant_macs_per_us + DISPATCH_US_PER_NODE)
    # LiteRT's 8-bit path (XNNPACK) is many times tflite-runtime 2.14's: the same service is
    # slower than one CPU and faster than the other.
    assert CPU_RATES["ai_edge_litert"].quant_macs_per_us > 10 * CPU_RATES["tflite_runtime"].quant_macs_per_us


def test_an_int8_partition_kept_on_litert_is_delegated_under_tflite_runtime():
    """A service stated twice as slow as LiteRT's 8-bit CPU path (a machine without VNNI states
    its own figures: ``nnhal serve --performance``) on a large int8 convolution: slower than
    LiteRT's CPU, still faster than tflite-runtime's."""
    graph = read_model(_int8_conv(32, 64))
    plans = {name: choose_partitions(graph, {0}, PartitionOptions(0, partitioning="cost_strict",
                                                                  cost=CostModel.uniform(2.0, cpu=rates)))
             for name, rates in CPU_RATES.items()}
    assert plans["ai_edge_litert"].partitions == [] and plans["ai_edge_litert"].estimates[0].saving_us < 0
    assert plans["tflite_runtime"].partitions == [[0]] and plans["tflite_runtime"].estimates[0].saving_us > 0


def test_the_numba_backends_stated_int8_speed_delegates_a_large_convolution_under_both_runtimes():
    """hal.performance's int8 figure for the numba backend (its VNNI / AMX tiles, measured faster
    than LiteRT's XNNPACK on whole models): a large int8 convolution is worth the round trip
    under LiteRT too, by less than under tflite-runtime."""
    graph = read_model(_int8_conv(32, 64))
    speed = performance.MEASURED["numba"][OperandType.TENSOR_QUANT8_ASYMM_SIGNED]
    plans = {name: choose_partitions(graph, {0}, PartitionOptions(0, partitioning="cost_strict",
                                                                  cost=CostModel.uniform(speed, cpu=rates)))
             for name, rates in CPU_RATES.items()}
    assert all(p.partitions == [[0]] for p in plans.values())
    assert 0 < plans["ai_edge_litert"].estimates[0].saving_us < plans["tflite_runtime"].estimates[0].saving_us


def test_without_vnni_the_numba_backend_states_int8_slower_than_litert_and_keeps_it_there():
    """Where the numba backend's 8-bit GEMMs run its float32 BLAS path (version "2": no AVX-512
    VNNI) it states the speed measured there, slower than LiteRT's XNNPACK: the same large int8
    convolution stays on LiteRT, and is still delegated under tflite-runtime (its 8-bit kernels
    are slower still)."""
    graph = read_model(_int8_conv(32, 64))
    speed = performance.BY_VERSION["numba", "2"][OperandType.TENSOR_QUANT8_ASYMM_SIGNED]
    plans = {name: choose_partitions(graph, {0}, PartitionOptions(0, partitioning="cost_strict",
                                                                  cost=CostModel.uniform(speed, cpu=rates)))
             for name, rates in CPU_RATES.items()}
    assert plans["ai_edge_litert"].partitions == [] and plans["tflite_runtime"].partitions == [[0]]
    numba = backends.get("numba")
    if numba is not None:  # this machine's figure: the VNNI tiles' or the BLAS path's
        want = performance.MEASURED["numba"] if numba.version.startswith("2-vnni") else performance.BY_VERSION[
            "numba", "2"]
        assert performance.stated("numba") == want


def test_int8_arithmetic_on_elements_and_moving_them_have_their_own_rates():
    """An int8 ADD rescales every element (tflite-runtime's 8-bit path: scalar on x86, far slower
    than a copy; LiteRT's XNNPACK: faster than its float); an int8 RESHAPE copies at the float rate."""
    b = TfLiteModelBuilder()
    q = {"scale": 0.5, "zero_point": 1}
    x, y = b.add_input("x", [4, 6], np.int8, **q), b.add_input("y", [4, 6], np.int8, **q)
    s = b.add_tensor("s", [4, 6], np.int8, **q)
    b.add_operator("ADD", [x, y], [s], ("AddOptions", {"fused_activation_function": 0}))
    r = b.add_tensor("r", [24], np.int8, **q)
    b.add_operator("RESHAPE", [s, b.add_constant("shape", np.array([24], np.int32))], [r],
                   ("ReshapeOptions", {"new_shape": [24]}))
    b.set_outputs([r])
    g = read_model(b.build())
    m = CostModel()
    add, reshape = (node_work(g, n) for n in g.nodes)
    assert add[0] == reshape[0] == "elements"
    assert m.node_cpu_us(g, g.nodes[0]) == add[1] / m.cpu.quant_elements_per_us
    assert m.node_cpu_us(g, g.nodes[1]) == reshape[1] / m.cpu.elements_per_us


def test_speeds_come_from_the_capabilities_per_operand_type():
    perf = {OperandType.TENSOR_FLOAT32: 0.25, OperandType.TENSOR_QUANT8_ASYMM_SIGNED: 2.0}
    caps = pb.Capabilities(
        relaxed_float32_to_float16_performance_tensor=pb.PerformanceInfo(exec_time=0.125, power_usage=1),
        operand_performance=[pb.OperandPerformance(type=int(t), info=pb.PerformanceInfo(exec_time=v, power_usage=1))
                             for t, v in perf.items()])
    from delegate.tfl.schema import TensorType
    m = CostModel.from_capabilities(caps)
    assert (m.speed(TensorType.FLOAT32), m.speed(TensorType.INT8), m.speed(TensorType.UINT8)) == (0.25, 2.0, 1.0)
    assert CostModel.from_capabilities(caps, allow_fp16=True).speed(TensorType.FLOAT32) == 0.125
    assert CostModel.from_capabilities(caps, local_burst=False).invoke_us == GRPC_INVOKE_US


# ---- choosing partitions by cost -------------------------------------------------------------------

def _sections_model(adds: int = 0) -> bytes:
    """0 CONV_2D 3x3 32x32x64 (big) -> 1 MAX_POOL to 1x1 -> 2 COS -> 3 RESHAPE -> 4 FULLY_CONNECTED(10)
    -> 5 COS; with ``adds``, a run of that many ADDs on a 256x128x10 input after it (nodes 6...)."""
    b = TfLiteModelBuilder()
    x = b.add_input("x", [1, 32, 32, 64])
    c = b.add_tensor("c", [1, 32, 32, 64])
    b.add_operator("CONV_2D", [x, b.add_constant("w", _weights((64, 3, 3, 64)) * 0.05),
                               b.add_constant("b", _weights(64))], [c],
                   ("Conv2DOptions", {"padding": Padding.SAME, "stride_w": 1, "stride_h": 1,
                                      "fused_activation_function": Act.RELU}))
    p = b.add_tensor("p", [1, 1, 1, 64])
    b.add_operator("MAX_POOL_2D", [c], [p], ("Pool2DOptions", {
        "padding": Padding.VALID, "stride_w": 1, "stride_h": 1, "filter_width": 32, "filter_height": 32,
        "fused_activation_function": Act.NONE}))
    k = b.add_tensor("k", [1, 1, 1, 64])
    b.add_operator("COS", [p], [k])
    r = b.add_tensor("r", [1, 64])
    b.add_operator("RESHAPE", [k, b.add_constant("shape", np.array([1, 64], np.int32))], [r],
                   ("ReshapeOptions", {"new_shape": [1, 64]}))
    fc = b.add_tensor("fc", [1, 10])
    b.add_operator("FULLY_CONNECTED", [r, b.add_constant("fw", _weights((10, 64)) * 0.02),
                                       b.add_constant("fb", _weights(10))], [fc],
                   ("FullyConnectedOptions", {"fused_activation_function": Act.NONE}))
    out = b.add_tensor("out", [1, 10])
    b.add_operator("COS", [fc], [out])
    outputs = [out]
    if adds:  # the first ADD broadcasts `out` over z: the run depends on the last CPU node
        z = b.add_input("z", [1, 256, 128, 10])
        cur = out
        for i in range(adds):
            nxt = b.add_tensor(f"a{i}", [1, 256, 128, 10])
            b.add_operator("ADD", [z, cur], [nxt], ("AddOptions", {"fused_activation_function": 0}))
            cur = nxt
        outputs.append(cur)
    b.set_outputs(outputs)
    return b.build()


SUPPORTED = {0, 1, 3, 4}  # every node but the COSes


def _plan(speed: float, partitioning: str = "cost", graph=None, supported=SUPPORTED, **kw):
    graph = graph or read_model(_sections_model())
    return choose_partitions(graph, supported, PartitionOptions(
        kw.pop("max_delegated_partitions", 0), partitioning=partitioning, cost=CostModel.uniform(speed), **kw))


def test_a_tiny_partition_between_cpu_sections_is_rejected_and_the_big_one_taken():
    graph = read_model(_sections_model())
    plan = _plan(0.5, graph=graph)
    big, tiny = plan.estimates
    assert plan.partitions == [[0, 1]] and big.delegated and not tiny.delegated
    assert big.reason == f"delegated: saves {big.saving_us:.1f} us"
    assert tiny.reason == f"kept on CPU: estimated {-tiny.saving_us:.1f} us slower"
    assert plan.rejected[3] == plan.rejected[4] == tiny.reason
    # The estimate is its parts: the anchor CPU's time (LiteRT's) x the device's relative speed plus
    # each node's dispatch, one invoke, the boundary bytes.
    model = CostModel.uniform(0.5)
    assert big.cpu_us == sum(model.node_cpu_us(graph, graph.nodes[k]) for k in (0, 1))
    anchor_us = sum(model.node_cpu_us(graph, graph.nodes[k], model.anchor) for k in (0, 1))
    assert big.compute_us == pytest.approx(0.5 * anchor_us + 2 * DISPATCH_US_PER_NODE)
    crossing = [graph.tensors[t] for t in boundary_tensors(graph, [0, 1])]
    assert [t.name for t in crossing] == ["x", "p"]  # c stays inside; the weights are sent once
    assert big.transfer_bytes == sum(math.prod(t.shape) * 4 for t in crossing)
    assert big.nnhal_us == pytest.approx(big.compute_us + big.overhead_us + big.transfer_bytes * model.us_per_byte)
    # Two candidates take turns: each invoke also wakes its burst's thread on the service.
    assert big.overhead_us == tiny.overhead_us == model.invoke_us + model.turn_us


def test_relative_speed_changes_the_choice():
    assert _plan(0.5).partitions == [[0, 1]]
    slow = _plan(2.0)
    assert slow.partitions == [] and all(not e.delegated and e.saving_us < 0 for e in slow.estimates)
    assert "kept on CPU: estimated" in slow.rejected[0]
    # NNAPI's tie rule: a device exactly as fast as the CPU gains nothing and pays the invoke.
    assert _plan(1.0).partitions == []


def test_cost_orders_by_saving_and_still_honours_the_limits():
    graph = read_model(_sections_model(adds=6))
    supported = SUPPORTED | set(range(6, 12))
    plan = _plan(0.25, graph=graph, supported=supported, max_delegated_partitions=1)
    by_first = {e.nodes[0]: e for e in plan.estimates}
    assert by_first[6].saving_us > 0 and by_first[0].saving_us > by_first[6].saving_us
    assert plan.partitions == [[0, 1]]  # the conv saves most; the 6-node run has more nodes
    assert plan.rejected[6] == "beyond max_delegated_partitions=1"
    assert by_first[6].reason == "kept on CPU: beyond max_delegated_partitions=1"
    assert _plan(0.25, "largest", graph, supported, max_delegated_partitions=1).partitions == [list(range(6, 12))]
    assert _plan(0.25, graph=graph, supported=supported).partitions == [[0, 1], list(range(6, 12))]
    min3 = _plan(0.25, graph=graph, supported=supported, min_nodes_per_partition=3)
    assert min3.partitions == [list(range(6, 12))] and "min_nodes_per_partition" in min3.rejected[0]
    ranged = _plan(0.25, graph=graph, supported=supported, node_ranges=parse_node_ranges("1-11"))
    assert ranged.partitions == [list(range(6, 12))]  # node 1 alone: too little work to pay an invoke
    assert ranged.rejected[0] == "outside the requested node ranges"


def test_largest_is_unchanged_and_reports_the_estimates_too():
    graph = read_model(_sections_model())
    plain = choose_partitions(graph, SUPPORTED, PartitionOptions(0, partitioning="largest"))
    estimated = _plan(0.5, "largest", graph)
    assert plain.partitions == estimated.partitions == [[0, 1], [3, 4]] and plain.estimates == []
    assert plain.rejected == estimated.rejected == {}
    tiny = estimated.estimates[1]
    assert tiny.delegated and tiny.reason == f"delegated (largest first): estimated {-tiny.saving_us:.1f} us slower"


def test_cost_without_capabilities_keeps_a_partial_graph_on_cpu():
    plan = choose_partitions(read_model(_sections_model()), SUPPORTED, PartitionOptions(0, partitioning="cost"))
    assert plan.partitions == [] and plan.rejected[0] == "cost partitioning: the service's capabilities are unknown"


def test_cost_delegates_a_wholly_supported_graph_whole_and_cost_strict_weighs_it_too():
    graph = read_model(_sections_model())
    every = set(range(len(graph.nodes)))
    whole = _plan(2.0, graph=graph, supported=every)  # a device estimated slower than the CPU
    (e,) = whole.estimates
    assert e.overhead_us == CostModel().invoke_us  # alone: its burst is invoked back to back
    assert whole.partitions == [sorted(every)] and e.delegated and e.saving_us < 0
    assert e.reason == (f"delegated (the whole graph is supported): estimated {-e.saving_us:.1f} us slower; "
                        "partitioning='cost_strict' would keep it on CPU")
    strict = _plan(2.0, "cost_strict", graph, every)
    assert strict.partitions == [] and strict.estimates[0].reason.startswith("kept on CPU: estimated")
    assert _plan(0.5, "cost_strict", graph, every).partitions == [sorted(every)]
    # Without capabilities "cost" still delegates a whole graph (no estimate needed); the strict rule cannot.
    assert choose_partitions(graph, every, PartitionOptions(0)).partitions == [sorted(every)]
    assert choose_partitions(graph, every, PartitionOptions(0, partitioning="cost_strict")).partitions == []
    # Not whole: a node range, or min_nodes_per_partition, and the cost rule applies.
    ranged = _plan(2.0, graph=graph, supported=every, node_ranges=parse_node_ranges("0-5"))
    assert ranged.partitions == [] and ranged.estimates[0].reason.startswith("kept on CPU")
    assert _plan(0.5, graph=graph, supported=every, min_nodes_per_partition=7).partitions == []


def test_partitioning_option_is_checked():
    with pytest.raises(ValueError, match="unknown partitioning 'fastest'"):
        NnhalOptions.from_kwargs(partitioning="fastest")
    with pytest.raises(ValueError, match="unknown partitioning"):
        choose_partitions(read_model(_sections_model()), SUPPORTED, PartitionOptions(partitioning="fastest"))
    assert NnhalOptions.from_kwargs().partitioning == PartitionOptions().partitioning == "cost"


# ---- the speeds a service states ----------------------------------------------------------------

def test_a_type_gets_the_first_measured_figure_of_the_order_and_unmeasured_types_the_slowest():
    order = [b.name for b in backends.available()]
    times = performance.exec_times(order)
    assert set(times) == {int(t) for t in OperandType if t != OperandType.SUBGRAPH}
    for t, v in times.items():
        stated = [performance.stated(n)[t] for n in order if t in performance.stated(n)]
        assert v == (stated[0] if stated else performance.slowest(times))
    assert performance.slowest(times) == max(v for n in order for v in performance.stated(n).values())
    # The reference backend alone: its own figures, slower than the default order's for float32.
    alone = performance.exec_times([backends.REFERENCE])
    assert alone[OperandType.TENSOR_FLOAT32] == performance.MEASURED[backends.REFERENCE][OperandType.TENSOR_FLOAT32]
    if "onnxruntime" in order:
        assert times[OperandType.TENSOR_FLOAT32] < alone[OperandType.TENSOR_FLOAT32]


# ---- end to end: a real service stating its speed -----------------------------------------------

def _anchor_us(model: bytes, nodes: list[int]) -> float:
    """The nodes' time on the CPU exec_time is relative to (LiteRT 1 thread)."""
    graph, cost = read_model(model), CostModel()
    return sum(cost.node_cpu_us(graph, graph.nodes[k], cost.anchor) for k in nodes)


@pytest.fixture
def fast_server(tmp_path):
    s = ServerProcess(tmp_path, "--relative-speed", "0.5")
    yield s
    s.stop()


def test_delegate_on_a_faster_service_takes_the_big_partition_only(fast_server, tmp_path):
    model = _sections_model()
    want_it = interpreter(model)  # TFLite's reference kernels
    inputs = random_inputs(want_it, RNG)
    d = load_delegate(fast_server.address, partitioning="cost", max_delegated_partitions=0)
    got = run(interpreter(model, d), inputs)
    assert_outputs_equal(got, run(want_it, inputs))
    r = d.report
    assert r.partitions == [[0, 1]] and r.delegated == 2
    big, tiny = r.candidates
    # The service's exec_time reached the delegate.
    assert big.compute_us == pytest.approx(0.5 * _anchor_us(model, big.nodes) + len(big.nodes) * DISPATCH_US_PER_NODE)
    assert (big.reason, tiny.reason) == (f"delegated: saves {big.saving_us:.1f} us",
                                         f"kept on CPU: estimated {-tiny.saving_us:.1f} us slower")
    assert r.nodes[3].reason == tiny.reason and r.nodes[2].reason == "no NNAPI mapping for COS"
    text = format_report(r)
    assert "nodes 0-1 (2): CPU" in text and f"-> {big.reason}" in text and f"-> {tiny.reason}" in text
    assert json.loads(report_json(r))["candidates"][1]["reason"] == tiny.reason

    # The same through `nnhal report`'s flags: cost is the default; "largest" takes both partitions.
    path = tmp_path / "m.tflite"
    path.write_bytes(model)
    for flags, partitions in (((), [[0, 1]]), (("--partitioning", "largest"), [[0, 1], [3, 4]])):
        out = subprocess.run([sys.executable, "-m", "nnhal.cli", "report", "--model_file", str(path), "--json",
                              "--service_address", fast_server.address, "--max_delegated_partitions", "0", *flags],
                             capture_output=True, text=True, timeout=HANG_LIMIT_S)
        assert out.returncode == 0, out.stderr
        report = json.loads(out.stdout)
        assert report["partitions"] == partitions
        assert [c["delegated"] for c in report["candidates"]] == [True, partitions != [[0, 1]]]


def test_the_default_service_states_its_backends_measured_figures(server, tmp_path):
    """`nnhal serve` without --relative-speed: getCapabilities carries hal.performance's figures for
    the service's backend order, and the delegate's default (cost) partitioning weighs with them."""
    from service.client import Client
    order = json.loads(subprocess.run([sys.executable, "-m", "nnhal.cli", "backends", "--json"], capture_output=True,
                                      text=True, timeout=HANG_LIMIT_S, check=True).stdout)["preference"]
    with Client.connect(server.address) as client:
        caps = client.get_capabilities()
    stated = {p.type: p.info.exec_time for p in caps.operand_performance}
    want = performance.exec_times(order)
    assert stated == pytest.approx(want)
    assert caps.relaxed_float32_to_float16_performance_tensor.exec_time == pytest.approx(
        performance.relaxed_exec_time(order, want))
    assert caps.while_performance.exec_time == pytest.approx(performance.slowest(want))
    d = load_delegate(server.address, max_delegated_partitions=0)
    interpreter(_sections_model(), d)
    for e in d.report.candidates:
        speed = want[OperandType.TENSOR_FLOAT32]
        assert e.compute_us == pytest.approx(_anchor_us(_sections_model(), e.nodes) * speed
                                             + len(e.nodes) * DISPATCH_US_PER_NODE), e.nodes
        assert e.delegated == (e.saving_us > 0)


def _performance_file(tmp_path, content) -> str:
    path = tmp_path / "performance.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return str(path)


def test_a_performance_file_replaces_the_figures_of_the_backends_it_names(tmp_path):
    path = _performance_file(tmp_path, {backends.REFERENCE: {"TENSOR_FLOAT32": 7.5, "TENSOR_INT32": 2}})
    measured = performance.read_measured(path)
    assert measured == {backends.REFERENCE: {OperandType.TENSOR_FLOAT32: 7.5, OperandType.TENSOR_INT32: 2.0}}
    times = performance.exec_times([backends.REFERENCE], measured)
    assert times[OperandType.TENSOR_FLOAT32] == 7.5 and times[OperandType.TENSOR_INT32] == 2.0
    # The reference backend's built-in int8 figure is replaced too: an unnamed type is unmeasured.
    assert times[OperandType.TENSOR_QUANT8_ASYMM_SIGNED] == 7.5


@pytest.mark.parametrize("content, words", [
    ("{not json", "not JSON"),
    ([1.0], "want an object of backend names"),
    ({"tpu": {"TENSOR_FLOAT32": 0.1}}, "unknown backend 'tpu' (available: "),
    ({backends.REFERENCE: {"TENSOR_FLOAT64": 1.0}}, "unknown operand type 'TENSOR_FLOAT64'"),
    ({backends.REFERENCE: {"name": 1.0}}, "unknown operand type 'name'"),
    ({backends.REFERENCE: {"SUBGRAPH": 1.0}}, "unknown operand type 'SUBGRAPH'"),
    ({backends.REFERENCE: {"TENSOR_FLOAT32": 0}}, "TENSOR_FLOAT32 must be a number > 0, not 0"),
    ({backends.REFERENCE: {"TENSOR_FLOAT32": True}}, "must be a number > 0, not True"),
    ({backends.REFERENCE: {"TENSOR_FLOAT32": "1.0"}}, "must be a number > 0, not '1.0'"),
    ('{"reference": {"TENSOR_FLOAT32": NaN}}', "must be a number > 0, not nan"),
    ({backends.REFERENCE: []}, "want an object of operand type names"),
    (" " * (performance.MAX_FILE_BYTES + 1), "larger than"),
])
def test_a_bad_performance_file_is_one_clear_error(tmp_path, content, words):
    path = _performance_file(tmp_path, content)
    with pytest.raises(ValueError, match=f"performance file {path}: ") as e:
        performance.read_measured(path)
    assert words in str(e.value)
    with pytest.raises(ValueError, match="No such file"):
        performance.read_measured(str(tmp_path / "missing.json"))


def test_a_service_started_with_a_performance_file_states_its_figures(tmp_path):
    from service.client import Client
    figures = {backends.REFERENCE: {"TENSOR_FLOAT32": 0.25, "TENSOR_QUANT8_ASYMM_SIGNED": 0.125}}
    s = ServerProcess(tmp_path, "--performance", _performance_file(tmp_path, figures), "--backend", "reference")
    try:
        with Client.connect(s.address) as client:
            stated = {p.type: p.info.exec_time for p in client.get_capabilities().operand_performance}
    finally:
        s.stop()
    assert stated[OperandType.TENSOR_FLOAT32] == 0.25 and stated[OperandType.TENSOR_QUANT8_ASYMM_SIGNED] == 0.125
    assert stated[OperandType.TENSOR_INT32] == 0.25  # unmeasured: the slowest stated


def test_serve_refuses_a_bad_performance_file_and_both_speed_options(tmp_path):
    for extra, words in ((("--performance", _performance_file(tmp_path, "[]")), "want an object of backend names"),
                         (("--performance", _performance_file(tmp_path, {}), "--relative-speed", "0.5"),
                          "give --relative-speed or --performance, not both")):
        out = subprocess.run([sys.executable, "-m", "nnhal.cli", "serve", "--socket", str(tmp_path / "s.sock"),
                              "--no-cache", *extra], capture_output=True, text=True, timeout=HANG_LIMIT_S)
        assert out.returncode == 2 and words in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_serve_refuses_a_relative_speed_that_is_not_positive(tmp_path):
    out = subprocess.run([sys.executable, "-m", "nnhal.cli", "serve", "--socket", str(tmp_path / "s.sock"),
                          "--no-cache", "--relative-speed", "0"], capture_output=True, text=True,
                         timeout=HANG_LIMIT_S)
    assert out.returncode == 2 and "--relative-speed must be a number > 0" in out.stderr
