"""One prepared check of the cuda backend on a GPU machine, in one command, results in one file.

A GPU is lent to a session rarely and briefly (one command of at most ~8 minutes on a bare machine
with no package index), so everything worth knowing is gathered in one run, in steps with a time
budget each, every step's outcome written to one markdown file as it comes (a step that fails or
runs out of time is recorded there and the next one still runs):

(a) ``environment``: Python, torch, CUDA, the driver, the GPU, ``nvidia-smi -L``, the backends
    registered and the time to load them (numba compiles its kernels on a bare machine);
(b) ``gpu-tests``: pytest of tests/backends/test_cuda.py (its GPU-only tests skip elsewhere);
(c) ``cts``: the float32 and relaxed NNAPI CTS cases in-process with the order
    ``cuda,onnxruntime,numba,reference``: pass/fail per operation and how many cases' tested
    operation the cuda backend ran (bench.gpu_float);
(d) ``float-bench``: MobileNetV2, EfficientNet-B0, BlazeFace, a face-landmark PReLU network and an
    encoder-decoder with bilinear upsampling (segmentation-style) through the delegate on a service
    with cuda first, fp32 and fp16 (allow_fp16), against LiteRT XNNPACK 1 thread and every thread in
    the same run (bench.gpu_float); the fp32 ratios' geometric mean is written beside the results as
    performance-gpu.json (the cuda backend's TENSOR_FLOAT32 figure for `nnhal serve --performance`).

Each step runs in a process of its own (a CUDA fault or a hang costs that step only), killed at its
budget; a step also stops starting new work shortly before it. Time a step leaves unused goes to
the next. Where no GPU is present the cuda backend runs on torch's CPU device
(``NNHAL_CUDA_DEVICE=cpu``, set here); ``--quick``: tiny models, a CTS sample, collect-only pytest
(well under a minute on a laptop; tests/test_gpu_check.py runs it).

Results: ``--results PATH``, else ``$OUT/results-gpu.md`` where ``$OUT`` is set (the device tool
copies back what is written there), else bench/results-gpu.md. The path is printed at the end.

Here, once, in the checkout the session was started in (the one the device tool sends): the 17
wheels the GPU machine lacks (the recipe's in shared/gpu/README.md, and pytest's), 36 MB in .whl/,
which git ignores:
    scripts/gpu_check.sh --download
Then the device tool's one call (at most 8 minutes of the command, its steps' budgets; about 5 in the runs
so far; ``carry``: .whl is ignored):
    run(command='export PYTHONUNBUFFERED=1; bash scripts/gpu_check.sh; rc=$?; '
                'tail -c 11000 "$OUT/results-gpu.md"; exit $rc',
        carry=[".whl"], timeout_s=540)
The script installs .whl/ into /tmp/site where the interpreter lacks those modules, generates the
protobuf code and runs ``python3 -m bench.gpu_check`` (arguments pass through; ``make bench-gpu``
runs it too); the results come back as $OUT/results-gpu.md (copy it to bench/results-gpu.md).
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The backend order every step runs with: the cuda backend first, then the CPU ones it falls back to.
ORDER = "cuda,onnxruntime,numba,reference"
#: (step, title, budget in seconds on the GPU machine, with --quick). Sized by the runs on bare H200
#: machines (bench/results-gpu.md): loading the backends, where numba compiles its kernels, took 85 s
#: on 2026-11-28 and more than 130 s on 2026-11-30 (its float32 CNN kernels had joined); the GPU tests
#: 85-161 s, the CTS cases 19-25 s, the float models 35-39 s.
STEPS = (("environment", "(a) Environment", 190, 30),
         ("gpu-tests", "(b) GPU tests: tests/backends/test_cuda.py", 170, 30),
         ("cts", "(c) NNAPI CTS float32 and relaxed cases, backend order " + ORDER, 50, 30),
         ("float-bench", "(d) Float models through the delegate, service order " + ORDER, 70, 60))
#: A step stops starting new work this long before its budget ends (then it is killed).
MARGIN_S = 8
GPU_TESTS = "tests/backends/test_cuda.py"


def append(path: str, text: str) -> None:
    """Add to the results file now: what a later step's crash or a kill leaves is kept."""
    with open(path, "a", encoding="utf-8") as f:
        f.write(text if text.endswith("\n") else text + "\n")


def default_results() -> str:
    out = os.environ.get("OUT")
    return str(Path(out) / "results-gpu.md") if out else str(ROOT / "bench" / "results-gpu.md")


def _tail(text: str, lines: int) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def code_block(text: str) -> str:
    return "```\n" + text.replace("```", "'''").rstrip() + "\n```\n"


# ---- (a) environment -----------------------------------------------------------------------------

def step_environment(results: str, until: float, quick: bool) -> int:
    device = _device_module()  # the cuda package itself would import torch before it is timed
    rows = [("python", f"{platform.python_version()} ({sys.executable})"), ("cores", str(os.cpu_count())),
            ("machine", f"{platform.machine()} {platform.processor() or ''}".strip()),
            (device.ENV_VAR, os.environ.get(device.ENV_VAR, "(unset)")),
            ("NVIDIA driver (/proc)", device.driver_version() or "none"),
            ("GPU listed by the driver", str(device.gpu_present()))]
    t = time.perf_counter()
    try:
        import torch
        rows += [("torch", f"{torch.__version__} (import {time.perf_counter() - t:.1f} s)"),
                 ("torch CUDA", str(torch.version.cuda)), ("torch.cuda.is_available()", str(torch.cuda.is_available()))]
        if torch.cuda.is_available():
            p = torch.cuda.get_device_properties(0)
            rows += [("GPU 0", f"{p.name}, sm{p.major}{p.minor}, {p.total_memory / 2**30:.1f} GiB"),
                     ("cuDNN", str(torch.backends.cudnn.version()))]
    except Exception as e:  # noqa: BLE001 - recorded: the step's point is to say what is there
        rows.append(("torch", f"not usable: {type(e).__name__}: {e}"))
    for mod in ("numpy", "onnx", "onnxruntime", "numba", "grpc"):
        try:
            rows.append((mod, __import__(mod).__version__))
        except Exception as e:  # noqa: BLE001
            rows.append((mod, f"missing: {e}"))
    from delegate import runtime
    rows.append(("TFLite runtime", runtime.label()))
    t = time.perf_counter()
    from hal import backends
    backends.ensure_loaded()  # the numba kernels compile here on a bare machine, once for every step
    rows.append(("load the backends", f"{time.perf_counter() - t:.1f} s"))
    for b in backends.available():
        rows.append((f"backend {b.name}", f"{b.version}{' (opt-in)' if b.opt_in else ''}: {b.description}"))
    rows.append(("default order", ",".join(backends.preference())))
    rows.append(("order of the steps below", ",".join(backends.parse_preference(ORDER))))
    append(results, "| what | value |\n|---|---|\n" + "".join(f"| {k} | {v} |\n" for k, v in rows))
    smi = shutil.which("nvidia-smi")
    if smi:
        r = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20)
        append(results, "`nvidia-smi -L`:\n\n" + code_block(r.stdout + r.stderr))
    else:
        append(results, "`nvidia-smi`: not on PATH.\n")
    return 0


# ---- (b) the GPU tests ---------------------------------------------------------------------------

def step_gpu_tests(results: str, until: float, quick: bool) -> int:
    if not (ROOT / GPU_TESTS).exists():
        append(results, f"{GPU_TESTS} is not in this checkout: nothing to run.\n")
        return 1
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", GPU_TESTS]
    if quick:  # the step's plumbing only: the tests themselves are the lead's suite's to run
        args.insert(-1, "--collect-only")
    append(results, f"`{' '.join(['python', *args[1:]])}`" + (" (--quick: collected, not run)" if quick else "")
           + "\n")
    try:
        r = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=max(5, until - time.time()))
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        append(results, "pytest ran out of the step's time; its output so far:\n\n" + code_block(_tail(out, 40)))
        return 1
    append(results, f"exit status {r.returncode}:\n\n" + code_block(_tail(r.stdout + r.stderr, 40)))
    return r.returncode


# ---- the steps' driver ---------------------------------------------------------------------------

def _steps():
    from bench import gpu_float
    return {"environment": step_environment, "gpu-tests": step_gpu_tests, "cts": gpu_float.step_cts,
            "float-bench": gpu_float.step_float_bench}


def run_step(name: str, title: str, budget: float, results: str, quick: bool, env: dict) -> str:
    """One step in a process of its own, killed at ``budget``; returns its status line."""
    append(results, f"\n## {title}\n")
    err = Path(results).with_name(f".{Path(results).name}.{name}.stderr")
    cmd = [sys.executable, "-m", "bench.gpu_check", "--step", name, "--results", results,
           "--until", f"{time.time() + budget - MARGIN_S:.3f}", *(["--quick"] if quick else [])]
    t = time.perf_counter()
    with open(err, "w+") as f:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(budget)
            status = "ok" if rc == 0 else f"FAILED (exit status {rc})"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)  # the step and what it started (a service)
            proc.wait()
            rc, status = None, f"TIMED OUT: killed at its budget of {budget:.0f} s; what it wrote above is partial"
        f.seek(0)
        log = f.read()
    err.unlink()
    line = f"Step {name}: {status}, {time.perf_counter() - t:.1f} s of a {budget:.0f} s budget."
    shown = "" if rc == 0 or not log.strip() else "\nIts output (last lines):\n\n" + code_block(_tail(log, 30))
    append(results, "\n" + line + "\n" + shown)
    return line


def _device_module():
    """hal/backends/cuda/device.py alone: importing its package registers the backend (torch, and on
    a GPU a CUDA context this process has no use for)."""
    path = ROOT / "hal" / "backends" / "cuda" / "device.py"
    spec = importlib.util.spec_from_file_location("_nnhal_cuda_device", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.gpu_check", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny models, a CTS sample, pytest collect-only")
    ap.add_argument("--results", default=None, help="the markdown file (default $OUT/results-gpu.md or "
                                                     "bench/results-gpu.md); replaced")
    ap.add_argument("--steps", default=",".join(s[0] for s in STEPS), help="which steps, comma-separated")
    ap.add_argument("--step", help=argparse.SUPPRESS)  # one step, in the process run_step starts
    ap.add_argument("--until", type=float, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    results = os.path.abspath(args.results or default_results())
    if args.step:
        return _steps()[args.step](results, args.until, args.quick)
    wanted = args.steps.split(",")
    unknown = set(wanted) - {s[0] for s in STEPS}
    if unknown:
        ap.error(f"unknown step {', '.join(sorted(unknown))}")
    device = _device_module()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    stand_in = not device.gpu_present() and not env.get(device.ENV_VAR)
    if stand_in:  # the cuda backend is opt-in there: on torch's CPU device
        env[device.ENV_VAR] = "cpu"
    Path(results).parent.mkdir(parents=True, exist_ok=True)
    start = time.time()
    Path(results).write_text(
        f"# nnhal cuda backend check ({'quick' if args.quick else 'full'})\n\n"
        f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(start))}, {platform.node()}, "
        f"`python -m bench.gpu_check {' '.join(argv if argv is not None else sys.argv[1:])}`"
        + (f"; no GPU: {device.ENV_VAR}=cpu (the cuda backend on torch's CPU device)" if stand_in else "") + "\n")
    lines, spent_budget = [], 0.0
    for name, title, budget, quick_budget in STEPS:
        if name not in wanted:
            continue
        spent_budget += quick_budget if args.quick else budget
        left = spent_budget - (time.time() - start)  # this step's budget and what earlier steps left
        lines.append(run_step(name, title, left, results, args.quick, env))
        print(lines[-1], flush=True)
    append(results, "\n## Summary\n\n" + "".join(f"- {x}\n" for x in lines)
           + f"\nTotal {time.time() - start:.1f} s.\n")
    print(f"results: {results}")
    return 0 if all(": ok," in x for x in lines) else 1


if __name__ == "__main__":
    sys.exit(main())
