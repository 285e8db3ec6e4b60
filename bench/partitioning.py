"""Partly supported models: the CPU alone vs the delegate choosing partitions largest-first (TFLite
NNAPI delegate's rule) vs by estimated cost (the default), measured in one run, interleaved.

Models: the converter's dynamic-range CNN (tests/converted: hybrid convolutions stay on the CPU,
three float partitions around them); four runs of ADDs on [1, 6] tensors split by COS (no NNAPI
mapping); mobilenet_like (64x64, width 16) in int8 and in float32, followed by COS (int8: after
a DEQUANTIZE), so one heavy partition and a CPU tail. The service is `nnhal serve`
with its default backends, stating its measured speeds (hal/performance.py: relative to LiteRT 1
thread). The delegate runs in LiteRT (1 thread); ratios are against LiteRT alone and tflite-runtime
2.14 alone (1 thread), the faster one's in bold.
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np

from bench.baselines import (
    PACING,
    anchor,
    beside,
    not_measured_row,
    p50_cell,
    ratio_cells,
    time_interleaved,
    with_ratios,
)
from bench.rpc_roundtrip import start_server, stop_servers
from delegate import load_delegate
from delegate.runtime import Interpreter
from nnhal.examples import _Net
from tests.delegate.helpers import random_inputs, run

HERE = Path(__file__).resolve().parent.parent


def mobilenet_like_with_cpu_tail(dtype) -> bytes:
    """nnhal.examples.mobilenet_like(dtype, 64, 16), then (8-bit) DEQUANTIZE and COS on its output."""
    net = _Net(dtype, [1, 64, 64, 3], 0)
    net.conv(16, stride=2).depthwise().conv(32, k=1)
    net.inverted_residual(32, expand=2, stride=1)
    net.inverted_residual(48, expand=2, stride=2)
    net.head(10)
    b = net.b
    (probs,) = b._outputs
    deq = probs
    if net.q8:
        deq = b.add_tensor("deq", [1, 10], np.float32)
        b.add_operator("DEQUANTIZE", [probs], [deq])
    out = b.add_tensor("cos", [1, 10], np.float32)
    b.add_operator("COS", [deq], [out])
    b.set_outputs([out])
    return b.build()


def _models():
    from tests.delegate.models import add_runs
    return [("converter CNN, dynamic-range (hybrid)", (HERE / "tests/converted/cnn_dynamic_range.tflite").read_bytes()),
            ("4 runs of ADDs [1,6] split by COS", add_runs(4)),
            ("mobilenet_like int8 64x64 + COS tail", mobilenet_like_with_cpu_tail(np.int8)),
            ("mobilenet_like float32 64x64 + COS tail", mobilenet_like_with_cpu_tail(np.float32))]


def measure(rounds: int = 5, per_round: int = 40, progress=None) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory() as d:
        sock = str(Path(d) / "s.sock")
        server = start_server(sock, "--threads", "1")
        try:
            for label, model in _models():
                if progress:
                    progress(label)
                path = str(Path(d) / "m.tflite")
                Path(path).write_bytes(model)
                configs = {anchor(1): Interpreter(model_path=path, num_threads=1)}
                delegates = {}
                for mode in ("largest", "cost"):
                    dl = load_delegate(f"unix:{sock}", partitioning=mode)
                    delegates[mode] = dl
                    configs[mode] = Interpreter(model_path=path, num_threads=1, experimental_delegates=[dl])
                xs = random_inputs(configs[anchor(1)], np.random.default_rng(0))
                for it in configs.values():
                    it.allocate_tensors()
                    run(it, xs)  # warm-up
                with beside(path, xs, d) as tflrt:
                    times = time_interleaved(configs, lambda it, xs=xs: run(it, xs), rounds, per_round, tflrt.remote,
                                             **PACING)
                figures = with_ratios(times, tflrt.config)
                for k in (anchor(1), tflrt.config, *delegates):
                    if k not in figures:
                        rows.append(not_measured_row(label, k, tflrt.why))
                        continue
                    rep = delegates[k].report if k in delegates else None
                    rows.append({"model": label, "config": k, **figures[k],
                                 "delegated": "" if rep is None else
                                 f"{rep.delegated}/{len(rep.nodes)} in {len(rep.partitions)}"})
        finally:
            stop_servers([server])
    return rows


def to_markdown(rows: list[dict]) -> str:
    lines = [f"| model | configuration | p50 µs | × {anchor(1)} | × tflite-runtime 1 thread | "
             "delegated nodes, partitions |", "|---|---|---:|---:|---:|---|"]
    for r in rows:
        config = {"largest": "delegate, largest-first", "cost": "delegate, cost (default)"}.get(r["config"],
                                                                                              r["config"])
        us = r if r.get("p50_ms") is None else {**r, "p50_ms": 1e3 * r["p50_ms"]}
        lines.append(f"| {r['model']} | {config} | {p50_cell(us, 1)} | {ratio_cells(r)} | {r.get('delegated', '')} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(to_markdown(measure(progress=lambda s: print(s, file=sys.stderr, flush=True))))
