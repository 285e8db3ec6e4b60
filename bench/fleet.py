"""`make fleet`: client processes run TFLite with the nnhal delegate on a list of 3 `nnhal serve`
replicas (one shared compilation cache) while, in turn, one replica is killed (SIGKILL, restarted
--down-seconds later) and another stopped (SIGSTOP, resumed --stop-seconds later); once with the
replicas on unix sockets, once on TCP loopback ports (--transports).

    .venv/bin/python -m bench.fleet --seconds 120

First, without faults, the throughput of the clients on 1, 2 and 3 replicas (--throughput-seconds
each; 1 replica is the plain one-address client). Then the fault run. Every output is checked
against TFLite (bench.soak_client). Pass criteria: 0 failed invokes, 0 wrong outputs, no client
crash or hang. Reported beside them: invokes that fell back to the CPU, prepared models moved to
another replica, and latency p50/p99/max in steady state and in the failover windows: an invoke
is in a window when it overlaps [fault, fault + --window-seconds]; steady is every other invoke after
the first --warmup-seconds. The goal (issue 35) is failover p99 ≤ 3 x steady p99; it is reported,
not a pass criterion here (timings on a shared machine). Writes the "## Fleet" section of
bench/results.md; exits 1 when a criterion fails.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.client_process import ClientProcess
from bench.fleet_client import CPU_ONLY, FAILED, FALLBACK, ON_SERVICE, WRONG
from bench.soak_report import replace_section
from bench.soak_service import SoakService

RESULTS = Path(__file__).resolve().parent / "results.md"
SECTION_TITLE = "## Fleet"
CLIENT_READY_LIMIT_S = 240.0
#: Whatever a client does beyond its run (saving its invokes) must end within this.
CLIENT_EXIT_LIMIT_S = 120.0


class Client(ClientProcess):
    """A bench.fleet_client process."""

    def __init__(self, index: int, address: str, run_dir: Path, tag: str, args, env: dict):
        self.out = run_dir / f"{tag}-client-{index}.npz"
        super().__init__("bench.fleet_client", index, address, run_dir, args, env,
                         run_dir / f"{tag}-client-{index}.log", ("--out", str(self.out)))

    def finish(self) -> str:
        """'' when it ended well, else its fate (a hang is killed)."""
        try:
            rc = self.proc.wait(CLIENT_EXIT_LIMIT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return "HUNG"
        return "" if rc == 0 and self.out.exists() else f"CRASHED (exit {rc})"

    def invokes(self) -> dict[str, np.ndarray]:
        with np.load(self.out) as f:
            return {k: f[k] for k in f.files}


class Fleet:
    def __init__(self, args, run_dir: Path, transport: str):
        self.args = args
        self.transport = transport
        self.run_dir = run_dir
        self.origin = time.monotonic()
        serve_args = ["--cache-max-bytes", str(args.cache_max_bytes)]
        self.replicas = []
        for i in range(args.replicas):
            d = run_dir / f"replica-{i}"
            d.mkdir()
            r = SoakService(d, serve_args, self.clock)
            r.cache_dir = run_dir / "cache"  # one compilation cache for every replica
            if transport == "tcp":  # plaintext on loopback, the same port at every restart
                r.address = f"127.0.0.1:{free_port()}"
                r.listen_args = ["--listen", r.address, "--insecure"]
            self.replicas.append(r)
        self.events: list[tuple[float, str, int]] = []  # (monotonic time, action, replica)
        self.env = dict(os.environ, NNHAL_EXECUTE_WAIT_MIN_S=str(args.wait_min))

    def clock(self) -> float:
        return time.monotonic() - self.origin

    def log(self, message: str) -> None:
        print(f"[fleet {self.clock():6.1f} s] {message}", file=sys.stderr, flush=True)

    def address(self, n: int) -> str:
        return ",".join(r.address for r in self.replicas[:n])

    def run(self) -> dict:
        a = self.args
        for r in self.replicas:
            r.start()
        for r in self.replicas:
            if not r.wait_ready():
                raise SystemExit(f"fleet: a replica did not start: {r.failures[-1]}")
        self.log(f"{len(self.replicas)} replicas up: {self.address(len(self.replicas))}")
        try:
            throughput = [self._phase(f"throughput-{n}", n, a.throughput_seconds, faults=False)
                          for n in range(1, len(self.replicas) + 1)] if a.throughput_seconds > 0 else []
            faults = self._phase("faults", len(self.replicas), a.seconds, faults=True)
        finally:
            for r in self.replicas:
                r.shutdown()
        return {"date": time.strftime("%Y-%m-%d %H:%M"), "args": vars(a), "transport": self.transport,
                "throughput": throughput,
                "faults": faults, "replica_failures": [f for r in self.replicas for f in r.failures]}

    def _phase(self, tag: str, n: int, seconds: float, faults: bool) -> dict:
        a = self.args
        clients = [Client(i, self.address(n), self.run_dir, tag, a, self.env) for i in range(a.clients)]
        deadline = time.monotonic() + CLIENT_READY_LIMIT_S
        for c in clients:
            c.ready.wait(max(0.0, deadline - time.monotonic()))
        for c in clients:
            if c.ready.is_set() and c.proc.poll() is None:
                c.go(seconds)
        start = time.monotonic()
        self.log(f"{tag}: {a.clients} clients on {n} replica(s) for {seconds:g} s")
        events = []
        if faults:
            events = self._faults(start, seconds)
        fates = [c.finish() for c in clients]
        end = start + seconds
        return summarize(tag, n, clients, fates, start, end, events, a)

    def _faults(self, start: float, seconds: float) -> list[tuple[float, str, int]]:
        """Kill one replica and stop another, in turn, evenly from 10% to 80% of the run; each comes
        back (restart, SIGCONT) after its down time. Returns the faults as carried out."""
        a = self.args
        k = len(self.replicas)
        plan = [(start + seconds * (0.1 + 0.7 * j / max(a.faults - 1, 1)), "kill" if j % 2 == 0 else "stop", j % k)
                for j in range(a.faults)]
        done, pending = [], []  # pending: (time, action, replica) restarts and resumes
        while plan or pending:
            now = time.monotonic()
            for r in self.replicas:
                if r.proc is not None and r.lifetimes[-1].ready is None and r.poll_ready():
                    self.log(f"replica {self.replicas.index(r)} answering again")
            for item in sorted(pending):
                if item[0] <= now:
                    pending.remove(item)
                    t, action, i = item
                    r = self.replicas[i]
                    if action == "restart":
                        r.start()  # answering once poll_ready says so (it starts in seconds)
                    else:
                        r.resume()
                    self.log(f"{action} replica {i}")
            if plan and plan[0][0] <= now:
                t, action, i = plan.pop(0)
                r = self.replicas[i]
                if not r.up or r.stopped:  # still coming back from an earlier fault: the next one
                    i = next((j for j, x in enumerate(self.replicas) if x.up and not x.stopped), i)
                    r = self.replicas[i]
                self.log(f"{action} replica {i} (pid {r.proc.pid})")
                if action == "kill":
                    r.kill()
                    pending.append((time.monotonic() + a.down_seconds, "restart", i))
                else:
                    r.stop()
                    pending.append((time.monotonic() + a.stop_seconds, "resume", i))
                done.append((time.monotonic(), action, i))
            time.sleep(0.02)
        return done


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _percentiles(lat: np.ndarray) -> dict:
    if not lat.size:
        return {"n": 0, "p50_ms": None, "p99_ms": None, "max_ms": None}
    return {"n": int(lat.size), "p50_ms": float(np.percentile(lat, 50) * 1e3),
            "p99_ms": float(np.percentile(lat, 99) * 1e3), "max_ms": float(lat.max() * 1e3)}


def summarize(tag: str, n: int, clients: list[Client], fates: list[str], start: float, end: float,
              events: list, a) -> dict:
    runs = [c.invokes() for c, fate in zip(clients, fates) if not fate]
    start_s = np.concatenate([r["start"] for r in runs]) if runs else np.zeros(0)
    lat = np.concatenate([r["latency_s"] for r in runs]) if runs else np.zeros(0)
    kind = np.concatenate([r["kind"] for r in runs]) if runs else np.zeros(0, np.int8)
    counts = {name: int((kind == k).sum()) for name, k in
              (("on_service", ON_SERVICE), ("fallback", FALLBACK), ("cpu_only", CPU_ONLY), ("failed", FAILED),
               ("wrong", WRONG))}
    counts["invokes"] = int(kind.size)
    counts["moved"] = sum(c.stats.get("moved", 0) for c in clients)
    counts["create_failed"] = sum(c.stats.get("create_failed", 0) for c in clients)
    ok = (kind != FAILED)
    in_window = np.zeros(kind.size, bool)
    for t, _, _ in events:
        in_window |= (start_s + lat >= t) & (start_s <= t + a.window_seconds)
    steady = ok & ~in_window & (start_s >= start + a.warmup_seconds)
    return {"tag": tag, "replicas": n, "seconds": end - start, "fates": fates, "counts": counts,
            "throughput_per_s": counts["on_service"] / max(end - start, 1e-9),
            "steady": _percentiles(lat[steady]), "failover": _percentiles(lat[ok & in_window]),
            "events": [(round(t - start, 1), action, i) for t, action, i in events]}


def criteria(r: dict) -> list[tuple[str, str, bool]]:
    f = r["faults"]
    c = f["counts"]
    phases = r["throughput"] + [f]
    bad = [f"{p['tag']} client {k}: {x}" for p in phases for k, x in enumerate(p["fates"]) if x]
    failed = sum(p["counts"]["failed"] + p["counts"]["create_failed"] for p in phases)
    wrong = sum(p["counts"]["wrong"] for p in phases)
    out = [("failed invokes or Interpreter creations (every phase)", str(failed), failed == 0),
           ("wrong outputs (every phase)", str(wrong), wrong == 0),
           ("client crashes or hangs", f"{len(bad)} ({'; '.join(bad)})" if bad else "0", not bad),
           ("replica deaths not caused by the run, failed restarts", str(len(r["replica_failures"])),
            not r["replica_failures"]),
           ("invokes on a service during the fault run", f"{c['on_service']:,}", c["on_service"] > 0)]
    return out


def _ms(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.1f}"


TRANSPORTS = {"unix": "unix sockets (shared-memory local bursts)",
              "tcp": "TCP on loopback (`--insecure`; unary gRPC executions)"}


def to_markdown(runs: list[dict]) -> str:
    a = runs[0]["args"]
    lines = [f"{SECTION_TITLE} (`make fleet`)", "",
             f"Measured {runs[0]['date']}: {a['replicas']} `nnhal serve` replicas sharing one compilation "
             f"cache (--cache-max-bytes {a['cache_max_bytes']}), {a['clients']} client processes each running "
             f"mobilenet_like {a['models'].replace(',', ' and ')} through the delegate with the replicas' list as "
             f"service_address, Interpreters re-created every {a['recreate_every']} invokes (a new prepared model, "
             f"placed round-robin); $NNHAL_EXECUTE_WAIT_MIN_S={a['wait_min']:g}. Every output checked against "
             f"TFLite. On a shared {os.cpu_count()}-core machine: throughput is bounded by the cores, not by the "
             f"replicas.", ""]
    for r in runs:
        lines += [f"### {TRANSPORTS[r['transport']]}", ""] + run_markdown(r)
    return "\n".join(lines).rstrip("\n") + "\n"


def run_markdown(r: dict) -> list[str]:
    a, f = r["args"], r["faults"]
    c = f["counts"]
    lines = ["| criterion | measured | ok |", "|---|---|---|"]
    lines += [f"| {name} | {measured} | {'yes' if ok else '**NO**'} |" for name, measured, ok in criteria(r)]
    ratio = (f["failover"]["p99_ms"] / f["steady"]["p99_ms"]
             if f["failover"]["p99_ms"] is not None and f["steady"]["p99_ms"] else None)
    lines += ["", f"Fault run, {f['seconds']:.0f} s: faults at "
              + ", ".join(f"{t:g} s {action} replica {i}" for t, action, i in f["events"])
              + f" (kill: restart {a['down_seconds']:g} s later; stop: SIGCONT {a['stop_seconds']:g} s later).", "",
              "| invokes | on a service | fell back to the CPU | TFLite CPU only | failed | wrong | models moved |",
              "|---|---|---|---|---|---|---|",
              f"| {c['invokes']:,} | {c['on_service']:,} | {c['fallback']:,} | {c['cpu_only']:,} | {c['failed']} | "
              f"{c['wrong']} | {c['moved']} |", "",
              "| latency (ms) | invokes | p50 | p99 | max |", "|---|---|---|---|---|"]
    for name, key in (("steady", "steady"), (f"failover windows ({a['window_seconds']:g} s from each fault)",
                                              "failover")):
        p = f[key]
        lines.append(f"| {name} | {p['n']:,} | {_ms(p['p50_ms'])} | {_ms(p['p99_ms'])} | {_ms(p['max_ms'])} |")
    goal = "n/a" if ratio is None else f"{ratio:.2f}x ({'met' if ratio <= 3 else 'NOT met'})"
    lines += ["", f"Failover p99 / steady p99: {goal} (goal ≤ 3x).", ""]
    if r["throughput"]:
        lines += [f"Throughput without faults ({a['throughput_seconds']:g} s each; 1 replica: the one-address "
                  "client):", "", "| replicas | invokes/s on the services | p50 (ms) | p99 (ms) |",
                  "|---|---|---|---|"]
        lines += [f"| {p['replicas']} | {p['throughput_per_s']:.1f} | {_ms(p['steady']['p50_ms'])} | "
                  f"{_ms(p['steady']['p99_ms'])} |" for p in r["throughput"]] + [""]
    return lines


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench.fleet", description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=120.0, help="the fault run (default 120)")
    p.add_argument("--throughput-seconds", type=float, default=20.0,
                   help="each no-fault run on 1, 2, 3 replicas (default 20; 0: none)")
    p.add_argument("--replicas", type=int, default=3)
    p.add_argument("--transports", default="unix,tcp",
                   help="one run per transport: unix sockets (shared-memory bursts) and/or tcp on loopback "
                        "(--insecure; gRPC) (default unix,tcp)")
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--models", default="float32,int8")
    p.add_argument("--faults", type=int, default=6, help="kills and stops, alternating (default 6)")
    p.add_argument("--down-seconds", type=float, default=3.0, help="from a SIGKILL to the restart (default 3)")
    p.add_argument("--stop-seconds", type=float, default=4.0, help="length of each SIGSTOP (default 4)")
    p.add_argument("--window-seconds", type=float, default=5.0, help="failover window after each fault (default 5)")
    p.add_argument("--warmup-seconds", type=float, default=3.0, help="not counted as steady (default 3)")
    p.add_argument("--wait-min", type=float, default=2.0, help="$NNHAL_EXECUTE_WAIT_MIN_S for the clients")
    p.add_argument("--recreate-every", type=int, default=200)
    p.add_argument("--fresh-token-every", type=int, default=10, help="1 creation in N compiles anew (cache writes)")
    p.add_argument("--cache-max-bytes", type=int, default=8 << 20, help="the shared cache's bound (default 8 MiB)")
    p.add_argument("--results", type=Path, default=RESULTS, help="markdown file whose Fleet section is replaced")
    p.add_argument("--no-results", action="store_true")
    p.add_argument("--keep", action="store_true", help="keep the run folder (logs)")
    p.add_argument("--json", action="store_true", help="print the results as JSON on stdout (after the table)")
    args = p.parse_args(argv)
    if args.replicas < 2 or args.clients < 1 or args.seconds <= 0 or args.faults < 0:
        p.error("--replicas >= 2, --clients >= 1, --seconds > 0, --faults >= 0")
    args.transports = args.transports.split(",")
    if not args.transports or any(t not in TRANSPORTS for t in args.transports):
        p.error(f"--transports: a comma-separated list of {', '.join(TRANSPORTS)}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    run_dir = Path(tempfile.mkdtemp(prefix="nnhal-fleet-"))
    try:
        runs = []
        for transport in args.transports:
            (run_dir / transport).mkdir()
            runs.append(Fleet(args, run_dir / transport, transport).run())
    except KeyboardInterrupt:
        print(f"fleet: interrupted; logs in {run_dir}", file=sys.stderr)
        return 130
    text = to_markdown(runs)
    print(text)
    passed = all(ok for r in runs for _, _, ok in criteria(r))
    if not args.no_results:
        replace_section(args.results, text, SECTION_TITLE)
        print(f"fleet: wrote the Fleet section of {args.results}", file=sys.stderr)
    if args.json:
        print(json.dumps({"passed": passed, "runs": [{"transport": r["transport"], "criteria": criteria(r),
                                                       "faults": r["faults"], "throughput": r["throughput"]}
                                                      for r in runs]}))
    if passed and not args.keep:
        shutil.rmtree(run_dir, ignore_errors=True)
    else:
        print(f"fleet: logs in {run_dir}", file=sys.stderr)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
