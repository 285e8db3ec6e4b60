"""Convolution2DTransposeBias: kernel, custom options, validation, and a selfie-segmentation-style
decoder step through TFLite + the nnhal delegate + a real service.

The reference semantics are MediaPipe's mediapipe/util/tflite/operations/transpose_conv_bias.cc:
output size ``s * (in - 1) + f - total_pad`` with SAME's ``total_pad = max(0, f - (in - 1) % s - 1)``,
head padding ``total_pad // 2``, every output starting at the bias, inputs scattered through the
OHWI filter. The reference below gathers instead of scattering: for each output pixel, the taps
``k`` whose input position ``(out + pad - k) / s`` is a whole in-range pixel.
"""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nnhal_mediapipe.transpose_conv_bias import CODE, pack_options, parse_options

from delegate import load_delegate
from delegate.mapping import MappingError, convert_partition
from delegate.runtime import RUNTIME, Interpreter
from delegate.tfl import TfLiteModelBuilder, read_model
from extensions.options import CustomOptionsError
from hal import compile_model, execute
from hal.errors import HalError
from tests.harness import assert_float_close, tflite_run

SAME, VALID = 1, 2


def transpose_conv_bias_reference(x, filt, bias, stride_h, stride_w, padding):
    """Gather form of MediaPipe's scatter loops, accumulated in float64."""
    n, h, w, ci = x.shape
    co, fh, fw, _ = filt.shape

    def axis(size, f, s):
        total = max(0, f - (size - 1) % s - 1) if padding == SAME else 0
        return s * (size - 1) + f - total, total // 2

    (oh, pt), (ow, pl) = axis(h, fh, stride_h), axis(w, fw, stride_w)
    out = np.empty((n, oh, ow, co))
    for b in range(n):
        for oy in range(oh):
            for ox in range(ow):
                acc = bias.astype(np.float64).copy()
                for ky in range(fh):
                    iy, ry = divmod(oy + pt - ky, stride_h)
                    if ry or not 0 <= iy < h:
                        continue
                    for kx in range(fw):
                        ix, rx = divmod(ox + pl - kx, stride_w)
                        if rx or not 0 <= ix < w:
                            continue
                        acc += filt[:, ky, kx, :].astype(np.float64) @ x[b, iy, ix].astype(np.float64)
                out[b, oy, ox] = acc
    return out.astype(np.float32)


def transpose_model(x_shape, filt, bias, stride_h, stride_w, padding, options=None, version=1):
    n, h, w, _ = x_shape
    b = TfLiteModelBuilder()
    x = b.add_input("x", x_shape)
    f = b.add_constant("filter", filt)
    bb = b.add_constant("bias", bias)
    oh, ow = (transpose_conv_bias_reference(np.zeros(x_shape, np.float32), filt, bias, stride_h, stride_w,
                                            padding).shape[1:3])
    y = b.add_tensor("y", [n, oh, ow, filt.shape[0]])
    opts = pack_options(padding, stride_w, stride_h) if options is None else options
    b.add_operator("CUSTOM", [x, f, bb], [y], custom_code=CODE, custom_options=opts, version=version)
    b.set_outputs([y])
    return b.build()


def run_in_hal(model: bytes, inputs):
    part = convert_partition(read_model(model))
    return execute(compile_model(part.model), list(inputs))


@settings(max_examples=30, deadline=None)
@given(shape=st.tuples(st.integers(1, 2), st.integers(1, 5), st.integers(1, 5), st.integers(1, 3)),
       co=st.integers(1, 3), f=st.tuples(st.integers(1, 4), st.integers(1, 4)),
       s=st.tuples(st.integers(1, 3), st.integers(1, 3)), padding=st.sampled_from([SAME, VALID]),
       seed=st.integers(0, 2**31))
def test_kernel_matches_reference(shape, co, f, s, padding, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32)
    filt = rng.standard_normal((co, *f, shape[3])).astype(np.float32)
    bias = rng.standard_normal(co).astype(np.float32)
    (got,) = run_in_hal(transpose_model(shape, filt, bias, *s, padding), [x])
    want = transpose_conv_bias_reference(x, filt, bias, *s, padding)
    assert got.dtype == np.float32 and got.shape == want.shape
    assert_float_close(got, want)


@pytest.mark.parametrize("h, f, s, padding, want", [
    (4, 2, 2, SAME, 8), (5, 2, 2, SAME, 9), (4, 3, 2, SAME, 8), (5, 3, 2, SAME, 9), (4, 4, 2, SAME, 8),
    (4, 3, 1, SAME, 4),
    (4, 3, 2, VALID, 9), (1, 1, 3, VALID, 1),
])
def test_output_sizes_follow_mediapipe_prepare(h, f, s, padding, want):
    """MediaPipe's Prepare: VALID s * (in - 1) + f; SAME drops max(0, f - (in - 1) % s - 1), so a 2x2 / 2
    upsampling doubles an even size but maps 5 to 9."""
    filt, bias = np.ones((1, f, f, 1), np.float32), np.zeros(1, np.float32)
    (got,) = run_in_hal(transpose_model((1, h, h, 1), filt, bias, s, s, padding), [np.ones((1, h, h, 1), np.float32)])
    assert got.shape == (1, want, want, 1)


def test_options_are_the_transpose_conv_params_struct():
    assert parse_options(pack_options(SAME, 2, 3)) == {"padding": SAME, "stride_width": 2, "stride_height": 3}
    # newer TFLite headers append activation and quantized_bias_type: read, and ignored as MediaPipe does
    assert parse_options(pack_options(VALID, 1, 1) + b"\x01\0\0\0")["padding"] == VALID
    assert parse_options(pack_options(VALID, 1, 1) + bytes(8))["stride_width"] == 1


@pytest.mark.parametrize("data, message", [
    (None, "got 0 bytes"), (b"\x01\0\0\0", "got 4 bytes"), (pack_options(SAME, 2, 2) + b"\0", "got 13 bytes"),
    (pack_options(0, 2, 2), "padding must be 1 \\(SAME\\) or 2 \\(VALID\\), got 0"),
    (pack_options(3, 2, 2), "got 3"), (pack_options(SAME, 0, 2), "strides must be >= 1, got 0x2"),
    (pack_options(SAME, 2, -1), "got 2x-1"),
])
def test_bad_options_are_errors(data, message):
    with pytest.raises(CustomOptionsError, match=message):
        parse_options(data)


ONES = np.ones((2, 3, 3, 1), np.float32), np.zeros(2, np.float32)


@pytest.mark.parametrize("kwargs, message", [
    ({"options": b"\x01\0\0\0"}, "TfLiteTransposeConvParams"),
    ({"options": pack_options(SAME, 0, 1)}, "strides must be >= 1"),
    ({"version": 2}, "version 2 is not supported"),
])
def test_bad_nodes_are_refused_by_the_mapper(kwargs, message):
    model = transpose_model((1, 3, 3, 1), *ONES, 2, 2, SAME, **kwargs)
    with pytest.raises(MappingError, match=message):
        convert_partition(read_model(model))


@pytest.mark.parametrize("filt, bias, message", [
    (np.ones((2, 3, 3, 2), np.float32), np.zeros(2, np.float32), "filter input depth 2 must equal the input depth 1"),
    (np.ones((2, 3, 3, 1), np.float32), np.zeros(3, np.float32), "bias size 3 must equal the filter's output depth 2"),
])
def test_hal_rejects_mismatched_shapes(filt, bias, message):
    b = TfLiteModelBuilder()
    x = b.add_input("x", [1, 3, 3, 1])
    y = b.add_tensor("y", [1, 6, 6, 2])
    b.add_operator("CUSTOM", [x, b.add_constant("f", filt), b.add_constant("b", bias)], [y], custom_code=CODE,
                   custom_options=pack_options(SAME, 2, 2))
    b.set_outputs([y])
    part = convert_partition(read_model(b.build()))
    with pytest.raises(HalError, match=message):
        compile_model(part.model)


def test_hal_rejects_wrong_ranks_and_types():
    b = TfLiteModelBuilder()
    x = b.add_input("x", [1, 3, 3, 1])
    y = b.add_tensor("y", [1, 6, 6, 2])
    b.add_operator("CUSTOM", [x, b.add_constant("f", np.ones((2, 3, 3, 1), np.float32)),
                              b.add_constant("b", np.zeros((1, 2), np.float32))], [y], custom_code=CODE,
                   custom_options=pack_options(SAME, 2, 2))
    b.set_outputs([y])
    with pytest.raises(MappingError, match="input 2 must be rank 1, got 2"):
        convert_partition(read_model(b.build()))
    b = TfLiteModelBuilder()
    x = b.add_input("x", [1, 3, 3, 1], np.int32)
    y = b.add_tensor("y", [1, 6, 6, 2], np.int32)
    b.add_operator("CUSTOM", [x, b.add_constant("f", np.ones((2, 3, 3, 1), np.int32)),
                              b.add_constant("b", np.zeros(2, np.int32))], [y], custom_code=CODE,
                   custom_options=pack_options(SAME, 2, 2))
    b.set_outputs([y])
    with pytest.raises(MappingError, match="float32 only"):
        convert_partition(read_model(b.build()))


# ---- a segmentation decoder step through TFLite with the delegate ---------------------------------

def decoder_models(seed=0):
    """(CONV_2D alone, CONV_2D -> Convolution2DTransposeBias -> LOGISTIC) and the weights: the tail
    of MediaPipe's selfie segmentation (a 2x upsampling to a one-channel mask)."""
    rng = np.random.default_rng(seed)
    conv_w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32) * 0.3
    conv_b = rng.standard_normal(4).astype(np.float32) * 0.1
    up_w = rng.standard_normal((1, 2, 2, 4)).astype(np.float32) * 0.5
    up_b = np.array([0.25], np.float32)
    models = []
    for full in (False, True):
        b = TfLiteModelBuilder()
        x = b.add_input("image", [1, 6, 4, 3])
        feat = b.add_tensor("features", [1, 6, 4, 4])
        b.add_operator("CONV_2D", [x, b.add_constant("conv_w", conv_w), b.add_constant("conv_b", conv_b)], [feat],
                       ("Conv2DOptions", {"padding": 0, "stride_w": 1, "stride_h": 1, "fused_activation_function": 1}))
        if full:
            up = b.add_tensor("upsampled", [1, 12, 8, 1])
            b.add_operator("CUSTOM", [feat, b.add_constant("up_w", up_w), b.add_constant("up_b", up_b)], [up],
                           custom_code=CODE, custom_options=pack_options(SAME, 2, 2))
            mask = b.add_tensor("mask", [1, 12, 8, 1])
            b.add_operator("LOGISTIC", [up], [mask])
            b.set_outputs([mask])
        else:
            b.set_outputs([feat])
        models.append(b.build())
    return models[0], models[1], (up_w, up_b)


def decoder_reference(conv_only, up, x):
    """TFLite's reference kernels run the CONV_2D; the transpose conv and the sigmoid are numpy."""
    (features,) = tflite_run(conv_only, [x], reference=True)
    logits = transpose_conv_bias_reference(features, *up, 2, 2, SAME).astype(np.float64)
    return (1 / (1 + np.exp(-logits))).astype(np.float32)


def test_tflite_alone_runs_the_decoder_only_in_litert():
    """tflite-runtime 2.14 has no kernel for the op; LiteRT 2.3 registers MediaPipe's own
    Convolution2DTransposeBias kernel, a second oracle: the delegated model must agree with it."""
    conv_only, model, up = decoder_models()
    if RUNTIME != "ai_edge_litert":
        with pytest.raises(RuntimeError, match=f"unresolved custom op: {CODE}"):
            Interpreter(model_content=model).allocate_tensors()
        return
    x = np.random.default_rng(2).standard_normal((1, 6, 4, 3)).astype(np.float32)
    it = Interpreter(model_content=model)  # only LiteRT's default (AUTO) resolver has the custom op
    it.allocate_tensors()
    it.set_tensor(it.get_input_details()[0]["index"], x)
    it.invoke()
    assert_float_close(it.get_tensor(it.get_output_details()[0]["index"]), decoder_reference(conv_only, up, x))


def test_decoder_runs_fully_delegated(mp_server):
    conv_only, model, up = decoder_models()
    d = load_delegate(mp_server.address)
    it = Interpreter(model_content=model, experimental_delegates=[d])
    it.allocate_tensors()
    assert d.report.delegated == 3 and d.report.partitions == [[0, 1, 2]], d.report
    rng = np.random.default_rng(1)
    for _ in range(2):  # repeated invokes
        x = rng.standard_normal((1, 6, 4, 3)).astype(np.float32)
        it.set_tensor(it.get_input_details()[0]["index"], x)
        it.invoke()
        got = it.get_tensor(it.get_output_details()[0]["index"])
        assert_float_close(got, decoder_reference(conv_only, up, x))


def test_report_names_the_extension_for_the_custom_node(tmp_path, mp_server, discovery_env):
    """`nnhal report --json` in a fresh process, which finds the extension through its entry point."""
    _, model, _ = decoder_models()
    path = tmp_path / "decoder.tflite"
    path.write_bytes(model)
    r = subprocess.run([sys.executable, "-m", "nnhal.cli", "report", "--json", "--model_file", str(path),
                        "--service_address", mp_server.address],
                       capture_output=True, text=True, timeout=120, env=discovery_env)
    assert r.returncode == 0, r.stderr
    nodes = json.loads(r.stdout)["nodes"]
    custom = nodes[1]
    assert CODE in custom["op"] and custom["placement"] == "nnhal", custom
    assert custom["backend"] == "com.google.mediapipe", custom
    assert [n["placement"] for n in nodes] == ["nnhal"] * 3
