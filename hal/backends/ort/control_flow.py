"""WHILE and IF as ONNX Loop and If: a loop runs inside the partition's session, whole.

Run by the executor (``hal.control_flow``), each trip pays a backend run of the condition and
one of the body, plus Python dispatch. Lowered, the loop is one Loop node: the condition
subgraph is lowered once before it (the first check) and again inside the body graph, on the
body's results (the next check); values the body only reads (NNAPI's input-only operands) are
read from the outer graph by name. An IF is one If node whose branches read their inputs the same
way. The referenced subgraphs are lowered from their own plans (``ctx.compiled_subgraphs``: each
operation's prepared context, in the subgraph's operand numbering), with this backend's
lowerings: the WHILE or IF is taken only when every operation of those plans is an onnxruntime
member (else it runs in the executor as before, and says why).

The loop timeout and the deadline: a partition with loops runs under a ``RunOptions`` whose
terminate flag a watchdog thread sets once the run is past its limit (``Executable``); the
executor's error (MISSED_DEADLINE_TRANSIENT, "the loop ran longer than the loop timeout") is kept.
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from hal.backends.ort import BACKEND
from hal.backends.ort.comparison import canonical_bool
from hal.backends.ort.graph import Inputs, OnnxGraph, onnx_type, read_in_subgraphs
from hal.errors import RuntimeValueNeeded
from hal.operations.common import I32
from hal.operations.comparison import LESS
from hal.operations.control_flow import (
    BOOL8,
    FIRST_BRANCH_INPUT,
    FIRST_LOOP_INPUT,
    IF,
    SUBGRAPH,
    WHILE,
    IfParams,
    WhileParams,
)
from hal.operations.elementwise import ADD
from hal.registry import OperationContext

#: A counted loop's body of at most UNROLL_MAX_OPERATIONS operations runs UNROLL times per trip of
#: the Loop (and the remainder in a second Loop): onnxruntime's Loop costs about as much per trip
#: as a few small operations (it runs the body as a graph of its own each time). A 64-unit
#: recurrence (tests/delegate/control_flow_models.recurrent_loop_model), p50 µs at 3 / 10 / 16 / 40
#: trips: 4 copies 21.7 / 29.9 / 36.0 / 64.7, 8 copies 22.0 / 28.5 / 32.3 / 55.8, 16 copies
#: 22.4 / 33.8 / 32.0 / 59.7.
UNROLL = 8
UNROLL_MAX_OPERATIONS = 16


def _plan(ctx: OperationContext, k: int, shapes: tuple):
    """The referenced subgraph k, compiled, and its plan for these input shapes (None: none static)."""
    compiled = ctx.compiled_subgraphs.get(k)
    try:
        return compiled, compiled.plan_for(shapes)
    except RuntimeValueNeeded:
        return compiled, None


def _unlowered(ctx: OperationContext, k: int, shapes: tuple) -> str | None:
    compiled, plan = _plan(ctx, k, shapes)
    if plan is None:
        return f"referenced subgraph {k} is planned only as it runs"
    for step in plan.steps:
        if step.backend != BACKEND.name:
            return f"referenced subgraph {k}: {step.ctx.name} runs on {step.backend or 'no backend'}"
    if any(plan.infos[o].value is not None for o in compiled.output_indexes):
        return f"referenced subgraph {k} outputs a constant"
    return None


def _input_shapes(ctx: OperationContext, first: int) -> tuple | None:
    shapes = []
    for info in ctx.inputs[first:]:
        if info is None or not info.rank_known or not all(d > 0 for d in info.shape):
            return None
        shapes.append(tuple(info.shape))
    return tuple(shapes)


def supports_while(ctx: OperationContext) -> str | None:
    if ctx.compiled_subgraphs is None:
        return "its subgraphs are not compiled here"
    p: WhileParams = ctx.params
    shapes = _input_shapes(ctx, FIRST_LOOP_INPUT)
    if shapes is None:
        return "a loop input's shape is not known"
    for k in (p.cond_subgraph, p.body_subgraph):
        why = _unlowered(ctx, k, shapes)
        if why is not None:
            return why
    body, plan = _plan(ctx, p.body_subgraph, shapes)
    if [plan.infos[o].shape for o in body.output_indexes] != list(shapes[:p.carried + p.state]):
        return "the body changes the shape of a value it carries"
    return None


def _inline(g: OnnxGraph, ctx: OperationContext, k: int, shapes: tuple, names: list[str]) -> list[str]:
    """Referenced subgraph k's operations lowered into ``g`` (a scope over its numbering) with
    its inputs bound to ``names``; the names of its outputs."""
    compiled, plan = _plan(ctx, k, shapes)
    g.infos = plan.infos
    for i, name in zip(compiled.input_indexes, names):
        g.bind(i, name)
    for step in plan.steps:
        lowering = BACKEND.lowering_for(step.ctx.op_type)
        outs = lowering.lower(g, step.ctx, Inputs(g, step.inputs))
        for o, name in zip(step.outputs, outs):
            g.bind(o, name)
    return [g.operand(o) for o in compiled.output_indexes]


def _copied_from(g: OnnxGraph, name: str) -> str:
    """The value ``name`` is an Identity (chain) of in ``g``, or itself."""
    copies = {n.output[0]: n.input[0] for n in g.nodes if n.op_type == "Identity"}
    while name in copies:
        name = copies[name]
    return name


def _scalar_condition(g: OnnxGraph, name: str) -> str:
    """An NNAPI condition (BOOL8, one element, any nonzero byte true) as ONNX's bool scalar."""
    return g.node("Reshape", [canonical_bool(g, name), g.ints([])])


def _value_info(name: str, info) -> object:
    return helper.make_tensor_value_info(name, onnx_type(info.dtype), list(info.shape))


def lower_while(g: OnnxGraph, ctx: OperationContext, x) -> list[str]:
    p: WhileParams = ctx.params
    shapes = _input_shapes(ctx, FIRST_LOOP_INPUT)
    outer = [x[j] for j in range(FIRST_LOOP_INPUT, len(ctx.inputs))]
    carried = p.carried + p.state
    # A value the body gives back unchanged (its output is that input, or a copy of it: how
    # converters pass a loop's bound and read-only tensors through) is read from the outer graph,
    # not carried: fewer values for onnxruntime to move every trip. A Loop carries at least one.
    trial = g.scope([], nested=True)
    names = [trial.fresh("state") for _ in range(carried)]
    got = _inline(trial, ctx, p.body_subgraph, shapes, names + outer[carried:])
    moving = [j for j in range(carried) if _copied_from(trial, got[j]) != names[j]] or [0]
    counted = _counted(ctx, p, shapes, moving)
    if counted is None:
        first = _inline(g.scope([], nested=False), ctx, p.cond_subgraph, shapes, outer)
        final = _loop(g, ctx, outer, moving, "", _scalar_condition(g, first[0]))
    else:  # the trip count up front: no condition to check in the body
        counter, bound, keep = counted
        wide = [g.node("Cast", [outer[j]], to=TensorProto.INT64) for j in (bound, counter)]
        trips = g.node("Reshape", [g.node("Max", [g.node("Sub", wide), g.const(np.int64(0))]), g.ints([])])
        if not keep and len(moving) > 1:
            moving = [j for j in moving if j != counter]
        copies = UNROLL if len(_plan(ctx, p.body_subgraph, shapes)[1].steps) <= UNROLL_MAX_OPERATIONS else 1
        values = outer
        if copies > 1:  # whole blocks of trips, then the rest one by one
            blocks = g.node("Div", [trips, g.const(np.int64(copies))])
            final = _loop(g, ctx, values, moving, blocks, g.const(np.array(True)), copies)
            values = [final.get(j, v) for j, v in enumerate(outer)]
            trips_left = g.node("Mod", [trips, g.const(np.int64(copies))])
        else:
            trips_left = trips
        final = _loop(g, ctx, values, moving, trips_left, g.const(np.array(True)))
        if counter not in final:  # the counter's last value: where it started + the trips
            final[counter] = g.node("Add", [outer[counter], g.node("Cast", [trips], to=TensorProto.INT32)])
    g.loops.append(ctx.name)
    return [final.get(j, outer[j]) for j in range(p.carried)]


def _loop(g: OnnxGraph, ctx: OperationContext, outer: list[str], moving: list[int], trips: str, condition: str,
          copies: int = 1) -> dict[int, str]:
    """One Loop node over the WHILE's body (``copies`` times in a row per trip) carrying the
    values ``moving``; without a trip count, the condition is checked after each trip. The
    Loop's final values, by loop-value position."""
    p: WhileParams = ctx.params
    shapes = _input_shapes(ctx, FIRST_LOOP_INPUT)
    body = g.scope([], nested=True)
    trip, cond_in = body.fresh("trip"), body.fresh("cond_in")
    state = {j: body.fresh("state") for j in moving}
    values = [state.get(j, v) for j, v in enumerate(outer)]
    for _ in range(copies):  # the same scope each time: its operands are bound again as lowered
        results = _inline(body, ctx, p.body_subgraph, shapes, values)
        values = [results[j] if j in state else v for j, v in enumerate(outer)]
    if trips:
        again = cond_in
    else:
        nxt = _inline(body.scope([], nested=False), ctx, p.cond_subgraph, shapes, values)
        again = _scalar_condition(body, nxt[0])
    loop_vars = [ctx.inputs[FIRST_LOOP_INPUT + j] for j in moving]
    _fold_invariant_addends(g, body, {trip, cond_in, *state.values()}, {values[j] for j in moving} | {again})
    graph = body.subgraph(
        body.fresh("while_body"),
        [helper.make_tensor_value_info(trip, TensorProto.INT64, []),
         helper.make_tensor_value_info(cond_in, TensorProto.BOOL, None),
         *(_value_info(state[j], info) for j, info in zip(moving, loop_vars))],
        [helper.make_tensor_value_info(again, TensorProto.BOOL, []),
         *(_value_info(values[j], info) for j, info in zip(moving, loop_vars))])
    outs = g.node("Loop", [trips, condition, *(outer[j] for j in moving)], outputs=len(moving), body=graph)
    return dict(zip(moving, [outs] if len(moving) == 1 else outs))


def _fold_invariant_addends(g: OnnxGraph, body: OnnxGraph, formal: set[str], results: set[str]) -> None:
    """Add(Gemm(a, B, C), v) in a Loop's body, with C and v the same on every trip (values of the
    outer graph: the bias, a loop input the body only reads), as Gemm(a, B, C + v), C + v added
    once in ``g`` before the Loop: a node less per trip, and onnxruntime then fuses the Gemm with
    the activation after it (FusedGemm), as an RNN step h = tanh(FC(h) + x) is written. Only where
    v broadcasts into the Gemm's output (Gemm's C broadcasts one way) and the Add is the Gemm's
    only reader. ``formal``: the body's inputs; ``results``: the names it gives back."""
    made = {o for n in body.nodes for o in n.output}
    readers: dict[str, int] = {}
    for n in body.nodes:
        for i in [*n.input, *read_in_subgraphs(n)]:
            readers[i] = readers.get(i, 0) + 1
    gemms = {n.output[0]: n for n in body.nodes if n.op_type == "Gemm" and not n.domain
             and all(a.name in ("transA", "transB") for a in n.attribute)}
    sums: dict[tuple[str, str], str] = {}
    kept = []
    for n in body.nodes:
        gemm = None
        if n.op_type == "Add" and not n.domain:
            for k, name in enumerate(n.input):
                other = n.input[1 - k]
                if name in gemms and readers[name] == 1 and name not in results \
                        and other not in made and other not in formal \
                        and _broadcasts_into(g.shapes.get(other), g.shapes.get(n.output[0]), g.shapes.get(name)):
                    gemm = gemms[name]
                    break
        c = None if gemm is None else (gemm.input[2] if len(gemm.input) > 2 and gemm.input[2] else None)
        if gemm is None or (c is not None and (c in made or c in formal)):
            kept.append(n)
            continue
        if c is None:
            gemm.input.append(other)
        else:
            key = (c, other)
            if key not in sums:
                sums[key] = g.node("Add", [c, other])
            gemm.input[2] = sums[key]
        gemm.output[0] = n.output[0]
    body.nodes[:] = kept


def _broadcasts_into(v: tuple | None, out: tuple | None, gemm: tuple | None) -> bool:
    """Whether a value of shape ``v`` broadcasts one way into the 2-D ``gemm`` output, which the
    Add (of output ``out``) leaves as it is."""
    if v is None or out is None or gemm is None or len(gemm) != 2 or tuple(out) != tuple(gemm) or len(v) > 2:
        return False
    return all(d in (1, t) for d, t in zip(reversed(v), reversed(gemm)))


def _counted(ctx: OperationContext, p: WhileParams, shapes: tuple, moving: list[int]):
    """(counter, bound, kept) for a loop as converters write a counted one: the condition is
    LESS(i, n) of a loop value i the body steps by ADD(i, 1) and a value n the loop never changes.
    It then runs max(n - i, 0) trips (i never wraps: it stops at n), which onnxruntime's Loop
    takes as its trip count. ``kept``: the body reads i for more than its step (carried still)."""
    cond, cplan = _plan(ctx, p.cond_subgraph, shapes)
    if len(cplan.steps) != 1 or cplan.steps[0].ctx.op_type != LESS \
            or cplan.steps[0].outputs[0] != cond.output_indexes[0]:
        return None
    inputs = list(cond.input_indexes)
    a, b = cplan.steps[0].inputs
    if a not in inputs or b not in inputs:
        return None
    counter, bound = inputs.index(a), inputs.index(b)
    if counter not in moving or bound in moving or ctx.inputs[FIRST_LOOP_INPUT + counter].type != I32:
        return None
    body, plan = _plan(ctx, p.body_subgraph, shapes)
    i, i2 = body.input_indexes[counter], body.output_indexes[counter]
    step = next((s for s in plan.steps if i2 in s.outputs), None)
    if step is None or step.ctx.op_type != ADD or step.inputs[0] != i or step.ctx.params.act != 0:
        return None
    one = plan.infos[step.inputs[1]].value
    if one is None or np.asarray(one).size != 1 or int(np.asarray(one).reshape(-1)[0]) != 1:
        return None
    readers = sum(v in s.inputs for s in plan.steps for v in (i, i2))
    return counter, bound, readers != 1 or list(body.output_indexes).count(i2) != 1


def supports_if(ctx: OperationContext) -> str | None:
    if ctx.compiled_subgraphs is None:
        return "its subgraphs are not compiled here"
    p: IfParams = ctx.params
    shapes = _input_shapes(ctx, FIRST_BRANCH_INPUT)
    if shapes is None:
        return "a branch input's shape is not known"
    if not all(s is not None and all(d > 0 for d in s) for s in ctx.output_shapes):
        return "the branches' output shapes are not known"
    for k in (p.then_subgraph, p.else_subgraph):
        why = _unlowered(ctx, k, shapes)
        if why is not None:
            return why
        compiled, plan = _plan(ctx, k, shapes)
        if [plan.infos[o].shape for o in compiled.output_indexes] != [tuple(s) for s in ctx.output_shapes]:
            return f"referenced subgraph {k} gives other output shapes than the IF's"
    return None


def lower_if(g: OnnxGraph, ctx: OperationContext, x) -> list[str]:
    p: IfParams = ctx.params
    shapes = _input_shapes(ctx, FIRST_BRANCH_INPUT)
    outer = [x[j] for j in range(FIRST_BRANCH_INPUT, len(ctx.inputs))]
    branches = []
    for k in (p.then_subgraph, p.else_subgraph):
        scope = g.scope([], nested=True)
        outs = _inline(scope, ctx, k, shapes, outer)
        g.loops.extend(scope.loops)  # a branch runs once: its loops are bounded as this graph's own
        branches.append(scope.subgraph(scope.fresh("branch"), [], [_typed(n, ctx, j) for j, n in enumerate(outs)]))
    outs = g.node("If", [_scalar_condition(g, x[0])], outputs=ctx.num_outputs, then_branch=branches[0],
                  else_branch=branches[1])
    return [outs] if ctx.num_outputs == 1 else outs


def _typed(name: str, ctx: OperationContext, j: int) -> object:
    return helper.make_tensor_value_info(name, onnx_type(ctx.outputs[j].dtype), list(ctx.output_shapes[j]))


# (input 0: the condition subgraph, the IF's condition; the values' types are what the subgraphs' lowerings take)
BACKEND.lowering(WHILE, lower=lower_while, types=[SUBGRAPH], supports=supports_while)
BACKEND.lowering(IF, lower=lower_if, types=[BOOL8], supports=supports_if)
