"""The onnxruntime backend's pass over the optimised graph (hal/backends/ort/blocked.py): the
element-wise operations between NCHWc convolutions (PReLU's Max/Min and Mul, residual ADDs, a
shortcut's channel PAD / CONCATENATION) run on the blocked tensors, without the reorders to NCHW
and back; results against the reference backend with NNAPI CTS's float criteria, special values
included, and the landmark networks within 1e-4 of their output scale."""
from __future__ import annotations

import numpy as np
import pytest

ort_backend = pytest.importorskip("hal.backends.ort")

import onnx  # noqa: E402

from hal.backends.ort.blocked import block_size  # noqa: E402
from hal.compiler import compile_model  # noqa: E402
from hal.executor import execute  # noqa: E402
from hal.plan import make_partition  # noqa: E402
from tests.backends.test_ort_layout import I32, ORDER, Op, _assert_matches_reference, _Chain  # noqa: E402

BACKEND = ort_backend.BACKEND
pytestmark = pytest.mark.skipif(block_size() is None, reason="onnxruntime does not use NCHWc on this CPU")


def _artifact_graph(model) -> onnx.GraphProto:
    """The graph the single onnxruntime partition of ``model`` runs (its compiled artifact)."""
    plan = compile_model(model, backend_order=ORDER).static_plan
    assert {s.backend for s in plan.steps} == {BACKEND.name}
    part = make_partition(model, plan.steps, 0, len(plan.steps), plan.infos, plan.keep)
    artifact, _ = ort_backend.compile_partition(BACKEND, part)
    return onnx.load_from_string(artifact.model.tobytes()).graph


def _reorders(graph) -> tuple[int, int]:
    """(ReorderInput, ReorderOutput) nodes: NCHW <-> NCHWc copies."""
    return (sum(n.op_type == "ReorderInput" for n in graph.node), sum(n.op_type == "ReorderOutput" for n in graph.node))


def _identity_depthwise(m: _Chain, x: int) -> int:
    """A 1x1 DEPTHWISE_CONV_2D with weights 1 and bias 0: ``x`` itself, special values included,
    as an NCHWc convolution's output."""
    n, h, w, c = m.shapes[x]
    i = m.b.add_int32
    return m._out(Op.DEPTHWISE_CONV_2D, [x, m._f32(np.ones((1, 1, 1, c))), m._f32(np.zeros(c)), i(1), i(1), i(1),
                                         i(1), i(0)], (n, h, w, c))


SPECIAL = [np.inf, -np.inf, np.nan, 0.0, -0.0, 1e-38, -1e-38, 1e30, -1e30]


def _blocked_chain():
    """PReLU in both exact forms, residual ADDs (a convolution's Sum; one with RELU6), a max-pooled
    shortcut widened by PAD, CONCATENATIONs with constants (zeros: a Pad), a MUL by a [w, c] constant; 16 to 64 channels
    (multiples of the block size), four 4-D outputs, three of them read inside the chain too.
    Special values in the first input's first row of pixels (the second input, max-pooled, has
    none: onnxruntime's MaxPool drops a NaN the reference keeps, with or without this pass)."""
    m = _Chain((1, 4, 6, 16), seed=5)
    a = _identity_depthwise(m, m.inputs[0])
    b = m.prelu(a, m.rng.uniform(0.05, 0.9, (1, 1, 16)))  # Max(x, x * alpha)
    c = m.binary(Op.ADD, m.conv(b, 16, k=1), b)
    d = m.prelu(c, m.rng.uniform(1.0, 3.0, (1, 1, 16)))  # Min(x, x * alpha)
    e = m.max_pool(m.prelu(_identity_depthwise(m, m.input((1, 4, 6, 16)))))  # 2x3x16
    wide = m.pad(e, [(0, 0), (0, 0), (0, 0), (0, 16)])
    f = m._out(Op.ADD, [m.conv(e, 32, k=1), wide, m.b.add_int32(3)], (1, 2, 3, 32))  # RELU6: the conv's Clip
    g = m.concat([m.prelu(f), m._f32(m.rng.normal(0, 1, (1, 2, 3, 16)))], 3)
    g = m.concat([m._f32(np.zeros((1, 2, 3, 16))), g], 3)  # a Pad of whole blocks
    y = m.binary(Op.MUL, m.conv(g, 48, k=1), m._f32(m.rng.normal(0, 1, (3, 48))))
    rng = np.random.default_rng(6)
    data = rng.normal(0, 4, (2, 1, 4, 6, 16)).astype(np.float32)
    data[0, 0, 0, :, :len(SPECIAL)] = SPECIAL
    return m.finish([y, b, c, d]), list(data)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # the reference's inf - inf
def test_elementwise_operations_between_convolutions_stay_blocked_and_match_the_reference():
    model, inputs = _blocked_chain()
    graph = _artifact_graph(model)
    ops = {n.op_type for n in graph.node}
    assert {"Max", "Min", "Pad", "Concat", "Mul"} <= ops, ops
    # No reorder into NCHWc but the inputs'; out of it only for the four outputs.
    assert _reorders(graph) == (2, 4)
    # Both residual ADDs became convolutions' Sum inputs, the RELU6 after one its activation.
    assert not any(n.op_type in ("Add", "Clip") for n in graph.node)
    assert [a.s for n in graph.node for a in n.attribute if a.name == "activation"] == [b"Clip"]
    _assert_matches_reference(model, inputs)


def test_a_value_read_outside_the_blocked_layout_is_reordered_where_it_is_read():
    """A PReLU output a RESHAPE reads (NHWC) is reordered back for it; the blocked chain goes on."""
    m = _Chain((1, 4, 6, 16), seed=7)
    b = m.prelu(_identity_depthwise(m, m.inputs[0]))
    c = m.binary(Op.ADD, m.conv(b, 16, k=1), b)
    shape = m.b.add_constant(I32, np.asarray([1, 4 * 6 * 16], np.int32))
    flat = m._out(Op.RESHAPE, [b, shape], (1, 4 * 6 * 16))
    model = m.finish([c, flat])
    inputs = [np.random.default_rng(8).normal(0, 2, (1, 4, 6, 16)).astype(np.float32)]
    graph = _artifact_graph(model)
    assert _reorders(graph)[0] == 1 and "Max" in {n.op_type for n in graph.node}
    _assert_matches_reference(model, inputs)


@pytest.mark.parametrize("builder", ["face_landmark_like", "iris_landmark_like"])
def test_landmark_networks_reorder_only_for_their_heads(builder):
    """The bench's PReLU landmark networks (at 64x64): no reorder into NCHWc after the stem, and
    out of it only for the heads (1404, 213, 15, 1 channels: not whole blocks); outputs within
    1e-4 of their scale from the reference backend's."""
    from delegate.mapping import convert_partition
    from delegate.tfl import read_model
    from nnhal import examples
    model = convert_partition(read_model(getattr(examples, builder)(input_size=64))).model
    reorder_in, reorder_out = _reorders(_artifact_graph(model))
    assert reorder_in == 0 and reorder_out <= 2
    x = np.random.default_rng(0).uniform(-1, 1, (1, 64, 64, 3)).astype(np.float32)
    got = execute(compile_model(model, backend_order=ORDER), [x])
    want = execute(compile_model(model, backend_order=["reference"]), [x])
    for g, w in zip(got, want, strict=True):
        assert np.abs(g - w).max() <= 1e-4 * np.abs(w).max()


def _partial_block_chain():
    """20 channels (not whole blocks of 8 or 16: their padding channels must stay zero): a residual
    ADD with RELU6, a MUL by a per-channel constant and an ADD of a scalar (both laid out with
    zeros in the padding channels), a max pool, the shortcut widened 20 -> 40 by PAD (the padding
    channels become channels), a 2x bilinear upsampling (half-pixel centers) added to a projection,
    and a LOGISTIC, which does not keep zeros (read in NCHW)."""
    m = _Chain((1, 8, 6, 20), seed=9)
    a = _identity_depthwise(m, m.inputs[0])
    b = m._out(Op.ADD, [m.conv(a, 20, k=1), a, m.b.add_int32(3)], (1, 8, 6, 20))  # RELU6
    c = m.binary(Op.MUL, b, m._f32(m.rng.normal(0, 2, 20)))
    d = m.binary(Op.ADD, c, m._f32([0.5]))
    e = m.max_pool(d)  # 4x3x20
    wide = m.pad(e, [(0, 0), (0, 0), (0, 0), (0, 20)])
    f = m.binary(Op.ADD, m.conv(e, 40, k=1), wide)
    up = m.resize(f, Op.RESIZE_BILINEAR, 8, 6, half=True)
    g = m.binary(Op.ADD, up, m.conv(d, 40, k=1))
    y = m.conv(g, 16, k=1)
    z = m.conv(m.unary(Op.LOGISTIC, c), 16, k=1)
    inputs = [np.random.default_rng(10).normal(0, 4, (1, 8, 6, 20)).astype(np.float32)]
    return m.finish([y, z]), inputs


def test_values_of_partial_blocks_stay_blocked_and_match_the_reference():
    model, inputs = _partial_block_chain()
    graph = _artifact_graph(model)
    relayout = [n for n in graph.node if n.op_type.startswith("Reorder")
                and not any(a.name == "channels_last" and a.i for a in n.attribute)]
    # The LOGISTIC's input reordered to NCHW and its output back: nothing else leaves the blocked layout.
    assert sorted(n.op_type for n in relayout) == ["ReorderInput", "ReorderOutput"], [n.name for n in relayout]
    # The resize's swaps of H and W move nothing; its gathers read the blocked tensor.
    assert sum(n.op_type == "Transpose" for n in graph.node) <= 1  # the NHWC input's
    assert sum(n.op_type == "Gather" for n in graph.node) == 6
    _assert_matches_reference(model, inputs)


def test_pose_network_resizes_in_the_blocked_layout():
    """The bench's pose-style network (at 64x64): its 24-channel stem and bilinear decoder never
    reorder to NCHW; outputs within 1e-4 of their scale from the reference backend's."""
    from delegate.mapping import convert_partition
    from delegate.tfl import read_model
    from nnhal import examples
    model = convert_partition(read_model(examples.pose_landmark_like(input_size=64))).model
    graph = _artifact_graph(model)
    assert _reorders(graph) == (0, 2)  # the two heads
    assert sum(n.op_type == "Gather" for n in graph.node) == 12
    x = np.random.default_rng(0).uniform(-1, 1, (1, 64, 64, 3)).astype(np.float32)
    got = execute(compile_model(model, backend_order=ORDER), [x])
    want = execute(compile_model(model, backend_order=["reference"]), [x])
    for g, w in zip(got, want, strict=True):
        assert np.abs(g - w).max() <= 1e-4 * np.abs(w).max()


def test_mobilenet_v3_squeeze_excite_pools_in_the_blocked_layout():
    """MobileNetV3-small (at 64x64, 10 classes): the global average pool of a 120-channel
    HARD_SWISH convolution (padding channels zero: HardSwish(0) = 0) runs as an NCHWc pool, so
    nothing is reordered into NCHWc after the input; outputs within 1e-4 of their scale."""
    from delegate.mapping import convert_partition
    from delegate.tfl import read_model
    from nnhal.examples_mobilenet_v3 import mobilenet_v3_small
    model = convert_partition(read_model(mobilenet_v3_small(np.float32, input_size=64, classes=10))).model
    graph = _artifact_graph(model)
    assert _reorders(graph)[0] == 0
    assert not any(n.op_type == "GlobalAveragePool" and not n.domain for n in graph.node)
    x = np.random.default_rng(0).uniform(-1, 1, (1, 64, 64, 3)).astype(np.float32)
    got = execute(compile_model(model, backend_order=ORDER), [x])
    want = execute(compile_model(model, backend_order=["reference"]), [x])
    for g, w in zip(got, want, strict=True):
        assert np.abs(g - w).max() <= 1e-4 * np.abs(w).max()


def _input_shortcut_chain():
    """Two residual PReLU blocks whose first shortcut is the partition's NHWC input itself (a
    partition that starts inside a network), 24 channels (not whole blocks), a 4-D output.
    Special values in the input's first row of pixels."""
    m = _Chain((1, 6, 8, 24), seed=11)
    x = m.inputs[0]
    a = m.prelu(m.binary(Op.ADD, m.conv(m.depthwise(x), 24, k=1), x), m.rng.uniform(0.05, 0.9, (1, 1, 24)))
    b = m.prelu(m.binary(Op.ADD, m.conv(m.depthwise(a), 24, k=1), a), m.rng.uniform(0.05, 0.9, (1, 1, 24)))
    data = np.random.default_rng(12).normal(0, 4, (1, 6, 8, 24)).astype(np.float32)
    data[0, 0, :, :len(SPECIAL)] = SPECIAL
    return m.finish([b]), [data]


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # the reference's inf - inf
def test_a_partition_input_a_residual_block_reads_stays_blocked_and_edges_reorder_once():
    """The shortcut that is the input is read through the ReorderInput blocking it for the
    depthwise convolution: both ADDs become convolutions' Sums, the PReLUs run blocked, and the
    NHWC edges are one reorder each way (channels_last), no Transpose."""
    model, inputs = _input_shortcut_chain()
    graph = _artifact_graph(model)
    ops = [n.op_type for n in graph.node]
    assert "Add" not in ops and "Transpose" not in ops, ops
    reorders = [(n.op_type, any(a.name == "channels_last" and a.i for a in n.attribute))
                for n in graph.node if n.op_type.startswith("Reorder")]
    assert reorders == [("ReorderInput", True), ("ReorderOutput", True)], reorders
    _assert_matches_reference(model, inputs)


def test_an_nhwc_prelu_reads_its_slopes_tiled_over_a_row():
    """A PRELU on the NHWC input (no convolution to block it): its per-channel slopes are a [1, 1,
    W, C] constant (one broadcast span per row of pixels), the result the reference's."""
    m = _Chain((1, 6, 8, 24), seed=13)
    y = m.prelu(m.inputs[0], m.rng.uniform(0.05, 0.9, (1, 1, 24)))
    model = m.finish([y])
    graph = _artifact_graph(model)
    shapes = [tuple(t.dims) for t in graph.initializer]
    assert (1, 1, 8, 24) in shapes, shapes
    data = np.random.default_rng(14).normal(0, 4, (1, 6, 8, 24)).astype(np.float32)
    data[0, 0, :, :len(SPECIAL)] = SPECIAL
    _assert_matches_reference(model, [data])
