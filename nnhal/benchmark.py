"""`nnhal benchmark`: latency with and without the delegate, prepare compile vs from-cache (only
when the cache really served it), and a per-operation profile from the service's perfinfo (run
order, top-10, by op type with MACs).

It takes TFLite benchmark_model's flags (--graph, --num_runs, --warmup_runs, --min_secs,
--max_secs, --num_threads, --enable_op_profiling, --input_layer*, --report_peak_memory_footprint)
and prints benchmark_model's summary lines for the delegated run first (its timed loop too:
at least --num_runs runs and --min_secs seconds, stopping after --max_secs). A model with a CUSTOM
op only an nnhal extension implements has no TFLite CPU baseline: that row says why, the delegated
rows stand.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import threading
import time
from collections import defaultdict

import numpy as np

from delegate.report import allocation_error
from extensions.registry import by_custom_code
from hal.model import Model
from hal.types import OperationType
from nnhal.inference_diff import model_and_inputs_error, tool_error
from nnhal.reference import custom_codes, unresolved_custom_op
from nnhal.tool_inputs import add_input_arguments, input_layers, input_sources, resize_inputs
from nnhal.tool_support import (
    add_bool_flag,
    add_delegate_arguments,
    delegate_options,
    interrupted,
    interrupts_after_tflite_calls,
    progress_bar,
    tflite_call,
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


def _latency(it, inputs, runs: int, min_secs: float = 0.0, max_secs: float = 150.0, progress: bool = False,
             label="") -> list[float]:
    """benchmark_model's loop: at least ``runs`` runs and ``min_secs`` seconds, but no run starts
    after ``max_secs``. Microseconds per run; ``progress``: a bar on a terminal."""
    for d, x in zip(it.get_input_details(), inputs):
        it.set_tensor(d["index"], x)
    out: list[float] = []
    now = start = time.monotonic()
    with progress_bar(total=runs, desc=label, enabled=progress) as bar:
        while (len(out) < runs or now < start + min_secs) and now <= start + max_secs:
            with tflite_call():
                t = time.perf_counter_ns()
                it.invoke()
                out.append((time.perf_counter_ns() - t) / 1e3)
            now = time.monotonic()
            bar.update(1)
    return out


def _summary(xs: list[float]) -> dict:
    s = sorted(xs)
    return {"mean_us": statistics.fmean(s), "std_us": statistics.pstdev(s),
            "p50_us": s[len(s) // 2], "p90_us": s[min(len(s) - 1, int(len(s) * 0.9))]}


def _footprint_kb() -> int:
    """TFLite's memory footprint: the process's peak resident set (ru_maxrss, KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


class _PeakMonitor:
    """benchmark_model's --report_peak_memory_footprint: this process's resident set every 50 ms
    (the service is another process and is not counted)."""

    def __init__(self, interval_s: float = 0.05):
        self.peak_kb = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(interval_s,), daemon=True)

    def _run(self, interval_s: float) -> None:
        page_kb = os.sysconf("SC_PAGE_SIZE") // 1024
        while True:
            with open("/proc/self/statm") as f:
                self.peak_kb = max(self.peak_kb, int(f.read().split()[1]) * page_kb)
            if self._stop.wait(interval_s):
                return

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def benchmark(model_file: str, runs: int = 50, warmup: int = 5, threads: int = 1,
              service_address: str | None = None, progress: bool = False, options: dict | None = None,
              min_secs: float = 0.0, max_secs: float = 150.0, layers: dict | None = None,
              peak_memory: bool = False) -> dict:
    """``options``: more load_delegate options (TLS files, execution_preference, ...); ``layers``:
    nnhal.tool_inputs.input_layers. The delegated interpreter runs first, so the memory figures
    are benchmark_model's for it."""
    from delegate import load_delegate
    from delegate.runtime import Interpreter
    options = dict(options or {})
    threads_arg = None if threads == -1 else threads  # -1: TFLite's own default, as benchmark_model
    start_kb = _footprint_kb()
    monitor = _PeakMonitor() if peak_memory else None
    if monitor:
        monitor.__enter__()
    try:
        with tflite_call():
            details = Interpreter(model_path=model_file).get_input_details()
        sources = input_sources(details, layers or {}, model_file)
        rng = np.random.default_rng(0)
        inputs = [s.value(rng) for s in sources]
        result: dict = {"model": os.path.basename(model_file), "runs": runs, "threads": threads}

        def interpreter(delegates=None):
            it = Interpreter(model_path=model_file, num_threads=threads_arg, experimental_delegates=delegates)
            resize_inputs(it, sources)
            it.allocate_tensors()
            return it
        # Compile with a fresh token (the user's model_token, if any, salted), then prepare the same
        # partitions from the cache: the interpreter that is timed.
        token = options.pop("cache_token", b"")
        token = (token.encode() if isinstance(token, str) else token) + os.urandom(16)
        t0 = time.perf_counter()
        d1 = load_delegate(service_address, cache_token=token, **options)
        with tflite_call():
            interpreter([d1])
        compile_wall = time.perf_counter() - t0
        t0 = time.perf_counter()
        d = load_delegate(service_address, cache_token=token, **options)
        with tflite_call():
            it = interpreter([d])
        cache_wall = time.perf_counter() - t0
        init_kb = _footprint_kb()
        kernels = d.impl.kernels
        result["prepare"] = _prepare_times(d1.impl.kernels, kernels, compile_wall, cache_wall)
        rep = d.report
        result["delegation"] = {"delegated_nodes": rep.delegated, "total_nodes": len(rep.nodes),
                                "partitions": len(rep.partitions), "service": rep.service}
        for k in kernels:
            if k.remote is not None:
                k.remote.reset_perf_info()
        warm = _latency(it, inputs, warmup, 0.0, max_secs)
        timed = _latency(it, inputs, runs, min_secs, max_secs, progress, "TFLite + nnhal")
        overall_kb = _footprint_kb()
        result["nnhal"] = _summary(timed)
        result["operations"] = _profile(kernels)
        del it, d, d1
        cpu = _cpu_interpreter(model_file, interpreter)
        if isinstance(cpu, str):
            result["cpu"], result["cpu_unavailable"] = None, cpu
        else:
            _latency(cpu, inputs, warmup, 0.0, max_secs)
            result["cpu"] = _summary(_latency(cpu, inputs, runs, min_secs, max_secs, progress, "TFLite CPU"))
    finally:
        if monitor:
            monitor.__exit__()
    result["ratio_nnhal_over_cpu"] = result["nnhal"]["mean_us"] / result["cpu"]["mean_us"] if result["cpu"] else None
    result["benchmark_model"] = {
        "num_runs": runs, "warmup_runs": warmup, "min_secs": min_secs, "max_secs": max_secs,
        "init_us": int(cache_wall * 1e6), "warmup_us": [int(x) for x in warm], "inference_us": [int(x) for x in timed],
        "memory_mb": {"init": (init_kb - start_kb) / 1024.0, "overall": (overall_kb - start_kb) / 1024.0,
                      "peak": monitor.peak_kb / 1024.0 if monitor else None}}
    return result


def _cpu_interpreter(model_file: str, interpreter):
    """The baseline: TFLite alone, or why it cannot be one (a CUSTOM op only an nnhal extension
    implements has no TFLite kernel: the delegated rows stand without it)."""
    try:
        with tflite_call():
            return interpreter()
    except (RuntimeError, ValueError) as e:
        code = unresolved_custom_op(e, custom_codes(model_file))
        found = by_custom_code(code)
        if found is None:
            raise
        return f"TFLite has no kernel for custom op {code!r} (extension {found[0].name}: only the delegate runs it)"


def stat_line(xs: list[int]) -> str:
    """TFLite's Stat<int64_t>::OutputToStream."""
    if not xs:
        return "count=0"
    if min(xs) == max(xs):
        return f"count={len(xs)} curr={xs[-1]}" + ("(all same)" if len(xs) > 1 else "")
    avg = sum(xs) / len(xs)
    std = int(max(0.0, sum(x * x for x in xs) / len(xs) - avg * avg) ** 0.5)
    return f"count={len(xs)} first={xs[0]} curr={xs[-1]} min={min(xs)} max={max(xs)} avg={avg:g} std={std}"


def benchmark_model_lines(bm: dict) -> list[str]:
    """benchmark_model's summary of the delegated run, in its words."""
    warm, timed = bm["warmup_us"], bm["inference_us"]
    mem = bm["memory_mb"]
    lines = []
    for runs, min_secs, stats in ((bm["warmup_runs"], 0.0, warm), (bm["num_runs"], bm["min_secs"], timed)):
        lines += [f"Running benchmark for at least {runs} iterations and at least {min_secs:g} seconds but terminate "
                  f"if exceeding {bm['max_secs']:g} seconds.", stat_line(stats)]
    warm_avg = sum(warm) / len(warm) if warm else float("nan")
    timed_avg = sum(timed) / len(timed) if timed else float("nan")
    lines += ["", f"Inference timings in us: Init: {bm['init_us']}, First inference: {warm[0] if warm else 0}, "
              f"Warmup (avg): {warm_avg:g}, Inference (avg): {timed_avg:g}",
              "Note: as the benchmark tool itself affects memory footprint, the following is only APPROXIMATE to "
              "the actual memory footprint of the model at runtime. Take the information at your discretion.",
              f"Memory footprint delta from the start of the tool (MB): init={mem['init']:g} "
              f"overall={mem['overall']:g}"]
    if mem["peak"] is not None:
        lines.append(f"Overall peak memory footprint (MB) via periodic monitoring: {mem['peak']:g}")
    return lines


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
            nodes = sorted(n for n, (lo, hi) in k.part.node_operations.items() if lo < members.stop and hi > op.index)
            rows.append({"partition": p, "index": op.index, "op": op.name, "backend": op.backend, "nodes": nodes,
                         "avg_us": op.total_ns / max(op.executions, 1) / 1e3, "executions": op.executions,
                         "operations": len(members), "macs": sum(operation_macs(model, k) for k in members)})
    return rows


def format_result(r: dict, op_profiling: bool = True) -> str:
    """benchmark_model's lines for the delegated run, then the comparison with TFLite's CPU and
    (``op_profiling``: --enable_op_profiling) the service's per-operation profile."""
    cpu, nn = r["cpu"], r["nnhal"]
    lines = benchmark_model_lines(r["benchmark_model"]) if "benchmark_model" in r else []
    lines += ["" if lines else None,
              f"model {r['model']}: at least {r['runs']} runs, {r['threads']} thread(s)",
              f"{'':<16}{'mean us':>10}{'std':>9}{'p50':>10}{'p90':>10}"]
    lines = [x for x in lines if x is not None]
    for label, s in (("TFLite CPU", cpu), ("TFLite + nnhal", nn)):
        if s is None:
            lines.append(f"{label:<16}not available: {r.get('cpu_unavailable')}")
            continue
        lines.append(f"{label:<16}{s['mean_us']:>10.1f}{s['std_us']:>9.1f}{s['p50_us']:>10.1f}{s['p90_us']:>10.1f}")
    dl = r["delegation"]
    pr = r["prepare"]
    ratio = "n/a" if r["ratio_nnhal_over_cpu"] is None else f"{r['ratio_nnhal_over_cpu']:.2f}x"
    lines.append(f"ratio nnhal/CPU (mean): {ratio}   delegated {dl['delegated_nodes']}/"
                 f"{dl['total_nodes']} nodes in {dl['partitions']} partition(s)")
    lines.append(_prepare_line(pr))
    ops = r["operations"] if op_profiling else []
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
    """benchmark_model's flags (our earlier names still work: --model_file, --runs, --warmup, --threads)."""
    p.add_argument("--graph", "--model_file", dest="model_file", required=True, help="the .tflite model")
    p.add_argument("--num_runs", "--runs", dest="runs", type=int, default=50,
                   help="timed runs at least (>= 1; see --min_secs, --max_secs)")
    p.add_argument("--warmup_runs", "--warmup", dest="warmup", type=int, default=1, help="untimed runs first (>= 0)")
    p.add_argument("--min_secs", type=float, default=1.0,
                   help="time the runs for at least this long, even past --num_runs (default 1)")
    p.add_argument("--max_secs", type=float, default=150.0,
                   help="start no run after this many seconds, even before --num_runs (default 150)")
    p.add_argument("--num_threads", "--threads", dest="threads", type=int, default=1,
                   help="TFLite's threads (>= 1; -1: TFLite's default)")
    add_bool_flag(p, "--enable_op_profiling", help="print the service's per-operation profile")
    add_bool_flag(p, "--report_peak_memory_footprint", help="sample this process's memory every 50 ms and "
                  "print the peak")
    add_input_arguments(p)
    add_delegate_arguments(p)
    p.add_argument("--json", action="store_true", help="everything as JSON (the profile included)")


def _usage_error(args: argparse.Namespace) -> str | None:
    """A bad flag value, found before anything runs."""
    for flag, value, least in (("--num_runs", args.runs, 1), ("--warmup_runs", args.warmup, 0),
                               ("--min_secs", args.min_secs, 0)):
        if value < least:
            return f"{flag} must be >= {least}, not {value}"
    if args.threads < 1 and args.threads != -1:
        return f"--num_threads must be >= 1 (or -1: TFLite's default), not {args.threads}"
    if not args.max_secs > 0:
        return f"--max_secs must be > 0, not {args.max_secs}"
    return model_and_inputs_error(args)


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
    try:
        with interrupts_after_tflite_calls("nnhal benchmark"):
            r = benchmark(args.model_file, args.runs, args.warmup, args.threads, args.service_address,
                          not args.json, options, min_secs=args.min_secs,
                          max_secs=args.max_secs, layers=input_layers(args),
                          peak_memory=args.report_peak_memory_footprint)
    except KeyboardInterrupt:
        return interrupted("nnhal benchmark")
    except MemoryError as e:  # tflite_runtime's std::bad_alloc, numpy's "Unable to allocate"
        print(f"nnhal benchmark: {args.model_file}: {allocation_error(args.model_file, e)}", file=sys.stderr)
        return 2
    except (ValueError, RuntimeError) as e:  # TFLite's load / prepare errors: multi-line, joined
        print(f"nnhal benchmark: {args.model_file}: {tool_error(e, args.model_file)}", file=sys.stderr)
        return 2
    print(json.dumps(r, indent=1) if args.json else format_result(r, args.enable_op_profiling))
    return 0
