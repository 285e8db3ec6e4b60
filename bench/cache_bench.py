"""prepareModel vs prepareModelFromCache on one model, timed in one run through the service.

Two views of the same cache: the NNAPI calls themselves (what issue 5's goal is about), and what a
TFLite user waits for end to end (Interpreter + delegate + allocate_tensors, which also reads the
TFLite file, converts the partition and computes the token in both cases).
"""
from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path

from bench import tflite_runtime_baseline as tflrt
from bench.rpc_roundtrip import start_server
from delegate.mapping import convert_partition
from delegate.tfl import read_model
from service.client import Client
from service.token import model_token


def measure(tflite_model: bytes, repeats: int = 5) -> dict:
    graph = read_model(tflite_model)
    model = convert_partition(graph).model
    params = sum(int(t.data.size) for t in graph.tensors if t.data is not None)
    compile_s, cache_s, e2e_compile_s, e2e_cache_s, cpu_s = [], [], [], [], []
    with tempfile.TemporaryDirectory() as d:
        sock = str(Path(d) / "s.sock")
        model_file = os.path.join(d, "model.tflite")
        with open(model_file, "wb") as f:
            f.write(tflite_model)
        proc = start_server(sock)
        try:
            with Client.connect("unix:" + sock) as c:
                for r in range(repeats):
                    token = model_token(model, user_token=f"bench-{time.time_ns()}-{r}".encode())
                    t = time.perf_counter()
                    compiled = c.prepare_model(model, token=token)
                    compile_s.append(time.perf_counter() - t)
                    compiled.release()
                    t = time.perf_counter()
                    loaded = c.prepare_model_from_cache(model, token)
                    cache_s.append(time.perf_counter() - t)
                    loaded.release()
            for _ in range(repeats):
                user_token = os.urandom(16)
                e2e_compile_s.append(_interpreter_s(model_file, "unix:" + sock, user_token))
                e2e_cache_s.append(_interpreter_s(model_file, "unix:" + sock, user_token))
                cpu_s.append(_interpreter_s(model_file, None, b""))
        finally:
            proc.terminate()
            proc.wait(30)
        other = tflrt.one_shot([(model_file, [])], d, runs=0)
    other = None if other is None else {"runtime": other["runtime"], **other["models"][0]}
    ms = lambda xs: 1e3 * statistics.median(xs)  # noqa: E731
    return {"parameters": params, "operations": len(model.main.operations),
            "compile_ms": ms(compile_s), "from_cache_ms": ms(cache_s),
            "compile_all_ms": [1e3 * x for x in compile_s], "from_cache_all_ms": [1e3 * x for x in cache_s],
            "e2e_compile_ms": ms(e2e_compile_s), "e2e_cache_ms": ms(e2e_cache_s), "cpu_prepare_ms": ms(cpu_s),
            "tflrt": other}


def _interpreter_s(model_file: str, address: str | None, user_token: bytes) -> float:
    """Seconds until a LiteRT Interpreter (with the nnhal delegate, if ``address``) is ready to invoke."""
    from delegate import load_delegate
    from delegate.runtime import Interpreter
    t = time.perf_counter()
    delegates = [load_delegate(address, cache_token=user_token)] if address else []
    it = Interpreter(model_path=model_file, num_threads=1, experimental_delegates=delegates)
    it.allocate_tensors()
    if address:
        assert delegates[0].report.delegated == len(delegates[0].report.nodes), "not fully delegated"
    return time.perf_counter() - t


def to_markdown(r: dict) -> str:
    from delegate.runtime import label
    runs = lambda xs: ", ".join(f"{x:.1f}" for x in xs)  # noqa: E731
    other = r["tflrt"]
    beside = (f"{tflrt.LABEL}: {tflrt.NOT_MEASURED}" if other is None else
              f"{other['runtime']}: not measured, {other['error']}" if "error" in other else
              f"{other['runtime']}: {other['allocate_ms']:.1f} ms")
    return (
        "| path | parameters | NNAPI operations | prepareModel ms (median) | prepareModelFromCache ms | ratio |\n"
        "|---|---:|---:|---:|---:|---:|\n"
        f"| NNAPI calls (client → service) | {r['parameters']:,} | {r['operations']} | {r['compile_ms']:.1f} | "
        f"{r['from_cache_ms']:.1f} | {r['compile_ms'] / r['from_cache_ms']:.1f}x |\n"
        f"| {label()} Interpreter + nnhal delegate, ready to invoke | | | {r['e2e_compile_ms']:.1f} | "
        f"{r['e2e_cache_ms']:.1f} | {r['e2e_compile_ms'] / r['e2e_cache_ms']:.1f}x |\n\n"
        f"Each run: prepareModel {runs(r['compile_all_ms'])} ms; fromCache {runs(r['from_cache_all_ms'])} ms. "
        "prepareModel includes sending the weights (shared memory) and writing the entry (fsync'd); "
        "fromCache verifies every byte of it (HMAC, SHA-256 payload, BLAKE3 data; the service hashes a data "
        "file once, and the warm delegate row loads entries it verified before). The delegate rows also "
        "read the TFLite file, convert the partition and compute the token in both cases. For scale, "
        f"{label()} alone (1 thread) is ready to invoke in {r['cpu_prepare_ms']:.1f} ms ({beside}).\n\n"
        + ready_ratios(r))


def ready_ratios(r: dict) -> str:
    """Interpreter ready with the delegate, as a multiple of each CPU runtime's own ready (1 thread)."""
    from delegate.runtime import label
    other = r["tflrt"]
    other_ms = None if other is None or "error" in other else other["allocate_ms"]
    head = (f"| Interpreter ready (1 thread) | ms | × {label()} alone ({r['cpu_prepare_ms']:.1f} ms) | "
            f"× {tflrt.LABEL} alone ({'not measured' if other_ms is None else f'{other_ms:.1f} ms'}) |\n"
            "|---|---:|---:|---:|\n")
    rows = []
    for what, ms in (("with the delegate, cold cache (prepareModel)", r["e2e_compile_ms"]),
                     ("with the delegate, warm cache (prepareModelFromCache)", r["e2e_cache_ms"])):
        beside_ratio = "" if other_ms is None else f"{ms / other_ms:.1f}"
        rows.append(f"| {what} | {ms:.1f} | {ms / r['cpu_prepare_ms']:.1f} | {beside_ratio} |")
    return head + "\n".join(rows)
