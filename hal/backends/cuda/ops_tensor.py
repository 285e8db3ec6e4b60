"""ONNX data-movement operators on torch (opset 17): shapes, slices, gathers, pads, depth/space.
Parameters ONNX takes as inputs (Reshape's shape, Slice's starts, Pad's pads, ...) must be
initializers, as the lowerings make them: they are read once, when the program is built."""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from hal.backends.cuda.program import Node, Unsupported, operator, per_shape


def _ints(node: Node, i: int, what: str) -> list[int] | None:
    value = node.required_const(i, what)
    return None if value is None else [int(v) for v in np.asarray(value).reshape(-1)]


@operator("Transpose")
def _transpose(node: Node):
    perm = node.attr("perm")
    if perm is None:
        return lambda x: x.permute(*reversed(range(x.dim())))
    perm = [int(p) for p in perm]
    return lambda x: x.permute(*perm)


@operator("Reshape")
def _reshape(node: Node):
    shape = _ints(node, 1, "shape")
    if shape is None:
        raise Unsupported("Reshape without a shape")
    allowzero = bool(node.attr("allowzero", 0))

    def reshape(x, _shape):
        # ONNX: 0 copies the input's dimension (unless allowzero), -1 is inferred
        dims = [x.shape[k] if d == 0 and not allowzero else d for k, d in enumerate(shape)]
        return x.reshape(dims)
    return reshape


@operator("Concat")
def _concat(node: Node):
    axis = int(node.attr("axis"))
    return lambda *xs: torch.cat(xs, axis)


@operator("Split")
def _split(node: Node):
    axis, count = int(node.attr("axis", 0)), len(node.proto.output)
    sizes = _ints(node, 1, "split")

    def split(x, _sizes=None):
        n = x.shape[axis]
        parts = sizes if sizes is not None else [-(-n // count)] * (count - 1) + [n - -(-n // count) * (count - 1)]
        return tuple(torch.split(x, parts, axis))
    return split


def _positions(n: int, start: int, end: int, step: int) -> np.ndarray:
    """ONNX Slice's indices along an axis of length n: Python's slice clamps starts and ends as
    ONNX says (an end below -n with a negative step runs through index 0)."""
    return np.arange(n)[start:end:step]


@operator("Slice")
def _slice(node: Node):
    starts, ends = _ints(node, 1, "starts"), _ints(node, 2, "ends")
    axes, steps = _ints(node, 3, "axes"), _ints(node, 4, "steps")
    if starts is None or ends is None:
        raise Unsupported("Slice without starts and ends")
    axes = axes if axes is not None else list(range(len(starts)))
    steps = steps if steps is not None else [1] * len(starts)

    @per_shape
    def plan(x) -> list:
        # per axis: ('narrow', start, length) for a unit step, ('index', positions on x's device) otherwise
        shape, out = tuple(x.shape), []
        for a, s, e, st in zip(axes, starts, ends, steps):
            a %= len(shape)
            n = shape[a]
            if st == 0:
                raise Unsupported("Slice with a zero step")
            if st == 1:
                s, e = (s + n if s < 0 else s), (e + n if e < 0 else e)
                s, e = min(max(s, 0), n), min(max(e, 0), n)
                out.append((a, "narrow", s, max(e - s, 0)))
            else:
                index = torch.as_tensor(np.ascontiguousarray(_positions(n, s, e, st)), device=x.device)
                out.append((a, "index", index))
        return out

    def slice_(x, *_):
        for a, kind, *rest in plan(x):
            x = x.narrow(a, rest[0], rest[1]) if kind == "narrow" else x.index_select(a, rest[0])
        return x
    return slice_


@operator("Gather")
def _gather(node: Node):
    axis = int(node.attr("axis", 0))
    constant = node.const(1)

    @per_shape
    def placed(x) -> torch.Tensor:  # constant indices, made non-negative, on x's device
        n = x.shape[axis % x.dim()]
        return torch.as_tensor(np.where(constant < 0, constant + n, constant).astype(np.int64), device=x.device)

    def gather(x, indices):
        a = axis % x.dim()
        if constant is not None:
            idx = placed(x)
        else:
            idx = indices.to(torch.int64)
            idx = torch.where(idx < 0, idx + x.shape[a], idx)
        out = x.index_select(a, idx.reshape(-1))
        return out.reshape(*x.shape[:a], *idx.shape, *x.shape[a + 1:])
    return gather


@operator("Tile")
def _tile(node: Node):
    repeats = _ints(node, 1, "repeats")
    if repeats is None:
        raise Unsupported("Tile without repeats")
    return lambda x, _r: x.repeat(*repeats)


@operator("Pad")
def _pad(node: Node):
    pads = _ints(node, 1, "pads")
    if pads is None:
        raise Unsupported("Pad without pads")
    if len(node.proto.input) > 3 and node.proto.input[3]:
        raise Unsupported("Pad with axes")
    mode = node.attr("mode", b"constant")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    fill = node.const(2)
    rank = len(pads) // 2
    begins, ends = pads[:rank], pads[rank:]
    if mode == "constant":
        torch_pads = [p for k in reversed(range(rank)) for p in (begins[k], ends[k])]
        value = 0.0 if fill is None or fill.size == 0 else float(fill.reshape(-1)[0])
        return lambda x, *_: F.pad(x, torch_pads, value=value)
    if mode not in ("reflect", "edge"):
        raise Unsupported(f"Pad mode {mode}")

    def positions(n: int, begin: int, end: int) -> np.ndarray:
        # a negative pad removes elements (ONNX; onnxruntime crops them before it pads, so a
        # reflection mirrors the cropped axis), a positive one pads by numpy's reflect / edge
        kept = np.arange(n)[max(-begin, 0):n - max(-end, 0)]
        return np.pad(kept, (max(begin, 0), max(end, 0)), mode=mode)

    @per_shape
    def plan(x) -> list:
        return [(k, torch.as_tensor(positions(x.shape[k], begins[k], ends[k]), device=x.device))
                for k in range(rank) if begins[k] or ends[k]]

    def pad(x, *_):
        # reflect / edge along each padded axis as one index_select with numpy's positions
        for k, idx in plan(x):
            x = x.index_select(k, idx)
        return x
    return pad


@operator("DepthToSpace")
def _depth_to_space(node: Node):
    b = int(node.attr("blocksize"))
    mode = node.attr("mode", b"DCR")
    mode = mode.decode() if isinstance(mode, bytes) else mode

    def depth_to_space(x):
        n, c, h, w = x.shape
        if mode == "DCR":
            y = x.reshape(n, b, b, c // (b * b), h, w).permute(0, 3, 4, 1, 5, 2)
        else:  # CRD
            y = x.reshape(n, c // (b * b), b, b, h, w).permute(0, 1, 4, 2, 5, 3)
        return y.reshape(n, c // (b * b), h * b, w * b)
    return depth_to_space


@operator("SpaceToDepth")
def _space_to_depth(node: Node):
    b = int(node.attr("blocksize"))

    def space_to_depth(x):
        n, c, h, w = x.shape
        y = x.reshape(n, c, h // b, b, w // b, b).permute(0, 3, 5, 1, 2, 4)
        return y.reshape(n, c * b * b, h // b, w // b)
    return space_to_depth


@operator("TopK")
def _topk(node: Node):
    k = _ints(node, 1, "k")
    if k is None:
        raise Unsupported("TopK without k")
    axis, largest = int(node.attr("axis", -1)), bool(node.attr("largest", 1))

    def topk(x, _k):
        # a stable sort: of equal values the lower index comes first, as ONNX and NNAPI say
        values, indices = torch.sort(x, dim=axis, descending=largest, stable=True)
        return values.narrow(axis, 0, k[0]), indices.narrow(axis, 0, k[0])
    return topk
