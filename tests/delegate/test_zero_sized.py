"""Zero-sized tensors (issue 34 item 5): TFLite runs an ADD of two [0, 3] tensors (an empty result);
NNAPI reads a 0 dimension as "unknown", so no request can carry such a tensor. The delegate claimed
the node and every invoke then failed (the service refused the request, and the in-process fallback
too). Now the node stays on TFLite with the reason in the report, and the rest is delegated."""
from __future__ import annotations

import numpy as np

from delegate import load_delegate
from delegate.tfl import TfLiteModelBuilder
from tests.delegate.helpers import assert_outputs_equal, interpreter, run


def _model() -> bytes:
    """s = x + y on [0, 3] tensors, t = u + v on [2, 3] ones."""
    b = TfLiteModelBuilder()
    x, y = b.add_input("x", [0, 3]), b.add_input("y", [0, 3])
    u, v = b.add_input("u", [2, 3]), b.add_input("v", [2, 3])
    s, t = b.add_tensor("s", [0, 3]), b.add_tensor("t", [2, 3])
    b.add_operator("ADD", [x, y], [s], ("AddOptions", {"fused_activation_function": 0}))
    b.add_operator("ADD", [u, v], [t], ("AddOptions", {"fused_activation_function": 0}))
    b.set_outputs([s, t])
    return b.build()


def test_zero_sized_add_stays_on_tflite_and_matches_it(server):
    model = _model()
    rng = np.random.default_rng(0)
    inputs = [np.zeros((0, 3), np.float32)] * 2 + [rng.standard_normal((2, 3)).astype(np.float32) for _ in range(2)]
    d = load_delegate(server.address, partitioning="largest")
    it, cpu = interpreter(model, d), interpreter(model)
    assert "zero-sized ([0, 3])" in (d.report.nodes[0].reason or "")
    assert d.report.nodes[1].reason is None and d.report.delegated == 1
    got = run(it, inputs)  # failed on every invoke when the empty ADD was claimed
    assert got[0].shape == (0, 3)
    assert_outputs_equal(got, run(cpu, inputs))
    assert [k.fallbacks for k in d.impl.kernels] == [0]
