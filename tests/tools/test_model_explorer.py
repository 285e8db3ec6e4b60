"""Model Explorer overlays (`nnhal report --model_explorer`, nnhal/model_explorer.py).

The ids an overlay uses are checked against the model itself (the flatbuffer's operator lists,
read with the `tflite` package) and, where the optional ai-edge-model-explorer is installed,
against what its TFLite adapter really produces and its node_data_builder dataclasses accept.
Values are checked against the delegate's own report and the benchmark's own profile.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import subprocess
import sys

import numpy as np
import pytest

from delegate.report import delegation_report
from delegate.tfl import TfLiteModelBuilder, read_model
from delegate.tfl.schema import module
from nnhal.benchmark import benchmark
from nnhal.model_explorer import ADAPTER_ID, overlays
from tests.delegate.control_flow_models import if_model
from tests.delegate.models import head_model

HAVE_MODEL_EXPLORER = importlib.util.find_spec("model_explorer") is not None


def _operator_counts(model: bytes) -> list[int]:
    fb = module("Model").Model.GetRootAs(model, 0)
    return [fb.Subgraphs(k).OperatorsLength() for k in range(fb.SubgraphsLength())]


def _adapter_graphs(path) -> dict[str, dict]:
    """Model Explorer's own graphs for the model: graph id -> {"nodes": ..., "by_tensor": ...}, as
    its UI resolves node data keys (an output tensor name first, else a node id)."""
    from model_explorer.extension_manager import ExtensionManager
    manager = ExtensionManager([])
    manager.load_extensions()
    adapter = next(e for e in manager.extensions if e.metadata.id == ADAPTER_ID)
    collections = adapter.ext_class().convert(str(path), {})["graphCollections"]
    out = {}
    for g in (g for c in collections for g in c.graphs):
        g = g if isinstance(g, dict) else dataclasses.asdict(g)
        by_tensor = {}
        for n in g["nodes"]:
            for meta in n.get("outputsMetadata") or []:
                for attr in meta["attrs"]:
                    if attr["key"] == "tensor_name":
                        by_tensor[attr["value"]] = n["id"]
        out[g["id"]] = {"labels": {n["id"]: n["label"] for n in g["nodes"]}, "by_tensor": by_tensor}
    return out


def _check_against_adapter(path, data: dict, ops: list[int]) -> None:
    """Every key resolves, through Model Explorer's own lookup, to a distinct operator node."""
    graphs = _adapter_graphs(path)
    for overlay in data.values():
        assert set(overlay) <= set(graphs), (set(overlay), set(graphs))
        for gid, gdata in overlay.items():
            g = graphs[gid]
            hit = [g["by_tensor"].get(key, key) for key in gdata["results"]]
            assert len(set(hit)) == len(hit), "two keys land on one node"
            assert all(h in g["labels"] for h in hit)
            assert not any(g["labels"][h] in ("GraphInputs", "GraphOutputs", "pseudo_const") for h in hit)


def _check_schema(data: dict) -> None:
    """Each overlay file is a ModelNodeData of Model Explorer's node_data_builder: constructing its
    dataclasses from the JSON rejects unknown or missing fields, and writing them back gives
    the same JSON."""
    if not HAVE_MODEL_EXPLORER:  # an optional dependency: the checks above still run
        return
    import model_explorer.node_data_builder as nd
    for overlay in data.values():
        graphs = {}
        for gid, g in overlay.items():
            g = dict(g)
            g["results"] = {k: nd.NodeDataResult(**v) for k, v in g["results"].items()}
            g["thresholds"] = [nd.ThresholdItem(**t) for t in g.get("thresholds", [])]
            g["gradient"] = [nd.GradientItem(**t) for t in g.get("gradient", [])]
            graphs[gid] = nd.GraphNodeData(**g)
        back = json.loads(nd.ModelNodeData(graphsData=graphs).to_json_string())
        for gid, g in overlay.items():
            assert {k: v for k, v in back[gid].items() if v not in ([], False)} == g


LARGEST = {"partitioning": "largest"}


@pytest.fixture(scope="module")
def partly_supported(tmp_path_factory):
    """head_model with COS in the middle: two partitions around a CPU node (largest-first, whatever
    they cost), and its report."""
    path = tmp_path_factory.mktemp("me") / "head.tflite"
    path.write_bytes(head_model(np.float32, unsupported_middle=True))
    return path, delegation_report(str(path), **LARGEST)


def test_overlays_cover_every_node_with_the_report_values(partly_supported):
    path, report = partly_supported
    model = path.read_bytes()
    data = overlays(model, report)
    assert set(data) == {"placement", "partition"}
    n_ops = _operator_counts(model)[0]
    assert len(report.nodes) == n_ops and 0 < report.delegated < n_ops and len(report.partitions) == 2
    for overlay in data.values():
        (gid, g), = overlay.items()
        assert sorted(g["results"], key=int) == [str(i) for i in range(n_ops)]  # each node, once
    place, part = data["placement"]["main"]["results"], data["partition"]["main"]["results"]
    for n in report.nodes:
        assert place[str(n.index)]["value"] == n.placement
        assert part[str(n.index)]["value"] == (f"partition {n.partition}" if n.placement == "nnhal" else "CPU")
    colours = {p: {part[str(i)]["bgColor"] for i in nodes} for p, nodes in enumerate(report.partitions)}
    assert all(len(c) == 1 for c in colours.values()) and len(set.union(*colours.values())) == len(colours)
    _check_schema(data)
    if HAVE_MODEL_EXPLORER:
        _check_against_adapter(path, data, _operator_counts(model))


def _named_like_ids() -> bytes:
    """Tensors named "1", "2": Model Explorer would take key "1" for the producer of tensor "1"."""
    b = TfLiteModelBuilder()
    x = b.add_input("x", [1, 6])
    cur = x
    for name in ["2", "0", "cos"]:
        nxt = b.add_tensor(name, [1, 6])
        if name == "cos":
            b.add_operator("COS", [cur], [nxt])
        else:
            b.add_operator("ADD", [cur, x], [nxt], ("AddOptions", {"fused_activation_function": 0}))
        cur = nxt
    b.set_outputs([cur])
    return b.build()


def test_a_node_id_that_is_a_tensor_name_is_keyed_by_the_node_s_own_output(tmp_path):
    path = tmp_path / "names.tflite"
    model = _named_like_ids()
    path.write_bytes(model)
    report = delegation_report(str(path))
    data = overlays(model, report)
    graph = read_model(model)
    # The UI's lookup (genOutputTensorIdToNodeIdMap): an operator's output tensor name, else a node id.
    by_tensor = {graph.tensors[t].name: str(n.index) for n in graph.nodes for t in n.outputs}
    assert any(by_tensor.get(str(n.index), str(n.index)) != str(n.index) for n in graph.nodes)  # ids are taken
    for overlay in data.values():
        results = overlay["main"]["results"]
        landed = {by_tensor.get(key, key): r["value"] for key, r in results.items()}
        assert len(landed) == len(results) == len(report.nodes)
        for n in report.nodes:
            want = n.placement if overlay is data["placement"] else \
                (f"partition {n.partition}" if n.placement == "nnhal" else "CPU")
            assert landed[str(n.index)] == want
    _check_schema(data)
    if HAVE_MODEL_EXPLORER:
        _check_against_adapter(path, data, _operator_counts(model))


def test_subgraphs_a_delegated_if_runs_are_on_nnhal_in_its_partition(tmp_path):
    path = tmp_path / "if.tflite"
    model = if_model()
    path.write_bytes(model)
    report = delegation_report(str(path))
    (node,) = report.nodes
    assert node.op == "IF" and node.placement == "nnhal", node.reason
    data = overlays(model, report)
    fb = module("Model").Model.GetRootAs(model, 0)
    names = [fb.Subgraphs(k).Name().decode() for k in range(fb.SubgraphsLength())]
    counts = _operator_counts(model)
    for overlay in data.values():
        assert set(overlay) == {names[0] or "main", *names[1:]}
    for k, name in enumerate(names[1:], 1):
        place, part = data["placement"][name]["results"], data["partition"][name]["results"]
        assert sorted(place, key=int) == [str(i) for i in range(counts[k])]
        assert {r["value"] for r in place.values()} == {"nnhal"}
        assert {r["value"] for r in part.values()} == {f"partition {node.partition}"}
    _check_schema(data)
    if HAVE_MODEL_EXPLORER:
        _check_against_adapter(path, data, counts)


def test_latency_overlay_is_the_benchmark_profile_per_node(partly_supported):
    path, report = partly_supported
    bench = benchmark(str(path), runs=2, warmup=0, min_secs=0.0, options=LARGEST)
    assert bench["delegation"]["delegated_nodes"] == report.delegated
    data = overlays(path.read_bytes(), report, bench)
    lat = data["latency"]["main"]
    assert set(lat["results"]) == {str(n.index) for n in report.nodes if n.placement == "nnhal"}
    rows = [r for r in bench["operations"] if r["nodes"]]
    assert rows and all(r["partition"] < len(report.partitions) for r in rows)
    assert sum(r["value"] for r in lat["results"].values()) == pytest.approx(sum(r["avg_us"] for r in rows),
                                                                           rel=1e-3, abs=1e-2)
    for r in rows:  # a node's value: its share of every row that timed it
        for n in r["nodes"]:
            share = sum(q["avg_us"] / len(q["nodes"]) for q in rows if n in q["nodes"])
            assert lat["results"][str(n)]["value"] == pytest.approx(share, abs=1e-3)
    assert [g["stop"] for g in lat["gradient"]][0] == 0 and lat["gradient"][-1]["stop"] == 1
    _check_schema(data)


def test_report_cli_writes_one_file_per_overlay(partly_supported, tmp_path):
    path, report = partly_supported
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps(benchmark(str(path), runs=1, warmup=0, min_secs=0.0, options=LARGEST)))
    out = subprocess.run([sys.executable, "-m", "nnhal.cli", "report", "--model_file", str(path),
                          "--model_explorer", str(tmp_path / "ov.json"), "--benchmark_json", str(bench),
                          "--partitioning", "largest"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "nodes delegated in" in out.stdout  # stdout: the report, as without the flag
    want = overlays(path.read_bytes(), report)
    for name in ("placement", "partition"):
        assert json.loads((tmp_path / f"ov.{name}.json").read_text()) == want[name]
    latency = json.loads((tmp_path / "ov.latency.json").read_text())
    assert set(latency["main"]["results"]) == {str(n.index) for n in report.nodes if n.placement == "nnhal"}
    bad = tmp_path / "other.json"
    bad.write_text(json.dumps({**json.loads(bench.read_text()), "model": "other.tflite"}))
    out = subprocess.run([sys.executable, "-m", "nnhal.cli", "report", "--model_file", str(path),
                          "--model_explorer", str(tmp_path / "ov2"), "--benchmark_json", str(bad)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "benchmark of other.tflite" in out.stderr, out.stderr


@pytest.mark.skipif(HAVE_MODEL_EXPLORER, reason="ai-edge-model-explorer is installed")
def test_explore_without_model_explorer_says_how_to_install(partly_supported):
    path, _ = partly_supported
    out = subprocess.run([sys.executable, "-m", "nnhal.cli", "explore", str(path)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2 and "pip install" in out.stderr and "ai-edge-model-explorer" in out.stderr
    assert "Traceback" not in out.stderr
