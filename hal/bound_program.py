"""A static plan's whole program bound to fixed input and output arrays (a burst's slots): every
intermediate tensor gets its buffer once, every step its arguments once, and an execution is
straight-line calls of zero-argument runners, generated as Python source and compiled once per
binding, so that no per-step argument list, allocation, dictionary or loop remains.

A step binds through its kernel's ``bind`` (``hal.backends.Kernel.bind``), or a partition's
executable / a fused step's plan offering ``bind(inputs, outputs)``; a reshape whose output is not
a model output is a view of its input's buffer (no call); a WHILE binds its condition and body
(``hal.bound_loop``); any other step runs its ``execute`` on the fixed buffers and its results are
copied into its output buffers.

Memory: the plan's memory plan (``Plan.release``) says when a tensor is dead; its buffer is then
taken by a later intermediate (``_Arena``), so a binding holds about the model's largest live
activations, for the binding's lifetime.
"""
from __future__ import annotations

import itertools
import time
from typing import Callable

import numpy as np

from hal.backends.registry import get as backend_named
from hal.bound_loop import BoundLoop, bind_while
from hal.errors import HalError
from hal.operations.control_flow import CONTROL_FLOW
from hal.plan import Plan, Step
from hal.types import ErrorStatus, OperationType, type_name

#: Operations whose output is their input's bytes under another shape (and, as NNAPI requires, the
#: same quantization): bound as a view of the input's buffer.
VIEWS = frozenset({OperationType.RESHAPE, OperationType.SQUEEZE, OperationType.EXPAND_DIMS})

_SOURCE = "<bound program>"  # the generated runners' file name: a failure's line names its step


def _nothing() -> None:
    """A view step's runner: its output already is its input's buffer."""


class BoundProgram:
    """``program(timings, deadline_ns)`` runs the bound steps, in one of three generated functions
    of straight-line code: plain calls; a deadline check before each; or, when timings are asked
    for, one ``time.monotonic_ns`` reading before each step (the deadline's clock, and the step's
    start), a step's time running to the next reading, one ``record(index, op_type, ns, backend,
    count)`` per step (``hal.executor.OperationTiming``) added at the end. The plain form calls
    consecutive steps of a backend with a ``chain`` (``hal.backends.Backend.chain``) as that
    backend chained them; where it fails, the per-step form runs the program again, so that the
    error names its step."""

    __slots__ = ("calls", "steps", "record", "chained", "loops", "_fields", "_run", "_run_late", "_run_timed")

    #: The generated functions' lines per step: a failure's line number names its step.
    _LINES = {"run": 1, "run_late": 2, "run_timed": 3}

    def __init__(self, calls: list[Callable[[], object]], steps: list[Step], record) -> None:
        self.calls, self.steps, self.record = calls, steps, record
        #: Its bound WHILEs, given the execution's limits before each run.
        self.loops = [c for c in calls if isinstance(c, BoundLoop)]
        self._fields = ([s.index for s in steps], [s.ctx.op_type for s in steps], [s.kernel.backend for s in steps],
                        [len(s.operations) for s in steps])
        scope = {f"c{k}": c for k, c in enumerate(calls)}
        scope.update(clock=time.monotonic_ns, late=self._late)
        call = [f"c{k}()" if c is not _nothing else "pass" for k, c in enumerate(calls)]
        chained = _chained(calls, steps)
        #: Whether the plain form calls a backend's chained runners (faster than the timed form).
        self.chained = chained is not None
        if chained is None:
            self._run = _compile("run", "", call, scope)
        else:
            scope.update({f"f{k}": c for k, c in enumerate(chained)})
            self._run = _compile("run", "", [f"f{k}()" for k in range(len(chained))], scope)
        self._run_late = _compile("run_late", "deadline", [line for k, c in enumerate(call) for line in (
            f"if clock() > deadline: late({k})", c)], scope)
        n = len(calls)
        self._run_timed = _compile("run_timed", "deadline", [line for k, c in enumerate(call) for line in (
            f"t{k} = clock()", f"if t{k} > deadline: late({k})", c)]
            + [f"return ({', '.join(f't{k}' for k in range(n + 1))},)" if n else "return ()"], scope,
            end=f"t{n} = clock()")

    def __call__(self, timings: list | None = None, deadline_ns: int | None = None,
                 loop_timeout_ns: int | None = None) -> None:
        for loop in self.loops:
            loop.limits = (deadline_ns, loop_timeout_ns)
        try:
            if timings is not None:
                stamps = self._run_timed(_NEVER if deadline_ns is None else deadline_ns)
                ns = [b - a for a, b in zip(stamps, stamps[1:])]
                index, op_type, backend, count = self._fields
                timings.extend(map(self.record, index, op_type, ns, backend, count))
            elif deadline_ns is None:
                try:
                    self._run()
                except Exception:
                    if not self.chained:
                        raise
                    self._run_late(_NEVER)  # the steps one by one: the failure names its step
            else:
                self._run_late(deadline_ns)
        except HalError:
            raise
        except Exception as e:
            raise HalError(ErrorStatus.GENERAL_FAILURE, f"{self._failed(e)}: execution failed: {e!r}") from e

    @staticmethod
    def is_view(call: Callable[[], object]) -> bool:
        """Whether a step's runner is a view's, which calls nothing."""
        return call is _nothing

    def _late(self, k: int) -> None:
        raise HalError(ErrorStatus.MISSED_DEADLINE_TRANSIENT, f"deadline passed before {self.steps[k].ctx.name}")

    def _failed(self, e: Exception) -> str:
        """The failing step's name, from the generated source's line the traceback passed (line 1
        is the ``def``)."""
        tb, k = e.__traceback__, None
        while tb is not None:
            code = tb.tb_frame.f_code
            if code.co_filename == _SOURCE and code.co_name in self._LINES:
                k = (tb.tb_lineno - 2) // self._LINES[code.co_name]
            tb = tb.tb_next
        return self.steps[k].ctx.name if k is not None and 0 <= k < len(self.steps) else "bound program"


#: "No deadline" for the timed form, which compares every step's clock reading with one.
_NEVER = 1 << 63


def _chained(calls: list[Callable[[], object]], steps: list[Step]) -> list[Callable[[], object]] | None:
    """The plain form's runners: each run of consecutive steps of one backend that has a ``chain``
    as that backend chains their runners (view steps, which call nothing, left out); None where
    no backend chains anything."""
    kept = [(c, s.kernel.backend) for c, s in zip(calls, steps) if c is not _nothing]
    out: list[Callable[[], object]] = []
    changed = False
    for name, run in itertools.groupby(kept, key=lambda kept_call: kept_call[1]):
        group = [c for c, _ in run]
        backend = backend_named(name)
        chained = backend.chain(group) if backend is not None and backend.chain is not None else group
        changed = changed or len(chained) != len(group)
        out.extend(chained)
    return out if changed else None


def _compile(name: str, params: str, lines: list[str], scope: dict, end: str = "") -> Callable:
    """``def name(params)`` of ``lines`` (``end``: one line more, before the last)."""
    if end:
        lines = [*lines[:-1], end, lines[-1]]
    src = f"def {name}({params}):\n" + "".join(f"    {line}\n" for line in lines or ["pass"])
    exec(compile(src, _SOURCE, "exec"), scope)  # noqa: S102 - source made here of names c0.. only
    return scope[name]


def bind_program(plan: Plan, template: dict[int, np.ndarray], inputs: dict[int, np.ndarray],
                 outputs: dict[int, np.ndarray], record, subgraphs=None) -> BoundProgram | None:
    """The program of ``plan`` reading the fixed ``inputs`` and writing the fixed ``outputs``
    (operand index -> C-contiguous array of the prepared shape and dtype; ``template``: the
    constants), or None where a step cannot run bound: an IF, a WHILE ``hal.bound_loop`` does not
    bind (``subgraphs``: the model's compiled referenced subgraphs), a partition running loops, an
    output shape that depends on the data, a model output no step produces."""
    arrays: dict[int, np.ndarray | None] = dict(template)
    arrays.update(inputs)
    produced = {o for s in plan.program for o in s.outputs}
    if any(o not in produced or o in inputs for o in outputs):
        return None
    calls, arena = [], _Arena()
    for step, dead in zip(plan.program, plan.release):
        loop = step.spec is not None and step.ctx.op_type == OperationType.WHILE
        if step.spec is not None and not loop and (step.ctx.op_type in CONTROL_FLOW
                                                   or step.spec.data_dependent_outputs):
            return None
        if runs_loops(step):
            return None
        infos = [plan.infos[o] for o in step.outputs]
        if any(0 in info.shape for info in infos):
            return None
        args = [arrays.get(i) if i >= 0 else None for i in step.inputs]
        view = _view(step, args, infos[0]) if step.outputs[0] not in outputs else None
        if view is not None:
            arrays[step.outputs[0]] = view
            arena.share(step.inputs[0], step.outputs[0])
            calls.append(_nothing)
        else:
            dests = [outputs[o] if o in outputs else arena.take(o, info.shape, info.dtype)
                     for o, info in zip(step.outputs, infos)]
            arrays.update(zip(step.outputs, dests))
            if loop:
                bound = bind_while(step, args, dests, subgraphs, bind_program)
                if bound is None:
                    return None
                calls.append(bound)
            else:
                calls.append(_bind_step(step, args, dests) or _executed(step, args, dests))
        for o in dead:  # the memory plan: this step was the tensor's last reader
            arena.give(o)
    return BoundProgram(calls, list(plan.program), record)


class _Arena:
    """The intermediates' memory: a dead tensor's buffer is taken again by a later tensor (the
    smallest free one that fits), so that successive layers write memory still in cache, as
    numpy's allocator gives ``execute`` the memory it has just freed. A view shares its input's
    buffer, which is free once neither is live."""

    def __init__(self) -> None:
        self.free: list[np.ndarray] = []  # uint8 buffers, smallest first
        self.owner: dict[int, np.ndarray] = {}  # live operand -> its buffer
        self.users: dict[int, int] = {}  # id(buffer) -> live operands in it

    def take(self, operand: int, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        dtype = np.dtype(dtype)
        nbytes = max(int(np.prod(shape)) * dtype.itemsize, 1)
        k = next((k for k, b in enumerate(self.free) if b.size >= nbytes), None)
        if k is not None:
            raw = self.free.pop(k)
        else:  # starting on a cache line: a vector kernel's 64-byte loads then never straddle two
            size = -(-nbytes // 64) * 64
            block = np.empty(size + 64, np.uint8)
            skip = -block.ctypes.data % 64
            raw = block[skip:skip + size]
        self.owner[operand] = raw
        self.users[id(raw)] = 1
        return raw[:nbytes].view(dtype)[:int(np.prod(shape))].reshape(shape)

    def share(self, operand: int, view: int) -> None:
        raw = self.owner.get(operand)
        if raw is not None:
            self.owner[view] = raw
            self.users[id(raw)] += 1

    def give(self, operand: int) -> None:
        raw = self.owner.pop(operand, None)
        if raw is None:
            return
        self.users[id(raw)] -= 1
        if not self.users[id(raw)]:
            del self.users[id(raw)]
            self.free.append(raw)
            self.free.sort(key=lambda b: b.size)


def _view(step: Step, args: list, out) -> np.ndarray | None:
    if step.spec is None or step.ctx.op_type not in VIEWS or len(step.outputs) != 1:
        return None
    x, info = args[0], step.ctx.inputs[0]
    if x is None or not x.flags.c_contiguous or x.dtype != out.dtype or x.size != int(np.prod(out.shape)) \
            or (info.scale, info.zero_point) != (out.scale, out.zero_point):
        return None
    return x.reshape(out.shape)


def plan_binder(step: Step) -> Callable | None:
    """A partition's executable's or a fused step's plan's ``bind(inputs, outputs)``, if it has one."""
    if step.spec is not None:
        return None
    holder = getattr(step.ctx, "executable", None)
    return getattr(getattr(step.ctx, "data", None) if holder is None else holder, "bind", None)


def runs_loops(step: Step) -> bool:
    """Whether a partition step's executable runs loops (a graph backend's lowered WHILE): it is
    then called with the execution's deadline and loop timeout, which bound it."""
    return bool(getattr(getattr(step.ctx, "executable", None), "loops", ()))


def _bind_step(step: Step, args: list, dests: list) -> Callable[[], object] | None:
    if step.kernel.bind is not None:
        return step.kernel.bind(step.ctx, args, dests)
    binder = plan_binder(step)
    if binder is not None and all(a is not None and a.flags.c_contiguous for a in args):
        return binder(args, dests)
    return None


def _executed(step: Step, args: list, dests: list) -> Callable[[], None]:
    """A step without a bound form: its ``execute`` on the fixed buffers, the results copied."""
    execute, ctx = step.kernel.execute, step.ctx

    def run() -> None:
        results = execute(ctx, list(args))
        if len(results) < len(dests):
            raise HalError(ErrorStatus.GENERAL_FAILURE, f"{ctx.name}: {len(results)} outputs came out, "
                                                        f"{len(dests)} prepared")
        for j, (out, dst) in enumerate(zip(results, dests)):
            if out.shape != dst.shape or out.dtype != dst.dtype:
                raise HalError(ErrorStatus.GENERAL_FAILURE,
                               f"{ctx.name}: output {j} came out {out.dtype}{list(out.shape)}, "
                               f"prepared as {type_name(ctx.outputs[j].type)}{list(dst.shape)}")
            if out is not dst:
                np.copyto(dst, out)
    return run


__all__ = ["BoundProgram", "VIEWS", "bind_program", "plan_binder", "runs_loops"]
