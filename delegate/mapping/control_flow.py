"""IF and WHILE: TFLite control flow over subgraphs -> NNAPI IF / WHILE over referenced subgraphs.

TFLite's IF (then/else subgraph indexes) and WHILE (cond/body) name other subgraphs of the model.
Each named subgraph is converted into an NNAPI model of its own (its inputs and outputs are the
TFLite subgraph's, in order) and grafted into the partition's model as a referenced subgraph,
named by a SUBGRAPH operand. Nested control flow converts the same way, recursively.

- IF: TFLite inputs (cond, x...) -> NNAPI (cond, then, else, x...), the outputs as they are.
- WHILE: TFLite carries every input (its outputs correspond 1:1), so all of them are NNAPI's
  loop-carried inputs (m = all, k = n = 0): cond takes them all and gives a TENSOR_BOOL8 [1],
  body gives the next values of all of them.

TFLite subgraphs differ from NNAPI's in ways bridged here: an input TFLite found unused is -1
(an operand shaped like the outer one takes its place); an output may be an input or a constant,
or repeat (NNAPI's outputs are distinct operands an operation writes: a CAST to the same type
copies it); the cond's bool may be declared with shape [] (NNAPI needs [1]: the operand is
created as [1] for its producer). Rank-0 tensors (a converted loop's counters) are NNAPI [1]
tensors on both sides (delegate.mapping.scalars: the subgraph's inputs, the mappers listed there
inside it, and rank-0 constants passed in or out as [1] constants). A subgraph node that cannot
be mapped keeps the IF / WHILE on TFLite's CPU, with a reason naming that node.
"""
from __future__ import annotations

import numpy as np

from delegate.mapping.core import MappingContext, MappingError, lookup_mapper, map_node, mapper
from delegate.mapping.folding import fold_constants
from delegate.mapping.options import OptionsReader, ints
from delegate.tfl.graph import TfLiteNode
from delegate.tfl.schema import BuiltinOperator, builtin_name
from hal.model import Model
from hal.types import OperandLifeTime, OperandType, OperationType

#: Deepest nesting of control flow converted (TFLite models rarely nest beyond 2-3 levels).
MAX_DEPTH = 16


def _pair(a: str, b: str):
    def read(addr: int) -> dict:
        x, y = ints(addr, 2)
        return {a: x, b: y}
    return read


IF_OPTIONS = OptionsReader("IfOptions", _pair("then_subgraph_index", "else_subgraph_index"))  # TfLiteIfParams
WHILE_OPTIONS = OptionsReader("WhileOptions", _pair("cond_subgraph_index", "body_subgraph_index"))  # TfLiteWhileParams


def _subgraph_index(ctx: MappingContext, name: str) -> int:
    k = ctx.option(name)
    if not isinstance(k, int) or k <= 0:  # 0 is the primary subgraph: never a branch or a body
        raise MappingError(f"{name} {k} does not name a subgraph")
    return k


def _node_name(node: TfLiteNode) -> str:
    return f"CUSTOM({node.custom_code})" if node.custom_code else builtin_name(node.builtin_code)


def convert_subgraph(ctx: MappingContext, k: int, outer_inputs: list[int], n_outputs: int, *,
                     condition: bool = False) -> Model:
    """TFLite subgraph ``k`` as an NNAPI model whose inputs stand for the operands ``outer_inputs``
    of ``ctx``; ``condition``: its single output is a TENSOR_BOOL8 [1] (a WHILE's cond)."""
    path = getattr(ctx, "subgraph_path", ())
    if k in path:
        raise MappingError(f"subgraph {k} contains itself (through {' -> '.join(map(str, path))})")
    if len(path) >= MAX_DEPTH:
        raise MappingError(f"control flow nested deeper than {MAX_DEPTH} subgraphs")
    try:
        graph, _ = fold_constants(ctx.graph.subgraph(k))
    except (LookupError, ValueError) as e:  # unreadable subgraph (runtime, corrupted model): stays on CPU
        raise MappingError(f"subgraph {k} cannot be read: {e}") from None
    where = f"subgraph {k}"
    if len(graph.inputs) != len(outer_inputs):
        raise MappingError(f"{where} takes {len(graph.inputs)} inputs, the node passes {len(outer_inputs)}")
    if len(graph.outputs) != n_outputs:
        raise MappingError(f"{where} gives {len(graph.outputs)} outputs, the node needs {n_outputs}")
    sub = MappingContext(graph, ctx.validate, ctx.runtime)
    sub.subgraph_path = (*path, k)
    b = sub.builder
    outer = ctx.builder.operands
    ins = []
    for t, o in zip(graph.inputs, outer_inputs):
        like = outer[o]
        if t < 0:  # TFLite dropped this unused input; NNAPI still passes it
            ins.append(b.add_operand(like.type, like.dimensions, like.scale, like.zero_point, like.channel_quant))
            continue
        info = sub.tensor_info(t)
        if info.is_constant or t in sub.operand_of:
            raise MappingError(f"{where}: input tensor {info.name!r} is a constant or repeated")
        sub.scalar_as_one = True  # a rank-0 input (a loop counter) is [1], as the outer operand
        ins.append(sub.tensor(t))
        sub.scalar_as_one = False
    if condition:
        t = graph.outputs[0]
        info = sub.tensor_info(t)
        if not info.shape and not info.is_constant and t not in sub.operand_of:
            sub.operand_of[t] = b.add_operand(OperandType.TENSOR_BOOL8, (1,))  # TFLite's scalar bool, as [1]
            sub.preset_scalars.add(t)  # whatever node produces it
    for node in graph.nodes:
        if node.options.get("__undecoded__") and lookup_mapper(node.builtin_code) is not None:
            raise MappingError(f"{where} node {node.index} ({_node_name(node)}): its parameters are not read "
                               "by the delegate")
        try:
            map_node(sub, node)
        except MappingError as e:
            raise type(e)(f"{where} node {node.index} ({_node_name(node)}): {e}") from None
    outs: list[int] = []
    for t in graph.outputs:
        info = sub.tensor_info(t)
        if info.is_constant:
            o = _carried(sub, t)
        elif t in sub.operand_of:
            o = sub.operand_of[t]
        else:
            raise MappingError(f"{where}: output tensor {info.name!r} is not computed by the subgraph")
        if o in ins or o in outs or b.operands[o].lifetime != OperandLifeTime.TEMPORARY_VARIABLE:
            o = _copy(sub, o)
        outs.append(o)
    b.identify_inputs_and_outputs(ins, outs)
    return b.finish()


def _copy(ctx: MappingContext, operand: int) -> int:
    """A new operand holding ``operand``'s value: NNAPI's outputs are operands an operation writes,
    not inputs, constants or another output (a CAST to the same type copies, whatever the type)."""
    out = ctx.new_temporary(operand)
    first = len(ctx.builder.model.main.operations)
    ctx.operation(OperationType.CAST, [operand], [out])
    if ctx.validate:
        ctx.validate_since(first)
    return out


def _carried(ctx: MappingContext, t: int) -> int:
    """The operand for a tensor passed into or out of a subgraph: a rank-0 constant as a [1] constant
    (the subgraph's operand for a rank-0 tensor is [1]: delegate.mapping.scalars), else ctx.tensor."""
    info = ctx.tensor_info(t)
    if not (info.is_constant and not info.shape):
        return ctx.tensor(t)
    otype = ctx.operand_type(info)
    quant8 = otype in (OperandType.TENSOR_QUANT8_ASYMM, OperandType.TENSOR_QUANT8_ASYMM_SIGNED)
    return ctx.constant(otype, np.asarray(info.data).reshape(1), scale=info.scales[0] if info.is_quantized else 0.0,
                        zero_point=info.zero_points[0] if quant8 else 0)


def _reference(ctx: MappingContext, model: Model) -> int:
    return ctx.builder.add_subgraph_operand(ctx.builder.add_referenced(model))


def _operands(ctx: MappingContext, tensors, what: str) -> list[int]:
    if any(t < 0 for t in tensors):
        raise MappingError(f"an omitted {what}")
    return [_carried(ctx, t) for t in tensors]


@mapper(BuiltinOperator.IF, options=IF_OPTIONS)
def map_if(ctx: MappingContext, node: TfLiteNode) -> None:
    then_k, else_k = _subgraph_index(ctx, "then_subgraph_index"), _subgraph_index(ctx, "else_subgraph_index")
    if not node.inputs or node.inputs[0] < 0:
        raise MappingError("IF has no condition")
    cond_info = ctx.input_tensor(0)
    if cond_info.is_constant:  # a constant may be declared as a scalar: NNAPI needs [1]
        if cond_info.data.size != 1:
            raise MappingError(f"IF condition has {cond_info.data.size} values")
        cond = ctx.constant(OperandType.TENSOR_BOOL8, cond_info.data.reshape(1).astype(bool))
    else:
        cond = ctx.tensor(node.inputs[0])
    cond_op = ctx.builder.operands[cond]
    if cond_op.type != OperandType.TENSOR_BOOL8 or tuple(cond_op.dimensions) != (1,):
        raise MappingError(f"IF condition must be a bool tensor of shape [1], got {list(cond_op.dimensions)}")
    ins = _operands(ctx, node.inputs[1:], "IF input")
    outs = _operands(ctx, node.outputs, "IF output")
    then_ref = _reference(ctx, convert_subgraph(ctx, then_k, ins, len(outs)))
    else_ref = _reference(ctx, convert_subgraph(ctx, else_k, ins, len(outs)))
    ctx.operation(OperationType.IF, [cond, then_ref, else_ref, *ins], outs)


@mapper(BuiltinOperator.WHILE, options=WHILE_OPTIONS)
def map_while(ctx: MappingContext, node: TfLiteNode) -> None:
    cond_k, body_k = _subgraph_index(ctx, "cond_subgraph_index"), _subgraph_index(ctx, "body_subgraph_index")
    if len(node.inputs) != len(node.outputs) or not node.inputs:
        raise MappingError(f"WHILE has {len(node.inputs)} inputs and {len(node.outputs)} outputs")
    ins = _operands(ctx, node.inputs, "WHILE input")
    # An output nobody reads may be -1 (LiteRT drops them): NNAPI still has it, like its input.
    outs = [ctx.new_temporary(i) if t < 0 else ctx.tensor(t) for t, i in zip(node.outputs, ins)]
    cond_ref = _reference(ctx, convert_subgraph(ctx, cond_k, ins, 1, condition=True))
    body_ref = _reference(ctx, convert_subgraph(ctx, body_k, ins, len(outs)))
    ctx.operation(OperationType.WHILE, [cond_ref, body_ref, *ins], outs)


__all__ = ["convert_subgraph", "map_if", "map_while"]
