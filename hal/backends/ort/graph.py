"""The ONNX graph a partition is lowered into, and the helpers every lowering shares.

A lowering sees NNAPI's view of its operation (``ctx``: operand infos, the spec's ``ctx.params``)
and the ONNX value names of its inputs (``x[i]``; a constant becomes an initializer the first time
it is asked for, so a lowering that repacks a weight never ships the original too). It adds nodes
with ``g.node`` and returns the names of its outputs.

Layout: values keep NNAPI's layout (NHWC for images). An operation whose ONNX form is NCHW wraps
itself in ``g.nchw`` / ``g.nhwc``; onnxruntime's transpose optimiser cancels the pairs between
consecutive operations, so only the partition's edges transpose (checked by the tests).
"""
from __future__ import annotations

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


def onnx_type(dtype: np.dtype) -> int:
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


class OnnxGraph:
    """Nodes and initializers of one partition's graph under construction."""

    def __init__(self, infos: list[OperandInfo]):
        self.infos = infos
        self.nodes: list = []
        self.initializers: list = []
        self._operand_names: dict[int, str] = {}
        self._count = 0

    def fresh(self, hint: str = "v") -> str:
        self._count += 1
        return f"{hint}_{self._count}"

    # ---- values --------------------------------------------------------------------------------
    def operand(self, index: int) -> str:
        """The value name of operand ``index``: a graph input or an earlier member's output (bound
        with ``bind``), or, for a constant, an initializer made on first use."""
        name = self._operand_names.get(index)
        if name is None:
            info = self.infos[index]
            if info.value is None:
                raise KeyError(f"operand {index} is neither an input of the partition nor computed in it")
            name = self.const(np.asarray(info.value, dtype=info.dtype), f"operand{index}")
            self._operand_names[index] = name
        return name

    def bind(self, index: int, name: str) -> None:
        self._operand_names[index] = name

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
        return self.node("Transpose", [x], perm=list(_TO_NCHW))

    def nhwc(self, x: str) -> str:
        return self.node("Transpose", [x], perm=list(_TO_NHWC))

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
        graph = helper.make_graph(self.nodes, "nnhal_partition", graph_inputs, graph_outputs, self.initializers)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                                  producer_name="nnhal")
        model.ir_version = 8
        return model


class Inputs(Sequence):
    """``x[i]``: the value name of the operation's input i, None when the input is omitted."""

    def __init__(self, graph: OnnxGraph, operands: Sequence[int]):
        self._graph = graph
        self._operands = operands

    def __len__(self) -> int:
        return len(self._operands)

    def __getitem__(self, i):  # type: ignore[override]
        k = self._operands[i]
        return None if k < 0 else self._graph.operand(k)


__all__ = ["Inputs", "OPSET", "OnnxGraph", "TensorProto", "onnx_type"]
