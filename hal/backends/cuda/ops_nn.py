"""ONNX neural-network operators on torch (opset 17): convolutions, pools, normalisations, GEMMs.
ONNX pads are (begin..., end...) per spatial axis and may differ; torch pads both sides alike, so
an uneven pad is applied as its own F.pad first (zeros for a convolution and an average, -inf for
a max pool) and the operator runs unpadded."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from hal.backends.cuda.program import Node, Unsupported, operator, per_shape


def _spatial(node: Node, rank: int) -> tuple[list[int], list[int], list[int], list[int]]:
    """(kernel_shape, strides, dilations, pads as ONNX gives it) of a conv / pool node."""
    auto_pad = node.attr("auto_pad", b"NOTSET")
    if (auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad) != "NOTSET":
        raise Unsupported(f"{node.op_type}: auto_pad")
    kernel = [int(k) for k in node.attr("kernel_shape", [])]
    strides = [int(s) for s in node.attr("strides", [1] * rank)]
    dilations = [int(d) for d in node.attr("dilations", [1] * rank)]
    pads = [int(p) for p in node.attr("pads", [0] * (2 * rank))]
    return kernel, strides, dilations, pads


def _even(pads: list[int]) -> tuple[list[int] | None, list[int]]:
    """(torch F.pad list for the uneven part or None, the symmetric padding left to the operator)."""
    rank = len(pads) // 2
    begins, ends = pads[:rank], pads[rank:]
    if begins == ends:
        return None, begins
    return [p for k in reversed(range(rank)) for p in (begins[k], ends[k])], [0] * rank


_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
_CONV_T = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}


def _rank(node: Node) -> int:
    """The spatial rank of a convolution (from its kernel_shape, else its constant filter)."""
    kernel, weight = node.attr("kernel_shape"), node.const(1)
    rank = len(kernel) if kernel else (weight.ndim - 2 if weight is not None else 0)
    if rank not in _CONV:
        raise Unsupported(f"{node.op_type} over {rank} spatial axes")
    return rank


@operator("Conv")
def _conv(node: Node):
    rank = _rank(node)
    _, strides, dilations, pads = _spatial(node, rank)
    group = int(node.attr("group", 1))
    uneven, padding = _even(pads)
    conv = _CONV[rank]

    def run(x, w, b=None):
        if uneven is not None:
            x = F.pad(x, uneven)
        return conv(x, w, b, strides, padding, dilations, group)
    return run


@operator("ConvTranspose")
def _conv_transpose(node: Node):
    rank = _rank(node)
    if node.attr("output_shape") is not None:
        raise Unsupported("ConvTranspose with output_shape")
    _, strides, dilations, pads = _spatial(node, rank)
    extra = [int(p) for p in node.attr("output_padding", [0] * rank)]
    group = int(node.attr("group", 1))
    begins, ends = pads[:rank], pads[rank:]
    conv_t = _CONV_T[rank]

    def run(x, w, b=None):
        # the full transposed convolution, then ONNX's output_padding (zeros at the end) and pads
        # (cropped from each side); the bias goes on every output position, the padded ones too
        y = conv_t(x, w, None, strides, 0, 0, group, dilations)
        if any(extra):
            y = F.pad(y, [p for k in reversed(range(rank)) for p in (0, extra[k])])
        for k in range(rank):
            axis = 2 + k
            y = y.narrow(axis, begins[k], y.shape[axis] - begins[k] - ends[k])
        if b is not None:
            y = y + b.reshape(1, -1, *([1] * rank))
        return y
    return run


_POOL = {1: (F.avg_pool1d, F.max_pool1d), 2: (F.avg_pool2d, F.max_pool2d), 3: (F.avg_pool3d, F.max_pool3d)}


@operator("AveragePool", "MaxPool")
def _pool(node: Node):
    kernel, strides, dilations, pads = _spatial(node, len(node.attr("kernel_shape", [])))
    rank = len(kernel)
    if rank not in _POOL or node.attr("ceil_mode", 0):
        raise Unsupported(f"{node.op_type}: {rank} spatial axes or ceil_mode")
    average, maximum = _POOL[rank]
    if node.op_type == "MaxPool":
        if len(node.proto.output) > 1:
            raise Unsupported("MaxPool's indices output")
        uneven, padding = _even(pads)
        if uneven is None and any(2 * p > k for p, k in zip(padding, kernel)):
            uneven, padding = [p for k in reversed(range(rank)) for p in (pads[k], pads[rank + k])], [0] * rank

        def max_pool(x):
            if uneven is not None:
                x = F.pad(x, uneven, value=float("-inf"))
            return maximum(x, kernel, strides, padding, dilations)
        return max_pool
    if any(d != 1 for d in dilations):
        raise Unsupported("AveragePool with dilations")
    include_pad = bool(node.attr("count_include_pad", 0))
    torch_pads = [p for k in reversed(range(rank)) for p in (pads[k], pads[rank + k])]
    window = 1
    for k in kernel:
        window *= k
    def window_sums(x):
        if rank == 1:  # avg_pool1d has no divisor_override
            return average(x, kernel, strides, 0, False, True) * window
        return average(x, kernel, strides, 0, False, True, 1)

    @per_shape
    def counts(x) -> torch.Tensor:  # how many of each window's positions lie in an input of x's shape
        return window_sums(F.pad(torch.ones((1, 1, *x.shape[2:]), dtype=x.dtype, device=x.device), torch_pads))

    def average_pool(x):
        # the sum over each window of the zero-padded input, divided by the window's size or by
        # how many of its positions lie in the input (count_include_pad=0): counts per shape
        sums = window_sums(F.pad(x, torch_pads) if any(torch_pads) else x)
        if include_pad or not any(torch_pads):
            return sums / window
        return sums / counts(x)
    return average_pool


@operator("GlobalAveragePool")
def _global_average_pool(node: Node):
    return lambda x: torch.mean(x, tuple(range(2, x.dim())), keepdim=True)


@operator("LRN")
def _lrn(node: Node):
    size = int(node.attr("size"))
    alpha, beta, bias = float(node.attr("alpha", 1e-4)), float(node.attr("beta", 0.75)), float(node.attr("bias", 1.0))
    before, after = (size - 1) // 2, size - 1 - (size - 1) // 2  # ONNX: floor((size-1)/2) before, ceil after

    def lrn(x):
        dtype = x.dtype
        # the window sums in float32 (a float16 program too: torch's CPU pools take no float16)
        x = x.float() if x.dtype == torch.float16 else x
        squares = F.pad((x * x).unsqueeze(1), (0, 0) * (x.dim() - 2) + (before, after))  # channels as depth
        window = [size] + [1] * (x.dim() - 2)
        sums = (F.avg_pool3d if x.dim() == 4 else F.avg_pool2d)(squares, window, 1, 0, False, True, 1).squeeze(1)
        return (x / torch.pow(bias + (alpha / size) * sums, beta)).to(dtype)
    return lrn


@operator("InstanceNormalization")
def _instance_norm(node: Node):
    eps = float(node.attr("epsilon", 1e-5))
    return lambda x, scale, bias: F.instance_norm(x, weight=scale, bias=bias, eps=eps)


@operator("Gemm")
def _gemm(node: Node):
    alpha, beta = float(node.attr("alpha", 1.0)), float(node.attr("beta", 1.0))
    trans_a, trans_b = bool(node.attr("transA", 0)), bool(node.attr("transB", 0))

    def gemm(a, b, c=None):
        y = torch.matmul(a.t() if trans_a else a, b.t() if trans_b else b)
        if alpha != 1.0:
            y = y * alpha
        if c is not None:
            y = y + (c * beta if beta != 1.0 else c)
        return y
    return gemm


@operator("MatMul")
def _matmul(node: Node):
    return torch.matmul
