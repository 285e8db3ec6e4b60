"""Operands as operations see them: constant decoding and the OperandInfo lists of each phase.

Validation sees types, declared shapes, quantization and the values of constant *scalars* (NNAPI's
parameters), never a tensor's buffer; compilation sees every constant.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from hal.extension_registry import extension_dtype, model_prefixes, resolve_extension_type
from hal.model import Model, Operand, Operation
from hal.registry import OperandInfo, OperationContext
from hal.types import NUMPY_DTYPE, SCALAR_TYPES, OperandLifeTime, OperandType, is_extension_type

_CONSTANT = (OperandLifeTime.CONSTANT_COPY, OperandLifeTime.CONSTANT_POOL)


def decode_constant(model: Model, operand: Operand, copy: bool = True, dtype: np.dtype | None = None) -> np.ndarray:
    """Constant operand bytes -> numpy array. Copied by default (pools may be unmapped later);
    the cache loader passes copy=False: its arrays are private, verified buffers."""
    loc = operand.location
    if operand.lifetime == OperandLifeTime.CONSTANT_COPY:
        raw = memoryview(model.operand_values)[loc.offset:loc.offset + loc.length]
    else:
        raw = memoryview(model.pools[loc.pool_index]).cast("B")[loc.offset:loc.offset + loc.length]
    return constant_from_bytes(raw, operand, copy, dtype)


def constant_from_bytes(raw, operand: Operand, copy: bool = True, dtype: np.dtype | None = None) -> np.ndarray:
    dtype = NUMPY_DTYPE[operand.type] if dtype is None else dtype  # an int finds its IntEnum key
    arr = np.frombuffer(raw, dtype=dtype)
    if copy:
        arr = arr.copy()
    if operand.type in SCALAR_TYPES or (arr.size == 1 and not operand.dimensions):
        return arr.reshape(())
    return arr.reshape(operand.dimensions)


def operand_info(i: int, op: Operand, value, ext_dtype, rank_known: bool = True) -> OperandInfo:
    """Operand i's info, with its decoded value (or None) and its extension element type."""
    cq = op.channel_quant
    if op.lifetime == OperandLifeTime.SUBGRAPH and op.type == OperandType.SUBGRAPH:
        value = np.asarray(op.location.offset, dtype=np.int32)  # which referenced subgraph: IF/WHILE read it
    return OperandInfo(
        type=op.type, shape=tuple(op.dimensions), scale=op.scale, zero_point=op.zero_point,
        channel_scales=None if cq is None else np.asarray(cq.scales, dtype=np.float32),
        channel_dim=0 if cq is None else cq.channel_dim, lifetime=op.lifetime, value=value,
        index=i, extension_dtype=ext_dtype, rank_known=rank_known)


def operand_infos(model: Model, copy: bool = True) -> list[OperandInfo]:
    """Infos for compilation: every constant decoded (copied unless ``copy=False``)."""
    infos = []
    prefixes = model_prefixes(model)
    for i, op in enumerate(model.main.operands):
        value = None
        ext_dtype = extension_dtype(op.type, prefixes)
        if op.lifetime in _CONSTANT and (not is_extension_type(op.type) or ext_dtype is not None):
            value = decode_constant(model, op, copy, ext_dtype)
        infos.append(operand_info(i, op, value, ext_dtype))
    return infos


ScalarValue = Callable[[int, Operand, "np.dtype | None"], "np.ndarray | None"]


def validation_info(i: int, op: Operand, prefixes: dict[int, str], scalar_value: ScalarValue) -> OperandInfo:
    """Operand i as validation sees it: no tensor value; a non-constant tensor declared without
    dimensions has an unknown rank. ``scalar_value(index, operand, dtype)`` gives a constant
    scalar's value (builtin scalar types, and an extension's non-tensor types)."""
    value = None
    ext_dtype = extension_dtype(op.type, prefixes)
    if is_extension_type(op.type):
        ext, t = resolve_extension_type(op.type, prefixes)
        ext_type = None if ext is None else ext.operand_types.get(t)
        is_tensor = ext_type is None or ext_type.is_tensor
    else:
        is_tensor = op.type not in SCALAR_TYPES
    constant = op.lifetime in _CONSTANT
    if constant and not is_tensor and op.type != OperandType.SUBGRAPH:
        value = scalar_value(i, op, ext_dtype)
    rank_known = not (is_tensor and not op.dimensions and not constant)
    return operand_info(i, op, value, ext_dtype, rank_known)


def validation_infos(operands: Sequence[Operand], prefixes: dict[int, str],
                     scalar_value: ScalarValue) -> list[OperandInfo]:
    """Infos for validation of a whole subgraph (see validation_info)."""
    return [validation_info(i, op, prefixes, scalar_value) for i, op in enumerate(operands)]


def model_scalar_value(model: Model) -> ScalarValue:
    """Constant scalars of a whole model (validateModel has checked their locations)."""
    def value(i: int, op: Operand, dtype: np.dtype | None = None):
        try:
            return decode_constant(model, op, copy=True, dtype=dtype)
        except (ValueError, IndexError, TypeError):
            return None  # a malformed location: validateModel's structural checks report it
    return value


def operation_context(k: int, operation: Operation, operands: Sequence[Operand], infos: list[OperandInfo],
                      validating: bool = False, model: Model | None = None) -> OperationContext:
    """``model``: the whole model, for operations that name its referenced subgraphs (IF, WHILE)."""
    # infos[i] None: a model input the execution's request omitted (NNAPI's setInput with no value)
    ins = [None if operands[i].lifetime == OperandLifeTime.NO_VALUE else infos[i] for i in operation.inputs]
    ctx = OperationContext(k, operation.type, ins, [infos[o] for o in operation.outputs], validating=validating)
    if model is not None and model.referenced:
        ctx.subgraphs = model.referenced
        ctx._subgraph_info = _subgraph_infos(model)
    return ctx


def _subgraph_infos(model: Model) -> Callable[[int, int], OperandInfo]:
    prefixes, scalars = model_prefixes(model), model_scalar_value(model)

    def info(k: int, i: int) -> OperandInfo:
        return validation_info(i, model.referenced[k].operands[i], prefixes, scalars)
    return info


def step_inputs(operation: Operation, operands: Sequence[Operand]) -> tuple[int, ...]:
    """An operation's input operand indexes for execution, -1 where an optional input is omitted."""
    return tuple(-1 if operands[i].lifetime == OperandLifeTime.NO_VALUE else i for i in operation.inputs)
