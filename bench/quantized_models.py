"""Quantized whole models through the delegate: the numba backend vs the reference backend vs
the CPU runtimes' own 8-bit kernels, measured in one run, configurations interleaved round by round (each
one's first invokes of a round untimed — at least one and at least 30 ms of them — after a 10 ms pause,
then at least 5 ms of timed ones: the figures are of back-to-back invokes).

Models are built by the project (random weights): MobileNetV2, EfficientNet-B0 and MobileNetV3-small
(nnhal.examples_mobilenet_v3: activations calibrated on its float twin) at 224x224, a
BlazeFace-style detector at 128x128 (two outputs) and a small CNN classifier at 128x128
(nnhal.examples_quantized), each int8 (per-channel filters, int8 I/O) and uint8 (per-tensor, uint8
I/O). A model's outputs are compared together (flattened, concatenated). Rows: LiteRT's default CPU
path (XNNPACK, which runs 8-bit models too) with 1 and 2 threads; tflite-runtime 2.14 with 1
thread (its default resolver: its own 8-bit kernels, not XNNPACK); the delegate (in LiteRT) on a
service whose backend preference is ``numba,reference``, and on one restricted to ``reference``.
Ratios are against LiteRT 1 thread and tflite-runtime 1 thread, the faster one's in bold.
Bit-exactness is against LiteRT's reference kernels (BUILTIN_REF). Its 8-bit SOFTMAX over 1000
classes is wrong in a corner (../shared/notes/tflite-oracle.md), and in LiteRT 2.3 it aborts the
process on EfficientNet-B0's logits (both types; REF therefore runs in a child process); an output
that differs from REF, or has none, is compared with LiteRT's builtin kernels
(BUILTIN_WITHOUT_DEFAULT_DELEGATES) too. Those are not REF's either: on EfficientNet-B0 int8
without its SOFTMAX, nnhal's logits equal REF's and LiteRT's builtin kernels' do not (2026-11-27);
LiteRT's XNNPACK rows differ from REF by a few steps.
"""
from __future__ import annotations

import subprocess
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
from delegate.runtime import Interpreter, OpResolverType
from nnhal.examples import efficientnet_b0, mobilenet_v2
from nnhal.examples_mobilenet_v3 import mobilenet_v3_small
from nnhal.examples_quantized import blazeface_quantized, small_cnn

MODELS = [("MobileNetV2 224 int8", mobilenet_v2, np.int8), ("MobileNetV2 224 uint8", mobilenet_v2, np.uint8),
          ("EfficientNet-B0 224 int8", efficientnet_b0, np.int8),
          ("EfficientNet-B0 224 uint8", efficientnet_b0, np.uint8),
          ("MobileNetV3-small 224 int8", mobilenet_v3_small, np.int8),
          ("MobileNetV3-small 224 uint8", mobilenet_v3_small, np.uint8),
          ("BlazeFace-style 128 int8", blazeface_quantized, np.int8),
          ("BlazeFace-style 128 uint8", blazeface_quantized, np.uint8),
          ("small CNN 128 int8", small_cnn, np.int8), ("small CNN 128 uint8", small_cnn, np.uint8)]


def _run(it, x) -> np.ndarray:
    """Every output, flattened and concatenated (one array to compare)."""
    it.set_tensor(it.get_input_details()[0]["index"], x)
    it.invoke()
    return np.concatenate([it.get_tensor(o["index"]).reshape(-1) for o in it.get_output_details()])


#: A child process's BUILTIN_REF output: argv model, input .npy, output .npy.
_REFERENCE = """import sys, numpy as np
from delegate.runtime import Interpreter, OpResolverType
it = Interpreter(model_path=sys.argv[1], experimental_op_resolver_type=OpResolverType.BUILTIN_REF)
it.allocate_tensors()
it.set_tensor(it.get_input_details()[0]["index"], np.load(sys.argv[2]))
it.invoke()
np.save(sys.argv[3], np.concatenate([it.get_tensor(o["index"]).reshape(-1) for o in it.get_output_details()]))
"""


def _reference(path: Path, x: np.ndarray) -> np.ndarray | None:
    """LiteRT's BUILTIN_REF output for ``x``, or None where REF aborts (its process, not ours)."""
    xin, out = path.with_suffix(".in.npy"), path.with_suffix(".ref.npy")
    np.save(xin, x)
    done = subprocess.run([sys.executable, "-c", _REFERENCE, str(path), str(xin), str(out)],
                          capture_output=True, timeout=600)
    return np.load(out) if done.returncode == 0 else None


def _exactness(out: np.ndarray, ref: np.ndarray | None, optimized: np.ndarray) -> str:
    diff = lambda want: int(np.abs(out.astype(int) - want.astype(int)).max())  # noqa: E731
    if ref is None:
        return ("REF aborts (its 1000-class 8-bit SOFTMAX); " +
                ("= LiteRT's builtin kernels" if np.array_equal(out, optimized) else
                 f"max |diff| vs LiteRT's builtin kernels {diff(optimized)}"))
    if np.array_equal(out, ref):
        return "bit-exact vs REF"
    if np.array_equal(out, optimized):
        return "= LiteRT's builtin kernels; ≠ REF (REF's 1000-class 8-bit SOFTMAX corner)"
    return f"DIFFERS: max |diff| vs REF {diff(ref)}"


def measure(rounds: int = 10, per_round: int = 3, progress=None) -> list[dict]:
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
                shape = tuple(Interpreter(model_path=str(path)).get_input_details()[0]["shape"])
                x = np.random.default_rng(0).integers(np.iinfo(dtype).min, np.iinfo(dtype).max + 1,
                                                      shape).astype(dtype)
                want = _reference(path, x)
                configs = {anchor(1): Interpreter(model_path=str(path), num_threads=1),
                           anchor(2): Interpreter(model_path=str(path), num_threads=2)}
                delegates = {}
                for name in servers:
                    dl = load_delegate(f"unix:{Path(d) / f'{name}.sock'}", max_delegated_partitions=0)
                    delegates[f"nnhal ({name} backend)"] = dl
                    configs[f"nnhal ({name} backend)"] = Interpreter(model_path=str(path), num_threads=1,
                                                                     experimental_delegates=[dl])
                for it in configs.values():
                    it.allocate_tensors()
                    _run(it, x)  # warm-up
                with beside(str(path), [x], d) as tflrt:
                    times = time_interleaved(configs, lambda it, x=x: _run(it, x), rounds, per_round, tflrt.remote,
                                             **PACING)
                builtin = Interpreter(model_path=str(path),
                                      experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
                builtin.allocate_tensors()
                optimized = _run(builtin, x).copy()
                figures = with_ratios(times, tflrt.config)
                order = [anchor(1), anchor(2), tflrt.config, *delegates]
                for k in order:
                    if k not in figures:
                        rows.append(not_measured_row(label, k, tflrt.why))
                        continue
                    rep = delegates[k].report if k in delegates else None
                    rows.append({"model": label, "config": k, **figures[k],
                                 "delegated": "" if rep is None else f"{rep.delegated}/{len(rep.nodes)}",
                                 "exact": "" if k not in configs else _exactness(_run(configs[k], x), want, optimized)})
        finally:
            stop_servers(servers.values())
    return rows


def to_markdown(rows: list[dict]) -> str:
    lines = [f"| model | configuration | p50 ms | × {anchor(1)} | × tflite-runtime 1 thread | delegated nodes | "
             "output |", "|---|---|---:|---:|---:|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['config']} | {p50_cell(r, 1)} | {ratio_cells(r)} | "
                     f"{r.get('delegated', '')} | {r.get('exact', '')} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(to_markdown(measure(progress=lambda s: print(s, file=sys.stderr, flush=True))))
