"""The delegate's support probe: which nodes of a TFLite graph the nnhal service would run.

Each node is mapped to NNAPI (a node without a mapping, or with parameters the delegate does not
read, is answered here), then one getSupportedOperations call asks the service about every mapped
node at once: a probe model in which every mapped tensor is an input or an output, so each node's
operations are valid on their own.
"""
from __future__ import annotations

import re

import hal
from delegate.mapping import InvalidNnapiOperation, MappingContext, MappingError, lookup_mapper, map_node
from delegate.mapping.core import custom_provider, lookup_custom_mapper
from delegate.tfl.schema import builtin_name
from service.client import Client, ServiceError


def op_name(node) -> str:
    return f"CUSTOM({node.custom_code})" if node.custom_code else builtin_name(node.builtin_code)


def _zero_sized(graph, node) -> str | None:
    """Why a node with a zero-sized tensor ([0, 3]) stays on TFLite: NNAPI reads a 0 dimension as
    "unknown", so a request cannot carry such a tensor (validation wants every request dimension
    known) and every invoke would fail; TFLite runs it (an empty result)."""
    for t in (*node.inputs, *node.outputs):
        if t < 0 or graph.tensors[t].is_constant:
            continue
        shape = graph.tensors[t].shape
        if 0 in shape:
            return (f"tensor {t} is zero-sized ({list(shape)}): NNAPI reads a 0 dimension as unknown, so "
                    f"it cannot carry an empty tensor; TFLite runs this node")
    return None


def supported_nodes(graph, client: Client | None) -> dict[int, str | None]:
    """Mapping check per node, then one GetSupportedOperations call for all mappable nodes."""
    reasons: dict[int, str | None] = {}
    ctx = MappingContext(graph)
    spans: dict[int, tuple[int, int]] = {}
    for node in graph.nodes:
        if node.outputs and all(graph.tensors[t].is_constant for t in node.outputs):
            reasons[node.index] = None  # folded into constants at delegation time
            continue
        if node.custom_code is not None:
            found = custom_provider(node)
            if found is None and lookup_custom_mapper(node.custom_code) is None:
                reasons[node.index] = f"no NNAPI mapping for {op_name(node)}: no registered extension implements it"
                continue
        elif lookup_mapper(node.builtin_code) is None:
            reasons[node.index] = f"no NNAPI mapping for {op_name(node)}"
            continue
        if node.options.get("__undecoded__"):
            reasons[node.index] = "parameters of this builtin are not read by the delegate"
            continue
        empty = _zero_sized(graph, node)
        if empty is not None:
            reasons[node.index] = empty
            continue
        checkpoint = ctx.checkpoint()
        start = len(ctx.builder.model.main.operations)
        try:
            map_node(ctx, node)
        except InvalidNnapiOperation as e:
            ctx.rollback(checkpoint)
            reasons[node.index] = str(e)
            continue
        except MappingError as e:
            ctx.rollback(checkpoint)
            reasons[node.index] = f"no NNAPI mapping: {e}"
            continue
        except Exception as e:  # noqa: BLE001 - a mapper bug must not break delegation
            ctx.rollback(checkpoint)
            reasons[node.index] = f"mapping failed: {e!r}"
            continue
        spans[node.index] = (start, len(ctx.builder.model.main.operations))
    if not spans:
        return reasons
    # Every mapped tensor becomes an input or output so the probe model is valid on its own.
    b = ctx.builder
    written = {o for op in b.model.main.operations for o in op.outputs}
    consts = {i for i, o in enumerate(b.operands) if o.lifetime != hal.OperandLifeTime.TEMPORARY_VARIABLE}
    ins = [i for i in range(len(b.operands)) if i not in written and i not in consts]
    outs = sorted(written)
    b.identify_inputs_and_outputs(ins, outs)
    model = b.finish()
    if client is None:
        answers = hal.support_reasons(model)
    else:
        try:
            answers = client.get_support_reasons(model)
        except ServiceError as e:
            for k in spans:
                reasons[k] = f"service error: {e}"
            return reasons
    for k, (lo, hi) in spans.items():
        why = next((a for a in answers[lo:hi] if a is not None), None)
        reasons[k] = None if why is None else f"not supported by the nnhal service: {_strip_operation(why)}"
    return reasons


_OPERATION_PREFIX = re.compile(r"^operation \d+ \((.*?)\): ")  # names may hold parentheses: EXTENSION(...)


def _strip_operation(message: str) -> str:
    """hal's "operation 3 (HARD_SWISH): ..." names an index of the probe model, not a node of
    the user's graph: keep the operation's name only."""
    return _OPERATION_PREFIX.sub(r"\1: ", message, count=1)
