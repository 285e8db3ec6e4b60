"""The tools under TFLite's flag names: benchmark_model's flags and summary lines, the NNAPI
delegate's flags in every tool, the input flags, inference_diff's extra error lines, and TFLite's
"Unconsumed cmdline flags" for a flag a tool does not know."""
from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from delegate.tfl import TfLiteModelBuilder
from nnhal.benchmark import stat_line
from nnhal.examples import mobilenet_like
from nnhal.inference_diff import _OutputError
from tests.delegate.models import add_runs

TIMINGS = re.compile(r"^Inference timings in us: Init: (\d+), First inference: (\d+), Warmup \(avg\): ([\d.e+]+), "
                     r"Inference \(avg\): ([\d.e+]+)$", re.M)
STAT = re.compile(r"^count=(\d+) first=(\d+) curr=(\d+) min=(\d+) max=(\d+) avg=([\d.e+]+) std=(\d+)$", re.M)
MEMORY = re.compile(r"^Memory footprint delta from the start of the tool \(MB\): init=([\d.e+-]+) "
                    r"overall=([\d.e+-]+)$", re.M)
PEAK = re.compile(r"^Overall peak memory footprint \(MB\) via periodic monitoring: ([\d.e+]+)$", re.M)
TOOLS = {"report": ("report",), "inference_diff": ("inference-diff", "--num_runs=1"),
         "benchmark": ("benchmark", "--num_runs=1", "--warmup_runs=0", "--min_secs=0")}


def _cli(*args, timeout=240):
    """The tool's run; one that outlives ``timeout`` fails the test with every thread's stack (the
    CLI dumps them on SIGUSR1), where a hang's cause is."""
    p = subprocess.Popen([sys.executable, "-m", "nnhal.cli", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGUSR1)
        time.sleep(2)
        p.kill()
        out, err = p.communicate()
        pytest.fail(f"nnhal {args[0]} did not end within {timeout} s; its output:\n{out[-2000:]}\n"
                    f"its threads:\n{err[-8000:]}")
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


def _error_lines(r: subprocess.CompletedProcess) -> list[str]:
    return [x for x in r.stderr.splitlines() if not x.startswith("INFO: ")]


@pytest.fixture
def model(tmp_path):
    p = tmp_path / "m_int8.tflite"
    p.write_bytes(mobilenet_like(np.int8, input_size=16, width=4))
    return p


def test_benchmark_model_flags_and_summary_lines(server, model):
    r = _cli("benchmark", f"--graph={model}", "--num_runs=4", "--warmup_runs=2", "--min_secs=0", "--max_secs=60",
             "--num_threads=1", "--enable_op_profiling=true", "--report_peak_memory_footprint",
             f"--service_address={server.address}")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert out.startswith("Running benchmark for at least 2 iterations and at least 0 seconds but terminate if "
                          "exceeding 60 seconds.\n"), out[:300]
    assert "Running benchmark for at least 4 iterations and at least 0 seconds" in out
    warm, timed = [m.groups() for m in STAT.finditer(out)][:2]
    assert int(warm[0]) == 2 and int(timed[0]) == 4  # min_secs 0: exactly the runs asked for
    init, first, warm_avg, avg = TIMINGS.search(out).groups()
    assert int(init) > 0 and int(first) == int(warm[1]) and float(warm_avg) == float(warm[5])
    assert float(avg) == float(timed[5])
    assert MEMORY.search(out) and float(PEAK.search(out).group(1)) > 0
    assert out.index("Inference timings") < out.index("ratio nnhal/CPU") < out.index("run order (service side):")
    quiet = _cli("benchmark", f"--graph={model}", "--num_runs=2", "--min_secs=0", "--enable_op_profiling=false",
                 f"--service_address={server.address}")
    assert quiet.returncode == 0, quiet.stderr
    assert "run order" not in quiet.stdout and not PEAK.search(quiet.stdout) and MEMORY.search(quiet.stdout)


@pytest.mark.any_runtime  # the tool's loop bounds, not the runtime's
def test_min_secs_and_max_secs_bound_the_timed_loop(server, model):
    def timed_runs(*flags) -> int:
        r = _cli("benchmark", f"--graph={model}", "--warmup_runs=0", *flags, f"--service_address={server.address}",
                 "--json")
        assert r.returncode == 0, r.stderr
        return len(json.loads(r.stdout)["benchmark_model"]["inference_us"])
    assert timed_runs("--num_runs=1", "--min_secs=0.3") > 1  # runs on past num_runs until min_secs
    assert timed_runs("--num_runs=1000000", "--max_secs=0.3") < 1000000  # stops at max_secs


def test_stat_line_is_tflites():
    assert stat_line([]) == "count=0"
    assert stat_line([7]) == "count=1 curr=7"
    assert stat_line([7, 7]) == "count=2 curr=7(all same)"
    assert stat_line([10, 20, 30, 1234567]) == ("count=4 first=10 curr=1234567 min=10 max=1234567 avg=308657 "
                                                "std=534574")


@pytest.mark.parametrize("tool", sorted(TOOLS))
def test_nnapi_delegate_flags_in_every_tool(server, tmp_path, tool):
    path = tmp_path / "runs.tflite"
    path.write_bytes(add_runs(4))  # 4 partitions; largest-first keeps 3 by default
    serialize_dir = tmp_path / "serialize"
    serialize_dir.mkdir()
    flags = ("--nnapi_accelerator_name=nnhal", "--disable_nnapi_cpu", "--nnapi_allow_fp16=false",
             "--nnapi_execution_preference=sustained_speed", "--nnapi_execution_priority=high",
             "--max_number_delegated_partitions=-1", f"--delegate_serialize_dir={serialize_dir}",
             "--delegate_serialize_token=app-v1", "--partitioning=largest")
    r = _cli(*TOOLS[tool], f"--model_file={path}", *flags, f"--service_address={server.address}")
    assert r.returncode == 0, r.stderr
    if tool == "report":
        assert "14/17 nodes delegated in 4 partition(s)" in r.stdout, r.stdout  # all 4 partitions kept
    elif tool == "inference_diff":
        assert "Delegation: 14/17 nodes in 4 partition(s)" in r.stdout, r.stdout
    else:
        assert "in 4 partition(s)" in r.stdout, r.stdout
    for bad, words in ((("--nnapi_accelerator_name=qti-dsp",), "unknown accelerator_name 'qti-dsp' (available: "
                        "nnhal)"),
                       ((f"--delegate_serialize_dir={tmp_path}/missing",), "is not a directory"),
                       (("--max_number_delegated_partitions=0", "--max_delegated_partitions=2"), "not both"),
                       (("--nnapi_execution_preference=fastest",), "unknown execution_preference 'fastest'")):
        r = _cli(*TOOLS[tool], f"--model_file={path}", *bad, f"--service_address={server.address}")
        lines = _error_lines(r)
        assert r.returncode == 2 and len(lines) == 1 and words in lines[0], (bad, r.returncode, r.stderr)
        assert r.stdout == ""


@pytest.mark.parametrize("tool", sorted(TOOLS))
def test_unknown_flags_are_tflites_unconsumed_cmdline_flags(model, tool):
    r = _cli(*TOOLS[tool], f"--model_file={model}", "--foo=1", "--num_run=3")  # no prefix matching either
    prog = "inference_diff" if tool == "inference_diff" else f"nnhal {tool}"
    assert _error_lines(r) == [f"{prog}: Unconsumed cmdline flags: --foo=1 --num_run=3"] and r.returncode == 1
    assert r.stdout == ""


def test_unknown_flags_of_the_inference_diff_entry_point(model, capsys):
    from nnhal.inference_diff import main
    assert main(["--model_file", str(model), "--use_gpu=true"]) == 1
    assert capsys.readouterr().err == "inference_diff: Unconsumed cmdline flags: --use_gpu=true\n"


def test_a_bad_flag_value_is_one_line(model):
    r = _cli("benchmark", f"--graph={model}", "--num_runs=x")
    assert _error_lines(r) == ["nnhal benchmark: argument --num_runs/--runs: invalid int value: 'x'"]
    assert r.returncode == 2


def quantize_first_model(scale: float = 1.0, metadata: bytes | None = None) -> bytes:
    """float x QUANTIZEd to uint8 with ``scale``, zero point 0 (scale 1: it expects [0, 255]) ->
    DEQUANTIZE; float y -> RELU, nothing said about its range. ``metadata``: TFLITE_METADATA bytes."""
    b = TfLiteModelBuilder()
    x = b.add_input("x", [1, 8])
    q = b.add_tensor("xq", [1, 8], np.uint8, scale=scale, zero_point=0)
    b.add_operator("QUANTIZE", [x], [q])
    out = b.add_tensor("out", [1, 8])
    b.add_operator("DEQUANTIZE", [q], [out])
    y = b.add_input("y", [1, 8])
    r = b.add_tensor("r", [1, 8])
    b.add_operator("RELU", [y], [r])
    b.set_outputs([out, r])
    if metadata is not None:
        b.add_metadata("TFLITE_METADATA", metadata)
    return b.build()


def test_inference_diff_input_ranges_from_the_models_quantization(tmp_path):
    path = tmp_path / "q.tflite"
    path.write_bytes(quantize_first_model())
    out = tmp_path / "m.json"
    r = _cli("inference-diff", f"--model_file={path}", "--num_runs=2", "--delegate=none", f"--output_file_path={out}")
    assert r.returncode == 0, r.stderr
    assert json.loads(out.read_text())["input_ranges"] == {"x": [0.0, 255.0], "y": None}
    r = _cli("inference-diff", f"--model_file={path}", "--num_runs=2", "--delegate=none", f"--output_file_path={out}",
             "--input_layer_value_range=y,0,4")
    assert r.returncode == 0, r.stderr
    assert json.loads(out.read_text())["input_ranges"]["y"] == [0.0, 4.0]


def test_input_layer_value_files(server, tmp_path):
    from delegate.runtime import Interpreter
    from nnhal.tool_inputs import input_sources, parse_input_flags
    path = tmp_path / "q.tflite"
    path.write_bytes(quantize_first_model())
    data = np.arange(8, dtype=np.float32).reshape(1, 8) * 3
    (tmp_path / "x.bin").write_bytes(data.tobytes())
    layers = parse_input_flags(None, None, None, f"x:{tmp_path}/x.bin")
    sources = input_sources(Interpreter(model_path=str(path)).get_input_details(), layers, str(path))
    np.testing.assert_array_equal(sources[0].value(np.random.default_rng(0)), data)
    out = tmp_path / "m.json"
    for tool in (("inference-diff", "--num_runs=2", f"--output_file_path={out}"),
                 ("benchmark", "--num_runs=2", "--min_secs=0", "--json")):
        r = _cli(*tool, f"--model_file={path}", f"--input_layer_value_files=x:{tmp_path}/x.bin",
                 f"--service_address={server.address}")
        assert r.returncode == 0, r.stderr
    assert json.loads(out.read_text())["input_ranges"]["x"] == "file"


@pytest.mark.any_runtime  # the tools' checks of their input flags against the model's inputs
def test_input_flags_that_do_not_fit_the_model_are_one_line_errors(tmp_path):
    path = tmp_path / "q.tflite"
    path.write_bytes(quantize_first_model())
    data = np.arange(8, dtype=np.float32).reshape(1, 8) * 3
    (tmp_path / "x.bin").write_bytes(data.tobytes())
    (tmp_path / "short.bin").write_bytes(data.tobytes()[:-4])
    for flags, words in (((f"--input_layer_value_files=x:{tmp_path}/short.bin",), "has 28 bytes; input 'x' "
                          "([1, 8], float32) takes 32"),
                         ((f"--input_layer_value_files=z:{tmp_path}/x.bin",), "the model has no input named 'z'"),
                         ((f"--input_layer_value_files=x:{tmp_path}/none.bin",), "cannot read input value file"),
                         (("--input_layer_value_range=x,5",), "wrong input value range item specified: x,5"),
                         (("--input_layer_value_range=x,5,1",), "wrong low and high value"),
                         (("--input_layer=x,y", "--input_layer_shape=1,8"), "must match the number of items"),
                         (("--input_layer=x", "--input_layer_shape=1,9"), "input 'x' has shape [1, 8]")):
        for tool in ("inference-diff", "benchmark"):
            r = _cli(tool, f"--model_file={path}", *flags, "--service_address=unix:/nonexistent/s.sock")
            lines = _error_lines(r)
            assert r.returncode == 2 and len(lines) == 1 and words in lines[0], (flags, r.stderr)


def test_max_and_relative_error():
    e = _OutputError()
    e.add(np.array([1.0, 2.0, 3.0]), np.array([1.0, 2.0, 5.0]))
    e.add(np.array([0.0, 0.0, 0.0]), np.array([0.0, 0.0, 0.0]))
    m = e.metrics()
    assert m["max_abs_error"] == 2.0 and m["relative_error"] == 2.0 / 5.0  # of the reference's range [0, 5]
    assert m["avg_error"] == pytest.approx(1 / 3)
    same = _OutputError()
    same.add(np.full(4, 3, np.int8), np.full(4, 3, np.int8))
    assert same.metrics()["relative_error"] == 0.0
