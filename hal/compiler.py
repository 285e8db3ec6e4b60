"""prepareModel's work: validate, decode constants, infer shapes, precompute op data.

``compile_model`` returns a CompiledModel whose steps each hold the op's
prepared context (``ctx.data`` = multipliers, repacked weights, ...), so an
execution only runs numpy kernels. Models whose inputs have unknown
dimensions are planned again per distinct input shape (and cached).
"""
from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass, field

import numpy as np

from hal.errors import HalError
from hal.model import Model, Operand
from hal.registry import (
    OperandInfo,
    OperationContext,
    OperationRegistration,
    extension_dtype,
    lookup_in_model,
    model_prefixes,
)
from hal.types import (
    NUMPY_DTYPE,
    SCALAR_TYPES,
    ErrorStatus,
    OperandLifeTime,
    OperandType,
    is_extension_type,
    operation_name,
)
from hal.validation import validate_model


@dataclass
class Step:
    index: int
    registration: OperationRegistration
    ctx: OperationContext
    inputs: tuple[int, ...]  # operand indexes, -1 where an optional input is omitted
    outputs: tuple[int, ...]


@dataclass
class Plan:
    """Steps in execution order, the operand infos they were prepared with, and the memory plan:
    ``release[n]`` lists the temporaries step n is the last reader of (or, if nothing reads them,
    produces), so an execution drops each intermediate tensor as soon as it is dead instead of
    holding every one until the end."""

    steps: list[Step]
    infos: list[OperandInfo]
    keep: frozenset[int] = frozenset()  # operands never released: the model's outputs
    release: list[tuple[int, ...]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.release:
            self.release = plan_releases(self.steps, self.keep)


def plan_releases(steps: list[Step], keep: frozenset[int]) -> list[tuple[int, ...]]:
    """Liveness over the step order: each produced operand dies after its last reading step."""
    last: dict[int, int] = {}
    for n, step in enumerate(steps):
        for o in step.outputs:
            last.setdefault(o, n)  # produced and never read: freed right after its producer
        for i in step.inputs:
            if i in last:  # a temporary produced earlier (constants and model inputs never are)
                last[i] = n
    release: list[list[int]] = [[] for _ in steps]
    for operand, n in last.items():
        if operand not in keep:
            release[n].append(operand)
    return [tuple(sorted(r)) for r in release]


@dataclass
class CompiledModel:
    model: Model
    constants: dict[int, np.ndarray]
    input_indexes: list[int]
    output_indexes: list[int]
    base_infos: list[OperandInfo]
    static_plan: Plan | None
    _plans: dict = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def plan_for(self, input_shapes: tuple[tuple[int, ...], ...]) -> Plan:
        if self.static_plan is not None:
            return self.static_plan
        with self._lock:
            plan = self._plans.get(input_shapes)
        if plan is None:
            plan = _make_plan(self.model, self.base_infos, dict(zip(self.input_indexes, input_shapes)))
            with self._lock:
                if len(self._plans) > 64:  # bound memory for clients cycling shapes
                    self._plans.clear()
                self._plans[input_shapes] = plan
        return plan

    def input_info(self, k: int) -> OperandInfo:
        return self.base_infos[self.input_indexes[k]]

    def output_info(self, k: int) -> OperandInfo:
        return self.base_infos[self.output_indexes[k]]


def decode_constant(model: Model, operand: Operand, copy: bool = True, dtype: np.dtype | None = None) -> np.ndarray:
    """Constant operand bytes -> numpy array. Copied by default (pools may be unmapped later);
    the cache loader passes copy=False: its arrays are private, verified buffers."""
    loc = operand.location
    if operand.lifetime == OperandLifeTime.CONSTANT_COPY:
        raw = memoryview(model.operand_values)[loc.offset:loc.offset + loc.length]
    else:
        raw = memoryview(model.pools[loc.pool_index]).cast("B")[loc.offset:loc.offset + loc.length]
    dtype = NUMPY_DTYPE[OperandType(operand.type)] if dtype is None else dtype
    arr = np.frombuffer(raw, dtype=dtype)
    if copy:
        arr = arr.copy()
    if operand.type in SCALAR_TYPES or (arr.size == 1 and not operand.dimensions):
        return arr.reshape(())
    return arr.reshape(operand.dimensions)


def operand_infos(model: Model, copy: bool = True) -> list[OperandInfo]:
    infos = []
    prefixes = model_prefixes(model)
    for i, op in enumerate(model.main.operands):
        value = None
        ext_dtype = extension_dtype(op.type, prefixes)
        if op.lifetime in (OperandLifeTime.CONSTANT_COPY, OperandLifeTime.CONSTANT_POOL) \
                and (not is_extension_type(op.type) or ext_dtype is not None):
            value = decode_constant(model, op, copy, ext_dtype)
        cq = op.channel_quant
        infos.append(OperandInfo(
            type=op.type, shape=tuple(op.dimensions), scale=op.scale, zero_point=op.zero_point,
            channel_scales=None if cq is None else np.asarray(cq.scales, dtype=np.float32),
            channel_dim=0 if cq is None else cq.channel_dim, lifetime=op.lifetime, value=value,
            index=i, extension_dtype=ext_dtype))
    return infos


def _context(k: int, model: Model, infos: list[OperandInfo]) -> OperationContext:
    operation = model.main.operations[k]
    ins = [None if model.main.operands[i].lifetime == OperandLifeTime.NO_VALUE else infos[i]
           for i in operation.inputs]
    return OperationContext(k, operation.type, ins, [infos[o] for o in operation.outputs])


def prepare_operation(k: int, model: Model, infos: list[OperandInfo], packing: bool = True) -> Step:
    """Validate + prepare one operation; updates ``infos`` with its output shapes.

    ``packing=False`` (support queries) lets prepare skip repacking constant weights."""
    operation = model.main.operations[k]
    reg = lookup_in_model(operation.type, model_prefixes(model))
    if reg is None:
        raise HalError(ErrorStatus.INVALID_ARGUMENT,
                       f"operation {k} ({operation_name(operation.type)}): not supported by this driver")
    ctx = _context(k, model, infos)
    ctx.packing = packing
    try:
        reg.validate(ctx)
        ctx.data = reg.prepare(ctx)
    except HalError:
        raise
    except Exception as e:  # a bug or an unforeseen input: still a clean error
        raise HalError(ErrorStatus.INVALID_ARGUMENT, f"{ctx.name}: cannot prepare: {e!r}") from e
    for j, shape in enumerate(ctx.output_shapes):
        if shape is None:
            raise HalError(ErrorStatus.GENERAL_FAILURE, f"{ctx.name}: prepare set no shape for output {j}")
        o = operation.outputs[j]
        infos[o] = dataclasses.replace(infos[o], shape=shape)
        ctx.outputs[j] = infos[o]
    inputs = tuple(-1 if model.main.operands[i].lifetime == OperandLifeTime.NO_VALUE else i
                   for i in operation.inputs)
    return Step(k, reg, ctx, inputs, tuple(operation.outputs))


def _make_plan(model: Model, base: list[OperandInfo], input_shapes: dict[int, tuple[int, ...]]) -> Plan:
    infos = list(base)
    for idx, shape in input_shapes.items():
        infos[idx] = dataclasses.replace(infos[idx], shape=tuple(shape))
    steps = [prepare_operation(k, model, infos) for k in range(len(model.main.operations))]
    return Plan(steps, infos, keep=frozenset(model.main.output_indexes))


def compile_model(model: Model, copy_constants: bool = True) -> CompiledModel:
    """prepareModel: raises HalError for invalid or unsupported models.

    ``copy_constants=False`` lets constants alias the model's buffers: only for
    callers that own those buffers privately and never change them.
    """
    validate_model(model)
    if model.referenced:
        raise HalError(ErrorStatus.INVALID_ARGUMENT, "control flow (referenced subgraphs) is not supported")
    base = operand_infos(model, copy_constants)
    sg = model.main
    static = all(base[i].type in SCALAR_TYPES or (base[i].shape and base[i].fully_specified)
                 for i in sg.input_indexes)
    plan = _make_plan(model, base, {}) if static else None
    if plan is None:  # still validate every operation's signature now, with unknown shapes
        for k in range(len(sg.operations)):
            op = sg.operations[k]
            reg = lookup_in_model(op.type, model_prefixes(model))
            if reg is None:
                raise HalError(ErrorStatus.INVALID_ARGUMENT,
                               f"operation {k} ({operation_name(op.type)}): not supported by this driver")
    return CompiledModel(model=model, constants={i: v.value for i, v in enumerate(base) if v.value is not None},
                         input_indexes=list(sg.input_indexes), output_indexes=list(sg.output_indexes),
                         base_infos=base, static_plan=plan)


def supported_operations(model: Model) -> list[bool]:
    """getSupportedOperations: one bool per operation of the main subgraph.

    The model must be valid (HalError otherwise). An operation is supported when
    it is registered and its own validate and prepare accept it as declared,
    so support is never claimed for a variant execute cannot run. Weights are
    not repacked for the answer: a delegate asks on every start, cached or not.
    """
    validate_model(model)
    infos = operand_infos(model, copy=False)  # nothing outlives the query: no need to copy constants
    result = []
    for k in range(len(model.main.operations)):
        try:
            prepare_operation(k, model, infos, packing=False)
            result.append(True)
        except HalError:
            result.append(False)
    return result
