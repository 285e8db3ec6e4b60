"""Round-trip cost of each execution path vs hal in-process, measured in one run.

A real `nnhal serve` process on a temporary unix socket; a 1-op model (ADD of two
[2,3] tensors) and a 224x224x3 float32 tensor model (ADD of a constant). Prints
a markdown table; overhead = path time - in-process hal time in the same run.
"""
from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import hal
from hal.model import ModelBuilder
from hal.types import OperandType as T
from hal.types import OperationType as O
from service.client import Client, answers


def one_op_model(shape):
    b = ModelBuilder()
    x = b.add_operand(T.TENSOR_FLOAT32, shape)
    z = b.add_constant(T.TENSOR_FLOAT32, np.zeros((1,), np.float32))
    y = b.add_operand(T.TENSOR_FLOAT32, shape)
    b.add_operation(O.ADD, [x, z, b.add_int32(0)], [y])
    b.identify_inputs_and_outputs([x], [y])
    return b.finish()


def timed(fn, n: int, warmup: int) -> list[float]:
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(n):
        t = time.perf_counter_ns()
        fn()
        out.append((time.perf_counter_ns() - t) / 1e3)
    return out


#: A service's first start after the sources changed compiles the numba kernels (2-3 minutes on a
#: 2-core machine) before it answers.
START_TIMEOUT_S = 300


def start_server(sock: str, *extra: str) -> subprocess.Popen:
    """`nnhal serve` on ``sock`` with a cache directory of its own next to it (never the user's
    cache; services with other backend preferences would reject each other's entries)."""
    cache = str(Path(sock).parent / f"cache-{Path(sock).stem}")
    proc = subprocess.Popen([sys.executable, "-m", "nnhal.cli", "serve", "--socket", sock, "--cache-dir", cache,
                             "--log-level", "warning", *extra], stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline and proc.poll() is None:
        if answers("unix:" + sock):
            return proc
        time.sleep(0.005)
    proc.kill()
    raise RuntimeError("server did not start")


def stop_servers(servers) -> None:
    for p in servers:
        p.terminate()
        p.wait(30)


def measure(n_small: int = 2000, n_large: int = 200) -> list[tuple[str, str, float, float]]:
    rows = []
    with tempfile.TemporaryDirectory() as d:
        sock = str(Path(d) / "s.sock")
        proc = start_server(sock)
        try:
            with Client.connect("unix:" + sock) as client:
                for label, shape, n in (("1-op [2,3]", (2, 3), n_small), ("224x224x3 f32", (1, 224, 224, 3), n_large)):
                    model = one_op_model(shape)
                    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
                    compiled = hal.compile_model(model)
                    pm = client.prepare_model(model)
                    paths = [("hal in-process", lambda c=compiled, x=x: hal.execute(c, [x]))]
                    if shape == (2, 3):  # this machine's floor for any gRPC call, for scale
                        paths.append(("gRPC trivial unary RPC (GetType, no model)", client.get_type))
                    paths.append(("gRPC unary Execute", lambda pm=pm, x=x: pm.execute([x])))
                    burst = pm.burst()
                    paths.append(("gRPC burst stream", lambda b=burst, x=x: b.execute([x])))
                    local = pm.local_burst()
                    paths.append(("shared-memory burst", lambda lb=local, x=x: lb.execute([x])))
                    for name, fn in paths:
                        t = timed(fn, n, warmup=max(20, n // 20))
                        rows.append((label, name, statistics.median(t), statistics.mean(t)))
                    burst.close()
                    local.close()
                    pm.release()
        finally:
            proc.terminate()
            proc.wait(30)
    return rows


def to_markdown(rows) -> str:
    base = {label: med for label, name, med, _ in rows if name == "hal in-process"}
    lines = ["| model | path | median µs | mean µs | overhead vs in-process (median µs) |",
             "|---|---|---:|---:|---:|"]
    for label, name, med, mean in rows:
        over = "" if name == "hal in-process" else f"{med - base[label]:.1f}"
        lines.append(f"| {label} | {name} | {med:.1f} | {mean:.1f} | {over} |")
    return "\n".join(lines)


def main() -> int:
    print("## RPC round trip (1 client, server in its own process)\n")
    print(to_markdown(measure()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
