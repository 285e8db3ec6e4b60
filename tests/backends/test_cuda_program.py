"""The cuda backend's torch operator builders against onnxruntime, the ONNX oracle, one ONNX node
(or a tiny graph) at a time: the forms the NNAPI CTS cases may not reach (negative Slice steps,
uneven pads, output_padding, ties, select_last_index, fmod, negative indices, ...). test_cuda.py
checks the backend end to end against the reference backend; this checks that each builder means
what ONNX means, so a lowering that starts to use a new form of an op meets no surprise.

Parameters ONNX takes as inputs (Slice's starts, Pad's pads, ...) are initializers, as the
lowerings make them. Integer, bool and data-movement outputs must match exactly; float math
within CTS's float32 criteria (``compare``); a float16 program (a relaxed partition) within CTS's
float16 criteria against onnxruntime in float32.
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

torch = pytest.importorskip("torch", reason="torch is not installed (pip install nnhal[cuda])")
ort = pytest.importorskip("onnxruntime")

from hal.backends.cuda import ops_math, ops_nn, ops_tensor  # noqa: E402, F401  (register the operators)
from hal.backends.cuda.program import Program  # noqa: E402
from hal.backends.ort.graph import OPSET  # noqa: E402
from tests.backends.differential import compare  # noqa: E402

RNG = np.random.default_rng(20261127)
I64 = np.int64


def _f(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def _model(nodes: list[onnx.NodeProto], feeds: dict[str, np.ndarray], inits: dict[str, np.ndarray],
           outputs: list[str]) -> onnx.ModelProto:
    """The graph of ``nodes``: ``feeds`` its inputs, ``inits`` its initializers, output types inferred."""
    graph = helper.make_graph(
        nodes, "case",
        [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape) for k, v in feeds.items()],
        [onnx.ValueInfoProto(name=o) for o in outputs],
        [onnx.numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    onnx.checker.check_model(model)
    return model


def _ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def _program(model: onnx.ModelProto, feeds: dict[str, np.ndarray], half: bool = False) -> list[np.ndarray]:
    float_type = torch.float16 if half else torch.float32
    program = Program(model, {}, torch.device("cpu"), float_type)
    ins = [torch.from_numpy(v.copy()) for v in feeds.values()]
    ins = [t.to(float_type) if t.dtype == torch.float32 else t for t in ins]
    outs = [t.cpu() for t in program(ins)]
    return [(t.float() if half and t.dtype == torch.float16 else t).numpy() for t in outs]


def check(op: str, feeds: dict[str, np.ndarray], inits: dict[str, np.ndarray] | None = None,
          inputs: list[str] | None = None, outputs: int = 1, exact: bool = False, **attrs) -> list[np.ndarray]:
    """One ``op`` node over ``inputs`` (default: the feeds, then the initializers, in order; "" for
    an omitted optional input) against onnxruntime; returns onnxruntime's outputs."""
    inits = inits or {}
    names = inputs if inputs is not None else [*feeds, *inits]
    outs = [f"y{k}" for k in range(outputs)]
    model = _model([helper.make_node(op, names, outs, **attrs)], feeds, inits, outs)
    return check_model(model, feeds, exact)


def check_model(model: onnx.ModelProto, feeds: dict[str, np.ndarray], exact: bool = False) -> list[np.ndarray]:
    want, got = _ort(model, feeds), _program(model, feeds)
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        if exact:
            assert g.dtype == w.dtype and g.shape == w.shape, f"output {k}: {g.dtype}{g.shape} != {w.dtype}{w.shape}"
            np.testing.assert_array_equal(g, w, err_msg=f"output {k}")
        else:
            problem = compare(g, w)
            assert problem is None, f"output {k}: {problem}"
    return want


# --- data movement: exact ---------------------------------------------------------------------

@pytest.mark.parametrize("starts,ends,axes,steps", [
    ([4], [-9], [1], [-1]),                        # negative step through index 0 (end below -n)
    ([-1, 0], [0, 5], [1, 0], [-2, 1]),             # axes out of order, negative step stopping at 1
    ([-100], [100], [2], [3]),                      # out-of-range start and end clamp
    ([2], [1], [0], [1]),                           # empty
    ([10], [-100], [-1], [-2]),                     # negative axis, start above n with a negative step
    ([1, 1, 1], [-1, 4, 3], None, None),            # no axes, no steps
    ([np.iinfo(I64).max], [np.iinfo(I64).min], [1], [-1]),  # INT64 sentinels: the whole axis reversed
])
def test_slice(starts, ends, axes, steps):
    x = np.arange(3 * 5 * 4, dtype=np.float32).reshape(3, 5, 4)
    inits = {"starts": np.array(starts, I64), "ends": np.array(ends, I64)}
    if axes is not None:
        inits["axes"] = np.array(axes, I64)
    if steps is not None:
        inits["steps"] = np.array(steps, I64)
    check("Slice", {"x": x}, inits, exact=True)


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge"])
@pytest.mark.parametrize("pads", [[0, 2, 1, 0, 1, 3], [1, -1, 0, -1, 2, 1], [0, -2, -1, 0, 0, 0]])
def test_pad(mode, pads):
    x = _f(3, 4, 5)  # (negative pads crop before a reflection: an axis it reflects keeps 2 elements)
    inits = {"pads": np.array(pads, I64)}
    if mode == "constant":
        inits["value"] = np.array(1.5, np.float32)
    check("Pad", {"x": x}, inits, exact=True, mode=mode)


@pytest.mark.parametrize("indices", [np.array([[0, -1], [-3, 2]], I64), np.array(-2, I64)])
@pytest.mark.parametrize("axis", [0, -1])
def test_gather(indices, axis):
    x = _f(3, 4)
    check("Gather", {"x": x}, {"i": indices}, exact=True, axis=axis)
    check("Gather", {"x": x, "i": indices.astype(np.int32)}, exact=True, axis=axis)  # computed indices


@pytest.mark.parametrize("split", [None, [1, 4, 1]])
def test_split(split):
    x = _f(2, 6, 3)
    inits = {} if split is None else {"split": np.array(split, I64)}
    check("Split", {"x": x}, inits, outputs=3, exact=True, axis=-2)


@pytest.mark.parametrize("shape,allowzero", [([0, -1], 0), ([-1, 0, 2], 0), ([2, 0, 3, 0], 1), ([0, 3, 4], 0)])
def test_reshape(shape, allowzero):
    x = _f(2, 3, 4) if not allowzero else _f(2, 0, 3, 0)
    check("Reshape", {"x": x}, {"shape": np.array(shape, I64)}, exact=True, allowzero=allowzero)


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_depth_to_space(mode):
    check("DepthToSpace", {"x": _f(2, 12, 2, 3)}, exact=True, blocksize=2, mode=mode)


def test_space_to_depth():
    check("SpaceToDepth", {"x": _f(2, 3, 4, 6)}, exact=True, blocksize=2)


def test_tile_concat_transpose():
    check("Tile", {"x": _f(2, 3)}, {"r": np.array([2, 3], I64)}, exact=True)
    check("Concat", {"a": _f(2, 3), "b": _f(2, 1), "c": _f(2, 2)}, exact=True, axis=-1)
    check("Transpose", {"x": _f(2, 3, 4)}, exact=True)
    check("Transpose", {"x": _f(2, 3, 4)}, exact=True, perm=[1, 2, 0])


@pytest.mark.parametrize("largest", [0, 1])
def test_topk_ties(largest):
    x = np.array([[3, 1, 3, 2, 1, 3], [0, 0, 0, 0, 0, 0]], np.float32)
    check("TopK", {"x": x}, {"k": np.array([4], I64)}, outputs=2, exact=True, axis=1, largest=largest)
    check("TopK", {"x": x.T.copy()}, {"k": np.array([2], I64)}, outputs=2, exact=True, axis=0, largest=largest)


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("last", [0, 1])
@pytest.mark.parametrize("keepdims,axis", [(1, 1), (0, -1), (0, 0)])
def test_arg(op, last, keepdims, axis):
    x = np.array([[[2, 5, 5, 1], [5, 1, 2, 1], [1, 1, 5, 2]]], np.float32).repeat(2, 0)
    check(op, {"x": x}, exact=True, axis=axis, keepdims=keepdims, select_last_index=last)


# --- integer and bool: exact -------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_integer_div_mod(dtype):
    a = np.array([7, -7, 7, -7, 0, 5, -9, 9], dtype)
    b = np.array([2, 2, -2, -2, 3, -5, 4, -4], dtype)
    check("Div", {"a": a, "b": b}, exact=True)                   # truncates toward zero
    check("Mod", {"a": a, "b": b}, exact=True, fmod=0)           # sign of the divisor
    check("Mod", {"a": a, "b": b}, exact=True, fmod=1)           # sign of the dividend


def test_float_fmod():
    a, b = _f(3, 4) * 5, _f(3, 4) + np.float32(3)
    check("Mod", {"a": a, "b": b}, exact=True, fmod=1)


@pytest.mark.parametrize("to", [onnx.TensorProto.INT32, onnx.TensorProto.INT64, onnx.TensorProto.INT8,
                                onnx.TensorProto.BOOL])
def test_cast_float_to_int(to):
    x = np.array([-2.7, -2.5, -1.5, -0.5, -0.0, 0.3, 0.5, 1.5, 2.5, 3.99, 100.2], np.float32)
    check("Cast", {"x": x}, exact=True, to=to)


@pytest.mark.parametrize("neg,pos", [(0, 0), (0, 1), (1, 0), (1, 1)])
def test_isinf(neg, pos):
    x = np.array([np.inf, -np.inf, np.nan, 0.0, 1e38, -3.0], np.float32)
    check("IsInf", {"x": x}, exact=True, detect_negative=neg, detect_positive=pos)


def test_where():
    c = RNG.random((2, 1, 4)) > 0.5
    check("Where", {"c": c, "a": _f(3, 4), "b": _f(2, 3, 1)}, exact=True)


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Equal", "Greater",
                                "GreaterOrEqual", "Less", "LessOrEqual"])
@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_binary_broadcast(op, dtype):
    a, b = (_f(2, 3, 4) * 3).astype(dtype), (np.abs(_f(3, 1)) + 1).astype(dtype)
    if op == "Pow":
        a = np.abs(a) + (dtype(1) if dtype == np.int32 else dtype(0))
    check(op, {"a": a, "b": b}, exact=dtype != np.float32)


def test_variadic_logic_and_unary():
    check("Max", {"a": _f(2, 3), "b": _f(3), "c": _f(2, 1)})
    check("Min", {"a": _f(2, 3), "b": _f(3), "c": _f(2, 1)})
    p, q = RNG.random((2, 3)) > 0.5, RNG.random(3) > 0.5
    for op in ("And", "Or", "Xor"):
        check(op, {"p": p, "q": q}, exact=True)
    check("Not", {"p": p}, exact=True)
    x = np.concatenate([_f(20) * 3, np.array([np.nan, np.inf, -np.inf, 0.0, -0.0], np.float32)])
    check("IsNaN", {"x": x}, exact=True)
    check("Pow", {"a": _f(4) * 2, "b": np.array([0.5, 2.0, -1.0, 3.0], np.float32)})  # NaN meets NaN
    for op in ("Abs", "Neg", "Exp", "Floor", "Relu", "Sigmoid", "Tanh", "Sin", "Identity"):
        check(op, {"x": x})
    for op in ("Log", "Sqrt", "Reciprocal"):
        check(op, {"x": np.abs(x)})
    check("Abs", {"x": np.array([-3, 0, 5], np.int32)}, exact=True)


# --- float math: CTS float32 criteria --------------------------------------------------------

@pytest.mark.parametrize("op,axes,keepdims", [
    ("ReduceMean", [-1], 0), ("ReduceMean", [0, -2], 1), ("ReduceMax", [1], 0), ("ReduceMin", [-3, 2], 0),
    ("ReduceProd", [2, 0], 1), ("ReduceSumSquare", None, 0), ("ReduceMax", None, 1),
])
def test_reduce(op, axes, keepdims):
    attrs = {"keepdims": keepdims} if axes is None else {"keepdims": keepdims, "axes": axes}
    check(op, {"x": _f(2, 3, 4)}, **attrs)


@pytest.mark.parametrize("axes,keepdims", [([-1, 0], 0), ([1], 1), (None, 0), ([], 1)])
def test_reduce_sum_axes_input(axes, keepdims):
    inits = {} if axes is None else {"axes": np.array(axes, I64)}
    check("ReduceSum", {"x": _f(2, 3, 4)}, inits, keepdims=keepdims)


def test_activations():
    x = _f(3, 17) * 4
    check("HardSigmoid", {"x": x}, alpha=0.3, beta=0.4)
    check("HardSigmoid", {"x": x})
    check("HardSwish", {"x": x})
    check("Elu", {"x": x}, alpha=0.7)
    check("PRelu", {"x": _f(2, 3, 4)}, {"slope": _f(3, 1)})
    check("PRelu", {"x": _f(2, 3, 4)}, {"slope": _f(4)})
    for axis in (0, 1, -1):
        check("Softmax", {"x": x}, axis=axis)
        check("LogSoftmax", {"x": x}, axis=axis)


@pytest.mark.parametrize("inputs", [["x", "", "hi"], ["x", "lo", ""], ["x", "lo"], ["x"]])
def test_clip(inputs):
    inits = {"lo": np.array(-0.5, np.float32), "hi": np.array(0.25, np.float32)}
    check("Clip", {"x": _f(4, 5)}, {k: v for k, v in inits.items() if k in inputs}, inputs=inputs)
    ints = {"lo": np.array(-2, np.int32), "hi": np.array(3, np.int32)}
    check("Clip", {"x": np.arange(-6, 6, dtype=np.int32)}, {k: v for k, v in ints.items() if k in inputs},
          inputs=inputs, exact=True)


def test_clip_bounds_beyond_float16_leave_a_float16_program_unclipped():
    """The lowerings clip before a float -> int Cast with the integer type's range: in a float16
    program those bounds are infinite, as the bound tensors converted to float16 were."""
    x = _f(3, 4) * 100
    inits = {"lo": np.array(-2.0 ** 31, np.float32), "hi": np.array(2.0 ** 31 - 1, np.float32)}
    model = _model([helper.make_node("Clip", ["x", "lo", "hi"], ["y"])], {"x": x}, inits, ["y"])
    np.testing.assert_array_equal(_program(model, {"x": x}, half=True)[0], x.astype(np.float16).astype(np.float32))


def test_clip_bounds_computed_crossed_and_nan():
    """Computed bounds clip with tensors; constant ones in one clamp: both as ONNX, NaN kept, a low
    bound above the high one giving the high one (onnxruntime's min(max(x, lo), hi))."""
    x = _f(4, 5)
    x[0, :2] = np.nan
    check("Clip", {"x": x, "lo": np.array(-0.5, np.float32)}, {"hi": np.array(0.25, np.float32)})
    check("Clip", {"x": x}, {"lo": np.array(0.5, np.float32), "hi": np.array(-0.25, np.float32)})
    check("Clip", {"x": x}, {"lo": np.array(0.0, np.float32), "hi": np.array(6.0, np.float32)})


def _lrn(x: np.ndarray, size: int, alpha: float, beta: float, bias: float) -> np.ndarray:
    """ONNX's LRN as its spec writes it, in float64: channels c - floor((size-1)/2) through
    c + ceil((size-1)/2). onnxruntime refuses an even size (the spec does not), and onnx's own
    reference evaluator loops over the batch axis instead of the channels."""
    x64, channels = x.astype(np.float64), x.shape[1]
    sums = np.zeros_like(x64)
    for c in range(channels):
        lo, hi = max(0, c - (size - 1) // 2), min(channels - 1, c + -(-(size - 1) // 2))
        sums[:, c] = np.sum(x64[:, lo:hi + 1] ** 2, axis=1)
    return (x64 / (bias + alpha / size * sums) ** beta).astype(np.float32)


@pytest.mark.parametrize("size", [1, 2, 3, 4, 5, 8])
@pytest.mark.parametrize("half", [False, True])
def test_lrn(size, half):
    x, attrs = _f(2, 7, 3, 3), {"size": size, "alpha": 0.02, "beta": 0.6, "bias": 1.5}
    model = _model([helper.make_node("LRN", ["x"], ["y"], **attrs)], {"x": x}, {}, ["y"])
    want = _lrn(x, **attrs)
    if size % 2 and not half:
        check_model(model, {"x": x})
        assert compare(_ort(model, {"x": x})[0], want) is None  # the spec's numpy is onnxruntime's LRN
    problem = compare(_program(model, {"x": x}, half)[0], want, relaxed=half)
    assert problem is None, problem


def test_instance_norm():
    check("InstanceNormalization", {"x": _f(2, 3, 4, 5)}, {"s": _f(3), "b": _f(3)}, epsilon=1e-3)


@pytest.mark.parametrize("trans_a,trans_b,alpha,beta", [(0, 0, 1.0, 1.0), (1, 0, 0.5, 2.0), (0, 1, 1.0, 0.0),
                                                        (1, 1, -1.5, 0.5)])
def test_gemm(trans_a, trans_b, alpha, beta):
    a = _f(5, 3) if trans_a else _f(3, 5)
    b = _f(4, 5) if trans_b else _f(5, 4)
    check("Gemm", {"a": a}, {"b": b, "c": _f(1, 4)}, transA=trans_a, transB=trans_b, alpha=alpha, beta=beta)


def test_gemm_without_c_and_matmul():
    check("Gemm", {"a": _f(3, 5)}, {"b": _f(4, 5)}, transB=1)
    check("MatMul", {"a": _f(2, 3, 4, 5), "b": _f(3, 5, 6)})
    check("MatMul", {"a": _f(4, 5), "b": _f(2, 5, 3)})
    check("MatMul", {"a": _f(2, 4, 5)}, {"b": _f(5, 3)})


@pytest.mark.parametrize("attrs,shape,group", [
    ({"pads": [1, 2]}, (2, 4, 9), 1),                                              # 1-D, uneven
    ({"pads": [0, 1, 2, 1], "strides": [2, 1]}, (1, 4, 7, 6), 2),                  # uneven, groups
    ({"pads": [1, 1, 1, 1], "dilations": [2, 1]}, (1, 6, 8, 5), 3),                # even, dilated, groups
    ({"strides": [1, 3], "dilations": [1, 2], "pads": [2, 0, 0, 1]}, (2, 2, 6, 9), 1),
])
def test_conv(attrs, shape, group):
    rank = len(shape) - 2
    kernel = [3] * rank
    w = _f(6, shape[1] // group, *kernel)
    check("Conv", {"x": _f(*shape)}, {"w": w, "b": _f(6)}, group=group, kernel_shape=kernel, **attrs)
    check("Conv", {"x": _f(*shape)}, {"w": w}, group=group, **attrs)  # no bias, no kernel_shape


@pytest.mark.parametrize("attrs,shape,group", [
    ({"strides": [2], "output_padding": [1], "pads": [1, 0]}, (1, 2, 5), 1),
    ({"strides": [2, 3], "output_padding": [1, 2], "pads": [0, 1, 2, 0]}, (2, 4, 3, 4), 2),
    ({"strides": [2, 2], "dilations": [2, 1], "pads": [1, 1, 1, 1]}, (1, 3, 4, 3), 3),
    ({"strides": [3, 2], "dilations": [1, 2], "output_padding": [2, 1], "pads": [2, 1, 0, 3]}, (1, 4, 3, 3), 1),
])
def test_conv_transpose(attrs, shape, group):
    rank = len(shape) - 2
    w = _f(shape[1], 6 // group, *[3] * rank)
    check("ConvTranspose", {"x": _f(*shape)}, {"w": w, "b": _f(6)}, group=group, **attrs)
    check("ConvTranspose", {"x": _f(*shape)}, {"w": w}, group=group, kernel_shape=[3] * rank, **attrs)


@pytest.mark.parametrize("count_include_pad", [0, 1])
@pytest.mark.parametrize("attrs", [
    {"kernel_shape": [3, 2], "pads": [1, 0, 2, 1], "strides": [2, 1]},
    {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]},
    {"kernel_shape": [2, 3], "strides": [1, 2]},
    {"kernel_shape": [3], "pads": [2, 1], "strides": [2]},
])
def test_average_pool(count_include_pad, attrs):
    shape = (2, 3, 7) if len(attrs["kernel_shape"]) == 1 else (2, 3, 6, 7)
    check("AveragePool", {"x": _f(*shape)}, count_include_pad=count_include_pad, **attrs)


@pytest.mark.parametrize("attrs", [
    {"kernel_shape": [3, 2], "pads": [1, 0, 2, 1], "strides": [2, 1]},
    {"kernel_shape": [2, 2], "pads": [1, 1, 1, 1]},
    {"kernel_shape": [3, 3], "pads": [2, 1, 2, 1]},                   # even, above half the kernel
    {"kernel_shape": [3, 3], "pads": [1, 2, 1, 2], "dilations": [2, 1]},
    {"kernel_shape": [3], "pads": [0, 2], "strides": [2]},
])
def test_max_pool(attrs):
    shape = (2, 3, 7) if len(attrs["kernel_shape"]) == 1 else (2, 3, 6, 7)
    check("MaxPool", {"x": -np.abs(_f(*shape))}, exact=True, **attrs)  # all negative: a pad must not win


def test_global_average_pool():
    check("GlobalAveragePool", {"x": _f(2, 3, 5, 4)})


# --- a float16 program (a relaxed partition) against onnxruntime in float32 -----------------

@pytest.mark.parametrize("op,feeds,inits,attrs", [
    ("Conv", {"x": _f(1, 4, 6, 5)}, {"w": _f(4, 2, 3, 3) * 0.3, "b": _f(4)}, {"group": 2, "pads": [1, 0, 2, 1]}),
    ("ConvTranspose", {"x": _f(1, 2, 3, 3)}, {"w": _f(2, 3, 3, 3) * 0.3},
     {"strides": [2, 2], "output_padding": [1, 1], "pads": [0, 1, 1, 0]}),
    ("AveragePool", {"x": _f(1, 2, 5, 5)}, {}, {"kernel_shape": [3, 3], "pads": [1, 0, 1, 2]}),
    ("LRN", {"x": _f(1, 6, 3, 3)}, {}, {"size": 3, "alpha": 0.02}),
    ("Softmax", {"x": _f(3, 9)}, {}, {"axis": 0}),
    ("Gemm", {"a": _f(4, 3) * 0.5}, {"b": _f(5, 4) * 0.5, "c": _f(5)}, {"transA": 1, "transB": 1, "alpha": 0.5}),
    ("InstanceNormalization", {"x": _f(1, 2, 4, 4)}, {"s": _f(2), "b": _f(2)}, {}),
    ("HardSwish", {"x": _f(4, 8) * 4}, {}, {}),
    ("ReduceMean", {"x": _f(2, 3, 4)}, {}, {"axes": [-1, 1], "keepdims": 0}),
])
def test_float16_program(op, feeds, inits, attrs):
    names = [*feeds, *inits]
    model = _model([helper.make_node(op, names, ["y"], **attrs)], feeds, inits, ["y"])
    (want,), (got,) = _ort(model, feeds), _program(model, feeds, half=True)
    problem = compare(got, want, relaxed=True)
    assert problem is None, problem


# --- the GPU's convolution fusion (hal.backends.cuda.fusion): the rewritten graph means the same ---

def _conv_chain(act: str, add: bool, extra_use: str | None = None, group: int = 1, pads=(1, 1, 1, 1)):
    """x -> Conv [-> Add(., skip)] -> act, with ``extra_use`` ("conv" / "add") read by a second output."""
    from onnx import numpy_helper  # noqa: F401
    c = 4
    feeds = {"x": _f(1, c, 6, 7), "skip": _f(1, c, 6 if pads[2] else 5, 7 if pads[3] else 6)}
    inits = {"w": _f(c, c // group, 3, 3), "b": _f(c), "lo": np.array(0.0, np.float32),
             "hi": np.array([6.0], np.float32)}  # a bound of rank 1, as the lowerings may make it
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["conv"], kernel_shape=[3, 3], pads=list(pads), group=group)]
    last = "conv"
    if add:
        nodes.append(helper.make_node("Add", ["skip", "conv"], ["add"]))
        last = "add"
    if act == "Relu":
        nodes.append(helper.make_node("Relu", [last], ["y"]))
    else:
        nodes.append(helper.make_node("Clip", [last, "lo", "hi" if act == "Relu6" else ""], ["y"]))
    outputs = ["y"]
    if extra_use:
        nodes.append(helper.make_node("Neg", [extra_use], ["other"]))
        outputs.append("other")
    if not add:
        del feeds["skip"]
    return _model(nodes, feeds, inits, outputs), feeds


@pytest.mark.parametrize("act,add,extra_use,group,pads,fused", [
    ("Relu6", True, None, 1, (1, 1, 1, 1), True),
    ("Relu", True, None, 1, (1, 1, 1, 1), True),
    ("Relu0", False, None, 1, (0, 0, 1, 1), True),       # Clip(0, no max), uneven pads
    ("Relu6", False, None, 1, (1, 1, 1, 1), True),
    ("Relu6", True, "conv", 1, (1, 1, 1, 1), False),     # the convolution read elsewhere
    ("Relu6", True, "add", 1, (1, 1, 1, 1), False),      # the sum read elsewhere
    ("Relu6", True, None, 4, (1, 1, 1, 1), False),       # depthwise: torch's kernel adds its bias
])
def test_fused_convolutions_mean_what_the_graph_means(act, add, extra_use, group, pads, fused):
    from hal.backends.cuda import fusion
    model, feeds = _conv_chain(act, add, extra_use, group, pads)
    values = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    nodes = fusion.rewrite(list(model.graph.node), values, {o.name for o in model.graph.output})
    assert any(n.op_type == "ConvAddRelu" for n in nodes) == fused
    if fused:
        assert len(nodes) == 1
    program = Program(model, {}, torch.device("cpu"), torch.float32, fusion.rewrite)
    got = [t.numpy() for t in program([torch.from_numpy(v.copy()) for v in feeds.values()])]
    for g, w in zip(got, _ort(model, feeds), strict=True):
        assert compare(g, w) is None, compare(g, w)
