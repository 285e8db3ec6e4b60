"""Models with dynamic dimensions (shape_signature -1, the TFLite converter's default batch for Keras
models) are delegated at the shapes TFLite resolved, and keep matching TFLite's CPU kernels after
resize_tensor_input + allocate_tensors, with and without kTfLiteDelegateFlagsAllowDynamicTensors
(TFLite re-delegates, or the kernel converts its partition again)."""
from __future__ import annotations

import numpy as np
import pytest

from delegate import capi, load_delegate
from delegate.mapping import MappingError, convert_partition
from delegate.tfl import TfLiteModelBuilder, read_model
from delegate.tfl.schema import ActivationFunctionType as Act
from delegate.tfl.schema import Padding
from tests.delegate.helpers import assert_outputs_equal, interpreter, random_inputs, run

H = W = 6


def _q(dtype, scale, zp):
    return {} if dtype == np.float32 else {"scale": scale, "zero_point": zp}


def convnet(dtype=np.float32, dynamic=(0,), seed: int = 0) -> bytes:
    """x -> CONV_2D 3x3 (4 channels) -> RELU -> MEAN over H, W -> FULLY_CONNECTED (5) -> SOFTMAX,
    built at batch 1 / HxW with -1 in the signatures at the ``dynamic`` axes of the NHWC tensors
    (0: batch; 1, 2: height, width; only the batch reaches the FC and softmax)."""
    rng = np.random.default_rng(seed)
    q8 = dtype != np.float32

    def nhwc(c):
        return [1, H, W, c], [-1 if a in dynamic else d for a, d in enumerate([1, H, W, c])]

    def flat(n):
        return [1, n], [-1 if 0 in dynamic else 1, n]

    b = TfLiteModelBuilder()
    shape, sig = nhwc(3)
    x = b.add_input("x", shape, dtype, shape_signature=sig, **_q(dtype, 0.05, 3))
    if q8:
        w = b.add_constant("w", rng.integers(-100, 100, (4, 3, 3, 3)).astype(np.int8), scale=0.02, zero_point=0)
        bias = b.add_constant("b", rng.integers(-300, 300, 4).astype(np.int32), scale=0.05 * 0.02)
    else:
        w = b.add_constant("w", rng.standard_normal((4, 3, 3, 3)).astype(np.float32))
        bias = b.add_constant("b", rng.standard_normal(4).astype(np.float32))
    shape, sig = nhwc(4)
    c = b.add_tensor("conv", shape, dtype, shape_signature=sig, **_q(dtype, 0.1, -10))
    b.add_operator("CONV_2D", [x, w, bias], [c], ("Conv2DOptions", {
        "padding": Padding.SAME, "stride_w": 1, "stride_h": 1, "fused_activation_function": Act.NONE}))
    r = b.add_tensor("relu", shape, dtype, shape_signature=sig, **_q(dtype, 0.1, -10))  # NNAPI: as its input
    b.add_operator("RELU", [c], [r])
    shape, sig = flat(4)
    m = b.add_tensor("mean", shape, dtype, shape_signature=sig, **_q(dtype, 0.1, -10))  # NNAPI: as its input
    b.add_operator("MEAN", [r, b.add_constant("axes", np.array([1, 2], np.int32))], [m],
                   ("ReducerOptions", {"keep_dims": False}))
    if q8:
        fw = b.add_constant("fw", rng.integers(-100, 100, (5, 4)).astype(np.int8), scale=0.03, zero_point=0)
        fb = b.add_constant("fb", rng.integers(-200, 200, 5).astype(np.int32), scale=0.1 * 0.03)
    else:
        fw = b.add_constant("fw", rng.standard_normal((5, 4)).astype(np.float32))
        fb = b.add_constant("fb", rng.standard_normal(5).astype(np.float32))
    shape, sig = flat(5)
    logits = b.add_tensor("logits", shape, dtype, shape_signature=sig, **_q(dtype, 0.1, 0))
    b.add_operator("FULLY_CONNECTED", [m, fw, fb], [logits], ("FullyConnectedOptions", {
        "fused_activation_function": Act.NONE}))
    out = b.add_tensor("probs", shape, dtype, shape_signature=sig, **_q(dtype, 1 / 256, -128))
    b.add_operator("SOFTMAX", [logits], [out], ("SoftmaxOptions", {"beta": 1.0}))
    b.set_outputs([out])
    return b.build()


def _resize(it, shape) -> None:
    it.resize_tensor_input(it.get_input_details()[0]["index"], list(shape))
    it.allocate_tensors()


def _check_all_delegated(d) -> None:
    rep = d.report
    assert rep.delegated == len(rep.nodes) == 5, [(n.op, n.reason) for n in rep.nodes]
    assert rep.partitions == [[0, 1, 2, 3, 4]]


@pytest.fixture(params=["AllowDynamicTensors", "static-only delegate"])
def delegate_flags(request, monkeypatch):
    """TFLite's two lives for a delegate: with AllowDynamicTensors (nnhal's: TFLite keeps the kernels
    on resize and propagates the new shapes to them) and without (a static-only SimpleDelegate: TFLite
    undoes and redoes the delegation on resize), which the kernel must survive too."""
    if request.param == "static-only delegate":
        monkeypatch.setattr("delegate.nnhal_delegate.NnhalDelegate.flags", 0)
    return request.param


@pytest.mark.parametrize("dtype", [np.float32, np.int8])
@pytest.mark.parametrize("dynamic", [(0,), (0, 1, 2)], ids=["batch", "batch+spatial"])
def test_dynamic_model_is_delegated_and_follows_resizes(server, delegate_flags, dtype, dynamic):
    model = convnet(dtype, dynamic)
    d = load_delegate(server.address)
    want = capi.kTfLiteDelegateFlagsAllowDynamicTensors if delegate_flags == "AllowDynamicTensors" else 0
    assert d.impl.flags == want
    it, ref = interpreter(model, d), interpreter(model)  # reference kernels: int8 bit-exact
    rng = np.random.default_rng(1)
    sizes = [(1, H, W, 3), (4, H, W, 3), (2, H, W, 3)]
    if dynamic != (0,):
        sizes += [(3, 9, 5, 3)]
    for k, shape in enumerate(sizes):
        if k:
            _resize(it, shape)
            _resize(ref, shape)
        for _ in range(2):
            xs = random_inputs(ref, rng)
            assert xs[0].shape == shape
            got, want_out = run(it, xs), run(ref, xs)
            assert got[0].shape == (shape[0], 5)
            assert_outputs_equal(got, want_out)
        _check_all_delegated(d)
        kernels = [k for k in d.impl.kernels if not k.freed]
        assert len(kernels) == 1 and kernels[0].remote is not None and kernels[0].fallbacks == 0
        (operand,) = [kernels[0].part.model.main.operands[i] for i in kernels[0].part.model.main.input_indexes]
        assert tuple(operand.dimensions) == shape  # the service ran the partition at this shape


def test_resize_prepares_a_new_model_and_releases_the_old(server):
    """Each shape is its own NNAPI model (its own compilation-cache token); the old one is released."""
    model = convnet(np.float32)
    d = load_delegate(server.address)
    it = interpreter(model, d)
    tokens, remotes = [], []
    for shape in [(1, H, W, 3), (4, H, W, 3), (1, H, W, 3)]:
        if tokens:
            _resize(it, shape)
        it.set_tensor(it.get_input_details()[0]["index"], np.zeros(shape, np.float32))
        it.invoke()
        (k,) = [k for k in d.impl.kernels if not k.freed]
        tokens.append(k.token)
        remotes.append(k.remote)
    assert tokens[0] != tokens[1] and tokens[2] == tokens[0]
    assert len({r.id for r in remotes}) == 3
    assert [_known(r) for r in remotes] == [False, False, True]  # the service holds the current one only
    assert d.impl.kernels[-1].from_cache  # batch 1 again: the service's cache had it


def _known(remote) -> bool:
    """The service still holds this prepared model."""
    from service.client import ServiceError
    try:
        remote.perf_info()
    except ServiceError:
        return False
    return True


def test_shapes_of_the_file_map_offline():
    """Read from a file (no interpreter), a -1 dimension maps at the stored shape, the one TFLite
    allocates first (`nnhal report` loads the model in TFLite and shows what it resolved)."""
    part = convert_partition(read_model(convnet(np.float32, (0, 1, 2))))
    inputs = [part.model.main.operands[i].dimensions for i in part.model.main.input_indexes]
    assert [tuple(d) for d in inputs] == [(1, H, W, 3)]


def test_unresolved_dimension_is_refused():
    b = TfLiteModelBuilder()
    x = b.add_input("x", [0, 4], shape_signature=[-1, 4])
    y = b.add_tensor("y", [0, 4], shape_signature=[-1, 4])
    b.add_operator("ADD", [x, x], [y], ("AddOptions", {"fused_activation_function": 0}))
    b.set_outputs([y])
    with pytest.raises(MappingError, match=r"unresolved dynamic shape \[0, 4\]"):
        convert_partition(read_model(b.build()))


def test_data_dependent_partition_input_follows_each_invoke(server):
    """RESHAPE to a shape given at run time stays on CPU (its shape input is no constant) and TFLite
    sizes its output only when it runs (kTfLiteDynamic); the delegated ADD after it is prepared again
    at each new shape (AllowDynamicTensors: without it TFLite refuses delegates on such graphs)."""
    b = TfLiteModelBuilder()
    x = b.add_input("x", [1, 12], shape_signature=[-1, 12])
    s = b.add_input("s", [2], np.int32)
    y = b.add_tensor("y", [3, 4], shape_signature=[-1, -1])
    b.add_operator("RESHAPE", [x, s], [y], ("ReshapeOptions", {"new_shape": []}))
    z = b.add_tensor("z", [3, 4], shape_signature=[-1, -1])
    b.add_operator("ADD", [y, y], [z], ("AddOptions", {"fused_activation_function": Act.RELU}))
    b.set_outputs([z])
    model = b.build()
    d = load_delegate(server.address, partitioning="largest")  # the one-ADD partition, whatever it costs
    assert d.impl.flags == capi.kTfLiteDelegateFlagsAllowDynamicTensors
    it, ref = interpreter(model, d), interpreter(model)
    assert [n.placement for n in d.report.nodes] == ["CPU", "nnhal"]
    x = np.random.default_rng(3).standard_normal((1, 12)).astype(np.float32)
    for shape in [(3, 4), (12, 1), (2, 6), (3, 4)]:
        xs = [x, np.array(shape, np.int32)]
        got = run(it, xs)
        assert got[0].shape == shape
        assert_outputs_equal(got, run(ref, xs))
        assert d.impl.kernels[-1].dims[z] == shape and d.impl.kernels[-1].fallbacks == 0


def test_data_dependent_shape_inside_a_partition_is_refused():
    import dataclasses
    graph = read_model(convnet(np.float32))
    relu = next(t for t in graph.tensors if t.name == "relu")
    graph.tensors[relu.index] = dataclasses.replace(relu, runtime_shape=True)
    with pytest.raises(MappingError, match=r"tensor 'relu'\)? has a data-dependent"):
        convert_partition(graph)


# ---- Keras' Flatten of a dynamic batch -------------------------------------------------------------
FEATURES = H * W * 4


def flatten_net(dtype=np.float32, seed: int = 0) -> bytes:
    """x -> CONV_2D 3x3 (4 channels) -> Flatten -> FULLY_CONNECTED (5), batch -1: the Flatten as the
    TFLite converter writes it for a dynamic batch, SHAPE(conv) -> STRIDED_SLICE (shrink: the batch, a
    rank-0 int32) -> PACK(batch, FEATURES) -> RESHAPE(conv, that). TFLite sizes that RESHAPE's output
    only when it runs (kTfLiteDynamic), and leaves the shapes after it stale on a resize."""
    rng = np.random.default_rng(seed)
    q8 = dtype != np.float32
    b = TfLiteModelBuilder()
    x = b.add_input("x", [1, H, W, 3], dtype, shape_signature=[-1, H, W, 3], **_q(dtype, 0.05, 3))
    if q8:
        w = b.add_constant("w", rng.integers(-100, 100, (4, 3, 3, 3)).astype(np.int8), scale=0.02, zero_point=0)
        bias = b.add_constant("b", rng.integers(-300, 300, 4).astype(np.int32), scale=0.05 * 0.02)
        fw = b.add_constant("fw", rng.integers(-100, 100, (5, FEATURES)).astype(np.int8), scale=0.01, zero_point=0)
        fb = b.add_constant("fb", rng.integers(-200, 200, 5).astype(np.int32), scale=0.1 * 0.01)
    else:
        w = b.add_constant("w", rng.standard_normal((4, 3, 3, 3)).astype(np.float32))
        bias = b.add_constant("b", rng.standard_normal(4).astype(np.float32))
        fw = b.add_constant("fw", rng.standard_normal((5, FEATURES)).astype(np.float32))
        fb = b.add_constant("fb", rng.standard_normal(5).astype(np.float32))
    c = b.add_tensor("conv", [1, H, W, 4], dtype, shape_signature=[-1, H, W, 4], **_q(dtype, 0.1, -10))
    b.add_operator("CONV_2D", [x, w, bias], [c], ("Conv2DOptions", {
        "padding": Padding.SAME, "stride_w": 1, "stride_h": 1, "fused_activation_function": Act.RELU}))
    shape = b.add_tensor("shape", [4], np.int32)
    b.add_operator("SHAPE", [c], [shape], ("ShapeOptions", {"out_type": 2}))  # TensorType.INT32
    batch = b.add_tensor("batch", [], np.int32)
    one = b.add_constant("one", np.array([1], np.int32))
    b.add_operator("STRIDED_SLICE", [shape, b.add_constant("zero", np.array([0], np.int32)), one, one], [batch],
                   ("StridedSliceOptions", {"begin_mask": 0, "end_mask": 0, "shrink_axis_mask": 1}))
    new_shape = b.add_tensor("new_shape", [2], np.int32)
    b.add_operator("PACK", [batch, b.add_constant("features", np.array(FEATURES, np.int32))], [new_shape],
                   ("PackOptions", {"values_count": 2, "axis": 0}))
    flat = b.add_tensor("flat", [1, FEATURES], dtype, shape_signature=[-1, FEATURES], **_q(dtype, 0.1, -10))
    b.add_operator("RESHAPE", [c, new_shape], [flat])
    out = b.add_tensor("out", [1, 5], dtype, shape_signature=[-1, 5], **_q(dtype, 0.2, 0))
    b.add_operator("FULLY_CONNECTED", [flat, fw, fb], [out], ("FullyConnectedOptions", {
        "fused_activation_function": Act.NONE}))
    b.set_outputs([out])
    return b.build()


def test_flatten_arithmetic_folds_for_the_shapes_it_is_given():
    """SHAPE -> STRIDED_SLICE -> PACK become constants of the current shapes, and fold again (not
    keep the old batch) for a graph with other shapes; the RESHAPE maps with that constant shape."""
    import dataclasses

    from delegate.mapping.folding import fold_constants
    graph = read_model(flatten_net())
    folded, nodes = fold_constants(graph)
    names = {t.name: t for t in folded.tensors}
    assert nodes == {1, 2, 3}
    np.testing.assert_array_equal(names["shape"].data, [1, H, W, 4])
    assert names["batch"].data.shape == () and names["batch"].data == 1
    np.testing.assert_array_equal(names["new_shape"].data, [1, FEATURES])
    assert fold_constants(folded)[0].tensors[names["new_shape"].index].data.tolist() == [1, FEATURES]
    tensors = list(folded.tensors)
    conv = names["conv"].index
    tensors[conv] = dataclasses.replace(tensors[conv], shape=(3, H, W, 4))
    refolded, _ = fold_constants(dataclasses.replace(folded, tensors=tensors))
    assert refolded.tensors[names["new_shape"].index].data.tolist() == [3, FEATURES]
    part = convert_partition(folded)
    assert [hi - lo for _, (lo, hi) in sorted(part.node_operations.items())] == [1, 0, 0, 0, 1, 1]  # folded: none
    reshape = part.model.main.operations[part.node_operations[4][0]]
    assert tuple(part.model.main.operands[reshape.outputs[0]].dimensions) == (1, FEATURES)


def test_stale_shapes_after_a_computed_reshape_are_inferred():
    """Given TFLite's view after a resize to batch 3 (the input and the CONV_2D output resized, the
    RESHAPE's output kTfLiteDynamic at [1, F], the FC output stale), the partition is converted at
    batch 3 throughout; without inference hal refuses the stale FC output."""
    import dataclasses
    graph = read_model(flatten_net())
    tensors = list(graph.tensors)
    by_name = {t.name: t.index for t in tensors}
    for name in ("x", "conv"):
        t = tensors[by_name[name]]
        tensors[t.index] = dataclasses.replace(t, shape=(3, *t.shape[1:]))
    tensors[by_name["flat"]] = dataclasses.replace(tensors[by_name["flat"]], runtime_shape=True)
    graph = dataclasses.replace(graph, tensors=tensors)
    from delegate.mapping.folding import fold_constants
    with pytest.raises(MappingError, match="data-dependent"):
        convert_partition(fold_constants(graph)[0])
    from delegate.mapping.shape_inference import convert_with_inferred_shapes
    part = convert_with_inferred_shapes(convert_partition, graph, list(range(len(graph.nodes))), None, None,
                                        validate=True)  # folds too
    main = part.model.main
    assert [tuple(main.operands[i].dimensions) for i in main.output_indexes] == [(3, 5)]
    assert tuple(main.operands[part.tensor_operands[by_name["flat"]]].dimensions) == (3, FEATURES)


@pytest.mark.parametrize("dtype", [np.float32, np.int8])
def test_dynamic_batch_flatten_is_delegated_whole_and_follows_resizes(server, dtype):
    """AllowDynamicTensors (TFLite keeps the kernel; the only way TFLite takes such a graph): the
    whole model is one partition at every batch, and its outputs equal TFLite's (float: CTS
    tolerance; int8: bit-exact with the reference kernels)."""
    model = flatten_net(dtype)
    d = load_delegate(server.address)
    assert d.impl.flags == capi.kTfLiteDelegateFlagsAllowDynamicTensors
    it, ref = interpreter(model, d), interpreter(model)
    rng = np.random.default_rng(2)
    for k, batch in enumerate([1, 4, 2]):
        shape = (batch, H, W, 3)
        if k:
            _resize(it, shape)
            _resize(ref, shape)
        for _ in range(2):
            xs = random_inputs(ref, rng)
            got, want = run(it, xs), run(ref, xs)
            assert got[0].shape == (batch, 5)
            assert_outputs_equal(got, want)
        rep = d.report
        assert rep.delegated == len(rep.nodes) == 6, [(n.op, n.reason) for n in rep.nodes]
        assert rep.partitions == [[0, 1, 2, 3, 4, 5]]
        (kernel,) = [k for k in d.impl.kernels if not k.freed]
        assert kernel.remote is not None and kernel.fallbacks == 0
        main = kernel.part.model.main
        assert [tuple(main.operands[i].dimensions) for i in main.input_indexes] == [shape]
        assert [tuple(main.operands[i].dimensions) for i in main.output_indexes] == [(batch, 5)]


def test_static_only_delegate_is_refused_such_a_graph_by_tflite(server, monkeypatch):
    """Why nnhal's delegate always allows dynamic tensors: without the flag TFLite prepares every node
    before the delegate sees the graph and refuses the delegate if one has a kTfLiteDynamic output
    (subgraph.cc, ModifyGraphWithDelegate: "a delegate that only supports static-sized tensors"); the
    Flatten's RESHAPE has one at any batch, so the Interpreter constructor itself would fail."""
    monkeypatch.setattr("delegate.nnhal_delegate.NnhalDelegate.flags", 0)
    d = load_delegate(server.address)
    with pytest.raises(RuntimeError):
        interpreter(flatten_net(), d)
    assert d.report.nodes == [] and d.last_error is None


def test_without_any_extension_the_delegate_takes_such_a_graph(server, monkeypatch):
    """No installed extension claims a CUSTOM op (a plain `pip install nnhal`): the flag is still set,
    so the Flatten model loads, is delegated whole and follows a resize."""
    monkeypatch.setattr("extensions.registry.registered", lambda: [])
    d = load_delegate(server.address)
    assert d.impl.flags == capi.kTfLiteDelegateFlagsAllowDynamicTensors
    model = flatten_net()
    it, ref = interpreter(model, d), interpreter(model)
    rng = np.random.default_rng(3)
    for batch in (1, 3):
        for i in (it, ref):
            shape = [batch, *i.get_input_details()[0]["shape"][1:]]
            i.resize_tensor_input(i.get_input_details()[0]["index"], shape)
            i.allocate_tensors()
        xs = random_inputs(ref, rng)
        assert_outputs_equal(run(it, xs), run(ref, xs))
    assert d.report.delegated == len(d.report.nodes) and len(d.report.partitions) == 1


def test_partition_of_folded_nodes_only_follows_resizes(server, delegate_flags):
    """A SHAPE between CPU nodes is a partition of its own that folds whole: no NNAPI operation, so
    nothing is prepared on the service (it would refuse an empty model); the kernel writes the
    constant, folded again for each batch."""
    b = TfLiteModelBuilder()
    x = b.add_input("x", [1, 3], shape_signature=[-1, 3])
    z = b.add_tensor("z", [1, 3], shape_signature=[-1, 3])
    b.add_operator("ZEROS_LIKE", [x], [z])  # no NNAPI mapping: stays on the CPU
    s = b.add_tensor("s", [2], np.int32)
    b.add_operator("SHAPE", [z], [s], ("ShapeOptions", {"out_type": 2}))
    b.set_outputs([s, z])
    model = b.build()
    d = load_delegate(server.address, partitioning="largest")  # the SHAPE partition, whatever it costs
    it, ref = interpreter(model, d), interpreter(model)
    for batch in (1, 4, 2):
        if batch != 1:
            _resize(it, (batch, 3))
            _resize(ref, (batch, 3))
        xs = [np.ones((batch, 3), np.float32)]
        got = run(it, xs)
        np.testing.assert_array_equal(got[0], [batch, 3])
        assert_outputs_equal(got, run(ref, xs))
        assert d.report.partitions == [[1]]
        (kernel,) = [k for k in d.impl.kernels if not k.freed]
        assert kernel.folded_only and kernel.remote is None
