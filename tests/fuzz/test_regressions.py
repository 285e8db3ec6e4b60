"""Regressions for what `make fuzz` found (each case reduced to a minimal model)."""
from __future__ import annotations

from delegate.tfl import TfLiteModelBuilder
from tests.delegate.helpers import assert_delegation_refused


def model_with_a_negative_dimension() -> bytes:
    """Part (c) case c:132 (seed 7), reduced: an intermediate tensor's shape holds a negative value
    (and a 0, so that TFLite's byte count does not overflow and its loader accepts the file)."""
    b = TfLiteModelBuilder()
    x = b.add_input("x", [1, 4])
    y = b.add_tensor("y", [1, 0, -4])
    z = b.add_tensor("z", [1, 4])
    add = ("AddOptions", {"fused_activation_function": 0})
    b.add_operator("ADD", [x, x], [y], add)
    b.add_operator("ADD", [y, x], [z], add)
    b.set_outputs([z])
    return b.build()


def test_a_negative_dimension_is_a_corrupted_model_not_a_traceback(server, tmp_path):
    """It reached the service's proto conversion (uint32 dimensions: ValueError, a traceback in the
    delegate's Prepare); the delegate must refuse it in one line as it refuses other corruption."""
    path = tmp_path / "negative_dimension.tflite"
    path.write_bytes(model_with_a_negative_dimension())
    assert_delegation_refused(path, server.address, "NnhalDelegate: corrupted model: tensor 1 (y)")
