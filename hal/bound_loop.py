"""A WHILE bound to fixed arrays (``hal.bound_program``): its condition and body subgraphs bound
once, each to the loop's own buffers, so that a trip is the condition's steps, a test of its one
boolean, the body's steps and a copy of each value the body produced back into the buffer the next
trip reads, with nothing allocated, validated or looked up.

Where every step of both subgraphs is one backend's and it offers a native loop
(``Backend.loop``: the numba backend's native_chain.py), the whole loop is one native call without
the GIL, which reads the clock every trip; otherwise the trips are a Python loop over the two
bound programs. Either way the loop obeys what hal.control_flow's executor path obeys, with the same
errors: each WHILE at most the execution's loop timeout, and the deadline (MISSED_DEADLINE_TRANSIENT).

The carried values (NNAPI's input-output operands) live in the WHILE's own output buffers: the
last trip leaves its outputs there. Loop-state-only values get buffers of their own; input-only
values are read where they are. A loop is bound only when its subgraphs have static plans for the
shapes it starts with and the body gives each value back in its shape and type (what the
executor's path would find out per trip); anything else is not bound and runs as before.
"""
from __future__ import annotations

import time
from typing import Callable

import numpy as np

from hal.backends.registry import get as backend_named
from hal.errors import HalError, RuntimeValueNeeded
from hal.plan import Step
from hal.types import ErrorStatus

DEFAULT_LOOP_TIMEOUT_NS = 2_000_000_000  # ANeuralNetworks_getDefaultLoopTimeout
MAX_LOOP_TIMEOUT_NS = 15_000_000_000  # ANeuralNetworks_getMaximumLoopTimeout

#: A native loop's answers (``Backend.loop``): the condition came out false; the clock passed the
#: limit before a trip; from FAILED on, call ``rc - FAILED`` of the condition's then the body's failed.
DONE, LATE, FAILED = 0, 1, 2


def loop_timeout_ns(requested: int | None) -> int:
    """The loop timeout an execution runs with (NNAPI's ANeuralNetworksExecution_setLoopTimeout):
    the default for None or a value <= 0 (unset), else the request clamped to the maximum."""
    if requested is None or requested <= 0:
        return DEFAULT_LOOP_TIMEOUT_NS
    return min(int(requested), MAX_LOOP_TIMEOUT_NS)


class BoundLoop:
    """A bound WHILE's zero-argument runner; ``limits`` (the deadline or None, the loop timeout as
    the execution asked for it) are set by the program that holds it before each run."""

    __slots__ = ("name", "starts", "cond", "flag", "body", "copies", "native", "limits")

    def __init__(self, name: str, starts, cond, flag, body, copies, native) -> None:
        self.name = name
        self.starts = starts  # (state buffer, the WHILE's input) per value the loop carries
        self.cond, self.flag, self.body, self.copies = cond, flag, body, copies
        self.native = native  # until_ns -> DONE / LATE / FAILED + k, and ``trips``; or None
        self.limits: tuple[int | None, int | None] = (None, None)

    def __call__(self) -> None:
        deadline_ns, requested = self.limits
        timeout_ns = loop_timeout_ns(requested)
        for dst, src in self.starts:
            np.copyto(dst, src)
        started = time.monotonic_ns()
        until = started + timeout_ns
        if deadline_ns is not None:
            until = min(until, deadline_ns)
        if self.native is not None:
            rc = self.native(until)
            trips = self.native.trips
        else:
            rc, trips = self._trips(until, deadline_ns, requested)
        if rc == LATE:
            if deadline_ns is not None and until == deadline_ns:
                raise HalError(ErrorStatus.MISSED_DEADLINE_TRANSIENT,
                               f"{self.name}: deadline passed in iteration {trips}")
            raise HalError(ErrorStatus.MISSED_DEADLINE_TRANSIENT,
                           f"{self.name}: the loop ran longer than the loop timeout ({timeout_ns / 1e9:g} s) "
                           f"after {trips} iterations")
        if rc != DONE:
            raise HalError(ErrorStatus.GENERAL_FAILURE, f"{self.name}: native call {rc - FAILED} of its condition "
                                                        f"and body failed in iteration {trips}")

    def _trips(self, until: int, deadline_ns: int | None, requested: int | None) -> tuple[int, int]:
        cond, flag, body, copies, clock = self.cond, self.flag, self.body, self.copies, time.monotonic_ns
        trips = 0
        while True:
            if clock() > until:
                return LATE, trips
            cond(None, deadline_ns, requested)
            if not flag[0]:
                return DONE, trips
            body(None, deadline_ns, requested)
            for dst, src in copies:
                np.copyto(dst, src)
            trips += 1


def bind_while(step: Step, args: list, dests: list[np.ndarray], subgraphs, bind_program: Callable) -> BoundLoop | None:
    """``step`` (a WHILE: inputs 2.. the loop's values, ``args`` their arrays) bound to write its
    outputs into ``dests``, or None. ``subgraphs``: the model's compiled referenced subgraphs
    (``hal.compiler.Subgraphs``); ``bind_program``: hal.bound_program's, for the two subgraphs."""
    p = step.ctx.data  # WhileParams (the reference backend's plan; cached with the model)
    if subgraphs is None or not hasattr(p, "body_subgraph"):
        return None
    values = args[2:]
    if any(v is None or not v.flags.c_contiguous for v in values):
        return None
    carried = p.carried + p.state
    shapes = tuple(v.shape for v in values)
    cond, body = subgraphs.get(p.cond_subgraph), subgraphs.get(p.body_subgraph)
    try:
        cond_plan, body_plan = cond.plan_for(shapes), body.plan_for(shapes)
    except RuntimeValueNeeded:
        return None
    for compiled, plan in ((cond, cond_plan), (body, body_plan)):
        if len(compiled.input_indexes) != len(values) or any(
                plan.infos[i].shape != v.shape or plan.infos[i].dtype != v.dtype
                for i, v in zip(compiled.input_indexes, values)):
            return None
    # the state: the carried values in the WHILE's outputs, the loop-state-only ones in buffers of their own
    state = [dests[j] if j < p.carried else np.empty_like(values[j]) for j in range(carried)]
    if any(s.shape != v.shape or s.dtype != v.dtype for s, v in zip(state, values)):
        return None
    reads = state + list(values[carried:])
    flag_info = cond_plan.infos[cond.output_indexes[0]] if len(cond.output_indexes) == 1 else None
    if flag_info is None or int(np.prod(flag_info.shape)) != 1:
        return None
    flag = np.zeros(flag_info.shape, flag_info.dtype)
    cond_bound = bind_program(cond_plan, cond.constants, dict(zip(cond.input_indexes, reads)),
                              {cond.output_indexes[0]: flag}, None, subgraphs)
    outs, copies = {}, []
    for j, o in enumerate(body.output_indexes[:carried]):
        if o in body.input_indexes:  # given back as it came
            if body.input_indexes.index(o) != j:
                return None
            continue
        info = body_plan.infos[o]
        if o in outs or info.shape != state[j].shape or info.dtype != state[j].dtype:
            return None
        outs[o] = np.empty_like(state[j])
        copies.append((state[j], outs[o]))
    if len(body.output_indexes) != carried:
        return None
    body_bound = bind_program(body_plan, body.constants, dict(zip(body.input_indexes, reads)), outs, None, subgraphs)
    if cond_bound is None or body_bound is None:
        return None
    # the buffers are held by what reads and writes them: the programs' runners, the copies, starts
    return BoundLoop(step.ctx.name, list(zip(state, values[:carried])), cond_bound, flag, body_bound, copies,
                     _native(cond_bound, flag, body_bound, copies))


def _native(cond, flag: np.ndarray, body, copies: list) -> Callable | None:
    """The backend's native loop over both programs' steps, where one backend runs them all and
    offers one (``Backend.loop``), else None."""
    cond_calls, body_calls = ([(c, s) for c, s in zip(p.calls, p.steps) if not p.is_view(c)] for p in (cond, body))
    names = {s.kernel.backend for _, s in cond_calls + body_calls}
    backend = backend_named(names.pop()) if len(names) == 1 else None
    if backend is None or backend.loop is None or cond.loops or body.loops:
        return None
    return backend.loop([c for c, _ in cond_calls], flag, [c for c, _ in body_calls], copies)


__all__ = ["BoundLoop", "DEFAULT_LOOP_TIMEOUT_NS", "DONE", "FAILED", "LATE", "MAX_LOOP_TIMEOUT_NS", "bind_while",
           "loop_timeout_ns"]
