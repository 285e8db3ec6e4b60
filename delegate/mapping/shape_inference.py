"""Shapes TFLite did not propagate, inferred by hal for a partition converted again.

After resize_tensor_input TFLite prepares the original nodes up to the first one whose output it
can size only when it runs (kTfLiteDynamic: e.g. a RESHAPE to a computed shape, as Keras' Flatten
of a dynamic batch is converted) and stops there: the tensors after it keep their old dims. A
partition holding such nodes is still computable, since folding (delegate.mapping.folding)
makes the computed shapes constants of the current input shapes, but its tensors' shapes must
come from the partition itself. hal knows them (``hal.shapes.infer_operand_shapes``: NNAPI's
shape rules, as the driver compiles them).

convert_with_inferred_shapes converts the partition, infers every operand's shape in operation
order, gives the TFLite tensors the partition produces those shapes, folds again (a SHAPE of one
of them changes) and repeats until nothing changes. Mappers then see consistent shapes, and the
model's output operands carry the shapes the delegate kernel resizes TFLite's outputs to.
"""
from __future__ import annotations

import dataclasses

from delegate.mapping.core import ConvertedPartition, InvalidNnapiOperation, MappingError
from delegate.mapping.folding import fold_constants
from delegate.mapping.scalars import nnapi_shape
from delegate.tfl.graph import TfLiteGraph
from hal.errors import HalError
from hal.shapes import ShapesNotInferable, infer_operand_shapes
from hal.validation import validate_model


def convert_with_inferred_shapes(convert, graph: TfLiteGraph, node_indexes: list[int], inputs, outputs,
                                 validate: bool) -> ConvertedPartition:
    """``convert(graph, nodes, inputs, outputs, validate=)`` (core's converter) until the shapes of
    the tensors the partition produces are those hal infers from its inputs' (TFLite's current
    ones). Those tensors are sized here, so TFLite's kTfLiteDynamic on one of them is no reason
    to refuse the partition."""
    produced = {t for n in node_indexes for t in graph.nodes[n].outputs if t >= 0}
    tensors = list(graph.tensors)
    for t in produced:
        tensors[t] = dataclasses.replace(tensors[t], runtime_shape=False)
    graph = dataclasses.replace(graph, tensors=tensors)

    def stale(t: int, shape: tuple[int, ...]) -> bool:  # a scalar may be NNAPI [1]: delegate.mapping.scalars
        info = graph.tensors[t]
        return not info.is_constant and shape != tuple(info.shape) and shape != nnapi_shape(info)

    for _ in range(len(node_indexes) + 2):  # each pass fixes at least the first stale tensor
        graph, _ = fold_constants(graph)
        part = convert(graph, node_indexes, inputs, outputs, validate=False)
        try:
            shapes = infer_operand_shapes(part.model)
        except ShapesNotInferable as e:
            raise MappingError(e.message) from None
        except HalError as e:
            raise InvalidNnapiOperation(f"at the resized shapes: {e.message}") from None
        changed = {t: shapes[o] for t, o in part.tensor_operands.items() if t in produced and stale(t, shapes[o])}
        if not changed:
            if validate and part.model.main.operations:  # none: every node folded (nothing to validate)
                try:
                    validate_model(part.model)
                except HalError as e:
                    raise InvalidNnapiOperation(f"NNAPI rejects the partition at its new shapes: "
                                                f"{getattr(e, 'detail', None) or e.message}") from None
            return part
        tensors = list(graph.tensors)
        for t, shape in changed.items():
            tensors[t] = dataclasses.replace(tensors[t], shape=shape)
        graph = dataclasses.replace(graph, tensors=tensors)
    raise MappingError("the partition's shapes do not settle: inferring them again keeps changing them")
