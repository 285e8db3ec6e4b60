"""`make bench`: every benchmark in one run, written to bench/results.md; the backends' measured
speeds also to bench/performance.json (`nnhal serve --performance bench/performance.json`).

Ratios are against TFLite's CPU interpreter measured in the same process and run.
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
from nnhal.benchmark import benchmark
from nnhal.examples import mobilenet_like, mobilenet_v2


def delegated_models(runs: int = 100) -> str:
    lines = ["| model | TFLite CPU p50 µs (mean) | TFLite + nnhal p50 µs (mean) | ratio nnhal/CPU (p50) | "
             "delegated nodes |", "|---|---:|---:|---:|---|"]
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
            r = benchmark(path, runs=runs, warmup=5)
            dl = r["delegation"]
            cpu, nn = r["cpu"], r["nnhal"]
            lines.append(f"| {name} | {cpu['p50_us']:.1f} ({cpu['mean_us']:.1f}) | {nn['p50_us']:.1f} "
                         f"({nn['mean_us']:.1f}) | {nn['p50_us'] / cpu['p50_us']:.2f} | "
                         f"{dl['delegated_nodes']}/{dl['total_nodes']} |")
    return "\n".join(lines)


def measured_speeds(rows: list[dict]) -> dict[tuple[str, int], list[float]]:
    """(backend, NNAPI operand type) -> this run's whole-model ratios to TFLite 1 thread."""
    from hal.types import OperandType
    measured: dict[tuple[str, int], list[float]] = {}
    for r in rows:
        m = re.fullmatch(r"nnhal \((\w+) backend\)", r.get("config", ""))
        if m is None:
            continue
        otype = (OperandType.TENSOR_QUANT8_ASYMM if "uint8" in r["model"] else
                 OperandType.TENSOR_QUANT8_ASYMM_SIGNED if "int8" in r["model"] else OperandType.TENSOR_FLOAT32)
        measured.setdefault((m.group(1), otype), []).append(r["ratio"])
    return measured


def _geomean(xs: list[float]) -> float:
    return float(np.exp(np.mean(np.log(xs))))


def stated_vs_measured(rows: list[dict]) -> str:
    """What the service states per operand type (hal.performance.MEASURED) beside what this run
    measured: the geometric mean of the backend's whole-model ratios to TFLite 1 thread. A figure
    that has drifted is updated by hand in hal/performance.py, or this machine's are stated with
    `nnhal serve --performance bench/performance.json` (``write_performance``)."""
    from hal.performance import MEASURED
    lines = ["| backend | operand type | stated exec_time | measured this run (geometric mean) | models |",
             "|---|---|---:|---:|---:|"]
    for (backend, otype), ratios in sorted(measured_speeds(rows).items()):
        stated = MEASURED.get(backend, {}).get(otype)
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
    """The cost model's CPU estimate of each bench model (delegate.cost, fitted on these models)
    beside TFLite 1 thread's measured time in this run."""
    from delegate.cost import CostModel
    from delegate.tfl import read_model
    builds = {label: build for label, build, _ in float_models.MODELS}
    builds.update({label: (lambda build=build, dtype=dtype: build(dtype))
                   for label, build, dtype in quantized_models.MODELS})
    lines = ["| model | TFLite 1 thread p50 ms | estimated ms | estimate / measured |", "|---|---:|---:|---:|"]
    model = CostModel()
    for r in rows:
        if r.get("config") != "TFLite 1 thread" or r["model"] not in builds:
            continue
        graph = read_model(builds[r["model"]]())
        est_ms = sum(model.node_cpu_us(graph, n) for n in graph.nodes) / 1e3
        lines.append(f"| {r['model']} | {r['p50_ms']:.2f} | {est_ms:.2f} | {est_ms / r['p50_ms']:.2f} |")
    return "\n".join(lines)


#: Sections of results.md other targets write (`make soak`, `make fuzz`): `make bench` keeps them.
OTHER_TARGETS = ("## Soak", "## Fuzz")


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
    sections.append("## Delegated models vs TFLite CPU (1 thread)\n\n" + delegated_models())
    print("partly supported models: largest-first vs cost partitioning...", file=sys.stderr, flush=True)
    sections.append("## Partly supported models: largest-first vs cost-aware partitioning\n\n"
                    + (partitioning.__doc__ or "").split("\n\n", 1)[1].strip() + "\n\n"
                    + partitioning.to_markdown(partitioning.measure()))
    print("float models: onnxruntime vs reference backend vs TFLite XNNPACK...", file=sys.stderr, flush=True)
    float_rows = float_models.measure()
    sections.append("## Float models: onnxruntime and reference backends vs TFLite's XNNPACK\n\n"
                    + (float_models.__doc__ or "").split("\n\n", 1)[1].strip() + "\n\n"
                    + float_models.to_markdown(float_rows))
    print("quantized models: numba vs reference backend vs TFLite...", file=sys.stderr, flush=True)
    quant_rows = quantized_models.measure()
    sections.append("## Quantized models at 224x224: numba and reference backends vs TFLite's int8 kernels\n\n"
                    + (quantized_models.__doc__ or "").split("\n\n", 1)[1].strip() + "\n\n"
                    + quantized_models.to_markdown(quant_rows))
    sections.append("## The speeds the service states, and the CPU estimate, vs this run\n\n"
                    "getCapabilities' exec_time per operand type (hal/performance.py: the delegate's default, "
                    "cost-aware partitioning weighs partitions with it) beside the ratios measured above.\n\n"
                    + stated_vs_measured(float_rows + quant_rows) + "\n\n"
                    "The cost model's CPU time of the same models (delegate/cost.py's rates) beside TFLite's:\n\n"
                    + cpu_estimates(float_rows + quant_rows))
    here = os.path.dirname(os.path.abspath(__file__))
    write_performance(float_rows + quant_rows, os.path.join(here, "performance.json"))
    text = "\n\n".join(sections) + f"\n\n(total benchmark time {time.time() - t0:.0f} s)\n"
    out = os.path.join(here, "results.md")
    text += "".join("\n" + s for s in kept_sections(out))
    with open(out, "w") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
