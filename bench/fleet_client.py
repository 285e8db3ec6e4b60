"""One fleet client process (started by bench.fleet): bench.soak_client's TFLite Interpreters with the
nnhal delegate on a list of services, every output checked against TFLite, and every invoke's start
and latency recorded for the failover windows.

Protocol: the soak client's ({"ready"} line, then "go <seconds>", status lines, a last one with
"done"); then the invokes are written to --out as .npz: ``start`` (CLOCK_MONOTONIC seconds, the
clock every process of the machine shares), ``latency_s``, ``kind`` (0 on a service, 1 fell back to
the CPU in-process, 2 TFLite's CPU only, 3 failed, 4 wrong output). Its status lines count ``moved``: the prepared
models service.fleet moved to another replica (each with the execution it retried there).
"""
from __future__ import annotations

import argparse
import faulthandler
import json
import logging
import signal
import sys
import time

import numpy as np

from bench.soak_client import MODELS, SoakClient

ON_SERVICE, FALLBACK, CPU_ONLY, FAILED, WRONG = range(5)


class FleetClient(SoakClient):
    """SoakClient, timing each invoke and saying how it ran."""

    def __init__(self, args):
        super().__init__(args)
        self.starts: list[float] = []
        self.latencies: list[float] = []
        self.kinds: list[int] = []
        self.stats["moved"] = 0
        fleet_log = logging.getLogger("nnhal.fleet")
        fleet_log.setLevel(logging.INFO)  # its INFO records are counted here, not printed (no handler)
        fleet_log.addFilter(self._count_move)

    def create(self, case) -> None:
        """SoakClient.create, saying in this client's log why an Interpreter delegated nothing."""
        super().create(case)
        live = self.live[-1] if self.live else None
        if live is not None and not live.kernels:
            print(f"fleet client: nothing delegated ({case.name}): {live.delegate.report.error}", file=sys.stderr,
                  flush=True)

    def _count_move(self, record: logging.LogRecord) -> bool:
        if record.getMessage().startswith("moving a prepared model"):
            self.stats["moved"] += 1
        return record.levelno >= logging.WARNING

    def execute_once(self, live, k: int) -> None:
        before = dict(self.stats)
        t0 = time.monotonic()
        super().execute_once(live, k)
        dt = time.monotonic() - t0
        s = self.stats
        if s["errors"] > before["errors"]:
            kind = FAILED
        elif s["wrong"] > before["wrong"]:
            kind = WRONG
        elif s["fallback"] > before["fallback"]:
            kind = FALLBACK
        elif s["cpu_only"] > before["cpu_only"]:
            kind = CPU_ONLY
        else:
            kind = ON_SERVICE
        self.starts.append(t0)
        self.latencies.append(dt)
        self.kinds.append(kind)

    def save(self, path: str) -> None:
        np.savez(path, start=np.array(self.starts), latency_s=np.array(self.latencies),
                 kind=np.array(self.kinds, np.int8))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--address", required=True, help="the services: a comma-separated list, or dns:///HOST:PORT")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--models", default="float32,int8", help=f"comma-separated, of {', '.join(MODELS)}")
    p.add_argument("--recreate-every", type=int, default=200, help="executions between Interpreter re-creations")
    p.add_argument("--fresh-token-every", type=int, default=0, help="1 creation in N uses a new cache token")
    p.add_argument("--dump-dir", default=".", help="where wrong outputs are saved as reproducers")
    p.add_argument("--out", required=True, help="the .npz of every invoke")
    args = p.parse_args(argv)
    faulthandler.enable()
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    logging.getLogger("nnhal.delegate").addFilter(lambda r: not r.getMessage().startswith("nnhal delegate:"))
    client = FleetClient(args)
    print(json.dumps({"ready": True}), flush=True)
    line = sys.stdin.readline().split()
    if len(line) != 2 or line[0] != "go":
        return 2
    client.run(float(line[1]))
    client.save(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
