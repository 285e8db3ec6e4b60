"""Float32 whole models through the delegate: the onnxruntime backend vs the reference backend vs
TFLite's XNNPACK, measured in one run, configurations interleaved round by round.

Models are built by the project (random weights): MobileNetV2 and EfficientNet-B0 at 224x224 and
a BlazeFace-style detector at 128x128, float32. Rows: TFLite's default CPU path (XNNPACK) with 1
and 2 threads; the delegate on a service whose backend preference is ``onnxruntime,reference``
(``--threads 1``: one intra-op thread, as TFLite's 1-thread row) and on one restricted to
``reference``. Accuracy: the largest |difference| from TFLite's reference kernels (BUILTIN_REF) over
every output, divided by that output's largest magnitude (the "output scale"). Ready: seconds from
``Interpreter(...)`` to the end of the first ``invoke()`` — TFLite alone, and with the delegate on a
cold compilation cache (a new token: prepareModel) and a warm one (prepareModelFromCache).
"""
from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.quantized_models import time_interleaved
from bench.rpc_roundtrip import start_server, stop_servers
from delegate import load_delegate
from delegate.runtime import Interpreter, OpResolverType
from nnhal.examples import blazeface_like, efficientnet_b0, mobilenet_v2

MODELS = [("MobileNetV2 224 f32", lambda: mobilenet_v2(np.float32), 224),
          ("EfficientNet-B0 224 f32", lambda: efficientnet_b0(np.float32), 224),
          ("BlazeFace-style 128 f32", blazeface_like, 128)]
SERVERS = (("onnxruntime", "onnxruntime,reference"), ("reference", "reference"))


def _outputs(it, x) -> list[np.ndarray]:
    it.set_tensor(it.get_input_details()[0]["index"], x)
    it.invoke()
    return [it.get_tensor(o["index"]).copy() for o in it.get_output_details()]


def _scaled_error(got: list[np.ndarray], want: list[np.ndarray]) -> float:
    return max(float(np.abs(g.astype(np.float64) - w).max() / max(np.abs(w).max(), 1e-30))
               for g, w in zip(got, want))


def _ready_s(path: str, address: str | None, x, token: bytes = b"") -> float:
    t = time.perf_counter()
    delegates = [load_delegate(address, cache_token=token)] if address else []
    it = Interpreter(model_path=path, num_threads=1, experimental_delegates=delegates)
    it.allocate_tensors()
    _outputs(it, x)
    return time.perf_counter() - t


def measure(rounds: int = 5, per_round: int = 3, progress=None) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory() as d:
        servers = {name: start_server(str(Path(d) / f"{name}.sock"), "--backend", order, "--threads", "1")
                   for name, order in SERVERS}
        address = {name: f"unix:{Path(d) / f'{name}.sock'}" for name in servers}
        try:
            for label, build, size in MODELS:
                if progress:
                    progress(label)
                path = str(Path(d) / "m.tflite")
                Path(path).write_bytes(build())
                x = np.random.default_rng(0).uniform(-1, 1, (1, size, size, 3)).astype(np.float32)
                ref = Interpreter(model_path=path, experimental_op_resolver_type=OpResolverType.BUILTIN_REF)
                ref.allocate_tensors()
                want = _outputs(ref, x)
                configs = {"TFLite 1 thread": Interpreter(model_path=path, num_threads=1),
                           "TFLite 2 threads": Interpreter(model_path=path, num_threads=2)}
                delegates = {}
                for name in servers:
                    dl = load_delegate(address[name], max_delegated_partitions=0)
                    delegates[f"nnhal ({name} backend)"] = dl
                    configs[f"nnhal ({name} backend)"] = Interpreter(model_path=path, num_threads=1,
                                                                     experimental_delegates=[dl])
                for it in configs.values():
                    it.allocate_tensors()
                    _outputs(it, x)  # warm-up
                times = time_interleaved(configs, lambda it, x=x: _outputs(it, x), rounds, per_round)
                base = statistics.median(times["TFLite 1 thread"])
                for k, it in configs.items():
                    rep = delegates[k].report if k in delegates else None
                    rows.append({"model": label, "config": k, "p50_ms": 1e3 * statistics.median(times[k]),
                                 "ratio": statistics.median(times[k]) / base,
                                 "delegated": "" if rep is None else f"{rep.delegated}/{len(rep.nodes)}",
                                 "error": _scaled_error(_outputs(it, x), want)})
                token = f"bench-{time.time_ns()}".encode()
                tflite = statistics.median(_ready_s(path, None, x) for _ in range(3))
                cold = _ready_s(path, address["onnxruntime"], x, token)
                warm = statistics.median(_ready_s(path, address["onnxruntime"], x, token) for _ in range(3))
                rows.append({"model": label, "ready_ms": (1e3 * tflite, 1e3 * cold, 1e3 * warm)})
        finally:
            stop_servers(servers.values())
    return rows


def to_markdown(rows: list[dict]) -> str:
    lines = ["| model | configuration | p50 ms | × TFLite 1 thread | delegated nodes | max error / output scale |",
             "|---|---|---:|---:|---|---:|"]
    ready = []
    for r in rows:
        if "ready_ms" in r:
            ready.append(r)
            continue
        lines.append(f"| {r['model']} | {r['config']} | {r['p50_ms']:.2f} | {r['ratio']:.2f} | {r['delegated']} | "
                     f"{r['error']:.1e} |")
    lines += ["", "Interpreter ready (construct, allocate_tensors, first invoke), ms:", "",
              "| model | TFLite alone | nnhal onnxruntime, cold cache | warm cache | warm × TFLite |",
              "|---|---:|---:|---:|---:|"]
    for r in ready:
        tflite, cold, warm = r["ready_ms"]
        lines.append(f"| {r['model']} | {tflite:.1f} | {cold:.1f} | {warm:.1f} | {warm / tflite:.2f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(to_markdown(measure(progress=lambda s: print(s, file=sys.stderr, flush=True))))
