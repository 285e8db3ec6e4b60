"""Graph partitioning: connected, dependency-safe node subsets, then the options' selection.

The subsets are those TFLite's PartitionGraphIntoIndependentNodeSubsets builds:
walking the execution plan, a subset grows with every ready node of its kind
(delegated or not), so no delegated subset ever needs a tensor that a later
CPU subset produces.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from delegate.cost import CostModel, PartitionEstimate
from delegate.tfl.graph import TfLiteGraph

#: ``partitioning`` (delegate.cost says how a partition's cost is estimated):
#: - "cost" (the default): a graph the service supports whole runs on it whole, as the user who
#:   loaded the delegate asked; a graph it supports only in part is split by estimated cost: the
#:   partitions that save the most time first, none estimated slower than the CPU.
#: - "cost_strict": the cost rule for every partition, a whole graph included: nothing runs on
#:   the service unless it is estimated faster there.
#: - "largest": TFLite NNAPI delegate's rule: the largest partitions, whatever they cost.
PARTITIONING = ("cost", "cost_strict", "largest")


def independent_subsets(graph: TfLiteGraph, delegated: set[int]) -> list[tuple[bool, list[int]]]:
    """All subsets in run order, each (is_delegated, node indexes)."""
    produced_by = {t: n.index for n in graph.nodes for t in n.outputs}
    done: set[int] = set()
    remaining = [n.index for n in graph.nodes]

    def ready(k: int) -> bool:
        return all(t < 0 or t not in produced_by or produced_by[t] in done for t in graph.nodes[k].inputs)

    subsets = []
    while remaining:
        first = next((k for k in remaining if ready(k)), None)
        if first is None:  # a cycle: not a valid TFLite graph; keep the rest on CPU
            subsets.append((False, remaining))
            break
        kind = first in delegated
        subset: list[int] = []
        progress = True
        while progress:
            progress = False
            for k in list(remaining):
                if (k in delegated) == kind and ready(k):
                    subset.append(k)
                    done.add(k)
                    remaining.remove(k)
                    progress = True
        subsets.append((kind, subset))
    return subsets


@dataclass(frozen=True)
class PartitionOptions:
    max_delegated_partitions: int = 3  # TFLite NNAPI delegate's default; 0 = unlimited
    min_nodes_per_partition: int = 1
    node_ranges: tuple[tuple[int, int], ...] | None = None  # manual "0-11,177-215", inclusive
    partitioning: str = "cost"
    #: The device's speeds and invoke costs: estimates for the report in every mode; the cost rule
    #: needs it (without it, a partition the rule would judge stays on the CPU).
    cost: CostModel | None = None


def parse_node_ranges(spec: str | None) -> tuple[tuple[int, int], ...] | None:
    """'0-11,177-215' -> ((0, 11), (177, 215)); single nodes '5' allowed."""
    if spec is None or spec == "":
        return None
    out = []
    for part in spec.split(","):
        m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
        if not m:
            raise ValueError(f"bad node range {part!r} in partitions={spec!r} (want e.g. '0-11,177-215')")
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        if hi < lo:
            raise ValueError(f"bad node range {part!r}: end before start")
        out.append((lo, hi))
    return tuple(out)


@dataclass
class PartitionPlan:
    partitions: list[list[int]]          # chosen: largest first, or (cost) largest saving first
    rejected: dict[int, str]             # node -> why a supported node stays on CPU
    #: Every partition candidate's estimate and decision, in run order (empty without a cost model).
    estimates: list[PartitionEstimate] = field(default_factory=list)

    @property
    def nodes(self) -> set[int]:
        return {n for p in self.partitions for n in p}


def choose_partitions(graph: TfLiteGraph, supported: set[int], options: PartitionOptions) -> PartitionPlan:
    if options.partitioning not in PARTITIONING:
        raise ValueError(f"unknown partitioning {options.partitioning!r} (one of: {', '.join(PARTITIONING)})")
    rejected: dict[int, str] = {}
    candidates = set(supported)
    if options.node_ranges is not None:
        inside = {n for lo, hi in options.node_ranges for n in range(lo, hi + 1)}
        for n in candidates - inside:
            rejected[n] = "outside the requested node ranges"
        candidates &= inside
    parts = [nodes for kind, nodes in independent_subsets(graph, candidates) if kind]
    model = options.cost
    estimates = ({p[0]: model.estimate(graph, p, taking_turns=len(parts) > 1) for p in parts}
                 if model is not None else {})

    def drop(p: list[int], why: str) -> None:
        for n in p:
            rejected[n] = why
        if p[0] in estimates:
            estimates[p[0]].reason = why if why.startswith("kept on CPU") else f"kept on CPU: {why}"

    by_cost = options.partitioning != "largest"
    #: "cost" delegates a wholly supported graph whatever it costs: no partition boundary, the
    #: device the user asked for. (A graph of one node counts: nothing is left for TFLite.)
    whole = (options.partitioning == "cost" and len(parts) == 1 and options.node_ranges is None
             and len(parts[0]) == len(graph.nodes))
    keep = []
    for p in parts:
        if len(p) < options.min_nodes_per_partition:
            drop(p, f"partition of {len(p)} nodes < min_nodes_per_partition")
        elif whole or not by_cost:
            keep.append(p)
        elif model is None:
            drop(p, "cost partitioning: the service's capabilities are unknown")
        elif estimates[p[0]].saving_us <= 0:
            drop(p, f"kept on CPU: estimated {-estimates[p[0]].saving_us:.1f} us slower")
        else:
            keep.append(p)
    if by_cost and not whole:
        keep.sort(key=lambda p: (-estimates[p[0]].saving_us, p[0]))
    else:
        keep.sort(key=lambda p: (-len(p), p[0]))
    if options.max_delegated_partitions > 0:
        for p in keep[options.max_delegated_partitions:]:
            drop(p, f"beyond max_delegated_partitions={options.max_delegated_partitions}")
        keep = keep[:options.max_delegated_partitions]
    for k, p in enumerate(keep):
        if p[0] in estimates:
            e = estimates[p[0]]
            e.delegated, e.partition = True, k
            if e.saving_us > 0:
                e.reason = f"delegated: saves {e.saving_us:.1f} us"
            elif whole:
                e.reason = (f"delegated (the whole graph is supported): estimated {-e.saving_us:.1f} us slower; "
                            "partitioning='cost_strict' would keep it on CPU")
            else:
                e.reason = f"delegated (largest first): estimated {-e.saving_us:.1f} us slower"
    return PartitionPlan(keep, rejected, [estimates[p[0]] for p in parts if p[0] in estimates])
