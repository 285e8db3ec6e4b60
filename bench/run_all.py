"""`make bench`: every benchmark in one run, written to bench/results.md; the backends' measured
speeds also to bench/performance.json (`nnhal serve --performance bench/performance.json`).

Every ratio is against the CPU measured in the same run, 1 thread unless a row says otherwise:
LiteRT 2.3 (this process's runtime, the anchor the service's stated speeds are relative to) and
tflite-runtime 2.14 beside it (a worker in .venv-tflite-runtime: bench/baselines.py).
"""
from __future__ import annotations

import json
import os
import platform
import re
import sys
import tempfile
import time

import numpy as np

from bench import cache_bench, float_models, partitioning, quantized_models, rpc_roundtrip
from bench import tflite_runtime_baseline as tflrt
from bench.baselines import anchor, ratio_cells
from delegate import runtime
from nnhal.benchmark import benchmark
from nnhal.examples import mobilenet_like, mobilenet_v2

#: The delegated-models table's least time of timed invokes per configuration: the 1-op model
#: runs thousands of invokes, not ``runs`` (a p50 of 100 invokes right after the prepare moved by
#: half between runs).
MIN_SECS = 0.25


def delegated_models(runs: int = 100) -> str:
    """`nnhal benchmark`'s CPU and delegated runs (LiteRT, 1 thread), tflite-runtime's beside."""
    from delegate.runtime import Interpreter
    from tests.delegate.helpers import random_inputs
    lines = [f"| model | {anchor(1)} p50 µs (mean) | tflite-runtime 1 thread p50 µs (mean) | "
             f"{runtime.label()} + nnhal p50 µs (mean) | nnhal × {anchor(1)} | nnhal × tflite-runtime 1 thread | "
             f"nnhal − {anchor(1)} (p50 µs; the 1-op row: the per-invoke overhead) | delegated nodes |",
             "|---|---:|---:|---:|---:|---:|---:|---|"]
    with tempfile.TemporaryDirectory() as d:
        for name, data in (("mobilenet_like float32 (64x64)", mobilenet_like(np.float32, 64, 16)),
                           ("mobilenet_like int8 (64x64)", mobilenet_like(np.int8, 64, 16)),
                           ("tiny 1-op ADD", None)):
            if data is None:
                from tests.delegate.models import add_runs
                data = add_runs(1, 1)
            path = os.path.join(d, "m.tflite")
            with open(path, "wb") as f:
                f.write(data)
            r = benchmark(path, runs=runs, warmup=5, min_secs=MIN_SECS)
            inputs = random_inputs(Interpreter(model_path=path), np.random.default_rng(0))
            other = tflrt.one_shot([(path, inputs)], d, runs)
            other = None if other is None else other["models"][0]
            dl = r["delegation"]
            cpu, nn = r["cpu"], r["nnhal"]
            if other is None or "error" in other:
                other_cell = tflrt.NOT_MEASURED if other is None else f"not measured: {other['error']}"
                ratios = {"ratio": nn["p50_us"] / cpu["p50_us"]}
            else:
                other_cell = f"{1e3 * other['p50_ms']:.1f} ({1e3 * other['mean_ms']:.1f})"
                ratios = {"ratio": nn["p50_us"] / cpu["p50_us"], "ratio_tflrt": nn["p50_us"] / (1e3 * other["p50_ms"]),
                          "tflrt_faster": 1e3 * other["p50_ms"] < cpu["p50_us"]}
            lines.append(f"| {name} | {cpu['p50_us']:.1f} ({cpu['mean_us']:.1f}) | {other_cell} | "
                         f"{nn['p50_us']:.1f} ({nn['mean_us']:.1f}) | {ratio_cells(ratios)} | "
                         f"{nn['p50_us'] - cpu['p50_us']:.1f} | {dl['delegated_nodes']}/{dl['total_nodes']} |")
    return "\n".join(lines)


#: Models shorter than this on the anchor CPU runtime do not count in the stated speeds.
MIN_CPU_MS = 2.0


def measured_speeds(rows: list[dict]) -> dict[tuple[str, int], list[float]]:
    """(backend, NNAPI operand type) -> this run's whole-model ratios to the anchor, LiteRT 1 thread.
    Only rows that ran wholly on the service count: a service that delegated nothing (unreachable
    at load_delegate) would state the CPU's own speed. Nor do models the CPU runs in under
    MIN_CPU_MS: their ratio measures the per-invoke round trip as much as the backend, and the
    delegate's cost model charges that round trip separately (delegate.cost's invoke overhead)."""
    from hal.types import OperandType
    anchor_ms = {r["model"]: r["p50_ms"] for r in rows
                 if r.get("config") == anchor(1) and r.get("p50_ms") is not None}
    measured: dict[tuple[str, int], list[float]] = {}
    for r in rows:
        m = re.fullmatch(r"nnhal \((\w+) backend\)", r.get("config", ""))
        done, _, total = r.get("delegated", "").partition("/")
        if m is None or r.get("ratio") is None or not total or done != total:
            continue
        if anchor_ms.get(r["model"], MIN_CPU_MS) < MIN_CPU_MS:
            continue
        otype = (OperandType.TENSOR_QUANT8_ASYMM if "uint8" in r["model"] else
                 OperandType.TENSOR_QUANT8_ASYMM_SIGNED if "int8" in r["model"] else OperandType.TENSOR_FLOAT32)
        measured.setdefault((m.group(1), otype), []).append(r["ratio"])
    return measured


def _geomean(xs: list[float]) -> float:
    return float(np.exp(np.mean(np.log(xs))))


def stated_vs_measured(rows: list[dict]) -> str:
    """What the service states per operand type on this machine (hal.performance.stated: MEASURED,
    or BY_VERSION's for a backend version that measured otherwise) beside what this run measured:
    the geometric mean of the backend's whole-model ratios to LiteRT 1 thread. A figure that has
    drifted is updated by hand in hal/performance.py, or this machine's are stated with
    `nnhal serve --performance bench/performance.json` (``write_performance``)."""
    from hal.performance import stated as stated_figures
    lines = ["| backend | operand type | stated exec_time | measured this run (geometric mean) | models |",
             "|---|---|---:|---:|---:|"]
    for (backend, otype), ratios in sorted(measured_speeds(rows).items()):
        stated = stated_figures(backend).get(otype)
        lines.append(f"| {backend} | {otype.name} | {'' if stated is None else f'{stated:.2f}'} | "
                     f"{_geomean(ratios):.2f} | {len(ratios)} |")
    return "\n".join(lines)


def write_performance(rows: list[dict], path: str) -> None:
    """This run's figures as `nnhal serve --performance` reads them (hal.performance.read_measured)."""
    out: dict[str, dict[str, float]] = {}
    for (backend, otype), ratios in sorted(measured_speeds(rows).items()):
        out.setdefault(backend, {})[otype.name] = round(_geomean(ratios), 3)
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")


def cpu_estimates(rows: list[dict]) -> str:
    """The cost model's CPU estimate of each bench model (delegate.cost's rates for each runtime,
    fitted on these models) beside each runtime's measured time, 1 thread, in this run."""
    from delegate.cost import CPU_RATES, CostModel
    from delegate.tfl import read_model
    builds = {label: build for label, build, _ in float_models.MODELS}
    builds.update({label: (lambda build=build, dtype=dtype: build(dtype))
                   for label, build, dtype in quantized_models.MODELS})
    lines = ["| model | runtime, 1 thread | p50 ms | estimated ms | estimate / measured |", "|---|---|---:|---:|---:|"]
    model = CostModel()
    for r in rows:
        name = r.get("config", "")
        which = (runtime.RUNTIME if name == anchor(1) else
                 "tflite_runtime" if name.startswith("tflite-runtime") and name.endswith(" 1 thread") else None)
        if which is None or r["model"] not in builds or r.get("p50_ms") is None:
            continue
        graph = read_model(builds[r["model"]]())
        est_ms = sum(model.node_cpu_us(graph, n, CPU_RATES[which]) for n in graph.nodes) / 1e3
        lines.append(f"| {r['model']} | {name.removesuffix(' 1 thread')} | {r['p50_ms']:.2f} | {est_ms:.2f} | "
                     f"{est_ms / r['p50_ms']:.2f} |")
    return "\n".join(lines)


#: Sections of results.md other targets write (`make soak`, `make fleet`, `make fuzz`): `make bench` keeps them.
OTHER_TARGETS = ("## Soak", "## Fleet", "## Fuzz")


def kept_sections(path: str) -> list[str]:
    """The sections of ``path`` written by other make targets, each up to the next "## " heading."""
    try:
        text = open(path).read()
    except FileNotFoundError:
        return []
    chunks = re.split(r"(?m)^(?=## )", text)
    return [c.rstrip("\n") + "\n" for c in chunks if c.startswith(OTHER_TARGETS)]


def main() -> int:
    t0 = time.time()
    sections = [f"# nnhal benchmarks\n\nMeasured {time.strftime('%Y-%m-%d %H:%M')} on {platform.machine()}, "
                f"{os.cpu_count()} cores, Python {platform.python_version()}. Server in its own process on a "
                f"unix socket. Regenerate with `make bench`.\n"]
    print("RPC round trips...", file=sys.stderr, flush=True)
    sections.append("## RPC round trip (1-op model)\n\n" + rpc_roundtrip.to_markdown(rpc_roundtrip.measure()))
    print("compilation cache...", file=sys.stderr, flush=True)
    sections.append("## Compilation cache (MobileNetV2-sized float32)\n\n" + cache_bench.to_markdown(
        cache_bench.measure(mobilenet_v2())))
    print("delegated models...", file=sys.stderr, flush=True)
    sections.append(f"## Delegated models vs the CPU: {anchor(1)}, tflite-runtime 1 thread beside it\n\n"
                    "The delegate runs in LiteRT; each nnhal ratio against the faster CPU is in bold.\n\n"
                    + delegated_models())
    print("partly supported models: largest-first vs cost partitioning...", file=sys.stderr, flush=True)
    sections.append("## Partly supported models: largest-first vs cost-aware partitioning\n\n"
                    + (partitioning.__doc__ or "").split("\n\n", 1)[1].strip() + "\n\n"
                    + partitioning.to_markdown(partitioning.measure()))
    print("float models: default vs reference backend vs the CPU runtimes...", file=sys.stderr, flush=True)
    float_rows = float_models.measure()
    sections.append("## Float models: the onnxruntime and numba backends, and the reference backend, vs LiteRT and "
                    "tflite-runtime (XNNPACK)\n\n"
                    + (float_models.__doc__ or "").split("\n\n", 1)[1].strip() + "\n\n"
                    + float_models.to_markdown(float_rows))
    print("quantized models: numba vs reference backend vs the CPU runtimes...", file=sys.stderr, flush=True)
    quant_rows = quantized_models.measure()
    sections.append("## Quantized models at 224x224: numba and reference backends vs LiteRT and tflite-runtime\n\n"
                    + (quantized_models.__doc__ or "").split("\n\n", 1)[1].strip() + "\n\n"
                    + quantized_models.to_markdown(quant_rows))
    sections.append("## The speeds the service states, and the CPU estimate, vs this run\n\n"
                    "getCapabilities' exec_time per operand type (hal/performance.py: the delegate's default, "
                    f"cost-aware partitioning weighs partitions with it; relative to {anchor(1)}) beside the "
                    "ratios measured above.\n\n"
                    + stated_vs_measured(float_rows + quant_rows) + "\n\n"
                    "The cost model's CPU time of the same models (delegate/cost.py's rates for each runtime) beside "
                    "the runtime's measured time:\n\n"
                    + cpu_estimates(float_rows + quant_rows))
    here = os.path.dirname(os.path.abspath(__file__))
    from delegate.cost import ANCHOR
    if runtime.RUNTIME == ANCHOR:
        write_performance(float_rows + quant_rows, os.path.join(here, "performance.json"))
    else:  # figures against another CPU are not the service's exec_time
        print(f"not writing performance.json: the bench ran in {runtime.label()}, not LiteRT", file=sys.stderr)
    text = "\n\n".join(sections) + f"\n\n(total benchmark time {time.time() - t0:.0f} s)\n"
    out = os.path.join(here, "results.md")
    text += "".join("\n" + s for s in kept_sections(out))
    with open(out, "w") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
