"""The soak's `nnhal serve` process: started, killed (SIGKILL) and restarted, stopped (SIGSTOP) and
resumed, its cache folder made read-only and writable again; each process's life is recorded.

Run as ``python -m bench.soak_service <serve arguments>`` it drops the capabilities that let root
ignore file modes (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH) and becomes `nnhal serve`: a read-only
cache folder is then read-only for the service even when the soak runs as root.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import stat
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from service.client import answers

#: How long a (re)start may take: a loaded 2-core machine, numba kernels loaded from their cache.
START_LIMIT_S = 120.0
_PR_CAPBSET_DROP = 24
_CAP_DAC_OVERRIDE, _CAP_DAC_READ_SEARCH = 1, 2


@dataclass
class Lifetime:
    """One service process, from its start to its end (times from the soak's start)."""

    pid: int
    started: float
    ready: float | None = None
    ended: float | None = None
    how: str = ""  # "killed", "crashed (exit N)", "stopped at the end"

    def length(self, now: float) -> float:
        return (self.ended if self.ended is not None else now) - self.started


class SoakService:
    def __init__(self, run_dir: Path, serve_args: list[str], clock, env: dict | None = None):
        self.run_dir = run_dir
        sock_dir = run_dir / "sock"
        if len(str(sock_dir / "nnhal.sock")) > 100:  # AF_UNIX paths are limited (108 bytes on Linux)
            import tempfile
            sock_dir = Path(tempfile.mkdtemp(prefix="nnhal-soak-", dir="/tmp"))
        sock_dir.mkdir(mode=0o700, exist_ok=True)
        self.socket = sock_dir / "nnhal.sock"
        self.address = f"unix:{self.socket}"
        #: Where `nnhal serve` listens (bench.fleet's TCP replicas listen on a loopback port instead).
        self.listen_args = ["--socket", str(self.socket)]
        self.cache_dir = run_dir / "cache"
        self.serve_args = serve_args
        self.clock = clock
        self.env = env
        self.proc: subprocess.Popen | None = None
        self.lifetimes: list[Lifetime] = []
        self.stopped = False
        self.read_only = False
        self._modes: dict[Path, int] = {}
        self._ready_deadline = 0.0
        self.failures: list[str] = []

    # ---- life ----------------------------------------------------------------------------------
    @property
    def up(self) -> bool:
        return self.proc is not None and self.lifetimes[-1].ready is not None and self.proc.poll() is None

    def start(self) -> None:
        n = len(self.lifetimes)
        log = open(self.run_dir / f"service-{n}.log", "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.soak_service", *self.listen_args, "--cache-dir",
             str(self.cache_dir), "--log-level", "warning", *self.serve_args],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self.env,
            cwd=Path(__file__).resolve().parent.parent)
        log.close()
        self.lifetimes.append(Lifetime(self.proc.pid, self.clock()))
        self._ready_deadline = time.monotonic() + START_LIMIT_S

    def poll_ready(self) -> bool:
        """True once the service answers; records a start that failed or took too long."""
        life = self.lifetimes[-1]
        if life.ready is not None:
            return True
        if self.proc.poll() is not None or time.monotonic() > self._ready_deadline:
            self.failures.append(f"service (re)start {len(self.lifetimes) - 1} failed "
                                 f"(exit {self.proc.poll()}; see service-{len(self.lifetimes) - 1}.log)")
            self._end("did not start")
            self.proc = None
            return False
        if not answers(self.address):
            return False
        life.ready = self.clock()
        return True

    def wait_ready(self) -> bool:
        while self.proc is not None and not self.poll_ready():
            time.sleep(0.01)
        return self.proc is not None

    def check_alive(self) -> bool:
        """False (and the death recorded) if the service ended without being killed."""
        if self.proc is None or self.proc.poll() is None:
            return True
        self.failures.append(f"service pid {self.proc.pid} died on its own (exit {self.proc.returncode}; "
                             f"see service-{len(self.lifetimes) - 1}.log)")
        self._end(f"crashed (exit {self.proc.returncode})")
        self.proc = None
        return False

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.stopped = False
        self._end("killed")
        self.proc = None

    def stop(self) -> None:
        """SIGSTOP, and wait until every thread is stopped (a spinning burst thread could still
        answer for a moment after kill() returns)."""
        os.kill(self.proc.pid, signal.SIGSTOP)
        self.stopped = True
        deadline = time.monotonic() + 30
        while not all_threads_stopped(self.proc.pid) and time.monotonic() < deadline:
            time.sleep(0.01)

    def resume(self) -> None:
        if self.proc is not None and self.stopped:
            os.kill(self.proc.pid, signal.SIGCONT)
        self.stopped = False

    def shutdown(self) -> None:
        """SIGTERM at the end (after resuming it); a service that does not exit within 30 s is a failure."""
        self.set_read_only(False)
        if self.proc is None:
            return
        self.resume()
        self.proc.terminate()
        try:
            self.proc.wait(30)
            self._end("stopped at the end")
        except subprocess.TimeoutExpired:
            self.failures.append(f"service pid {self.proc.pid} did not exit within 30 s of SIGTERM")
            self.proc.kill()
            self.proc.wait()
            self._end("killed at the end (ignored SIGTERM)")
        self.proc = None

    def _end(self, how: str) -> None:
        life = self.lifetimes[-1]
        life.ended, life.how = self.clock(), how

    # ---- cache folder --------------------------------------------------------------------------
    def set_read_only(self, on: bool) -> None:
        """The cache folder and its files read-only (entries cannot be written, replaced or
        evicted), or writable again."""
        if on == self.read_only or not self.cache_dir.exists():
            return
        if on:  # the modes are put back exactly: the cache maps only data files that are read-only
            self._modes = {p: stat.S_IMODE(p.lstat().st_mode) for p in [self.cache_dir, *self.cache_dir.rglob("*")]
                           if p.is_file() or p.is_dir()}
            for p, mode in self._modes.items():
                os.chmod(p, mode & ~0o222)
        else:
            for p, mode in self._modes.items():
                with contextlib.suppress(FileNotFoundError):
                    os.chmod(p, mode)
        self.read_only = on


def all_threads_stopped(pid: int) -> bool:
    """Every thread of ``pid`` is stopped (SIGSTOP takes effect thread by thread); True once it is gone."""
    states = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return True
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                states.append(f.read().rsplit(")", 1)[1].split()[0])
        except FileNotFoundError:
            pass  # the thread ended
    return all(st in "tT" for st in states)


def rss_bytes(pid: int) -> int | None:
    """VmRSS of a live process, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


def _drop_file_mode_override() -> bool:
    if os.geteuid() != 0:
        return True
    libc = ctypes.CDLL(None, use_errno=True)
    return all(libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) == 0 for cap in (_CAP_DAC_OVERRIDE, _CAP_DAC_READ_SEARCH))


if __name__ == "__main__":
    if not _drop_file_mode_override():
        print("soak: cannot drop CAP_DAC_OVERRIDE: read-only cache phases are not read-only for this root service",
              file=sys.stderr, flush=True)
    os.execv(sys.executable, [sys.executable, "-m", "nnhal.cli", "serve", *sys.argv[1:]])
