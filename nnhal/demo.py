"""`make run` / `nnhal demo`: the whole path on bundled example models.

Builds a MobileNet-like float32 model and its int8 version with the project's
builder, connects to the service (the per-user socket, or an embedded one it
starts), and prints inference_diff and the benchmark summary for both.
"""
from __future__ import annotations

import os
import sys
import tempfile

import numpy as np

from nnhal.benchmark import benchmark, format_result
from nnhal.examples import mobilenet_like
from nnhal.inference_diff import evaluate, format_metrics


def main(out_dir: str | None = None, runs: int = 20) -> int:
    out_dir = out_dir or os.path.join(tempfile.gettempdir(), f"nnhal-examples-{os.getuid()}")
    os.makedirs(out_dir, exist_ok=True)
    for label, dtype in (("float32", np.float32), ("int8", np.int8)):
        path = os.path.join(out_dir, f"mobilenet_like_{label}.tflite")
        with open(path, "wb") as f:
            f.write(mobilenet_like(dtype, input_size=64, width=16))
        print(f"=== {os.path.basename(path)} ===")
        if dtype == np.int8:
            # The oracle for quantized ops: TFLite's reference kernels (bit-exact). TFLite's optimized
            # int8 kernels round some ops differently, so the default CPU run differs by a few steps.
            print("--- inference_diff (reference: TFLite's reference kernels, both sides) ---")
            print(format_metrics(evaluate(path, num_runs=runs, progress=True, reference_kernels=True)))
            print("--- inference_diff (reference: TFLite CPU, optimized kernels) ---")
        else:
            print("--- inference_diff (reference: TFLite CPU) ---")
        print(format_metrics(evaluate(path, num_runs=runs, progress=True)))
        print("--- benchmark ---")
        print(format_result(benchmark(path, runs=runs, progress=True)).split("\n\nrun order")[0])
        print(flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
