"""The onnxruntime backend's layout: one per partition. Activations stay in NCHW (the layout of
the convolutions) between operations and are transposed once at the partition's edges; counted
here on MediaPipe-style graphs (CONV, DEPTHWISE, PRELU, ADD, MAX_POOL, PAD, RESIZE,
CONCATENATION chains), whose results must still meet NNAPI CTS's float criteria against the
reference backend. Also PRELU's Max/Min forms, exact against the reference on infinities, NaN
and zeros, and the layout-free operations computed in NCHW with constants of every rank."""
from __future__ import annotations

import tempfile

import numpy as np
import pytest

ort_backend = pytest.importorskip("hal.backends.ort")

import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402

from hal.compiler import compile_model  # noqa: E402
from hal.executor import execute  # noqa: E402
from hal.model import ModelBuilder  # noqa: E402
from hal.plan import make_partition  # noqa: E402
from hal.types import OperandType, OperationType  # noqa: E402
from tests.backends.differential import compare  # noqa: E402

BACKEND = ort_backend.BACKEND
ORDER = ["onnxruntime", "reference"]
F32, I32 = OperandType.TENSOR_FLOAT32, OperandType.TENSOR_INT32
Op = OperationType


class _Chain:
    """A float32 NNAPI model grown one operation at a time (NHWC, SAME padding, random weights)."""

    def __init__(self, shape, seed: int = 0):
        self.b = ModelBuilder()
        self.rng = np.random.default_rng(seed)
        self.inputs = [self.b.add_operand(F32, shape)]
        self.shapes = {self.inputs[0]: tuple(shape)}

    def _out(self, op, inputs, shape) -> int:
        y = self.b.add_operand(F32, shape)
        self.b.add_operation(op, inputs, [y])
        self.shapes[y] = tuple(shape)
        return y

    def _f32(self, array) -> int:
        array = np.asarray(array, np.float32)
        index = self.b.add_constant(F32, array)
        self.shapes[index] = array.shape
        return index

    def conv(self, x, out_c, k=3, stride=1) -> int:
        n, h, w, c = self.shapes[x]
        wt = self._f32(self.rng.normal(0, (k * k * c) ** -0.5, (out_c, k, k, c)))
        i = self.b.add_int32
        return self._out(Op.CONV_2D, [x, wt, self._f32(self.rng.normal(0, 0.1, out_c)), i(1), i(stride), i(stride),
                                      i(0)], (n, -(-h // stride), -(-w // stride), out_c))

    def depthwise(self, x, stride=1) -> int:
        n, h, w, c = self.shapes[x]
        wt = self._f32(self.rng.normal(0, 1 / 3, (1, 3, 3, c)))
        i = self.b.add_int32
        return self._out(Op.DEPTHWISE_CONV_2D, [x, wt, self._f32(self.rng.normal(0, 0.1, c)), i(1), i(stride),
                                                i(stride), i(1), i(0)], (n, -(-h // stride), -(-w // stride), c))

    def prelu(self, x, alpha=None) -> int:
        c = self.shapes[x][3]
        alpha = self.rng.uniform(0.05, 0.3, (1, 1, c)) if alpha is None else alpha
        return self._out(Op.PRELU, [x, self._f32(alpha)], self.shapes[x])

    def binary(self, op, a, b) -> int:
        shape = np.broadcast_shapes(self.shapes[a], self.shapes[b])
        return self._out(op, [a, b, self.b.add_int32(0)], shape)

    def max_pool(self, x) -> int:
        n, h, w, c = self.shapes[x]
        i = self.b.add_int32
        return self._out(Op.MAX_POOL_2D, [x, i(1), i(2), i(2), i(2), i(2), i(0)], (n, -(-h // 2), -(-w // 2), c))

    def pad(self, x, paddings, op=Op.PAD, extra=()) -> int:
        shape = tuple(d + b + a for d, (b, a) in zip(self.shapes[x], paddings))
        pads = self.b.add_constant(I32, np.asarray(paddings, np.int32))
        return self._out(op, [x, pads, *extra], shape)

    def resize(self, x, op, h, w, align=False, half=False) -> int:
        n, _, _, c = self.shapes[x]
        i, flag = self.b.add_int32, self.b.add_bool
        return self._out(op, [x, i(w), i(h), flag(False), flag(align), flag(half)], (n, h, w, c))

    def concat(self, parts, axis) -> int:
        shape = list(self.shapes[parts[0]])
        shape[axis] = sum(self.shapes[p][axis] for p in parts)
        return self._out(Op.CONCATENATION, [*parts, self.b.add_int32(axis)], shape)

    def unary(self, op, x, *params) -> int:
        return self._out(op, [x, *params], self.shapes[x])

    def input(self, shape) -> int:
        x = self.b.add_operand(F32, shape)
        self.inputs.append(x)
        self.shapes[x] = tuple(shape)
        return x

    def finish(self, outputs):
        self.b.identify_inputs_and_outputs(self.inputs, list(outputs))
        return self.b.finish()


def _mediapipe_chain():
    """Stem conv + PReLU, a residual block, a strided block whose shortcut is max-pooled and
    widened by PAD, a block widened by CONCATENATION, bilinear and nearest upsampling, a skip
    CONCATENATION and a sigmoid: every kind of operation a landmark or segmentation network
    chains between its convolutions."""
    m = _Chain((1, 16, 16, 3))
    x = m.prelu(m.conv(m.inputs[0], 16, stride=2))  # 8x8x16
    x = m.prelu(m.binary(Op.ADD, m.conv(m.depthwise(x), 16, k=1), x))
    skip = x
    wide = m.pad(m.max_pool(x), [(0, 0), (0, 0), (0, 0), (0, 16)])  # 4x4x32
    x = m.prelu(m.binary(Op.ADD, m.conv(m.depthwise(x, stride=2), 32, k=1), wide))
    x = m.prelu(m.binary(Op.ADD, m.conv(m.depthwise(x), 48, k=1), m.concat([x, m.conv(x, 16, k=1)], 3)))
    up = m.resize(x, Op.RESIZE_BILINEAR, 8, 8, half=True)  # 8x8x48
    x = m.concat([up, skip], 3)  # 8x8x64
    x = m.resize(m.conv(x, 16, k=1), Op.RESIZE_NEAREST_NEIGHBOR, 16, 16)
    return m.finish([m.unary(Op.LOGISTIC, x)]), [np.random.default_rng(1).uniform(-1, 1, (1, 16, 16, 3))
                                                 .astype(np.float32)]


def _partition_graphs(model):
    """The single onnxruntime partition of ``model``: its lowered ONNX graph and the graph
    onnxruntime optimises that into (the session's own settings)."""
    plan = compile_model(model, backend_order=ORDER).static_plan
    assert {s.backend for s in plan.steps} == {BACKEND.name}, [s.ctx.name for s in plan.steps
                                                                if s.backend != BACKEND.name]
    part = make_partition(model, plan.steps, 0, len(plan.steps), plan.infos, plan.keep)
    graph, _ = ort_backend.lower_partition(BACKEND, part)
    lowered = graph.model(part.inputs, part.outputs)
    with tempfile.NamedTemporaryFile(suffix=".onnx") as f:
        so = ort_backend.session_options()
        so.optimized_model_filepath = f.name
        ort.InferenceSession(lowered.SerializeToString(), so, providers=["CPUExecutionProvider"])
        optimised = onnx.load(f.name)
    edges = sum(len(model.main.operands[i].dimensions) == 4
                for i in (*model.main.input_indexes, *model.main.output_indexes))
    return lowered, optimised, edges


def _relayouts(graph) -> int:
    """NHWC <-> NCHW transposes plus NCHWc reorders that read or write NHWC (channels_last):
    layout changes other than the blocked layout of the convolutions. (Resizing swaps H and W
    inside NCHW to gather columns as rows: not a change of layout.)"""
    def attr(n, name):
        return next((onnx.helper.get_attribute_value(a) for a in n.attribute if a.name == name), None)
    return sum((n.op_type == "Transpose" and list(attr(n, "perm")) in ([0, 3, 1, 2], [0, 2, 3, 1]))
               or (n.op_type.startswith("Reorder") and bool(attr(n, "channels_last"))) for n in graph.node)


def _assert_matches_reference(model, inputs) -> None:
    got = execute(compile_model(model, backend_order=ORDER), inputs)
    want = execute(compile_model(model, backend_order=["reference"]), inputs)
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        why = compare(g, w)
        assert why is None, f"output {k}: {why}"


def test_a_mediapipe_style_chain_changes_layout_only_at_its_edges():
    model, inputs = _mediapipe_chain()
    lowered, optimised, edges = _partition_graphs(model)
    ops = {n.op_type for n in lowered.graph.node}
    assert {"Conv", "Max", "Add", "MaxPool", "Pad", "Concat", "Sigmoid"} <= ops, ops
    # The stem convolution reads the NHWC input as one channel (no Transpose): the output's only.
    assert edges == 2 and _relayouts(lowered.graph) == 1
    assert _relayouts(optimised.graph) <= 1
    _assert_matches_reference(model, inputs)


@pytest.mark.parametrize("c, k, stride, pads, dilation", [
    (3, 3, 2, 1, 1), (3, 3, 1, 2, 1), (1, 5, 2, 1, 1), (2, 3, 3, 2, 1), (3, 3, 2, (0, 2, 1, 0), 1),
    (3, 3, 1, 1, (1, 2)), (3, 3, 1, 1, (2, 1)), (8, 3, 2, 1, 1)])
def test_a_stem_convolution_reads_nhwc_pixels_as_columns(c, k, stride, pads, dilation):
    """A CONV_2D of an NHWC input of up to 3 channels is a one-channel convolution of [n, 1, h, w * c]
    (no Transpose of the input); SAME (1) / VALID (2) or explicit padding (left, right, top,
    bottom), strides, a height dilation. A width dilation (dilation: (width, height)) and 8
    channels take the NCHW form. Against the reference backend with CTS's float criteria."""
    m = _Chain((2, 11, 13, c), seed=11)
    n, h, w, _ = m.shapes[m.inputs[0]]
    i = m.b.add_int32
    dw, dh = (dilation, dilation) if isinstance(dilation, int) else dilation
    wt = m._f32(m.rng.normal(0, 1, (5, k, k, c)))
    bias = m._f32(m.rng.normal(0, 1, 5))
    if isinstance(pads, tuple):
        left, right, top, bottom = pads
        geometry = [i(left), i(right), i(top), i(bottom), i(stride), i(stride), i(1)]
        oh = (h + top + bottom - (k - 1) * dh - 1) // stride + 1
        ow = (w + left + right - (k - 1) * dw - 1) // stride + 1
    else:
        geometry = [i(pads), i(stride), i(stride), i(1)]
        eh, ew = (k - 1) * dh + 1, (k - 1) * dw + 1
        oh, ow = ((-(-h // stride), -(-w // stride)) if pads == 1
                  else ((h - eh) // stride + 1, (w - ew) // stride + 1))
    y = m._out(Op.CONV_2D, [m.inputs[0], wt, bias, *geometry, m.b.add_bool(False), i(dw), i(dh)], (n, oh, ow, 5))
    model = m.finish([y])
    lowered, _, edges = _partition_graphs(model)
    flat = c <= 3 and dw == 1
    assert _relayouts(lowered.graph) == (1 if flat else 2)
    inputs = [np.random.default_rng(12).normal(0, 3, (n, h, w, c)).astype(np.float32)]
    _assert_matches_reference(model, inputs)


@pytest.mark.parametrize("builder, op", [("face_landmark_like", "Max"), ("iris_landmark_like", "Max"),
                                         ("pose_landmark_like", "Gather")])
def test_landmark_networks_change_layout_only_at_their_edges(builder, op):
    """The bench's landmark networks (at 64x64): one partition, a transpose per 4-D input and
    output at most, outputs within 1e-4 of their scale from the reference backend's. (``op``:
    what their PReLU (Max(x, x * alpha)) or bilinear upsampling (Gathers) lowers to.)"""
    from delegate.mapping import convert_partition
    from delegate.tfl import read_model
    from nnhal import examples
    model = convert_partition(read_model(getattr(examples, builder)(input_size=64))).model
    lowered, optimised, edges = _partition_graphs(model)
    assert sum(n.op_type == op for n in lowered.graph.node) > 5
    assert _relayouts(lowered.graph) <= edges and _relayouts(optimised.graph) <= edges
    x = np.random.default_rng(0).uniform(-1, 1, (1, 64, 64, 3)).astype(np.float32)
    got = execute(compile_model(model, backend_order=ORDER), [x])
    want = execute(compile_model(model, backend_order=["reference"]), [x])
    for g, w in zip(got, want, strict=True):
        assert np.abs(g - w).max() <= 1e-4 * np.abs(w).max()


# ---- PRELU ------------------------------------------------------------------------------------

SPECIAL = [np.inf, -np.inf, np.nan, 0.0, -0.0, 1e-38, -1e-38, 3e38, -3e38]


@pytest.mark.parametrize("alpha, form", [
    ([0.25, 0.5, 1.0, 0.01], "Max"), ([-0.5, 0.2, -3.0, 1.0], "Max"), ([1.0, 2.5, 1e3, 4.0], "Min"),
    ([0.0, 0.5, 0.25, 0.1], "PRelu"), ([0.5, 2.0, 0.25, 0.1], "PRelu"), ([np.inf, 0.5, 0.25, 0.1], "PRelu")])
@pytest.mark.parametrize("after_conv", [False, True])
def test_prelu_forms_match_the_reference_on_special_values(alpha, form, after_conv):
    """Max/Min(x, x * alpha) is PRELU for alphas all <= 1 (not 0) or all >= 1: checked on
    infinities, NaN, signed zeros and extremes, in NHWC (straight on the input) and in NCHW
    (after a convolution: the special values added to its output)."""
    m = _Chain((1, 4, 5, 4))
    x = m.inputs[0]
    if after_conv:
        x = m.binary(Op.ADD, m.conv(x, 4, k=1), m.input((1, 4, 5, 4)))
    y = m.prelu(x, np.asarray(alpha, np.float32).reshape(1, 1, 4))
    model = m.finish([y])
    rng = np.random.default_rng(2)
    data = rng.normal(0, 10, (1, 4, 5, 4)).astype(np.float32)
    data.reshape(-1)[:len(SPECIAL)] = SPECIAL
    inputs = [data] if not after_conv else [rng.normal(0, 1, (1, 4, 5, 4)).astype(np.float32), data]
    lowered, _, edges = _partition_graphs(model)
    assert form in {n.op_type for n in lowered.graph.node}
    assert _relayouts(lowered.graph) == (edges if after_conv else 0)
    _assert_matches_reference(model, inputs)


# ---- layout-free operations in NCHW -----------------------------------------------------------

def _after_conv(build, extra_inputs=()):
    """A conv (so the value is in NCHW), then ``build(chain, value)``; random inputs."""
    m = _Chain((1, 6, 5, 4), seed=3)
    others = [m.input(s) for s in extra_inputs]
    y = build(m, m.conv(m.inputs[0], 4), *others)
    rng = np.random.default_rng(4)
    inputs = [rng.normal(0, 2, m.shapes[i]).astype(np.float32) for i in m.inputs]
    return m.finish([y]), inputs


def _const(m, shape):
    return m._f32(m.rng.normal(0, 1, shape))


CASES = {
    "add channel vector": lambda m, x: m.binary(Op.ADD, x, _const(m, (4,))),
    "mul [w, c] constant": lambda m, x: m.binary(Op.MUL, _const(m, (5, 4)), x),
    "sub scalar": lambda m, x: m.binary(Op.SUB, x, _const(m, (1,))),
    "div 4-D constant": lambda m, x: m.binary(Op.DIV, x, m._f32(m.rng.uniform(1, 2, (1, 6, 1, 4)))),
    "maximum with an NHWC input": lambda m, x, y: m._out(Op.MAXIMUM, [x, y], (1, 6, 5, 4)),
    "add a lower-rank input": lambda m, x, y: m.binary(Op.ADD, x, y),
    "prelu alpha broadcast up": lambda m, x: m._out(Op.PRELU, [x, _const(m, (2, 1, 1, 1, 4))], (2, 1, 6, 5, 4)),
    "pad spatial": lambda m, x: m.pad(x, [(0, 0), (1, 2), (0, 1), (0, 0)]),
    "pad_v2 channels": lambda m, x: m.pad(x, [(0, 0), (0, 0), (0, 0), (2, 1)], Op.PAD_V2, [m.b.add_float32(-1.5)]),
    "mirror reflect": lambda m, x: m.pad(x, [(0, 0), (2, 1), (1, 2), (0, 0)], Op.MIRROR_PAD, [m.b.add_int32(0)]),
    "mirror symmetric": lambda m, x: m.pad(x, [(0, 0), (1, 2), (2, 0), (1, 1)], Op.MIRROR_PAD, [m.b.add_int32(1)]),
    "concat rows with a constant": lambda m, x: m.concat([x, _const(m, (1, 2, 5, 4))], 1),
    "concat channels with an input": lambda m, x, y: m.concat([y, x], 3),
    "bilinear align corners": lambda m, x: m.resize(x, Op.RESIZE_BILINEAR, 11, 7, align=True),
    "nearest half pixel": lambda m, x: m.resize(x, Op.RESIZE_NEAREST_NEIGHBOR, 3, 9, half=True),
    "elu": lambda m, x: m.unary(Op.ELU, x, m.b.add_float32(0.7)),
    "hard swish": lambda m, x: m.unary(Op.HARD_SWISH, x),
    "relu6": lambda m, x: m.unary(Op.RELU6, x),
}
EXTRA = {"maximum with an NHWC input": [(1, 6, 5, 4)], "add a lower-rank input": [(5, 4)],
         "concat channels with an input": [(1, 6, 5, 3)]}


@pytest.mark.parametrize("case", sorted(CASES))
def test_layout_free_operations_in_nchw_match_the_reference(case):
    model, inputs = _after_conv(CASES[case], EXTRA.get(case, ()))
    _assert_matches_reference(model, inputs)
    lowered, _, edges = _partition_graphs(model)
    # One transpose per 4-D input and output (an NHWC input read in NCHW is one); a result that
    # is not 4-D is computed in NHWC, after the conv's output is transposed back once.
    assert _relayouts(lowered.graph) == edges + (len(model.main.operands[model.main.output_indexes[0]].dimensions) != 4)
