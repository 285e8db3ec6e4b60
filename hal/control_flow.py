"""Running IF and WHILE: the executor's part of control flow (AOSP's CpuExecutor does the same).

The operations' rules are in hal/operations/control_flow.py. Running one needs what no kernel
has: the compiled referenced subgraphs and the execution's deadline and loop timeout, so the
executor calls ``run`` here instead of a backend kernel.

Loop timeout (NNAPI's ANeuralNetworksExecution_setLoopTimeout): each WHILE may run for at most
the execution's loop timeout, 2 s by default and never more than 15 s (a longer request is
clamped, as NNAPI clamps it); a loop still running then ends the execution with
MISSED_DEADLINE_TRANSIENT. An endless loop therefore costs a client at most 15 s of one worker,
never the service.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from hal.compiler import CompiledModel
from hal.errors import HalError
from hal.plan import Step
from hal.types import ErrorStatus, OperationType

DEFAULT_LOOP_TIMEOUT_NS = 2_000_000_000  # ANeuralNetworks_getDefaultLoopTimeout
MAX_LOOP_TIMEOUT_NS = 15_000_000_000  # ANeuralNetworks_getMaximumLoopTimeout
#: Bound on the bytes a WHILE carries from one iteration to the next: a body that grows its state
#: every iteration fails cleanly instead of exhausting the service's memory before the timeout.
MAX_LOOP_STATE_BYTES = 1 << 31


def loop_timeout_ns(requested: int | None) -> int:
    """The loop timeout an execution runs with: the default for None or a value <= 0 (unset),
    else the request clamped to the maximum."""
    if requested is None or requested <= 0:
        return DEFAULT_LOOP_TIMEOUT_NS
    return min(int(requested), MAX_LOOP_TIMEOUT_NS)


#: Runs a compiled subgraph on input arrays: the executor's ``execute`` with this execution's
#: deadline and loop timeout bound in.
RunSubgraph = Callable[[CompiledModel, list], list]


@dataclass
class ControlFlowRun:
    subgraph: Callable[[int], CompiledModel]  # the compiled referenced subgraph of an index
    run: RunSubgraph
    deadline_ns: int | None
    loop_timeout_ns: int


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


def _run_while(step: Step, args: list, cf: ControlFlowRun) -> list[np.ndarray]:
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
