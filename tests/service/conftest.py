"""A real `nnhal serve` subprocess on a temporary unix socket."""
from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from bench.soak_service import all_threads_stopped
from service.client import Client, answers


class ServerProcess:
    def __init__(self, tmp_path, *extra: str, env: dict[str, str] | None = None):
        self.socket = str(tmp_path / "nnhal.sock")
        self.address = "unix:" + self.socket
        self.log_path = tmp_path / "server.log"
        self.log = open(self.log_path, "w+")
        self.cache_dir = str(tmp_path / "cache")
        self.proc = subprocess.Popen([sys.executable, "-m", "nnhal.cli", "serve", "--socket", self.socket,
                                      "--cache-dir", self.cache_dir, "--log-level", "warning", *extra],
                                     stdout=self.log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + 30
        while not answers(self.address):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                terminate(self.proc)  # one that never answered must not outlive the test
                self.log.seek(0)
                raise RuntimeError(f"server did not start:\n{self.log.read()}")
            time.sleep(0.005)

    def output(self) -> str:
        return self.log_path.read_text()

    def stop(self) -> int:
        terminate(self.proc)
        self.log.close()
        return self.proc.returncode


def terminate(proc: subprocess.Popen) -> None:
    """SIGTERM (a graceful stop), SIGKILL after 60 s (after a stack dump, to see what held it)."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGUSR1)  # nnhal serve dumps every thread's stack into its log
            time.sleep(1)
            proc.kill()
            proc.wait()


@pytest.fixture
def client(server):
    c = Client.connect(server.address)
    yield c
    c.close()


def socket_mode(path: str) -> int:
    return os.stat(path).st_mode & 0o777


#: How long a test waits for a call on a stopped service before calling it hung: far above the
#: bounds under test (about a second), so no claim about speed, only that the call returns at all.
HANG_LIMIT_S = 120


@contextlib.contextmanager
def stopped(server: ServerProcess):
    """The service process stopped (SIGSTOP, as a wedged service): it holds its sockets but never
    answers. Resumed on exit, so its fixture can stop it normally."""
    os.kill(server.proc.pid, signal.SIGSTOP)
    try:
        # kill() returns before the stop takes effect, and a spinning burst thread could still
        # answer: wait until every thread of the process is stopped.
        deadline = time.monotonic() + HANG_LIMIT_S
        while not all_threads_stopped(server.proc.pid):
            assert time.monotonic() < deadline, "SIGSTOP did not stop the service"
            time.sleep(0.01)
        yield
    finally:
        if server.proc.poll() is None:
            os.kill(server.proc.pid, signal.SIGCONT)


def returns(fn, *args, **kw):
    """fn(*args, **kw) on a thread: a hang fails the test (after HANG_LIMIT_S) instead of blocking
    the suite. Returns its result or raises its exception."""
    done: dict = {}

    def target():
        try:
            done["value"] = fn(*args, **kw)
        except BaseException as e:  # noqa: BLE001 - re-raised on the test's thread
            done["error"] = e
    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(HANG_LIMIT_S)
    assert not t.is_alive(), f"still blocked after {HANG_LIMIT_S} s on a stopped service"
    if "error" in done:
        raise done["error"]
    return done["value"]


class TcpServer:
    """`nnhal serve --listen 127.0.0.1:0` (--insecure, or TLS with ``tls`` args); the port is read
    from the line serve prints."""

    def __init__(self, tmp_path, *args: str):
        self.log_path = tmp_path / "tcp-server.log"
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen([sys.executable, "-m", "nnhal.cli", "serve", "--listen", "127.0.0.1:0",
                                      "--no-cache", "--log-level", "warning", *args],
                                     stdout=subprocess.PIPE, stderr=self.log, text=True)
        first: list[str] = []
        reader = threading.Thread(target=lambda: first.append(self.proc.stdout.readline()), daemon=True)
        reader.start()
        reader.join(HANG_LIMIT_S)
        m = re.match(r"nnhal service listening on (127\.0\.0\.1:\d+)$", (first or [""])[0].strip())
        if m is None:
            self.stop()
            raise RuntimeError(f"server did not start: {first}\n{self.log_path.read_text()}")
        self.address = m.group(1)

    def stop(self) -> None:
        terminate(self.proc)
        self.log.close()
