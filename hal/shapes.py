"""Shape inference: every operand's shape from the model's input shapes, by the operations' specs.

Each spec's ``prepare`` sets its outputs' shapes from its inputs' (NNAPI's shape rules, the same
call the compiler plans with). A client that must know a model's shapes before preparing it (the
TFLite delegate, converting a partition again after a resize) asks here instead of keeping a
copy of those rules.
"""
from __future__ import annotations

import dataclasses

from hal.errors import HalError, RuntimeValueNeeded
from hal.extension_registry import lookup_in_model, model_prefixes
from hal.model import Model
from hal.operands import operand_infos, operation_context
from hal.operations.control_flow import CONTROL_FLOW
from hal.registry import OperandInfo, OperationContext
from hal.types import ErrorStatus, operation_name


class ShapesNotInferable(HalError):
    """No shape can be given ahead of execution: an operation without shape rules, or with output
    shapes that depend on values known only at run time."""

    def __init__(self, message: str):
        super().__init__(ErrorStatus.GENERAL_FAILURE, message)


def set_output_shapes(ctx: OperationContext, outputs, infos: list[OperandInfo]) -> None:
    """After ``spec.prepare(ctx)``: record each output's prepared shape in ``infos`` (and in ctx)."""
    for j, shape in enumerate(ctx.output_shapes):
        if shape is None:
            raise HalError(ErrorStatus.GENERAL_FAILURE, f"{ctx.name}: prepare set no shape for output {j}")
        o = outputs[j]
        infos[o] = dataclasses.replace(infos[o], shape=tuple(shape))
        ctx.outputs[j] = infos[o]


def infer_operand_shapes(model: Model) -> list[tuple[int, ...]]:
    """Every operand's shape, each operation's outputs computed by its spec from its inputs'
    shapes (and constant values), whatever the outputs' declared dimensions. IF / WHILE keep their
    declared output shapes (their subgraphs are not planned here).

    ShapesNotInferable where an operation cannot say; HalError(INVALID_ARGUMENT) where its rules
    reject the shapes it is given."""
    infos = operand_infos(model, copy=False)
    prefixes = model_prefixes(model)
    operands = model.main.operands
    for k, operation in enumerate(model.main.operations):
        if operation.type in CONTROL_FLOW:
            continue
        spec = lookup_in_model(operation.type, prefixes)
        name = operation_name(operation.type)
        if spec is None:
            raise ShapesNotInferable(f"NNAPI {name}: no shape rules to infer its output shapes from")
        if spec.data_dependent_outputs:
            raise ShapesNotInferable(f"NNAPI {name}: its output shapes depend on values known only at run time")
        for o in operation.outputs:  # declared dims may be stale: the spec computes them
            infos[o] = dataclasses.replace(infos[o], shape=())
        ctx = operation_context(k, operation, operands, infos, model=model)
        try:
            spec.prepare(ctx)
        except RuntimeValueNeeded as e:
            raise ShapesNotInferable(f"NNAPI {name}: its output shapes depend on run-time values "
                                     f"({getattr(e, 'detail', None) or e.message})") from None
        except HalError as e:
            raise HalError(ErrorStatus.INVALID_ARGUMENT, f"NNAPI {name} rejects the shapes: "
                                                         f"{getattr(e, 'detail', None) or e.message}") from None
        except Exception as e:  # noqa: BLE001 - a spec's bug: no shapes, no crash
            raise ShapesNotInferable(f"NNAPI {name}: cannot infer its output shapes: {e!r}") from None
        set_output_shapes(ctx, operation.outputs, infos)
    return [info.shape for info in infos]


__all__ = ["ShapesNotInferable", "infer_operand_shapes", "set_output_shapes"]
