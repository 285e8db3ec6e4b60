"""Convolution + residual add + ReLU/ReLU6 as one cuDNN call on a GPU.

A captured CUDA graph still runs each operator as its own kernel, and on small feature maps the
kernels are short: the gaps between them and the bias pass cuDNN's plain convolution leaves to a
separate kernel cost as much as the arithmetic. cuDNN's fused convolution computes
``relu(conv(x, w) + z + bias)`` in one call (torch's ``cudnn_convolution_add_relu``, and
``cudnn_convolution_relu`` without z), so a Conv whose result only feeds an Add whose result
only feeds a Relu or a Clip(0, max), or a Conv that only feeds the activation, becomes one step
(a Clip's upper bound is one clamp after it). The rewrite reads the ONNX graph the lowerings made;
NNAPI's semantics stay in the lowerings.

Only ungrouped 2-D convolutions fuse (torch's own depthwise kernel already adds its bias), and
only in float32 programs: in float16 the fused call was slower than the operators apart. Measured
on a lent H200, a partition bound to page-locked slots, p50 per execution, apart -> fused:
BlazeFace-style 322 -> 273 us, pose-landmark-style 521-550 -> 489, MobileNetV2 735-765 -> 696-736,
EfficientNet-B0 and the PReLU face network level; float16 pose 540 -> 623, BlazeFace 315 -> 372.
The fused step checks z's shape and falls back to the unfused operators if cuDNN refuses the
fused call (that happens in the runs before the capture, so the captured graph holds whichever
works).
"""
from __future__ import annotations

import logging
from collections import Counter

import numpy as np
import onnx
import torch
import torch.nn.functional as F
from onnx import helper

from hal.backends.cuda.ops_nn import _even, _spatial
from hal.backends.cuda.program import Node, operator

log = logging.getLogger(__name__)

#: The domain of the fused nodes the rewrite makes (the program runs them like ONNX ones).
DOMAIN = "nnhal.cuda"
#: Whether the backend fuses float32 programs on a GPU (off: to compare).
ENABLED = True


def rewrite(nodes: list[onnx.NodeProto], values: dict[str, np.ndarray], outputs: set[str]) -> list[onnx.NodeProto]:
    """``nodes`` with each Conv [-> Add] -> Relu/Clip(0, max) chain as one ConvAddRelu node, placed
    where the activation was (every input it reads exists by then)."""
    uses = Counter(name for n in nodes for name in n.input if name)
    by_input: dict[str, int] = {}
    for k, n in enumerate(nodes):
        for name in n.input:
            by_input.setdefault(name, k)

    def only_use(name: str) -> int | None:
        """The node that alone reads ``name`` (None where several do, or it is a graph output)."""
        return by_input.get(name) if uses[name] == 1 and name not in outputs else None

    replaced: dict[int, onnx.NodeProto] = {}
    dropped: set[int] = set()
    for k, conv in enumerate(nodes):
        if conv.op_type != "Conv" or conv.domain not in ("", "ai.onnx") or not _fusable(conv, values):
            continue
        nxt = only_use(conv.output[0])
        z = None
        if nxt is not None and nodes[nxt].op_type == "Add" and len(nodes[nxt].input) == 2:
            add = nodes[nxt]
            z = add.input[1] if add.input[0] == conv.output[0] else add.input[0]
            if z == conv.output[0]:
                continue
            act_at = only_use(add.output[0])
        else:
            act_at, nxt = nxt, None
        if act_at is None or act_at in replaced:
            continue
        high = _relu_bound(nodes[act_at], values)
        if high is False:
            continue
        inputs = list(conv.input) + [""] * (3 - len(conv.input)) + ([z] if z is not None else [])
        fused = helper.make_node("ConvAddRelu", inputs, [nodes[act_at].output[0]], domain=DOMAIN,
                                 name=f"{conv.name or conv.output[0]}_fused")
        fused.attribute.extend(conv.attribute)
        if high is not None:
            fused.attribute.append(helper.make_attribute("clip_max", float(high)))
        replaced[act_at] = fused
        dropped.add(k)
        if nxt is not None:
            dropped.add(nxt)
    return [replaced.get(k, n) for k, n in enumerate(nodes) if k not in dropped]


def _fusable(conv: onnx.NodeProto, values: dict[str, np.ndarray]) -> bool:
    w = values.get(conv.input[1]) if len(conv.input) > 1 else None
    group = next((a.i for a in conv.attribute if a.name == "group"), 1)
    return w is not None and w.ndim == 4 and group == 1


def _relu_bound(act: onnx.NodeProto, values: dict[str, np.ndarray]):
    """None for Relu or Clip(0, no max), the max of a Clip(0, max), False for anything else."""
    if act.domain not in ("", "ai.onnx"):
        return False
    if act.op_type == "Relu":
        return None
    if act.op_type != "Clip":
        return False
    named = [k < len(act.input) and bool(act.input[k]) for k in (1, 2)]
    bounds = [_scalar(values.get(act.input[k])) if named[k - 1] else None for k in (1, 2)]
    if any(n and b is None for n, b in zip(named, bounds)) or bounds[0] != 0.0:
        return False  # a computed bound, or not clipped at 0 below
    return bounds[1]


def _scalar(value: np.ndarray | None) -> float | None:
    """A constant bound (a one-element array of any rank) as a float; None where not constant."""
    return None if value is None or np.size(value) != 1 else float(np.asarray(value).reshape(-1)[0])


@operator("ConvAddRelu", domain=DOMAIN)
def _conv_add_relu(node: Node):
    _, strides, dilations, pads = _spatial(node, 2)
    uneven, padding = _even(pads)
    high = node.attr("clip_max")
    state = {"fused": True}

    def unfused(x, w, b, z):
        y = F.conv2d(x, w, b, strides, padding, dilations)
        if z is not None:
            y = y + z
        return torch.clamp(y, 0.0, high) if high is not None else torch.relu(y)

    def run(x, w, b=None, z=None):
        if uneven is not None:
            x = F.pad(x, uneven)
        if state["fused"] and x.is_cuda:
            try:
                if z is None:
                    y = torch.cudnn_convolution_relu(x, w, b, strides, padding, dilations, 1)
                elif z.shape == _out_shape(x, w, strides, padding, dilations):
                    y = torch.cudnn_convolution_add_relu(x, w, z, 1.0, b, strides, padding, dilations, 1)
                else:
                    return unfused(x, w, b, z)
                return y.clamp_max_(high) if high is not None else y
            except RuntimeError as e:
                log.info("cuda backend: cuDNN's fused convolution refused (%s); unfused", str(e)[:200])
                state["fused"] = False
        return unfused(x, w, b, z)
    return run


def _out_shape(x: torch.Tensor, w: torch.Tensor, strides, padding, dilations) -> torch.Size:
    spatial = [(x.shape[2 + k] + 2 * padding[k] - dilations[k] * (w.shape[2 + k] - 1) - 1) // strides[k] + 1
               for k in range(2)]
    return torch.Size([x.shape[0], w.shape[0], *spatial])
