"""bench.gpu_check's float steps: the CTS float cases and the float models, the cuda backend first.

``cts``: the corpus cases whose tested operation takes TENSOR_FLOAT32 (float32 and relaxed to
float16), in-process with the order bench.gpu_check.ORDER, judged by nnhal.cts as ``nnhal cts``
judges them. Passing says little unless the cuda backend ran the case, so the table also counts,
per operation, the cases whose tested operation the compiler gave to cuda and names the backends
that took the others. Cases are taken round-robin over the operations (float32 and relaxed in
turn), so a run the step's time cuts short still covers every operation.

``float-bench``: each model through the delegate on a real service (``nnhal serve --backend
ORDER``), fp32 and fp16 (the delegate's ``allow_fp16``: the model relaxed to float16, which the
cuda backend computes in float16 on a GPU and in float32 on torch's CPU device), interleaved with
LiteRT's XNNPACK at 1 thread and at every core in the same run (bench.baselines). Accuracy: the
largest |difference| from LiteRT's reference kernels over every output, divided by that output's
largest magnitude (bench.float_models' figure). "on cuda": the delegated nodes the service's cuda
backend ran (its perf info), so a partition it could not compile shows.
"""
from __future__ import annotations

import itertools
import json
import mmap
import os
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Callable

import numpy as np

from bench.gpu_check import ORDER, append

#: Cases per operation in --quick (one float32, one relaxed where the corpus has both).
QUICK_CASES_PER_OPERATION = 2


# ---- (c) CTS -------------------------------------------------------------------------------------

def tested_type(case) -> str:
    operands, op = case.raw["operands"], case.raw["operations"][-1]
    return operands[op["inputs"][0]]["type"]


def float_cases(quick: bool) -> tuple[list, int]:
    """The float32 and relaxed cases in the order they are run, and how many the corpus has."""
    from nnhal.cts.corpus import load_cases
    by_op: dict[str, list] = defaultdict(list)
    for c in load_cases():
        if tested_type(c) == "TENSOR_FLOAT32":
            by_op[c.operation].append(c)
    total = sum(map(len, by_op.values()))
    per_op = []
    for op in sorted(by_op):
        plain = [c for c in by_op[op] if not c.relaxed]
        relaxed = [c for c in by_op[op] if c.relaxed]
        per_op.append([c for pair in itertools.zip_longest(plain, relaxed) for c in pair if c is not None])
        if quick:
            per_op[-1] = per_op[-1][:QUICK_CASES_PER_OPERATION]
    return [c for group in itertools.zip_longest(*per_op) for c in group if c is not None], total


def tested_backend(compiled) -> str:
    """The backend the compiler gave the model's last operation (the one a CTS case tests)."""
    plan = compiled.static_plan
    if plan is None:
        return "(planned per execution)"
    last = len(compiled.model.main.operations) - 1
    return next((s.backend for s in plan.program if last in s.operations), "?")


def step_cts(results: str, until: float, quick: bool) -> int:
    from hal import backends
    from nnhal.cts.runner import InProcessTarget, Outcome, run_case
    backends.set_preference(ORDER)

    class Recording(InProcessTarget):
        """In-process, as ``nnhal cts``; remembers who ran the tested operation of the last prepare."""

        ran = ""

        def prepare(self, model):
            compiled = super().prepare(model)
            self.ran = tested_backend(compiled)
            return compiled

    cases, total = float_cases(quick)
    target = Recording()
    rows: dict[str, Counter] = defaultdict(Counter)
    elsewhere: dict[str, Counter] = defaultdict(Counter)
    bad = []
    t = time.perf_counter()
    done = 0
    for case in cases:
        if time.time() > until:
            break
        print(case.name, flush=True)  # the step's output: on a hang or a kill, the last line names the case
        target.ran = ""
        r = run_case(target, case)
        done += 1
        row = rows[case.operation]
        kind = "relaxed" if case.relaxed else "f32"
        row[kind] += 1
        row[(kind, r.outcome)] += 1
        if target.ran == "cuda":
            row["cuda"] += 1
        elif target.ran:
            elsewhere[case.operation][target.ran] += 1
        if r.outcome in (Outcome.WRONG, Outcome.REJECTED, Outcome.CRASH):
            bad.append(f"- {r.outcome.value} {case.name} (tested operation on {target.ran or '?'}): {r.detail[:240]}")
    seconds = time.perf_counter() - t
    fails = (Outcome.WRONG, Outcome.REJECTED, Outcome.CRASH, Outcome.UNSUPPORTED)
    lines = [f"{done} of {len(cases)} cases run" + (f" (--quick: a sample of the corpus's {total})" if quick else "")
             + f" in {seconds:.1f} s" + ("; the step's time ran out" if done < len(cases) else "") + ".", "",
             "| operation | float32 pass/run | relaxed pass/run | wrong | rejected | crash | unsupported "
             "| tested op on cuda | tested op elsewhere |", "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    totals: Counter = Counter()
    for op in sorted(rows):
        c = rows[op]
        totals.update(c)
        others = ", ".join(f"{b} {n}" for b, n in elsewhere[op].most_common())
        lines.append(_cts_row(op, c, fails, Outcome.PASS, others))
    lines.append(_cts_row("**total**", totals, fails, Outcome.PASS, ""))
    append(results, "\n".join(lines) + "\n")
    if bad:
        append(results, f"\n{len(bad)} failing cases (wrong, rejected, crash):\n\n" + "\n".join(bad[:60])
               + ("\n- …" if len(bad) > 60 else "") + "\n")
    return 1 if bad or done < len(cases) else 0


def _cts_row(op: str, c: Counter, fails, passed, elsewhere: str) -> str:
    counts = [c[("f32", o)] + c[("relaxed", o)] for o in fails]
    return (f"| {op} | {c[('f32', passed)]}/{c['f32']} | {c[('relaxed', passed)]}/{c['relaxed']} | "
            + " | ".join(map(str, counts)) + f" | {c['cuda']}/{c['f32'] + c['relaxed']} | {elsewhere} |")


# ---- (d) float models through the delegate -------------------------------------------------------

def models(quick: bool) -> list[tuple[str, object]]:
    """(label, builder) at their real sizes, or tiny for --quick (the same architectures)."""
    from nnhal.examples import blazeface_like, efficientnet_b0, face_landmark_like, mobilenet_v2, pose_landmark_like
    s = {"mnv2": 32, "eff": 32, "blaze": 64, "face": 64, "pose": 64} if quick else \
        {"mnv2": 224, "eff": 224, "blaze": 128, "face": 192, "pose": 256}
    classes = 10 if quick else 1000
    return [(f"MobileNetV2 {s['mnv2']}", lambda: mobilenet_v2(np.float32, s["mnv2"], classes)),
            (f"EfficientNet-B0 {s['eff']}", lambda: efficientnet_b0(np.float32, s["eff"], classes)),
            (f"BlazeFace-style {s['blaze']}", lambda: blazeface_like(np.float32, s["blaze"])),
            (f"Face-landmark-style {s['face']} (PReLU)", lambda: face_landmark_like(s["face"])),
            (f"Pose-landmark-style {s['pose']} (encoder-decoder, 2x bilinear up)",
             lambda: pose_landmark_like(s["pose"]))]


def step_float_bench(results: str, until: float, quick: bool) -> int:
    from bench.baselines import anchor
    from bench.rpc_roundtrip import start_server, stop_servers

    rounds, per_round = (2, 3) if quick else (5, 20)
    cores = os.cpu_count() or 1
    cpu_note = "" if os.environ.get("NNHAL_CUDA_DEVICE", "").lower() != "cpu" else \
        " The cuda backend runs on torch's CPU device here: its fp16 rows compute in float32."
    append(results, f"p50 of {rounds} rounds x {per_round} invokes, interleaved; ratio: p50 / {anchor(1)}'s; "
                    f"accuracy: max |diff| / output scale vs LiteRT BUILTIN_REF; ready: Interpreter() to the end "
                    f"of the first invoke (prepareModel: lowering, CUDA graph capture).{cpu_note}\n\n"
                    "| model | configuration | p50 ms | ratio | accuracy | on cuda | ready ms |\n"
                    "|---|---|---:|---:|---:|---:|---:|\n")
    failed = False
    ratios: dict[str, list[float]] = defaultdict(list)  # configuration -> each model's ratio
    with tempfile.TemporaryDirectory() as d:
        sock = str(Path(d) / "cuda.sock")
        t = time.perf_counter()
        server = start_server(sock, "--backend", ORDER, "--threads", "1")
        print(f"service up in {time.perf_counter() - t:.1f} s", flush=True)
        try:
            for label, build in models(quick):
                if time.time() > until:
                    append(results, f"| {label} | not run: the step's time ran out | | | | | |\n")
                    failed = True
                    continue
                print(label, flush=True)
                try:
                    measured = _bench_model(results, label, build, Path(d), sock, cores, rounds, per_round)
                    for k, ratio in measured.items():
                        ratios[k].append(ratio)
                except Exception as e:  # noqa: BLE001 - recorded; the next model still runs
                    append(results, f"| {label} | FAILED: {type(e).__name__}: {str(e)[:300]} | | | | | |\n")
                    failed = True
        finally:
            stop_servers([server])
    _state_figures(results, ratios, stand_in=bool(cpu_note))
    return 1 if failed else 0


def _state_figures(results: str, ratios: dict[str, list[float]], stand_in: bool) -> None:
    """The geometric mean of each delegate configuration's ratios, and the fp32 one as the figure
    getCapabilities should state for the cuda backend's TENSOR_FLOAT32 (hal.performance): written
    beside the results as performance-gpu.json, which `nnhal serve --performance` reads. Not on a
    stand-in device: its speed says nothing about a GPU's."""
    means = {k: float(np.exp(np.mean(np.log(v)))) for k, v in ratios.items() if k.startswith("nnhal") and v}
    if not means:
        return
    text = ", ".join(f"{k} {m:.3f} ({len(ratios[k])} models)" for k, m in sorted(means.items()))
    append(results, f"\nGeometric mean of the ratios: {text}.\n")
    fp32 = means.get("nnhal cuda fp32")
    if fp32 is None or stand_in:
        return
    path = Path(results).with_name("performance-gpu.json")
    path.write_text(json.dumps({"cuda": {"TENSOR_FLOAT32": round(fp32, 3)}}, indent=1) + "\n")
    append(results, f"The cuda backend's float32 figure, for `nnhal serve --performance`: {path}.\n")


def _bench_model(results, label, build, folder: Path, sock, cores, rounds, per_round) -> dict[str, float]:
    """Times the model in every configuration, appends its rows; returns each configuration's ratio."""
    from bench.baselines import PACING, anchor, time_interleaved, with_ratios
    from bench.float_models import _fresh_outputs, _outputs, _scaled_error
    from delegate import load_delegate
    from delegate.runtime import Interpreter, OpResolverType

    path = str(folder / "m.tflite")
    Path(path).write_bytes(build())
    ref = Interpreter(model_path=path, experimental_op_resolver_type=OpResolverType.BUILTIN_REF)
    ref.allocate_tensors()
    x = [np.random.default_rng(0).uniform(-1, 1, d["shape"]).astype(np.float32) for d in ref.get_input_details()]
    want = _outputs(ref, x)
    configs = {anchor(1): Interpreter(model_path=path, num_threads=1)}
    if cores > 1:
        configs[anchor(cores)] = Interpreter(model_path=path, num_threads=cores)
    delegates, ready = {}, {}
    for name, fp16 in (("nnhal cuda fp32", False), ("nnhal cuda fp16", True)):
        t = time.perf_counter()
        delegates[name] = load_delegate(f"unix:{sock}", max_delegated_partitions=0, allow_fp16=fp16)
        configs[name] = Interpreter(model_path=path, num_threads=1, experimental_delegates=[delegates[name]])
        configs[name].allocate_tensors()
        _outputs(configs[name], x)
        ready[name] = time.perf_counter() - t
    for it in configs.values():
        it.allocate_tensors()
        _outputs(it, x)  # warm-up
    runs = {k: (lambda it=it: _outputs(it, x)) for k, it in configs.items()}
    runs[IN_PROCESS], bound_outputs = _bound_in_process(build(), x)
    runs[IN_PROCESS]()  # warm-up (the graph is captured at compile time)
    times = time_interleaved(runs, lambda run: run(), rounds, per_round, **PACING)
    figures = with_ratios(times, "")
    rows = []
    for k, it in configs.items():
        error = _scaled_error(_fresh_outputs(it, x), want)
        on_cuda = ""
        if k in delegates:
            dl = delegates[k]
            dl.impl.fetch_backends()
            nodes = dl.report.nodes
            on_cuda = f"{sum('cuda' in (n.backend or '') for n in nodes)}/{len(nodes)}"
        ready_ms = f"{1e3 * ready[k]:.0f}" if k in ready else ""
        rows.append(f"| {label} | {k} | {figures[k]['p50_ms']:.3f} | {figures[k]['ratio']:.2f} | {error:.1e} | "
                    f"{on_cuda} | {ready_ms} |")
    rows.append(f"| {label} | {IN_PROCESS} | {figures[IN_PROCESS]['p50_ms']:.3f} | "
                f"{figures[IN_PROCESS]['ratio']:.2f} | {_scaled_error(bound_outputs, want):.1e} | | |")
    append(results, "\n".join(rows) + "\n")
    return {k: figures[k]["ratio"] for k in configs}


#: The row that tells the GPU's share from the delegate's: the same partition compiled in this process
#: with the service's order and run bound to fixed arrays (what a local burst's service runs per
#: request), so "nnhal cuda fp32" minus it is TFLite's kernel call, the copies into and out of the
#: shared-memory slots and the two doorbells.
IN_PROCESS = "hal bound in-process, fp32 (no delegate, no IPC)"


def _bound_in_process(data: bytes, x: list[np.ndarray]) -> tuple[Callable[[], object], list[np.ndarray]]:
    """One execution of the bound partition, and the arrays it writes its outputs to: arrays in a
    mapping pinned as a local burst pins its slots (hal.backends.host_memory)."""
    from delegate.mapping import convert_partition
    from delegate.tfl import read_model
    from hal.backends import host_memory
    from hal.compiler import compile_model
    from hal.types import ExecutionPreference, Priority
    from service.execution import PreparedModel

    compiled = compile_model(convert_partition(read_model(data)).model, backend_order=ORDER.split(","))
    local = PreparedModel("in-process", compiled, ExecutionPreference.FAST_SINGLE_ANSWER, Priority.MEDIUM)
    slots = local.output_slots()
    sizes = [a.nbytes for a in x] + [int(np.prod(s)) * np.dtype(t).itemsize for s, t in slots]
    starts = np.cumsum([0] + [-(-n // 4096) * 4096 for n in sizes])
    region = mmap.mmap(-1, int(starts[-1]) + 4096)
    pinned = host_memory.pin(region)
    inputs = [np.frombuffer(region, a.dtype, a.size, int(o)).reshape(a.shape) for a, o in zip(x, starts)]
    for slot, a in zip(inputs, x):
        slot[...] = a
    outputs = [np.frombuffer(region, t, int(np.prod(s)), int(o)).reshape(s)
               for (s, t), o in zip(slots, starts[len(x):])]
    bound = local.bind(inputs, outputs)
    del pinned  # never released: the arrays keep the mapping, and so its pages, for the bench's process
    return (lambda: bound(None, 0)), outputs


if __name__ == "__main__":
    sys.exit("run python -m bench.gpu_check")
