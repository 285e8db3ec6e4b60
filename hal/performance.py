"""How fast this device is relative to the CPU, per operand type: NNAPI's PerformanceInfo.

Why: the delegate chooses partitions by estimated cost (delegate.cost), and NNAPI gives a device
one way to say how fast it is: getCapabilities' ``execTime`` per operand type, "the ratio of the
time taken by the driver to execute the workload compared to the time the CPU would take for the
same workload" (lower is faster). A driver states figures measured on its hardware, as AOSP's
sample drivers and ARM NN's driver do (fixed or configured numbers, not a benchmark at boot).
"The CPU" is one runtime here, the anchor: LiteRT 2.3 (``ai_edge_litert``, what `pip install`
gives TFLite users) with one thread and its default op resolver (XNNPACK, float and 8-bit). A
client on another runtime (tflite-runtime 2.14, whose 8-bit kernels are about 20x slower) converts
through the anchor: delegate.cost estimates the service from LiteRT's CPU rates and the CPU from
its own. Each built-in backend's figures are in ``MEASURED`` (``BY_VERSION`` where the backend's
version is a kind of CPU that measured otherwise: ``stated``), whole-model ratios against LiteRT 1
thread from ``make bench`` (bench/results.md; its "stated vs measured" table shows when they
drift), and the device's figure for a type is that of the first backend in the preference order
that has one. They live here, not in the backends' packages, because a
backend's identity hashes its sources: re-measuring must not invalidate compiled cache entries.

A type no backend of the order measured (TENSOR_INT32, BOOL8, FLOAT16, ...) gets the slowest
figure the order has: an unmeasured type errs towards the CPU, never towards delegation.
``nnhal serve --performance FILE`` states figures measured on the machine the service runs on
instead (``make bench`` writes them to bench/performance.json: the same ratios, this machine's);
``nnhal serve --relative-speed R`` replaces every figure with R.
"""
from __future__ import annotations

import json
import math
from typing import Iterable

from hal import backends
from hal.types import OperandType

#: Backend name -> NNAPI operand type -> time relative to LiteRT 2.3's CPU path (1 thread, the
#: default op resolver: XNNPACK) on whole models of that type. Measured 2026-11-27 on x86_64, 2
#: cores, a loaded machine (load average 2-3; the lead's `make bench` on a quiet one supersedes
#: them), the service with one intra-op thread: medians of 3-4 bench runs (each 5 interleaved rounds
#: of 3 invokes) of p50 ratios, and their geometric means:
#: - onnxruntime, float32: MobileNetV2 1.21, EfficientNet-B0 1.12, BlazeFace 1.26 -> 1.19. Re-measured
#:   after issue 30 (activations kept in NCHW, PRELU as Max/Mul; 2 runs): 1.12/1.19, 1.04/0.82,
#:   1.43/1.48 (geomean of medians 1.17: the figure stands). The small MediaPipe-style models added
#:   to the bench then (face 1.94/1.77, iris 1.51/2.00, pose 1.60/1.43, a 3-layer MLP 13.5/2.5) are
#:   not in it: their whole-model ratios carry the per-invoke round trip (0.05-0.4 ms on this loaded
#:   machine, a third of a 1 ms model), which delegate.cost charges separately (overhead_us).
#: - numba: int8 MobileNetV2 0.84, EfficientNet-B0 0.88 -> 0.86; uint8 0.36, 0.46 -> 0.41 (2026-11-28,
#:   after the AMX-INT8 tiles: medians of 3 runs of bench/quantized_models through the delegate,
#:   interleaved with LiteRT, on an Intel Xeon with AVX-512 VNNI and AMX; the same code measured
#:   0.91 / 0.96 and 0.41 / 0.48 in an earlier, slower phase of this machine (its AMX throughput
#:   varies): stated 0.9 and 0.42, between the two. Before the tiles, int8 1.00 / 1.19 and uint8
#:   0.47 / 0.59; 2026-11-27, after issue 29's filter-column depthwise, cheaper RELU-clamped
#:   requantization and 32-bit ADD scaling: 1.34 / 1.44 and 0.68 / 0.80; before them 1.85 / 2.23
#:   and 0.87 / 1.32; without VNNI its GEMMs fall back to float32 BLAS, not re-measured: before the
#:   VNNI kernels that path measured 6.2 / 2.9). Now, after the bound program's numba steps were
#:   chained natively (native_chain; 2026-11-28, three `make bench` runs, all in slower phases of
#:   LiteRT's own time): int8 MobileNetV2 0.80 / 0.78 / 0.81, EfficientNet-B0 0.90 / 0.81 / 0.79
#:   -> medians 0.80, 0.81 -> stated 0.8; uint8 0.36 / 0.35 / 0.37 and 0.47 / 0.45 / 0.44 -> 0.36,
#:   0.45 -> stated 0.4.
#: - reference: float32 5.77, 5.23, 8.17 -> 6.3; int8 48.1, 48.9 -> 48; uint8 25.4, 26.2 -> 26.
#: Against tflite-runtime 2.14 in the same runs numba was 0.06-0.07 (int8) and 0.03-0.04 (uint8):
#: LiteRT's 8-bit path (XNNPACK) ran these models 11-16x as fast as tflite-runtime's; float32 (both
#: XNNPACK) within 10% of each other.
#: - cuda, float32: MobileNetV2 0.12 / 0.13, EfficientNet-B0 0.10 / 0.10, BlazeFace 0.27 / 0.26,
#:   face landmark 0.28 / 0.35, pose landmark 0.17 / 0.22 -> geometric means 0.17 / 0.19, stated 0.18
#:   (2026-11-28, two runs of `make bench-gpu` on a lent NVIDIA H200, 16 cores, through the delegate
#:   with IPC and the copies in and out, against LiteRT 2.3 at 1 thread on that machine's CPU;
#:   bench/results-gpu.md). Then (2026-11-30, one run, after the slots' DMA, one-kernel Clip and the
#:   fused convolutions): MobileNetV2 0.11, EfficientNet-B0 0.09, BlazeFace 0.18, face landmark 0.29,
#:   pose landmark 0.20 -> geometric mean 0.161, stated 0.16 (LiteRT's 1-thread MobileNetV2 took
#:   6.6 ms on that machine's CPU against 10.0 ms on 11-28's: the ratios also move with the host).
#:   The small models' ratios carry the per-invoke round trip. A backend on a
#:   stand-in device (``Backend.opt_in``: the cuda backend on torch's CPU device) states nothing:
#:   its type's figure is the next backend's.
MEASURED: dict[str, dict[int, float]] = {
    "cuda": {OperandType.TENSOR_FLOAT32: 0.16},
    "onnxruntime": {OperandType.TENSOR_FLOAT32: 1.19},
    "numba": {OperandType.TENSOR_QUANT8_ASYMM_SIGNED: 0.8, OperandType.TENSOR_QUANT8_ASYMM: 0.4},
    backends.REFERENCE: {OperandType.TENSOR_FLOAT32: 6.3, OperandType.TENSOR_QUANT8_ASYMM_SIGNED: 48.0,
                         OperandType.TENSOR_QUANT8_ASYMM: 26.0},
}

#: Relaxed float32 (computed in float16: NNAPI's relaxComputationFloat32toFloat16, the delegate's
#: allow_fp16), for a backend that computes it faster than float32; any other backend computes a
#: relaxed model in float32, at its TENSOR_FLOAT32 figure. cuda: the same run's fp16 ratios,
#: MobileNetV2 0.09, EfficientNet-B0 0.06, BlazeFace 0.20, face landmark 0.28, pose landmark 0.22
#: -> geometric mean 0.145, stated 0.15 (2026-11-30, bench/results-gpu.md).
RELAXED: dict[str, float] = {"cuda": 0.15}

#: Figures for one version of a backend, where its version names a kind of CPU its plans are for
#: and that kind measured differently: numba "2" is a machine without AVX-512 VNNI, whose 8-bit
#: convolutions and FULLY_CONNECTED run the float32 BLAS path (per step, unbound). Measured
#: 2026-11-30 on an AMD EPYC (Zen 3: AVX2, no AVX-512), `make bench` through the delegate against
#: LiteRT 1 thread, after its depthwise runs took plain byte moves and its requantization 16
#: lanes: int8 MobileNetV2 1.97, EfficientNet-B0 2.64, MobileNetV3-small 1.65, BlazeFace-style
#: 2.66; uint8 1.43, 2.04, 1.49, 2.26 -> stated 2.2 and 1.8 (2026-11-29: 3.0 and 2.1): slower than the CPU,
#: so the delegate's cost estimate leaves a partly supported 8-bit graph's partitions to LiteRT
#: there, and partitioning="cost_strict" a whole one too; the default "cost" still runs a graph
#: supported whole on the service, as the user asked, its reason saying it is estimated slower
#: (delegate.partition).
BY_VERSION: dict[tuple[str, str], dict[int, float]] = {
    ("numba", "2"): {OperandType.TENSOR_QUANT8_ASYMM_SIGNED: 2.2, OperandType.TENSOR_QUANT8_ASYMM: 1.8},
}

#: The figure when no backend of the order has one: the CPU's (the anchor's).
CPU = 1.0
#: A performance file is a few lines; anything this large is not one.
MAX_FILE_BYTES = 1 << 16


def exec_times(order: Iterable[str] | None = None, measured: dict[str, dict[int, float]] | None = None
               ) -> dict[int, float]:
    """NNAPI operand type (SUBGRAPH aside) -> exec_time for a service whose backend preference is
    ``order`` (default: the process's preference). ``measured`` (``read_measured``) replaces the
    built-in figures of the backends it names."""
    candidates = [b for b in backends.candidates(order) if not b.opt_in]
    table = {**{b.name: stated(b.name) for b in candidates}, **(measured or {})}
    figures = [table[b.name] for b in candidates if table.get(b.name)]
    worst = max((v for p in figures for v in p.values()), default=CPU)
    return {int(t): next((p[t] for p in figures if t in p), worst) for t in OperandType if t != OperandType.SUBGRAPH}


def relaxed_exec_time(order: Iterable[str] | None = None, times: dict[int, float] | None = None) -> float:
    """getCapabilities' relaxed-float32 figure: that of the backend whose TENSOR_FLOAT32 figure the
    order states (the one that takes float work), its relaxed figure where it has one (RELAXED),
    else ``times``' float32 figure (``exec_times``), as it computes relaxed models in float32."""
    times = exec_times(order) if times is None else times
    for b in backends.candidates(order):
        if not b.opt_in and int(OperandType.TENSOR_FLOAT32) in stated(b.name):
            return RELAXED.get(b.name, times[int(OperandType.TENSOR_FLOAT32)])
    return times[int(OperandType.TENSOR_FLOAT32)]


def stated(name: str) -> dict[int, float]:
    """Backend ``name``'s built-in figures as it is on this machine: ``BY_VERSION``'s where its
    version has its own, else ``MEASURED``'s (empty: it states none)."""
    b = backends.get(name)
    if b is not None and (name, b.version) in BY_VERSION:
        return BY_VERSION[name, b.version]
    return MEASURED.get(name, {})


def slowest(times: dict[int, float]) -> float:
    """The figure for work no operand type describes (control flow), and for unmeasured types."""
    return max(times.values(), default=CPU)


def read_measured(path: str) -> dict[str, dict[int, float]]:
    """Figures from a JSON file ``{"backend": {"TENSOR_FLOAT32": 1.06, ...}, ...}`` (what make bench
    writes to bench/performance.json). ValueError, naming the file and what is wrong, for anything
    else: a service must not state figures it cannot account for."""
    try:
        with open(path, "rb") as f:
            text = f.read(MAX_FILE_BYTES + 1)
    except OSError as e:
        raise ValueError(f"performance file {path}: {e.strerror}") from None
    if len(text) > MAX_FILE_BYTES:
        raise ValueError(f"performance file {path}: larger than {MAX_FILE_BYTES} bytes")
    try:
        raw = json.loads(text)
    except ValueError as e:
        raise ValueError(f"performance file {path}: not JSON ({e})") from None
    if not isinstance(raw, dict) or not raw:
        raise ValueError(f"performance file {path}: want an object of backend names")
    known = {b.name for b in backends.available()}
    out: dict[str, dict[int, float]] = {}
    for name, figures in raw.items():
        if name not in known:
            raise ValueError(f"performance file {path}: unknown backend {name!r} "
                             f"(available: {', '.join(sorted(known))})")
        if not isinstance(figures, dict) or not figures:
            raise ValueError(f"performance file {path}: {name}: want an object of operand type names")
        out[name] = {}
        for type_name, value in figures.items():
            t = OperandType.__members__.get(type_name)
            if t is None or t == OperandType.SUBGRAPH:
                raise ValueError(f"performance file {path}: {name}: unknown operand type {type_name!r}")
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if not (number and math.isfinite(value) and value > 0):
                raise ValueError(f"performance file {path}: {name}.{type_name} must be a number > 0, not {value!r}")
            out[name][int(t)] = float(value)
    return out
