"""The CPU baselines every benchmark's ratios are against, timed in the same run.

The anchor is this process's runtime, LiteRT 2.3 (``delegate.runtime``), with 1 thread: the CPU
the service's stated speeds are relative to (hal/performance.py). tflite-runtime 2.14 with 1
thread is measured beside it, in a worker of .venv-tflite-runtime (the two runtimes need
different numpys: bench/tflite_runtime_baseline.py), interleaved with the configurations it is
compared with. Tables show a configuration's ratio against each; the one against the faster of
the two CPUs is in bold.
"""
from __future__ import annotations

import contextlib
import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

from bench import tflite_runtime_baseline as tflrt
from delegate import runtime


def threads(n: int) -> str:
    return f"{n} thread" if n == 1 else f"{n} threads"


def anchor(n: int = 1) -> str:
    """The anchor's row name: "LiteRT 2.3.0 1 thread"."""
    return f"{runtime.label()} {threads(n)}"


def tflrt_config(worker: tflrt.Baseline | None) -> str:
    """tflite-runtime's row name, with the version the worker reports."""
    return f"{worker.label if worker is not None else tflrt.LABEL} {threads(1)}"


@dataclass
class Beside:
    """tflite-runtime for one model: its row name, its timer for ``time_interleaved``'s ``remote``
    (empty when not measured, ``why`` then says why) and its load times (``info``)."""

    config: str
    remote: dict = field(default_factory=dict)
    why: str | None = None
    info: dict = field(default_factory=dict)


@contextlib.contextmanager
def beside(path: str, inputs: list, folder: str) -> Iterator[Beside]:
    """tflite-runtime's worker for the model at ``path`` fed ``inputs``, for a ``with`` block."""
    try:
        worker = tflrt.start([(path, inputs)], folder)
    except (OSError, RuntimeError, ValueError) as e:  # a broken venv: the rows say so, the bench goes on
        yield Beside(tflrt_config(None), why=f"not measured: {e}")
        return
    if worker is None:
        yield Beside(tflrt_config(None), why=tflrt.NOT_MEASURED)
        return
    with worker:
        error = worker.error(0)
        b = Beside(tflrt_config(worker), why=None if error is None else f"not measured: {error}",
                   info=worker.models[0])
        if error is None:
            b.remote[b.config] = lambda n: worker.time(0, n)
        yield b


#: The benchmarks' pause between configurations (time_interleaved's ``settle_s``).
SETTLE_S = 0.01
#: The benchmarks' untimed invokes before a configuration's timed ones (time_interleaved's
#: ``warmup_s``): after SETTLE_S idle, a small model's invokes take this long to come back to
#: their back-to-back time. LiteRT's do within a few invokes; through the service, both processes
#: wake, and the service's own time for a 27 us MLP was 168, 82, 52, 43 ... 27 us over the first
#: 20 invokes after 10 ms idle (medians of 20 such starts), and a round timed 2 ms after the
#: pause still ran at up to twice the steady time. The first invokes after idle (what an app
#: that invokes once per frame sees) are therefore in no table.
WARMUP_S = 0.03
#: The benchmarks' least time of timed invokes per configuration and round (``timed_s``).
TIMED_S = 0.005
#: time_interleaved's pacing as every model table uses it: one untimed invoke at least, then the
#: constants above.
PACING = {"warmup": 1, "settle_s": SETTLE_S, "warmup_s": WARMUP_S, "timed_s": TIMED_S}


def time_interleaved(configs: dict, run, rounds: int, per_round: int,
                     remote: dict[str, Callable[[int], list[float]]] | None = None,
                     warmup: int = 0, settle_s: float = 0.0, warmup_s: float = 0.0,
                     timed_s: float = 0.0) -> dict[str, list[float]]:
    """Seconds per ``run(config)``, configurations interleaved round by round, the order reversed
    every other round (no first-run or thermal bias toward one of them). ``remote``: configurations
    another process times, ``f(n)`` -> the seconds of its n runs (tflite-runtime's worker).
    ``warmup``, ``warmup_s``: untimed runs of a configuration before its timed ones in each round,
    at least ``warmup`` of them and at least ``warmup_s`` of its time (counted from the runs of
    earlier rounds), so the figures are of back-to-back invokes (an app's loop), not of the first
    invokes after another configuration ran (its caches cold, a service's thread asleep): a model
    of tens of microseconds takes a few hundred microseconds of invokes to get there again.
    ``settle_s``: a pause before each configuration's runs, so that none runs while the one before
    still holds a core (LiteRT's 2-thread interpreter leaves its worker spinning for milliseconds
    after an invoke). ``timed_s``: each round times at least ``per_round`` runs and at least this
    long of them (counted as ``warmup_s``), so a model of tens of microseconds has hundreds of
    samples, not ``rounds · per_round``."""
    remote = remote or {}
    times: dict[str, list[float]] = {k: [] for k in [*configs, *remote]}
    keys = list(times)
    for r in range(rounds):
        for k in (keys if r % 2 == 0 else reversed(keys)):
            n_warm, n_timed = warmup, per_round
            if times[k]:
                typical = max(statistics.median(times[k]), 1e-7)
                n_warm = max(warmup, math.ceil(warmup_s / typical))
                n_timed = max(per_round, math.ceil(timed_s / typical))
            if settle_s:
                time.sleep(settle_s)
            if k in remote:
                times[k] += remote[k](n_warm + n_timed)[n_warm:]
                continue
            for _ in range(n_warm):
                run(configs[k])
            for _ in range(n_timed):
                t = time.perf_counter()
                run(configs[k])
                times[k].append(time.perf_counter() - t)
    return times


def with_ratios(times: dict[str, list[float]], tflrt_key: str) -> dict[str, dict]:
    """Config -> p50_ms, ratio (to the anchor, 1 thread), ratio_tflrt (to tflite-runtime, None
    when it was not measured: ``tflrt_key`` is its key in ``times`` if it was) and tflrt_faster."""
    p50 = {k: statistics.median(v) for k, v in times.items() if v}
    base, other = p50[anchor()], p50.get(tflrt_key)
    return {k: {"p50_ms": 1e3 * v, "ratio": v / base, "ratio_tflrt": None if other is None else v / other,
                "tflrt_faster": other is not None and other < base} for k, v in p50.items()}


def not_measured_row(model: str, config: str, why: str = tflrt.NOT_MEASURED) -> dict:
    """tflite-runtime's row where it could not be measured: says why, has no figures."""
    return {"model": model, "config": config, "p50_ms": None, "ratio": None, "ratio_tflrt": None, "note": why}


def ratio_cells(row: dict) -> str:
    """"a | b": the row's ratio to the anchor and to tflite-runtime, the faster CPU's in bold."""
    cells, faster = [], row.get("tflrt_faster", False)
    for value, bold in ((row.get("ratio"), not faster), (row.get("ratio_tflrt"), faster)):
        cells.append("" if value is None else f"**{value:.2f}**" if bold else f"{value:.2f}")
    return " | ".join(cells)


def p50_cell(row: dict, digits: int) -> str:
    return row["note"] if row.get("p50_ms") is None else f"{row['p50_ms']:.{digits}f}"
