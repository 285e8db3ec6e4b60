"""Overlays of the delegate's decisions for Google's Model Explorer (``ai-edge-model-explorer``).

Model Explorer colours a graph with "node data": JSON that maps each graph id to a
``{"results": {node key: {"value": ...}}, "thresholds" / "gradient": ...}`` table
(``model_explorer.node_data_builder.ModelNodeData`` / ``GraphNodeData`` / ``NodeDataResult``).
One such file is one overlay (one "run" in its UI: the file's ``name``, one colour scheme), so
``nnhal report --model_explorer FILE`` writes one file per overlay: placement (nnhal / CPU),
partition, and, from ``nnhal benchmark --json`` (the service's per-operation profile), latency.

Ids must be the ones Model Explorer's built-in TFLite flatbuffer adapter gives
(``builtin_tflite_flatbuffer``, the default for .tflite; ``nnhal explore`` asks for it by name):

- a graph is named by its subgraph's name, else its signature key, else ``main`` (subgraph 0)
  or ``subgraph_<index>``;
- an operator node's id is its index in the subgraph's operator list (GraphInputs, GraphOutputs
  and pseudo_const nodes come after). A result key is looked up as an output tensor name first,
  so a node whose id is also a tensor's name (common in converted models: tensors named "3") is
  keyed by one of its own output tensor names instead.

This module is a tool of the command line (it reads ``nnhal benchmark`` output), hence in
``nnhal/``, not ``delegate/``: the delegate's report stays the one source of the decisions.
"""
from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field

from delegate.delegation_report import DelegationReport
from delegate.tfl import TfLiteGraph, read_model
from delegate.tfl.schema import module

ADAPTER_ID = "builtin_tflite_flatbuffer"
INSTALL_HINT = ("Model Explorer is an optional dependency: pip install 'nnhal[explorer]' "
                "(or pip install ai-edge-model-explorer)")
OVERLAYS = ("placement", "partition", "latency")

NNHAL_COLOR, CPU_COLOR = "#34a853", "#bdbdbd"
#: Partition colours (Google's categorical palette), repeated for more partitions.
PARTITION_COLORS = ("#4285f4", "#ea4335", "#fbbc04", "#34a853", "#ff6d01", "#46bdc6", "#7baaf7", "#f07b72",
                    "#fcd04f", "#71c287", "#ff994d", "#7ed1d7")
LATENCY_GRADIENT = [{"stop": 0, "bgColor": "#fff5eb"}, {"stop": 0.5, "bgColor": "#fd8d3c"},
                    {"stop": 1, "bgColor": "#a63603"}]


@dataclass
class ExplorerGraph:
    """One subgraph as Model Explorer names it."""
    index: int
    id: str
    #: TFLite node index -> the key Model Explorer resolves to that node's id.
    keys: dict[int, str] = field(default_factory=dict)
    #: Nodes no key reaches (their id and every output name are other nodes' tensor names).
    unreachable: list[int] = field(default_factory=list)


def explorer_graphs(model: bytes) -> list[ExplorerGraph]:
    """Model Explorer's graph ids and node keys for every subgraph of the model."""
    graph = read_model(model)  # verifies the flatbuffer first
    fb = module("Model").Model.GetRootAs(model, 0)
    signature_keys: dict[int, str] = {}
    for s in range(fb.SignatureDefsLength()):
        sig = fb.SignatureDefs(s)
        signature_keys.setdefault(sig.SubgraphIndex(), (sig.SignatureKey() or b"").decode())
    out = []
    for k, sub in enumerate(graph.subgraphs):
        name = (fb.Subgraphs(k).Name() or b"").decode()
        gid = name or signature_keys.get(k) or ("main" if k == 0 else f"subgraph_{k}")
        out.append(_keys(ExplorerGraph(k, gid), sub))
    return out


def _keys(eg: ExplorerGraph, g: TfLiteGraph) -> ExplorerGraph:
    """The UI maps a result key through {output tensor name: producing node} before taking it as a
    node id; producers are GraphInputs, the operators and pseudo_const nodes (constants and
    other unproduced inputs), later ones winning a shared name."""
    names = lambda ts: [g.tensors[t].name for t in ts if 0 <= t < len(g.tensors)]  # noqa: E731
    producer: dict[str, object] = {n: "inputs" for n in names(g.inputs)}
    produced = set(g.inputs)
    for node in g.nodes:
        for t in node.inputs:
            if t >= 0 and t not in produced:
                producer[g.tensors[t].name] = ("const", t)
                produced.add(t)
        for n in names(node.outputs):
            producer[n] = node.index
        produced.update(node.outputs)
    for node in g.nodes:
        key = str(node.index)
        if key in producer:
            key = next((n for n in names(node.outputs) if producer[n] == node.index), None)
        if key is None:
            eg.unreachable.append(node.index)
        else:
            eg.keys[node.index] = key
    return eg


def _graph_data(name: str, results: dict[str, dict], **style) -> dict:
    return {"name": name, "results": results, **style}


def _reports_by_subgraph(model: bytes, report: DelegationReport) -> dict[int, list[tuple[int, str, int | None]]]:
    """Subgraph index -> (node, placement, partition) for every subgraph whose placement is known:
    0, the subgraphs TFLite prepared the delegate on, and those a delegated IF / WHILE runs
    (all of theirs on nnhal, in the partition of that node)."""
    from delegate.simple import absorbed_subgraphs, named_subgraphs
    rows = {0: [(n.index, n.placement, n.partition) for n in report.nodes]}
    for k, sub in report.subgraphs.items():
        if k > 0:  # negative: TFLite did not say which subgraph
            rows[k] = [(n.index, n.placement, n.partition) for n in sub.nodes]
    graph = read_model(model)
    on = [n for n in report.nodes if n.placement == "nnhal" and n.index < len(graph.nodes)]
    absorbed = absorbed_subgraphs(graph, [n.index for n in on])
    partitions: dict[int, set] = {}
    for n in on:  # which partitions run each absorbed subgraph (nested control flow included)
        stack = named_subgraphs(graph.nodes[n.index])
        while stack:
            k = stack.pop()
            if k in absorbed and n.partition not in partitions.setdefault(k, set()):
                partitions[k].add(n.partition)
                stack.extend(j for m in graph.subgraph(k).nodes for j in named_subgraphs(m))
    for k, ps in sorted(partitions.items()):
        if k not in rows and k < len(graph.subgraphs):
            p = next(iter(ps)) if len(ps) == 1 else None
            rows[k] = [(m.index, "nnhal", p) for m in graph.subgraph(k).nodes]
    return rows


def latency_by_node(benchmark: dict, report: DelegationReport) -> dict[int, float]:
    """Mean microseconds per delegated node of subgraph 0, from ``nnhal benchmark --json``.

    The profile has one row per NNAPI operation the service timed (or per partition a graph
    backend runs whole); each row names the TFLite nodes it came from. A TFLite node mapped to
    several NNAPI operations gets their sum; a row covering several nodes is shared equally."""
    rows = benchmark.get("operations")
    if rows is None:
        raise ValueError("no per-operation profile in the benchmark JSON (nnhal benchmark --json)")
    main_parts = benchmark.get("delegation", {}).get("partitions", len(report.partitions))
    delegated = {n.index for n in report.nodes if n.placement == "nnhal"}
    out: dict[int, float] = {}
    for r in rows:
        if r.get("partition", 0) >= main_parts:
            continue  # a kernel of another subgraph (TFLite prepares subgraph 0 first)
        if "nodes" not in r:
            raise ValueError("the benchmark JSON has no TFLite nodes per profile row: re-run nnhal benchmark")
        nodes = r["nodes"]
        if not nodes:
            continue  # nothing of the user's graph (e.g. an operation folding left behind)
        if not set(nodes) <= delegated:
            raise ValueError(f"the benchmark ran nodes {sorted(set(nodes) - delegated)} on nnhal that this report "
                             f"leaves on the CPU: run both with the same model and delegate options")
        for n in nodes:
            out[n] = out.get(n, 0.0) + r["avg_us"] / len(nodes)
    return out


def _partition_result(p: int | None) -> dict:
    if p is None:  # a subgraph that delegated IF / WHILE nodes of several partitions run
        return {"value": "nnhal", "bgColor": NNHAL_COLOR}
    return {"value": f"partition {p}", "bgColor": PARTITION_COLORS[p % len(PARTITION_COLORS)]}


def overlays(model: bytes, report: DelegationReport, benchmark: dict | None = None) -> dict[str, dict]:
    """Overlay name -> Model Explorer ModelNodeData (graph id -> GraphNodeData), as JSON values."""
    graphs = {g.index: g for g in explorer_graphs(model)}
    rows = _reports_by_subgraph(model, report)
    placement: dict[str, dict] = {}
    partition: dict[str, dict] = {}
    for k, nodes in sorted(rows.items()):
        eg = graphs[k]
        place, part = {}, {}
        for index, where, p in nodes:
            key = eg.keys.get(index)
            if key is None:
                continue
            on = where == "nnhal"
            place[key] = {"value": where, "bgColor": NNHAL_COLOR if on else CPU_COLOR}
            part[key] = _partition_result(p) if on else {"value": "CPU", "bgColor": CPU_COLOR}
        categorical = {"showExpandedSummaryOnGroupNode": True, "showLabelCountColumnsInChildrenStatsTable": True}
        placement[eg.id] = _graph_data("nnhal placement", place, **categorical)
        partition[eg.id] = _graph_data("nnhal partition", part, **categorical)
    out = {"placement": placement, "partition": partition}
    if benchmark is not None:
        eg = graphs[0]
        lat = {eg.keys[n]: {"value": round(us, 3)} for n, us in sorted(latency_by_node(benchmark, report).items())
               if n in eg.keys}
        out["latency"] = {eg.id: _graph_data("nnhal latency (us)", lat, gradient=LATENCY_GRADIENT)}
    return out


def overlay_paths(target: str, names=OVERLAYS) -> dict[str, str]:
    """``out.json`` (or ``out``) -> {overlay: ``out.<overlay>.json``}: one file per overlay, since
    a node data file is one overlay in Model Explorer."""
    stem = target[:-5] if target.endswith(".json") else target
    return {n: f"{stem}.{n}.json" for n in names}


def write_overlays(target: str, model_path: str, report: DelegationReport, benchmark: dict | None = None
                   ) -> list[str]:
    with open(model_path, "rb") as f:
        data = overlays(f.read(), report, benchmark)
    paths = overlay_paths(target, list(data))
    for name, path in paths.items():
        with open(path, "w") as f:
            json.dump(data[name], f, indent=1)
    return list(paths.values())


def read_benchmark(path: str | None, model_path: str) -> dict | None:
    """``nnhal benchmark --json`` output, checked to be for this model (by file name)."""
    if path is None:
        return None
    with open(path) as f:
        bench = json.load(f)
    if not isinstance(bench, dict) or "operations" not in bench:
        raise ValueError(f"{path} is not nnhal benchmark --json output")
    if bench.get("model") not in (None, os.path.basename(model_path)):
        raise ValueError(f"{path} is a benchmark of {bench['model']}, not of {os.path.basename(model_path)}")
    return bench


def explore(model_path: str, node_data_paths: list[str], port: int = 8080, open_browser: bool = True) -> int:
    """Start Model Explorer on the model with the overlays (blocks until Ctrl-C)."""
    try:
        import model_explorer
    except ImportError:
        print(f"nnhal explore: {INSTALL_HINT}", file=sys.stderr)
        return 2
    config = model_explorer.config()
    config.add_model_from_path(os.path.abspath(model_path), adapterId=ADAPTER_ID)
    for p in node_data_paths:  # the last one added is the one shown first
        config.add_node_data_from_path(os.path.abspath(p))
    model_explorer.visualize_from_config(config, port=port, no_open_in_browser=not open_browser)
    return 0
