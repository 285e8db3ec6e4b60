"""Where a delegated invoke's time goes: the same compiled model run in-process and through the
service, configurations interleaved round by round in one process (``python -m bench.delegate_gap``;
not part of ``make bench``).

Rows per model: hal in-process (``hal.executor.execute``; and ``PreparedModel.bind``, the bound
path a local burst serves with, its per-operation timings included); a plain client's local burst
(``service.client``), whose replies carry the service's time in the driver (from the request seen
to the reply written), so the burst's wall time minus it is the transport (input and output copies,
the two doorbells, the client's Python); the delegate in LiteRT, which adds TFLite's ``set_tensor``
copy and its kernel call to that; LiteRT's own CPU path for scale. The services are started as the
quantized and float benches start theirs (``--threads 1``). Percentiles, not means: on a shared
machine a blocked side's wake-up now and then waits for a CPU, a tail the in-process rows lack.
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np

from bench.baselines import anchor, time_interleaved
from bench.rpc_roundtrip import start_server, stop_servers
from delegate import load_delegate
from delegate.mapping import convert_partition
from delegate.runtime import Interpreter
from delegate.tfl import read_model
from hal import backends
from hal.compiler import compile_model
from hal.executor import execute
from hal.types import ExecutionPreference, Priority
from nnhal.examples import efficientnet_b0, mobilenet_v2
from service.client import Client
from service.execution import PreparedModel

ORDERS = {"int8": "numba,reference", "float32": "onnxruntime,numba,reference"}
MODELS = [("MobileNetV2 224 int8", mobilenet_v2, np.int8), ("EfficientNet-B0 224 int8", efficientnet_b0, np.int8),
          ("MobileNetV2 224 f32", mobilenet_v2, np.float32)]
BURST = "local burst (plain client)"


def _input(shape, dtype) -> np.ndarray:
    rng = np.random.default_rng(0)
    if dtype == np.float32:
        return rng.standard_normal(shape).astype(np.float32)
    return rng.integers(np.iinfo(dtype).min, np.iinfo(dtype).max + 1, shape).astype(dtype)


def _interpreter(path: str, x: np.ndarray, **kw):
    it = Interpreter(model_path=path, num_threads=1, **kw)
    it.allocate_tensors()
    index = it.get_input_details()[0]["index"]

    def run():
        it.set_tensor(index, x)
        it.invoke()
    return run


def measure_model(build, dtype, address: str, folder: str, rounds: int, per_round: int) -> dict[str, list[float]]:
    """Seconds per invoke of each configuration, and the service's in-driver seconds of each burst
    invoke (key ``service in-driver``, in the burst's order)."""
    data = build(dtype)
    path = str(Path(folder) / "m.tflite")
    Path(path).write_bytes(data)
    model = convert_partition(read_model(data)).model
    order = ORDERS["float32" if dtype == np.float32 else "int8"]
    compiled = compile_model(model, backend_order=order.split(","))
    x = _input(compiled.input_info(0).shape, dtype)
    local = PreparedModel("in-process", compiled, ExecutionPreference.FAST_SINGLE_ANSWER, Priority.MEDIUM)
    bound = local.bind([x.copy()], [np.empty(shape, t) for shape, t in local.output_slots()])
    in_driver: list[float] = []
    with Client.connect(address) as client:
        remote = client.prepare_model(model)
        burst = remote.local_burst()

        def burst_run():
            in_driver.append(burst.execute([x], measure_timing=True).timing.time_in_driver_ns * 1e-9)
        configs = {anchor(1): _interpreter(path, x), "hal execute (in-process)": lambda: execute(compiled, [x]),
                   "hal bound (in-process, the service's path)": lambda: bound(None, 0), BURST: burst_run,
                   "delegate (LiteRT)": _interpreter(path, x, experimental_delegates=[
                       load_delegate(address, max_delegated_partitions=0)])}
        for run in configs.values():
            run()  # warm-up
        in_driver.clear()
        times = time_interleaved(configs, lambda run: run(), rounds, per_round)
        burst.close()
        remote.release()
    times["service in-driver"] = in_driver
    return times


def to_markdown(label: str, times: dict[str, list[float]]) -> str:
    q = lambda v, p: 1e3 * float(np.percentile(v, p))  # noqa: E731
    lines = [f"### {label}", "", "| configuration | p10 ms | p50 ms |", "|---|---:|---:|"]
    lines += [f"| {k} | {q(v, 10):.3f} | {q(v, 50):.3f} |" for k, v in times.items()]
    transport = np.subtract(times[BURST], times["service in-driver"])
    lines.append(f"| transport (burst wall − in-driver, per invoke) | {q(transport, 10):.3f} | "
                 f"{q(transport, 50):.3f} |")
    return "\n".join(lines)


def main(rounds: int = 10, per_round: int = 5) -> int:
    backends.ensure_loaded()
    backends.set_compute_threads(1)  # as the services' --threads 1
    with tempfile.TemporaryDirectory() as d:
        socks = {kind: str(Path(d) / f"{kind}.sock") for kind in ORDERS}
        servers = [start_server(socks[kind], "--backend", order, "--no-cache", "--threads", "1")
                   for kind, order in ORDERS.items()]
        try:
            for label, build, dtype in MODELS:
                kind = "float32" if dtype == np.float32 else "int8"
                times = measure_model(build, dtype, f"unix:{socks[kind]}", d, rounds, per_round)
                print(to_markdown(label, times) + "\n", flush=True)
        finally:
            stop_servers(servers)
    return 0


if __name__ == "__main__":
    sys.exit(main(*(int(a) for a in sys.argv[1:3])))
