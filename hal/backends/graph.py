"""Partition backends: a run of consecutive operations compiled into one executable.

A per-operation backend (:class:`hal.backends.Backend`) plans and runs each operation on its own.
A *graph* backend does what a vendor driver does with its accelerator's partition: at
prepareModel it lowers every operation of a run it takes into one graph and compiles that once
(onnxruntime: one InferenceSession), so an execution runs the whole run in one call, with the
backend free to fuse, re-layout and schedule across operations.

The compiler asks a graph backend, in the preference order like any other, whether it takes an
operation (``claim``: a lowering registered for the operation type and input type, and the
lowering's ``supports``). Operations it takes are planned as members of the run they fall in
(no per-operation data); each maximal run of consecutive members becomes one partition step
(``hal.plan.Partition``) whose executable comes from ``compile`` — or, from the compilation
cache, from ``load`` of the ``artifact`` compile returned. A partition whose compilation fails is
planned again operation by operation without the graph backend: a lowering's bug costs speed,
never the model.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable

from hal.backends import Backend, Kernel, Supports, has_float16
from hal.errors import HalError
from hal.registry import OperationContext
from hal.types import ErrorStatus, OperationType, type_name

#: (graph, ctx, inputs) -> names of the outputs; the graph type is the backend's own.
Lower = Callable[[Any, OperationContext, Any], list]


@dataclass(frozen=True)
class Lowering:
    """How one graph backend expresses one operation code in its graph."""

    lower: Lower
    types: tuple[int, ...] | None = None  # input-0 operand types; None: every type the spec defines
    supports: Supports | None = None
    float16: bool = False  # True: the lowering computes float16 operands itself

    def unsupported(self, ctx: OperationContext) -> str | None:
        if ctx.inputs and ctx.inputs[0] is not None and self.types is not None \
                and ctx.inputs[0].type not in self.types:
            return f"input type {type_name(ctx.inputs[0].type)} is not lowered"
        if not self.float16 and has_float16(ctx):
            return "float16 operands are not lowered"
        return None if self.supports is None else self.supports(ctx)


def _run_partition(ctx, inputs: list) -> list:
    return ctx.executable(inputs)


def _member_execute(ctx: OperationContext, inputs: list) -> list:
    raise HalError(ErrorStatus.GENERAL_FAILURE, f"{ctx.name}: runs only inside its {ctx.backend} partition")


class GraphBackend(Backend):
    """A backend that compiles runs of operations (see the module docstring). Subclasses define
    ``compile`` and ``load``; lowerings register per operation code like kernels do."""

    def __init__(self, name: str, version: str, modules: Iterable[str] = (), *, priority: int = 0,
                 description: str = "", opt_in: bool = False):
        super().__init__(name, version, modules, priority=priority, description=description, opt_in=opt_in)
        self.lowerings: dict[int, Lowering] = {}
        #: The kernel of an operation planned as a partition member: it never runs alone.
        self.member_kernel = Kernel(name, plan=lambda ctx: None, execute=_member_execute, native_float16=True)
        #: The kernel of a partition step (``hal.plan.PartitionContext``): runs its executable.
        self.partition_kernel = Kernel(name, plan=lambda ctx: None, execute=_run_partition, native_float16=True)

    def lowering(self, op_types: OperationType | int | Iterable[OperationType | int], *, lower: Lower,
                 types: Iterable[int] | None = None, supports: Supports | None = None,
                 float16: bool = False) -> None:
        if isinstance(op_types, int):
            op_types = [op_types]
        for t in op_types:
            if int(t) in self.lowerings:
                raise RuntimeError(f"backend {self.name}: operation {t} lowered twice")
            self.lowerings[int(t)] = Lowering(lower, None if types is None else tuple(types), supports, float16)
        self._identity = None

    def lowering_for(self, op_type: int) -> Lowering | None:
        return self.lowerings.get(int(op_type))

    def claim(self, ctx: OperationContext) -> str | None:
        """None when this backend takes the operation as prepared, else why not."""
        lowering = self.lowerings.get(int(ctx.op_type))
        if lowering is None:
            return "not lowered"
        return lowering.unsupported(ctx)

    def takes(self, op_type: int, operand_type: int) -> bool:
        lowering = self.lowerings.get(int(op_type))
        return lowering is not None and (lowering.types is None or operand_type in lowering.types)

    # ---- what a subclass provides ----------------------------------------------------------------
    def compile(self, partition) -> tuple[Any, Any]:
        """(artifact, executable) for a ``hal.plan.Partition``: the artifact is what the
        compilation cache stores (serialisable: arrays, dataclasses of this backend's modules);
        the executable is called with the partition's input arrays and returns its outputs."""
        raise NotImplementedError

    def load(self, partition, artifact: Any) -> Any:
        """The executable for a partition from a cached artifact (no graph building)."""
        raise NotImplementedError


__all__ = ["GraphBackend", "Lowering"]
