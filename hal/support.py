"""getSupportedOperations: which operations of a model this driver runs, and why not the others.

Answered by preparing each operation as ``hal.compiler`` would (without repacking weights), so
support is never claimed for a variant execute cannot run.
"""
from __future__ import annotations

from typing import Iterable

from hal import backends
from hal.backends import Backend
from hal.compiler import Subgraphs, inputs_static, outputs_known, prepare_operation
from hal.errors import HalError, RuntimeValueNeeded
from hal.extension_registry import extension_name, model_prefixes
from hal.model import Model
from hal.operands import operand_infos, operation_context
from hal.registry import OperandInfo
from hal.validation import validate_model


def support_reasons(model: Model, backend_order: Iterable[str] | None = None) -> list[str | None]:
    """getSupportedOperations with reasons: None for each supported operation of the main
    subgraph, else hal's message saying why not.

    The model must be valid (HalError otherwise). An operation is supported when it has a spec,
    its validate and prepare accept it as declared and a backend's kernel takes it, so support
    is never claimed for a variant execute cannot run. Weights are not repacked for the answer:
    a delegate asks on every start, cached or not."""
    validate_model(model)
    infos = operand_infos(model, copy=False)  # nothing outlives the query: no need to copy constants
    order = backends.candidates(backend_order)
    subgraphs = None
    if model.referenced:  # an IF or WHILE is supported when its subgraphs compile
        names = backends.parse_preference(backend_order) if backend_order is not None else backends.preference()
        subgraphs = Subgraphs(model, False, names)
    static = inputs_static(model, infos)
    result: list[str | None] = []
    for k in range(len(model.main.operations)):
        try:
            step = prepare_operation(k, model, infos, packing=False, order=order, shapes_known=static,
                                     subgraphs=subgraphs)
            result.append(None)
            if step.spec.data_dependent_outputs and not outputs_known(step.ctx):
                static = False  # later 0s may stand for sizes known only at execution
        except RuntimeValueNeeded:
            # Planned at execution, from the values: supported if some backend runs its type.
            result.append(_runtime_support(k, model, infos, order))
        except HalError as e:
            result.append(e.message)
    return result


def _runtime_support(k: int, model: Model, infos: list[OperandInfo], order: list[Backend]) -> str | None:
    operation = model.main.operations[k]
    prefixes = model_prefixes(model)
    ctx = operation_context(k, operation, model.main.operands, infos)
    ext = extension_name(operation.type, prefixes)
    if ext is not None:
        order = [b for b in [backends.extension_backend(ext)] if b is not None]
    for backend in order:
        # Only the input type can be checked: supports() may need the params prepare could not make.
        kernel = backend.kernel(operation.type & 0xFFFF if ext else operation.type)
        if kernel is not None and (not ctx.inputs or ctx.inputs[0] is None or kernel.runs_type(ctx.inputs[0].type)):
            return None
    return f"{ctx.name}: no backend runs it"


def supported_operations(model: Model, backend_order: Iterable[str] | None = None) -> list[bool]:
    """getSupportedOperations: one bool per operation of the main subgraph (see support_reasons)."""
    return [r is None for r in support_reasons(model, backend_order)]
