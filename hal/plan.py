"""What an execution runs: the steps of a compiled model, the graph-backend partitions that replace
runs of their members, and the memory plan (which temporaries each step is the last to read).

``hal.compiler`` makes these; ``hal.executor`` runs them; ``hal.serialize`` stores and restores
them for the compilation cache.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable

from hal.backends import Kernel
from hal.backends.graph import GraphBackend
from hal.model import Model
from hal.registry import OperandInfo, OperationContext, OperationSpec
from hal.types import OperandLifeTime

#: Lifetimes of operands a compiled graph owns (not a partition input).
CONSTANT_LIFETIMES = (OperandLifeTime.CONSTANT_COPY, OperandLifeTime.CONSTANT_POOL)
#: Operands a partition never takes as inputs: constants, and the subgraphs an IF or WHILE it
#: lowers names (their operations are lowered into its graph).
_NOT_INPUTS = (*CONSTANT_LIFETIMES, OperandLifeTime.SUBGRAPH)


@dataclass
class Step:
    index: int
    spec: OperationSpec
    kernel: Kernel
    ctx: OperationContext
    inputs: tuple[int, ...]  # operand indexes, -1 where an optional input is omitted
    outputs: tuple[int, ...]

    @property
    def backend(self) -> str:
        return self.kernel.backend

    @property
    def operations(self) -> tuple[int, ...]:
        """The operations this step runs: its own, or a partition's members."""
        ops = getattr(self.ctx, "operations", None)
        return (self.index,) if ops is None else ops


@dataclass
class PartitionContext:
    """A partition step's context: what an OperationContext is to one operation's kernel."""

    backend: str
    operations: tuple[int, ...]  # the member operations, in order
    artifact: Any  # what the compilation cache stores (the graph backend's, serialisable)
    executable: Any  # called with the partition's input arrays, returns its output arrays
    op_type: int = -1  # no single operation type: timings name the partition by ``operations``

    @property
    def name(self) -> str:
        first, last = self.operations[0], self.operations[-1]
        return f"operations {first}-{last} ({self.backend} partition)" if last != first \
            else f"operation {first} ({self.backend} partition)"


@dataclass
class Partition:
    """A run of consecutive operations one graph backend compiles into one executable. Its inputs
    are the operands the members read that none of them produces (constants excepted: they belong
    to the compiled graph), its outputs those they produce that a later step or the caller reads."""

    members: list[Step]
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    infos: list[OperandInfo]  # the plan's (shapes as inferred; constant values at compile time)
    model: Model


def make_partition(model: Model, steps: list[Step], start: int, end: int, infos: list[OperandInfo],
                   keep: frozenset[int]) -> Partition:
    """The partition of ``steps[start:end]``; lifetimes, not values, tell constants (a cached plan
    does not keep the constants only its partitions read)."""
    operands = model.main.operands
    members = steps[start:end]
    produced = {o for s in members for o in s.outputs}
    inputs: dict[int, None] = {}
    for s in members:
        for i in s.inputs:
            if i >= 0 and i not in produced and operands[i].lifetime not in _NOT_INPUTS:
                inputs.setdefault(i)
    read_later = {i for s in steps[end:] for i in s.inputs} | keep
    outputs = tuple(o for s in members for o in s.outputs if o in read_later)
    return Partition(members, tuple(inputs), outputs, infos, model)


def partition_step(backend: GraphBackend, partition: Partition, artifact: Any, executable: Any) -> Step:
    ctx = PartitionContext(backend.name, tuple(s.index for s in partition.members), artifact, executable)
    return Step(partition.members[0].index, None, backend.partition_kernel, ctx,  # type: ignore[arg-type]
                partition.inputs, partition.outputs)


class Plan:
    """Steps in execution order, the operand infos they were prepared with, and the memory plan:
    ``release[n]`` lists the temporaries step n is the last reader of (or, if nothing reads them,
    produces), so an execution drops each intermediate tensor as soon as it is dead instead of
    holding every one until the end.

    ``steps`` has one step per operation (its backend is the operation's assignment); ``program``
    is what an execution runs: the same steps, with each run of a graph backend's members replaced
    by its partition step. ``release`` follows ``program``.

    ``make_program`` (instead of ``program``) makes the program when it is first read: a referenced
    subgraph's plan, whose steps an IF or WHILE lowered into a graph inlines; only the executor
    running that subgraph needs its partitions compiled. ``make_program`` may replace steps (a
    partition that fails to compile is planned again without its backend)."""

    def __init__(self, steps: list[Step], infos: list[OperandInfo], keep: frozenset[int] = frozenset(),
                 program: list[Step] | None = None,
                 make_program: Callable[[], list[Step]] | None = None) -> None:
        self.steps = steps
        self.infos = infos
        self.keep = keep  # operands never released: the model's outputs
        #: The program bound for execution (``hal.executor``): made on the first execution, then reused.
        self.bound: Any = None
        self._program = program or (None if make_program is not None else list(steps))
        self._make_program = make_program
        self._release: list[tuple[int, ...]] | None = None
        self._lock = threading.Lock()

    @property
    def built(self) -> bool:
        """The program is made (graph backends' partitions compiled)."""
        return self._program is not None

    @property
    def program(self) -> list[Step]:
        if self._program is None:
            with self._lock:
                if self._program is None:
                    self._program = self._make_program()
        return self._program

    @property
    def release(self) -> list[tuple[int, ...]]:
        if self._release is None:
            self._release = plan_releases(self.program, self.keep)
        return self._release


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
