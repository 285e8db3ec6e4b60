"""`make fuzz`: python -m tests.fuzz [--cases N] [--seconds S] [--seed K] [--parts abc] [--replay PART:CASE]

Cases are split between the parts (a: 55%, b: 30%, c: 15%), time differently (a: 25%, b: 10%,
c: 65%: a part (c) case is a child process, ~100x the cost of the others); a part stops at its
count or its share of the time left, whichever comes first. Case N of a part is the same for the
same --seed whatever else runs (its random generator is seeded with (seed, part, N)), so a case
listed in the summary replays alone with --replay a:N. The summary table is printed and written
as the "Fuzz" section of bench/results.md (--no-results to skip). Exit code 1 when a case
failed (a service death or hang, a wrong result, a crash or hang in nnhal's code).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from collections import Counter

import numpy as np

from tests.fuzz.core import (
    FAILING,
    Progress,
    Service,
    Tally,
    service_problems,
    summary_table,
    write_results_section,
)

CASE_SHARES = {"a": 0.55, "b": 0.3, "c": 0.15}
TIME_SHARES = {"a": 0.25, "b": 0.1, "c": 0.65}
TITLES = {"a": "a: model mutation", "b": "b: request mutation", "c": "c: .tflite bytes"}


def case_rng(seed: int, part: str, n: int) -> np.random.Generator:
    return np.random.default_rng([seed, ord(part), n])


def run_part(part: str, cases, n_cases: int, seconds: float, seed: int, tally: Tally, step) -> None:
    """Run cases 0..n_cases-1 (or the ``cases`` given) of a part with ``step(n, rng)`` until the time is up."""
    progress = Progress(tally, n_cases)
    t0 = time.monotonic()
    done = 0
    for n in cases if cases is not None else range(n_cases):
        if time.monotonic() - t0 > seconds:
            tally.notes.append(f"stopped by the time bound after {done} of {n_cases} cases")
            break
        step(n, case_rng(seed, part, n))
        done += 1
        progress(done)
    progress(done, force=True)
    tally.seconds = time.monotonic() - t0


def split_cases(n_cases: int, parts: str) -> dict[str, int]:
    return {p: int(round(n_cases * CASE_SHARES[p] / sum(CASE_SHARES[q] for q in parts))) for p in parts}


def run(counts: dict[str, int], seconds: float, seed: int, replay: dict[str, list[int]] | None = None,
        full_seeds: bool = True, workers: int = 2, log=print) -> tuple[list[Tally], list[tuple[str, Service]]]:
    """Run ``counts[part]`` cases of each part; returns the tallies and the services (still running:
    the caller checks and stops them). ``full_seeds``: seeds from the whole CTS corpus, else the
    slice's few (seconds to load, not ten)."""
    os.environ.setdefault("NNHAL_EXECUTE_WAIT_MIN_S", "60")  # the client's bound on one execution
    np.seterr(all="ignore")  # mutated inputs overflow in the in-process reference: expected, not news
    warnings.simplefilter("ignore", RuntimeWarning)
    deadline = time.monotonic() + seconds
    rng = np.random.default_rng(seed)
    tallies, services = [], []
    parts = "".join(p for p in "abc" if p in (replay or counts))
    try:
        _run_parts(parts, counts, deadline, seed, replay, full_seeds, workers, rng, tallies, services, log)
    except BaseException:
        for _, s in services:
            s.stop()
            s.cleanup()
        raise
    return tallies, services


def _run_parts(parts, counts, deadline, seed, replay, full_seeds, workers, rng, tallies, services, log) -> None:
    from tests.fuzz import seeds
    if "a" in parts or "b" in parts:
        t0 = time.monotonic()
        model_seeds = seeds.model_seeds(full_seeds, rng)
        log(f"{len(model_seeds)} seed models ({time.monotonic() - t0:.0f} s)", file=sys.stderr)
        svc = Service("ab")
        services.append(("parts a and b", svc))
    for k, part in enumerate(p for p in "abc" if p in parts):
        count = counts.get(part, 0)
        left = [p for p in "abc" if p in parts][k:]  # time an earlier part did not use goes to the later ones
        budget = (deadline - time.monotonic()) * TIME_SHARES[part] / sum(TIME_SHARES[p] for p in left)
        tally = Tally(TITLES[part])
        tallies.append(tally)
        cases = (replay or {}).get(part)
        if part == "a":
            from tests.fuzz import models

            def step(n, r, tally=tally):
                models.run_case(svc, model_seeds[int(r.integers(len(model_seeds)))], r, tally, f"case a:{n}")
            run_part(part, cases, count, budget, seed, tally, step)
        elif part == "b":
            from tests.fuzz import requests
            with requests.PreparedSeeds(svc, model_seeds) as prepared:
                def step(n, r, tally=tally, prepared=prepared):
                    requests.run_case(svc, prepared, r, tally, f"case b:{n}")
                run_part(part, cases, count, budget, seed, tally, step)
        else:
            from tests.fuzz import tflite_bytes
            svc_c = Service("c")
            services.append(("part c", svc_c))
            tflite_bytes.run(svc_c, tflite_bytes.seeds(), count, budget, seed, tally, workers, cases)


def report(tallies: list[Tally], services: list[tuple[str, Service]], started: float, seed: int = 1) -> str:
    lines = [f"`python -m tests.fuzz --seed {seed}` ({'`make fuzz`' if seed == 1 else 'FUZZ_SEED'}) run "
             f"{time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores, {time.monotonic() - started:.0f} s in all. "
             f"Failing outcomes (the goal is 0): {', '.join(FAILING)}; the others are described in "
             "tests/fuzz/core.py.", "", summary_table(tallies, services)]
    for t in tallies:
        for note in t.notes:
            lines.append(f"- {t.part}: {note}")
    return "\n".join(lines)


def details(tallies: list[Tally], services: list[tuple[str, Service]]) -> str:
    out = []
    for t in tallies:
        shown = Counter()
        for o, d in t.listed:
            shown[o] += 1
            if shown[o] <= 15:
                out.append(f"  {t.part}: {o}: {d}")
    for t in tallies:
        if len(t.by_mutation) > 1:
            out.append(f"\n{t.part}: outcomes by mutation")
            for m, c in sorted(t.by_mutation.items()):
                out.append(f"  {m:22s} " + " ".join(f"{k}={v}" for k, v in c.most_common()))
    for name, s in services:
        found = s.log_findings()
        if found or s.deaths:
            out.append(f"\nservice for {name}: log")
            out.extend("  " + f for f in found)
            out.extend("  death: " + d for d in s.deaths)
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=10000)
    ap.add_argument("--seconds", type=float, default=1200)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--parts", default="abc")
    ap.add_argument("--workers", type=int, default=2, help="child processes at once (part c)")
    ap.add_argument("--replay", action="append", default=[], metavar="PART:CASE", help="run only these cases")
    ap.add_argument("--no-results", action="store_true", help="do not write bench/results.md")
    args = ap.parse_args(argv)
    if args.cases <= 0 or args.seconds <= 0 or not args.parts or not set(args.parts) <= set("abc"):
        print("error: --cases and --seconds must be > 0, --parts a subset of abc", file=sys.stderr)
        return 2
    replay: dict[str, list[int]] = {}
    for r in args.replay:
        part, _, n = r.partition(":")
        if part not in ("a", "b", "c") or not n.isdigit():
            print(f"error: --replay {r}: expected PART:CASE, e.g. a:17", file=sys.stderr)
            return 2
        replay.setdefault(part, []).append(int(n))
    started = time.monotonic()
    tallies, services = run(split_cases(args.cases, args.parts), args.seconds, args.seed, replay or None,
                            workers=args.workers)
    try:
        problems = service_problems(services)
        text = report(tallies, services, started, args.seed)
        print(details(tallies, services))
        print("\n" + text)
        if not args.no_results and not replay:
            print(f"\nwritten to {write_results_section(text)}")
    finally:
        for _, s in services:
            s.stop()
            s.cleanup()
    failed = sum(t.counts[o] for t in tallies for o in FAILING) + len(problems)
    for p in problems:
        print(f"FAILED: {p}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
