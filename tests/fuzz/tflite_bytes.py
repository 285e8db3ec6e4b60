"""Part (c): byte-level .tflite mutation through the delegate, each case in its own child process.

A child loads the mutated bytes in tflite_runtime's Interpreter with the nnhal delegate (on the
part's own service), invokes, then runs the same bytes on TFLite's CPU kernels alone and compares;
it also records whether nnhal's verifier (delegate/tfl/verify.py, what the tools run first) would
have refused the file. TFLite's loader does not verify flatbuffers: many mutations crash it
before the delegate sees anything. So a crash is attributed by the child's innermost Python frame
(faulthandler, all threads): nnhal's code (delegate/, hal/, service/, ... : ``nnhal_crash``) or
TFLite's Python wrapper and anything else (``tflite_crash``); a child stuck past its bound is
attributed the same way (faulthandler's dump_traceback_later).

Children fork from a forkserver that imported numpy, TFLite and the delegate once, two at a time.
"""
from __future__ import annotations

import multiprocessing
import os
import re
import tempfile
import time
from multiprocessing.connection import wait
from pathlib import Path

import numpy as np

from tests.fuzz.core import Progress, Service, Tally, compare

ROOT = Path(__file__).resolve().parents[2]
NNHAL_DIRS = {"delegate", "hal", "service", "cache", "nnhal", "extensions"}
CHILD_BOUND_S = 30.0  # faulthandler dumps the stacks and ends the child after this long
INT32 = [0, 1, -1, 2, 4, 8, 0x7FFFFFFF, -0x80000000, 0xFFFF, 0x10000, 1 << 20]


def seeds() -> list[tuple[str, bytes]]:
    from tests.fuzz.seeds import tflite_seeds
    return tflite_seeds()


# ---- mutations -------------------------------------------------------------------------------
def mutate(data: bytes, rng) -> tuple[bytes, str]:
    b = bytearray(data)
    n = len(b)
    kind = ["flip", "flip", "flip", "byte", "byte", "int32", "int32", "int32", "truncate", "insert",
            "delete", "copy"][int(rng.integers(12))]
    if kind == "flip":
        where = [int(rng.integers(n)) for _ in range(int(rng.integers(1, 5)))]
        for p in where:
            b[p] ^= 1 << int(rng.integers(8))
        return bytes(b), f"bits flipped at {where}"
    if kind == "byte":
        where = [int(rng.integers(n)) for _ in range(int(rng.integers(1, 4)))]
        for p in where:
            b[p] = int([0, 0xFF, 0x7F, 0x80, int(rng.integers(256))][int(rng.integers(5))])
        return bytes(b), f"bytes set at {where}"
    if kind == "int32":
        p = int(rng.integers(n // 4)) * 4
        v = [*INT32, n, n + 4, n - 4][int(rng.integers(len(INT32) + 3))]
        b[p:p + 4] = int(v & 0xFFFFFFFF).to_bytes(4, "little")
        return bytes(b), f"int32 at {p} -> {v}"
    if kind == "truncate":
        k = int(rng.integers(n))
        return bytes(b[:k]), f"truncated to {k} bytes"
    p = int(rng.integers(n))
    k = int(rng.integers(1, 17))
    if kind == "insert":
        noise = rng.integers(0, 256, k, dtype=np.uint8).tobytes()
        return bytes(b[:p]) + noise + bytes(b[p:]), f"{k} bytes inserted at {p}"
    if kind == "delete":
        return bytes(b[:p] + b[p + k:]), f"{k} bytes deleted at {p}"
    q = int(rng.integers(n))
    b[q:q + k] = data[p:p + k]
    return bytes(b[:n]), f"{k} bytes copied from {p} to {q}"


def mutate_case(data: bytes, rng) -> tuple[bytes, str]:
    """Half the cases: any mutation (TFLite's loader mostly crashes on those before the delegate
    runs). The other half: a mutation nnhal's verifier accepts (up to 30 tries), i.e. a file the
    tools would hand to TFLite and the delegate: where their own checks matter."""
    if rng.random() < 0.5:
        return mutate(data, rng)
    for _ in range(30):
        mutated, what = mutate(data, rng)
        if tools_accept(mutated) is None:
            return mutated, what + " (verifier accepts)"
    return mutated, what


def tools_accept(data: bytes) -> str | None:
    """None if nnhal's tools would hand the file to TFLite (the checks of verify_model_file), else why not."""
    from delegate.tfl.reader import read_model
    from delegate.tfl.verify import ModelFormatError, check_dataflow
    try:
        check_dataflow(read_model(data))
        return None
    except ModelFormatError as e:
        return str(e)
    except Exception as e:  # noqa: BLE001 - the tools would print a traceback: reported by the child
        return f"the verifier raised {e!r}"


# ---- the child -------------------------------------------------------------------------------
def _child(data: bytes, address: str, seed: int, log_path: str, conn) -> None:
    """Runs in the child: everything it prints, and faulthandler's stacks, go to ``log_path``."""
    import faulthandler
    import sys
    log = open(log_path, "w")
    os.dup2(log.fileno(), 2)
    sys.stderr = log
    faulthandler.enable(log, all_threads=True)
    faulthandler.dump_traceback_later(CHILD_BOUND_S, exit=True, file=log)
    from delegate import load_delegate
    from delegate.runtime import Interpreter, OpResolverType
    result: dict = {}
    why = tools_accept(data)
    result["verified"], result["verifier_error"] = why is None, why or ""
    print(f"verified: {result['verified']}", file=log, flush=True)

    def run(delegate):
        rng = np.random.default_rng(seed)
        try:
            it = Interpreter(model_content=data, experimental_delegates=[delegate] if delegate else None,
                             experimental_op_resolver_type=OpResolverType.BUILTIN_REF)
            it.allocate_tensors()
            for d in it.get_input_details():
                dt = np.dtype(d["dtype"])
                x = (rng.uniform(-2, 2, d["shape"]) if dt.kind == "f" else
                     rng.integers(np.iinfo(dt).min, np.iinfo(dt).max, d["shape"], endpoint=True) if dt.kind in "iu"
                     else rng.random(d["shape"]) < 0.5)
                it.set_tensor(d["index"], np.asarray(x).astype(dt))
            it.invoke()
            return [it.get_tensor(d["index"]).copy() for d in it.get_output_details()], None
        except (RuntimeError, ValueError, MemoryError) as e:  # MemoryError: TFLite's loader, std::bad_alloc
            return None, (str(e).splitlines() or [type(e).__name__])[0]

    print("stage: delegate", file=log, flush=True)
    d = load_delegate(address, partitioning="largest")  # delegate all it can: the paths under test
    result["delegate"], result["delegate_error"] = run(d)
    result["delegated"] = bool(d.impl.kernels) if hasattr(d.impl, "kernels") else None
    result["last_error"] = d.last_error or ""
    print("stage: cpu", file=log, flush=True)
    result["cpu"], result["cpu_error"] = run(None)
    faulthandler.cancel_dump_traceback_later()
    conn.send(result)
    conn.close()


# ---- attribution -----------------------------------------------------------------------------
_FRAME = re.compile(r'^\s+File "([^"]+)", line (\d+) in (\S+)')


def _main_thread_frames(text: str) -> list[tuple[str, str]]:
    """(path, "path:line in function") innermost first: the crashing thread, else (a timeout dump)
    the thread running the child's code."""
    blocks = re.split(r"\n(?=(?:Current thread|Thread) 0x)", text)
    chosen = None
    for blk in blocks:
        if blk.startswith("Current thread"):
            chosen = blk
            break
        if "in _child" in blk:
            chosen = blk
    frames = []
    for line in (chosen or "").splitlines():
        m = _FRAME.match(line)
        if m:
            frames.append((m.group(1), f"{_short(m.group(1))}:{m.group(2)} in {m.group(3)}"))
    return frames


def _short(path: str) -> str:
    try:
        return str(Path(path).resolve().relative_to(ROOT))
    except ValueError:
        return path.split("site-packages/")[-1]


def attribute(text: str) -> tuple[str, str]:
    """("nnhal" | "tflite", the frame that decided): the innermost frame in nnhal's code or in
    TFLite's wrapper; frames of other libraries (numpy, ctypes, grpc, ...) are skipped."""
    frames = _main_thread_frames(text)
    for path, where in frames:
        rel = _short(path)
        if rel.split("/")[0] in NNHAL_DIRS and not rel.startswith(("/", ".venv")):
            return "nnhal", where
        if "tflite_runtime" in path or "ai_edge_litert" in path:
            return "tflite", where
    return "tflite", frames[0][1] if frames else "no Python frame"


# ---- the parent ------------------------------------------------------------------------------
def _outcome(result: dict) -> tuple[str, str]:
    if "Traceback" in result.get("last_error", ""):
        return "nnhal_traceback", result["last_error"][-400:]
    if result.get("verifier_error", "").startswith("the verifier raised"):
        return "nnhal_traceback", result["verifier_error"]
    got, want = result.get("delegate"), result.get("cpu")
    if got is None:
        return "refused", f"with the delegate: {result.get('delegate_error')}"
    if want is None:
        return "unverified", f"the delegate path ran; TFLite alone refuses: {result.get('cpu_error')}"
    for k, (g, w) in enumerate(zip(got, want)):
        if w.dtype.kind == "f" and (not np.isfinite(w).all() or np.abs(w).max(initial=0) > 1e30):
            return "incomparable", "non-finite or huge values in TFLite's output"
        msg = compare(g, w, loose=False)
        if msg:
            return "wrong", f"output {k}: {msg} (delegated: {result.get('delegated')})"
    return "ok", ""


def run(service: Service, seed_models: list[tuple[str, bytes]], n_cases: int, seconds: float, seed: int,
        tally: Tally, workers: int = 2, cases=None) -> None:
    from tests.fuzz.__main__ import case_rng
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["tests.fuzz.tflite_bytes", "tests.fuzz.child_preload"])
    todo = list(cases) if cases is not None else list(range(n_cases))
    progress = Progress(tally, len(todo))
    t0 = time.monotonic()
    running: dict = {}  # result pipe -> (process, log path, case label, start)
    done = 0
    with tempfile.TemporaryDirectory(prefix="nnhal-fuzz-c-") as tmp:
        while todo or running:
            while todo and len(running) < workers and time.monotonic() - t0 < seconds:
                n = todo.pop(0)
                rng = case_rng(seed, "c", n)
                name, data = seed_models[int(rng.integers(len(seed_models)))]
                mutated, what = mutate_case(data, rng)
                path = os.path.join(tmp, f"case{n}.log")
                parent_end, child_end = ctx.Pipe(duplex=False)
                p = ctx.Process(target=_child, args=(mutated, service.address, int(rng.integers(2**31)), path,
                                                     child_end), daemon=True)
                p.start()
                child_end.close()
                running[parent_end] = (p, path, f"case c:{n} {name}: {what}", time.monotonic())
            if not running:
                if todo:
                    tally.notes.append(f"stopped by the time bound after {done} of {n_cases} cases")
                break
            for conn in wait(list(running), timeout=5):  # a result, or the child's end closed
                p, path, where, _ = running.pop(conn)
                _finish(p, conn, path, where, tally)
                done += 1
                progress(done)
            for conn, (p, _, where, start) in list(running.items()):
                if time.monotonic() - start > CHILD_BOUND_S + 30:  # faulthandler did not end it
                    p.kill()
                    p.join()
                    running.pop(conn).close()
                    tally.add("nnhal_hang", "tflite bytes", where, "killed by the parent: no stack dumped")
                    done += 1
    progress(done, force=True)
    tally.seconds = time.monotonic() - t0
    crashes = tally.counts["tflite_crash"] + tally.counts["tflite_crash_verified"]
    if crashes:
        tally.notes.append(f"{tally.counts['tflite_crash_verified']} of {crashes} TFLite crashes were on files "
                           "nnhal's verifier accepts (the others: files nnhal's tools refuse before TFLite loads them)")
    if not service.alive() or not service.answers():
        service.check("part c")


def _finish(p, conn, path: str, where: str, tally: Tally) -> None:
    try:
        result = conn.recv()
    except EOFError:  # the child ended without a result
        result = None
    conn.close()
    p.join(30)
    if p.exitcode is None:  # sent its result, then stuck on the way out
        p.kill()
        p.join()
    text = Path(path).read_text(errors="replace") if os.path.exists(path) else ""
    if result is not None and p.exitcode == 0:
        outcome, detail = _outcome(result)
        tally.add(outcome, "tflite bytes", where, detail)
        return
    if "Fatal Python error" in text or (p.exitcode or 0) < 0:
        who, frame = attribute(text)
        stage = "cpu" if "stage: cpu" in text else "delegate" if "stage: delegate" in text else "load"
        outcome = f"{who}_crash"
        if who == "tflite" and "verified: True" in text:
            outcome = "tflite_crash_verified"  # a file nnhal's tools would have handed to TFLite
        tally.add(outcome, "tflite bytes", where, f"signal {-(p.exitcode or 0)} in the {stage} stage at {frame}")
        return
    if "Timeout (" in text:
        who, frame = attribute(text)
        tally.add(f"{who}_hang", "tflite bytes", where, f"stuck at {frame}")
        return
    tally.add("child_error", "tflite bytes", where, f"exit code {p.exitcode}: {text[-600:]}")
