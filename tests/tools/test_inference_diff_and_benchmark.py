"""inference_diff and nnhal benchmark: output parsed back, and clear errors for bad models."""
from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import pytest

from delegate.tfl import TfLiteModelBuilder
from nnhal.examples import mobilenet_like
from tests.delegate.models import model_writing_a_constant

DIFF_FORMAT = [
    r"^Num evaluation runs: (\d+)$",
    r"^Reference run latency: avg=([\d.]+)\(us\), std_dev=([\d.]+)\(us\)$",
    r"^Test run latency: avg=([\d.]+)\(us\), std_dev=([\d.]+)\(us\)$",
    r"^OutputDiff\[0\]: avg_error=([\d.e+-]+), std_dev=([\d.e+-]+)$",
    r"^OutputMaxError\[0\]: max_abs_error=([\d.e+-]+), relative_error=([\d.e+-]+)$",
    r"^Delegation: (\d+)/(\d+) nodes in (\d+) partition\(s\) on nnhal",
    r"^Input 0 range \[-128, 127\] \(from default\)$",  # the int8 input's type range
]


def _cli(*args, timeout=180):
    return subprocess.run([sys.executable, "-m", "nnhal.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture
def int8_model(tmp_path):
    p = tmp_path / "m_int8.tflite"
    p.write_bytes(mobilenet_like(np.int8, input_size=16, width=4))
    return p


def test_inference_diff_format_and_json(server, int8_model, tmp_path):
    out_json = tmp_path / "metrics.json"
    r = _cli("inference-diff", "--model_file", str(int8_model), "--num_runs", "4", "--service_address",
             server.address, "--output_file_path", str(out_json), "--reference_kernels")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert len(lines) == len(DIFF_FORMAT)
    groups = [re.match(p, line) for p, line in zip(DIFF_FORMAT, lines)]
    assert all(groups), lines
    assert groups[0].group(1) == "4"
    # Against TFLite's reference kernels the int8 model is bit-exact: zero error.
    assert float(groups[3].group(1)) == 0.0 and float(groups[4].group(1)) == float(groups[4].group(2)) == 0.0
    delegated, total = int(groups[5].group(1)), int(groups[5].group(2))
    assert delegated == total > 0
    m = json.loads(out_json.read_text())
    assert m["num_runs"] == 4 and m["output_errors"][0]["avg_error"] == 0.0
    assert m["delegation"]["delegated_nodes"] == delegated


def test_inference_diff_script_entry_point(int8_model):
    from nnhal.inference_diff import main
    assert main(["--model_file", str(int8_model) + ".missing"]) == 2


@pytest.mark.parametrize("content, message", [(None, "cannot read model file"),
                                               (b"\x00" * 64, "inference_diff: ")])
def test_inference_diff_bad_models(tmp_path, content, message):
    path = tmp_path / "bad.tflite"
    if content is not None:
        path.write_bytes(content)
    r = _cli("inference-diff", "--model_file", str(path), "--num_runs", "1", "--delegate", "none")
    assert r.returncode != 0 and message in r.stderr


def test_model_with_no_delegable_nodes(server, tmp_path):
    b = TfLiteModelBuilder()
    x = b.add_input("x", [1, 8])
    y = b.add_tensor("y", [1, 8])
    b.add_operator("COS", [x], [y])
    b.set_outputs([y])
    path = tmp_path / "cos.tflite"
    path.write_bytes(b.build())
    r = _cli("inference-diff", "--model_file", str(path), "--num_runs", "2", "--service_address", server.address)
    assert r.returncode == 0, r.stderr
    assert "Delegation: 0/1 nodes in 0 partition(s)" in r.stdout
    assert "OutputDiff[0]: avg_error=0," in r.stdout


def test_benchmark_json_and_table(server, int8_model):
    r = _cli("benchmark", "--model_file", str(int8_model), "--runs", "5", "--warmup", "1", "--min_secs", "0",
             "--service_address", server.address, "--json")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["cpu"]["p50_us"] > 0 and res["nnhal"]["p90_us"] >= res["nnhal"]["p50_us"]
    assert res["prepare"]["all_from_cache"] is True and res["prepare"]["compile_ms"] > 0
    assert res["prepare"]["cache_hits"] == res["prepare"]["partitions"] > 0 and res["prepare"]["from_cache_ms"] > 0
    ops = res["operations"]
    assert {o["op"] for o in ops} >= {"CONV_2D", "DEPTHWISE_CONV_2D", "SOFTMAX"}
    # 1 warm-up + 5 timed runs: the service times each operation in a sample of them (the first
    # execution, and the first bound one; service.execution.TIMED_ONE_IN)
    assert len({o["executions"] for o in ops}) == 1 and 1 <= ops[0]["executions"] <= 6
    assert any(o["macs"] > 0 for o in ops if o["op"] == "CONV_2D")
    table = _cli("benchmark", "--model_file", str(int8_model), "--runs", "3", "--min_secs", "0",
                 "--enable_op_profiling", "--service_address", server.address)
    assert table.returncode == 0
    for header in ("ratio nnhal/CPU", "run order (service side):", "top 10 by time:", "by operation type:"):
        assert header in table.stdout


def test_benchmark_says_when_nothing_came_from_the_cache(tmp_path, int8_model):
    """A service without a cache compiles the second prepare too: no "from cache" time for it."""
    from tests.service.conftest import ServerProcess
    server = ServerProcess(tmp_path, "--no-cache")
    try:
        r = _cli("benchmark", "--model_file", str(int8_model), "--runs", "2", "--warmup", "0", "--min_secs", "0",
                 "--service_address", server.address, "--json")
        table = _cli("benchmark", "--model_file", str(int8_model), "--runs", "2", "--warmup", "0", "--min_secs", "0",
                     "--service_address", server.address)
    finally:
        server.stop()
    assert r.returncode == 0, r.stderr
    pr = json.loads(r.stdout)["prepare"]
    assert pr["partitions"] > 0 and pr["cache_hits"] == 0 and pr["all_from_cache"] is False
    assert pr["from_cache_ms"] is None and pr["interpreter_from_cache_ms"] is None and pr["second_prepare_ms"] > 0
    assert table.returncode == 0, table.stderr
    line = next(x for x in table.stdout.splitlines() if x.startswith("prepare:"))
    assert "NOT from the cache" in line and "0/" in line and not re.search(r"from cache [\d.]+ ms", line)


def _bad_copies(data: bytes) -> dict[str, bytes]:
    """Deterministic corruptions of a model: cut in half, its root offset's third byte flipped,
    every 97th byte of its first KiB flipped (each made TFLite's loader crash or hang)."""
    root = bytearray(data)
    root[2] ^= 0xFF
    spread = bytearray(data)
    for i in range(8, 1024, 97):
        spread[i] ^= 0xFF
    return {"truncated": data[: len(data) // 2], "root-flipped": bytes(root), "bytes-flipped": bytes(spread)}


BAD_FILE_TOOLS = {"report": ("report",), "inference_diff": ("inference-diff", "--num_runs", "1"),
                  "benchmark": ("benchmark", "--runs", "1", "--warmup", "0")}


@pytest.mark.parametrize("tool", sorted(BAD_FILE_TOOLS))
def test_tools_refuse_corrupted_models_with_one_line(tmp_path, tool):
    """TFLite's loader does not verify the flatbuffer: the tools do, and say so in one line."""
    data = mobilenet_like(np.int8, input_size=16, width=4)
    for name, bad in {**_bad_copies(data), "writes-constant": model_writing_a_constant()}.items():
        path = tmp_path / f"{name}.tflite"
        path.write_bytes(bad)
        r = _cli(*BAD_FILE_TOOLS[tool], "--model_file", str(path),
                 "--service_address", f"unix:{tmp_path}/no-service.sock", timeout=60)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2, (name, r.returncode, r.stderr[-2000:])
        assert len(lines) == 1 and "malformed TFLite model" in lines[0] and str(path) in lines[0], (name, lines)


def test_benchmark_missing_model(tmp_path):
    r = _cli("benchmark", "--model_file", str(tmp_path / "none.tflite"))
    assert r.returncode == 2 and "cannot read model file" in r.stderr


@pytest.mark.any_runtime  # nnhal cts: no TFLite runtime in it
def test_cli_output_into_a_closed_pipe_ends_quietly():
    """`nnhal cts ... | head -1`: the reader goes away; no traceback, exit 141 (SIGPIPE's)."""
    # ~120 KB of output, well over a pipe's 64 KB buffer: the writer must meet the closed pipe
    p = subprocess.Popen([sys.executable, "-m", "nnhal.cli", "cts", "--op", "CONV_2D", "--op", "DEPTHWISE_CONV_2D",
                          "--op", "TRANSPOSE_CONV_2D", "--show", "all"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.readline()
    p.stdout.close()
    _, err = p.communicate(timeout=300)
    assert p.returncode == 141 and b"Traceback" not in err, err.decode()
