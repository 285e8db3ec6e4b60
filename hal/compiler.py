"""prepareModel's work: validate, decode constants, infer shapes, assign backends, plan.

For every operation: the spec's validate (with the inferred shapes) and prepare (output shapes,
``ctx.params``), then the first backend of the preference order whose kernel takes it plans it
(``ctx.data``: packed weights, multipliers, ...). ``compile_model`` returns a CompiledModel whose
steps hold those contexts, so an execution only runs kernels. Models whose inputs have unknown
dimensions are planned again per distinct input shape (and cached). Models with a parameter that
is not a constant (a shape, axis or paddings given as a model input or computed) are planned one
operation at a time during each execution, from the values (``CompiledModel.runtime_step``); so
are models with an operation whose output sizes depend on the values (``data_dependent_outputs``,
see ``make_plan``).
"""
from __future__ import annotations

import dataclasses
import logging
import threading
from dataclasses import dataclass, field
from typing import Iterable

import numpy as np

from hal import backends
from hal.assign import assign_backend
from hal.backends import Backend
from hal.backends.graph import GraphBackend
from hal.errors import HalError, RuntimeValueNeeded
from hal.extension_registry import lookup_in_model, model_prefixes
from hal.fusion import chain, fuse, is_fc
from hal.model import Model
from hal.operands import decode_constant, operand_infos, operation_context, step_inputs  # noqa: F401  (decode_constant: API)
from hal.operations.control_flow import CONTROL_FLOW
from hal.plan import CONSTANT_LIFETIMES, Plan, Step, make_partition, partition_step, plan_releases
from hal.registry import OperandInfo, OperationContext, OperationSpec
from hal.shapes import set_output_shapes
from hal.types import SCALAR_TYPES, ErrorStatus, OperandLifeTime, OperandType, OperationType, operation_name
from hal.validation import validate_model

_log = logging.getLogger(__name__)

#: Operand types whose runtime value a runtime-planned operation's prepare may read (parameters).
_RUNTIME_PARAM_TYPES = SCALAR_TYPES | {OperandType.TENSOR_INT32, OperandType.TENSOR_BOOL8}


@dataclass
class CompiledModel:
    model: Model
    constants: dict[int, np.ndarray]
    input_indexes: list[int]
    output_indexes: list[int]
    base_infos: list[OperandInfo]
    static_plan: Plan | None
    #: Backend preference this model was compiled with (dynamic models plan again with it).
    backend_order: tuple[str, ...] = ()
    #: Some operation reads a parameter that is not a constant (RuntimeValueNeeded): the model is
    #: planned operation by operation during each execution (``runtime_step``), from the values.
    runtime_values: bool = False
    #: The model's referenced subgraphs, compiled (IF and WHILE run them); None without any.
    subgraphs: "Subgraphs | None" = None
    #: A referenced subgraph (an IF's branch, a WHILE's condition or body): its plans compile their
    #: partitions only once an execution runs them (``Plan.make_program``).
    referenced: bool = False
    _plans: dict = field(default_factory=dict)
    _steps: dict = field(default_factory=dict)
    _runtime_release: list | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def plan_for(self, input_shapes: tuple[tuple[int, ...], ...]) -> Plan:
        """The plan for these input shapes (raises RuntimeValueNeeded for a runtime-planned model)."""
        if self.static_plan is not None:
            return self.static_plan
        with self._lock:
            plan = self._plans.get(input_shapes)
        if plan is None:
            plan = make_plan(self.model, self.base_infos, dict(zip(self.input_indexes, input_shapes)),
                             self.backend_order or None, self.subgraphs, self.referenced)
            with self._lock:
                if len(self._plans) > 64:  # bound memory for clients cycling shapes
                    self._plans.clear()
                self._plans[input_shapes] = plan
        return plan

    def runtime_step(self, k: int, infos: list[OperandInfo], values: dict[int, np.ndarray]) -> Step:
        """Operation k prepared and planned during an execution: its non-constant parameters
        (scalars, INT32 and BOOL8 tensors: shapes, axes, paddings) carry their computed values.
        Updates ``infos`` with the output shapes. Steps are reused while the input shapes and those
        values repeat (bounded, like ``plan_for``)."""
        operation = self.model.main.operations[k]
        view = list(infos)
        key: list = [k]
        for i in operation.inputs:
            info = infos[i] if i >= 0 else None
            if info is None or info.value is not None:
                key.append(None if info is None else ())  # an omitted input is part of the key
                continue
            key.append(info.shape)
            if info.type in _RUNTIME_PARAM_TYPES and i in values:
                v = np.asarray(values[i])
                view[i] = dataclasses.replace(info, value=v)
                key.append(v.tobytes())
        key = tuple(key)
        with self._lock:
            step = self._steps.get(key)
        if step is None:
            step = prepare_operation(k, self.model, view,
                                     order=per_operation(backends.candidates(self.backend_order or None)),
                                     subgraphs=self.subgraphs)
            with self._lock:
                if len(self._steps) > 256:
                    self._steps.clear()
                self._steps[key] = step
        for o in operation.outputs:
            infos[o] = step.ctx.outputs[operation.outputs.index(o)]
        return step

    def runtime_releases(self) -> list[tuple[int, ...]]:
        """The memory plan of a runtime-planned model: per operation, the temporaries it is the
        last reader of (the graph's structure does not depend on the values)."""
        if self._runtime_release is None:
            sg = self.model.main
            steps = [Step(k, None, None, None, step_inputs(op, sg.operands), tuple(op.outputs))  # type: ignore[arg-type]
                     for k, op in enumerate(sg.operations)]
            self._runtime_release = plan_releases(steps, frozenset(sg.output_indexes))
        return self._runtime_release

    def input_info(self, k: int) -> OperandInfo:
        return self.base_infos[self.input_indexes[k]]

    def output_info(self, k: int) -> OperandInfo:
        return self.base_infos[self.output_indexes[k]]


def _not_supported(k: int, op_type: int) -> HalError:
    return HalError(ErrorStatus.INVALID_ARGUMENT, f"operation {k} ({operation_name(op_type)}): not supported by "
                                                  f"this driver")


def _check_zero_sized(ctx: OperationContext, spec: OperationSpec) -> None:
    """Only with actual shapes (a plan): in a declared shape a 0 means "not known yet"."""
    if spec.allow_zero_sized_inputs:
        return
    for i, info in enumerate(ctx.inputs):
        if info is not None and info.type not in SCALAR_TYPES and info.rank_known and 0 in info.shape \
                and not info.is_constant:
            raise ctx.fail(f"input {i} is zero-sized ({list(info.shape)}); this operation does not "
                           f"accept zero-sized inputs")


def _shapes_inferred(operation, model: Model, infos: list[OperandInfo]) -> bool:
    """Whether shape inference (or an execution's input shapes) made an input of this operation
    other than validateModel saw it: a different shape, or any shape for a non-constant tensor
    declared without dimensions (its rank was unknown then). If not, validateModel already ran
    the operation's validate on exactly this."""
    operands = model.main.operands
    for i in operation.inputs:
        op = operands[i]
        if op.lifetime == OperandLifeTime.NO_VALUE:
            continue
        if infos[i] is None:  # omitted by the request: validate must see it omitted
            return True
        if infos[i].shape != tuple(op.dimensions):
            return True
        if not op.dimensions and op.type not in SCALAR_TYPES and op.lifetime not in CONSTANT_LIFETIMES:
            return True
    return False


def prepare_operation(k: int, model: Model, infos: list[OperandInfo], packing: bool = True,
                      order: list[Backend] | None = None, shapes_known: bool = True,
                      subgraphs: "Subgraphs | None" = None) -> Step:
    """Validate, infer shapes and plan one operation of a model validateModel accepted; updates
    ``infos`` with its output shapes.

    validate runs again only where the input shapes differ from the declared ones (it saw those
    in validateModel). ``packing=False`` (support queries) lets plans skip repacking constant
    weights. ``shapes_known=False`` when a 0 in a shape may still mean "not specified" (support
    queries on models with unknown input dimensions): zero-sized inputs are then not checked.
    ``subgraphs``: the model's compiled referenced subgraphs, for IF and WHILE."""
    operation = model.main.operations[k]
    prefixes = model_prefixes(model)
    spec = lookup_in_model(operation.type, prefixes)
    if spec is None:
        raise _not_supported(k, operation.type)
    ctx = operation_context(k, operation, model.main.operands, infos, model=model)
    ctx.packing = packing
    try:
        if _shapes_inferred(operation, model, infos):
            spec.run_validate(ctx)
        ctx.params = spec.prepare(ctx)
        if operation.type in CONTROL_FLOW:
            if subgraphs is None:
                raise ctx.fail("its subgraphs are not compiled here", ErrorStatus.GENERAL_FAILURE)
            _control_flow_shapes(ctx, subgraphs)
            ctx.compiled_subgraphs = subgraphs
        if shapes_known:
            _check_zero_sized(ctx, spec)
        set_output_shapes(ctx, operation.outputs, infos)  # backends plan with the prepared shapes
        kernel, ctx.data = assign_backend(ctx, spec, prefixes, order)
    except HalError:
        raise
    except Exception as e:  # a bug or an unforeseen input: still a clean error
        raise HalError(ErrorStatus.INVALID_ARGUMENT, f"{ctx.name}: cannot prepare: {e!r}") from e
    return Step(k, spec, kernel, ctx, step_inputs(operation, model.main.operands), tuple(operation.outputs))


def make_plan(model: Model, base: list[OperandInfo], input_shapes: dict[int, tuple[int, ...]],
              order_names: tuple[str, ...] | None = None, subgraphs: "Subgraphs | None" = None,
              referenced: bool = False) -> Plan:
    """The plan of ``model``'s main subgraph for these input shapes (hal.serialize plans a cached
    referenced subgraph again with it when it was stored without its partitions)."""
    # Data-dependent output shapes: an operation whose output sizes depend on its input values
    # (BOX_WITH_NMS_LIMIT, GENERATE_PROPOSALS) opts in with ``register(...,
    # data_dependent_outputs=True)``; its prepare sets a 0 in every dimension only the kernel
    # knows (e.g. ``(0, 4)``; a dimension the model declares may be used instead). No plan can be
    # made ahead of the values: RuntimeValueNeeded makes the model planned operation by operation
    # during each execution (``CompiledModel.runtime_step``), where the executor takes those
    # outputs' shapes from the kernel's results and the later operations are prepared with them.
    infos = list(base)
    for idx, shape in input_shapes.items():
        infos[idx] = dataclasses.replace(infos[idx], shape=tuple(shape))
    order = backends.candidates(order_names)
    steps = []
    for k in range(len(model.main.operations)):
        steps.append(prepare_operation(k, model, infos, order=order, subgraphs=subgraphs))
        if steps[-1].spec.data_dependent_outputs and not outputs_known(steps[-1].ctx):
            raise RuntimeValueNeeded(f"{steps[-1].ctx.name}: its output shapes are known only once it has run")
    keep = frozenset(model.main.output_indexes)

    def program() -> list[Step]:
        return fuse(_partition(model, steps, infos, order, keep, subgraphs), keep)
    if referenced:  # an IF or WHILE lowered into a graph inlines the steps: the program may never run
        return Plan(steps, infos, keep=keep, make_program=program)
    return Plan(steps, infos, keep=keep, program=program())


def outputs_known(ctx: OperationContext) -> bool:
    """A data-dependent operation whose outputs' shapes are known after all: an IF or WHILE whose
    declarations or planned subgraphs fix them (other such operations always run first)."""
    return ctx.op_type in CONTROL_FLOW and all(s is not None and all(d > 0 for d in s) for s in ctx.output_shapes)


def _control_flow_shapes(ctx: OperationContext, subgraphs: "Subgraphs") -> None:
    """Output shapes the declarations left open, from the subgraphs planned with the actual input
    shapes: an IF's when both branches agree, a WHILE's when the body gives back the shapes it
    was given (a loop whose shapes do not change). Otherwise they stay 0: known once it has run."""
    if all(s is not None and all(d > 0 for d in s) for s in ctx.output_shapes):
        return
    shapes = [info.shape if info is not None else None for info in ctx.inputs]
    if any(s is None or not all(d > 0 for d in s) for s in shapes[2 + (ctx.op_type == int(OperationType.IF)):]):
        return

    def planned(sub: int, input_shapes) -> list[tuple[int, ...]] | None:
        compiled = subgraphs.get(sub)
        try:
            plan = compiled.plan_for(tuple(input_shapes))
        except RuntimeValueNeeded:
            return None
        return [plan.infos[o].shape for o in compiled.output_indexes]

    p = ctx.params
    if ctx.op_type == int(OperationType.IF):
        outs = [planned(b, shapes[3:]) for b in (p.then_subgraph, p.else_subgraph)]
        if outs[0] is None or outs[0] != outs[1]:
            return
        found = outs[0]
    else:
        body = planned(p.body_subgraph, shapes[2:])
        if body is None or body != [tuple(s) for s in shapes[2:2 + len(body)]]:
            return
        found = body[:p.carried]
    for j, shape in enumerate(found):
        declared = ctx.outputs[j].shape
        if not declared or (len(declared) == len(shape) and all(d in (0, s) for d, s in zip(declared, shape))):
            ctx.output_shapes[j] = tuple(shape)


class Subgraphs:
    """A model's referenced subgraphs, each compiled on first use as a model of its own (the same
    referenced list, constants and pools; that subgraph as main) and shared by every operation
    naming it, nested ones included. Validation has excluded reference cycles."""

    def __init__(self, model: Model, copy_constants: bool, order: tuple[str, ...]):
        self.model = model
        self.copy_constants = copy_constants
        self.order = order
        self._compiled: dict[int, CompiledModel] = {}
        self._lock = threading.RLock()

    def view(self, k: int) -> Model:
        m = self.model
        return Model(main=m.referenced[k], referenced=m.referenced, operand_values=m.operand_values, pools=m.pools,
                     relax_computation_float32_to_float16=m.relax_computation_float32_to_float16,
                     extension_name_to_prefix=m.extension_name_to_prefix)

    def get(self, k: int) -> CompiledModel:
        with self._lock:
            compiled = self._compiled.get(k)
            if compiled is None:
                try:
                    compiled = _compile_validated(self.view(k), self.copy_constants, self.order, self, True)
                except HalError as e:
                    raise HalError(e.status, f"referenced subgraph {k}: {e.message}") from None
                self._compiled[k] = compiled
            return compiled

    def put(self, k: int, compiled: CompiledModel) -> None:
        """A subgraph loaded from the compilation cache."""
        with self._lock:
            self._compiled[k] = compiled

    def all(self) -> list[CompiledModel]:
        return [self.get(k) for k in range(len(self.model.referenced))]


def _partition(model: Model, steps: list[Step], infos: list[OperandInfo], order: list[Backend],
               keep: frozenset[int], subgraphs: "Subgraphs | None" = None) -> list[Step]:
    """The program: each maximal run of one graph backend's members compiled into one partition
    step. A run that fails to compile is planned again without that backend (``steps`` updated),
    and looked at again: the next backend may be a graph backend too (cuda's run falls to
    onnxruntime's partitions), each failed backend left out of every later fallback."""
    program: list[Step] = []
    failed: set[str] = set()
    k = 0
    while k < len(steps):
        backend = backends.get(steps[k].backend)
        if not isinstance(backend, GraphBackend):
            program.append(steps[k])
            k += 1
            continue
        end = k
        while end < len(steps) and steps[end].backend == backend.name:
            end += 1
        part = make_partition(model, steps, k, end, infos, keep)
        handed = _fc_chain_instead(model, steps, k, end, part, infos, order, backend, subgraphs)
        if handed is not None:
            steps[k:end], fused = handed
            program.append(fused)
            k = end
            continue
        whole = _whole_run_instead(model, steps, k, end, infos, order, backend, subgraphs)
        if whole is not None:
            steps[k:end] = whole
            program.extend(whole)
            k = end
            continue
        if not part.outputs:  # nothing reads what the run computes (valid NNAPI): a graph needs outputs
            fallback = [b for b in order if not isinstance(b, GraphBackend)]
            for m in range(k, end):
                steps[m] = prepare_operation(steps[m].index, model, infos, order=fallback, subgraphs=subgraphs)
                program.append(steps[m])
            k = end
            continue
        try:
            artifact, executable = backend.compile(part)
        except Exception as e:  # noqa: BLE001 - a lowering's bug costs speed, never the model
            _log.warning("%s could not compile operations %d-%d (%r); they are planned on the next backends",
                         backend.name, steps[k].index, steps[end - 1].index, e)
            failed.add(backend.name)
            fallback = [b for b in order if b.name not in failed]
            for m in range(k, end):
                steps[m] = prepare_operation(steps[m].index, model, infos, order=fallback, subgraphs=subgraphs)
            continue  # the same position again, planned without the failed backends
        program.append(partition_step(backend, part, artifact, executable))
        k = end
    return program


def _fc_chain_instead(model: Model, steps: list[Step], start: int, end: int, part, infos: list[OperandInfo],
                      order: list[Backend], graph: Backend, subgraphs) -> tuple[list[Step], Step] | None:
    """A graph backend's run that is only chained FULLY_CONNECTED layers (a perceptron), planned
    on the first per-operation backend after it that runs them as one ``fc_chain`` step: the
    members so planned and that step (``fuse`` leaves a fused step as it is), else None.
    Why: such a chain's time is its weights streamed through the core once, plus the call around
    it, which the numba step makes smaller than onnxruntime's run (bench/results.md's MLP row)."""
    members = steps[start:end]
    if len(members) < 2 or not all(is_fc(s) for s in members) \
            or any(b.inputs[0] != a.outputs[0] for a, b in zip(members, members[1:])) \
            or part.outputs != members[-1].outputs:
        return None
    after = order[order.index(graph) + 1:]
    fallback = [b for b in after if not isinstance(b, GraphBackend)]
    try:
        planned = [prepare_operation(s.index, model, infos, order=fallback, subgraphs=subgraphs) for s in members]
    except HalError:
        return None
    if len({s.backend for s in planned}) != 1 or planned[0].backend == backends.REFERENCE:
        return None
    fused = chain(planned)  # its plan packs the weights: made once, here
    return None if fused is None else (planned, fused)


def _whole_run_instead(model: Model, steps: list[Step], start: int, end: int, infos: list[OperandInfo],
                       order: list[Backend], graph: Backend, subgraphs) -> list[Step] | None:
    """A graph backend's run planned on the first per-operation backend after it, when that
    backend plans every operation of the run and takes that graph backend's runs of their type
    (``Backend.takes_runs``: the numba backend's float32 CNN kernels, onnxruntime's runs; never an
    accelerator's; not a run holding an operation in ``Backend.leaves_runs_with``;
    $NNHAL_NUMBA_FLOAT_RUNS=0 keeps them all on onnxruntime, see numba's package): the members so
    planned (``fuse`` then fuses their patterns), else None. Why: chained natively, with a
    convolution's residual ADD and PRELU applied in its epilogue, they run a PReLU landmark
    network faster than onnxruntime's session; a run they cover only in part stays whole on the
    graph backend, since splitting it would add layout changes and a second engine's calls. At
    more than one compute thread the graph backend keeps its runs (it uses them; these kernels
    run on one)."""
    if backends.compute_threads() > 1:
        return None
    after = [b for b in order[order.index(graph) + 1:] if not isinstance(b, GraphBackend)]
    types = after[0].takes_runs.get(graph.name) if after else None
    if not types:
        return None
    members, per_op = steps[start:end], after[0]
    if any(s.ctx.op_type in per_op.leaves_runs_with for s in members):
        return None
    for s in members:
        if s.ctx.op_type == OperationType.WHILE:
            continue  # judged by its subgraphs, below
        t = s.ctx.inputs[0].type if s.ctx.inputs and s.ctx.inputs[0] is not None else -1
        if t not in types or not per_op.takes(s.ctx.op_type, t):
            return None
    if not all(_loop_runs_on(per_op, s) for s in members if s.ctx.op_type == OperationType.WHILE):
        return None
    # a WHILE is run by the executor (hal.control_flow; bound: hal.bound_program's loop), as the
    # reference backend's control-flow placeholder, on subgraphs now planned on ``per_op``
    executor = [per_op, backends.get(backends.REFERENCE)]
    try:
        planned = [prepare_operation(s.index, model, infos, subgraphs=subgraphs,
                                     order=executor if s.ctx.op_type == OperationType.WHILE else [per_op])
                   for s in members]
    except HalError:  # an operation it declines
        return None
    return planned


def _loop_runs_on(backend: Backend, step: Step) -> bool:
    """Whether a WHILE's condition and body subgraphs are planned wholly on ``backend`` (their
    programs made now: a graph backend's run inside them is taken by it as this rule takes the
    main graph's), with the shapes the loop starts with, which its body keeps."""
    p, subgraphs = step.ctx.params, step.ctx.compiled_subgraphs
    if subgraphs is None:
        return False
    shapes = tuple(tuple(info.shape) if info is not None else () for info in step.ctx.inputs[2:])
    for k in (p.cond_subgraph, p.body_subgraph):
        compiled = subgraphs.get(k)
        try:
            plan = compiled.plan_for(shapes)
        except RuntimeValueNeeded:
            return False
        if any(plan.infos[i].shape != shape for i, shape in zip(compiled.input_indexes, shapes)) \
                or not all(s.backend == backend.name for s in plan.program):
            return False
    return True


def per_operation(order: list[Backend]) -> list[Backend]:
    """``order`` without graph backends: for operations planned one at a time during execution."""
    return [b for b in order if not isinstance(b, GraphBackend)]


def compile_model(model: Model, copy_constants: bool = True,
                  backend_order: Iterable[str] | None = None) -> CompiledModel:
    """prepareModel: raises HalError for invalid or unsupported models.

    ``copy_constants=False`` lets constants alias the model's buffers: only for
    callers that own those buffers privately and never change them. ``backend_order``
    overrides the process's backend preference (``hal.backends.preference()``).
    """
    validate_model(model)
    order = backends.parse_preference(backend_order) if backend_order is not None else backends.preference()
    subgraphs = Subgraphs(model, copy_constants, order) if model.referenced else None
    return _compile_validated(model, copy_constants, order, subgraphs)


def _compile_validated(model: Model, copy_constants: bool, order: tuple[str, ...],
                       subgraphs: Subgraphs | None, referenced: bool = False) -> CompiledModel:
    """compile_model's work after validation: the main subgraph of ``model``, whose referenced
    subgraphs ``subgraphs`` compiles; ``referenced``: ``model`` is one of those (its view)."""
    base = operand_infos(model, copy_constants)
    sg = model.main
    plan, runtime_values = None, False
    if inputs_static(model, base):
        try:
            plan = make_plan(model, base, {}, order, subgraphs, referenced)
        except RuntimeValueNeeded:
            runtime_values = True
    if plan is None:  # still check now that every operation is one this driver has
        prefixes = model_prefixes(model)
        for k, op in enumerate(sg.operations):
            if lookup_in_model(op.type, prefixes) is None:
                raise _not_supported(k, op.type)
    else:
        ready(plan)
    return CompiledModel(model=model, constants={i: v.value for i, v in enumerate(base) if v.value is not None},
                         input_indexes=list(sg.input_indexes), output_indexes=list(sg.output_indexes),
                         base_infos=base, static_plan=plan, backend_order=order, runtime_values=runtime_values,
                         subgraphs=subgraphs, referenced=referenced)


def ready(plan: Plan) -> None:
    """Each backend's ``Backend.ready`` with the kernels its steps of ``plan`` run: a plan made or
    loaded from the cache has what it runs loaded before its first execution."""
    by_backend: dict[str, list] = {}
    for step in plan.steps:
        by_backend.setdefault(step.backend, []).append(step.kernel)
    for name, kernels in by_backend.items():
        backend = backends.get(name)
        if backend is not None and backend.ready is not None:
            backend.ready(kernels)


def inputs_static(model: Model, infos: list[OperandInfo]) -> bool:
    """Every model input's shape is fully known: one plan, made at compile time."""
    return all(infos[i].type in SCALAR_TYPES or (infos[i].shape and infos[i].fully_specified)
               for i in model.main.input_indexes)
