"""Example models built with the project's TFLite builder (no TensorFlow needed).

``mobilenet_like``: a small MobileNet-style stack (conv, depthwise, inverted
residual with ADD, global average pool, reshape, fully connected, softmax) in
float32, uint8 (per-tensor) or int8 (per-channel filters). ``mobilenet_v2``: the
MobileNetV2 layer table at full size (~3.5 M parameters), for benchmarks; ``efficientnet_b0``:
EfficientNet-B0's (swish, squeeze-excite, 5x5 depthwise); ``blazeface_like``: a BlazeFace-style
float32 face detector (BlazeBlocks, two SSD heads).
Weights are random; quantization parameters are chosen so activations use a
sensible part of the 8-bit range.
"""
from __future__ import annotations

import numpy as np

from delegate.tfl import TfLiteModelBuilder
from delegate.tfl.schema import ActivationFunctionType as Act
from delegate.tfl.schema import Padding


class _Net:
    """Tracks the current tensor and its quantization while layers are appended."""

    def __init__(self, dtype, input_shape, seed: int):
        self.b = TfLiteModelBuilder(description="nnhal example")
        self.dtype = np.dtype(dtype)
        self.q8 = self.dtype != np.float32
        self.rng = np.random.default_rng(seed)
        self.n = 0
        self.act_scale = 0.05
        self.zp = {np.dtype(np.uint8): 128, np.dtype(np.int8): 0}.get(self.dtype, 0)
        self.cur = self.b.add_input("input", input_shape, self.dtype, **self._q(0.02, self.zp))
        self.shape = list(input_shape)
        self.scale = 0.02

    def _q(self, scale, zp):
        return {"scale": scale, "zero_point": zp} if self.q8 else {}

    def _name(self, kind):
        self.n += 1
        return f"{kind}_{self.n}"

    def _tensor(self, kind, shape, scale=None, zp=None):
        scale = self.act_scale if scale is None else scale
        zp = self.zp if zp is None else zp
        return self.b.add_tensor(self._name(kind), shape, self.dtype, **self._q(scale, zp)), scale

    def _filter(self, shape, fan_in, channel_axis):
        w = self.rng.normal(0, np.sqrt(2.0 / fan_in), shape).astype(np.float32)
        if not self.q8:
            return self.b.add_constant(self._name("w"), w), None
        if self.dtype == np.int8:  # per-channel symmetric, as TFLite's converter emits
            axes = tuple(i for i in range(w.ndim) if i != channel_axis)
            s = np.maximum(np.abs(w).max(axis=axes), 1e-6) / 127.0
            shp = [1] * w.ndim
            shp[channel_axis] = -1
            q = np.clip(np.round(w / s.reshape(shp)), -127, 127).astype(np.int8)
            return self.b.add_constant(self._name("w"), q, scale=s.astype(np.float32), zero_point=[0] * len(s),
                                       quantized_dimension=channel_axis), s.astype(np.float32)
        s = np.float32(max(np.abs(w).max(), 1e-6) / 127.0)
        q = np.clip(np.round(w / s) + 128, 0, 255).astype(np.uint8)
        return self.b.add_constant(self._name("w"), q, scale=float(s), zero_point=128), np.array([s], np.float32)

    def _bias(self, n, wscale):
        if not self.q8:
            return self.b.add_constant(self._name("bias"), self.rng.normal(0, 0.1, n).astype(np.float32))
        bscale = (np.float32(self.scale) * wscale).astype(np.float32)
        vals = np.round(self.rng.normal(0, 0.1, n) / (bscale if len(bscale) == n else bscale[0])).astype(np.int32)
        if len(bscale) == n and self.dtype == np.int8:
            return self.b.add_constant(self._name("bias"), vals, scale=bscale, zero_point=[0] * n)
        return self.b.add_constant(self._name("bias"), vals, scale=float(bscale[0]), zero_point=0)

    def conv(self, out_c, k=3, stride=1, act=Act.RELU6):
        n, h, w, c = self.shape
        wt, ws = self._filter((out_c, k, k, c), k * k * c, 0)
        bias = self._bias(out_c, ws)
        oh, ow = -(-h // stride), -(-w // stride)
        out, scale = self._tensor("conv", [n, oh, ow, out_c])
        self.b.add_operator("CONV_2D", [self.cur, wt, bias], [out], ("Conv2DOptions", {
            "padding": Padding.SAME, "stride_w": stride, "stride_h": stride, "fused_activation_function": act,
            "dilation_w_factor": 1, "dilation_h_factor": 1}))
        self.cur, self.shape, self.scale = out, [n, oh, ow, out_c], scale
        return self

    def depthwise(self, k=3, stride=1, act=Act.RELU6):
        n, h, w, c = self.shape
        wt, ws = self._filter((1, k, k, c), k * k, 3)
        bias = self._bias(c, ws)
        oh, ow = -(-h // stride), -(-w // stride)
        out, scale = self._tensor("dw", [n, oh, ow, c])
        self.b.add_operator("DEPTHWISE_CONV_2D", [self.cur, wt, bias], [out], ("DepthwiseConv2DOptions", {
            "padding": Padding.SAME, "stride_w": stride, "stride_h": stride, "depth_multiplier": 1,
            "fused_activation_function": act, "dilation_w_factor": 1, "dilation_h_factor": 1}))
        self.cur, self.shape, self.scale = out, [n, oh, ow, c], scale
        return self

    def inverted_residual(self, out_c, expand, stride):
        src, src_shape, src_scale = self.cur, list(self.shape), self.scale
        if expand != 1:
            self.conv(src_shape[3] * expand, k=1)
        self.depthwise(stride=stride)
        self.conv(out_c, k=1, act=Act.NONE)
        if stride == 1 and src_shape[3] == out_c:
            out, scale = self._tensor("add", list(self.shape), scale=max(self.scale, src_scale) * 1.5)
            self.b.add_operator("ADD", [self.cur, src], [out], ("AddOptions", {"fused_activation_function": Act.NONE}))
            self.cur, self.scale = out, scale
        return self

    def head(self, classes):
        n, h, w, c = self.shape
        pooled, _ = self._tensor("pool", [n, 1, 1, c], scale=self.scale)
        self.b.add_operator("AVERAGE_POOL_2D", [self.cur], [pooled], ("Pool2DOptions", {
            "padding": Padding.VALID, "stride_w": 1, "stride_h": 1, "filter_width": w, "filter_height": h,
            "fused_activation_function": Act.NONE}))
        flat, _ = self._tensor("flat", [n, c], scale=self.scale)
        shape = self.b.add_constant(self._name("shape"), np.array([n, c], np.int32))
        self.b.add_operator("RESHAPE", [pooled, shape], [flat], ("ReshapeOptions", {"new_shape": [n, c]}))
        self.cur, self.shape = flat, [n, c]
        wt, ws = self._filter((classes, c), c, 0)
        if self.q8 and ws is not None and len(ws) > 1:  # NNAPI FC weights are per-tensor
            wt, ws = self._per_tensor_fc(classes, c)
        bias = self._bias(classes, ws)
        logits, _ = self._tensor("logits", [n, classes], scale=0.1)
        self.b.add_operator("FULLY_CONNECTED", [self.cur, wt, bias], [logits], ("FullyConnectedOptions", {
            "fused_activation_function": Act.NONE}))
        zp_out = {np.dtype(np.uint8): 0, np.dtype(np.int8): -128}.get(self.dtype, 0)
        probs, _ = self._tensor("probs", [n, classes], scale=1.0 / 256, zp=zp_out)
        self.b.add_operator("SOFTMAX", [logits], [probs], ("SoftmaxOptions", {"beta": 1.0}))
        self.b.set_outputs([probs])
        return self

    def swish(self):
        """x * sigmoid(x): LOGISTIC (NNAPI's fixed output quantization) then MUL."""
        n_zp = {np.dtype(np.uint8): 0, np.dtype(np.int8): -128}.get(self.dtype, 0)
        sig, _ = self._tensor("sigmoid", list(self.shape), scale=1.0 / 256, zp=n_zp)
        self.b.add_operator("LOGISTIC", [self.cur], [sig])
        out, scale = self._tensor("swish", list(self.shape), scale=self.scale)
        self.b.add_operator("MUL", [self.cur, sig], [out], ("MulOptions", {"fused_activation_function": Act.NONE}))
        self.cur, self.scale = out, scale
        return self

    def squeeze_excite(self, reduced: int):
        """Squeeze-and-excite: spatial MEAN, 1x1 reduce + swish, 1x1 expand, sigmoid gate, MUL."""
        src, shape, scale = self.cur, list(self.shape), self.scale
        n, _, _, c = shape
        axes = self.b.add_constant(self._name("axes"), np.array([1, 2], np.int32))
        pooled, _ = self._tensor("se_mean", [n, 1, 1, c], scale=scale)  # NNAPI MEAN keeps the quantization
        self.b.add_operator("MEAN", [src, axes], [pooled], ("ReducerOptions", {"keep_dims": True}))
        self.cur, self.shape = pooled, [n, 1, 1, c]
        self.conv(reduced, k=1, act=Act.NONE).swish().conv(c, k=1, act=Act.NONE)
        n_zp = {np.dtype(np.uint8): 0, np.dtype(np.int8): -128}.get(self.dtype, 0)
        gate, _ = self._tensor("se_gate", [n, 1, 1, c], scale=1.0 / 256, zp=n_zp)
        self.b.add_operator("LOGISTIC", [self.cur], [gate])
        out, _ = self._tensor("se_out", shape, scale=scale)
        self.b.add_operator("MUL", [src, gate], [out], ("MulOptions", {"fused_activation_function": Act.NONE}))
        self.cur, self.shape, self.scale = out, shape, scale
        return self

    def mbconv(self, out_c, expand, k, stride, se_ratio=0.25):
        """EfficientNet's MBConv: expand 1x1 + swish, k x k depthwise + swish, squeeze-excite,
        project 1x1, residual ADD when the shape is kept."""
        src, src_shape, src_scale = self.cur, list(self.shape), self.scale
        in_c = src_shape[3]
        if expand != 1:
            self.conv(in_c * expand, k=1, act=Act.NONE).swish()
        self.depthwise(k=k, stride=stride, act=Act.NONE).swish()
        self.squeeze_excite(max(1, int(in_c * se_ratio)))
        self.conv(out_c, k=1, act=Act.NONE)
        if stride == 1 and in_c == out_c:
            out, scale = self._tensor("add", list(self.shape), scale=max(self.scale, src_scale) * 1.5)
            self.b.add_operator("ADD", [self.cur, src], [out], ("AddOptions", {"fused_activation_function": Act.NONE}))
            self.cur, self.scale = out, scale
        return self

    def _per_tensor_fc(self, classes, c):
        w = self.rng.normal(0, np.sqrt(2.0 / c), (classes, c)).astype(np.float32)
        s = np.float32(max(np.abs(w).max(), 1e-6) / 127.0)
        q = np.clip(np.round(w / s), -127, 127).astype(np.int8)
        return self.b.add_constant(self._name("w"), q, scale=float(s), zero_point=0), np.array([s], np.float32)

    def build(self) -> bytes:
        return self.b.build()


def mobilenet_like(dtype=np.float32, input_size: int = 32, width: int = 8, classes: int = 10,
                   seed: int = 0) -> bytes:
    """A small MobileNet-style model: 16 nodes, runs in milliseconds."""
    net = _Net(dtype, [1, input_size, input_size, 3], seed)
    net.conv(width, stride=2).depthwise().conv(width * 2, k=1)
    net.inverted_residual(width * 2, expand=2, stride=1)
    net.inverted_residual(width * 3, expand=2, stride=2)
    return net.head(classes).build()


#: MobileNetV2 (Sandler et al. 2018): (expansion t, channels c, repeats n, first stride s)
_V2 = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]


def mobilenet_v2(dtype=np.float32, input_size: int = 224, classes: int = 1000, seed: int = 0) -> bytes:
    """MobileNetV2 at width 1.0: ~3.5 M parameters, 65 operators."""
    net = _Net(dtype, [1, input_size, input_size, 3], seed)
    net.conv(32, stride=2)
    for t, c, n, s in _V2:
        for i in range(n):
            net.inverted_residual(c, expand=t, stride=s if i == 0 else 1)
    net.conv(1280, k=1)
    return net.head(classes).build()


#: EfficientNet-B0 (Tan & Le 2019): (expansion, channels, repeats, first stride, kernel)
_B0 = [(1, 16, 1, 1, 3), (6, 24, 2, 2, 3), (6, 40, 2, 2, 5), (6, 80, 3, 2, 3), (6, 112, 3, 1, 5),
       (6, 192, 4, 2, 5), (6, 320, 1, 1, 3)]


def efficientnet_b0(dtype=np.float32, input_size: int = 224, classes: int = 1000, seed: int = 0) -> bytes:
    """EfficientNet-B0's layer table (MBConv with swish and squeeze-excite, 5x5 depthwise): ~5.3 M
    parameters. Quantized, every op is one NNAPI defines (MEAN keeps its input's quantization)."""
    net = _Net(dtype, [1, input_size, input_size, 3], seed)
    net.conv(32, stride=2, act=Act.NONE).swish()
    for t, c, n, s, k in _B0:
        for i in range(n):
            net.mbconv(c, expand=t, k=k, stride=s if i == 0 else 1)
    net.conv(1280, k=1, act=Act.NONE).swish()
    return net.head(classes).build()


#: BlazeFace's front model (Bazarevsky et al. 2019): (channels, stride) of each BlazeBlock.
_BLAZE = [(24, 1), (28, 1), (32, 2), (36, 1), (42, 1), (48, 2), (56, 1), (64, 1), (72, 1), (80, 1), (88, 1),
          (96, 2), (96, 1), (96, 1), (96, 1)]


def blazeface_like(dtype=np.float32, input_size: int = 128, seed: int = 0) -> bytes:
    """A BlazeFace-style face detector: 5x5 conv stem, BlazeBlocks (5x5 depthwise, 1x1 projection,
    residual ADD + ReLU; max-pooled and channel-padded shortcuts), and SSD heads at 16x16 and 8x8
    whose boxes and scores are reshaped and concatenated: outputs [1, 896, 16] regressors and
    [1, 896, 1] scores (for a 128 input; ``input_size`` a multiple of 16), as MediaPipe's
    face_detection_short_range. float32, or int8 (per-channel filters) / uint8 (per-tensor): the
    shortcuts' MAX_POOL and PAD and the heads' RESHAPE and CONCATENATION keep their inputs'
    quantization, each ADD has one of its own."""
    if np.dtype(dtype) not in (np.dtype(np.float32), np.dtype(np.int8), np.dtype(np.uint8)):
        raise ValueError("blazeface_like is float32, int8 or uint8")
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




def _blaze_block(net: _Net, out_c: int, stride: int) -> None:
    """5x5 depthwise (stride), 1x1 conv to ``out_c``, + shortcut (2x2 max pool when strided,
    zero channels PADded when widening: quantized, the block input's quantization, PAD filling
    with its zero point), ReLU fused into the ADD."""
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


# ---- MediaPipe-style landmark networks (float32, per-channel PReLU activations) ------------------

def _prelu(net: _Net) -> None:
    """Per-channel PRELU (alpha [1, 1, C], as MediaPipe's converted landmark models carry it)."""
    b, c = net.b, net.shape[3]
    alpha = b.add_constant(net._name("alpha"), net.rng.uniform(0.05, 0.3, (1, 1, c)).astype(np.float32))
    out = b.add_tensor(net._name("prelu"), list(net.shape), np.float32)
    b.add_operator("PRELU", [net.cur, alpha], [out])
    net.cur = out


def _widen(net: _Net, src: int, shape: list[int], out_c: int, concat: bool) -> int:
    """``src`` ([n, h, w, c]) with zero channels appended up to ``out_c``: a PAD, or a
    CONCATENATION with a constant zero tensor (both forms occur in MediaPipe's graphs)."""
    b = net.b
    n, h, w, c = shape
    out = b.add_tensor(net._name("widen"), [n, h, w, out_c], np.float32)
    if concat:
        zeros = b.add_constant(net._name("zeros"), np.zeros((n, h, w, out_c - c), np.float32))
        b.add_operator("CONCATENATION", [src, zeros], [out], ("ConcatenationOptions", {
            "axis": 3, "fused_activation_function": Act.NONE}))
    else:
        pads = b.add_constant(net._name("paddings"), np.array([[0, 0], [0, 0], [0, 0], [0, out_c - c]], np.int32))
        b.add_operator("PAD", [src, pads], [out])
    return out


def _prelu_block(net: _Net, out_c: int | None = None, stride: int = 1, concat: bool = False) -> None:
    """A landmark-network residual block: 3x3 depthwise (stride), 1x1 conv, + shortcut (2x2 max
    pool when strided, zero channels appended when widening), then per-channel PRELU."""
    b = net.b
    src, shape = net.cur, list(net.shape)
    n, _, _, c = shape
    out_c = out_c or c
    net.depthwise(k=3, stride=stride, act=Act.NONE).conv(out_c, k=1, act=Act.NONE)
    oh, ow = net.shape[1], net.shape[2]
    if stride == 2:
        pooled = b.add_tensor(net._name("maxpool"), [n, oh, ow, c], np.float32)
        b.add_operator("MAX_POOL_2D", [src], [pooled], ("Pool2DOptions", {
            "padding": Padding.SAME, "stride_w": 2, "stride_h": 2, "filter_width": 2, "filter_height": 2,
            "fused_activation_function": Act.NONE}))
        src = pooled
    if out_c > c:
        src = _widen(net, src, [n, oh, ow, c], out_c, concat)
    out = b.add_tensor(net._name("add"), [n, oh, ow, out_c], np.float32)
    b.add_operator("ADD", [net.cur, src], [out], ("AddOptions", {"fused_activation_function": Act.NONE}))
    net.cur = out
    _prelu(net)


def _head(net: _Net, src: int, shape: list[int], units: int, name: str) -> int:
    """A landmark head: conv with a kernel the size of the feature map (VALID) to [1, 1, 1, units]."""
    b = net.b
    n, h, w, c = shape
    wt, _ = net._filter((units, h, w, c), h * w * c, 0)
    bias = net._bias(units, None)
    out = b.add_tensor(net._name(name), [n, 1, 1, units], np.float32)
    b.add_operator("CONV_2D", [src, wt, bias], [out], ("Conv2DOptions", {
        "padding": Padding.VALID, "stride_w": 1, "stride_h": 1, "fused_activation_function": Act.NONE,
        "dilation_w_factor": 1, "dilation_h_factor": 1}))
    return out


#: Face-mesh-style stages: (channels, blocks after the downsampling one) at 48, 24, 12, 6, 3.
_FACE = [(32, 1), (64, 1), (128, 1), (128, 1), (128, 1)]


def face_landmark_like(input_size: int = 192, seed: int = 0) -> bytes:
    """A face-landmark-style network (MediaPipe face mesh's shape, float32): 3x3/2 conv + PReLU
    stem, PReLU residual blocks with 3x3 depthwise, 2x2 max-pool downsampling and zero channels
    PADded (or CONCATENATED) onto the shortcut, then two heads on the 3x3 map: [1, 1, 1, 1404]
    landmarks (468 x 3) and a [1, 1, 1, 1] face score."""
    net = _Net(np.float32, [1, input_size, input_size, 3], seed)
    net.conv(16, stride=2, act=Act.NONE)
    _prelu(net)
    _prelu_block(net)
    _prelu_block(net)
    for k, (c, repeats) in enumerate(_FACE):
        _prelu_block(net, c, stride=2, concat=k % 2 == 1)
        for _ in range(repeats):
            _prelu_block(net)
    src, shape = net.cur, list(net.shape)
    landmarks = _head(net, src, shape, 1404, "landmarks")
    score = _head(net, src, shape, 1, "score")
    net.b.set_outputs([landmarks, score])
    return net.build()


def iris_landmark_like(input_size: int = 64, seed: int = 0) -> bytes:
    """An iris-landmark-style network (MediaPipe iris's shape, float32): conv + PReLU stem to 64
    channels at half size, PReLU residual blocks down to 4x4 with 128 channels, then two branches
    (their own blocks) ending in [1, 1, 1, 213] eye-contour and [1, 1, 1, 15] iris landmarks."""
    net = _Net(np.float32, [1, input_size, input_size, 3], seed)
    net.conv(64, stride=2, act=Act.NONE)
    _prelu(net)
    for _ in range(4):
        _prelu_block(net)
    _prelu_block(net, 128, stride=2)
    _prelu_block(net)
    _prelu_block(net, stride=2)
    _prelu_block(net)
    trunk, shape = net.cur, list(net.shape)
    outputs = []
    for units, name in ((213, "contour"), (15, "iris")):
        net.cur, net.shape = trunk, list(shape)
        _prelu_block(net, stride=2)
        _prelu_block(net)
        outputs.append(_head(net, net.cur, list(net.shape), units, name))
    net.b.set_outputs(outputs)
    return net.build()


def mlp(inputs: int = 256, hidden: int = 512, outputs: int = 10, seed: int = 0) -> bytes:
    """A 3-layer float32 perceptron: FULLY_CONNECTED + RELU twice, then FULLY_CONNECTED to the
    outputs (so small that per-invoke overhead, not arithmetic, is its time)."""
    net = _Net(np.float32, [1, inputs], seed)
    b = net.b
    for units, act in ((hidden, Act.RELU), (hidden, Act.RELU), (outputs, Act.NONE)):
        wt, _ = net._filter((units, net.shape[1]), net.shape[1], 0)
        bias = net._bias(units, None)
        out = b.add_tensor(net._name("fc"), [1, units], np.float32)
        b.add_operator("FULLY_CONNECTED", [net.cur, wt, bias], [out], ("FullyConnectedOptions", {
            "fused_activation_function": act}))
        net.cur, net.shape = out, [1, units]
    b.set_outputs([net.cur])
    return net.build()


def _relu6_block(net: _Net, out_c: int, stride: int = 1) -> None:
    """3x3 depthwise (stride), 1x1 conv to ``out_c``, + shortcut (2x2 max pool when strided, zero
    channels PADded when widening), RELU6 fused into the ADD."""
    b = net.b
    src, (n, _, _, c) = net.cur, list(net.shape)
    net.depthwise(k=3, stride=stride, act=Act.NONE).conv(out_c, k=1, act=Act.NONE)
    oh, ow = net.shape[1], net.shape[2]
    if stride == 2:
        pooled = b.add_tensor(net._name("maxpool"), [n, oh, ow, c], np.float32)
        b.add_operator("MAX_POOL_2D", [src], [pooled], ("Pool2DOptions", {
            "padding": Padding.SAME, "stride_w": 2, "stride_h": 2, "filter_width": 2, "filter_height": 2,
            "fused_activation_function": Act.NONE}))
        src = pooled
    if out_c > c:
        src = _widen(net, src, [n, oh, ow, c], out_c, concat=False)
    out = b.add_tensor(net._name("add"), [n, oh, ow, out_c], np.float32)
    b.add_operator("ADD", [net.cur, src], [out], ("AddOptions", {"fused_activation_function": Act.RELU6}))
    net.cur = out


def _upsample_add(net: _Net, skip: int, skip_shape: list[int]) -> None:
    """2x bilinear upsampling (half-pixel centers) of the current map, + a 1x1 projection of the
    encoder's ``skip`` map at that size, RELU6."""
    b = net.b
    n, h, w, c = net.shape
    size = b.add_constant(net._name("size"), np.array([2 * h, 2 * w], np.int32))
    up = b.add_tensor(net._name("upsample"), [n, 2 * h, 2 * w, c], np.float32)
    b.add_operator("RESIZE_BILINEAR", [net.cur, size], [up], ("ResizeBilinearOptions", {
        "align_corners": False, "half_pixel_centers": True}))
    net.cur, net.shape = skip, list(skip_shape)
    net.conv(c, k=1, act=Act.NONE)
    out = b.add_tensor(net._name("add"), [n, 2 * h, 2 * w, c], np.float32)
    b.add_operator("ADD", [up, net.cur], [out], ("AddOptions", {"fused_activation_function": Act.RELU6}))
    net.cur = out


def pose_landmark_like(input_size: int = 256, seed: int = 0) -> bytes:
    """A pose-landmark-style network (BlazePose's shape, float32, input a multiple of 64): an
    encoder of residual blocks (3x3 depthwise, max-pooled and channel-padded shortcuts) down to
    1/32, a decoder of 2x RESIZE_BILINEAR upsamplings added to projected encoder maps up to 1/8,
    and a second encoder from there to the heads: [1, 1, 1, 195] landmarks (39 x 5) and a
    [1, 1, 1, 1] pose score."""
    net = _Net(np.float32, [1, input_size, input_size, 3], seed)
    net.conv(24, stride=2)
    _relu6_block(net, 24)
    skips = {}
    for c in (48, 96, 192, 192):
        _relu6_block(net, c, stride=2)
        _relu6_block(net, c)
        skips[net.shape[1]] = (net.cur, list(net.shape))
    net.conv(48, k=1, act=Act.NONE)
    for _ in range(2):
        _upsample_add(net, *skips[2 * net.shape[1]])
    for c in (96, 192, 192, 192):
        _relu6_block(net, c, stride=2)
        _relu6_block(net, c)
    src, shape = net.cur, list(net.shape)
    landmarks = _head(net, src, shape, 195, "landmarks")
    score = _head(net, src, shape, 1, "score")
    net.b.set_outputs([landmarks, score])
    return net.build()
