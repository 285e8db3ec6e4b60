"""Where an 8-bit model's time goes, step by step, on the bound path a local burst serves
(``python -m bench.step_profile small_cnn int8``; not part of ``make bench``).

Each step's p50 over the runs (``hal.executor.bind``'s per-step timings), its multiply-accumulates
(convolutions and FULLY_CONNECTED; a fused step counts its members'), their rate, and that rate
against the CPU's own: ``vpdpbusd`` throughput measured here (a loop of independent 512-bit
``vpdpbusd`` chains, 64 MACs each), the integer peak the VNNI tiles can approach, and where the
AMX tiles run, ``amx.sums``' own rate on operands in L1 (32 rows × 512 k × 32 columns a call, as
the layers call it: loads, ``tdpbusd``, stores). The per-step clock readings
add about 0.1 µs per step to the total.
"""
from __future__ import annotations

import ctypes
import sys
import time

import llvmlite.binding as llvm
import numba
import numpy as np

from delegate.mapping import convert_partition
from delegate.tfl import read_model
from hal import backends
from hal.backends.numba_kernels import amx, vnni
from hal.compiler import compile_model
from hal.executor import bind
from hal.types import OperationType as Op
from nnhal.examples import efficientnet_b0, mobilenet_v2
from nnhal.examples_mobilenet_v3 import mobilenet_v3_small
from nnhal.examples_quantized import blazeface_quantized, small_cnn

MODELS = {"small_cnn": small_cnn, "efficientnet_b0": efficientnet_b0, "mobilenet_v2": mobilenet_v2,
          "mobilenet_v3_small": mobilenet_v3_small, "blazeface": blazeface_quantized}
_GEMM_OPS = (Op.CONV_2D, Op.DEPTHWISE_CONV_2D, Op.GROUPED_CONV_2D, Op.FULLY_CONNECTED)
_CHAINS = 12  # independent accumulators: more than latency × throughput, so the loop is throughput-bound


def vnni_peak_macs_per_s(iterations: int = 20_000_000) -> float | None:
    """u8 × s8 multiply-accumulates per second of one core's ``vpdpbusd`` (None without AVX-512 VNNI)."""
    if not vnni.AVAILABLE:
        return None
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    v = "<16 x i32>"
    body = "".join(f"  %a{k} = phi {v} [zeroinitializer, %entry], [%x{k}, %loop]\n" for k in range(_CHAINS))
    body += "".join(f"  %x{k} = call {v} @llvm.x86.avx512.vpdpbusd.512({v} %a{k}, {v} %b, {v} %c)\n"
                    for k in range(_CHAINS))
    ends = "".join(f"  %s{k} = extractelement {v} %x{k}, i32 0\n" for k in range(_CHAINS))
    ends += "  %t0 = add i32 %s0, 0\n" + "".join(f"  %t{k} = add i32 %t{k - 1}, %s{k}\n" for k in range(1, _CHAINS))
    src = (f"declare {v} @llvm.x86.avx512.vpdpbusd.512({v}, {v}, {v})\n"
           f"define i32 @peak(i64 %n, {v}* %p) {{\nentry:\n  %b = load {v}, {v}* %p, align 1\n"
           f"  %q = getelementptr {v}, {v}* %p, i64 1\n  %c = load {v}, {v}* %q, align 1\n  br label %loop\n"
           f"loop:\n  %i = phi i64 [0, %entry], [%i2, %loop]\n{body}  %i2 = add i64 %i, 1\n"
           f"  %more = icmp slt i64 %i2, %n\n  br i1 %more, label %loop, label %done\ndone:\n{ends}"
           f"  ret i32 %t{_CHAINS - 1}\n}}\n")
    module = llvm.parse_assembly(src)
    machine = llvm.Target.from_default_triple().create_target_machine(
        cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(), opt=3)
    engine = llvm.create_mcjit_compiler(module, machine)
    engine.finalize_object()
    peak = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_int64, ctypes.c_void_p)(engine.get_function_address("peak"))
    operands = (ctypes.c_int32 * 32)(*range(32))
    peak(1000, ctypes.addressof(operands))
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        peak(iterations, ctypes.addressof(operands))
        best = min(best, time.perf_counter() - t)
    return iterations * _CHAINS * 64 / best


def amx_peak_macs_per_s(calls: int = 20_000) -> float | None:
    """u8 × s8 multiply-accumulates per second of ``amx.sums`` on blocks in L1 (None without AMX)."""
    if not amx.AVAILABLE:
        return None
    k, cols = 512, 32
    a, w = amx.aligned_zeros(amx.BLOCK_ROWS * k + amx.TILE_K), amx.aligned_zeros(k * cols, np.int8)
    out = amx.aligned_zeros(amx.BLOCK_ROWS * cols, np.int32)
    _amx_loop(a, k, w, k // amx.TILE_K, out, 10)
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        _amx_loop(a, k, w, k // amx.TILE_K, out, calls)
        best = min(best, time.perf_counter() - t)
    return calls * amx.BLOCK_ROWS * k * cols / best


@numba.njit(nogil=True)
def _amx_loop(a, k, w, chunks, out, calls):
    amx.configure()
    for _ in range(calls):
        amx.sums(a, 0, k, 1, 0, chunks, w, 1, 2, out, 32)
    amx.release()


def _macs(ctx) -> int:
    """A convolution's or FULLY_CONNECTED's multiply-accumulates (a fused step: its members')."""
    members = getattr(ctx, "members", None)
    if members is not None:
        return sum(_macs(m.ctx) for m in members)
    if ctx.op_type not in _GEMM_OPS:
        return 0
    w, out = ctx.inputs[1].shape, ctx.outputs[0].shape
    if ctx.op_type == Op.DEPTHWISE_CONV_2D:
        return int(np.prod(out)) * int(w[1]) * int(w[2])
    return int(np.prod(out)) * int(np.prod(w[1:]))


def profile(build, dtype, runs: int = 200) -> list[tuple]:
    """(step name, p50 seconds, MACs) per bound step, in program order."""
    backends.ensure_loaded()
    backends.set_compute_threads(1)
    compiled = compile_model(convert_partition(read_model(build(dtype))).model, backend_order=["numba", "reference"])
    plan = compiled.static_plan
    info = compiled.input_info(0)
    info_min, info_max = np.iinfo(dtype).min, np.iinfo(dtype).max
    x = np.random.default_rng(0).integers(info_min, info_max + 1, info.shape).astype(dtype)
    outs = [np.empty(plan.infos[i].shape, plan.infos[i].dtype) for i in compiled.output_indexes]
    runner = bind(compiled, [x], outs)
    if runner is None:
        raise SystemExit("the model does not bind (not a static plan)")
    samples = []
    for k in range(runs + 20):
        timings: list = []
        runner(timings, None, None)
        if k >= 20:  # warm-up runs
            samples.append([t.ns for t in timings])
    p50 = np.median(np.array(samples), axis=0) * 1e-9
    return [(s.ctx.name, t, _macs(s.ctx)) for s, t in zip(plan.program, p50)]


def to_markdown(rows: list[tuple], peak: float | None, amx_peak: float | None = None) -> str:
    peaks = [("VNNI", peak)] + ([("AMX", amx_peak)] if amx_peak else [])

    def shares(macs, t):
        return "".join(f" {100 * macs / t / v:.0f} % |" if macs and t and v else " |" for _, v in peaks)
    lines = ["| step | p50 µs | M MACs | GMAC/s |" + "".join(f" of the {n} peak |" for n, _ in peaks),
             "|---|---:|---:|---:|" + "---:|" * len(peaks)]
    for name, t, macs in rows:
        rate = macs / t / 1e9 if macs and t else 0.0
        lines.append(f"| {name} | {t * 1e6:.1f} | {macs / 1e6:.2f} | {rate:.0f} |{shares(macs, t)}" if macs else
                     f"| {name} | {t * 1e6:.1f} | | |" + " |" * len(peaks))
    total, gemm_t = sum(t for _, t, _ in rows), sum(t for _, t, m in rows if m)
    macs = sum(m for _, _, m in rows)
    lines.append(f"| **total** | {total * 1e6:.1f} | {macs / 1e6:.1f} | {macs / total / 1e9:.0f} |" + " |" * len(peaks))
    lines.append(f"| convolutions / FC steps | {gemm_t * 1e6:.1f} | {macs / 1e6:.1f} | {macs / gemm_t / 1e9:.0f} |"
                 + shares(macs, gemm_t))
    if peak:
        lines.append(f"\nVNNI peak measured: {peak / 1e9:.0f} GMAC/s (one core, `vpdpbusd` zmm).")
    if amx_peak:
        lines.append(f"AMX peak measured: {amx_peak / 1e9:.0f} GMAC/s (one core, `amx.sums` on operands in L1).")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    name = argv[0] if argv else "small_cnn"
    dtype = np.uint8 if len(argv) > 1 and argv[1] == "uint8" else np.int8
    if name not in MODELS:
        raise SystemExit(f"models: {', '.join(MODELS)}")
    rows = profile(MODELS[name], dtype)
    print(f"### {name} {np.dtype(dtype).name}\n\n" + to_markdown(rows, vnni_peak_macs_per_s(), amx_peak_macs_per_s()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
