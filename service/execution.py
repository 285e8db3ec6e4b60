"""A prepared model and the one way it executes.

Every transport (unary gRPC, the gRPC burst, the shared-memory burst) and the delegate's
in-process fallback only translate their wire format into calls on a ``PreparedModel``:
``execute`` for a request whose tensors live in memory pools, ``execute_arrays`` for numpy arrays,
``bind`` for fixed input and output arrays executed again and again (a burst's slots). What an
execution is subject to lives here once: the priority scheduler's admission, the deadline, the
LOW_POWER gate, the WHILE loop timeout, the perf records and the timing. AOSP keeps its burst
server a codec over one executor the same way (``ExecutionBurstServer`` over
``IBurstExecutorWithCache``).
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from hal.compiler import CompiledModel
from hal.errors import HalError
from hal.executor import OperationTiming, OutputShape, check_inputs, execute, execute_request
from hal.executor import bind as hal_bind
from hal.model import Request
from hal.types import ErrorStatus, ExecutionPreference, Priority
from service.scheduler import Scheduler


@dataclass
class OperationPerfRecord:
    index: int
    type: int
    executions: int = 0
    total_ns: int = 0
    backend: str = ""
    #: Operations timed together: a graph backend's partition runs index .. index + count - 1
    #: (type -1), in one call whose time cannot be split between them.
    count: int = 1


class PerfCounters:
    """Per-operation execution counts and time (Hexagon NN's perfinfo). ``executions`` counts every
    execution; an operation's ``executions`` those timed per operation (a bound model's unmeasured
    executions are sampled: ``TIMED_ONE_IN``), over which its ``total_ns`` is summed."""

    def __init__(self, compiled: CompiledModel | None = None) -> None:
        self._lock = threading.Lock()
        self.executions = 0
        self.ops: dict[int, OperationPerfRecord] = {}
        #: Every operation's assigned backend, known before any execution for static models.
        self._assigned: dict[int, tuple[int, str, int]] = {}
        if compiled is not None and compiled.static_plan is not None:
            self._assigned = {s.index: (s.ctx.op_type, s.backend, len(s.operations))
                              for s in compiled.static_plan.program}
        self._seed()

    def _seed(self) -> None:
        for k, (t, backend, count) in self._assigned.items():
            self.ops[k] = OperationPerfRecord(k, t, backend=backend, count=count)

    def record(self, timings: list[OperationTiming]) -> None:
        with self._lock:
            self.executions += 1
            for t in timings:
                r = self.ops.get(t.index)
                if r is None:
                    r = self.ops[t.index] = OperationPerfRecord(t.index, t.type, backend=t.backend, count=t.count)
                # a dynamic model's plan per input shape may assign another backend or partition
                r.backend, r.type, r.count = t.backend, t.type, t.count
                r.executions += 1
                r.total_ns += t.ns

    def snapshot(self) -> tuple[int, list[OperationPerfRecord]]:
        with self._lock:
            return self.executions, [OperationPerfRecord(**r.__dict__) for _, r in sorted(self.ops.items())]

    def reset(self) -> None:
        with self._lock:
            self.executions = 0
            self.ops.clear()
            self._seed()


@dataclass(slots=True)
class ExecutionResult:
    output_shapes: list[OutputShape]
    time_in_driver_ns: int
    #: The operations' timings: the time on device is their sum (added up only when asked for).
    timings: list[OperationTiming] = field(default_factory=list)

    @property
    def time_on_device_ns(self) -> int:
        return sum(t.ns for t in self.timings) if self.time_in_driver_ns >= 0 else -1

    @classmethod
    def failed(cls, output_shapes: list[OutputShape] | None = None) -> "ExecutionResult":
        """What a failed execution reports: its output shapes (OUTPUT_INSUFFICIENT_SIZE), no timing."""
        return cls(output_shapes or [], -1)


def deadline_from_timeout(timeout_ns: int, start_ns: int | None = None) -> int | None:
    """The monotonic deadline of a request that allows ``timeout_ns`` from ``start_ns`` (now); 0: none."""
    if timeout_ns <= 0:
        return None
    return (time.monotonic_ns() if start_ns is None else start_ns) + timeout_ns


def check_deadline(deadline_ns: int | None, what: str) -> None:
    if deadline_ns is not None and time.monotonic_ns() > deadline_ns:
        raise HalError(ErrorStatus.MISSED_DEADLINE_TRANSIENT, f"deadline passed {what}")


#: One execution's work, given the list its operation timings go into, the deadline (None: none)
#: and the WHILE loop timeout (0: the default); returns the output shapes.
Work = Callable[[list[OperationTiming], "int | None", int], list[OutputShape]]


@dataclass(eq=False)
class PreparedModel:
    """IPreparedModel's state on the service: the compiled model and how its executions run."""

    id: str
    compiled: CompiledModel
    preference: ExecutionPreference
    priority: Priority
    #: Admission for every execution of the service (None: in-process, no limit).
    scheduler: Scheduler | None = None
    perf: PerfCounters = field(default=None)  # type: ignore[assignment]
    #: The execution-preference knob: LOW_POWER runs one execution of this model at a time.
    gate: threading.Semaphore | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        if self.perf is None:
            self.perf = PerfCounters(self.compiled)
        if self.preference == ExecutionPreference.LOW_POWER:
            self.gate = threading.Semaphore(1)

    # ---- the entries ------------------------------------------------------------------------------
    def execute(self, request: Request, deadline_ns: int | None, received_ns: int,
                loop_timeout_ns: int = 0) -> ExecutionResult:
        """NNAPI execute: inputs read from and outputs written into the request's pools.
        ``loop_timeout_ns``: the bound on each WHILE loop (0: NNAPI's default, 2 s; clamped to
        15 s by ``hal.control_flow``). OUTPUT_INSUFFICIENT_SIZE carries ``output_shapes``."""
        def work(timings, deadline_ns, loop_timeout_ns):
            return execute_request(self.compiled, request, timings, deadline_ns, loop_timeout_ns)
        return self._run(work, deadline_ns, received_ns, loop_timeout_ns)

    def execute_arrays(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray] | None = None, *,
                       deadline_ns: int | None = None, loop_timeout_ns: int = 0) -> tuple[list[np.ndarray],
                                                                                           ExecutionResult]:
        """Execute on numpy inputs (validated against the model). With ``outputs``, each result is
        written into the given array (reshaped to it: the element counts must match) and those
        arrays are returned; else new arrays."""
        received = time.monotonic_ns()
        results: list[np.ndarray] = []

        def work(timings, deadline_ns, loop_timeout_ns):
            outs = execute(self.compiled, inputs, timings, deadline_ns, loop_timeout_ns=loop_timeout_ns or None)
            if outputs is None:
                results.extend(outs)
            else:
                _deliver(outs, outputs)
                results.extend(outputs)
            return [OutputShape(tuple(o.shape), True) for o in outs]
        result = self._run(work, deadline_ns, received, loop_timeout_ns)
        return results, result

    def output_slots(self) -> list[tuple[tuple[int, ...], np.dtype]] | None:
        """Each output's (shape, dtype) when every execution produces the same (a static model), else None."""
        plan = self.compiled.static_plan
        if plan is None:
            return None
        return [(plan.infos[i].shape, plan.infos[i].dtype) for i in self.compiled.output_indexes]

    def bind(self, inputs: list[np.ndarray], outputs: list[np.ndarray]) -> "BoundExecution | None":
        """Executions that read ``inputs`` and write ``outputs``, fixed arrays whose contents change
        between executions (a burst's slots); None for a model whose output shapes depend on its
        inputs (each request is then executed and validated on its own)."""
        slots = self.output_slots()
        if slots is None or len(outputs) != len(slots):
            return None
        if any(o.shape != s or o.dtype != d or not o.flags.c_contiguous for o, (s, d) in zip(outputs, slots)):
            return None
        check_inputs(self.compiled, inputs)
        return BoundExecution(self, inputs, outputs)

    # ---- what every execution is subject to -----------------------------------------------------
    def _run(self, work: Work, deadline_ns: int | None, received_ns: int, loop_timeout_ns: int = 0,
             done: Callable[[], None] | None = None) -> ExecutionResult:
        scheduler = self.scheduler
        if scheduler is None:
            return self._admitted(work, deadline_ns, received_ns, loop_timeout_ns, done)
        scheduler.admit(self.priority)
        try:
            return self._admitted(work, deadline_ns, received_ns, loop_timeout_ns, done)
        finally:
            scheduler.release()

    def _admitted(self, work: Work, deadline_ns: int | None, received_ns: int, loop_timeout_ns: int,
                  done: Callable[[], None] | None = None) -> ExecutionResult:
        """``done``: called once the outputs are valid (computed, in time) and recorded: a
        transport's reply that needs no timing goes out then (``BoundExecution``)."""
        if deadline_ns is not None:
            check_deadline(deadline_ns, "before execution started")
        timings: list[OperationTiming] = []
        gate = self.gate
        if gate is None:
            shapes = work(timings, deadline_ns, loop_timeout_ns)
        else:
            with gate:
                shapes = work(timings, deadline_ns, loop_timeout_ns)
        self.perf.record(timings)
        # The executor checks the deadline between steps, and a model that is one step (one
        # partition, one operation) has no "between": a result computed past the deadline is a
        # missed deadline all the same (NNAPI: MISSED_DEADLINE_*, the outputs are not valid).
        if deadline_ns is not None:
            check_deadline(deadline_ns, "during execution (the result came too late)")
        if done is not None:
            done()
        return ExecutionResult(shapes, time.monotonic_ns() - received_ns, timings)


#: A bound model whose untimed program chains its steps (``hal.bound_program``): its executions
#: that nobody measures are timed step by step one in this many (and the first), the
#: per-operation counters' sample; the others run the untimed form.
TIMED_ONE_IN = 16


class BoundExecution:
    """``PreparedModel.bind``: a model's executions on fixed arrays. A static model's program is
    bound to them (``hal.executor.bind``: one partition computing straight into the outputs, or
    every step bound once, intermediates allocated once); otherwise (control flow, shapes that
    depend on the data) each execution's results are copied into them once. Everything per
    execution is prepared here once (the work, the shapes): a call is the admission, the gate, the
    work and the records (``PreparedModel._run``: the one place they are done). An execution
    whose caller does not measure it is timed per operation as ``TIMED_ONE_IN`` says."""

    def __init__(self, model: PreparedModel, inputs: list[np.ndarray], outputs: list[np.ndarray]):
        self.model, self.inputs, self.outputs = model, inputs, outputs
        self.shapes = [OutputShape(tuple(o.shape), True) for o in outputs]
        self._runner = hal_bind(model.compiled, inputs, outputs)
        self._work: Work = self._run_bound if self._runner is not None else self._run_and_copy
        self._untimed: Work = self._run_untimed if self._runner is not None else self._run_and_copy
        self._executions = 0
        self._sampled = bool(getattr(self._runner, "chained", False))

    def __call__(self, deadline_ns: int | None, received_ns: int, loop_timeout_ns: int = 0,
                 measure: bool = True, done: Callable[[], None] | None = None) -> ExecutionResult:
        """One execution; ``measure`` False: the caller does not read its timing. ``done``: called as
        soon as the outputs are valid and recorded (``PreparedModel._admitted``): a reply sent
        then does not wait for the rest of the way back to the transport, which after a large
        model's run costs several times what it does hot (the caches hold the model's data, not
        the interpreter's). MobileNetV3-small through the delegate, from the end of the run to the
        posted reply: 29 us p50 posted after the return, 19 us posted from ``done``."""
        self._executions += 1
        timed = measure or not self._sampled or self._executions % TIMED_ONE_IN == 1
        return self.model._run(self._work if timed else self._untimed, deadline_ns, received_ns, loop_timeout_ns,
                               done)

    def _run_bound(self, timings: list[OperationTiming], deadline_ns: int | None, loop_timeout_ns: int):
        self._runner(timings, deadline_ns, loop_timeout_ns or None)
        return self.shapes

    def _run_untimed(self, timings: list[OperationTiming], deadline_ns: int | None, loop_timeout_ns: int):
        self._runner(None, deadline_ns, loop_timeout_ns or None)
        return self.shapes

    def _run_and_copy(self, timings: list[OperationTiming], deadline_ns: int | None, loop_timeout_ns: int):
        outs = execute(self.model.compiled, self.inputs, timings, deadline_ns, _validated=True,
                       loop_timeout_ns=loop_timeout_ns or None)
        for dst, out in zip(self.outputs, outs):
            np.copyto(dst, out, casting="no")
        return self.shapes


def _deliver(outs: list[np.ndarray], dests: list[np.ndarray]) -> None:
    if len(dests) != len(outs):
        raise HalError(ErrorStatus.INVALID_ARGUMENT, f"the model has {len(outs)} outputs, {len(dests)} arrays given")
    for k, (out, dst) in enumerate(zip(outs, dests)):
        if out.size != dst.size or out.dtype != dst.dtype:
            raise HalError(ErrorStatus.INVALID_ARGUMENT, f"output {k} is {out.dtype}{list(out.shape)}, the array "
                                                         f"given for it {dst.dtype}{list(dst.shape)}")
        np.copyto(dst, out.reshape(dst.shape), casting="no")


__all__ = ["BoundExecution", "ExecutionResult", "OperationPerfRecord", "PerfCounters", "PreparedModel",
           "check_deadline", "deadline_from_timeout"]
