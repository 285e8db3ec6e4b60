"""One soak client process (started by bench.soak): TFLite Interpreters with the nnhal delegate,
invoked without pause while the service is killed, stopped and starved of its cache; every
output is checked against TFLite's own kernels.

Protocol with the orchestrator: one JSON line {"ready": ...} on stdout once the models and their
expected outputs are built, then it waits for "go <seconds>" on stdin, runs that long, and prints a
JSON status line at most every STATUS_INTERVAL_S (the orchestrator's progress and hang signal: a
client blocked in invoke prints nothing) and a last one with "done". Interpreters are freed and
re-created every --recreate-every executions (prepare, prepareModelFromCache and release paths, not
only execute); one creation in --fresh-token-every uses a new cache token (a compilation and a
cache store, which fail while the cache folder is read-only).
"""
from __future__ import annotations

import argparse
import faulthandler
import gc
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path

import numpy as np

import hal
from delegate import load_delegate
from delegate.mapping import convert_partition
from delegate.runtime import Interpreter, OpResolverType
from delegate.tfl import read_model
from nnhal.examples import mobilenet_like

STATUS_INTERVAL_S = 0.5
#: Inputs per model, cycled; their expected outputs are computed once, before the run.
INPUTS_PER_MODEL = 8
#: Wrong outputs saved as reproducers (inputs, got, want) per client; the rest are only counted.
MAX_DUMPS = 5
#: Float outputs: the largest |difference| allowed, relative to the output's largest magnitude.
FLOAT_TOLERANCE = 1e-4

MODELS = {"float32": lambda: mobilenet_like(np.float32), "int8": lambda: mobilenet_like(np.int8)}


class ModelCase:
    """A model, inputs, and what TFLite computes for them: its reference kernels (what nnhal's
    kernels match bit for bit) and its default kernels (what an Interpreter runs when nothing was
    delegated, XNNPACK included: under LiteRT it runs int8 too, and rounds quantized results
    differently from the reference kernels)."""

    def __init__(self, name: str, seed: int):
        self.name = name
        self.content = MODELS[name]()
        rng = np.random.default_rng(seed)
        ref = self._cpu(OpResolverType.BUILTIN_REF)
        self.inputs = [[_random(rng, d) for d in ref.get_input_details()] for _ in range(INPUTS_PER_MODEL)]
        self.want_ref = [_run(ref, xs) for xs in self.inputs]
        cpu = self._cpu(OpResolverType.AUTO)  # LiteRT's default: XNNPACK, 8-bit included
        self.want_cpu = [_run(cpu, xs) for xs in self.inputs]
        self._warm_fallback()

    def _warm_fallback(self) -> None:
        """Run the model once in-process on hal, as the delegate's fallback does: loading the
        backends (~150 MB: numba, onnxruntime) and their first session happen once per process,
        before the run, and do not count as RSS growth."""
        graph = read_model(self.content)
        part = convert_partition(graph)
        by_tensor = dict(zip(graph.inputs, self.inputs[0]))
        hal.execute(hal.compile_model(part.model), [by_tensor[t] for t in part.input_tensors])

    def _cpu(self, kind) -> Interpreter:
        it = Interpreter(model_content=self.content, experimental_op_resolver_type=kind)
        it.allocate_tensors()
        return it


def _random(rng, detail) -> np.ndarray:
    dtype, shape = np.dtype(detail["dtype"]), detail["shape"]
    if dtype.kind == "f":
        return rng.uniform(-1, 1, shape).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, shape, endpoint=True).astype(dtype)


def _run(it: Interpreter, xs) -> list[np.ndarray]:
    for d, x in zip(it.get_input_details(), xs):
        it.set_tensor(d["index"], x)
    it.invoke()
    return [it.get_tensor(d["index"]).copy() for d in it.get_output_details()]


def mismatch(got: list[np.ndarray], want: list[np.ndarray]) -> str | None:
    """Why ``got`` is not TFLite's answer, or None: quantized outputs bit-exact, float outputs within
    FLOAT_TOLERANCE of the output's scale (its largest magnitude)."""
    if len(got) != len(want):
        return f"{len(got)} outputs, expected {len(want)}"
    for i, (g, w) in enumerate(zip(got, want)):
        if g.dtype != w.dtype or g.shape != w.shape:
            return f"output {i}: {g.dtype}{list(g.shape)}, expected {w.dtype}{list(w.shape)}"
        if w.dtype.kind == "f":
            scale = max(float(np.abs(w).max()), 1e-30)
            err = float(np.abs(g.astype(np.float64) - w).max()) if g.size else 0.0
            if not err <= FLOAT_TOLERANCE * scale:  # also catches NaN
                return f"output {i}: max |difference| {err:.3g} > {FLOAT_TOLERANCE:g} x scale {scale:.3g}"
        elif not np.array_equal(g, w):
            n = int(np.count_nonzero(g != w))
            return f"output {i}: {n} of {w.size} values differ (quantized: bit-exact expected)"
    return None


class Live:
    """One Interpreter with its own delegate (as an app creates them)."""

    def __init__(self, case: ModelCase, address: str, token: bytes):
        self.case = case
        self.delegate = load_delegate(address, cache_token=token)
        self.it = Interpreter(model_content=case.content, experimental_delegates=[self.delegate])
        self.it.allocate_tensors()
        self.kernels = list(self.delegate.impl.kernels)

    def fallbacks(self) -> int:
        return sum(k.fallbacks for k in self.kernels)


class SoakClient:
    def __init__(self, args):
        self.args = args
        self.address = args.address
        self.dumps = Path(args.dump_dir)
        self.cases = [ModelCase(name, args.seed * 100 + i) for i, name in enumerate(args.models.split(","))]
        self.stats = {"executions": 0, "wrong": 0, "errors": 0, "on_service": 0, "fallback": 0, "cpu_only": 0,
                      "created": 0, "freed": 0, "create_failed": 0, "fresh_tokens": 0}
        self.live: list[Live] = []
        self.creations = 0
        self.last_error: str | None = None

    def create(self, case: ModelCase) -> None:
        self.creations += 1
        token = f"soak-{case.name}".encode()
        if self.args.fresh_token_every and self.creations % self.args.fresh_token_every == 0:
            token += f"-{os.getpid()}-{self.creations}".encode()
            self.stats["fresh_tokens"] += 1
        try:
            self.live.append(Live(case, self.address, token))
            self.stats["created"] += 1
        except Exception as e:  # noqa: BLE001 - counted and reported: an app would see this failure
            self.stats["create_failed"] += 1
            self._error(f"creating an Interpreter ({case.name}): {e!r}")

    def recreate(self) -> None:
        """Free the oldest Interpreter (its delegate kernels release their prepared models) and
        create one for the next model."""
        if self.live:
            old = self.live.pop(0)
            del old
            gc.collect()  # ctypes callbacks form cycles: free the kernels now, not at some later GC
            self.stats["freed"] += 1
        self.create(self.cases[self.creations % len(self.cases)])

    def _error(self, message: str) -> None:
        self.stats["errors"] += 1
        self.last_error = message.splitlines()[0][:300]
        print(f"soak client error: {self.last_error}", file=sys.stderr, flush=True)

    def execute_once(self, live: Live, k: int) -> None:
        case = live.case
        before = live.fallbacks()
        try:
            got = _run(live.it, case.inputs[k])
        except Exception as e:  # noqa: BLE001 - an invoke must never fail: count it
            self._error(f"invoke ({case.name}): {e!r}")
            return
        self.stats["executions"] += 1
        if not live.kernels:
            self.stats["cpu_only"] += 1
            want = case.want_cpu[k]
        else:
            self.stats["fallback" if live.fallbacks() > before else "on_service"] += 1
            want = case.want_ref[k]
        why = mismatch(got, want)
        if why is not None:
            self.stats["wrong"] += 1
            self.last_error = f"wrong output ({case.name}, input {k}): {why}"
            print(f"soak client: {self.last_error}", file=sys.stderr, flush=True)
            if self.stats["wrong"] <= MAX_DUMPS:
                self._dump(case, k, got, want, why)

    def _dump(self, case: ModelCase, k: int, got, want, why: str) -> None:
        """A reproducer: the model, the input, what came back and what TFLite computes."""
        base = self.dumps / f"wrong-{os.getpid()}-{self.stats['wrong']}"
        base.with_suffix(".tflite").write_bytes(case.content)
        np.savez(base.with_suffix(".npz"), why=why, model=case.name,
                 **{f"input{i}": x for i, x in enumerate(case.inputs[k])},
                 **{f"got{i}": g for i, g in enumerate(got)}, **{f"want{i}": w for i, w in enumerate(want)})

    def status(self, **extra) -> None:
        print(json.dumps({"pid": os.getpid(), **self.stats, "live": len(self.live),
                          "last_error": self.last_error, **extra}), flush=True)

    def run(self, seconds: float) -> None:
        for case in self.cases:
            self.create(case)
        end = time.monotonic() + seconds
        next_status = 0.0
        n = 0
        while True:
            now = time.monotonic()
            if now >= end:
                break
            if now >= next_status:
                self.status()
                next_status = now + STATUS_INTERVAL_S
            if n and n % self.args.recreate_every == 0 or not self.live:
                self.recreate()
            if self.live:
                self.execute_once(self.live[n % len(self.live)], (n // len(self.live)) % INPUTS_PER_MODEL)
            else:
                time.sleep(0.1)  # every creation failed: retry, without spinning
            n += 1
        self.live.clear()
        gc.collect()
        self.status(done=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--address", required=True, help="unix:PATH of the nnhal service")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--models", default="float32,int8", help=f"comma-separated, of {', '.join(MODELS)}")
    p.add_argument("--recreate-every", type=int, default=100, help="executions between Interpreter re-creations")
    p.add_argument("--fresh-token-every", type=int, default=10, help="1 creation in N uses a new cache token")
    p.add_argument("--dump-dir", default=".", help="where wrong outputs are saved as reproducers")
    args = p.parse_args(argv)
    faulthandler.enable()  # a crash leaves its Python stacks in the client's log
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the orchestrator asks for them on a hang
    # The delegate logs once per delegate when the service is unreachable: expected here, and
    # counted from the kernels instead.
    logging.getLogger("nnhal.delegate").addFilter(lambda r: not r.getMessage().startswith("nnhal delegate:"))
    client = SoakClient(args)
    print(json.dumps({"ready": True, "pid": os.getpid()}), flush=True)
    line = sys.stdin.readline().split()
    if len(line) != 2 or line[0] != "go":
        return 2
    client.run(float(line[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
