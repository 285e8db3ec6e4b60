"""`nnhal benchmark`: latency with and without the delegate, prepare compile vs from-cache (only
when the cache really served it), and a per-operation profile from the service's perfinfo (run
order, top-10, by op type with MACs).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections import defaultdict

import numpy as np

from hal.model import Model
from hal.types import OperationType
from nnhal.inference_diff import model_file_error, random_input
from nnhal.tool_support import (
    add_service_arguments,
    delegate_options,
    interrupted,
    interrupts_after_tflite_calls,
    tflite_call,
    tflite_error,
)


def operation_macs(model: Model, k: int) -> int:
    """Multiply-accumulates of NNAPI operation k (0 for ops without a GEMM-like core)."""
    sg = model.main
    op = sg.operations[k]
    dims = [tuple(sg.operands[i].dimensions) for i in op.inputs]
    out = tuple(sg.operands[op.outputs[0]].dimensions)
    n_out = int(np.prod(out)) if out else 0
    if op.type == OperationType.CONV_2D and len(dims) > 1 and len(dims[1]) == 4:
        _, kh, kw, cin = dims[1]
        return n_out * kh * kw * cin
    if op.type == OperationType.DEPTHWISE_CONV_2D and len(dims) > 1 and len(dims[1]) == 4:
        return n_out * dims[1][1] * dims[1][2]
    if op.type == OperationType.FULLY_CONNECTED and len(dims) > 1 and len(dims[1]) == 2:
        return n_out * dims[1][1]
    return 0


def _latency(it, inputs, runs: int, warmup: int, progress=None, label="") -> list[float]:
    for d, x in zip(it.get_input_details(), inputs):
        it.set_tensor(d["index"], x)
    for _ in range(warmup):
        with tflite_call():
            it.invoke()
    out = []
    for r in range(runs):
        with tflite_call():
            t = time.perf_counter_ns()
            it.invoke()
            out.append((time.perf_counter_ns() - t) / 1e3)
        if progress and (r == 0 or (r + 1) % max(1, runs // 10) == 0):
            progress(f"{label}: {r + 1}/{runs}")
    return out


def _summary(xs: list[float]) -> dict:
    s = sorted(xs)
    return {"mean_us": statistics.fmean(s), "std_us": statistics.pstdev(s),
            "p50_us": s[len(s) // 2], "p90_us": s[min(len(s) - 1, int(len(s) * 0.9))]}


def benchmark(model_file: str, runs: int = 50, warmup: int = 5, threads: int = 1,
              service_address: str | None = None, progress=None, options: dict | None = None) -> dict:
    """``options``: more load_delegate options (TLS files, execution_preference, priority)."""
    from delegate import load_delegate
    from delegate.runtime import Interpreter
    options = options or {}
    with tflite_call():
        cpu = Interpreter(model_path=model_file, num_threads=threads)
        cpu.allocate_tensors()
    rng = np.random.default_rng(0)
    inputs = [random_input(rng, d["shape"], d["dtype"]) for d in cpu.get_input_details()]
    result: dict = {"model": os.path.basename(model_file), "runs": runs, "threads": threads}
    result["cpu"] = _summary(_latency(cpu, inputs, runs, warmup, progress, "TFLite CPU"))
    # Compile with a fresh token, then prepare the same partitions from the cache.
    token = os.urandom(16)
    t0 = time.perf_counter()
    d1 = load_delegate(service_address, cache_token=token, **options)
    with tflite_call():
        Interpreter(model_path=model_file, experimental_delegates=[d1]).allocate_tensors()
    compile_wall = time.perf_counter() - t0
    t0 = time.perf_counter()
    d = load_delegate(service_address, cache_token=token, **options)
    with tflite_call():
        it = Interpreter(model_path=model_file, num_threads=threads, experimental_delegates=[d])
        it.allocate_tensors()
    cache_wall = time.perf_counter() - t0
    kernels = d.impl.kernels
    result["prepare"] = _prepare_times(d1.impl.kernels, kernels, compile_wall, cache_wall)
    rep = d.report
    result["delegation"] = {"delegated_nodes": rep.delegated, "total_nodes": len(rep.nodes),
                            "partitions": len(rep.partitions), "service": rep.service}
    for k in kernels:
        if k.remote is not None:
            k.remote.reset_perf_info()
    result["nnhal"] = _summary(_latency(it, inputs, runs, warmup, progress, "TFLite + nnhal"))
    result["ratio_nnhal_over_cpu"] = result["nnhal"]["mean_us"] / result["cpu"]["mean_us"]
    result["operations"] = _profile(kernels)
    return result


def _prepare_times(first, second, first_wall: float, second_wall: float) -> dict:
    """The first prepare (fresh token: compiled) and the second (same token). The second is a
    "from cache" time only if every partition really came from the service's cache (a kernel's
    ``from_cache``: PrepareModelFromCache succeeded); otherwise the service compiled again
    (caching off, a model planned per execution, ...) and the figures say so."""
    hits = sum(1 for k in second if k.from_cache)
    all_hit = bool(second) and hits == len(second)
    second_ms = 1e3 * sum(k.prepare_s for k in second)
    return {"compile_ms": 1e3 * sum(k.prepare_s for k in first), "second_prepare_ms": second_ms,
            "partitions": len(second), "cache_hits": hits, "all_from_cache": all_hit,
            "from_cache_ms": second_ms if all_hit else None,
            "interpreter_with_compile_ms": 1e3 * first_wall, "interpreter_second_ms": 1e3 * second_wall,
            "interpreter_from_cache_ms": 1e3 * second_wall if all_hit else None}


def _prepare_line(pr: dict) -> str:
    if not pr["partitions"]:
        return "prepare: nothing delegated, no partition prepared"
    if pr["all_from_cache"]:
        ratio = f"{pr['compile_ms'] / pr['from_cache_ms']:.1f}x" if pr["from_cache_ms"] else "n/a"
        return f"prepare: compile {pr['compile_ms']:.1f} ms, from cache {pr['from_cache_ms']:.1f} ms ({ratio})"
    return (f"prepare: compile {pr['compile_ms']:.1f} ms, again {pr['second_prepare_ms']:.1f} ms NOT from the cache "
            f"({pr['cache_hits']}/{pr['partitions']} partitions were; the service's cache is off or did not "
            f"store the model)")


def _profile(kernels) -> list[dict]:
    rows = []
    for p, k in enumerate(kernels):
        if k.remote is None:
            continue
        info = k.remote.perf_info()
        model = k.part.model
        for op in info.operations:
            members = range(op.index, op.index + max(op.count, 1))  # a graph backend's partition: its operations
            rows.append({"partition": p, "index": op.index, "op": op.name, "backend": op.backend,
                         "avg_us": op.total_ns / max(op.executions, 1) / 1e3, "executions": op.executions,
                         "operations": len(members), "macs": sum(operation_macs(model, k) for k in members)})
    return rows


def format_result(r: dict) -> str:
    cpu, nn = r["cpu"], r["nnhal"]
    lines = [f"model {r['model']}: {r['runs']} runs, {r['threads']} thread(s)",
             f"{'':<16}{'mean us':>10}{'std':>9}{'p50':>10}{'p90':>10}"]
    for label, s in (("TFLite CPU", cpu), ("TFLite + nnhal", nn)):
        lines.append(f"{label:<16}{s['mean_us']:>10.1f}{s['std_us']:>9.1f}{s['p50_us']:>10.1f}{s['p90_us']:>10.1f}")
    dl = r["delegation"]
    pr = r["prepare"]
    lines.append(f"ratio nnhal/CPU (mean): {r['ratio_nnhal_over_cpu']:.2f}x   delegated {dl['delegated_nodes']}/"
                 f"{dl['total_nodes']} nodes in {dl['partitions']} partition(s)")
    lines.append(_prepare_line(pr))
    ops = r["operations"]
    if ops:
        total = sum(o["avg_us"] for o in ops) or 1.0
        lines.append("\nrun order (service side):")
        lines.append(f"{'part':>4} {'idx':>4}  {'op':<22}{'backend':<11}{'avg us':>10}{'MACs':>14}")
        for o in ops:
            lines.append(f"{o['partition']:>4} {o['index']:>4}  {o['op']:<22}{o['backend']:<11}{o['avg_us']:>10.1f}"
                         f"{o['macs']:>14}")
        lines.append("\ntop 10 by time:")
        for o in sorted(ops, key=lambda o: -o["avg_us"])[:10]:
            lines.append(f"{o['partition']:>4} {o['index']:>4}  {o['op']:<22}{o['avg_us']:>10.1f}"
                         f"{100 * o['avg_us'] / total:>8.1f}%")
        by = defaultdict(lambda: [0, 0.0, 0])
        for o in ops:
            e = by[o["op"]]
            e[0] += 1
            e[1] += o["avg_us"]
            e[2] += o["macs"]
        lines.append("\nby operation type:")
        lines.append(f"{'op':<22}{'count':>6}{'avg us':>10}{'share':>8}{'MACs':>14}")
        for name, (count, t, macs) in sorted(by.items(), key=lambda kv: -kv[1][1]):
            lines.append(f"{name:<22}{count:>6}{t:>10.1f}{100 * t / total:>7.1f}%{macs:>14}")
        per_backend = defaultdict(lambda: [0, 0.0])
        for o in ops:
            per_backend[o["backend"] or "?"][0] += 1
            per_backend[o["backend"] or "?"][1] += o["avg_us"]
        lines.append("\nby backend:")
        for name, (count, t) in sorted(per_backend.items(), key=lambda kv: -kv[1][1]):
            lines.append(f"{name:<22}{count:>6}{t:>10.1f}{100 * t / total:>7.1f}%")
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model_file", required=True)
    p.add_argument("--runs", type=int, default=50, help="timed runs (>= 1)")
    p.add_argument("--warmup", type=int, default=5, help="untimed runs first (>= 0)")
    p.add_argument("--threads", type=int, default=1, help="TFLite's threads (>= 1)")
    add_service_arguments(p)
    p.add_argument("--json", action="store_true")


def _usage_error(args: argparse.Namespace) -> str | None:
    """A bad flag value, found before anything runs."""
    for flag, value, least in (("--runs", args.runs, 1), ("--warmup", args.warmup, 0), ("--threads", args.threads, 1)):
        if value < least:
            return f"{flag} must be >= {least}, not {value}"
    if not os.path.isfile(args.model_file):
        return f"cannot read model file {args.model_file!r}"
    error = model_file_error(args.model_file)
    return f"{args.model_file}: {error}" if error else None


def run_cli(args: argparse.Namespace) -> int:
    error = _usage_error(args)
    if error:
        print(f"nnhal benchmark: {error}", file=sys.stderr)
        return 2
    try:
        options = delegate_options(args)
    except ValueError as e:
        print(f"nnhal benchmark: {e}", file=sys.stderr)
        return 2

    def progress(msg):
        print(msg, file=sys.stderr, flush=True)
    try:
        with interrupts_after_tflite_calls("nnhal benchmark"):
            r = benchmark(args.model_file, args.runs, args.warmup, args.threads, args.service_address,
                          progress if args.runs >= 200 else None, options)
    except KeyboardInterrupt:
        return interrupted("nnhal benchmark")
    except (ValueError, RuntimeError) as e:  # TFLite's load / prepare errors: multi-line, joined
        print(f"nnhal benchmark: {args.model_file}: {tflite_error(e, args.model_file)}", file=sys.stderr)
        return 2
    print(json.dumps(r, indent=1) if args.json else format_result(r))
    return 0
