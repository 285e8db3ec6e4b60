"""Float32 whole models through the delegate: the onnxruntime backend vs the reference backend vs
the CPU runtimes' XNNPACK, measured in one run, configurations interleaved round by round (each
one's first invokes of a round untimed — at least one and at least 30 ms of them — after a 10 ms pause,
then at least 5 ms of timed ones: the figures are of back-to-back invokes).

Models are built by the project (random weights, float32): MobileNetV2, EfficientNet-B0 and
MobileNetV3-small (nnhal.examples_mobilenet_v3: Keras' architecture as the converter emits it,
HARD_SWISH, squeeze-excite, explicit PADs) at 224x224, a BlazeFace-style detector at 128x128,
MediaPipe-style landmark networks (face mesh at 192x192 and iris at 64x64: per-channel PReLU
residual blocks, max-pooled and channel-padded shortcuts; pose at 256x256: an encoder-decoder
with 2x bilinear upsampling), a 3-layer perceptron (256-512-512-10: its time is the per-invoke
overhead, not arithmetic) and a keyword-spotting LSTM (49 MFCC frames, 64 units projected to
32: tests/delegate/kws_model.py; its states are TFLite variable tensors, carried from one invoke
to the next) and a WHILE loop
(tests/delegate/control_flow_models.py: h = tanh(FULLY_CONNECTED(h) + x), 64 units, run 16 trips,
then a classifier: the trip count is the model's second input). Rows: LiteRT's
default CPU path (XNNPACK) with 1 and 2 threads; tflite-runtime 2.14's (XNNPACK too) with 1
thread; the delegate (in LiteRT) on a service whose backend preference is
``onnxruntime,numba,reference`` (``--threads 1``: one intra-op thread, as the CPU's 1-thread rows;
at one thread the numba backend runs every onnxruntime run its float kernels cover wholly: the
"planned on" column says which engine ran each model) and on one restricted to ``reference``. Ratios are against
LiteRT 1 thread and tflite-runtime 1 thread, the faster one's in bold. Accuracy: the largest
|difference| from LiteRT's reference kernels (BUILTIN_REF) over every output, divided by that
output's largest magnitude (the "output scale"). Ready: milliseconds from ``Interpreter(...)`` to
the end of the first ``invoke()`` — each CPU runtime alone, and LiteRT with the delegate on a cold
compilation cache (a new token: prepareModel) and a warm one (prepareModelFromCache).
"""
from __future__ import annotations

import statistics
import sys
import tempfile
import time
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
from nnhal.examples import (
    blazeface_like,
    efficientnet_b0,
    face_landmark_like,
    iris_landmark_like,
    mlp,
    mobilenet_v2,
    pose_landmark_like,
)
from nnhal.examples_mobilenet_v3 import mobilenet_v3_small
from tests.delegate.control_flow_models import RNN_TRIPS, RNN_UNITS, recurrent_loop_model
from tests.delegate.kws_model import FEATURES, FRAMES, kws_model


def _loop_feed(rng: np.random.Generator) -> list[np.ndarray]:
    return [rng.uniform(-1, 1, (1, RNN_UNITS)).astype(np.float32), np.array([RNN_TRIPS], np.int32)]


#: (label, builder, input shape of the one float input, or rng -> every input)
MODELS = [("MobileNetV2 224 f32", lambda: mobilenet_v2(np.float32), (1, 224, 224, 3)),
          ("EfficientNet-B0 224 f32", lambda: efficientnet_b0(np.float32), (1, 224, 224, 3)),
          ("MobileNetV3-small 224 f32", lambda: mobilenet_v3_small(np.float32), (1, 224, 224, 3)),
          ("BlazeFace-style 128 f32", blazeface_like, (1, 128, 128, 3)),
          ("Face-landmark-style 192 f32", face_landmark_like, (1, 192, 192, 3)),
          ("Iris-landmark-style 64 f32", iris_landmark_like, (1, 64, 64, 3)),
          ("Pose-landmark-style 256 f32", pose_landmark_like, (1, 256, 256, 3)),
          ("MLP 256-512-512-10 f32", mlp, (1, 256)),
          ("KWS LSTM 49x10 f32", kws_model, (1, FRAMES, FEATURES)),
          (f"WHILE RNN {RNN_UNITS}x{RNN_TRIPS} f32", recurrent_loop_model, _loop_feed)]
SERVERS = (("onnxruntime", "onnxruntime,numba,reference"), ("reference", "reference"))


def _feed(spec, rng: np.random.Generator) -> list[np.ndarray]:
    return spec(rng) if callable(spec) else [rng.uniform(-1, 1, spec).astype(np.float32)]


def _outputs(it, xs: list[np.ndarray]) -> list[np.ndarray]:
    for d, x in zip(it.get_input_details(), xs):
        it.set_tensor(d["index"], x)
    it.invoke()
    return [it.get_tensor(o["index"]).copy() for o in it.get_output_details()]


def _fresh_outputs(it, xs: list[np.ndarray]) -> list[np.ndarray]:
    """The outputs of one invoke from the model's initial state (an LSTM's states are variable
    tensors that every timed invoke carried forward), as the BUILTIN_REF run computed them."""
    it.reset_all_variables()
    return _outputs(it, xs)


def _scaled_error(got: list[np.ndarray], want: list[np.ndarray]) -> float:
    return max(float(np.abs(g.astype(np.float64) - w).max() / max(np.abs(w).max(), 1e-30))
               for g, w in zip(got, want))


def _ready_s(path: str, address: str | None, xs: list[np.ndarray], token: bytes = b"") -> float:
    t = time.perf_counter()
    delegates = [load_delegate(address, cache_token=token)] if address else []
    it = Interpreter(model_path=path, num_threads=1, experimental_delegates=delegates)
    it.allocate_tensors()
    _outputs(it, xs)
    return time.perf_counter() - t


def _planned_backends(model: bytes, order: str) -> str:
    """The backends the service's compiler plans the delegated model on (this process's compiler,
    the service's order, one compute thread as ``--threads 1``): which engine a row measured."""
    from delegate.mapping import convert_partition
    from delegate.tfl import read_model
    from hal import backends
    from hal.compiler import compile_model
    with backends.thread_limit(1):
        plan = compile_model(convert_partition(read_model(model)).model, backend_order=order.split(",")).static_plan
    return "+".join(sorted({s.backend for s in plan.program})) if plan is not None else "planned per execution"


def measure(rounds: int = 10, per_round: int = 3, progress=None) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory() as d:
        servers = {name: start_server(str(Path(d) / f"{name}.sock"), "--backend", order, "--threads", "1")
                   for name, order in SERVERS}
        address = {name: f"unix:{Path(d) / f'{name}.sock'}" for name in servers}
        try:
            for label, build, spec in MODELS:
                if progress:
                    progress(label)
                path = str(Path(d) / "m.tflite")
                model = build()
                Path(path).write_bytes(model)
                ran_on = {name: _planned_backends(model, order) for name, order in SERVERS}
                x = _feed(spec, np.random.default_rng(0))
                ref = Interpreter(model_path=path, experimental_op_resolver_type=OpResolverType.BUILTIN_REF)
                ref.allocate_tensors()
                want = _outputs(ref, x)
                configs = {anchor(1): Interpreter(model_path=path, num_threads=1),
                           anchor(2): Interpreter(model_path=path, num_threads=2)}
                delegates = {}
                for name in servers:
                    dl = load_delegate(address[name], max_delegated_partitions=0)
                    delegates[f"nnhal ({name} backend)"] = dl
                    configs[f"nnhal ({name} backend)"] = Interpreter(model_path=path, num_threads=1,
                                                                     experimental_delegates=[dl])
                for it in configs.values():
                    it.allocate_tensors()
                    _outputs(it, x)  # warm-up
                with beside(path, x, d) as tflrt:
                    times = time_interleaved(configs, lambda it, x=x: _outputs(it, x), rounds, per_round,
                                             tflrt.remote, **PACING)
                figures = with_ratios(times, tflrt.config)
                for k in (anchor(1), anchor(2), tflrt.config, *delegates):
                    if k not in figures:
                        rows.append(not_measured_row(label, k, tflrt.why))
                        continue
                    rep = delegates[k].report if k in delegates else None
                    error = None if k not in configs else _scaled_error(_fresh_outputs(configs[k], x), want)
                    server = next((name for name in servers if k == f"nnhal ({name} backend)"), None)
                    rows.append({"model": label, "config": k, **figures[k], "error": error,
                                 "delegated": "" if rep is None else f"{rep.delegated}/{len(rep.nodes)}",
                                 "ran_on": ran_on.get(server, "")})
                token = f"bench-{time.time_ns()}".encode()
                litert = statistics.median(_ready_s(path, None, x) for _ in range(3))
                cold = _ready_s(path, address["onnxruntime"], x, token)
                warm = statistics.median(_ready_s(path, address["onnxruntime"], x, token) for _ in range(3))
                other = tflrt.info["ready_ms"] if tflrt.why is None else None
                rows.append({"model": label, "ready_ms": (1e3 * litert, other, 1e3 * cold, 1e3 * warm),
                             "tflrt_why": tflrt.why})
        finally:
            stop_servers(servers.values())
    return rows


def to_markdown(rows: list[dict]) -> str:
    lines = [f"| model | configuration | p50 ms | × {anchor(1)} | × tflite-runtime 1 thread | delegated nodes | "
             "planned on | max error / output scale |", "|---|---|---:|---:|---:|---|---|---:|"]
    ready = []
    for r in rows:
        if "ready_ms" in r:
            ready.append(r)
            continue
        error = "" if r.get("error") is None else f"{r['error']:.1e}"
        lines.append(f"| {r['model']} | {r['config']} | {p50_cell(r, 2)} | {ratio_cells(r)} | "
                     f"{r.get('delegated', '')} | {r.get('ran_on', '')} | {error} |")
    lines += ["", "Interpreter ready (construct, allocate_tensors, first invoke), ms:", "",
              "| model | LiteRT alone | tflite-runtime alone | nnhal onnxruntime (in LiteRT), cold cache | warm cache "
              "| warm × LiteRT |", "|---|---:|---:|---:|---:|---:|"]
    for r in ready:
        litert, other, cold, warm = r["ready_ms"]
        other_cell = r["tflrt_why"] if other is None else f"{other:.1f}"
        lines.append(f"| {r['model']} | {litert:.1f} | {other_cell} | {cold:.1f} | {warm:.1f} | {warm / litert:.2f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(to_markdown(measure(progress=lambda s: print(s, file=sys.stderr, flush=True))))
