"""Run a tool with its stderr on a pseudo-terminal, as a user at a terminal would: tools show
progress only there."""
from __future__ import annotations

import fcntl
import os
import select
import struct
import subprocess
import termios
import threading
import time


def run_on_tty(cmd: list[str], timeout: float = 180, marker: str | None = None, on_marker=None,
               env: dict | None = None) -> tuple[int, str, str]:
    """(exit status, stdout (a pipe), what reached the terminal); ``on_marker(proc)`` runs once
    when the terminal shows ``marker``."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # a terminal's size, not 0x0
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=slave,
                            start_new_session=True, env=env)
    os.close(slave)
    out: list[bytes] = []
    reader = threading.Thread(target=lambda: out.append(proc.stdout.read()), daemon=True)
    reader.start()
    tty, fired, deadline = b"", False, time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: every writer closed the terminal
                    break
                if not chunk:
                    break
                tty += chunk
                if marker and not fired and marker.encode() in tty:
                    fired = True
                    on_marker(proc)
            elif proc.poll() is not None:
                break
        proc.wait(max(1.0, deadline - time.monotonic()))
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
    reader.join(10)
    return proc.returncode, (out[0] if out else b"").decode(), tty.decode(errors="replace")
