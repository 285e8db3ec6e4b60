"""prepareModel vs prepareModelFromCache on one model, timed in one run through the service."""
from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

from bench.rpc_roundtrip import start_server
from delegate.mapping import convert_partition
from delegate.tfl import read_model
from service.client import Client
from service.token import model_token


def measure(tflite_model: bytes, repeats: int = 3) -> dict:
    graph = read_model(tflite_model)
    model = convert_partition(graph).model
    params = sum(int(t.data.size) for t in graph.tensors if t.data is not None)
    compile_s, cache_s = [], []
    with tempfile.TemporaryDirectory() as d:
        sock = str(Path(d) / "s.sock")
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
        finally:
            proc.terminate()
            proc.wait(30)
    return {"parameters": params, "operations": len(model.main.operations),
            "compile_ms": 1e3 * statistics.median(compile_s), "from_cache_ms": 1e3 * statistics.median(cache_s)}


def to_markdown(r: dict) -> str:
    return ("| parameters | NNAPI operations | prepareModel ms (median) | prepareModelFromCache ms | ratio |\n"
            "|---:|---:|---:|---:|---:|\n"
            f"| {r['parameters']:,} | {r['operations']} | {r['compile_ms']:.1f} | {r['from_cache_ms']:.1f} | "
            f"{r['compile_ms'] / r['from_cache_ms']:.1f}x |\n\n"
            "Both include the gRPC call and, for prepareModel, sending the weights (shared memory).")
