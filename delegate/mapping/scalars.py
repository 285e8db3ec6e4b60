"""TFLite rank-0 (scalar) activations as NNAPI [1] tensors, where that is the same computation.

NNAPI has rank-0 tensors only as constants: an operand without dimensions is one of *unknown* rank.
Converted loops count with scalars (Keras 3's LSTM is a WHILE over int32 rank-0 counters: LESS,
LOGICAL_AND, ADD and a GATHER at the counter), so a rank-0 activation becomes an NNAPI tensor of
shape [1] -- but only for the TFLite builtins listed in SCALAR_AS_ONE, whose NNAPI operations give
the same values for a [1] operand as TFLite does for a scalar, the output then [1] where TFLite's is
[]. Every other mapper keeps refusing a rank-0 activation (MappingContext.tensor, map_node), even one
another node already made a [1] operand: RESHAPE, EXPAND_DIMS, CONCATENATION, PACK, STRIDED_SLICE,
reductions, FILL/RANGE... would compute another rank from [1] than from [].

The rules, one per family (each checked on the node before its mapper runs):

* broadcasting elementwise (ADD, SUB, MUL, DIV, FLOOR_DIV, MAXIMUM, MINIMUM, SQUARED_DIFFERENCE, POW,
  comparisons, LOGICAL_AND/OR): broadcasting [1] against a rank >= 1 shape gives that shape, as []
  does, and all-scalar inputs give [1] for TFLite's []; checked as "NNAPI's broadcast of the operand
  shapes is the output's NNAPI shape" (a rank-0 constant stays a rank-0 NNAPI constant).
* same shape in and out (CAST, LOGICAL_NOT, SELECT/SELECT_V2 of equal shapes, unary math): every
  tensor operand's NNAPI shape must be the same (a scalar SELECT with a rank-0 *constant* operand
  would not be: refused).
* GATHER: a scalar index (input 1) drops the gathered axis; the mapper gathers a [1] index and
  reshapes to the output's NNAPI shape (exact). The params (input 0) are never a scalar in TFLite.
* IF / WHILE: any input or output; the mapper passes rank-0 constants as [1] constants, and the
  subgraphs' own operands are [1] for their rank-0 tensors (hal checks the operands are compatible).

A partition input or output that is rank-0 is copied by the delegate kernel with a reshape. A
WHILE cond's scalar bool stays what it was before this table: a [1] operand for whatever node
produces it (control_flow, MappingContext.preset_scalars). Listing a builtin here needs its case
against TFLite in tests/delegate/test_scalars.py (a test checks every entry has one).
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from delegate.tfl.graph import TfLiteNode, TfLiteTensor
from delegate.tfl.schema import BuiltinOperator as B
from delegate.tfl.schema import builtin_name

TensorInfo = Callable[[int], TfLiteTensor]
#: (node, tensor_info) -> why the node's NNAPI form differs with [1] for its scalars, or None.
Rule = Callable[[TfLiteNode, TensorInfo], "str | None"]

#: The NNAPI shape of a rank-0 activation.
ONE = (1,)


def is_scalar_activation(info: TfLiteTensor) -> bool:
    """A non-constant rank-0 tensor (a rank-0 constant is an NNAPI constant as it is)."""
    return not info.shape and not info.is_constant


def nnapi_shape(info: TfLiteTensor) -> tuple[int, ...]:
    """The dimensions of the NNAPI operand standing for ``info`` (a scalar activation: [1])."""
    return ONE if is_scalar_activation(info) else tuple(info.shape)


def _tensors(node: TfLiteNode, info: TensorInfo, which) -> list[TfLiteTensor]:
    return [info(t) for t in which if t >= 0]


def _broadcasting(node: TfLiteNode, info: TensorInfo) -> str | None:
    ins = [nnapi_shape(t) for t in _tensors(node, info, node.inputs)]
    outs = [nnapi_shape(t) for t in _tensors(node, info, node.outputs)]
    try:
        got = tuple(np.broadcast_shapes(*ins))
    except ValueError:
        return f"shapes {[list(s) for s in ins]} do not broadcast"
    if outs != [got]:
        return f"NNAPI's output shape would be {list(got)}, TFLite's (scalar as [1]) is {[list(s) for s in outs]}"
    return None


def _same_shape(node: TfLiteNode, info: TensorInfo) -> str | None:
    shapes = {nnapi_shape(t) for t in _tensors(node, info, (*node.inputs, *node.outputs))}
    if len(shapes) != 1:
        return f"NNAPI needs one shape for all operands here, the scalar as [1] gives {sorted(map(list, shapes))}"
    return None


def _gather(node: TfLiteNode, info: TensorInfo) -> str | None:
    if node.inputs and node.inputs[0] >= 0 and is_scalar_activation(info(node.inputs[0])):
        return "GATHER's params must have rank >= 1"
    return None  # a scalar index and the scalar output: the mapper gathers [index] and reshapes


def _any(node: TfLiteNode, info: TensorInfo) -> str | None:
    return None  # IF / WHILE: the subgraphs' operands follow the same convention (hal checks them)


_BROADCASTING = (B.ADD, B.SUB, B.MUL, B.DIV, B.FLOOR_DIV, B.MAXIMUM, B.MINIMUM, B.SQUARED_DIFFERENCE, B.POW,
                 B.EQUAL, B.NOT_EQUAL, B.GREATER, B.GREATER_EQUAL, B.LESS, B.LESS_EQUAL,
                 B.LOGICAL_AND, B.LOGICAL_OR)
_SAME_SHAPE = (B.CAST, B.LOGICAL_NOT, B.SELECT, B.SELECT_V2,
               B.ABS, B.NEG, B.EXP, B.LOG, B.SQRT, B.RSQRT, B.SIN, B.FLOOR)

#: TFLite builtin -> the rule under which its mapper takes a rank-0 activation as an NNAPI [1] tensor.
#: A builtin not listed keeps refusing rank-0 activations.
SCALAR_AS_ONE: dict[int, Rule] = {
    **{b: _broadcasting for b in _BROADCASTING},
    **{b: _same_shape for b in _SAME_SHAPE},
    B.GATHER: _gather,
    B.IF: _any,
    B.WHILE: _any,
}


def scalar_tensors(node: TfLiteNode, info: TensorInfo) -> list[TfLiteTensor]:
    """The node's rank-0 activations (inputs and outputs)."""
    return [t for t in _tensors(node, info, (*node.inputs, *node.outputs)) if is_scalar_activation(t)]


def scalar_refusal(node: TfLiteNode, info: TensorInfo) -> str | None:
    """Why this builtin node cannot take its rank-0 activations as [1] tensors (None: it has none, or
    its mapper is listed and the rule holds). Custom nodes: None (an extension decides, by its types)."""
    if node.custom_code is not None:
        return None
    scalars = scalar_tensors(node, info)
    if not scalars:
        return None
    rule = SCALAR_AS_ONE.get(node.builtin_code)
    if rule is None:
        return not_listed(node, scalars[0])
    why = rule(node, info)
    return None if why is None else f"{builtin_name(node.builtin_code)} with a rank-0 (scalar) tensor as NNAPI [1]: " \
                                    f"{why}"


def not_listed(node: TfLiteNode | None, tensor: TfLiteTensor) -> str:
    """The refusal of a rank-0 activation outside SCALAR_AS_ONE."""
    why = f"tensor {tensor.name!r} is a rank-0 (scalar) tensor, which NNAPI has only as a constant"
    if node is None or node.custom_code is not None:
        return why
    return (f"{why} ({builtin_name(node.builtin_code)} is not among the operations that take it as a [1] "
            f"tensor: delegate.mapping.scalars)")


def is_listed(node: TfLiteNode) -> bool:
    return node.custom_code is None and node.builtin_code in SCALAR_AS_ONE


__all__ = ["ONE", "SCALAR_AS_ONE", "is_listed", "is_scalar_activation", "nnapi_shape", "not_listed",
           "scalar_refusal", "scalar_tensors"]
