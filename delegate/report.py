"""`nnhal report`: which node of a .tflite model runs where, and why not on nnhal."""
from __future__ import annotations

import dataclasses
import json

from delegate.delegation_report import DelegationReport
from delegate.nnhal_delegate import load_delegate


def delegation_report(model_path: str, service_address: str | None = None, **options) -> DelegationReport:
    """Load the model in TFLite with the nnhal delegate and return what the delegate decided.

    A model TFLite cannot load (e.g. CUSTOM ops nobody claimed) raises ValueError whose message
    says which installed extension would provide each custom op."""
    from delegate.runtime import Interpreter
    d = load_delegate(service_address, **options)
    try:
        it = Interpreter(model_path=model_path, experimental_delegates=[d])
        it.allocate_tensors()
    except (RuntimeError, ValueError) as e:
        hint = custom_op_hints(model_path)
        raise ValueError(f"{e}".strip() + (f"; {hint}" if hint else "")) from None
    d.impl.fetch_backends()
    return d.report


def custom_op_hints(model_path: str) -> str:
    """Which extension (installed here) implements each CUSTOM op of the model."""
    from delegate.mapping.core import custom_provider
    from delegate.tfl import read_model
    from extensions import ensure_plugins_loaded
    ensure_plugins_loaded()
    try:
        with open(model_path, "rb") as f:
            graph = read_model(f.read())
    except (OSError, ValueError):
        return ""
    hints = []
    for code in sorted({n.custom_code for g in graph.subgraphs for n in g.nodes if n.custom_code}):
        found = custom_provider(type("N", (), {"custom_code": code})())
        hints.append(f"custom op {code!r} is provided by extension {found[0].name} (needs a running nnhal service)"
                     if found else f"custom op {code!r}: no installed nnhal extension implements it")
    return "; ".join(hints)


def format_report(r: DelegationReport) -> str:
    lines = [f"{'node':>5}  {'op':<24} {'placement':<9} {'partition':>9}  {'backend':<10}  reason"]
    for n in r.nodes:
        part = "" if n.partition is None else str(n.partition)
        lines.append(f"{n.index:>5}  {n.op:<24} {n.placement:<9} {part:>9}  {n.backend or '':<10}  {n.reason or ''}")
    lines.append(f"{r.delegated}/{len(r.nodes)} nodes delegated in {len(r.partitions)} partition(s)"
                 + (f" to {r.service}" if r.service else "") + (f"; {r.error}" if r.error else ""))
    lines += format_candidates(r.candidates)
    for k, sub in sorted(r.subgraphs.items()):  # IF / WHILE subgraphs TFLite runs itself
        lines.append(f"subgraph {k}: {sub.delegated}/{len(sub.nodes)} nodes delegated in {len(sub.partitions)} "
                     f"partition(s)" + "".join(f"; node {n.index} {n.op}: {n.reason}" for n in sub.nodes
                                               if n.placement != "nnhal"))
    return "\n".join(lines)


def report_json(r: DelegationReport) -> str:
    d = dataclasses.asdict(r)
    d["delegated"] = r.delegated
    return json.dumps(d, indent=1)


def _ranges(nodes: list[int]) -> str:
    """[0, 1, 2, 5] -> "0-2,5"."""
    out: list[str] = []
    for n in sorted(nodes):
        if out and n == int(out[-1].split("-")[-1]) + 1:
            out[-1] = f"{out[-1].split('-')[0]}-{n}"
        else:
            out.append(str(n))
    return ",".join(out)


def format_candidates(candidates) -> list[str]:
    """One line per partition candidate: its estimate (delegate.cost) and the decision."""
    if not candidates:
        return []
    lines = ["partition candidates (estimated us: CPU | nnhal = compute and per-node dispatch + invoke + transfer):"]
    for e in candidates:
        lines.append(f"  nodes {_ranges(e.nodes)} ({len(e.nodes)}): CPU {e.cpu_us:.1f} | nnhal {e.nnhal_us:.1f} = "
                     f"{e.compute_us:.1f} + {e.overhead_us:.1f} + {e.transfer_us:.1f} ({e.transfer_bytes} bytes)"
                     f" -> {e.reason}")
    return lines
