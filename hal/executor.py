"""Runs a CompiledModel on numpy arrays, or on an NNAPI Request with memory pools."""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import numpy as np

from hal import control_flow
from hal.bound_program import bind_program, plan_binder, runs_loops
from hal.compiler import CompiledModel
from hal.errors import HalError, RuntimeValueNeeded
from hal.model import Request
from hal.operations.control_flow import CONTROL_FLOW
from hal.plan import Plan, Step
from hal.registry import OperandInfo
from hal.types import SCALAR_TYPES, ErrorStatus, type_name
from hal.validation import validate_request


@dataclass(frozen=True)
class OutputShape:
    dimensions: tuple[int, ...]
    is_sufficient: bool


@dataclass
class OperationTiming:
    """One perfinfo record: which op ran and how long it took."""

    index: int
    type: int
    ns: int
    backend: str = ""
    #: Operations timed together: a partition step runs operations index .. index + count - 1.
    count: int = 1


def _check_input(k: int, info: OperandInfo, arr: np.ndarray) -> None:
    want = info.dtype
    if arr.dtype != want:
        raise HalError(ErrorStatus.INVALID_ARGUMENT,
                       f"input {k} ({type_name(info.type)}) must have dtype {want}, got {arr.dtype}")
    if info.type in SCALAR_TYPES:
        if arr.shape != ():
            raise HalError(ErrorStatus.INVALID_ARGUMENT, f"input {k} must be a scalar, got {arr.shape}")
        return
    if not arr.shape or 0 in arr.shape:
        raise HalError(ErrorStatus.INVALID_ARGUMENT, f"input {k} has shape {list(arr.shape)}")
    if info.shape and arr.shape != info.shape:  # equal: the common case, no per-dimension walk
        if len(info.shape) != arr.ndim or any(d and d != s for d, s in zip(info.shape, arr.shape)):
            raise HalError(ErrorStatus.INVALID_ARGUMENT,
                           f"input {k} has shape {list(arr.shape)}, the model says {list(info.shape)}")


def check_inputs(compiled: CompiledModel, inputs: list[np.ndarray]) -> None:
    """INVALID_ARGUMENT unless ``inputs`` are the model's inputs (count, dtype, shape): what
    ``execute`` checks, for a caller that binds arrays once and executes them many times."""
    if len(inputs) != len(compiled.input_indexes):
        raise HalError(ErrorStatus.INVALID_ARGUMENT,
                       f"model has {len(compiled.input_indexes)} inputs, got {len(inputs)}")
    for k, a in enumerate(inputs):
        _check_input(k, compiled.input_info(k), a)


def _check_deadline(deadline_ns: int | None, where) -> None:
    """``where``: a string, or a step (named only when the deadline has passed: an execution
    without a deadline never formats a name)."""
    if deadline_ns is not None and time.monotonic_ns() > deadline_ns:
        if not isinstance(where, str):
            where = f"before {where.ctx.name}"
        raise HalError(ErrorStatus.MISSED_DEADLINE_TRANSIENT, f"deadline passed {where}")


@dataclass
class _Run:
    """One execution's settings, which every step (and a control-flow subgraph) runs under."""

    compiled: CompiledModel
    timings: list[OperationTiming] | None
    deadline_ns: int | None
    loop_timeout_ns: int

    def control_flow(self) -> control_flow.ControlFlowRun:
        def run(sub: CompiledModel, inputs: list) -> list:  # a subgraph's operations are not timed one by one
            return execute(sub, inputs, None, self.deadline_ns, loop_timeout_ns=self.loop_timeout_ns)
        return control_flow.ControlFlowRun(self.compiled.subgraphs, run, self.deadline_ns, self.loop_timeout_ns)


def execute(compiled: CompiledModel, inputs: list[np.ndarray],
            timings: list[OperationTiming] | None = None,
            deadline_ns: int | None = None, _validated: bool = False,
            loop_timeout_ns: int | None = None) -> list[np.ndarray]:
    """Run the model; ``timings`` (if given) receives one record per operation.

    ``deadline_ns`` (time.monotonic_ns clock) is checked before every operation:
    a late execution stops with MISSED_DEADLINE_TRANSIENT, as NNAPI drivers do.
    ``loop_timeout_ns`` bounds each WHILE loop (``hal.control_flow.loop_timeout_ns``: 2 s by
    default, at most 15 s).
    """
    run = _Run(compiled, timings, deadline_ns, control_flow.loop_timeout_ns(loop_timeout_ns))
    if len(inputs) != len(compiled.input_indexes):
        raise HalError(ErrorStatus.INVALID_ARGUMENT,
                       f"model has {len(compiled.input_indexes)} inputs, got {len(inputs)}")
    if _validated:  # execute_request already checked every argument against the model
        arrays = inputs
    else:
        arrays = []
        for k, a in enumerate(inputs):
            if a is not None:  # None: omitted, for an operation input NNAPI lets a model omit
                a = np.asarray(a)
                _check_input(k, compiled.input_info(k), a)
            arrays.append(a)
    omitted = any(a is None for a in arrays)
    if not compiled.runtime_values and not omitted:
        try:
            plan = compiled.plan_for(tuple(a.shape for a in arrays))
        except RuntimeValueNeeded:
            compiled.runtime_values = True  # a parameter computed from these inputs: plan as we go
        else:
            bound = plan.bound
            if bound is None:
                bound = plan.bound = _Bound.of(compiled, plan)
            return bound.run(arrays, run)
    # Planned operation by operation from the values (and with omitted inputs as NO_VALUE).
    values: dict[int, np.ndarray] = dict(compiled.constants)
    values.update((i, a) for i, a in zip(compiled.input_indexes, arrays) if a is not None)
    infos: list = list(compiled.base_infos)
    for idx, a in zip(compiled.input_indexes, arrays):
        infos[idx] = None if a is None else dataclasses.replace(infos[idx], shape=tuple(a.shape))
    for k, dead in enumerate(compiled.runtime_releases()):
        _check_deadline(deadline_ns, f"before operation {k}")
        step = compiled.runtime_step(k, infos, values)
        if _zero_sized_output(step, infos):  # AOSP's rule: such an operation is not run
            values.update((o, np.zeros(infos[o].shape, infos[o].dtype)) for o in step.outputs)
        else:
            _run_step(step, values, infos, run)
        for o in dead:
            values.pop(o, None)
    return [values[o] for o in compiled.output_indexes]


class _Bound:
    """A plan bound for execution: operands are slots of a list (constants filled in, one more
    slot, index -1, for an omitted input: None), and each step is its kernel's execute, its
    context, its input and output slots, each output's prepared shape and dtype and the slots the
    memory plan frees after it. An execution copies the slot list and runs the steps: no
    dictionary, no operand info or attribute lookups per step."""

    __slots__ = ("template", "inputs", "outputs", "steps", "types")

    def __init__(self, template: list, inputs: tuple[int, ...], outputs: tuple[int, ...], steps: tuple,
                 types: list[int]) -> None:
        self.template, self.inputs, self.outputs, self.steps, self.types = template, inputs, outputs, steps, types

    @classmethod
    def of(cls, compiled: CompiledModel, plan: Plan) -> "_Bound":
        template: list = [None] * (len(plan.infos) + 1)
        for i, v in compiled.constants.items():  # a constant the cache did not keep stays None
            template[i] = v
        steps = []
        for step, dead in zip(plan.program, plan.release):
            # 1: IF / WHILE run here; 2: a partition whose graph loops, run with the execution's limits
            flow = 1 if step.spec is not None and step.ctx.op_type in CONTROL_FLOW else 2 if runs_loops(step) else 0
            outs = tuple((o, plan.infos[o].shape, plan.infos[o].dtype, j) for j, o in enumerate(step.outputs))
            steps.append((step, step.kernel.execute, step.ctx, step.inputs, outs, dead, flow))
        return cls(template, tuple(compiled.input_indexes), tuple(compiled.output_indexes), tuple(steps),
                   [info.type for info in plan.infos])

    def run(self, arrays: list[np.ndarray], run: _Run) -> list[np.ndarray]:
        values = self.template.copy()
        for i, a in zip(self.inputs, arrays):
            values[i] = a
        deadline, timings = run.deadline_ns, run.timings
        for step, kernel, ctx, inputs, outs, dead, flow in self.steps:
            if deadline is not None and time.monotonic_ns() > deadline:
                raise HalError(ErrorStatus.MISSED_DEADLINE_TRANSIENT, f"deadline passed before {ctx.name}")
            args = [values[i] for i in inputs]
            t0 = time.perf_counter_ns() if timings is not None else 0
            try:
                if not flow:
                    results = kernel(ctx, args)
                elif flow == 1:
                    results = control_flow.run(step, args, run.control_flow())
                else:
                    results = ctx.executable(args, (deadline, run.loop_timeout_ns))
            except HalError:
                raise
            except Exception as e:
                raise HalError(ErrorStatus.GENERAL_FAILURE, f"{ctx.name}: execution failed: {e!r}") from e
            if timings is not None:
                timings.append(OperationTiming(step.index, ctx.op_type, time.perf_counter_ns() - t0,
                                               step.kernel.backend, len(step.operations)))
            if len(results) < len(outs):
                raise HalError(ErrorStatus.GENERAL_FAILURE, f"{ctx.name}: {len(results)} outputs came out, "
                                                            f"{len(outs)} prepared")
            for (o, shape, dtype, j), out in zip(outs, results):
                if out.shape != shape or (out.dtype is not dtype and out.dtype != dtype):
                    raise HalError(ErrorStatus.GENERAL_FAILURE,
                                   f"{ctx.name}: output {j} came out {out.dtype}{list(out.shape)}, "
                                   f"prepared as {type_name(self.types[o])}{list(shape)}")
                values[o] = out
            for o in dead:  # the memory plan: this step was the tensor's last reader
                values[o] = None
        return [values[o] for o in self.outputs]


def _zero_sized_output(step: Step, infos: list[OperandInfo]) -> bool:
    """Whether a prepared output has a 0 dimension (after a data-dependent operation found nothing,
    e.g. no box left after BOX_WITH_NMS_LIMIT): the outputs are empty and the kernel is skipped.
    A data-dependent operation's 0s are placeholders: it always runs."""
    return not step.spec.data_dependent_outputs and any(0 in infos[o].shape for o in step.outputs)


def _fits(shape: tuple[int, ...], prepared: tuple[int, ...]) -> bool:
    """A data-dependent output's actual shape against its prepared one (0: the kernel decides)."""
    return len(shape) == len(prepared) and all(p in (0, s) for s, p in zip(shape, prepared))


def _run_step(step: Step, values: dict[int, np.ndarray], infos: list[OperandInfo], run: _Run) -> None:
    _check_deadline(run.deadline_ns, step)
    timings = run.timings
    # .get: a constant the cache did not keep (its op reads the packed form) arrives as None
    args = [values.get(i) if i >= 0 else None for i in step.inputs]
    t0 = time.perf_counter_ns() if timings is not None else 0
    try:
        if step.ctx.op_type in CONTROL_FLOW and step.spec is not None:
            outs = control_flow.run(step, args, run.control_flow())
        else:
            outs = step.kernel.execute(step.ctx, args)
    except HalError:
        raise
    except Exception as e:
        raise HalError(ErrorStatus.GENERAL_FAILURE, f"{step.ctx.name}: execution failed: {e!r}") from e
    if timings is not None:
        timings.append(OperationTiming(step.index, step.ctx.op_type, time.perf_counter_ns() - t0,
                                       step.kernel.backend, len(step.operations)))
    dynamic = step.spec is not None and step.spec.data_dependent_outputs
    for j, (o, out) in enumerate(zip(step.outputs, outs)):
        info = infos[o]
        if dynamic and out.dtype == info.dtype and _fits(out.shape, info.shape):
            infos[o] = info = dataclasses.replace(info, shape=tuple(out.shape))  # the later steps plan with it
        if out.shape != info.shape or out.dtype != info.dtype:
            raise HalError(ErrorStatus.GENERAL_FAILURE,
                           f"{step.ctx.name}: output {j} came out {out.dtype}{list(out.shape)}, "
                           f"prepared as {type_name(info.type)}{list(info.shape)}")
        values[o] = out


def bind(compiled: CompiledModel, inputs: list[np.ndarray], outputs: list[np.ndarray]):
    """A runner for fixed input and output arrays (a local burst's shared-memory slots), or None.

    Each ``runner(timings, deadline_ns, loop_timeout_ns)`` computes from the inputs' current
    contents straight into the outputs, with no per-execution argument handling. A static model
    whose whole program is one step that binds arrays (a graph-backend partition's executable, or
    a fused step's plan with a ``bind``: the numba backend's ``fc_chain``) and reads exactly the
    model's inputs and writes exactly its outputs binds that step (``loop_timeout_ns`` bounds a
    partition that runs loops, as ``execute``'s does); any other static program is bound step by
    step (``hal.bound_program``: intermediates allocated once, each step's arguments computed once).
    None (the caller uses ``execute`` and copies): a model planned per execution, arrays that are
    not C-contiguous or not the prepared shapes, an IF or a WHILE not bound (hal.bound_loop),
    data-dependent shapes."""
    plan = compiled.static_plan
    if plan is None or len(inputs) != len(compiled.input_indexes) or len(outputs) != len(compiled.output_indexes) \
            or len(set(compiled.output_indexes)) != len(compiled.output_indexes):
        return None
    single = _bind_single(compiled, plan, inputs, outputs) if len(plan.program) == 1 else None
    if single is not None:
        return single
    fixed = [(i, a) for i, a in zip(compiled.input_indexes, inputs)] + \
        [(o, a) for o, a in zip(compiled.output_indexes, outputs)]
    for i, arr in fixed:
        info = plan.infos[i]
        if arr.shape != info.shape or arr.dtype != info.dtype or not arr.flags.c_contiguous:
            return None
    return bind_program(plan, compiled.constants, dict(zip(compiled.input_indexes, inputs)),
                        dict(zip(compiled.output_indexes, outputs)), OperationTiming, compiled.subgraphs)


def _bind_single(compiled: CompiledModel, plan: Plan, inputs: list[np.ndarray], outputs: list[np.ndarray]):
    """``bind`` of a program of one step that binds the model's own arrays, or None."""
    step = plan.program[0]
    binder = plan_binder(step)
    if binder is None or sorted(step.inputs) != sorted(compiled.input_indexes) \
            or sorted(step.outputs) != sorted(compiled.output_indexes):
        return None
    by_operand = dict(zip(compiled.input_indexes, inputs))
    out_by_operand = dict(zip(compiled.output_indexes, outputs))
    for o, arr in out_by_operand.items():
        info = plan.infos[o]
        if arr.shape != info.shape or arr.dtype != info.dtype or not arr.flags.c_contiguous:
            return None
    run = binder([np.ascontiguousarray(by_operand[i]) for i in step.inputs], [out_by_operand[o] for o in step.outputs])
    loops = runs_loops(step)
    # what each execution records, looked up once: the runner is a burst's whole per-request work
    index, op_type, backend, count, clock = step.index, step.ctx.op_type, step.kernel.backend, len(step.operations), \
        time.perf_counter_ns

    def runner(timings: list[OperationTiming] | None = None, deadline_ns: int | None = None,
               loop_timeout_ns: int | None = None) -> None:
        if deadline_ns is not None:
            _check_deadline(deadline_ns, step)
        t0 = clock()
        try:
            if loops:
                run((deadline_ns, control_flow.loop_timeout_ns(loop_timeout_ns)))
            else:
                run()
        except HalError:
            raise
        except Exception as e:
            raise HalError(ErrorStatus.GENERAL_FAILURE, f"{step.ctx.name}: execution failed: {e!r}") from e
        if timings is not None:
            timings.append(OperationTiming(index, op_type, clock() - t0, backend, count))
    return runner


def execute_request(compiled: CompiledModel, request: Request,
                    timings: list[OperationTiming] | None = None,
                    deadline_ns: int | None = None, loop_timeout_ns: int | None = None) -> list[OutputShape]:
    """NNAPI execute: read inputs from request pools, write outputs into them.

    Raises HalError(OUTPUT_INSUFFICIENT_SIZE) with ``.output_shapes`` set when an
    output buffer is too small, as NNAPI reports it.
    """
    validate_request(request, compiled.model)
    operands = compiled.model.main.operands
    inputs = []
    for k, (arg, idx) in enumerate(zip(request.inputs, compiled.input_indexes)):
        operand = operands[idx]
        if arg.has_no_value:  # omitted: the operations reading it must allow that (checked when planned)
            inputs.append(None)
            continue
        dims = tuple(arg.dimensions) or tuple(operand.dimensions)
        dtype = compiled.input_info(k).dtype
        loc = arg.location
        raw = memoryview(request.pools[loc.pool_index]).cast("B")[loc.offset:loc.offset + loc.length]
        arr = np.frombuffer(raw, dtype=dtype)
        inputs.append(arr.reshape(() if operand.type in SCALAR_TYPES else dims))
    outs = execute(compiled, inputs, timings, deadline_ns, _validated=True, loop_timeout_ns=loop_timeout_ns)
    shapes = [OutputShape(tuple(out.shape), out.nbytes <= arg.location.length)
              for arg, out in zip(request.outputs, outs)]
    if not all(s.is_sufficient for s in shapes):
        err = HalError(ErrorStatus.OUTPUT_INSUFFICIENT_SIZE, "output buffer too small: " + ", ".join(
            f"output {k} needs {outs[k].nbytes} bytes, got {a.location.length}"
            for k, (a, s) in enumerate(zip(request.outputs, shapes)) if not s.is_sufficient))
        err.output_shapes = shapes
        raise err
    for arg, out in zip(request.outputs, outs):
        loc = arg.location
        dst = memoryview(request.pools[loc.pool_index]).cast("B")
        dst[loc.offset:loc.offset + out.nbytes] = np.ascontiguousarray(out).view(np.uint8).reshape(-1).data
    return shapes


__all__ = ["bind", "check_inputs", "execute", "execute_request", "OutputShape", "OperationTiming"]
