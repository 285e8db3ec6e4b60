"""Running IF and WHILE: the executor's part of control flow (AOSP's CpuExecutor does the same).

The operations' rules are in hal/operations/control_flow.py. Running one needs what no kernel
has: the compiled referenced subgraphs and the execution's deadline and loop timeout, so the
executor calls ``run`` here instead of a backend kernel.

Loop timeout (NNAPI's ANeuralNetworksExecution_setLoopTimeout): each WHILE may run for at most
the execution's loop timeout, 2 s by default and never more than 15 s (a longer request is
clamped, as NNAPI clamps it); a loop still running then ends the execution with
MISSED_DEADLINE_TRANSIENT. An endless loop therefore costs a client at most 15 s of one worker,
never the service.

A WHILE whose subgraphs have static plans runs bound (hal.bound_loop; with the numba backend one
native call), once per thread bound to buffers of its own; others run trip by trip here.
"""
from __future__ import annotations

import threading
import time
import weakref
from dataclasses import dataclass
from typing import Callable

import numpy as np

from hal.bound_loop import DEFAULT_LOOP_TIMEOUT_NS, MAX_LOOP_TIMEOUT_NS, BoundLoop, bind_while, loop_timeout_ns
from hal.bound_program import bind_program
from hal.compiler import CompiledModel, Subgraphs
from hal.errors import HalError
from hal.plan import Step
from hal.types import ErrorStatus, OperationType

#: Bound on the bytes a WHILE carries from one iteration to the next: a body that grows its state
#: every iteration fails cleanly instead of exhausting the service's memory before the timeout.
MAX_LOOP_STATE_BYTES = 1 << 31


#: Runs a compiled subgraph on input arrays: the executor's ``execute`` with this execution's
#: deadline and loop timeout bound in.
RunSubgraph = Callable[[CompiledModel, list], list]


@dataclass
class ControlFlowRun:
    subgraphs: Subgraphs  # the model's compiled referenced subgraphs
    run: RunSubgraph
    deadline_ns: int | None
    loop_timeout_ns: int

    def subgraph(self, k: int) -> CompiledModel:
        return self.subgraphs.get(k)


def run(step: Step, args: list, cf: ControlFlowRun) -> list[np.ndarray]:
    if step.ctx.op_type == OperationType.IF:
        return _run_if(step, args, cf)
    return _run_while(step, args, cf)


def _condition(value: np.ndarray, what: str) -> bool:
    if value.size != 1:
        raise HalError(ErrorStatus.INVALID_ARGUMENT, f"{what} has {value.size} elements; a condition has one")
    return bool(value.reshape(-1)[0])


def _run_if(step: Step, args: list, cf: ControlFlowRun) -> list[np.ndarray]:
    p = step.ctx.data  # IfParams / WhileParams (the reference backend's plan; cached with the model)
    branch = p.then_subgraph if _condition(args[0], f"{step.ctx.name}: the condition") else p.else_subgraph
    return cf.run(cf.subgraph(branch), args[3:])


class _ThreadLoop:
    """A WHILE bound (hal.bound_loop) to buffers of its own, for one thread's executions: each
    copies the loop's inputs in and its outputs out, and its trips run as a burst's do."""

    def __init__(self, step: Step, args: list, subgraphs: Subgraphs) -> None:
        p = step.ctx.data
        self.key = [(a.shape, a.dtype) for a in args[2:]]
        self.values = [np.empty(a.shape, a.dtype) for a in args[2:]]
        self.outputs = [np.empty_like(v) for v in self.values[:p.carried]]
        self.loop: BoundLoop | None = bind_while(step, [None, None, *self.values], self.outputs, subgraphs,
                                                 bind_program)

    def __call__(self, args: list, cf: ControlFlowRun) -> list[np.ndarray]:
        for buffer, a in zip(self.values, args[2:]):
            np.copyto(buffer, a)
        self.loop.limits = (cf.deadline_ns, cf.loop_timeout_ns)
        self.loop()
        return [o.copy() for o in self.outputs]


#: Per WHILE (its context) and thread, the loop bound for that thread's executions (None: it
#: does not bind, the trips run below).
_THREAD_LOOPS: "weakref.WeakKeyDictionary[object, dict[int, _ThreadLoop]]" = weakref.WeakKeyDictionary()
_thread_loops_lock = threading.Lock()


def _thread_loop(step: Step, args: list, cf: ControlFlowRun) -> _ThreadLoop | None:
    """This thread's bound form of the WHILE for these inputs' shapes and types, made on its first
    execution here; None where the loop does not bind."""
    with _thread_loops_lock:
        loops = _THREAD_LOOPS.setdefault(step.ctx, {})
    me = threading.get_ident()
    loop = loops.get(me)
    if loop is None or loop.key != [(a.shape, a.dtype) for a in args[2:]]:
        if any(a is None for a in args[2:]):
            return None
        loop = loops[me] = _ThreadLoop(step, args, cf.subgraphs)
    return loop if loop.loop is not None else None


def _run_while(step: Step, args: list, cf: ControlFlowRun) -> list[np.ndarray]:
    bound = _thread_loop(step, args, cf) if cf.subgraphs is not None else None
    if bound is not None:
        return bound(args, cf)
    p = step.ctx.data  # IfParams / WhileParams (the reference backend's plan; cached with the model)
    cond, body = cf.subgraph(p.cond_subgraph), cf.subgraph(p.body_subgraph)
    values = list(args[2:])
    carried = p.carried + p.state
    started = time.monotonic_ns()
    iteration = 0
    while True:
        now = time.monotonic_ns()
        if now - started > cf.loop_timeout_ns:
            raise HalError(ErrorStatus.MISSED_DEADLINE_TRANSIENT,
                           f"{step.ctx.name}: the loop ran longer than the loop timeout "
                           f"({cf.loop_timeout_ns / 1e9:g} s) after {iteration} iterations")
        if cf.deadline_ns is not None and now > cf.deadline_ns:
            raise HalError(ErrorStatus.MISSED_DEADLINE_TRANSIENT,
                           f"{step.ctx.name}: deadline passed in iteration {iteration}")
        if not _condition(cf.run(cond, values)[0], f"{step.ctx.name}: the condition's output"):
            return values[:p.carried]
        outs = cf.run(body, values)
        if sum(o.nbytes for o in outs) > MAX_LOOP_STATE_BYTES:
            raise HalError(ErrorStatus.INVALID_ARGUMENT,
                           f"{step.ctx.name}: the loop state grew past {MAX_LOOP_STATE_BYTES} bytes in "
                           f"iteration {iteration}")
        values[:carried] = outs
        iteration += 1


__all__ = ["ControlFlowRun", "DEFAULT_LOOP_TIMEOUT_NS", "MAX_LOOP_STATE_BYTES", "MAX_LOOP_TIMEOUT_NS", "RunSubgraph",
           "loop_timeout_ns", "run"]
