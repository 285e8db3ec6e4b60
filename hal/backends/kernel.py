"""Kernel types: one backend's implementation of one operation, and the float16 adapter that runs a
float32 kernel on float16 operations (NNAPI's CPU path)."""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from hal.registry import OperandInfo, OperationContext
from hal.types import OperandType, type_name

Plan = Callable[[OperationContext], Any]
Execute = Callable[[OperationContext, list], list]
Supports = Callable[[OperationContext], "str | None"]
#: ``bind(ctx, inputs, outputs)``: a zero-argument runner computing from the fixed ``inputs``' current
#: contents into the fixed, C-contiguous ``outputs`` (prepared shapes and dtypes), its scratch
#: allocated once; None where this operation's plan has no such form (``execute`` runs it then).
Bind = Callable[[OperationContext, list, list], "Callable[[], object] | None"]


@dataclass(frozen=True)
class Kernel:
    """One backend's implementation of one operation code (or of several sharing it)."""

    backend: str
    plan: Plan
    execute: Execute
    types: tuple[int, ...] | None = None  # input-0 operand types; None = all the spec defines
    supports: Supports | None = None
    prepacked_inputs: tuple[int, ...] = ()
    #: False: the kernel is written for float32 and runs float16 operations through
    #: ``via_float32`` (NNAPI's CPU path: widen, compute in float32, round the outputs once).
    native_float16: bool = False
    #: A whole-program runner binds each step once (hal.bound_program); None: ``execute`` only.
    bind: Bind | None = None

    def for_context(self, ctx: OperationContext) -> "Kernel":
        """The kernel to run ``ctx`` with: itself, or its float32 adapter for float16 operands."""
        if self.native_float16 or not has_float16(ctx):
            return self
        return via_float32(self)

    def runs_type(self, operand_type: int) -> bool:
        return self.types is None or operand_type in self.types

    def unsupported(self, ctx: OperationContext) -> str | None:
        """Why this kernel cannot take this operation as prepared, or None."""
        if ctx.inputs and ctx.inputs[0] is not None and not self.runs_type(ctx.inputs[0].type):
            return f"input type {type_name(ctx.inputs[0].type)} is not implemented"
        if self.supports is not None:
            return self.supports(ctx)
        return None


#: float16 operand types and the float32 type a widened context gives them.
FLOAT16_TO_FLOAT32 = {OperandType.TENSOR_FLOAT16: OperandType.TENSOR_FLOAT32, OperandType.FLOAT16: OperandType.FLOAT32}


def has_float16(ctx: OperationContext) -> bool:
    return any(info is not None and info.type in FLOAT16_TO_FLOAT32 for info in (*ctx.inputs, *ctx.outputs))


def _widen(info: OperandInfo | None) -> OperandInfo | None:
    if info is None or info.type not in FLOAT16_TO_FLOAT32:
        return info
    value = None if info.value is None else info.value.astype(np.float32)  # exact: every half is a float
    return dataclasses.replace(info, type=FLOAT16_TO_FLOAT32[info.type], value=value)


def float32_view(ctx: OperationContext) -> OperationContext:
    """``ctx`` as the float32 operation it widens to: every float16 operand (tensor or scalar)
    retyped float32, constant values widened; params, data and backend shared."""
    view = OperationContext(ctx.index, ctx.op_type, [_widen(i) for i in ctx.inputs],
                            [_widen(o) for o in ctx.outputs])
    view.output_shapes = list(ctx.output_shapes)
    view.params, view.data, view.backend, view.packing = ctx.params, ctx.data, ctx.backend, ctx.packing
    return view


@functools.lru_cache(maxsize=None)
def via_float32(kernel: Kernel) -> Kernel:
    """A float32 kernel run on float16 operations as AOSP's CPU driver runs most of them: inputs
    widened to float32, the float32 kernel, each float16 output rounded to nearest once. CTS judges
    float16 results with 5·2⁻¹⁰ tolerances, which one rounding always meets where float32 does."""
    def plan(ctx: OperationContext) -> Any:
        return kernel.plan(float32_view(ctx))

    def execute(ctx: OperationContext, inputs: list) -> list:
        args = [x.astype(np.float32) if x is not None and x.dtype == np.float16 else x for x in inputs]
        outs = kernel.execute(float32_view(ctx), args)
        return [o.astype(np.float16) if info.type in FLOAT16_TO_FLOAT32 else o for o, info in zip(outs, ctx.outputs)]

    plan.__qualname__ = execute.__qualname__ = f"via_float32({getattr(kernel.execute, '__qualname__', '?')})"
    supports = None if kernel.supports is None else (lambda ctx: kernel.supports(float32_view(ctx)))
    return dataclasses.replace(kernel, plan=plan, execute=execute, supports=supports, native_float16=True,
                               bind=None)  # the float32 kernel's bind would skip the widening


def by_input_type(first: Kernel, second: Kernel) -> Kernel | None:
    """One kernel running each operation on whichever of two kernels runs its input-0 type (one
    backend's kernels for the same operation code in two modules, for disjoint types: its
    quantized and its float kernels), or None where they cannot be told apart by that type (a
    kernel for every type, overlapping types, different prepacked inputs or float16 handling)."""
    if first.types is None or second.types is None or set(first.types) & set(second.types) \
            or first.prepacked_inputs != second.prepacked_inputs or first.native_float16 != second.native_float16:
        return None

    def of(ctx: OperationContext) -> Kernel:
        info = ctx.inputs[0] if ctx.inputs else None
        return second if info is not None and second.runs_type(info.type) else first

    def bind(ctx: OperationContext, inputs: list, outputs: list):
        b = of(ctx).bind
        return None if b is None else b(ctx, inputs, outputs)

    def supports(ctx: OperationContext) -> str | None:
        k = of(ctx)
        return None if k.supports is None else k.supports(ctx)
    return Kernel(first.backend, lambda ctx: of(ctx).plan(ctx), lambda ctx, inputs: of(ctx).execute(ctx, inputs),
                  first.types + second.types, supports, first.prepacked_inputs, first.native_float16,
                  bind if first.bind is not None or second.bind is not None else None)
