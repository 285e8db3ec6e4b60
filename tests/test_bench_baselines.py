"""The benchmarks' CPU baselines (bench/baselines.py, bench/tflite_runtime_baseline.py): LiteRT in
this process, tflite-runtime 2.14 in a worker of .venv-tflite-runtime, interleaved."""
from __future__ import annotations

import numpy as np
import pytest

from bench import baselines
from bench import tflite_runtime_baseline as tflrt
from delegate.tfl import TfLiteModelBuilder


def test_remote_configurations_are_interleaved_with_local_ones():
    calls = []
    local = {"a": "A", "b": "B"}
    times = baselines.time_interleaved(local, calls.append, rounds=3, per_round=2,
                                       remote={"r": lambda n: calls.append(f"r{n}") or [0.5] * n})
    assert {k: len(v) for k, v in times.items()} == {"a": 6, "b": 6, "r": 6} and times["r"] == [0.5] * 6
    # Round 0 in order, round 1 reversed: no configuration always runs first.
    assert calls == ["A", "A", "B", "B", "r2", "r2", "B", "B", "A", "A", "A", "A", "B", "B", "r2"]


def test_warmup_runs_are_run_but_not_timed():
    calls = []
    times = baselines.time_interleaved({"a": "A"}, calls.append, rounds=2, per_round=2, warmup=1,
                                       remote={"r": lambda n: calls.append(f"r{n}") or list(range(n))})
    assert calls == ["A", "A", "A", "r3", "r3", "A", "A", "A"]
    assert len(times["a"]) == 4 and times["r"] == [1, 2, 1, 2]  # the remote's first run of each round dropped


def test_warmup_time_adds_untimed_runs_to_short_configurations():
    """A configuration whose runs took 1 ms in earlier rounds gets warmup_s / 1 ms untimed runs
    before its timed ones; one slower than warmup_s keeps the ``warmup`` count."""
    calls = []
    remote = {"short": lambda n: calls.append(n) or [1e-3] * n, "long": lambda n: calls.append(-n) or [1.0] * n}
    times = baselines.time_interleaved({}, None, rounds=3, per_round=2, remote=remote, warmup=1, warmup_s=0.005)
    # round 0: no figures yet (warmup 1); round 1 reversed; round 2 in order
    assert calls == [3, -3, -3, 7, 7, -3]
    assert times["short"] == [1e-3] * 6 and times["long"] == [1.0] * 6


def test_timed_time_adds_timed_runs_to_short_configurations():
    """A configuration whose runs took 1 ms in earlier rounds gets timed_s / 1 ms timed runs per
    round after its first; one slower than timed_s keeps ``per_round``."""
    calls = []
    remote = {"short": lambda n: calls.append(n) or [1e-3] * n, "long": lambda n: calls.append(-n) or [1.0] * n}
    times = baselines.time_interleaved({}, None, rounds=3, per_round=2, remote=remote, timed_s=0.005)
    assert calls == [2, -2, -2, 5, 5, -2]
    assert len(times["short"]) == 2 + 5 + 5 and len(times["long"]) == 6


def test_ratios_are_against_both_cpus_and_the_faster_one_is_bold():
    anchor = baselines.anchor(1)
    figures = baselines.with_ratios({anchor: [0.004], "tflrt": [0.002], "nnhal": [0.008]}, "tflrt")
    assert figures["nnhal"]["ratio"] == pytest.approx(2.0) and figures["nnhal"]["ratio_tflrt"] == pytest.approx(4.0)
    assert baselines.ratio_cells(figures["nnhal"]) == "2.00 | **4.00**"
    alone = baselines.with_ratios({anchor: [0.004], "nnhal": [0.002]}, "tflrt")
    assert alone["nnhal"]["ratio_tflrt"] is None and baselines.ratio_cells(alone["nnhal"]) == "**0.50** | "
    row = baselines.not_measured_row("m", "tflite-runtime 2.14 1 thread")
    assert baselines.p50_cell(row, 1) == tflrt.NOT_MEASURED


def _add_model(path) -> str:
    b = TfLiteModelBuilder()
    x, y = b.add_input("x", [2, 3]), b.add_input("y", [2, 3])
    z = b.add_tensor("z", [2, 3])
    b.add_operator("ADD", [x, y], [z], ("AddOptions", {"fused_activation_function": 0}))
    b.set_outputs([z])
    path.write_bytes(b.build())
    return str(path)


@pytest.mark.skipif(not tflrt.available(), reason="no .venv-tflite-runtime (make setup-tflite-runtime)")
def test_the_tflite_runtime_worker_times_each_model_and_names_what_it_refuses(tmp_path):
    model = _add_model(tmp_path / "add.tflite")
    (tmp_path / "bad.tflite").write_bytes(b"not a model")
    inputs = [np.ones((2, 3), np.float32), np.zeros((2, 3), np.float32)]
    with tflrt.start([(model, inputs), (str(tmp_path / "bad.tflite"), [])], str(tmp_path)) as worker:
        assert worker.label.startswith("tflite-runtime 2.14")
        assert worker.error(0) is None and worker.error(1)
        ts = worker.time(0, 3)
        assert len(ts) == 3 and all(t > 0 for t in ts)
    out = tflrt.one_shot([(model, [])], str(tmp_path), runs=2)
    (info,) = out["models"]
    assert out["threads"] == 1 and {"allocate_ms", "first_invoke_ms", "ready_ms", "p50_ms", "mean_ms"} <= set(info)


def test_without_the_venv_the_rows_say_how_to_measure_it(tmp_path, monkeypatch):
    monkeypatch.setattr(tflrt, "PYTHON", tmp_path / "missing" / "python")
    assert tflrt.one_shot([(_add_model(tmp_path / "add.tflite"), [])], str(tmp_path), runs=1) is None
    with baselines.beside(str(tmp_path / "add.tflite"), [], str(tmp_path)) as b:
        assert b.remote == {} and b.why == tflrt.NOT_MEASURED and b.config == f"{tflrt.LABEL} 1 thread"
