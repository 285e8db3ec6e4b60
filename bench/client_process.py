"""A bench client process (bench.soak_client, bench.fleet_client): started with the common flags,
told ``go SECONDS`` on its stdin, read back from the JSON lines it prints (``{"ready": true}``, then
its statistics)."""
from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


class ClientProcess:
    """``module`` run with ``--address``, ``--seed`` (the index), the run's model flags and ``extra``;
    its stderr goes to ``log_path``."""

    def __init__(self, module: str, index: int, address: str, run_dir: Path, args, env: dict, log_path: Path,
                 extra: tuple[str, ...] = ()):
        self.index = index
        self.log_path = log_path
        with open(log_path, "w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", module, "--address", address, "--seed", str(index),
                 "--models", args.models, "--recreate-every", str(args.recreate_every),
                 "--fresh-token-every", str(args.fresh_token_every), "--dump-dir", str(run_dir), *extra],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True, env=env, cwd=REPO)
        self.ready = threading.Event()
        self.stats: dict = {}
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if msg.get("ready"):
                self.ready.set()
            else:
                self.on_stats(msg)
                self.stats = msg

    def on_stats(self, msg: dict) -> None:
        """A statistics line arrived (``self.stats`` still holds the one before it)."""

    def go(self, seconds: float) -> None:
        self.proc.stdin.write(f"go {seconds}\n")
        self.proc.stdin.flush()
