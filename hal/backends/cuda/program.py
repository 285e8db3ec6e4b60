"""An ONNX graph as a straight-line torch program: what the cuda backend runs and captures.

The cuda backend does not lower NNAPI a second time: a partition is lowered by the onnxruntime
backend's lowerings (``hal.backends.ort``: NNAPI's semantics written once, as ONNX), and this
module runs that ONNX graph with torch operators (ONNX's semantics, opset ``OPSET``). Each node
becomes one closure over its attributes and constant inputs, built once; a run calls them in
order on a list of slots, no dictionary, no lookup. On a CUDA device the run is what a CUDA graph
captures (``hal.backends.cuda.runner``), so Python is not on the replayed path at all.

An operator builder is registered per ONNX op type with ``@operator("Name")``; it gets a ``Node``
(attributes, the constant value of each input that is an initializer) and returns the function
called with the node's input tensors (None for an omitted optional input), returning a tensor or
a tuple of tensors. An op type without a builder, or a form a builder does not take, raises
``Unsupported`` when the program is built: the partition then runs on the next backend.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import onnx
import torch
from onnx import numpy_helper

from hal.backends.ort.graph import OPSET


class Unsupported(Exception):
    """An ONNX node this program cannot run (op type, form or attribute)."""


Fn = Callable[..., Any]
Builder = Callable[["Node"], Fn]
#: (domain, op type) -> builder; ONNX's own operators under "" (also spelt "ai.onnx").
_BUILDERS: dict[tuple[str, str], Builder] = {}
#: A pass over the graph's nodes before the program is built (``fusion.rewrite``): the nodes, the
#: constant values by name, the graph's output names -> the nodes to run.
Rewrite = Callable[[list, dict, set], list]


def _domain(domain: str) -> str:
    return "" if domain == "ai.onnx" else domain


def operator(*op_types: str, domain: str = "") -> Callable[[Builder], Builder]:
    def register(builder: Builder) -> Builder:
        for t in op_types:
            if (domain, t) in _BUILDERS:
                raise RuntimeError(f"operator {domain}:{t} registered twice")
            _BUILDERS[(domain, t)] = builder
        return builder
    return register


def operators() -> frozenset[str]:
    """The ONNX op types this program runs."""
    return frozenset(t for d, t in _BUILDERS if d == "")


def per_shape(make: Callable[[torch.Tensor], Any]) -> Callable[[torch.Tensor], Any]:
    """``make(x)`` once per input shape and device, then the same value (index tensors, divisors):
    made by the runs before a CUDA graph's capture, so the captured run only reads them."""
    made: dict[tuple, Any] = {}

    def get(x: torch.Tensor) -> Any:
        key = (tuple(x.shape), x.device)
        value = made.get(key)
        if value is None:
            value = made[key] = make(x)
        return value
    return get


#: ONNX tensor element type -> torch dtype (the types the lowerings use).
TORCH_DTYPE = {
    onnx.TensorProto.FLOAT: torch.float32, onnx.TensorProto.FLOAT16: torch.float16,
    onnx.TensorProto.DOUBLE: torch.float64, onnx.TensorProto.INT8: torch.int8, onnx.TensorProto.UINT8: torch.uint8,
    onnx.TensorProto.INT16: torch.int16, onnx.TensorProto.INT32: torch.int32, onnx.TensorProto.INT64: torch.int64,
    onnx.TensorProto.BOOL: torch.bool,
}


@dataclass
class Node:
    """One ONNX node as a builder sees it."""

    proto: onnx.NodeProto
    #: The numpy value of each input that is an initializer (None: computed, or omitted).
    constants: list[np.ndarray | None]
    #: The float type the program computes in (float32; float16 for a relaxed partition).
    float_type: torch.dtype

    @property
    def op_type(self) -> str:
        return self.proto.op_type

    def attr(self, name: str, default: Any = None) -> Any:
        for a in self.proto.attribute:
            if a.name == name:
                return onnx.helper.get_attribute_value(a)
        return default

    def const(self, i: int) -> np.ndarray | None:
        return self.constants[i] if i < len(self.constants) else None

    def required_const(self, i: int, what: str) -> np.ndarray:
        value = self.const(i)
        if value is None and i < len(self.proto.input) and self.proto.input[i]:
            raise Unsupported(f"{self.op_type}: {what} (input {i}) must be a constant")
        return value

    def dtype(self, onnx_type: int) -> torch.dtype:
        """The torch dtype a node makes for ONNX type ``onnx_type`` (float32 -> the program's float type)."""
        t = TORCH_DTYPE.get(onnx_type)
        if t is None:
            raise Unsupported(f"{self.op_type}: ONNX type {onnx_type} is not run")
        return self.float_type if t == torch.float32 else t


class Program:
    """``program(inputs) -> outputs``: the graph's nodes in order over torch tensors on ``device``.
    Float32 inputs, weights and outputs are carried in ``float_type`` inside (float16 for a
    relaxed partition: the caller converts at the edges)."""

    def __init__(self, model: onnx.ModelProto, weights: dict[str, np.ndarray], device: torch.device,
                 float_type: torch.dtype = torch.float32, rewrite: Rewrite | None = None):
        for opset in model.opset_import:
            if opset.domain in ("", "ai.onnx") and opset.version != OPSET:
                raise Unsupported(f"opset {opset.version}: the program runs opset {OPSET}")
        graph = model.graph
        values: dict[str, np.ndarray] = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
        values.update(weights)
        slot: dict[str, int] = {}
        self._constants: list[torch.Tensor] = []

        def place(name: str) -> int:
            if name not in slot:
                slot[name] = len(slot)
            return slot[name]

        self.input_slots = [place(vi.name) for vi in graph.input if vi.name not in values]
        self.device = device
        self.float_type = float_type
        # (slot, tensor) of every initializer a node reads as a tensor
        self._preset: list[tuple[int, torch.Tensor]] = []
        self._steps: list[tuple[Fn, tuple[int, ...], tuple[int, ...]]] = []
        preset: set[str] = set()
        nodes = list(graph.node)
        if rewrite is not None:
            nodes = rewrite(nodes, values, {vi.name for vi in graph.output})
        #: How many nodes of each op type the program runs (after ``rewrite``).
        self.node_types = Counter(n.op_type for n in nodes)
        for proto in nodes:
            builder = _BUILDERS.get((_domain(proto.domain), proto.op_type))
            if builder is None:
                raise Unsupported(f"{proto.domain or 'ONNX'} {proto.op_type} is not run")
            fn = builder(Node(proto, [values.get(i) if i else None for i in proto.input], float_type))
            for name in proto.input:
                if name and name in values and name not in preset:
                    preset.add(name)
                    self._preset.append((place(name), self._tensor(values[name])))
            ins = tuple(place(i) if i else -1 for i in proto.input)
            self._steps.append((fn, ins, tuple(place(o) for o in proto.output)))
        for vi in graph.output:
            if vi.name in values and vi.name not in preset:  # an initializer as an output
                preset.add(vi.name)
                self._preset.append((place(vi.name), self._tensor(values[vi.name])))
        self.output_slots = [slot[vi.name] for vi in graph.output]
        self._size = len(slot)

    def _tensor(self, value: np.ndarray) -> torch.Tensor:
        t = torch.from_numpy(np.array(value, copy=True))
        if t.dtype == torch.float32:
            t = t.to(self.float_type)
        return t.to(self.device)

    def __call__(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        env: list[Any] = [None] * self._size
        for k, t in self._preset:
            env[k] = t
        for k, t in zip(self.input_slots, inputs, strict=True):
            env[k] = t
        for fn, ins, outs in self._steps:
            result = fn(*[env[i] if i >= 0 else None for i in ins])
            if len(outs) == 1:
                env[outs[0]] = result
            else:
                for k, r in zip(outs, result, strict=True):
                    env[k] = r
        return [env[k] for k in self.output_slots]

