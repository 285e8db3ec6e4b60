"""`make soak`: client processes run TFLite with the nnhal delegate for a fixed time while their
`nnhal serve` is killed and restarted, stopped and resumed, and its cache folder made read-only.

    .venv/bin/python -m bench.soak --seconds 300

Pass criteria: 0 wrong outputs (every output checked against TFLite) and 0 failed invokes or
Interpreter creations, 0 client crashes, 0 hung clients (no progress for --hang-seconds), no
service death or failed restart the soak did not cause, and VmRSS growth after warm-up within
--max-growth percent for every client and for the service's longest life (bench.soak_report says
how it is measured). Prints a summary, writes the "Soak" section of bench/results.md, exits 1 when
a criterion fails. Logs and reproducers (wrong outputs as .tflite + .npz) stay in the run folder
when something failed.

Schedule (fractions of the run): the kills (each followed by a restart --down-seconds later) fall
evenly in the first KILL_SPAN, so the last life is the longest (70% of the run by default); SIGSTOPs
(each --stop-seconds long) fall evenly from 10% to 90% of the run; read-only phases are centred on the
last kill (the service restarts on a read-only cache) and then evenly over the last life. An event
due while the service is still restarting waits until it answers. With the defaults, the clients'
warm-up (the first 20%) holds a stop and a kill/restart cycle, and the service's longest life
begins with a stop and a read-only phase in its own warm-up.
"""
from __future__ import annotations

import argparse
import heapq
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

from bench.client_process import ClientProcess
from bench.soak_report import Criterion, growth, replace_section, to_markdown
from bench.soak_service import SoakService, rss_bytes

KILL_SPAN = 0.3
READ_ONLY_FRACTION = 0.08
READ_ONLY_MIN_S = 2.0
#: How long clients may take to build their models and expected outputs before the run starts.
CLIENT_READY_LIMIT_S = 180.0
RESULTS = Path(__file__).resolve().parent / "results.md"


def schedule(seconds: float, kills: int, stops: int, read_only: int) -> list[tuple[float, str]]:
    """The fault events (time from the start, action) of a run."""
    events = []
    kill_at = [KILL_SPAN * seconds * (i + 1) / kills for i in range(kills)]
    events += [(t, "kill") for t in kill_at]
    events += [(seconds * (0.1 + 0.8 * j / max(stops - 1, 1)), "stop") for j in range(stops)]
    first = kill_at[-1] if kill_at else seconds / (read_only + 1)
    length = max(READ_ONLY_MIN_S, READ_ONLY_FRACTION * seconds)
    for j in range(read_only):
        centre = first + (seconds - first) * j / read_only
        events += [(max(0.0, centre - length / 2), "read-only"), (min(seconds, centre + length / 2), "writable")]
    return sorted(events)


def describe(events: list[tuple[float, str]], args) -> str:
    kills = [f"{t:.0f}" for t, a in events if a == "kill"]
    stops = [f"{t:.0f}" for t, a in events if a == "stop"]
    ro = [f"{t:.0f}" for t, a in events if a == "read-only"]
    return (f"SIGKILL at {', '.join(kills) or 'never'} s (restart {args.down_seconds:g} s later); "
            f"SIGSTOP for {args.stop_seconds:g} s at {', '.join(stops) or 'never'} s; cache folder read-only for "
            f"{max(READ_ONLY_MIN_S, READ_ONLY_FRACTION * args.seconds):.0f} s from {', '.join(ro) or 'never'} s")


class SoakClientProcess(ClientProcess):
    """A bench.soak_client process; ``progress_at``: when its counts last moved (a hang's clock)."""

    def __init__(self, index: int, address: str, run_dir: Path, args, env: dict):
        self.done = False
        self.progress_at = time.monotonic()
        self.hung = False
        self.samples: list[tuple[float, int]] = []
        super().__init__("bench.soak_client", index, address, run_dir, args, env, run_dir / f"client-{index}.log")

    def on_stats(self, msg: dict) -> None:
        keys = ("executions", "errors", "created", "create_failed")
        if any(msg.get(k) != self.stats.get(k) for k in keys):
            self.progress_at = time.monotonic()
        self.done = self.done or bool(msg.get("done"))

    def go(self, seconds: float) -> None:
        self.progress_at = time.monotonic()
        super().go(seconds)

    def ask_for_stacks(self) -> None:
        """faulthandler in the client writes every thread's stack to its log."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGUSR1)

    @property
    def fate(self) -> str:
        if self.hung:
            return "HUNG"
        rc = self.proc.poll()
        if rc is None or (rc == 0 and self.done):
            return ""
        return f"CRASHED (exit {rc})" if rc >= 0 else f"CRASHED ({signal.Signals(-rc).name})"


class Soak:
    def __init__(self, args, run_dir: Path):
        self.args = args
        self.run_dir = run_dir
        self.origin = time.monotonic()
        serve_args = ["--cache-max-bytes", str(args.cache_max_bytes)] + (args.serve_args or [])
        self.service = SoakService(run_dir, serve_args, self.clock)
        self.clients: list[SoakClientProcess] = []
        self.service_samples: dict[int, list[tuple[float, int]]] = {}
        self.events = schedule(args.seconds, args.kills, args.stops, args.read_only)
        self.done_events: list[str] = []
        self.notes: list[str] = []

    def clock(self) -> float:
        return time.monotonic() - self.origin

    def log(self, message: str) -> None:
        print(f"[soak {self.clock():6.1f} s] {message}", file=sys.stderr, flush=True)

    # ---- the run -------------------------------------------------------------------------------
    def run(self) -> dict:
        a = self.args
        self.service.start()
        env = dict(os.environ, NNHAL_EXECUTE_WAIT_MIN_S=str(a.wait_min))
        # The clients build their models and expected outputs while the service starts.
        self.clients = [SoakClientProcess(i, self.service.address, self.run_dir, a, env) for i in range(a.clients)]
        if not self.service.wait_ready():
            for c in self.clients:
                c.proc.kill()
            raise SystemExit(f"soak: the service did not start: {self.service.failures[-1]}")
        deadline = time.monotonic() + CLIENT_READY_LIMIT_S
        for c in self.clients:
            c.ready.wait(max(0.0, deadline - time.monotonic()))
        for c in self.clients:
            if c.ready.is_set() and c.proc.poll() is None:
                c.go(a.seconds)
        self.origin = time.monotonic()
        life = self.service.lifetimes[0]
        life.started = life.ready = 0.0
        self.log(f"{a.clients} clients running for {a.seconds:g} s; service {self.service.address}")
        try:
            self._loop()
        finally:
            self.service.shutdown()
            for c in self.clients:
                if c.proc.poll() is None:
                    c.proc.kill()
                    c.proc.wait()
        return self._results()

    def _loop(self) -> None:
        a = self.args
        queue = list(self.events)
        heapq.heapify(queue)
        next_sample = 0.0
        end = a.seconds + a.hang_seconds + 10  # clients stop at a.seconds; a later one is hung
        while True:
            now = self.clock()
            while queue and queue[0][0] <= now:
                t, action = heapq.heappop(queue)
                retry = self._do(action, now, queue)
                if retry:
                    heapq.heappush(queue, (now + 0.5, action))
                    break
            if self.service.proc is not None and self.service.lifetimes[-1].ready is None:
                if self.service.poll_ready():
                    self.log(f"service {self.service.proc.pid} answering")
            elif not self.service.check_alive():
                self.log(f"service died on its own: {self.service.failures[-1]}; restarting")
                self.service.start()
            if now >= next_sample:
                self._sample(now)
                next_sample = now + a.sample_seconds
            self._watch_clients()
            running = [c for c in self.clients if c.proc.poll() is None]
            if not running and now >= a.seconds or now > end:
                break
            time.sleep(0.05)
        for c in self.clients:
            if c.proc.poll() is None and not c.hung:
                c.hung = True
                c.ask_for_stacks()
                self.log(f"client {c.index} still running {a.hang_seconds + 10:g} s after the end: hung")
        time.sleep(1)  # let faulthandler write

    def _do(self, action: str, now: float, queue: list) -> bool:
        """Carry out one event; True to retry it shortly (the service is not up to be stopped)."""
        s = self.service
        if action == "kill":
            if s.proc is None:
                return True
            pid = s.proc.pid
            s.kill()
            heapq.heappush(queue, (now + self.args.down_seconds, "restart"))
        elif action == "restart":
            s.start()
            pid = s.proc.pid
        elif action == "stop":
            if not s.up or s.stopped:
                return True
            pid = s.proc.pid
            s.stop()
            heapq.heappush(queue, (now + self.args.stop_seconds, "resume"))
        elif action == "resume":
            pid = s.proc.pid if s.proc else None
            s.resume()
        else:
            pid = None
            s.set_read_only(action == "read-only")
        self.done_events.append(f"{now:.1f} s {action}")
        self.log(f"{action} {'' if pid is None else f'(pid {pid})'}")
        return False

    def _sample(self, now: float) -> None:
        for c in self.clients:
            if c.proc.poll() is None and not c.done and now <= self.args.seconds:
                r = rss_bytes(c.proc.pid)
                if r is not None:
                    c.samples.append((now, r))
        s = self.service
        if s.proc is not None and s.lifetimes[-1].ready is not None:
            r = rss_bytes(s.proc.pid)
            if r is not None:
                self.service_samples.setdefault(len(s.lifetimes) - 1, []).append((now, r))

    def _watch_clients(self) -> None:
        for c in self.clients:
            if c.hung or c.done or c.proc.poll() is not None:
                continue
            if time.monotonic() - c.progress_at > self.args.hang_seconds:
                c.hung = True
                c.ask_for_stacks()
                self.log(f"client {c.index} (pid {c.proc.pid}) made no progress for {self.args.hang_seconds:g} s: "
                         f"hung; stacks in {c.log_path}")

    # ---- the verdict ---------------------------------------------------------------------------
    def _results(self) -> dict:
        a = self.args
        s = self.service
        lives = s.lifetimes
        longest = max(range(len(lives)), key=lambda i: min(lives[i].length(a.seconds), a.seconds - lives[i].started))
        life = lives[longest]
        life_end = min(life.ended if life.ended is not None else a.seconds, a.seconds)
        service_growth = growth(self.service_samples.get(longest, []), life.ready or life.started, life_end)
        client_rows = [{"index": c.index, "pid": c.proc.pid, "stats": c.stats, "fate": c.fate,
                        "growth": growth(c.samples, 0.0, a.seconds)} for c in self.clients]
        total = {k: sum(c.stats.get(k, 0) for c in self.clients) for k in
                 ("executions", "wrong", "errors", "on_service", "fallback", "cpu_only", "created")}
        crashed = [c for c in self.clients if c.fate.startswith("CRASHED")]
        hung = [c for c in self.clients if c.hung]
        limit = a.max_growth / 100
        worst = max((r["growth"].fraction for r in client_rows if r["growth"]), default=None)
        criteria = [
            Criterion("wrong outputs", f"{total['wrong']} of {total['executions']:,} executions", total["wrong"] == 0),
            Criterion("failed invokes or Interpreter creations", str(total["errors"]), total["errors"] == 0),
            Criterion("client crashes", str(len(crashed)), not crashed),
            Criterion(f"client hangs (no progress for {a.hang_seconds:g} s)", str(len(hung)), not hung),
            Criterion("service deaths not caused by the soak, failed restarts", str(len(s.failures)), not s.failures),
            Criterion(f"service RSS growth after warm-up (longest life, {life_end - life.started:.0f} s) "
                      f"≤ {a.max_growth:g}%",
                      "n/a" if service_growth is None else f"{service_growth.fraction * 100:+.1f}%",
                      service_growth is not None and service_growth.fraction <= limit),
            Criterion(f"client RSS growth after warm-up ≤ {a.max_growth:g}% (worst client)",
                      "n/a" if worst is None else f"{worst * 100:+.1f}%",
                      worst is not None and all(r["growth"] and r["growth"].fraction <= limit for r in client_rows)),
        ]
        notes = list(s.failures)
        notes += [f"client {c.index}: last error: {c.stats.get('last_error')}" for c in self.clients
                  if c.stats.get("last_error")]
        tracebacks = sum((self.run_dir / f"service-{i}.log").read_text().count("Traceback")
                         for i in range(len(lives)) if (self.run_dir / f"service-{i}.log").exists())
        notes.append(f"{total['executions']:,} executions: {total['on_service']:,} on the service, "
                     f"{total['fallback']:,} fell back in-process, {total['cpu_only']:,} on TFLite's CPU kernels "
                     f"(Interpreters created while the service was unreachable); {total['created']:,} Interpreters "
                     f"created; {tracebacks} tracebacks in the service logs")
        notes.append("events as carried out (an event waits while the service restarts): "
                     + ", ".join(self.done_events))
        peaks = [max((r for _, r in self.service_samples.get(i, [])), default=None) for i in range(len(lives))]
        return {"date": time.strftime("%Y-%m-%d %H:%M"), "seconds": a.seconds, "clients": a.clients,
                "models": f"mobilenet_like {a.models.replace(',', ' and ')}", "recreate_every": a.recreate_every,
                "fresh_token_every": a.fresh_token_every, "serve_args": s.serve_args,
                "faults": describe(self.events, a),
                "wait_min": a.wait_min, "hang_s": a.hang_seconds, "sample_s": a.sample_seconds,
                "criteria": criteria, "passed": all(c.ok for c in criteria), "client_rows": client_rows,
                "service_pid": life.pid, "service_growth": service_growth, "lives": list(zip(lives, peaks)),
                "notes": notes, "events": self.done_events, "totals": total, "tracebacks": tracebacks}


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=300.0, help="length of the run (default 300)")
    p.add_argument("--clients", type=int, default=4, help="client processes (default 4)")
    p.add_argument("--models", default="float32,int8", help="example models each client runs (float32,int8)")
    p.add_argument("--kills", type=int, default=2, help="SIGKILL + restart cycles, in the first 30%% (default 2)")
    p.add_argument("--stops", type=int, default=5, help="SIGSTOP + SIGCONT cycles, spread over the run (default 5)")
    p.add_argument("--read-only", type=int, default=3, help="read-only cache folder phases (default 3)")
    p.add_argument("--stop-seconds", type=float, default=4.0, help="length of each SIGSTOP (default 4)")
    p.add_argument("--down-seconds", type=float, default=2.0, help="from a SIGKILL to the restart (default 2)")
    p.add_argument("--wait-min", type=float, default=2.0, help="$NNHAL_EXECUTE_WAIT_MIN_S for the clients (default 2)")
    p.add_argument("--hang-seconds", type=float, default=60.0, help="no progress for this long is a hang (default 60)")
    p.add_argument("--max-growth", type=float, default=5.0, help="RSS growth allowed after warm-up, %% (default 5)")
    p.add_argument("--sample-seconds", type=float, default=1.0, help="RSS sampling interval (default 1)")
    p.add_argument("--recreate-every", type=int, default=100, help="executions between Interpreter re-creations")
    p.add_argument("--fresh-token-every", type=int, default=10, help="1 Interpreter creation in N uses a new token")
    p.add_argument("--cache-max-bytes", type=int, default=8 << 20, help="the service's cache bound (default 8 MiB)")
    p.add_argument("--serve-arg", dest="serve_args", action="append", help="extra `nnhal serve` argument")
    p.add_argument("--results", type=Path, default=RESULTS, help="markdown file whose Soak section is replaced")
    p.add_argument("--no-results", action="store_true", help="do not write the results file")
    p.add_argument("--keep", action="store_true", help="keep the run folder (logs) even when everything passed")
    p.add_argument("--json", action="store_true", help="print the results as JSON on stdout (after the table)")
    args = p.parse_args(argv)
    for name in ("seconds", "clients", "recreate_every", "fresh_token_every"):
        if getattr(args, name) <= 0 and not (name == "fresh_token_every" and args.fresh_token_every == 0):
            p.error(f"--{name.replace('_', '-')} must be > 0")
    if min(args.kills, args.stops, args.read_only) < 0 or args.stop_seconds <= 0 or args.down_seconds < 0:
        p.error("counts and durations must not be negative")
    from bench.soak_client import MODELS
    if not args.models or any(m not in MODELS for m in args.models.split(",")):
        p.error(f"--models: a comma-separated list of {', '.join(MODELS)}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    run_dir = Path(tempfile.mkdtemp(prefix="nnhal-soak-"))
    try:
        r = Soak(args, run_dir).run()
    except KeyboardInterrupt:
        print(f"soak: interrupted; logs in {run_dir}", file=sys.stderr)
        return 130
    text = to_markdown(r)
    print(text)
    if not args.no_results:
        replace_section(args.results, text)
        print(f"soak: wrote the Soak section of {args.results}", file=sys.stderr)
    if args.json:
        print(json.dumps({"passed": r["passed"], "totals": r["totals"], "events": r["events"],
                          "hung": sum(c["fate"] == "HUNG" for c in r["client_rows"]),
                          "crashed": sum(c["fate"].startswith("CRASHED") for c in r["client_rows"]),
                          "criteria": [[c.name, c.measured, c.ok] for c in r["criteria"]]}))
    if r["passed"] and not r["tracebacks"] and not args.keep:
        shutil.rmtree(run_dir, ignore_errors=True)
    else:
        print(f"soak: logs{' and reproducers' if not r['passed'] else ''} in {run_dir}", file=sys.stderr)
    return 0 if r["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
