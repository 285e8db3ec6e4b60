"""int8/uint8 models whose ops TFLite computes in quantized forms NNAPI lacks, through TFLite with the
nnhal delegate (a real `nnhal serve`) vs TFLite's reference kernels (BUILTIN_REF), bit-exact, every
node delegated in one partition:
- per-channel FULLY_CONNECTED (int8 weights, one scale per unit): RESHAPE + 1x1 CONV_2D + RESHAPE in
  a runtime that requantizes it in fixed point (tflite-runtime 2.14), and every 8-bit
  FULLY_CONNECTED com.nnhal.litert:FULLY_CONNECTED_DOUBLE_REQUANT in one that requantizes in
  double (LiteRT >= 1.3; delegate/mapping/host_runtime.py);
- MEAN with another output quantization: com.nnhal.tflite:QUANTIZED_MEAN;
- QUANTIZE uint8 -> int8 and int8 -> uint8 at the edges of an int8 model (the converter's uint8 I/O):
  NNAPI DEQUANTIZE + QUANTIZE for equal scales, com.nnhal.tflite:REQUANTIZE for different ones;
- RELU6 with another output quantization (the converter writes it when it does not fuse the
  activation): com.nnhal.tflite:RELU_REQUANTIZED;
- a squeeze-excitation block (MEAN over H,W -> FC -> RELU -> FC -> LOGISTIC -> MUL) and a classifier
  head (MEAN -> per-channel FC -> SOFTMAX over 10 classes), as the TFLite converter writes them.
uint8 models have per-tensor uint8 weights (TFLite has no uint8 per-channel FULLY_CONNECTED)."""
from __future__ import annotations

import numpy as np
import pytest

from delegate import load_delegate
from delegate.mapping import MappingError, convert_partition
from delegate.mapping.host_runtime import host_runtime, requantizes_fully_connected_in_double
from delegate.tfl import TfLiteModelBuilder, read_model
from extensions import litert_compat, tflite_compat
from hal.types import OperationType
from tests.delegate.helpers import interpreter, random_inputs, run
from tests.ops._tflite_compat_util import is_compat_operation

SEEDS = range(6)


def _q(rng, dtype, lo=0.01, hi=0.2) -> dict:
    info = np.iinfo(dtype)
    scale = float(np.float32(np.exp(rng.uniform(np.log(lo), np.log(hi)))))
    zero_point = int(rng.integers(info.min // 2, info.max // 2 + 1)) + (64 if dtype == np.uint8 else 0)
    return {"scale": scale, "zero_point": zero_point}


def _fc(m, rng, x: int, xq: dict, k: int, n: int, dtype, act: int, out_shape, *, bias=True,
        name="fc") -> tuple[int, dict]:
    """FULLY_CONNECTED x -> [.., n]: int8 per-channel weights, uint8 per-tensor weights."""
    yq = _q(rng, dtype, 0.02, 0.3)
    if dtype == np.int8:
        ws = rng.uniform(0.002, 0.03, n).astype(np.float32)
        w = m.add_constant(f"{name}_w", rng.integers(-127, 128, (n, k)).astype(np.int8), scale=ws,
                           zero_point=[0] * n, quantized_dimension=0)
        bq = {"scale": (np.float32(xq["scale"]) * ws).astype(np.float32), "zero_point": [0] * n}
    else:
        ws = float(np.float32(rng.uniform(0.002, 0.03)))
        w = m.add_constant(f"{name}_w", rng.integers(0, 256, (n, k)).astype(np.uint8), scale=ws,
                           zero_point=int(rng.integers(100, 156)))
        bq = {"scale": float(np.float32(xq["scale"]) * np.float32(ws)), "zero_point": 0}
    inputs = [x, w]
    if bias:
        inputs.append(m.add_constant(f"{name}_b", rng.integers(-4000, 4000, n).astype(np.int32), **bq))
    y = m.add_tensor(f"{name}_y", out_shape, dtype, **yq)
    m.add_operator("FULLY_CONNECTED", inputs, [y], ("FullyConnectedOptions", {"fused_activation_function": act}),
                   version=5 if dtype == np.int8 else 1)
    return y, yq


def _mean(m, rng, x: int, xq: dict, shape, axes, keep: bool, dtype, *, same_q=False) -> tuple[int, dict]:
    yq = dict(xq) if same_q else _q(rng, dtype, 0.005, 0.2)
    out = [1 if i in axes else d for i, d in enumerate(shape)] if keep else [d for i, d in enumerate(shape)
                                                                             if i not in axes]
    y = m.add_tensor("mean", out, dtype, **yq)
    m.add_operator("MEAN", [x, m.add_constant("axes", np.array(axes, np.int32))], [y],
                   ("ReducerOptions", {"keep_dims": keep}))
    return y, yq


def _logistic_q(dtype) -> dict:  # TFLite's fixed LOGISTIC output quantization
    return {"scale": 1 / 256, "zero_point": -128 if dtype == np.int8 else 0}


def se_block(dtype, seed: int, hw: int = 7, c: int = 16) -> bytes:
    rng = np.random.default_rng(seed)
    m = TfLiteModelBuilder()
    xq = _q(rng, dtype)
    x = m.add_input("x", [1, hw, hw, c], dtype, **xq)
    s, sq = _mean(m, rng, x, xq, [1, hw, hw, c], [1, 2], True, dtype)
    h, hq = _fc(m, rng, s, sq, c, c // 4, dtype, 1, [1, c // 4], name="squeeze")  # fused RELU
    g, _ = _fc(m, rng, h, hq, c // 4, c, dtype, 0, [1, c], name="excite")
    gate = m.add_tensor("gate", [1, c], dtype, **_logistic_q(dtype))
    m.add_operator("LOGISTIC", [g], [gate])
    y = m.add_tensor("y", [1, hw, hw, c], dtype, **_q(rng, dtype))
    m.add_operator("MUL", [x, gate], [y], ("MulOptions", {"fused_activation_function": 0}))
    m.set_outputs([y])
    return m.build()


def classifier_head(dtype, seed: int, hw: int = 7, c: int = 24, classes: int = 10) -> bytes:
    rng = np.random.default_rng(seed)
    m = TfLiteModelBuilder()
    xq = _q(rng, dtype)
    x = m.add_input("x", [1, hw, hw, c], dtype, **xq)
    s, sq = _mean(m, rng, x, xq, [1, hw, hw, c], [1, 2], False, dtype)
    logits, _ = _fc(m, rng, s, sq, c, classes, dtype, 0, [1, classes], name="logits")
    y = m.add_tensor("probs", [1, classes], dtype, **_logistic_q(dtype))
    m.add_operator("SOFTMAX", [logits], [y], ("SoftmaxOptions", {"beta": 1.0}))
    m.set_outputs([y])
    return m.build()


def single_fc(seed: int, batch: int, k: int, n: int) -> bytes:
    rng = np.random.default_rng(seed)
    m = TfLiteModelBuilder()
    xq = _q(rng, np.int8)
    x = m.add_input("x", [batch, k], np.int8, **xq)
    y, _ = _fc(m, rng, x, xq, k, n, np.int8, int(rng.choice([0, 1, 2, 3])), [batch, n], bias=bool(seed % 3))
    m.set_outputs([y])
    return m.build()


def single_mean(dtype, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    rank = 1 + seed % 4
    shape = [int(d) for d in rng.integers(1, 7, rank)]
    axes = sorted({int(a) for a in rng.integers(0, rank, 1 + seed % rank)})
    keep = bool(seed % 2) or len(axes) == rank
    m = TfLiteModelBuilder()
    xq = _q(rng, dtype)
    x = m.add_input("x", shape, dtype, **xq)
    y, _ = _mean(m, rng, x, xq, shape, axes, keep, dtype)
    m.set_outputs([y])
    return m.build()


def _requantize(m, rng, x: int, shape, to_dtype, xq: dict, same_scale: bool, name: str) -> tuple[int, dict]:
    """QUANTIZE between uint8 and int8: the converter's form (same scale, zero point +-128) or any."""
    shift = 128 if to_dtype == np.uint8 else -128
    yq = {"scale": xq["scale"], "zero_point": xq["zero_point"] + shift} if same_scale else _q(rng, to_dtype)
    y = m.add_tensor(name, shape, to_dtype, **yq)
    m.add_operator("QUANTIZE", [x], [y])
    return y, yq


def uint8_io(seed: int, same_scale: bool, hw: int = 5, c: int = 12, classes: int = 7) -> bytes:
    """uint8 image -> QUANTIZE -> int8 MEAN -> per-channel FC -> QUANTIZE -> uint8 scores."""
    rng = np.random.default_rng(seed)
    m = TfLiteModelBuilder()
    xq = _q(rng, np.uint8)
    x = m.add_input("image", [1, hw, hw, c], np.uint8, **xq)
    h, hq = _requantize(m, rng, x, [1, hw, hw, c], np.int8, xq, same_scale, "quantize_in")
    s, sq = _mean(m, rng, h, hq, [1, hw, hw, c], [1, 2], False, np.int8)
    logits, lq = _fc(m, rng, s, sq, c, classes, np.int8, 0, [1, classes], name="logits")
    y, _ = _requantize(m, rng, logits, [1, classes], np.uint8, lq, same_scale, "scores")
    m.set_outputs([y])
    return m.build()


def requantizing_relu6(seed: int, k: int = 12, n: int = 8, classes: int = 5) -> bytes:
    """int8 x -> per-channel FC -> RELU6 into another quantization -> per-channel FC."""
    rng = np.random.default_rng(seed)
    m = TfLiteModelBuilder()
    xq = _q(rng, np.int8)
    x = m.add_input("x", [2, k], np.int8, **xq)
    h, hq = _fc(m, rng, x, xq, k, n, np.int8, 0, [2, n], name="hidden")
    rq = _q(rng, np.int8, 0.01, 0.05)  # roughly [0, 6] over the int8 range: a RELU6 output's
    r = m.add_tensor("relu6", [2, n], np.int8, **rq)
    m.add_operator("RELU6", [h], [r])
    y, _ = _fc(m, rng, r, rq, n, classes, np.int8, 0, [2, classes], name="logits")
    m.set_outputs([y])
    return m.build()


def _check(server, model: bytes, runs: int = 3) -> None:
    """Bit-exact with TFLite's reference kernels, every node in one nnhal partition."""
    d = load_delegate(server.address)
    it, ref = interpreter(model, d), interpreter(model)
    rep = d.report
    assert rep.delegated == len(rep.nodes) and rep.partitions == [list(range(len(rep.nodes)))], \
        [(n.index, n.op, n.reason) for n in rep.nodes if n.placement != "nnhal"]
    rng = np.random.default_rng(len(model))
    for _ in range(runs):
        xs = random_inputs(ref, rng)
        for got, want in zip(run(it, xs), run(ref, xs)):
            np.testing.assert_array_equal(got, want)


def test_per_channel_fully_connected(server):
    for seed in SEEDS:
        batch, k, n = 1 + seed % 3, 3 + 7 * seed, 1 + 5 * seed
        _check(server, single_fc(seed, batch, k, n))


@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
def test_requantizing_mean(server, dtype):
    for seed in SEEDS:
        _check(server, single_mean(dtype, seed))


@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
def test_se_block(server, dtype):
    for seed in SEEDS:
        _check(server, se_block(dtype, seed, hw=3 + 2 * seed))


@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
def test_classifier_head(server, dtype):
    for seed in SEEDS:
        _check(server, classifier_head(dtype, seed, hw=1 + 3 * seed))


@pytest.mark.parametrize("same_scale", [True, False])
def test_uint8_io_int8_model(server, same_scale):
    for seed in SEEDS:
        _check(server, uint8_io(seed, same_scale, hw=1 + 2 * seed))


def test_requantizing_relu6(server):
    for seed in SEEDS:
        model = requantizing_relu6(seed)
        ops = [op.type for op in convert_partition(read_model(model)).model.main.operations]
        relu = ops[1 if requantizes_fully_connected_in_double(host_runtime()) else 3]  # after the first FC's operations
        assert is_compat_operation(relu, tflite_compat.RELU_REQUANTIZED), ops
        _check(server, model)


def test_per_channel_fc_mapping():
    """The host runtime's arithmetic: LiteRT's double requantization, else the exact CONV_2D rewrite."""
    model = convert_partition(read_model(single_fc(1, 2, 10, 6))).model
    ops = [op.type for op in model.main.operations]
    if requantizes_fully_connected_in_double(host_runtime()):
        assert [e.name for e in model.extension_name_to_prefix] == [litert_compat.NAME]
        assert len(ops) == 1 and is_compat_operation(ops[0], litert_compat.FULLY_CONNECTED_DOUBLE_REQUANT), ops
    else:
        assert ops == [OperationType.RESHAPE, OperationType.CONV_2D, OperationType.RESHAPE]


def _fc_model(w_q: dict, x_shape=(2, 4), y_shape=(2, 3), keep=False) -> bytes:
    m = TfLiteModelBuilder()
    x = m.add_input("x", x_shape, np.int8, scale=0.1, zero_point=0)
    w = m.add_constant("w", np.ones((3, 4), np.int8), **w_q)
    y = m.add_tensor("y", y_shape, np.int8, scale=0.2, zero_point=0)
    m.add_operator("FULLY_CONNECTED", [x, w], [y], ("FullyConnectedOptions", {"keep_num_dims": keep}), version=5)
    m.set_outputs([y])
    return m.build()


@pytest.mark.parametrize("w_q, kw, why", [
    ({"scale": [0.1, 0.2, 0.3], "zero_point": [0, 1, 0]}, {}, "zero points 0"),
    ({"scale": [0.1, 0.2, 0.3, 0.4], "zero_point": [0] * 4, "quantized_dimension": 1}, {}, "quantized_dimension 0"),
    ({"scale": [0.1, 0.2, 0.3], "zero_point": [0] * 3},
     {"x_shape": (2, 2, 4), "y_shape": (2, 2, 3), "keep": True}, "2-D [batch, units]"),
])
def test_per_channel_variants_not_mapped(w_q, kw, why):
    with pytest.raises(MappingError) as e:
        convert_partition(read_model(_fc_model(w_q, **kw)))
    assert why in str(e.value)
