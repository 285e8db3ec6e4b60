"""TFLite flatbuffer builder/reader: round trip, and malformed bytes give a clean error."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from delegate.mapping import MappingError, convert_partition, partition_io
from delegate.tfl import TfLiteModelBuilder, read_model
from delegate.tfl.reader import ModelFormatError
from delegate.tfl.schema import BuiltinOperator, Padding, TensorType
from delegate.tfl.verify import verify_model
from tests.harness import tflite_run


def _conv_model():
    b = TfLiteModelBuilder()
    x = b.add_input("x", [1, 5, 5, 2], np.int8, scale=0.5, zero_point=-3)
    w = b.add_constant("w", np.arange(3 * 3 * 3 * 2, dtype=np.int8).reshape(3, 3, 3, 2),
                       scale=[0.1, 0.2, 0.3], zero_point=[0, 0, 0], quantized_dimension=0)
    bias = b.add_constant("bias", np.array([1, -2, 3], np.int32), scale=[0.05, 0.1, 0.15])
    y = b.add_tensor("y", [1, 5, 5, 3], np.int8, scale=0.25, zero_point=1)
    b.add_operator("CONV_2D", [x, w, bias], [y], ("Conv2DOptions", {
        "padding": Padding.SAME, "stride_w": 1, "stride_h": 1, "fused_activation_function": 0,
        "dilation_w_factor": 1, "dilation_h_factor": 1}))
    r = b.add_tensor("r", [1, 75], np.int8, scale=0.25, zero_point=1)
    b.add_operator("RESHAPE", [y], [r], ("ReshapeOptions", {"new_shape": [1, 75]}))
    b.set_outputs([r])
    return b.build()


def test_round_trip_tensors_quantization_and_options():
    g = read_model(_conv_model())
    assert g.inputs == [0] and g.outputs == [4]
    x, w, bias, y, r = g.tensors
    assert (x.type, x.shape, x.scales, x.zero_points) == (TensorType.INT8, (1, 5, 5, 2), (0.5,), (-3,))
    assert w.per_channel and w.quantized_dimension == 0 and w.is_constant
    np.testing.assert_allclose(w.scales, [0.1, 0.2, 0.3], rtol=1e-6)
    np.testing.assert_array_equal(w.data.reshape(-1), np.arange(54, dtype=np.int8))
    np.testing.assert_array_equal(bias.data, [1, -2, 3])
    conv, reshape = g.nodes
    assert conv.builtin_code == BuiltinOperator.CONV_2D and conv.inputs == (0, 1, 2)
    assert conv.options["padding"] == Padding.SAME and conv.options["stride_w"] == 1
    assert reshape.options["new_shape"] == [1, 75]


def test_builder_output_runs_in_tflite():
    out = tflite_run(_conv_model(), [np.zeros((1, 5, 5, 2), np.int8)])
    assert out[0].shape == (1, 75) and out[0].dtype == np.int8


def test_custom_op_round_trip():
    b = TfLiteModelBuilder()
    x = b.add_input("x", [4])
    y = b.add_tensor("y", [4])
    b.add_operator("CUSTOM", [x], [y], custom_code="com.example.fibonacci", custom_options=b"\x01\x02")
    b.set_outputs([y])
    node = read_model(b.build()).nodes[0]
    assert node.builtin_code == BuiltinOperator.CUSTOM
    assert node.custom_code == "com.example.fibonacci" and node.custom_options == b"\x01\x02"


def test_unmapped_builtin_gives_mapping_error():
    b = TfLiteModelBuilder()
    x = b.add_input("x", [4])
    y = b.add_tensor("y", [4])
    b.add_operator("CUSTOM", [x], [y], custom_code="nope")
    b.set_outputs([y])
    with pytest.raises(MappingError, match=r"no NNAPI mapping for CUSTOM \(nope\)"):
        convert_partition(read_model(b.build()))


def test_dynamic_dimension_maps_at_the_stored_shape():
    """-1 in the signature: the stored shape is the one TFLite allocates first (resizes and unresolved
    dimensions: tests/delegate/test_dynamic_shapes.py)."""
    b = TfLiteModelBuilder()
    x = b.add_input("x", [1, 4], shape_signature=[-1, 4])
    y = b.add_tensor("y", [1, 4], shape_signature=[-1, 4])
    b.add_operator("ADD", [x, x], [y], ("AddOptions", {"fused_activation_function": 0}))
    b.set_outputs([y])
    main = convert_partition(read_model(b.build())).model.main
    assert [tuple(main.operands[i].dimensions) for i in main.input_indexes + main.output_indexes] == [(1, 4)] * 2


def test_partition_io_orders_by_graph_io_and_finds_escaping_tensors():
    b = TfLiteModelBuilder()
    x = b.add_input("x", [4])
    z = b.add_input("z", [4])
    t1 = b.add_tensor("t1", [4])
    t2 = b.add_tensor("t2", [4])
    t3 = b.add_tensor("t3", [4])
    opts = ("AddOptions", {"fused_activation_function": 0})
    b.add_operator("ADD", [z, x], [t1], opts)
    b.add_operator("ADD", [t1, x], [t2], opts)
    b.add_operator("ADD", [t2, t1], [t3], opts)
    b.set_outputs([t3])
    g = read_model(b.build())
    assert partition_io(g, [0, 1]) == ([x, z], [t1, t2])  # t1 is also used by node 2
    assert partition_io(g, [2]) == ([t2, t1], [t3])


def test_verifier_accepts_built_models_and_rejects_every_truncation():
    """The flatbuffer verifier (TFLite's loader has none): every cut of a model is refused with one
    line, as are offsets pointing outside it; whole models, all builtin-options kinds, pass."""
    from nnhal.examples import blazeface_like, mobilenet_like
    for model in (_conv_model(), mobilenet_like(np.int8, input_size=16, width=4),
                  blazeface_like(np.float32, input_size=32)):
        verify_model(model)
    model = _conv_model()
    for cut in range(len(model)):
        with pytest.raises(ModelFormatError) as e:
            verify_model(model[:cut])
        assert "\n" not in str(e.value)
    root_far = bytearray(model)
    root_far[2] ^= 0xFF
    with pytest.raises(ModelFormatError, match=r"root at byte \d+ .* is outside the file"):
        read_model(bytes(root_far))


def test_not_a_tflite_file():
    with pytest.raises(ModelFormatError, match="TFL3"):
        read_model(b"hello world, not a model")


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_corrupted_models_raise_model_format_error_only(data):
    model = bytearray(_conv_model())
    for _ in range(data.draw(st.integers(1, 8))):
        i = data.draw(st.integers(8, len(model) - 1))
        model[i] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(8, len(model)))
    try:
        g = read_model(bytes(model[:cut]))
    except ModelFormatError:
        return
    # A corruption the reader could not detect still yields a graph the mapper handles cleanly.
    try:
        convert_partition(g)
    except (MappingError, ValueError):
        pass
