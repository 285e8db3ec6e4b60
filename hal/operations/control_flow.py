"""IF and WHILE (NNAPI 1.3): control flow over referenced subgraphs.

A SUBGRAPH operand names one of the model's referenced subgraphs (its location offset); its info
carries that index as its value. Outer operands and the subgraph operands they pass to or receive
from must be *compatible* (AOSP's rule): the same type, scale, zero point and per-channel
parameters, and dimensions that agree wherever both are known.

IF inputs: 0 condition (TENSOR_BOOL8 [1]), 1 then-subgraph, 2 else-subgraph, 3.. the branch's
inputs; outputs: the branch's outputs.

WHILE inputs: 0 condition subgraph, 1 body subgraph, then m loop-carried inputs, k loop-state-only
inputs and n input-only inputs. The condition takes all m+k+n and outputs one TENSOR_BOOL8 [1];
the body takes all m+k+n and outputs m+k (the next values of the loop-carried and state ones);
WHILE outputs the m loop-carried values once the condition is false. A WHILE that runs longer than
the execution's loop timeout ends with MISSED_DEADLINE (``hal.control_flow``).

Both are run by the executor, not by a backend kernel: they need the compiled subgraphs and the
execution's deadline and loop timeout. Output shapes are the declared ones where those are fully
specified; otherwise the compiler tries the subgraphs' planned shapes, else they are known only
once the operation has run (``data_dependent_outputs``).
"""
from __future__ import annotations

from dataclasses import dataclass

from hal.registry import OperandInfo, OperationContext, register
from hal.types import FeatureLevel, OperandType, OperationType, type_name

IF = OperationType.IF
WHILE = OperationType.WHILE
#: The operations the executor runs itself (``hal.control_flow``), never a backend kernel.
CONTROL_FLOW = frozenset({int(IF), int(WHILE)})
BOOL8 = OperandType.TENSOR_BOOL8
SUBGRAPH = OperandType.SUBGRAPH

CONDITION, THEN_BRANCH, ELSE_BRANCH, FIRST_BRANCH_INPUT = 0, 1, 2, 3
COND_SUBGRAPH, BODY_SUBGRAPH, FIRST_LOOP_INPUT = 0, 1, 2


@dataclass(frozen=True)
class IfParams:
    then_subgraph: int
    else_subgraph: int


@dataclass(frozen=True)
class WhileParams:
    cond_subgraph: int
    body_subgraph: int
    carried: int  # m: loop-carried (also the outputs)
    state: int  # k: loop-state-only


def subgraph_index(ctx: OperationContext, i: int) -> int:
    """The referenced subgraph input i names (checked to exist)."""
    info = ctx.input(i)
    ctx.check(info.type == SUBGRAPH, f"input {i} must be a SUBGRAPH operand, got {type_name(info.type)}")
    ctx.check(info.value is not None, f"input {i}: a SUBGRAPH operand must reference a subgraph")
    k = int(info.value)
    n = len(ctx.subgraphs or ())
    ctx.check(0 <= k < n, f"input {i} references subgraph {k}, the model has {n}")
    return k


def _subgraph_infos(ctx: OperationContext, k: int, indexes) -> list[OperandInfo]:
    return [ctx.subgraph_operand_info(k, i) for i in indexes]


def _compatible(a: OperandInfo, b: OperandInfo) -> str | None:
    """Why ``a`` (outer) and ``b`` (subgraph) are not compatible, or None."""
    if a.type != b.type:
        return f"type {type_name(a.type)} vs {type_name(b.type)}"
    if a.scale != b.scale or a.zero_point != b.zero_point:
        return f"quantization ({a.scale}, {a.zero_point}) vs ({b.scale}, {b.zero_point})"
    ca, cb = a.channel_scales, b.channel_scales
    if (ca is None) != (cb is None) or (ca is not None and (a.channel_dim != b.channel_dim
                                                            or list(ca) != list(cb))):
        return "per-channel quantization differs"
    if a.rank_known and b.rank_known and a.shape and b.shape:
        if len(a.shape) != len(b.shape) or any(x and y and x != y for x, y in zip(a.shape, b.shape)):
            return f"dimensions {list(a.shape)} vs {list(b.shape)}"
    return None


def _expect_compatible(ctx: OperationContext, what: str, outer: OperandInfo, inner: OperandInfo) -> None:
    why = _compatible(outer, inner)
    if why is not None:
        raise ctx.fail(f"{what} is not compatible with the subgraph's operand: {why}")


def _expect_condition(ctx: OperationContext, info: OperandInfo, what: str) -> None:
    ctx.check(info.type == BOOL8, f"{what} must be TENSOR_BOOL8, got {type_name(info.type)}")
    if info.rank_known and info.shape and tuple(info.shape) not in ((1,), (0,)):
        raise ctx.fail(f"{what} must have shape [1], got {list(info.shape)}")


def validate_if(ctx: OperationContext) -> None:
    ctx.check(ctx.num_inputs >= 3, f"expected at least 3 inputs, got {ctx.num_inputs}")
    ctx.check(ctx.num_outputs >= 1, "expected at least 1 output")
    _expect_condition(ctx, ctx.input(CONDITION), "input 0 (the condition)")
    n_in = ctx.num_inputs - FIRST_BRANCH_INPUT
    for i, branch in ((THEN_BRANCH, "then"), (ELSE_BRANCH, "else")):
        k = subgraph_index(ctx, i)
        sg = ctx.subgraphs[k]
        ctx.check(len(sg.input_indexes) == n_in and len(sg.output_indexes) == ctx.num_outputs,
                  f"the {branch} branch (referenced subgraph {k}) has {len(sg.input_indexes)} inputs and "
                  f"{len(sg.output_indexes)} outputs; the IF passes {n_in} and expects {ctx.num_outputs}")
        for j, inner in enumerate(_subgraph_infos(ctx, k, sg.input_indexes)):
            _expect_compatible(ctx, f"input {FIRST_BRANCH_INPUT + j} ({branch} branch input {j})",
                               ctx.input(FIRST_BRANCH_INPUT + j), inner)
        for j, inner in enumerate(_subgraph_infos(ctx, k, sg.output_indexes)):
            _expect_compatible(ctx, f"output {j} ({branch} branch output {j})", ctx.output(j), inner)


def _while_counts(ctx: OperationContext) -> tuple[int, int, int]:
    """(m, k, n): loop-carried, loop-state-only and input-only inputs, from the body's signature."""
    body = ctx.subgraphs[subgraph_index(ctx, BODY_SUBGRAPH)]
    total = ctx.num_inputs - FIRST_LOOP_INPUT
    m = ctx.num_outputs
    k = len(body.output_indexes) - m
    ctx.check(k >= 0 and m + k <= total,
              f"the body has {len(body.output_indexes)} outputs: it must give the {m} loop-carried "
              f"values and at most {total - m} loop-state ones")
    return m, k, total - m - k


def validate_while(ctx: OperationContext) -> None:
    ctx.check(ctx.num_inputs >= 3, f"expected at least 3 inputs, got {ctx.num_inputs}")
    ctx.check(ctx.num_outputs >= 1, "expected at least 1 output")
    cond_k, body_k = subgraph_index(ctx, COND_SUBGRAPH), subgraph_index(ctx, BODY_SUBGRAPH)
    total = ctx.num_inputs - FIRST_LOOP_INPUT
    m, k, _ = _while_counts(ctx)
    outer = [ctx.input(FIRST_LOOP_INPUT + j) for j in range(total)]
    for name, sub in (("condition", cond_k), ("body", body_k)):
        sg = ctx.subgraphs[sub]
        ctx.check(len(sg.input_indexes) == total,
                  f"the {name} (referenced subgraph {sub}) has {len(sg.input_indexes)} inputs, "
                  f"the WHILE passes {total}")
        for j, inner in enumerate(_subgraph_infos(ctx, sub, sg.input_indexes)):
            _expect_compatible(ctx, f"input {FIRST_LOOP_INPUT + j} ({name} input {j})", outer[j], inner)
    cond = ctx.subgraphs[cond_k]
    ctx.check(len(cond.output_indexes) == 1,
              f"the condition (referenced subgraph {cond_k}) must have 1 output, got {len(cond.output_indexes)}")
    _expect_condition(ctx, ctx.subgraph_operand_info(cond_k, cond.output_indexes[0]), "the condition's output")
    body = ctx.subgraphs[body_k]
    body_outs = _subgraph_infos(ctx, body_k, body.output_indexes)
    for j, inner in enumerate(body_outs):  # what the body gives back goes in again next iteration
        _expect_compatible(ctx, f"input {FIRST_LOOP_INPUT + j} (body output {j})", outer[j], inner)
    for j in range(m):
        _expect_compatible(ctx, f"output {j} (body output {j})", ctx.output(j), body_outs[j])
    del k


def _declared_or_unknown(ctx: OperationContext, j: int, candidates: list[OperandInfo]) -> tuple[int, ...]:
    """Output j's shape as far as declarations tell: the output's own if fully specified, else the
    subgraphs' if they all declare the same full shape, else 0 where unknown (decided at run time)."""
    out = ctx.output(j)
    if out.shape and all(d > 0 for d in out.shape):
        return tuple(out.shape)
    shapes = {tuple(c.shape) for c in candidates}
    if len(shapes) == 1:
        (shape,) = shapes
        if shape and all(d > 0 for d in shape) and (not out.shape or len(out.shape) == len(shape)):
            return shape
    rank = len(out.shape) or next((len(c.shape) for c in candidates if c.shape), 0)
    return tuple(out.shape) if out.shape else (0,) * rank


def prepare_if(ctx: OperationContext) -> IfParams:
    then_k, else_k = subgraph_index(ctx, THEN_BRANCH), subgraph_index(ctx, ELSE_BRANCH)
    for j in range(ctx.num_outputs):
        branches = [ctx.subgraph_operand_info(k, ctx.subgraphs[k].output_indexes[j]) for k in (then_k, else_k)]
        ctx.output_shapes[j] = _declared_or_unknown(ctx, j, branches)
    return IfParams(then_k, else_k)


def prepare_while(ctx: OperationContext) -> WhileParams:
    cond_k, body_k = subgraph_index(ctx, COND_SUBGRAPH), subgraph_index(ctx, BODY_SUBGRAPH)
    m, k, _ = _while_counts(ctx)
    body = ctx.subgraphs[body_k]
    for j in range(m):
        # Zero iterations give back the input, one or more the body's output: known only if they agree.
        candidates = [ctx.input(FIRST_LOOP_INPUT + j), ctx.subgraph_operand_info(body_k, body.output_indexes[j])]
        ctx.output_shapes[j] = _declared_or_unknown(ctx, j, candidates)
    return WhileParams(cond_k, body_k, m, k)


register(IF, validate=validate_if, prepare=prepare_if, input_types=(BOOL8,), num_outputs=None, min_inputs=3,
         min_feature_level=FeatureLevel.FL4, data_dependent_outputs=True, allow_zero_sized_inputs=True)
register(WHILE, validate=validate_while, prepare=prepare_while, input_types=(SUBGRAPH,), num_outputs=None,
         min_inputs=3, min_feature_level=FeatureLevel.FL4, data_dependent_outputs=True,
         allow_zero_sized_inputs=True)
