"""Multi-op TFLite models for delegate tests, built with the project's builder."""
from __future__ import annotations

import numpy as np

from delegate.tfl import TfLiteModelBuilder
from delegate.tfl.schema import ActivationFunctionType as Act
from delegate.tfl.schema import Padding


def _q(dtype, scale, zp):
    return {} if dtype == np.float32 else {"scale": scale, "zero_point": zp}


def head_model(dtype=np.float32, unsupported_middle: bool = False, seed: int = 0) -> bytes:
    """x,y -> ADD(relu) -> AVG_POOL 2x2 -> [COS] -> RESHAPE -> FC(10) -> SOFTMAX."""
    rng = np.random.default_rng(seed)
    q8 = dtype != np.float32
    zp0 = 0 if dtype == np.uint8 else -128
    b = TfLiteModelBuilder()
    x = b.add_input("x", [1, 4, 4, 8], dtype, **_q(dtype, 0.05, zp0 + 10))
    y = b.add_input("y", [1, 4, 4, 8], dtype, **_q(dtype, 0.04, zp0 + 20))
    s = b.add_tensor("sum", [1, 4, 4, 8], dtype, **_q(dtype, 0.08, zp0 + 5))
    b.add_operator("ADD", [x, y], [s], ("AddOptions", {"fused_activation_function": Act.RELU}))
    p = b.add_tensor("pool", [1, 2, 2, 8], dtype, **_q(dtype, 0.08, zp0 + 5))
    b.add_operator("AVERAGE_POOL_2D", [s], [p], ("Pool2DOptions", {
        "padding": Padding.VALID, "stride_w": 2, "stride_h": 2, "filter_width": 2, "filter_height": 2,
        "fused_activation_function": Act.NONE}))
    if unsupported_middle:
        assert not q8
        f = b.add_tensor("cos", [1, 2, 2, 8], dtype)
        b.add_operator("COS", [p], [f])
        p = f
    r = b.add_tensor("flat", [1, 32], dtype, **_q(dtype, 0.08, zp0 + 5))
    shape = b.add_constant("shape", np.array([1, 32], np.int32))
    b.add_operator("RESHAPE", [p, shape], [r], ("ReshapeOptions", {"new_shape": [1, 32]}))
    if q8:
        values = (rng.integers(-100, 100, (10, 32)) if dtype == np.int8 else rng.integers(0, 255, (10, 32)))
        w = b.add_constant("w", values.astype(dtype), scale=0.02, zero_point=0 if dtype == np.int8 else 128)
        bias = b.add_constant("bias", rng.integers(-500, 500, 10).astype(np.int32), scale=0.08 * 0.02)
    else:
        w = b.add_constant("w", rng.standard_normal((10, 32)).astype(np.float32))
        bias = b.add_constant("bias", rng.standard_normal(10).astype(np.float32))
    logits = b.add_tensor("logits", [1, 10], dtype, **_q(dtype, 0.1, zp0 + 128 if dtype == np.uint8 else 0))
    b.add_operator("FULLY_CONNECTED", [r, w, bias], [logits], ("FullyConnectedOptions", {
        "fused_activation_function": Act.NONE}))
    out = b.add_tensor("probs", [1, 10], dtype, **_q(dtype, 1 / 256, zp0))
    b.add_operator("SOFTMAX", [logits], [out], ("SoftmaxOptions", {"beta": 1.0}))
    b.set_outputs([out])
    return b.build()


def add_runs(n_runs: int, run_length: int = 2) -> bytes:
    """Runs of ADDs separated by COS (unsupported): n_runs separate partitions."""
    b = TfLiteModelBuilder()
    x = b.add_input("x", [1, 6])
    cur = x
    for r in range(n_runs):
        for k in range(run_length + r):  # later runs are longer
            nxt = b.add_tensor(f"a{r}_{k}", [1, 6])
            b.add_operator("ADD", [cur, x], [nxt], ("AddOptions", {"fused_activation_function": 0}))
            cur = nxt
        if r < n_runs - 1:
            f = b.add_tensor(f"f{r}", [1, 6])
            b.add_operator("COS", [cur], [f])
            cur = f
    b.set_outputs([cur])
    return b.build()


def model_writing_a_constant() -> bytes:
    """Sound flatbuffer, unsound graph: operator 1 writes the constant operator 0 reads (TFLite's
    own CPU path crashes on it)."""
    b = TfLiteModelBuilder()
    x = b.add_input("x", [1, 4])
    c = b.add_constant("c", np.ones((1, 4), np.float32))
    y, z = b.add_tensor("y", [1, 4]), b.add_tensor("z", [1, 4])
    add = ("AddOptions", {"fused_activation_function": 0})
    b.add_operator("ADD", [x, c], [y], add)
    b.add_operator("ADD", [y, y], [c], add)
    b.add_operator("ADD", [y, x], [z], add)
    b.set_outputs([z])
    return b.build()
