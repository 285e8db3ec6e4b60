"""tflite-runtime 2.14's CPU timings, measured beside LiteRT's in the same `make bench` run.

Why a second process: tflite-runtime 2.14 is built for numpy 1 and LiteRT 2.3 (the bench's own
runtime) for numpy 2; the two cannot share a process. The bench runs this file with the Python of
.venv-tflite-runtime (`make setup-tflite-runtime`); run there, it imports only numpy and
tflite_runtime, so what it times is tflite-runtime alone: ``Interpreter(num_threads=T)`` with its
default op resolver (XNNPACK for float, its own kernels for 8-bit), as the bench's LiteRT rows.

    .venv-tflite-runtime/bin/python bench/tflite_runtime_baseline.py [--threads 1] [--runs 20]
        MODEL.tflite[=IN0.npy,IN1.npy] ...

prints one JSON object: the runtime, and per model allocate_ms (construct + allocate_tensors),
first_invoke_ms and ready_ms (their sum; medians of 3 fresh Interpreters), p50_ms and mean_ms of
``--runs`` invokes after one warm-up, or error. Inputs not given are zeros. With ``--serve`` instead of ``--runs`` it
prints that object without timings, then answers each stdin line ``K N`` with the seconds of N
invokes of model K (a JSON list): the bench interleaves them with its own configurations.

Imported (the bench's side, the ``Baseline`` worker and ``one_shot``), it imports no runtime.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
#: The Python of the second venv; absent until `make setup-tflite-runtime`.
PYTHON = ROOT / ".venv-tflite-runtime" / "bin" / "python"
NOT_MEASURED = "not measured: make setup-tflite-runtime"
#: The runtime's name in rows when it could not be asked its version.
LABEL = "tflite-runtime 2.14"


# ---- the bench's side (LiteRT's process) ----------------------------------------------------------

def available() -> bool:
    return PYTHON.exists()


def _model_args(models: list[tuple[str, list[np.ndarray]]], folder: str) -> list[str]:
    """``MODEL=IN0.npy,...`` arguments, the inputs saved as .npy files in ``folder``."""
    args = []
    for k, (path, inputs) in enumerate(models):
        files = []
        for j, x in enumerate(inputs):
            f = str(Path(folder) / f"tflrt-in-{k}-{j}.npy")
            np.save(f, np.asarray(x))
            files.append(f)
        args.append(path + ("=" + ",".join(files) if files else ""))
    return args


class Baseline:
    """A worker process of .venv-tflite-runtime holding one Interpreter per model (``--serve``)."""

    def __init__(self, models: list[tuple[str, list[np.ndarray]]], folder: str, threads: int = 1):
        self.proc = subprocess.Popen([str(PYTHON), __file__, "--serve", "--threads", str(threads),
                                      *_model_args(models, folder)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        header = self._reply()
        self.label: str = header["runtime"]
        self.models: list[dict] = header["models"]

    def _reply(self):
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{PYTHON} {Path(__file__).name} exited with {self.proc.wait()}")
        return json.loads(line)

    def error(self, k: int) -> str | None:
        return self.models[k].get("error")

    def time(self, k: int, n: int) -> list[float]:
        """Seconds of each of ``n`` invokes of model ``k``, timed in the worker."""
        self.proc.stdin.write(f"{k} {n}\n")
        self.proc.stdin.flush()
        return self._reply()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(30)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def start(models: list[tuple[str, list[np.ndarray]]], folder: str, threads: int = 1) -> Baseline | None:
    """The worker, or None without .venv-tflite-runtime (the rows then say ``NOT_MEASURED``)."""
    return Baseline(models, folder, threads) if available() else None


def one_shot(models: list[tuple[str, list[np.ndarray]]], folder: str, runs: int, threads: int = 1) -> dict | None:
    """This file's JSON for ``models`` (``--runs``), or None without .venv-tflite-runtime; a worker
    that fails gives every model its last line of stderr as the error."""
    if not available():
        return None
    out = subprocess.run([str(PYTHON), __file__, "--runs", str(runs), "--threads", str(threads),
                          *_model_args(models, folder)], capture_output=True, text=True)
    if out.returncode != 0:
        why = (out.stderr.strip().splitlines() or [f"exit status {out.returncode}"])[-1]
        return {"runtime": LABEL, "models": [{"error": why} for _ in models]}
    return json.loads(out.stdout)


# ---- the worker (tflite-runtime's process) --------------------------------------------------------

def _load(spec: str, threads: int, Interpreter) -> tuple[object, list, dict]:
    path, _, files = spec.partition("=")
    inputs = [np.load(f) for f in files.split(",")] if files else None
    allocate, first = [], []
    for _ in range(3):
        t = time.perf_counter()
        it = Interpreter(model_path=path, num_threads=threads)
        it.allocate_tensors()
        allocate.append(time.perf_counter() - t)
        details = it.get_input_details()
        xs = inputs if inputs is not None else [np.zeros(d["shape"], d["dtype"]) for d in details]
        t = time.perf_counter()
        _invoke(it, details, xs)
        first.append(time.perf_counter() - t)
    ready = [a + f for a, f in zip(allocate, first)]
    return it, xs, {"allocate_ms": 1e3 * statistics.median(allocate), "first_invoke_ms": 1e3 * statistics.median(first),
                    "ready_ms": 1e3 * statistics.median(ready)}


def _invoke(it, details, xs) -> None:
    for d, x in zip(details, xs):
        it.set_tensor(d["index"], x)
    it.invoke()


def _times(it, xs, n: int) -> list[float]:
    details = it.get_input_details()
    out = []
    for _ in range(n):
        t = time.perf_counter()
        _invoke(it, details, xs)
        out.append(time.perf_counter() - t)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("models", nargs="+", metavar="MODEL[=IN.npy,...]")
    p.add_argument("--threads", type=int, default=1)
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--runs", type=int)
    mode.add_argument("--serve", action="store_true")
    args = p.parse_args(argv)
    import tflite_runtime
    from tflite_runtime.interpreter import Interpreter
    loaded, models = [], []
    for spec in args.models:
        try:
            it, xs, info = _load(spec, args.threads, Interpreter)
        except Exception as e:  # a model this runtime refuses: its rows say why, the others are measured
            it, xs, info = None, None, {"error": f"{type(e).__name__}: {e}".splitlines()[0]}
        loaded.append((it, xs))
        if it is not None and args.runs:
            _times(it, xs, 1)  # warm-up
            ts = _times(it, xs, args.runs)
            info.update(p50_ms=1e3 * statistics.median(ts), mean_ms=1e3 * statistics.fmean(ts))
        models.append(info)
    print(json.dumps({"runtime": f"tflite-runtime {tflite_runtime.__version__}", "threads": args.threads,
                      "models": models}), flush=True)
    if args.serve:
        for line in sys.stdin:
            k, n = (int(v) for v in line.split())
            it, xs = loaded[k]
            print(json.dumps(_times(it, xs, n)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
