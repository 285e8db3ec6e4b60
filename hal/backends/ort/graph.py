"""The ONNX graph a partition is lowered into, and the helpers every lowering shares.

A lowering sees NNAPI's view of its operation (``ctx``: operand infos, the spec's ``ctx.params``)
and the ONNX value names of its inputs (``x[i]``; a constant becomes an initializer the first time
it is asked for, so a lowering that repacks a weight never ships the original too). It adds nodes
with ``g.node`` and returns the names of its outputs.

Layout: one per partition. A 4-D value may exist in NNAPI's NHWC and in NCHW (the layout of ONNX's
Conv / pooling, and the one onnxruntime's NCHWc convolutions reorder from): ``g.nchw`` / ``g.nhwc``
return the other form, made by a Transpose only the first time and remembered both ways. An
operation whose ONNX form is NCHW wraps itself in them; a layout-free one (element-wise, PAD,
CONCATENATION, RESIZE) computes in NCHW when one of its inputs already exists there
(``g.channels_first``), so activations stay in the convolutions' layout between them. A
Transpose nothing reads is dropped when the model is made: only the partition's edges, and
operations that need NHWC (RESHAPE, FULLY_CONNECTED, ...), transpose (counted by
tests/backends/test_ort_layout.py on MediaPipe-style graphs). Before, with NHWC kept and a
Transpose pair around each convolution, onnxruntime's optimiser cancelled the pairs but left the
operations between convolutions in NHWC, where a per-channel constant broadcasts along the
innermost axis: PRelu there was 61% of a face-landmark-style network's time.
"""
from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from hal.registry import OperandInfo
from hal.types import FusedActivationFunc

#: The ONNX opset every lowering is written against (ReduceMean & co. take axes as an attribute,
#: Split/Pad/Clip/Reshape take their parameters as inputs).
OPSET = 17

_TO_NCHW = (0, 3, 1, 2)
_TO_NHWC = (0, 2, 3, 1)


def nchw_axis(axis: int) -> int:
    """Where NHWC axis ``axis`` (0..3, or negative) is in NCHW."""
    return _TO_NHWC[axis % 4]


def onnx_type(dtype: np.dtype) -> int:
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


class OnnxGraph:
    """Nodes and initializers of one partition's graph under construction."""

    def __init__(self, infos: list[OperandInfo], parent: "OnnxGraph | None" = None):
        self.infos = infos
        self.nodes: list = []
        self._operand_names: dict[int, str] = {}
        if parent is None:
            self.initializers: list = []
            #: The shape of each value bound to an operand (``bind``, ``operand``), every scope's.
            self.shapes: dict[str, tuple[int, ...]] = {}
            #: (id of an operand numbering, operand) -> its constant's initializer and that numbering:
            #: a subgraph inlined more than once (a Loop's unrolled copies, its second Loop) shares them.
            self._constants: dict[tuple[int, int], tuple[list, str]] = {}
            self._counter = itertools.count(1)
            # value name -> the same value in the other layout (NHWC <-> NCHW), both directions
            self._twin: dict[str, str] = {}
            #: Names of the loops (WHILE operations) lowered into this partition, nested ones not counted.
            self.loops: list[str] = []
        else:  # one name space and one initializer list with the partition's graph
            self.initializers, self._counter, self.shapes = parent.initializers, parent._counter, parent.shapes
            self._constants = parent._constants
            self._twin = dict(parent._twin)  # the parent's twins are visible here, this scope's stay here
            self.loops = []

    def scope(self, infos: list[OperandInfo], nested: bool) -> "OnnxGraph":
        """A graph over another operand numbering (a referenced subgraph's): ``nested`` for the
        body of a Loop / If node (nodes of its own, outer values read by name), else its nodes go
        into this graph (a WHILE's first condition). Initializers live in the partition's graph."""
        child = OnnxGraph(infos, self)
        if not nested:
            child.nodes = self.nodes
            child._twin = self._twin
        return child

    def fresh(self, hint: str = "v") -> str:
        return f"{hint}_{next(self._counter)}"

    # ---- values --------------------------------------------------------------------------------
    def operand(self, index: int) -> str:
        """The value name of operand ``index``: a graph input or an earlier member's output (bound
        with ``bind``), or, for a constant, an initializer made on first use."""
        name = self._operand_names.get(index)
        if name is None:
            info = self.infos[index]
            if info.value is None:
                raise KeyError(f"operand {index} is neither an input of the partition nor computed in it")
            made = self._constants.get((id(self.infos), index))
            if made is not None and made[0] is self.infos:
                name = made[1]
            else:
                name = self.const(np.asarray(info.value, dtype=info.dtype), f"operand{index}")
                self._constants[(id(self.infos), index)] = (self.infos, name)
            self.bind(index, name)
        return name

    def bind(self, index: int, name: str) -> None:
        self._operand_names[index] = name
        info = self.infos[index] if index < len(self.infos) else None
        if info is not None and info.shape is not None:
            self.shapes[name] = tuple(info.shape)

    def bound(self, index: int) -> str | None:
        return self._operand_names.get(index)

    def const(self, value: Any, hint: str = "c", dtype: Any = None) -> str:
        """An initializer holding ``value`` (a numpy array or a Python scalar / list)."""
        arr = np.asarray(value, dtype=dtype)
        if arr.dtype == np.float64 and dtype is None:
            arr = arr.astype(np.float32)
        name = self.fresh(hint)
        # (np.ascontiguousarray alone would make a 0-d value 1-d)
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(arr).reshape(arr.shape), name))
        return name

    def ints(self, values: Sequence[int], hint: str = "i64") -> str:
        """An int64 1-D initializer (shapes, axes, pads, starts/ends as ONNX wants them)."""
        return self.const(np.asarray(list(values), dtype=np.int64), hint)

    # ---- nodes ---------------------------------------------------------------------------------
    def node(self, op_type: str, inputs: Sequence[str | None], outputs: int = 1, *, domain: str = "",
             **attrs: Any) -> Any:
        """Add one node; returns its output name (or the list of names when ``outputs`` > 1). An
        omitted optional input is ``None`` (written as ONNX's empty name)."""
        names = [self.fresh(op_type.lower()) for _ in range(outputs)]
        self.nodes.append(helper.make_node(op_type, ["" if i is None else i for i in inputs], names,
                                           domain=domain or None, **attrs))
        return names[0] if outputs == 1 else names

    def nchw(self, x: str) -> str:
        """``x`` (4-D NHWC) in NCHW: its known twin, else a Transpose (remembered)."""
        return self._relayout(x, _TO_NCHW)

    def nhwc(self, x: str) -> str:
        """``x`` (4-D NCHW) in NHWC: its known twin, else a Transpose (remembered)."""
        return self._relayout(x, _TO_NHWC)

    def _relayout(self, x: str, perm: tuple[int, ...]) -> str:
        twin = self._twin.get(x)
        if twin is None:
            twin = self.node("Transpose", [x], perm=list(perm))
            self._twin[x], self._twin[twin] = twin, x
        return twin

    def in_nchw(self, x: str) -> bool:
        """Whether the NHWC value ``x`` already exists in NCHW (no Transpose needed to get it)."""
        return x in self._twin

    def pointwise(self, x: str, build) -> str:
        """``build(v)`` for an operation that reads ``x`` element by element (its constants
        scalars): on x's NCHW twin when it has one, so the result stays in NCHW too."""
        if not self.in_nchw(x):
            return build(x)
        return self.nhwc(build(self.nchw(x)))

    def channels_first(self, ctx, x, indices: Sequence[int], rank: int = 4) -> list[str | None] | None:
        """The inputs ``indices`` of a layout-free operation in NCHW, when computing there saves
        transposes: the output is 4-D, every non-constant input 4-D and at least one of them
        already in NCHW. A constant of any rank is broadcast up to 4-D (NNAPI aligns trailing
        axes) and permuted here, once; an omitted input stays None. None: compute in NHWC."""
        if len(ctx.output(0).shape) != rank:
            return None
        variable = [i for i in indices if x.operand_index(i) >= 0 and ctx.input(i).value is None]
        if any(len(ctx.input(i).shape) != rank for i in variable):
            return None
        if not any(self.in_nchw(x[i]) for i in variable):
            return None
        out: list[str | None] = []
        for i in indices:
            if x.operand_index(i) < 0:
                out.append(None)
            elif i in variable:
                out.append(self.nchw(x[i]))
            else:
                info = ctx.input(i)
                value = np.asarray(info.value, dtype=info.dtype)
                value = value.reshape((1,) * (rank - value.ndim) + value.shape)
                out.append(self.const(np.transpose(value, _TO_NCHW), "nchw_const"))
        return out

    def activation(self, x: str, code: int) -> str:
        """NNAPI's fused activation on ``x`` (RELU, RELU1, RELU6) as Relu / Clip."""
        code = FusedActivationFunc(int(code))
        if code == FusedActivationFunc.NONE:
            return x
        if code == FusedActivationFunc.RELU:
            return self.node("Relu", [x])
        low, high = (-1.0, 1.0) if code == FusedActivationFunc.RELU1 else (0.0, 6.0)
        return self.node("Clip", [x, self.const(np.float32(low)), self.const(np.float32(high))])

    # ---- the model -----------------------------------------------------------------------------
    def model(self, inputs: Sequence[int], outputs: Sequence[int]):
        """The ONNX ModelProto with the partition's inputs and outputs as graph inputs/outputs
        (named ``in<operand>`` / by value; an output that is not a node's own gets an Identity)."""
        graph_inputs = [helper.make_tensor_value_info(self._operand_names[i], onnx_type(self.infos[i].dtype),
                                                      list(self.infos[i].shape)) for i in inputs]
        taken = {vi.name for vi in graph_inputs} | {t.name for t in self.initializers}
        graph_outputs = []
        for o in outputs:
            name = self._operand_names[o]
            if name in taken:  # a graph input, initializer or another output passed straight through
                name = self.node("Identity", [name])
            taken.add(name)
            graph_outputs.append(helper.make_tensor_value_info(name, onnx_type(self.infos[o].dtype),
                                                               list(self.infos[o].shape)))
        nodes, initializers = self._live([vi.name for vi in graph_outputs])
        graph = helper.make_graph(nodes, "nnhal_partition", graph_inputs, graph_outputs, initializers)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                                  producer_name="nnhal")
        model.ir_version = 8
        return model


    def subgraph(self, name: str, inputs: Sequence, outputs: Sequence):
        """This (nested) scope's nodes as the GraphProto of a Loop / If attribute: ``inputs`` and
        ``outputs`` are ValueInfoProtos; an output that no node of the scope makes (an outer value
        passed through) or that another output already names gets an Identity. One of the graph's
        own inputs is given back as it is (a counted Loop's condition: no node per trip)."""
        made = {o for n in self.nodes for o in n.output} | {vi.name for vi in inputs}
        seen: set[str] = set()
        fixed = []
        for vi in outputs:
            if vi.name not in made or vi.name in seen:
                vi = helper.make_value_info(self.node("Identity", [vi.name]), vi.type)
            seen.add(vi.name)
            fixed.append(vi)
        nodes, _ = self._live([vi.name for vi in fixed])
        return helper.make_graph(nodes, name, list(inputs), fixed)

    def _live(self, outputs: Sequence[str]) -> tuple[list, list]:
        """The nodes and initializers the outputs depend on (in order): a layout twin made and
        then never read is not part of the model. A node with a subgraph (Loop, If) reads every
        name its subgraph's nodes read."""
        needed = set(outputs)
        live = []
        for n in reversed(self.nodes):
            if any(o in needed for o in n.output):
                live.append(n)
                needed.update(i for i in n.input if i)
                needed.update(read_in_subgraphs(n))
        live.reverse()
        return live, [t for t in self.initializers if t.name in needed]


def read_in_subgraphs(node) -> set[str]:
    names: set[str] = set()
    for attr in node.attribute:
        for graph in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
            for n in graph.node:
                names.update(i for i in n.input if i)
                names |= read_in_subgraphs(n)
    return names


class Inputs(Sequence):
    """``x[i]``: the value name of the operation's input i, None when the input is omitted."""

    def __init__(self, graph: OnnxGraph, operands: Sequence[int]):
        self._graph = graph
        self._operands = operands

    def __len__(self) -> int:
        return len(self._operands)

    def operand_index(self, i: int) -> int:
        """The NNAPI operand of input i (negative when omitted)."""
        return self._operands[i]

    def __getitem__(self, i):  # type: ignore[override]
        k = self._operands[i]
        return None if k < 0 else self._graph.operand(k)


__all__ = ["Inputs", "OPSET", "OnnxGraph", "TensorProto", "nchw_axis", "onnx_type"]
