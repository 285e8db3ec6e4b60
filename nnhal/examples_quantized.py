"""Quantized example models beside nnhal.examples' MobileNetV2 / EfficientNet-B0, for the 8-bit
benchmarks (bench/quantized_models.py) and the numba backend's whole-model tests.

``blazeface_quantized``: nnhal.examples' BlazeFace-style detector (``blazeface_like``) in int8
(per-channel filters) or uint8 (per-tensor).
``small_cnn``: a plain CNN classifier (3x3 convolutions with RELU, stride-2 downsampling, 2x2 max
pools, global average pool, FULLY_CONNECTED, SOFTMAX).
Weights are random (nnhal.examples._Net); every intermediate tensor of a kind shares one
quantization, so the shortcuts' MAX_POOL / PAD and the heads' CONCATENATION keep their inputs'.
"""
from __future__ import annotations

import numpy as np

from delegate.tfl.schema import ActivationFunctionType as Act
from delegate.tfl.schema import Padding
from nnhal.examples import _Net, blazeface_like


def blazeface_quantized(dtype=np.int8, input_size: int = 128, seed: int = 0) -> bytes:
    if np.dtype(dtype) not in (np.dtype(np.int8), np.dtype(np.uint8)):
        raise ValueError("blazeface_quantized is int8 or uint8")
    return blazeface_like(dtype, input_size, seed)


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
