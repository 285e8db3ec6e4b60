"""The soak's verdict: RSS growth after warm-up, the pass criteria, the summary table, and the
"Soak" section of bench/results.md (replaced in place; the other sections are left as they are).

RSS growth of a window (the whole run for a client; for the service, its longest life, because a
restarted service is a new process): warm-up is the window's first WARMUP_FRACTION; the baseline is
the median VmRSS over the next EDGE_FRACTION of the window, the final figure the median over its last
EDGE_FRACTION; growth = final / baseline - 1. Medians, because Interpreters are created and freed all
the time and RSS moves with them; a leak moves both the median and the peak.
"""
from __future__ import annotations

import re
import statistics
from dataclasses import dataclass
from pathlib import Path

WARMUP_FRACTION = 0.2
EDGE_FRACTION = 0.1
SECTION_TITLE = "## Soak"


@dataclass
class Growth:
    baseline: int
    final: int
    peak: int
    samples: int

    @property
    def fraction(self) -> float:
        return self.final / self.baseline - 1 if self.baseline else 0.0


def growth(samples: list[tuple[float, int]], start: float, end: float) -> Growth | None:
    """RSS growth after warm-up of the samples (time, bytes) within [start, end]; None if too few."""
    span = end - start
    w0 = start + WARMUP_FRACTION * span
    after = [(t, r) for t, r in samples if w0 <= t <= end]
    base = [r for t, r in after if t <= w0 + EDGE_FRACTION * span]
    last = [r for t, r in after if t >= end - EDGE_FRACTION * span]
    if not base or not last:
        return None
    return Growth(int(statistics.median(base)), int(statistics.median(last)), max(r for _, r in after), len(after))


@dataclass
class Criterion:
    name: str
    measured: str
    ok: bool


def fmt(v: float | None) -> str:
    return "" if v is None else f"{v:.1f}"


def _mb(n: int) -> str:
    return f"{n / 2**20:.1f}"


def growth_cell(g: Growth | None) -> str:
    if g is None:
        return "too few samples"
    return f"{_mb(g.baseline)} → {_mb(g.final)} MB ({g.fraction * 100:+.1f}%), peak {_mb(g.peak)} MB"


def to_markdown(r: dict) -> str:
    """The soak's section body: parameters, criteria, per-process figures, the service's lives."""
    lines = [f"{SECTION_TITLE} (`make soak`)", "",
             f"Measured {r['date']}: {r['seconds']:g} s, {r['clients']} client processes "
             f"({r['models']}; an Interpreter freed and re-created every {r['recreate_every']} executions, one "
             f"creation in {r['fresh_token_every']} with a new cache token), one `nnhal serve` "
             f"({' '.join(r['serve_args']) or 'default options'}). Faults: {r['faults']}. Client waits: "
             f"$NNHAL_EXECUTE_WAIT_MIN_S={r['wait_min']:g}. Every output is checked against TFLite "
             f"(reference kernels when delegated, its default kernels when nothing was delegated): quantized "
             f"bit-exact, float within 1e-4 of the output's largest magnitude. A client that makes no "
             f"progress for {r['hang_s']:g} s is hung. Each client runs its models once in-process on hal "
             f"before the run (the fallback path's one-time loading of the backends is not growth). RSS "
             f"(VmRSS, sampled every {r['sample_s']:g} s): warm-up is "
             f"the first {WARMUP_FRACTION:.0%} of the window (a client's window is the run; the service's is its "
             f"longest life, since a restart is a new process); growth compares the median over the next "
             f"{EDGE_FRACTION:.0%} with the median over the last {EDGE_FRACTION:.0%}.", "",
             "| criterion | measured | pass |", "|---|---|---|"]
    lines += [f"| {c.name} | {c.measured} | {'yes' if c.ok else '**no**'} |" for c in r["criteria"]]
    lines += ["", f"Verdict: **{'PASS' if r['passed'] else 'FAIL'}**.", "",
              "| process | executions | on the service | in-process fallback | TFLite CPU (not delegated) | wrong | "
              "errors | Interpreters created | RSS after warm-up |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for c in r["client_rows"]:
        s = c["stats"]
        lines.append(f"| client {c['index']} (pid {c['pid']}){' ' + c['fate'] if c['fate'] else ''} | "
                     f"{s.get('executions', 0):,} | {s.get('on_service', 0):,} | {s.get('fallback', 0):,} | "
                     f"{s.get('cpu_only', 0):,} | {s.get('wrong', 0)} | {s.get('errors', 0)} | "
                     f"{s.get('created', 0)} | {growth_cell(c['growth'])} |")
    lines.append(f"| service, longest life (pid {r['service_pid']}) | | | | | | | | "
                 f"{growth_cell(r['service_growth'])} |")
    lines += ["", "Service lives (s from the start of the run):", "",
              "| # | pid | started | answering | ended | how | length s | RSS peak MB |",
              "|---:|---:|---:|---:|---:|---|---:|---:|"]
    for i, (life, peak) in enumerate(r["lives"]):
        lines.append(f"| {i} | {life.pid} | {fmt(life.started)} | {fmt(life.ready)} | {fmt(life.ended)} | {life.how} | "
                     f"{life.length(r['seconds']):.1f} | {'' if peak is None else _mb(peak)} |")
    if r["notes"]:
        lines += [""] + [f"- {n}" for n in r["notes"]]
    return "\n".join(lines) + "\n"


def replace_section(path: Path, section: str, title: str = SECTION_TITLE) -> None:
    """Write ``section`` (starting with its ``title`` heading, "## Soak") into ``path``: in place of
    an earlier section of that title (up to the next "## " heading), else appended; everything else
    is kept (bench.fleet writes its "## Fleet" section so too)."""
    text = path.read_text() if path.exists() else ""
    pattern = re.compile(rf"^{re.escape(title)}\b.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(text):
        text = pattern.sub(lambda _: section.rstrip("\n") + "\n\n", text, count=1).rstrip("\n") + "\n"
    else:
        text = (text.rstrip("\n") + "\n\n" if text else "") + section
    path.write_text(text)
