"""ONNX element-wise, comparison, activation and reduction operators on torch (ONNX opset 17
semantics: numpy broadcasting; ReduceSum's axes an input, the other reductions' an attribute)."""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from hal.backends.cuda.program import Node, Unsupported, operator


def _integer(t: torch.Tensor) -> bool:
    return not (t.is_floating_point() or t.dtype == torch.bool)


_BINARY = {
    "Add": torch.add, "Sub": torch.sub, "Mul": torch.mul, "Pow": torch.pow,
    "And": torch.logical_and, "Or": torch.logical_or, "Xor": torch.logical_xor,
    "Equal": torch.eq, "Greater": torch.gt, "GreaterOrEqual": torch.ge, "Less": torch.lt, "LessOrEqual": torch.le,
}


@operator(*_BINARY)
def _binary(node: Node):
    return _BINARY[node.op_type]


@operator("Div")
def _div(node: Node):
    def div(a, b):  # ONNX (as C): integer division truncates
        return torch.div(a, b, rounding_mode="trunc") if _integer(a) else torch.div(a, b)
    return div


@operator("Mod")
def _mod(node: Node):
    # fmod=0 (integers only): the remainder takes the divisor's sign; fmod=1: the dividend's (C fmod)
    return torch.fmod if node.attr("fmod", 0) else torch.remainder


@operator("Max", "Min")
def _extremum(node: Node):
    pick = torch.maximum if node.op_type == "Max" else torch.minimum

    def extremum(*xs):
        out = xs[0]
        for x in xs[1:]:
            out = pick(out, x)
        return out
    return extremum


_UNARY = {
    "Abs": torch.abs, "Neg": torch.neg, "Exp": torch.exp, "Log": torch.log, "Sqrt": torch.sqrt, "Sin": torch.sin,
    "Floor": torch.floor, "Reciprocal": torch.reciprocal, "Relu": torch.relu, "Sigmoid": torch.sigmoid,
    "Tanh": torch.tanh, "IsNaN": torch.isnan, "Not": torch.logical_not,
}


@operator(*_UNARY)
def _unary(node: Node):
    return _UNARY[node.op_type]


@operator("Identity")
def _identity(node: Node):
    return lambda x: x


@operator("IsInf")
def _isinf(node: Node):
    negative, positive = node.attr("detect_negative", 1), node.attr("detect_positive", 1)
    if negative and positive:
        return torch.isinf
    if positive:
        return torch.isposinf
    if negative:
        return torch.isneginf
    return lambda x: torch.zeros_like(x, dtype=torch.bool)


@operator("Elu")
def _elu(node: Node):
    alpha = float(node.attr("alpha", 1.0))
    return lambda x: F.elu(x, alpha)


@operator("HardSigmoid")
def _hard_sigmoid(node: Node):
    alpha, beta = float(node.attr("alpha", 0.2)), float(node.attr("beta", 0.5))
    return lambda x: torch.clamp(x * alpha + beta, 0.0, 1.0)


@operator("HardSwish")
def _hard_swish(node: Node):
    # ONNX: x * max(0, min(1, x / 6 + 0.5)); torch's hardswish is x * relu6(x + 3) / 6
    return lambda x: x * torch.clamp(x * (1.0 / 6.0) + 0.5, 0.0, 1.0)


@operator("PRelu")
def _prelu(node: Node):
    return lambda x, slope: torch.where(x < 0, x * slope, x)


@operator("Clip")
def _clip(node: Node):
    bounds = [_constant_bound(node, k) for k in (1, 2)]
    if all(b is not _COMPUTED for b in bounds):  # the lowerings' form: one clamp, one kernel
        if bounds == [None, None]:
            return lambda x, *_: x
        typed: dict[torch.dtype, tuple] = {}

        def clamp(x, *_):
            b = typed.get(x.dtype)
            if b is None:  # each bound in x's type, as the tensor form converts it (beyond float16: inf)
                b = typed[x.dtype] = tuple(None if v is None else torch.from_numpy(v).to(x.dtype).item()
                                           for v in bounds)
            return torch.clamp(x, *b)
        return clamp

    def clip(x, low=None, high=None):
        if low is not None:
            x = torch.maximum(x, low.to(x.dtype))
        if high is not None:
            x = torch.minimum(x, high.to(x.dtype))
        return x
    return clip


#: A Clip bound that is a computed input (not an initializer): clipped with tensors.
_COMPUTED = object()


def _constant_bound(node: Node, k: int):
    """Clip's bound ``k`` (a one-element array), None where it is omitted, _COMPUTED where computed."""
    if k >= len(node.proto.input) or not node.proto.input[k]:
        return None
    value = node.const(k)
    return _COMPUTED if value is None or value.size != 1 else np.array(value.reshape(()))


@operator("Where")
def _where(node: Node):
    return torch.where


@operator("Cast")
def _cast(node: Node):
    dtype = node.dtype(node.attr("to"))

    def cast(x):
        if x.is_floating_point() and not dtype.is_floating_point and dtype != torch.bool:
            # ONNX casts a float to an integer type as C does: toward zero (torch too, but say it)
            x = torch.trunc(x)
        return x.to(dtype)
    return cast


@operator("Softmax", "LogSoftmax")
def _softmax(node: Node):
    axis = int(node.attr("axis", -1))
    fn = torch.softmax if node.op_type == "Softmax" else torch.log_softmax
    return lambda x: fn(x, axis)


def _axes(node: Node) -> tuple[int, ...] | None:
    """The reduction's axes (None: every axis), from the attribute or, for ReduceSum, input 1."""
    if node.op_type == "ReduceSum":
        value = node.required_const(1, "axes")
        axes = None if value is None else [int(a) for a in value.reshape(-1)]
    else:
        axes = node.attr("axes")
    if not axes:
        if node.attr("noop_with_empty_axes", 0):
            raise Unsupported(f"{node.op_type}: noop_with_empty_axes")
        return None
    return tuple(int(a) for a in axes)


def _over(reduce_one):
    """A reduction over several axes from one that takes a single axis (keepdim True)."""
    def over(x, dims):
        for d in dims:
            x = reduce_one(x, d)
        return x
    return over


_REDUCE = {
    "ReduceMax": lambda x, dims: torch.amax(x, dims, keepdim=True),
    "ReduceMin": lambda x, dims: torch.amin(x, dims, keepdim=True),
    "ReduceMean": lambda x, dims: torch.mean(x, dims, keepdim=True),
    "ReduceSum": lambda x, dims: torch.sum(x, dims, keepdim=True),
    "ReduceSumSquare": lambda x, dims: torch.sum(x * x, dims, keepdim=True),
    "ReduceProd": _over(lambda x, d: torch.prod(x, d, keepdim=True)),
}


@operator(*_REDUCE)
def _reduce(node: Node):
    axes = _axes(node)
    keep = bool(node.attr("keepdims", 1))
    reduce = _REDUCE[node.op_type]

    def run(x, *_):
        dims = tuple(range(x.dim())) if axes is None else tuple(sorted(a % x.dim() for a in axes))
        if not dims:
            return x
        out = reduce(x, dims)
        return out if keep else out.reshape([n for k, n in enumerate(out.shape) if k not in dims])
    return run


@operator("ArgMax", "ArgMin")
def _arg(node: Node):
    axis, keep = int(node.attr("axis", 0)), bool(node.attr("keepdims", 1))
    last = bool(node.attr("select_last_index", 0))
    pick = torch.argmax if node.op_type == "ArgMax" else torch.argmin

    def arg(x):
        if not last:  # torch, as ONNX by default, gives the first of equal extremes
            return pick(x, axis, keepdim=keep)
        n = x.shape[axis]
        return (n - 1) - pick(torch.flip(x, (axis,)), axis, keepdim=keep)
    return arg
