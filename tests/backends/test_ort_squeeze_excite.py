"""Squeeze-excite blocks (MEAN over rows and columns, 1x1 CONV + RELU, 1x1 CONV + RELU6 or
LOGISTIC, MUL by 1/6, MUL onto the block's input; MobileNetV3's and EfficientNet's) stay in
onnxruntime's NCHWc layout: counted on the graph onnxruntime optimises the lowered block into
(no reorder or transpose but at the partition's edges), with results within NNAPI CTS's float
criteria of the reference backend's; the exact HardSigmoid form checked on special values."""
from __future__ import annotations

import numpy as np
import pytest

ort_backend = pytest.importorskip("hal.backends.ort")

from delegate.mapping import convert_partition  # noqa: E402
from delegate.tfl import read_model  # noqa: E402
from hal.compiler import compile_model  # noqa: E402
from hal.executor import execute  # noqa: E402
from hal.types import OperandType  # noqa: E402
from nnhal import examples, examples_mobilenet_v3  # noqa: E402
from tests.backends.test_ort_layout import Op, _assert_matches_reference, _Chain, _partition_graphs  # noqa: E402
from tests.harness import random_tensor, tflite_run  # noqa: E402


class _Block(_Chain):
    def conv_act(self, x, out_c, act) -> int:
        """A 1x1 CONV_2D with a fused activation (1 RELU, 3 RELU6)."""
        n, h, w, c = self.shapes[x]
        wt = self._f32(self.rng.normal(0, c ** -0.5, (out_c, 1, 1, c)))
        i = self.b.add_int32
        return self._out(Op.CONV_2D, [x, wt, self._f32(self.rng.normal(0, 1, out_c)), i(1), i(1), i(1), i(act)],
                         (n, h, w, out_c))

    def mean(self, x, keep=True) -> int:
        n, _, _, c = self.shapes[x]
        axes = self.b.add_constant(OperandType.TENSOR_INT32, np.asarray([1, 2], np.int32))
        return self._out(Op.MEAN, [x, axes, self.b.add_int32(int(keep))], (n, 1, 1, c) if keep else (n, c))


def _se_block(channels: int, sigmoid: bool = False, gate_first: bool = False, scale: float = 1 / 6):
    """conv -> SE -> conv on an 8x8 image: the gate is RELU6(conv + 3) * ``scale`` (MobileNetV3's
    hard sigmoid), or LOGISTIC(conv) (EfficientNet's)."""
    m = _Block((1, 8, 8, 16), seed=5)
    x = m.conv(m.inputs[0], channels, k=1)
    squeezed = m.conv_act(m.mean(x), max(8, channels // 4), act=1)
    if sigmoid:
        g = m.unary(Op.LOGISTIC, m.conv_act(squeezed, channels, act=0))
    else:
        g = m.binary(Op.MUL, m.conv_act(squeezed, channels, act=3), m._f32(np.float32([scale])))
    y = m.binary(Op.MUL, g, x) if gate_first else m.binary(Op.MUL, x, g)
    out = m.conv(y, 16, k=1)
    return m.finish([out]), [np.random.default_rng(6).normal(0, 1, (1, 8, 8, 16)).astype(np.float32)]


def _layout_changes(graph) -> int:
    """Nodes that convert between layouts: NCHWc reorders and transposes."""
    return sum(n.op_type.startswith("Reorder") or n.op_type == "Transpose" for n in graph.node)


@pytest.mark.parametrize("sigmoid", [False, True])
@pytest.mark.parametrize("gate_first", [False, True])
def test_a_squeeze_excite_block_stays_in_nchwc(sigmoid, gate_first):
    """64 channels squeezed to 16 (multiples of the NCHWc block: 16 with AVX-512, 8 with AVX2; fewer
    squeezed channels are read in NCHW by the convolution after them): the optimised graph
    converts layout at the edges only (one ReorderInput reading NHWC, one ReorderOutput writing
    it); before, each block reordered its input out and the product back in."""
    model, inputs = _se_block(64, sigmoid, gate_first)
    lowered, optimised, edges = _partition_graphs(model)
    assert _layout_changes(optimised.graph) == edges == 2, [n.op_type for n in optimised.graph.node]
    ops = {n.op_type for n in lowered.graph.node}
    assert {"GlobalAveragePool", "Resize"} <= ops and ("HardSigmoid" in ops) != sigmoid, ops
    _assert_matches_reference(model, inputs)


def test_unaligned_channels_and_other_scales_still_match_the_reference():
    """120 channels (not a multiple of the block: the pooling reorders) and a gate scaled by 0.2
    (not 1/6: a Mul, not HardSigmoid) compute what the reference does."""
    for model, inputs in (_se_block(120), _se_block(32, scale=0.2)):
        _assert_matches_reference(model, inputs)
    lowered, _, _ = _partition_graphs(_se_block(32, scale=0.2)[0])
    assert "HardSigmoid" not in {n.op_type for n in lowered.graph.node}


def test_mean_without_keep_dims_after_a_convolution():
    m = _Block((1, 6, 5, 4), seed=7)
    model = m.finish([m.mean(m.conv(m.inputs[0], 24, k=3), keep=False)])
    inputs = [np.random.default_rng(8).normal(0, 2, (1, 6, 5, 4)).astype(np.float32)]
    lowered, _, _ = _partition_graphs(model)
    assert "GlobalAveragePool" in {n.op_type for n in lowered.graph.node}
    _assert_matches_reference(model, inputs)


def test_hard_sigmoid_form_is_exact_on_special_values():
    """RELU6(z) * (1/6) as HardSigmoid(z, 1/6, 0): the reference's values on NaN, infinities,
    signed zeros, 6 and its neighbours, and extremes (z = conv output + an input holding them)."""
    m = _Block((1, 4, 5, 8), seed=9)
    extra = m.input((1, 4, 5, 8))
    z = m.binary(Op.ADD, m.conv(m.inputs[0], 8, k=1), extra)
    y = m.binary(Op.MUL, m.unary(Op.RELU6, z), m._f32(np.float32([1 / 6])))
    model = m.finish([y])
    rng = np.random.default_rng(10)
    data = rng.normal(0, 5, (1, 4, 5, 8)).astype(np.float32)
    six = np.float32(6)
    special = [np.nan, np.inf, -np.inf, 0.0, -0.0, six, np.nextafter(six, 0), np.nextafter(six, 7), 3e38, -3e38, 1e-38]
    data.reshape(-1)[:len(special)] = special
    inputs = [np.zeros((1, 4, 5, 8), np.float32), data]
    lowered, _, _ = _partition_graphs(model)
    assert "HardSigmoid" in {n.op_type for n in lowered.graph.node}
    _assert_matches_reference(model, inputs)


@pytest.mark.parametrize("builder", [pytest.param("efficientnet_b0", marks=pytest.mark.xfail(
    ort_backend.blocked.block_size() == 8, strict=True,
    reason="where onnxruntime's NCHWc block is 8 (AVX2, no AVX-512) it fuses each swish into QuickGelu, which has "
           "no NCHWc kernel: reordered to NCHW, the gate's Mul with it (measured in process: the same time with "
           "that fusion disabled)")), "mobilenet_v3_small"])
def test_networks_with_squeeze_excite_blocks_reorder_no_gate(builder):
    """EfficientNet-B0 (LOGISTIC gates) and MobileNetV3-small (hard-sigmoid gates) at 64x64: no
    NCHWc reorder feeds a gate's Mul or reads its product, and the output is within 1e-4 of its
    scale from TFLite's reference kernels."""
    make = getattr(examples, builder, None) or getattr(examples_mobilenet_v3, builder)
    data = make(np.float32, 64, 10)
    model = convert_partition(read_model(data)).model
    _, optimised, _ = _partition_graphs(model)
    made_by = {o: n.op_type for n in optimised.graph.node for o in n.output}
    read_by = {}
    for n in optimised.graph.node:
        for i in n.input:
            read_by.setdefault(i, []).append(n.op_type)
    gates = [n for n in optimised.graph.node if n.op_type.startswith("Reorder")
             and (made_by.get(n.input[0]) == "Mul" or "Mul" in read_by.get(n.output[0], []))]
    assert sum(n.op_type == "Mul" for n in optimised.graph.node) >= 9 and not gates
    x = random_tensor(np.random.default_rng(0), (1, 64, 64, 3), np.float32)
    got = execute(compile_model(model, backend_order=["onnxruntime"]), [x])[0]
    want = tflite_run(data, [x])[0]
    assert np.abs(got.astype(np.float64) - want).max() <= 1e-4 * np.abs(want).max()
