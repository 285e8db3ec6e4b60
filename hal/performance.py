"""How fast this device is relative to TFLite's CPU, per operand type: NNAPI's PerformanceInfo.

Why: the delegate chooses partitions by estimated cost (delegate.cost), and NNAPI gives a device
one way to say how fast it is: getCapabilities' ``execTime`` per operand type, "the ratio of the
time taken by the driver to execute the workload compared to the time the CPU would take for the
same workload" (lower is faster). A driver states figures measured on its hardware, as AOSP's
sample drivers and ARM NN's driver do (fixed or configured numbers, not a benchmark at boot).
Here each built-in backend's figures are in ``MEASURED``, whole-model ratios against TFLite's CPU
kernels with one thread from ``make bench`` (bench/results.md; its "stated vs measured" table
shows when they drift), and the device's figure for a type is that of the first backend in the
preference order that has one. They live here, not in the backends' packages, because a
backend's identity hashes its sources: re-measuring must not invalidate compiled cache entries.

A type no backend of the order measured (TENSOR_INT32, BOOL8, FLOAT16, ...) gets the slowest
figure the order has: an unmeasured type errs towards the CPU, never towards delegation.
``nnhal serve --relative-speed R`` replaces every figure with R (a faster machine behind the
service, or figures measured elsewhere).
"""
from __future__ import annotations

from typing import Iterable

from hal import backends
from hal.types import OperandType

#: Backend name -> NNAPI operand type -> time relative to TFLite's CPU (1 thread, the default op
#: resolver: XNNPACK for float) on whole models of that type. Measured 2026-11-26 on x86_64, 2
#: cores (bench/results.md), the service with one intra-op thread; p50 ratios and their geometric
#: means:
#: - onnxruntime, float32: MobileNetV2 1.04, EfficientNet-B0 0.91, BlazeFace 1.27 -> 1.06.
#: - numba: int8 MobileNetV2 0.51, EfficientNet-B0 0.50 -> 0.50; uint8 0.36, 0.36 -> 0.36.
#: - reference: float32 10.86, 8.25, 11.49 -> 10.1; int8 3.27, 3.81 -> 3.5; uint8 2.44, 2.79 -> 2.6.
MEASURED: dict[str, dict[int, float]] = {
    "onnxruntime": {OperandType.TENSOR_FLOAT32: 1.06},
    "numba": {OperandType.TENSOR_QUANT8_ASYMM_SIGNED: 0.50, OperandType.TENSOR_QUANT8_ASYMM: 0.36},
    backends.REFERENCE: {OperandType.TENSOR_FLOAT32: 10.1, OperandType.TENSOR_QUANT8_ASYMM_SIGNED: 3.5,
                         OperandType.TENSOR_QUANT8_ASYMM: 2.6},
}

#: The figure when no backend of the order has one: the CPU's.
CPU = 1.0


def exec_times(order: Iterable[str] | None = None) -> dict[int, float]:
    """NNAPI operand type (SUBGRAPH aside) -> exec_time for a service whose backend preference is
    ``order`` (default: the process's preference)."""
    stated = [MEASURED[b.name] for b in backends.candidates(order) if b.name in MEASURED]
    worst = max((v for p in stated for v in p.values()), default=CPU)
    return {int(t): next((p[t] for p in stated if t in p), worst) for t in OperandType if t != OperandType.SUBGRAPH}


def slowest(times: dict[int, float]) -> float:
    """The figure for work no operand type describes (control flow), and for unmeasured types."""
    return max(times.values(), default=CPU)
