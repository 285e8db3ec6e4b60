"""MobileNetV3-small (Howard et al. 2019) as the TFLite converter emits Keras' ``MobileNetV3Small``
(``include_preprocessing=False``, batch norms folded into the biases), built on nnhal.examples'
``_Net`` with random weights, for the float and 8-bit benchmarks and whole-model tests.

The converter's forms, kept here:

* hard-swish ``x * relu6(x + 3) / 6`` is one HARD_SWISH operation;
* the squeeze-excite's hard-sigmoid ``relu6(x + 3) / 6``: the ``+ 3`` folded into the bias of the
  1x1 CONV_2D before it, RELU6 fused into that CONV_2D, then a MUL by a constant 1/6, and the
  gate's MUL broadcasting [1, 1, 1, C] over the block's [1, H, W, C];
* squeeze: MEAN over H and W (keep_dims), reduce and expand as 1x1 CONV_2D, ReLU fused;
* Keras pads a stride-2 depthwise explicitly (ZeroPadding2D): a PAD, then a VALID depthwise;
* the head: 1x1 CONV_2D to 576 + HARD_SWISH, MEAN (keep_dims), 1x1 CONV_2D to 1024 + HARD_SWISH,
  1x1 CONV_2D to the classes, RESHAPE (Keras' Flatten), SOFTMAX.

Quantized (int8: per-channel symmetric filters, int8 I/O; uint8: per-tensor filters, uint8 I/O;
input scale 0.02), every activation the converter would calibrate gets the asymmetric 8-bit range
of the same-seed float32 model's values on random images (as a representative data set gives it):
the weights are random, so fixed guesses leave deep layers a few levels of the range. PAD, MEAN
and RESHAPE keep their input's quantization; the gate's MUL by 1/6 spans [0, 1]; SOFTMAX is
TFLite's fixed 1/256. The classifier's filters are drawn larger (CLASSIFIER_GAIN) so that the
random logits spread over a few units.
"""
from __future__ import annotations

import numpy as np

from delegate.runtime import Interpreter, OpResolverType
from delegate.tfl.schema import ActivationFunctionType as Act
from delegate.tfl.schema import Padding
from nnhal.examples import _Net

RE, HS = "RE", "HS"

#: Table 2 of Howard et al. 2019 as Keras builds it: (kernel, expansion size, output channels,
#: squeeze-excite, nonlinearity, stride) of each bottleneck.
_SMALL = [(3, 16, 16, True, RE, 2), (3, 72, 24, False, RE, 2), (3, 88, 24, False, RE, 1),
          (5, 96, 40, True, HS, 2), (5, 240, 40, True, HS, 1), (5, 240, 40, True, HS, 1),
          (5, 120, 48, True, HS, 1), (5, 144, 48, True, HS, 1), (5, 288, 96, True, HS, 2),
          (5, 576, 96, True, HS, 1), (5, 576, 96, True, HS, 1)]


def _depth(v: float, divisor: int = 8) -> int:
    """Keras' channel rounding: to a multiple of ``divisor``, at least it, never 10% below ``v``."""
    d = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return d + divisor if d < 0.9 * v else d


class _V3Net(_Net):
    """_Net whose free activation quantizations come from ``ranges`` (tensor name -> the float
    twin's (min, max), as the converter calibrates them), and that tracks the current zero point."""

    def __init__(self, dtype, input_shape, seed: int, ranges: dict[str, tuple[float, float]] | None = None):
        super().__init__(dtype, input_shape, seed)
        self.ranges = ranges
        self.zp_cur = self.out_zp = self.zp

    def _tensor(self, kind, shape, scale=None, zp=None):
        if self.q8 and scale is None and self.ranges is not None:
            scale, zp = _quantization(self.ranges[f"{kind}_{self.n + 1}"], self.dtype)
        self.out_zp = self.zp if zp is None else zp
        return super()._tensor(kind, shape, scale, zp)


def _quantization(span: tuple[float, float], dtype) -> tuple[float, int]:
    """The asymmetric 8-bit quantization of [min, max] widened to hold 0 (TFLite's nudging)."""
    lo, hi = min(span[0], 0.0), max(span[1], 0.0)
    scale = max(hi - lo, 1e-6) / 255.0
    return scale, int(np.iinfo(dtype).min) + int(round(-lo / scale))


def _conv(net: _V3Net, out_c: int, k: int = 1, stride: int = 1, act=Act.NONE, depthwise: bool = False,
          padding=Padding.SAME, bias_shift: float = 0.0, gain: float = 1.0) -> None:
    """CONV_2D (or DEPTHWISE_CONV_2D); ``bias_shift`` is added to every bias (a folded ``+ 3``),
    ``gain`` scales the filters' He initialisation."""
    n, h, w, c = net.shape
    if depthwise:
        wt, ws = net._filter((1, k, k, c), k * k / gain ** 2, 3)
        out_c = c
    else:
        wt, ws = net._filter((out_c, k, k, c), k * k * c / gain ** 2, 0)
    bias = _bias(net, out_c, ws, bias_shift)
    if padding == Padding.SAME:
        oh, ow = -(-h // stride), -(-w // stride)
    else:
        oh, ow = (h - k) // stride + 1, (w - k) // stride + 1
    out, scale = net._tensor("dw" if depthwise else "conv", [n, oh, ow, out_c])
    options = {"padding": padding, "stride_w": stride, "stride_h": stride, "fused_activation_function": act,
               "dilation_w_factor": 1, "dilation_h_factor": 1}
    if depthwise:
        net.b.add_operator("DEPTHWISE_CONV_2D", [net.cur, wt, bias], [out],
                           ("DepthwiseConv2DOptions", {**options, "depth_multiplier": 1}))
    else:
        net.b.add_operator("CONV_2D", [net.cur, wt, bias], [out], ("Conv2DOptions", options))
    net.cur, net.shape, net.scale, net.zp_cur = out, [n, oh, ow, out_c], scale, net.out_zp


def _bias(net: _V3Net, n: int, wscale, shift: float) -> int:
    """_Net's random bias plus ``shift``: quantized, int32 at input scale x filter scale."""
    values = net.rng.normal(0, 0.1, n) + shift
    if not net.q8:
        return net.b.add_constant(net._name("bias"), values.astype(np.float32))
    bscale = np.broadcast_to((np.float32(net.scale) * wscale).astype(np.float32), (n,))
    q = np.round(values / bscale).astype(np.int32)
    if len(wscale) == n and net.dtype == np.int8:
        return net.b.add_constant(net._name("bias"), q, scale=bscale.copy(), zero_point=[0] * n)
    return net.b.add_constant(net._name("bias"), q, scale=float(bscale[0]), zero_point=0)


def _hard_swish(net: _V3Net) -> None:
    out, scale = net._tensor("hard_swish", list(net.shape))
    net.b.add_operator("HARD_SWISH", [net.cur], [out])
    net.cur, net.scale, net.zp_cur = out, scale, net.out_zp


def _act(net: _V3Net, nl: str, out_c: int, **conv) -> None:
    """A convolution followed by the block's nonlinearity: ReLU fused, or HARD_SWISH after it."""
    _conv(net, out_c, act=Act.RELU if nl == RE else Act.NONE, **conv)
    if nl == HS:
        _hard_swish(net)


def _mean(net: _V3Net) -> None:
    """MEAN over H and W, keep_dims (Keras' GlobalAveragePooling2D(keepdims=True)); quantized, the
    input's quantization (as NNAPI's MEAN requires)."""
    n, _, _, c = net.shape
    axes = net.b.add_constant(net._name("axes"), np.array([1, 2], np.int32))
    pooled, _ = net._tensor("mean", [n, 1, 1, c], scale=net.scale, zp=net.zp_cur)
    net.b.add_operator("MEAN", [net.cur, axes], [pooled], ("ReducerOptions", {"keep_dims": True}))
    net.cur, net.shape = pooled, [n, 1, 1, c]


def _squeeze_excite(net: _V3Net) -> None:
    """MEAN, 1x1 reduce + ReLU, 1x1 expand with the hard-sigmoid's + 3 in its bias and RELU6
    fused, MUL by 1/6 (quantized: [0, 1]), then the gate's broadcast MUL over the block."""
    src, shape = net.cur, list(net.shape)
    c = shape[3]
    _mean(net)
    _conv(net, _depth(c * 0.25), act=Act.RELU)
    _conv(net, c, act=Act.RELU6, bias_shift=3.0)
    if net.q8:
        top = int(np.iinfo(net.dtype).max)
        sixth = net.b.add_constant(net._name("sixth"), np.array([top], net.dtype), scale=1.0 / 6 / top,
                                   zero_point=0)
        gate, _ = net._tensor("se_gate", [1, 1, 1, c], scale=1.0 / 255, zp=int(np.iinfo(net.dtype).min))
    else:
        sixth = net.b.add_constant(net._name("sixth"), np.array([1.0 / 6], np.float32))
        gate, _ = net._tensor("se_gate", [1, 1, 1, c])
    net.b.add_operator("MUL", [net.cur, sixth], [gate], ("MulOptions", {"fused_activation_function": Act.NONE}))
    out, scale = net._tensor("se_out", shape)
    net.b.add_operator("MUL", [src, gate], [out], ("MulOptions", {"fused_activation_function": Act.NONE}))
    net.cur, net.shape, net.scale, net.zp_cur = out, shape, scale, net.out_zp


def _pad_for(net: _V3Net, k: int) -> None:
    """Keras' ZeroPadding2D(correct_pad(x, k)) before a stride-2 VALID depthwise: one less row and
    column before than after on an even size (TensorFlow's SAME), k // 2 each side on an odd one."""
    n, h, w, c = net.shape
    (top, bottom), (left, right) = ((k // 2 - (1 - d % 2), k // 2) for d in (h, w))
    pads = net.b.add_constant(net._name("paddings"),
                              np.array([[0, 0], [top, bottom], [left, right], [0, 0]], np.int32))
    shape = [n, h + top + bottom, w + left + right, c]
    out, _ = net._tensor("pad", shape, scale=net.scale, zp=net.zp_cur)
    net.b.add_operator("PAD", [net.cur, pads], [out])
    net.cur, net.shape = out, shape


def _bneck(net: _V3Net, k: int, expanded: int, out_c: int, se: bool, nl: str, stride: int, first: bool) -> None:
    """Keras' _inverted_res_block: 1x1 expand + nonlinearity (not in the first block), k x k
    depthwise + nonlinearity, squeeze-excite, 1x1 project, residual ADD when the shape is kept."""
    src, src_shape = net.cur, list(net.shape)
    if not first:
        _act(net, nl, expanded)
    if stride == 2:
        _pad_for(net, k)
    _act(net, nl, expanded, k=k, stride=stride, depthwise=True,
         padding=Padding.VALID if stride == 2 else Padding.SAME)
    if se:
        _squeeze_excite(net)
    _conv(net, out_c)
    if stride == 1 and src_shape[3] == out_c:
        out, scale = net._tensor("add", list(net.shape))
        net.b.add_operator("ADD", [src, net.cur], [out], ("AddOptions", {"fused_activation_function": Act.NONE}))
        net.cur, net.scale, net.zp_cur = out, scale, net.out_zp


#: The classifier's filters at this many times He's scale: random logits then spread over a few
#: units, as a trained network's do, and an 8-bit SOFTMAX over 1000 classes is not all zeros.
CLASSIFIER_GAIN = 8.0


def _build(dtype, input_size: int, classes: int, seed: int, ranges=None) -> bytes:
    net = _V3Net(dtype, [1, input_size, input_size, 3], seed, ranges)
    _act(net, HS, 16, k=3, stride=2)
    for i, (k, expanded, out_c, se, nl, stride) in enumerate(_SMALL):
        _bneck(net, k, expanded, out_c, se, nl, stride, first=i == 0)
    _act(net, HS, _depth(net.shape[3] * 6))
    _mean(net)
    _act(net, HS, 1024)
    _conv(net, classes, gain=CLASSIFIER_GAIN)
    n = net.shape[0]
    flat, _ = net._tensor("flat", [n, classes], scale=net.scale, zp=net.zp_cur)
    shape = net.b.add_constant(net._name("shape"), np.array([n, classes], np.int32))
    net.b.add_operator("RESHAPE", [net.cur, shape], [flat], ("ReshapeOptions", {"new_shape": [n, classes]}))
    zp_out = {np.dtype(np.uint8): 0, np.dtype(np.int8): -128}.get(net.dtype, 0)
    probs, _ = net._tensor("probs", [n, classes], scale=1.0 / 256, zp=zp_out)
    net.b.add_operator("SOFTMAX", [flat], [probs], ("SoftmaxOptions", {"beta": 1.0}))
    net.b.set_outputs([probs])
    return net.build()


def _calibrate(input_size: int, classes: int, seed: int, samples: int = 4) -> dict[str, tuple[float, float]]:
    """Every activation's (min, max) in the float32 model of the same weights on ``samples``
    random images over the 8-bit input's range [-2.56, 2.54] (its scale 0.02), as the converter's
    representative data set gives them."""
    it = Interpreter(model_content=_build(np.float32, input_size, classes, seed),
                     experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES,
                     experimental_preserve_all_tensors=True)
    it.allocate_tensors()
    details = [d for d in it.get_tensor_details() if d["dtype"] == np.float32]
    rng = np.random.default_rng(seed)
    ranges: dict[str, tuple[float, float]] = {}
    for _ in range(samples):
        it.set_tensor(it.get_input_details()[0]["index"],
                      rng.uniform(-2.56, 2.54, (1, input_size, input_size, 3)).astype(np.float32))
        it.invoke()
        for d in details:
            v = it.get_tensor(d["index"])
            lo, hi = ranges.get(d["name"], (np.inf, -np.inf))
            ranges[d["name"]] = (min(lo, float(v.min())), max(hi, float(v.max())))
    return ranges


def mobilenet_v3_small(dtype=np.float32, input_size: int = 224, classes: int = 1000, seed: int = 0) -> bytes:
    """MobileNetV3-small at width 1.0 (~2.5 M parameters with 1000 classes): float32, int8
    (per-channel filters) or uint8 (per-tensor), activations quantized to the float32 model's
    calibrated ranges."""
    if np.dtype(dtype) not in (np.dtype(np.float32), np.dtype(np.int8), np.dtype(np.uint8)):
        raise ValueError("mobilenet_v3_small is float32, int8 or uint8")
    ranges = None if np.dtype(dtype) == np.float32 else _calibrate(input_size, classes, seed)
    return _build(dtype, input_size, classes, seed, ranges)
