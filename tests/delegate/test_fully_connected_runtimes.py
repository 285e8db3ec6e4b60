"""8-bit FULLY_CONNECTED against the reference kernels (BUILTIN_REF) of the runtime in use.

LiteRT >= 1.3 requantizes FULLY_CONNECTED's accumulators in double, tflite-runtime 2.14 in NNAPI's
fixed point (delegate/mapping/host_runtime.py). The two disagree in about one output in a thousand
of random models, so besides random models these tests build models whose accumulators are chosen
where the two disagree (and ties, where rounding rules show): the runtime's own answers must be the
form host_runtime says it uses, and nnhal's must equal them. Run under each runtime (LiteRT in .venv,
tflite-runtime 2.14 in .venv-tflite-runtime)."""
from __future__ import annotations

import numpy as np
import pytest

from delegate.mapping import convert_partition
from delegate.mapping.host_runtime import (
    TFLITE_RUNTIME_2_14,
    host_runtime,
    parse_version,
    requantizes_fully_connected_in_double,
)
from delegate.runtime import RUNTIME
from delegate.tfl import TfLiteModelBuilder, read_model
from extensions import litert_compat
from hal import quant
from hal.compiler import compile_model
from hal.executor import execute
from tests.harness import hal_run, tflite_run

KINDS = ("per_channel_int8", "int8", "uint8")
ACC_RANGE = 16000  # accumulators (x0 - zp) + 127 * (x1 - zp) reach every integer in +-ACC_RANGE


def _fc_model(kind: str, x_q: dict, w_scales, y_q: dict, w: np.ndarray, w_zp: int, bias: np.ndarray,
              batch: int, act: int = 0) -> bytes:
    dtype = np.uint8 if kind == "uint8" else np.int8
    n, k = w.shape
    m = TfLiteModelBuilder()
    x = m.add_input("x", [batch, k], dtype, **x_q)
    if kind == "per_channel_int8":
        wt = m.add_constant("w", w.astype(np.int8), scale=w_scales, zero_point=[0] * n, quantized_dimension=0)
        b_q = {"scale": (np.float32(x_q["scale"]) * w_scales).astype(np.float32), "zero_point": [0] * n}
    else:
        wt = m.add_constant("w", w.astype(dtype), scale=float(w_scales[0]), zero_point=w_zp)
        b_q = {"scale": float(np.float32(x_q["scale"]) * w_scales[0]), "zero_point": 0}
    b = m.add_constant("b", bias.astype(np.int32), **b_q)
    y = m.add_tensor("y", [batch, n], dtype, **y_q)
    m.add_operator("FULLY_CONNECTED", [x, wt, b], [y], ("FullyConnectedOptions", {"fused_activation_function": act}),
                   version=5 if dtype == np.int8 else 1)
    m.set_outputs([y])
    return m.build()


def _scales(rng, kind: str, n: int, ties: bool) -> tuple[float, np.ndarray, float]:
    """(input, weights, output) scales, float32 values; powers of two for exact ties."""
    units = n if kind == "per_channel_int8" else 1
    if ties:
        return (2.0 ** -int(rng.integers(3, 8)), np.array([2.0 ** -int(rng.integers(3, 9)) for _ in range(units)],
                np.float32), 2.0 ** -int(rng.integers(1, 4)))
    return (float(np.float32(rng.uniform(0.005, 0.2))), rng.uniform(0.002, 0.03, units).astype(np.float32),
            float(np.float32(rng.uniform(0.05, 0.3))))


def fixed_point(kind: str, acc: np.ndarray, x_s: float, w_s: np.ndarray, y_s: float) -> np.ndarray:
    """tflite-runtime 2.14's requantization: QuantizeMultiplier, then MultiplyByQuantizedMultiplier.
    Per-channel multipliers from double products; per-tensor ones (GetQuantizedConvolutionMultipler)
    from the float32 product."""
    f32 = np.float32
    if kind == "per_channel_int8":
        reals = [float(f32(x_s)) * float(s) / float(f32(y_s)) for s in w_s]
    else:
        reals = [float(f32(x_s) * f32(s)) / float(f32(y_s)) for s in w_s]
    pairs = [quant.quantize_multiplier(r) for r in reals]
    return quant.multiply_by_quantized_multiplier(acc, np.array([m for m, _ in pairs]), np.array([e for _, e in pairs]))


def double(acc: np.ndarray, x_s: float, w_s: np.ndarray, y_s: float) -> np.ndarray:
    """LiteRT's: round(double(acc) * (double(x_s) * double(w_s) / double(y_s))), half away from zero."""
    scale = np.float64(np.float32(x_s)) * np.asarray(w_s, np.float64) / np.float64(np.float32(y_s))
    v = np.asarray(acc, np.float64) * scale
    whole = np.trunc(v)  # v - whole is exact
    return (whole + np.sign(v) * (np.abs(v - whole) >= 0.5)).astype(np.int64)


def disagreeing_model(rng, kind: str, ties: bool):
    """A model whose rows' accumulators are ones where the two requantizations disagree (None if the
    drawn scales have none). Weights [1, 127] per unit, bias 0, input and output zero points in the
    middle: acc = (x0 - zp) + 127 * (x1 - zp), outputs away from saturation."""
    n = int(rng.integers(2, 5)) if kind == "per_channel_int8" else 1
    x_s, w_s, y_s = _scales(rng, kind, n, ties)
    accs = np.arange(-ACC_RANGE, ACC_RANGE)[:, None]
    rows = set()
    for c in range(len(w_s)):
        want = double(accs, x_s, w_s[c:c + 1], y_s)[:, 0]
        other = fixed_point(kind, accs[:, 0], x_s, w_s[c:c + 1], y_s)
        picks = accs[(want != other) & (np.abs(want) <= 100), 0]
        rows.update(int(a) for a in rng.permutation(picks)[:24])
    if not rows:
        return None
    acc = np.array(sorted(rows))
    x1 = np.floor((acc + 64) / 127).astype(np.int64)
    zp = 128 if kind == "uint8" else 0
    x = np.stack([acc - 127 * x1, x1], 1) + zp
    w = np.tile([[1, 127]], (n, 1)) + zp
    model = _fc_model(kind, {"scale": x_s, "zero_point": zp}, w_s, {"scale": y_s, "zero_point": zp}, w, zp,
                      np.zeros(n, np.int32), len(acc))
    return model, x.astype(np.uint8 if kind == "uint8" else np.int8), acc, (x_s, w_s, y_s, zp)


def random_model(rng, kind: str):
    dtype = np.uint8 if kind == "uint8" else np.int8
    batch, k, n = int(rng.integers(1, 6)), int(rng.integers(1, 48)), int(rng.integers(2, 33))
    x_s, w_s, y_s = _scales(rng, kind, n, False)
    info = np.iinfo(dtype)
    x_zp, y_zp = (int(rng.integers(info.min // 2, info.max // 2 + 1)) + (64 if kind == "uint8" else 0) for _ in "xy")
    w_zp = int(rng.integers(100, 156)) if kind == "uint8" else 0
    w = rng.integers(-127, 128, (n, k)) if dtype == np.int8 else rng.integers(0, 256, (n, k))
    model = _fc_model(kind, {"scale": x_s, "zero_point": x_zp}, w_s, {"scale": y_s, "zero_point": y_zp}, w, w_zp,
                      rng.integers(-4000, 4000, n), batch, act=int(rng.choice([0, 1, 3])))
    return model, rng.integers(info.min, info.max, (batch, k), endpoint=True).astype(dtype)


@pytest.mark.parametrize("kind", KINDS)
def test_runtime_uses_the_requantization_host_runtime_names(kind):
    """The finding itself, on the runtime's own outputs: where the two forms disagree, BUILTIN_REF
    gives LiteRT's double form exactly when host_runtime says so, and the fixed-point form otherwise."""
    rng = np.random.default_rng([7, KINDS.index(kind)])
    in_double = requantizes_fully_connected_in_double(host_runtime())
    checked = 0
    for ties in (False, True):
        for _ in range(12):
            case = disagreeing_model(rng, kind, ties)
            if case is None:
                continue
            model, x, acc, (x_s, w_s, y_s, zp) = case
            (got,) = tflite_run(model, [x])
            acc = np.broadcast_to(acc[:, None], got.shape)
            info = np.iinfo(got.dtype)
            forms = {True: np.clip(double(acc, x_s, w_s, y_s) + zp, info.min, info.max),
                     False: np.clip(fixed_point(kind, acc, x_s, w_s, y_s) + zp, info.min, info.max)}
            np.testing.assert_array_equal(got, forms[in_double], err_msg=f"{RUNTIME}: not its form ({ties=})")
            assert np.any(forms[True] != forms[False])
            checked += 1
    assert checked >= 20


@pytest.mark.parametrize("kind", KINDS)
def test_nnhal_matches_the_host_reference(kind):
    """nnhal (this runtime's mapping, hal's kernels) == BUILTIN_REF, bit for bit, on random models
    and on ones built where the two requantizations disagree."""
    rng = np.random.default_rng([11, KINDS.index(kind)])
    for k in range(40):
        case = random_model(rng, kind) if k % 2 else disagreeing_model(rng, kind, ties=k % 4 == 0)
        if case is None:
            continue
        model, x = case[:2]
        np.testing.assert_array_equal(hal_run(model, [x])[0], tflite_run(model, [x])[0], err_msg=f"case {k}")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("output_zero_point", [5, -7])
def test_results_past_int32_match_the_host_reference(kind, output_zero_point):
    """An output scale of 1e-7 puts acc * scale past int32: LiteRT's cast gives INT32_MIN on x86-64
    before the zero point and the clamp, tflite-runtime's fixed point wraps or saturates; nnhal
    gives each runtime's answer."""
    zp = 128 if kind == "uint8" else 0
    w = np.array([[1, 1], [2, 3]]) + zp
    model = _fc_model(kind, {"scale": 1.0, "zero_point": zp}, np.ones(2, np.float32),
                      {"scale": 1e-7, "zero_point": output_zero_point + zp}, w, zp, np.array([0, 7]), 6)
    x = (np.array([[0, 0], [1, 0], [-1, 0], [100, 100], [-100, -100], [0, -1]]) + zp).astype(
        np.uint8 if kind == "uint8" else np.int8)
    np.testing.assert_array_equal(hal_run(model, [x])[0], tflite_run(model, [x])[0])


LITERT_2_3 = ("ai_edge_litert", (2, 3, 0))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("runtime", [TFLITE_RUNTIME_2_14, LITERT_2_3], ids=["tflite_runtime", "litert"])
def test_each_runtimes_mapping_computes_its_form(kind, runtime):
    """Whatever the host: the mapping for a runtime (convert_partition's ``runtime``) gives that
    runtime's form on the disagreeing models: NNAPI's operations for tflite-runtime, the extension
    operation for LiteRT."""
    rng = np.random.default_rng([13, KINDS.index(kind)])
    in_double = requantizes_fully_connected_in_double(runtime)
    checked = 0
    for k in range(16):
        case = disagreeing_model(rng, kind, ties=k % 2 == 1)
        if case is None:
            continue
        model, x, acc, (x_s, w_s, y_s, zp) = case
        part = convert_partition(read_model(model), runtime=runtime)
        ops = [op.type for op in part.model.main.operations]
        if in_double:
            assert [e.name for e in part.model.extension_name_to_prefix] == [litert_compat.NAME]
            assert len(ops) == 1 and ops[0] & 0xFFFF == litert_compat.FULLY_CONNECTED_DOUBLE_REQUANT, ops
        else:
            assert all(op >> 16 == 0 for op in ops), ops
        (got,) = execute(compile_model(part.model), [x])
        acc = np.broadcast_to(acc[:, None], got.shape)
        info = np.iinfo(got.dtype)
        form = double(acc, x_s, w_s, y_s) if in_double else fixed_point(kind, acc, x_s, w_s, y_s)
        np.testing.assert_array_equal(got, np.clip(form + zp, info.min, info.max), err_msg=f"case {k}")
        checked += 1
    assert checked >= 10


def test_version_rule():
    assert parse_version("2.3.0") == (2, 3, 0) and parse_version("1.3.0rc1") == (1, 3, 0)
    assert parse_version("2.4.0.dev20250101") == (2, 4, 0) and parse_version("") == ()
    assert requantizes_fully_connected_in_double(LITERT_2_3)
    assert requantizes_fully_connected_in_double(("ai_edge_litert", (1, 3, 0)))
    assert not requantizes_fully_connected_in_double(("ai_edge_litert", (1, 2, 0)))
    assert not requantizes_fully_connected_in_double(TFLITE_RUNTIME_2_14)
    assert not requantizes_fully_connected_in_double(None)
    package, version = host_runtime()
    assert package == RUNTIME and version == parse_version(__import__(RUNTIME).__version__)
