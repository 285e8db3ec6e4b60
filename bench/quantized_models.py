"""Quantized whole models through the delegate: the numba backend vs the reference backend vs
TFLite's own int8 kernels, measured in one run, configurations interleaved round by round.

Models are built by the project (random weights): MobileNetV2 and EfficientNet-B0 at 224x224, int8
(per-channel filters, int8 I/O) and uint8 (per-tensor, uint8 I/O). Rows: TFLite's default kernels
with 1 and 2 threads; the delegate on a service whose backend preference is ``numba,reference``,
and on one restricted to ``reference``. Bit-exactness is against TFLite's reference kernels
(BUILTIN_REF); the int8 REF SOFTMAX is wrong on 1000 classes (../shared/notes/tflite-oracle.md),
so a model's output that differs from REF only there is compared with the optimized kernel too.
"""
from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.rpc_roundtrip import start_server, stop_servers
from delegate import load_delegate
from delegate.runtime import Interpreter, OpResolverType
from nnhal.examples import efficientnet_b0, mobilenet_v2

MODELS = [("MobileNetV2 224 int8", mobilenet_v2, np.int8), ("MobileNetV2 224 uint8", mobilenet_v2, np.uint8),
          ("EfficientNet-B0 224 int8", efficientnet_b0, np.int8),
          ("EfficientNet-B0 224 uint8", efficientnet_b0, np.uint8)]


def _run(it, x) -> np.ndarray:
    it.set_tensor(it.get_input_details()[0]["index"], x)
    it.invoke()
    return it.get_tensor(it.get_output_details()[0]["index"])


def _exactness(out: np.ndarray, ref: np.ndarray, optimized: np.ndarray) -> str:
    if np.array_equal(out, ref):
        return "bit-exact vs REF"
    if np.array_equal(out, optimized):
        return "= TFLite's optimized kernels; ≠ REF (REF's 1000-class 8-bit SOFTMAX corner)"
    return f"DIFFERS: max |diff| vs REF {int(np.abs(out.astype(int) - ref.astype(int)).max())}"


def time_interleaved(configs: dict, run, rounds: int, per_round: int) -> dict[str, list[float]]:
    """Seconds per ``run(config)``, configurations interleaved round by round, the order reversed
    every other round (no first-run or thermal bias toward one of them)."""
    times: dict[str, list[float]] = {k: [] for k in configs}
    for r in range(rounds):
        for k in (list(configs) if r % 2 == 0 else list(reversed(configs))):
            for _ in range(per_round):
                t = time.perf_counter()
                run(configs[k])
                times[k].append(time.perf_counter() - t)
    return times


def measure(rounds: int = 5, per_round: int = 3, progress=None) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory() as d:
        servers = {name: start_server(str(Path(d) / f"{name}.sock"), "--backend", order, "--no-cache")
                   for name, order in (("numba", "numba,reference"), ("reference", "reference"))}
        try:
            for label, build, dtype in MODELS:
                if progress:
                    progress(label)
                path = Path(d) / "m.tflite"
                path.write_bytes(build(dtype))
                x = np.random.default_rng(0).integers(np.iinfo(dtype).min, np.iinfo(dtype).max + 1,
                                                      (1, 224, 224, 3)).astype(dtype)
                ref = Interpreter(model_path=str(path), experimental_op_resolver_type=OpResolverType.BUILTIN_REF)
                ref.allocate_tensors()
                want = _run(ref, x).copy()
                configs = {"TFLite 1 thread": Interpreter(model_path=str(path), num_threads=1),
                           "TFLite 2 threads": Interpreter(model_path=str(path), num_threads=2)}
                delegates = {}
                for name in servers:
                    dl = load_delegate(f"unix:{Path(d) / f'{name}.sock'}", max_delegated_partitions=0)
                    delegates[name] = dl
                    configs[f"nnhal ({name} backend)"] = Interpreter(model_path=str(path), num_threads=1,
                                                                     experimental_delegates=[dl])
                for it in configs.values():
                    it.allocate_tensors()
                    _run(it, x)  # warm-up
                times = time_interleaved(configs, lambda it, x=x: _run(it, x), rounds, per_round)
                optimized = _run(configs["TFLite 1 thread"], x).copy()
                base = statistics.median(times["TFLite 1 thread"])
                for k, it in configs.items():
                    rep = delegates[k.split("(")[1].split()[0]].report if k.startswith("nnhal") else None
                    rows.append({"model": label, "config": k, "p50_ms": 1e3 * statistics.median(times[k]),
                                 "ratio": statistics.median(times[k]) / base,
                                 "delegated": "" if rep is None else f"{rep.delegated}/{len(rep.nodes)}",
                                 "exact": _exactness(_run(it, x), want, optimized) if rep is not None else ""})
        finally:
            stop_servers(servers.values())
    return rows


def to_markdown(rows: list[dict]) -> str:
    lines = ["| model | configuration | p50 ms | × TFLite 1 thread | delegated nodes | output |",
             "|---|---|---:|---:|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['config']} | {r['p50_ms']:.1f} | {r['ratio']:.2f} | {r['delegated']} | "
                     f"{r['exact']} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(to_markdown(measure(progress=lambda s: print(s, file=sys.stderr, flush=True))))
