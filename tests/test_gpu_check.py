"""The GPU session's one command (bench.gpu_check) in --quick mode, end to end, on torch's CPU
device: a GPU is lent rarely and for minutes, so the command must not be run for the first time
there. Marked ``gpu_check`` (about 25 s on 2 busy cores; deselect with -m "not gpu_check").

Checks what the GPU session relies on: one results file with every step's section and status, and
the benchmark's rows through the delegate (cuda first in the service's order) as accurate as
LiteRT's XNNPACK against LiteRT's reference kernels (real outputs compared: this can fail).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from bench.gpu_check import STEPS

pytestmark = pytest.mark.gpu_check

#: Largest |difference| / output scale a float32 row may show against LiteRT's reference kernels.
ACCURACY = 1e-4


def test_quick_mode_writes_every_step_and_accurate_rows(tmp_path):
    pytest.importorskip("torch")
    results = tmp_path / "results.md"
    env = {k: v for k, v in os.environ.items() if k != "OUT"}
    env["NNHAL_CUDA_DEVICE"] = "cpu"  # the same run with or without a GPU: torch's CPU device computes float32
    r = subprocess.run([sys.executable, "-m", "bench.gpu_check", "--quick", "--results", str(results)],
                       capture_output=True, text=True, timeout=180, env=env)
    text = results.read_text()
    assert f"results: {results}" in r.stdout, r.stdout + r.stderr
    sections = {}
    for name, title, *_ in STEPS:
        assert f"\n## {title}\n" in text, f"no section for {name}:\n{text}"
        sections[name] = text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]
        status = re.search(rf"^Step {name}: (.*)$", sections[name], re.M)
        assert status, f"no status line for {name}:\n{sections[name]}"
        missing_tests = name == "gpu-tests" and "is not in this checkout" in sections[name]
        assert status.group(1).startswith("ok,") or missing_tests, sections[name]
    assert "## Summary" in text
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in sections["float-bench"].splitlines()
            if line.startswith("| ") and not line.startswith("| model ")]
    configs: dict[str, set[str]] = {}
    for model, config, p50, ratio, accuracy, on_cuda, ready in rows:
        configs.setdefault(model, set()).add(config)
        assert float(p50) > 0 and float(ratio) > 0, (model, config)
        assert float(accuracy) <= ACCURACY, f"{model}, {config}: max |diff| / output scale {accuracy}"
        if config.startswith("nnhal"):
            assert re.fullmatch(r"\d+/\d+", on_cuda) and float(ready) > 0, (model, config, on_cuda, ready)
            ran, delegated = on_cuda.split("/")
            assert ran == delegated, f"{model}, {config}: the cuda backend ran {on_cuda} of the delegated nodes"
    assert len(configs) == 5, configs
    # the figures' geometric means are stated; a stand-in device's are not written for --performance
    assert "Geometric mean of the ratios: nnhal cuda fp16" in sections["float-bench"]
    assert not (tmp_path / "performance-gpu.json").exists()
    for seen in configs.values():
        assert {"nnhal cuda fp32", "nnhal cuda fp16"} <= seen and any(c.endswith(" 1 thread") for c in seen), seen
