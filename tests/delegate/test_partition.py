"""Partitioning: dependency-safe subsets and the selection options under TFLite's largest-first rule
(the cost rules: test_cost_partitioning.py)."""
import numpy as np
import pytest

from delegate.partition import PartitionOptions, choose_partitions, independent_subsets, parse_node_ranges
from delegate.tfl.graph import TfLiteGraph, TfLiteNode, TfLiteTensor


def LARGEST(*args, **kw) -> PartitionOptions:  # noqa: N802 - reads as the options it builds
    return PartitionOptions(*args, partitioning="largest", **kw)


def chain(n: int, branches=()) -> TfLiteGraph:
    """Node k reads tensor k, writes k+1; extra (src, dst) edges in `branches`."""
    tensors = [TfLiteTensor(i, f"t{i}", 0, (1,)) for i in range(n + 1)]
    nodes = [TfLiteNode(k, 0, (k,), (k + 1,)) for k in range(n)]
    for src, dst in branches:
        nodes[dst].inputs = nodes[dst].inputs + (src + 1,)
    return TfLiteGraph(tensors, nodes, [0], [n])


def test_subsets_follow_runs_of_same_kind():
    g = chain(6)
    assert independent_subsets(g, {0, 1, 3, 4, 5}) == [(True, [0, 1]), (False, [2]), (True, [3, 4, 5])]


def test_subset_never_depends_on_a_later_cpu_subset():
    # 0 -> 1(cpu) -> 2, and 0 -> 3 with 3 also reading 1's output: 3 cannot join 0's subset.
    tensors = [TfLiteTensor(i, f"t{i}", 0, (1,)) for i in range(5)]
    nodes = [TfLiteNode(0, 0, (0,), (1,)), TfLiteNode(1, 0, (1,), (2,)), TfLiteNode(2, 0, (2,), (3,)),
             TfLiteNode(3, 0, (1, 2), (4,))]
    g = TfLiteGraph(tensors, nodes, [0], [3, 4])
    subsets = independent_subsets(g, {0, 2, 3})
    assert subsets == [(True, [0]), (False, [1]), (True, [2, 3])]


def test_independent_branches_join_one_subset():
    tensors = [TfLiteTensor(i, f"t{i}", 0, (1,)) for i in range(4)]
    nodes = [TfLiteNode(0, 0, (0,), (1,)), TfLiteNode(1, 0, (0,), (2,)), TfLiteNode(2, 0, (1, 2), (3,))]
    assert independent_subsets(TfLiteGraph(tensors, nodes, [0], [3]), {0, 1, 2}) == [(True, [0, 1, 2])]


def test_max_partitions_keeps_the_largest():
    g = chain(12)
    supported = {0, 2, 3, 5, 6, 7, 8, 10, 11}  # runs: [0], [2,3], [5..8], [10,11]
    plan = choose_partitions(g, supported, LARGEST(max_delegated_partitions=2))
    assert plan.partitions == [[5, 6, 7, 8], [2, 3]]
    assert "max_delegated_partitions=2" in plan.rejected[0] and 10 in plan.rejected
    assert choose_partitions(g, supported, LARGEST(0)).partitions == [[5, 6, 7, 8], [2, 3], [10, 11], [0]]


def test_min_nodes_and_manual_ranges():
    g = chain(12)
    supported = set(range(12)) - {4, 9}
    plan = choose_partitions(g, supported, LARGEST(0, min_nodes_per_partition=3))
    assert plan.partitions == [[0, 1, 2, 3], [5, 6, 7, 8]]
    assert "min_nodes_per_partition" in plan.rejected[10]
    plan = choose_partitions(g, supported, LARGEST(0, 1, parse_node_ranges("0-1, 6-7,11")))
    assert plan.partitions == [[0, 1], [6, 7], [11]]
    assert plan.rejected[2] == "outside the requested node ranges"


@pytest.mark.parametrize("bad", ["x", "3-1", "1-2-3", "-4"])
def test_bad_ranges(bad):
    with pytest.raises(ValueError):
        parse_node_ranges(bad)


def _conv_graph(act):
    from delegate.tfl import TfLiteModelBuilder, read_model
    b = TfLiteModelBuilder()
    x = b.add_input("x", [1, 4, 4, 2])
    w = b.add_constant("w", np.ones((3, 3, 3, 2), np.float32))
    bias = b.add_constant("b", np.zeros(3, np.float32))
    y = b.add_tensor("y", [1, 4, 4, 3])
    b.add_operator("CONV_2D", [x, w, bias], [y], ("Conv2DOptions", {
        "padding": 0, "stride_w": 1, "stride_h": 1, "fused_activation_function": act}))
    b.set_outputs([y])
    return read_model(b.build())


def test_a_failed_node_mapping_is_rolled_back():
    """supported_nodes maps each node once into the probe model; a node failing half way (here on
    its fused TANH, after its padding scalar was added) must leave nothing behind."""
    from delegate.mapping import MappingError
    from delegate.mapping.core import MappingContext, map_node
    from delegate.tfl.schema import ActivationFunctionType as Act
    graph = _conv_graph(Act.TANH)
    ctx = MappingContext(graph)
    ctx.tensor(graph.inputs[0])  # state from earlier nodes must survive
    before = ctx.checkpoint()
    values_before = ctx.builder.finish().operand_values
    with pytest.raises(MappingError, match="fused activation"):
        map_node(ctx, graph.nodes[0])
    assert ctx.checkpoint() != before  # the failed mapping did add operands
    ctx.rollback(before)
    assert ctx.checkpoint() == before
    assert ctx.builder.finish().operand_values == values_before
    map_node(ctx, _conv_graph(Act.RELU).nodes[0])  # the context still works
    assert len(ctx.builder.model.main.operations) == 1
