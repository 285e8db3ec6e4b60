"""What the three fuzzers share: the service under test, outcome tallies, the output oracle's
comparison, progress lines, and the summary table (printed, and written to bench/results.md).

Outcomes. Allowed: ``ok`` (ran, result correct), ``refused`` (a clean NNAPI error status, or a
clean error from TFLite / the delegate). Failures of the suite (the slice in `make test` fails on
any): ``death`` (the service process died), ``hang`` (a call exceeded its bound), ``wrong`` (a
result differing from the reference backend's or TFLite's, or a write outside the caller's output
buffers), ``nnhal_crash`` / ``nnhal_hang`` (part c: a child process killed or stuck in nnhal's
code). Listed for the report, not failing: ``internal_error`` (GENERAL_FAILURE "internal error": an
exception the service's last guard caught), ``caught_exception`` (hal's catch-alls turned a Python
exception in a spec, backend or kernel into a status: "cannot prepare", "execution failed", ...),
``accepted_invalid`` / ``refused_valid`` (the service and this suite's reading of NNAPI's rules
disagree), ``unverified`` (ran, but nothing to compare with), ``transport_error``; part (c):
``nnhal_traceback`` (an exception escaped into the delegate's error or the tools' verifier),
``tflite_crash`` / ``tflite_hang`` (TFLite's own; ``tflite_crash_verified``: on a file nnhal's
tools would have handed to TFLite), ``incomparable`` (non-finite reference outputs), ``child_error``.
"""
from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import numpy as np

from hal.types import ErrorStatus

FAILING = ("death", "hang", "wrong", "nnhal_crash", "nnhal_hang")
LISTED = ("internal_error", "caught_exception", "accepted_invalid", "refused_valid", "unverified", "transport_error",
          "nnhal_traceback", "child_error", "tflite_crash_verified", "tflite_crash", "tflite_hang",
          "incomparable")
#: Messages of hal's catch-alls: a Python exception nobody foresaw, turned into a status.
CAUGHT = ("cannot validate:", "cannot prepare:", "execution failed:", "supports failed:", "plan failed:")

#: Every call of the fuzzers waits at most this long (the client library's own bounds are longer).
CALL_BOUND_S = 60.0


class Hang(Exception):
    """A call did not return within its bound."""


class Death(Exception):
    """The service is gone (or its transport broke)."""


def call(fn, request, timeout_s: float = CALL_BOUND_S, client=None, metadata=None):
    """A unary RPC with a bound (and ``client``'s session, for calls that create resources, unless
    ``metadata`` is given); transport faults become Hang / Death (grpc's own errors only)."""
    if metadata is None:
        metadata = list(getattr(client, "session", None) or []) or None
    try:
        return fn(request, timeout=timeout_s, metadata=metadata)
    except grpc.RpcError as e:
        code = e.code() if hasattr(e, "code") else None
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            raise Hang(f"no answer within {timeout_s:g} s") from None
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
            return None  # the message is over grpc's size limit: refused by the transport
        raise Death(f"{code}: {e.details() if hasattr(e, 'details') else e}") from None


def status_outcome(code: int, message: str) -> str:
    """The outcome of a reply whose status is not NONE."""
    if code == ErrorStatus.GENERAL_FAILURE and message.startswith("internal error"):
        return "internal_error"
    if any(c in message for c in CAUGHT):
        return "caught_exception"
    return "refused"


@dataclass
class Tally:
    """Outcome counts of one part, and the cases worth listing (with what replays them)."""

    part: str
    counts: Counter = field(default_factory=Counter)
    by_mutation: dict[str, Counter] = field(default_factory=lambda: defaultdict(Counter))
    listed: list[tuple[str, str]] = field(default_factory=list)  # (outcome, "case N: seed / mutation: detail")
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def cases(self) -> int:
        return sum(self.counts.values())

    def add(self, outcome: str, mutation: str, where: str = "", detail: str = "") -> None:
        self.counts[outcome] += 1
        self.by_mutation[mutation][outcome] += 1
        if outcome in FAILING or outcome in LISTED:
            if sum(1 for o, _ in self.listed if o == outcome) < 200:
                self.listed.append((outcome, f"{where} [{mutation}]: {detail}"[:600]))

    def failures(self) -> list[str]:
        return [f"{o}: {d}" for o, d in self.listed if o in FAILING]


class Progress:
    """One status line, redrawn on a terminal, printed every 10% otherwise."""

    def __init__(self, tally: Tally, total: int):
        self.tally, self.total = tally, total
        self.t0 = time.monotonic()
        self.tty = sys.stderr.isatty()
        self._last = 0.0
        self._step = -1

    def __call__(self, done: int, force: bool = False) -> None:
        now = time.monotonic()
        step = done * 10 // max(self.total, 1)
        if not force and (now - self._last < 0.5 if self.tty else step == self._step):
            return
        self._last, self._step = now, step
        rate = done / max(now - self.t0, 1e-9)
        c = self.tally.counts
        bad = {k: c[k] for k in FAILING + LISTED if c[k]}
        line = (f"[{self.tally.part}] {done}/{self.total} {rate:.1f}/s ok={c['ok']} refused={c['refused']} "
                + " ".join(f"{k}={v}" for k, v in bad.items()))
        if self.tty:
            sys.stderr.write("\r" + line[:150].ljust(150) + ("\n" if force else ""))
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()


def compare(got: np.ndarray, want: np.ndarray, loose: bool = False) -> str | None:
    """None when ``got`` is ``want``: integers exactly, floats within a tolerance scaled by the
    output's magnitude (backends sum in different orders), non-finite exactly where ``want`` is
    (outputs reaching 1e30 are not compared: evaluation order decides where they overflow).
    ``loose``: float16 or relaxed computation."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return f"shape {list(got.shape)}, expected {list(want.shape)}"
    if got.dtype != want.dtype:
        return f"dtype {got.dtype}, expected {want.dtype}"
    if want.dtype.kind != "f":
        bad = got != want
        if bad.any():
            k = int(np.flatnonzero(bad)[0])
            return f"{int(bad.sum())} of {want.size} values differ (first at {k}: {got.flat[k]} vs {want.flat[k]})"
        return None
    g, w = got.astype(np.float64), want.astype(np.float64)
    # Non-finite where the reference is: which of inf or NaN depends on the evaluation order (a
    # fused graph computes gamma * x - gamma * mean where the reference computes gamma * (x - mean)).
    # Near float32's limit, reordered arithmetic overflows in different places: not comparable.
    fin = np.isfinite(w)
    if fin.any() and np.abs(w[fin]).max() > 1e30:
        return None
    if (np.isfinite(g) != fin).any():
        return "non-finite values where the reference has finite ones (or the reverse)"
    if not fin.any():
        return None
    rtol = 2e-2 if loose else 1e-4
    scale = max(1.0, float(np.abs(w[fin]).max()))
    err = np.abs(g[fin] - w[fin])
    bad = err > rtol * np.abs(w[fin]) + rtol * scale * 0.1
    if bad.any():
        return f"{int(bad.sum())} of {w.size} values differ (max abs error {err.max():.3g}, output scale {scale:.3g})"
    return None


class Service:
    """A real `nnhal serve` process (tests/service's ServerProcess), restarted after a death so that
    a run goes on; ``deaths`` records each."""

    def __init__(self, label: str, *extra: str):
        self.label = label
        self.extra = extra
        self.deaths: list[str] = []
        self.dirs: list[str] = []
        self._start()

    def _start(self) -> None:
        from service.client import Client
        from tests.service.conftest import ServerProcess
        d = tempfile.mkdtemp(prefix=f"nnhal-fuzz-{self.label}-")
        self.dirs.append(d)
        # --parent-pid: the service stops when this process ends, however it ends (a killed run leaves none)
        # every numba kernel loaded at start: the RSS bound (RSS_GROWTH_LIMIT) is on what a run grows
        # from there, and kernels loaded for the first model that runs them are not growth
        self.server = ServerProcess(Path(d), "--parent-pid", str(os.getpid()), *self.extra,
                                    env=dict(os.environ, NNHAL_NUMBA_EAGER="1"))
        self.address = self.server.address
        self.client = Client.connect(self.address)
        self.pid = self.server.proc.pid
        self.rss_start_kb = self.rss_kb()

    def alive(self) -> bool:
        return self.server.proc.poll() is None

    def rss_kb(self) -> int:
        try:
            with open(f"/proc/{self.server.proc.pid}/status") as f:
                return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
        except (OSError, StopIteration, ValueError):
            return 0

    def answers(self) -> bool:
        from service.client import ServiceError
        try:
            self.client.get_version_string(10.0)
            return True
        except ServiceError:
            return False

    def check(self, where: str) -> bool:
        """After a transport fault: True if the service died (recorded, and a new one started)."""
        if self.alive() and self.answers():
            return False
        code = self.server.proc.poll()
        tail = self.server.output()[-1500:]
        self.deaths.append(f"{where}: exit code {code}; log tail: {tail}")
        self.restart()
        return True

    def restart(self) -> None:
        self.stop()
        self._start()

    def log_findings(self) -> list[str]:
        """What the service logged that points at a bug: tracebacks' last lines, partitions that fell
        back, cache writes that failed unexpectedly (distinct lines, with counts)."""
        found: Counter = Counter()
        for d in self.dirs:
            p = Path(d) / "server.log"
            if not p.exists():
                continue
            lines = p.read_text(errors="replace").splitlines()
            for k, line in enumerate(lines):
                if line.startswith("Traceback"):
                    j = k + 1
                    while j < len(lines) and (lines[j].startswith(" ") or not lines[j].strip()):
                        j += 1
                    if j < len(lines):
                        found["traceback: " + lines[j][:200]] += 1
                elif "could not compile" in line or "unexpectedly" in line:
                    found[re.sub(r"\d+", "N", line[:200])] += 1
        return [f"{n} x {s}" for s, n in found.most_common(30)]

    def stop(self) -> None:
        try:
            self.client.close()
        except Exception:  # noqa: BLE001 - a dead service's channel
            pass
        self.server.stop()

    def cleanup(self) -> None:
        for d in self.dirs:
            shutil.rmtree(d, ignore_errors=True)


def summary_table(tallies: list[Tally], services: list[tuple[str, Service]]) -> str:
    """The figures as a markdown table (parts x outcomes), then the services' state."""
    cols = ["ok", "refused"] + [c for c in FAILING + LISTED if any(t.counts[c] for t in tallies) or c in FAILING]
    head = "| part | cases | " + " | ".join(cols) + " | seconds |"
    lines = [head, "|---|---:|" + "---:|" * len(cols) + "---:|"]
    for t in tallies:
        lines.append(f"| {t.part} | {t.cases} | " + " | ".join(str(t.counts[c]) for c in cols)
                     + f" | {t.seconds:.0f} |")
    total = Counter()
    for t in tallies:
        total.update(t.counts)
    lines.append(f"| **total** | {sum(total.values())} | " + " | ".join(str(total[c]) for c in cols)
                 + f" | {sum(t.seconds for t in tallies):.0f} |")
    out = ["\n".join(lines), ""]
    for name, s in services:
        out.append(f"- service for {name}: pid {s.pid}, {len(s.deaths)} deaths, still answers: "
                   f"{s.alive() and s.answers()}, RSS {s.rss_start_kb / 1024:.0f} MB at start, "
                   f"{s.rss_kb() / 1024:.0f} MB at the end")
    return "\n".join(out)


#: "Its RSS did not explode": the service ends a run with at most this multiple of its start RSS.
RSS_GROWTH_LIMIT = 2.0


def service_problems(services: list[tuple[str, Service]]) -> list[str]:
    """What is wrong with the services at the end of a run: deaths, no answer, RSS growth."""
    out = []
    for name, s in services:
        if s.deaths:
            out.append(f"the service for {name} died {len(s.deaths)} times")
        if not (s.alive() and s.answers()):
            out.append(f"the service for {name} (pid {s.pid}) no longer answers")
        if s.rss_kb() > RSS_GROWTH_LIMIT * s.rss_start_kb:
            out.append(f"the service for {name} grew from {s.rss_start_kb // 1024} MB to {s.rss_kb() // 1024} MB")
    return out


SECTION = "## Fuzz (make fuzz)"


def write_results_section(text: str, path: Path | None = None) -> Path:
    """Replace (or append) the fuzz section of bench/results.md, leaving every other section as it is."""
    path = path or Path(__file__).resolve().parents[2] / "bench" / "results.md"
    old = path.read_text() if path.exists() else ""
    body = f"{SECTION}\n\n{text.strip()}\n"
    start = old.find(SECTION)
    if start < 0:
        new = old.rstrip("\n") + ("\n\n" if old else "") + body
    else:
        nxt = old.find("\n## ", start + len(SECTION))
        new = old[:start] + body + ("\n" + old[nxt + 1:] if nxt >= 0 else "")
    tmp = path.with_suffix(".md.tmp")
    tmp.write_text(new)
    os.replace(tmp, path)
    return path
