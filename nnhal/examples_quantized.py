"""Quantized example models beside nnhal.examples' MobileNetV2 / EfficientNet-B0, for the 8-bit
benchmarks (bench/quantized_models.py) and the numba backend's whole-model tests.

``blazeface_quantized``: nnhal.examples' BlazeFace-style detector in int8 (per-channel filters) or
uint8 (per-tensor): 5x5 stem, BlazeBlocks (5x5 depthwise, 1x1 projection, max-pooled and
zero-padded shortcuts, ADD + RELU), SSD heads reshaped and concatenated (two outputs).
``small_cnn``: a plain CNN classifier (3x3 convolutions with RELU, stride-2 downsampling, 2x2 max
pools, global average pool, FULLY_CONNECTED, SOFTMAX).
Weights are random (nnhal.examples._Net); every intermediate tensor of a kind shares one
quantization, so the shortcuts' MAX_POOL / PAD and the heads' CONCATENATION keep their inputs'.
"""
from __future__ import annotations

import numpy as np

from delegate.tfl.schema import ActivationFunctionType as Act
from delegate.tfl.schema import Padding
from nnhal.examples import _BLAZE, _Net


def _blaze_block(net: _Net, out_c: int, stride: int) -> None:
    """nnhal.examples' BlazeBlock, quantized: the shortcut's MAX_POOL and PAD keep the block
    input's quantization (PAD fills with its zero point), the ADD has one of its own."""
    b = net.b
    src, (n, _, _, c), src_scale = net.cur, list(net.shape), net.scale
    net.depthwise(k=5, stride=stride, act=Act.NONE).conv(out_c, k=1, act=Act.NONE)
    oh, ow = net.shape[1], net.shape[2]
    if stride == 2:
        pooled, _ = net._tensor("maxpool", [n, oh, ow, c], scale=src_scale)
        b.add_operator("MAX_POOL_2D", [src], [pooled], ("Pool2DOptions", {
            "padding": Padding.VALID, "stride_w": 2, "stride_h": 2, "filter_width": 2, "filter_height": 2,
            "fused_activation_function": Act.NONE}))
        src = pooled
    if out_c > c:
        padded, _ = net._tensor("pad", [n, oh, ow, out_c], scale=src_scale)
        pads = b.add_constant(net._name("paddings"), np.array([[0, 0], [0, 0], [0, 0], [0, out_c - c]], np.int32))
        b.add_operator("PAD", [src, pads], [padded])
        src = padded
    out, scale = net._tensor("add", [n, oh, ow, out_c], scale=max(net.scale, src_scale) * 1.5)
    b.add_operator("ADD", [net.cur, src], [out], ("AddOptions", {"fused_activation_function": Act.RELU}))
    net.cur, net.scale = out, scale


def blazeface_quantized(dtype=np.int8, input_size: int = 128, seed: int = 0) -> bytes:
    """The BlazeFace-style detector in int8 or uint8: outputs [1, 896, 16] regressors and
    [1, 896, 1] scores for a 128 input (``input_size`` a multiple of 16)."""
    if np.dtype(dtype) not in (np.dtype(np.int8), np.dtype(np.uint8)):
        raise ValueError("blazeface_quantized is int8 or uint8")
    net = _Net(dtype, [1, input_size, input_size, 3], seed)
    net.conv(24, k=5, stride=2, act=Act.RELU)
    features = []
    for k, (c, s) in enumerate(_BLAZE):
        _blaze_block(net, c, s)
        if k in (10, 14):  # the 16x16 (88 channels) and 8x8 (96 channels) feature maps
            features.append((net.cur, list(net.shape), net.scale))
    b, regressors, scores = net.b, [], []
    for (src, shape, scale), anchors in zip(features, (2, 6)):
        for per_anchor, into in ((16, regressors), (1, scores)):
            net.cur, net.shape, net.scale = src, shape, scale
            net.conv(anchors * per_anchor, k=1, act=Act.NONE)  # every head: act_scale, the zero point
            n, h, w, _ = net.shape
            rows = [n, h * w * anchors, per_anchor]
            flat, _ = net._tensor("flat", rows, scale=net.scale)
            shp = b.add_constant(net._name("shape"), np.array(rows, np.int32))
            b.add_operator("RESHAPE", [net.cur, shp], [flat], ("ReshapeOptions", {"new_shape": rows}))
            into.append((flat, h * w * anchors, per_anchor, net.scale))
    outputs = []
    for parts in (regressors, scores):
        out, _ = net._tensor("concat", [1, sum(p[1] for p in parts), parts[0][2]], scale=parts[0][3])
        b.add_operator("CONCATENATION", [p[0] for p in parts], [out], ("ConcatenationOptions", {
            "axis": 1, "fused_activation_function": Act.NONE}))
        outputs.append(out)
    b.set_outputs(outputs)
    return net.build()


def small_cnn(dtype=np.int8, input_size: int = 128, classes: int = 10, seed: int = 0) -> bytes:
    """A plain CNN classifier: [3x3 conv + RELU] x2 per stage (the first strided), a 2x2 max pool
    after the second stage, widths 32-64-128-256, global average pool, FULLY_CONNECTED, SOFTMAX."""
    net = _Net(dtype, [1, input_size, input_size, 3], seed)
    for stage, width in enumerate((32, 64, 128, 256)):
        net.conv(width, stride=2, act=Act.RELU).conv(width, act=Act.RELU)
        if stage == 1:
            n, h, w, c = net.shape
            pooled, _ = net._tensor("maxpool", [n, h // 2, w // 2, c], scale=net.scale)
            net.b.add_operator("MAX_POOL_2D", [net.cur], [pooled], ("Pool2DOptions", {
                "padding": Padding.VALID, "stride_w": 2, "stride_h": 2, "filter_width": 2, "filter_height": 2,
                "fused_activation_function": Act.NONE}))
            net.cur, net.shape = pooled, [n, h // 2, w // 2, c]
    return net.head(classes).build()
