"""TFLite CUSTOM ops run as extension operations: in hal, and through the delegate and a real service."""
from __future__ import annotations

import itertools
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from delegate import load_delegate
from delegate.mapping import convert_partition
from delegate.runtime import RUNTIME, Interpreter
from delegate.tfl import TfLiteModelBuilder, read_model
from extensions.options import pack_pool_params
from hal import compile_model, execute
from hal.errors import HalError
from service.client import Client, ServiceError
from tests.extensions.conftest import EXAMPLE_DIRS
from tests.extensions.test_registry import fib_model

SAME, VALID = 1, 2
LOWEST = np.finfo(np.float32).min
CLAMP = {0: (-np.inf, np.inf), 1: (0.0, np.inf), 2: (-1.0, 1.0), 3: (0.0, 6.0)}


def pool_reference(x, fh, fw, sh, sw, padding, activation=0):
    """MediaPipe's MaxPoolArgmax loops, transcribed independently: window-local index + 0.1 (float32)."""
    n, h, w, c = x.shape
    oh, ow = ((h + sh - 1) // sh, (w + sw - 1) // sw) if padding == SAME else ((h - fh + sh) // sh, (w - fw + sw) // sw)
    pt = max(0, ((oh - 1) * sh + fh - h) // 2)
    pl = max(0, ((ow - 1) * sw + fw - w) // 2)
    vals = np.zeros((n, oh, ow, c), np.float32)
    idx = np.zeros((n, oh, ow, c), np.float32)
    lo, hi = CLAMP[activation]
    for b, oy, ox, ch in itertools.product(range(n), range(oh), range(ow), range(c)):
        y0, x0 = oy * sh - pt, ox * sw - pl
        best, my, mx = LOWEST, 0, 0
        for fy in range(max(0, -y0), min(fh, h - y0)):
            for fx in range(max(0, -x0), min(fw, w - x0)):
                if x[b, y0 + fy, x0 + fx, ch] > best:
                    best, my, mx = x[b, y0 + fy, x0 + fx, ch], fy, fx
        vals[b, oy, ox, ch] = min(max(best, lo), hi)
        idx[b, oy, ox, ch] = np.float32(my * fw + mx) + np.float32(0.1)
    return vals, idx


def unpool_reference(vals, ind, fh, fw, sh, sw):
    """MediaPipe's MaxUnpooling loops: later writes win, out-of-range indices skipped."""
    n, h, w, c = vals.shape
    oh, ow = h * fh, w * fw
    pt, pl = max(0, ((h - 1) * sh + fh - oh) // 2), max(0, ((w - 1) * sw + fw - ow) // 2)
    out = np.zeros((n, oh, ow, c), np.float32)
    for b, y, x, ch in itertools.product(range(n), range(h), range(w), range(c)):
        k = int(ind[b, y, x, ch])  # truncation toward zero, as C
        mx, my = int(np.fmod(k, fw)), int(k / fw)
        ty, tx = y * sh - pt + my, x * sw - pl + mx
        if 0 <= ty < oh and 0 <= tx < ow:
            out[b, ty, tx, ch] = vals[b, y, x, ch]
    return out


def pool_out_hw(h, w, fh, fw, sh, sw, padding):
    return ((h + sh - 1) // sh, (w + sw - 1) // sw) if padding == SAME else ((h - fh + sh) // sh, (w - fw + sw) // sw)


def segnet_model(shape, f=(2, 2), s=(2, 2), padding=SAME, activation=0, options=None, unpool=True):
    """x -> MaxPoolingWithArgmax2D -> (v, i); v + v -> MaxUnpooling2D(., i): a SegNet encoder/decoder step."""
    n, h, w, c = shape
    oh, ow = pool_out_hw(h, w, *f, *s, padding)
    b = TfLiteModelBuilder()
    x = b.add_input("x", shape)
    v = b.add_tensor("values", [n, oh, ow, c])
    i = b.add_tensor("indices", [n, oh, ow, c])
    opts = pack_pool_params(padding, s[1], s[0], f[1], f[0], activation) if options is None else options
    b.add_operator("CUSTOM", [x], [v, i], custom_code="MaxPoolingWithArgmax2D", custom_options=opts)
    y = b.add_tensor("doubled", [n, oh, ow, c])
    b.add_operator("ADD", [v, v], [y], ("AddOptions", {"fused_activation_function": 0}))
    if unpool:
        u = b.add_tensor("unpooled", [n, oh * f[0], ow * f[1], c])
        b.add_operator("CUSTOM", [y, i], [u], custom_code="MaxUnpooling2D", custom_options=opts)
        b.set_outputs([u, i])
    else:
        b.set_outputs([y, i])
    return b.build()


def run(model, delegate, x):
    it = Interpreter(model_content=model, experimental_delegates=[delegate])
    it.allocate_tensors()
    it.set_tensor(it.get_input_details()[0]["index"], x)
    it.invoke()
    return [it.get_tensor(d["index"]) for d in it.get_output_details()], it


def run_in_hal(model_bytes, x):
    """Every node converted to one NNAPI model, compiled and run in-process (no TFLite, no service)."""
    part = convert_partition(read_model(model_bytes))
    return dict(zip(part.output_tensors, execute(compile_model(part.model), [x])))


def test_custom_op_without_delegate_is_tflites_clear_error():
    # LiteRT registers TFLite's perception op MaxPoolingWithArgmax2D; neither runtime has MaxUnpooling2D.
    unresolved = "MaxUnpooling2D" if RUNTIME == "ai_edge_litert" else "MaxPoolingWithArgmax2D"
    with pytest.raises(RuntimeError, match=f"unresolved custom op: {unresolved}"):
        Interpreter(model_content=segnet_model((1, 4, 4, 1))).allocate_tensors()


@settings(max_examples=25, deadline=None)
@given(shape=st.tuples(st.integers(1, 2), st.integers(1, 9), st.integers(1, 9), st.integers(1, 3)),
       f=st.tuples(st.integers(1, 3), st.integers(1, 3)), s=st.tuples(st.integers(1, 3), st.integers(1, 3)),
       padding=st.sampled_from([SAME, VALID]), activation=st.sampled_from([0, 1, 2, 3]),
       special=st.booleans(), seed=st.integers(0, 2**31))
def test_argmax_pooling_pair_in_hal_matches_reference(shape, f, s, padding, activation, special, seed):
    """Both ops in hal against the loop references, incl. ties (small integers) and -inf / NaN values."""
    n, h, w, c = shape
    oh, ow = pool_out_hw(h, w, *f, *s, padding)
    if oh < 1 or ow < 1:
        return
    x = np.random.default_rng(seed).integers(-3, 4, shape).astype(np.float32)  # many ties
    if special:
        x.reshape(-1)[:: 3] = -np.inf
        x.reshape(-1)[1:: 5] = np.nan
    with np.errstate(over="ignore"):  # lowest + lowest (all -inf/NaN windows) is -inf, in TFLite too
        out = run_in_hal(segnet_model(shape, f, s, padding, activation), x)
        want_v, want_i = pool_reference(x, *f, *s, padding, activation)
        doubled = want_v + want_v
    np.testing.assert_array_equal(out[2], want_i)  # tensor "indices"
    np.testing.assert_array_equal(out[4], unpool_reference(doubled, want_i, *f, *s))  # "unpooled"


def test_unpooling_skips_out_of_range_and_odd_indices():
    vals = np.arange(1, 9, dtype=np.float32).reshape(1, 2, 2, 2)
    ind = np.array([3.1, -1.0, 7.9, np.nan, 0.2, 1e12, 2.5, -0.7], np.float32).reshape(1, 2, 2, 2)
    b = TfLiteModelBuilder()
    v, i = b.add_input("v", [1, 2, 2, 2]), b.add_input("i", [1, 2, 2, 2])
    u = b.add_tensor("u", [1, 4, 4, 2])
    b.add_operator("CUSTOM", [v, i], [u], custom_code="MaxUnpooling2D",
                   custom_options=pack_pool_params(SAME, 2, 2, 2, 2))
    b.set_outputs([u])
    part = convert_partition(read_model(b.build()))
    got = execute(compile_model(part.model), [vals, ind])[0]
    ind_clean = np.where(np.isfinite(ind) & (np.abs(ind) < 100), ind, -1e6)  # skipped either way
    np.testing.assert_array_equal(got, unpool_reference(vals, ind_clean, 2, 2, 2, 2))


def test_segnet_step_runs_fully_delegated(ext_server):
    model = segnet_model((1, 8, 6, 3), padding=SAME, activation=1)
    d = load_delegate(ext_server.address)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 8, 6, 3)).astype(np.float32)
    (unpooled, idx), it = run(model, d, x)
    want_v, want_i = pool_reference(x, 2, 2, 2, 2, SAME, 1)
    np.testing.assert_array_equal(idx, want_i)
    np.testing.assert_array_equal(unpooled, unpool_reference(want_v + want_v, want_i, 2, 2, 2, 2))
    assert d.report.delegated == 3 and d.report.partitions == [[0, 1, 2]]
    assert [o["op_name"] for o in it._get_ops_details()][-1] == "DELEGATE"
    for _ in range(3):  # repeated invokes
        x = rng.standard_normal((1, 8, 6, 3)).astype(np.float32)
        it.set_tensor(it.get_input_details()[0]["index"], x)
        it.invoke()
        want_v, want_i = pool_reference(x, 2, 2, 2, 2, SAME, 1)
        np.testing.assert_array_equal(it.get_tensor(it.get_output_details()[0]["index"]),
                                      unpool_reference(want_v + want_v, want_i, 2, 2, 2, 2))


def test_fibonacci_custom_op_through_the_delegate(ext_server):
    b = TfLiteModelBuilder()
    x = b.add_input("x", [1, 6])
    f = b.add_tensor("fib", [1, 6])
    b.add_operator("CUSTOM", [x], [f], custom_code="com.example.fibonacci")
    y = b.add_tensor("y", [1, 6])
    b.add_operator("ADD", [f, x], [y], ("AddOptions", {"fused_activation_function": 0}))
    b.set_outputs([y])
    d = load_delegate(ext_server.address)
    n = np.array([[0, 1, 2, 3, 10, 20]], np.float32)
    (out,), _ = run(b.build(), d, n)
    np.testing.assert_array_equal(out, np.array([[0, 1, 1, 2, 55, 6765]], np.float32) + n)
    assert d.report.partitions == [[0, 1]]


def test_service_lists_extensions_and_runs_extension_operand_types(ext_server):
    """GetSupportedExtensions; an EXAMPLE_INT64 model (extension operand type in and out) end to end."""
    c = Client.connect(ext_server.address)
    try:
        exts = {e.name: e for e in c.get_supported_extensions()}
        fib = exts["com.example.fibonacci"]
        assert [(t.type, t.is_tensor, t.byte_size) for t in fib.operand_types] == [(0, True, 8)]
        assert "com.nnhal.maxpool_argmax" in exts
        m = fib_model(prefix=12, int64=True, n=4)
        assert c.get_supported_operations(m) == [True]
        pm = c.prepare_model(m)
        out = pm.execute([np.array([5, 50, 90, 92], np.int64)]).outputs[0]
        assert out.dtype == np.int64
        np.testing.assert_array_equal(out, [5, 12586269025, 2880067194370816120, 7540113804746346429])
        with pm.local_burst() as burst:
            np.testing.assert_array_equal(burst.execute([np.array([1, 2, 3, 4], np.int64)]).outputs[0], [1, 1, 2, 3])
    finally:
        c.close()


@pytest.mark.parametrize("kwargs, message", [
    ({"prefix_name": "com.unknown.ext"}, "unknown extension 'com.unknown.ext'"),
    ({"op_type": 9}, "has no operation type 9"),
])
def test_bad_extension_models_are_errors_from_the_service(ext_server, kwargs, message):
    c = Client.connect(ext_server.address)
    try:
        with pytest.raises(ServiceError, match=message):
            c.prepare_model(fib_model(**kwargs))
        m = fib_model()
        m.extension_name_to_prefix.append(m.extension_name_to_prefix[0].__class__("com.nnhal.maxpool_argmax", 3))
        with pytest.raises(ServiceError, match="assigned twice"):
            c.get_supported_operations(m)
        assert c.get_version_string()  # still serving
    finally:
        c.close()


@pytest.mark.parametrize("options", [b"", b"\x01\x00\x00\x00", pack_pool_params(3, 2, 2, 2, 2),
                                     pack_pool_params(SAME, 2, 2, 2, 2, activation=6)])
def test_malformed_custom_options_are_not_delegated(ext_server, options):
    """The nodes stay with TFLite, which has no kernel for them: a clear error, no crash."""
    model = segnet_model((1, 4, 4, 1), options=options)
    d = load_delegate(ext_server.address)
    with pytest.raises(RuntimeError, match="unresolved custom op"):
        run(model, d, np.zeros((1, 4, 4, 1), np.float32))
    assert "MaxPoolingWithArgmax2D" in d.report.nodes[0].reason


def test_hal_rejects_bad_pool_parameters():
    with pytest.raises(HalError, match="does not fit"):
        run_in_hal(segnet_model((1, 2, 2, 1), f=(3, 3), s=(1, 1), padding=VALID, unpool=False),
                   np.zeros((1, 2, 2, 1), np.float32))


def test_report_names_the_extension_when_the_service_is_missing(tmp_path):
    path = tmp_path / "segnet.tflite"
    path.write_bytes(segnet_model((1, 4, 4, 1)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(EXAMPLE_DIRS + [os.getcwd()])}
    r = subprocess.run([sys.executable, "-m", "nnhal.cli", "report", "--model_file", str(path),
                        "--service_address", "unix:" + str(tmp_path / "nobody.sock")],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 2
    assert "unresolved custom op" in r.stderr
    try:
        from importlib import metadata
        metadata.distribution("nnhal-example-maxpool-argmax")
    except metadata.PackageNotFoundError:
        assert "no installed nnhal extension implements it" in r.stderr
    else:
        assert "'MaxPoolingWithArgmax2D' is provided by extension com.nnhal.maxpool_argmax" in r.stderr


def test_resizing_inputs_after_delegation_is_a_clear_error_with_the_flag(ext_server):
    """With AllowDynamicTensors TFLite keeps the delegate kernel across resize_tensor_input."""
    model = segnet_model((1, 4, 4, 1), unpool=False)
    (_, _), it = run(model, load_delegate(ext_server.address), np.zeros((1, 4, 4, 1), np.float32))
    it.resize_tensor_input(it.get_input_details()[0]["index"], [2, 4, 4, 1])
    with pytest.raises(RuntimeError, match="failed to prepare"):
        it.allocate_tensors()
