"""What the nnhal delegate decided for each node of a model: where it runs and why not on nnhal.

Filled by NnhalDelegate (delegate.nnhal_delegate) as TFLite prepares it; read by `nnhal report`
(delegate.report), the tools and Model Explorer overlays (nnhal.model_explorer)."""
from __future__ import annotations

from dataclasses import dataclass, field

from delegate.cost import PartitionEstimate
from delegate.partition import PartitionPlan


@dataclass
class NodeReport:
    """One TFLite node of the subgraph."""

    index: int  #: the node's index in TFLite's execution plan
    op: str  #: its TFLite operator ("CONV_2D", a custom op's code, ...)
    placement: str = "CPU"  #: "nnhal" (in a delegated partition) or "CPU" (TFLite's kernels)
    partition: int | None = None  #: index into DelegationReport.partitions when on nnhal
    #: Why it stays on the CPU: no NNAPI mapping, hal's rule it breaks, the service's refusal, the
    #: partitioning rule (estimated slower, partition limit), "nnhal service unreachable". None on nnhal.
    reason: str | None = None
    #: The service's compute backend(s) for this node's NNAPI operations (filled by
    #: NnhalDelegate.fetch_backends, e.g. for `nnhal report`).
    backend: str | None = None


@dataclass
class DelegationReport:
    """``delegate.report`` (``load_delegate(...).report``): filled while TFLite prepares the model,
    i.e. after ``Interpreter(..., experimental_delegates=[d])``; ``delegated`` counts the nodes on nnhal."""

    nodes: list[NodeReport] = field(default_factory=list)  #: every node of the primary subgraph
    partitions: list[list[int]] = field(default_factory=list)  #: node indices of each delegated partition
    service: str | None = None  #: the address of the service the partitions run on ("unix:/...")
    error: str | None = None  #: why nothing could be delegated (e.g. the service unreachable)
    #: Other subgraphs TFLite prepared the delegate on, by subgraph index (negative: not known):
    #: those of IF / WHILE nodes left to TFLite's CPU (a delegated IF / WHILE runs its subgraphs).
    subgraphs: dict[int, DelegationReport] = field(default_factory=dict)
    #: Each partition candidate's estimated cost (CPU vs nnhal, delegate.cost) and the decision.
    candidates: list[PartitionEstimate] = field(default_factory=list)

    @property
    def delegated(self) -> int:
        return sum(n.placement == "nnhal" for n in self.nodes)


def fill_report(report: DelegationReport, plan: PartitionPlan, reasons: dict[int, str | None]) -> None:
    report.partitions = plan.partitions
    report.candidates = plan.estimates
    part_of = {n: p for p, nodes in enumerate(plan.partitions) for n in nodes}
    for r in report.nodes:
        if r.index in part_of:
            r.placement, r.partition, r.reason = "nnhal", part_of[r.index], None
        else:
            r.reason = plan.rejected.get(r.index) or reasons.get(r.index) or "not supported"
