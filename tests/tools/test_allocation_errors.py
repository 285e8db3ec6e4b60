"""Models whose tensors cannot be allocated (issue 33, item 6): `nnhal report`, `nnhal benchmark` and
`inference_diff` say so in one line naming the model, the tensor and its size, and exit 2, instead
of a traceback (TFLite's std::bad_alloc, LiteRT's error without a message, numpy's "Unable to
allocate 894 GiB").

A tensor larger than the machine's memory is refused before anything runs. One that fits the
machine but not the process (here: an address-space limit, ulimit -v) fails where TFLite or numpy
allocates it, and is said in one line too.
"""
from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest

from delegate.report import human_bytes, machine_memory
from delegate.tfl import TfLiteModelBuilder

HUGE = [240000, 1000000]  # float32: 894 GiB
BIG = [1048576, 1024]  # float32: 4 GiB

TOOLS = {"report": ("report",), "benchmark": ("benchmark", "--num_runs", "1", "--min_secs", "0"),
         "inference_diff": ("inference-diff", "--num_runs", "1")}
PROG = {"report": "nnhal report: cannot load", "benchmark": "nnhal benchmark:", "inference_diff": "inference_diff:"}


def intermediate_model(shape) -> bytes:
    """x [1, n] -> BROADCAST_TO ``shape`` (tensor 1, 'y': neither input nor output) -> SUM."""
    b = TfLiteModelBuilder()
    x = b.add_input("x", [1, shape[-1]])
    y = b.add_tensor("y", shape)
    b.add_operator("BROADCAST_TO", [x, b.add_constant("shape", np.array(shape, np.int32))], [y], version=2)
    z = b.add_tensor("z", [1, 1])
    b.add_operator("SUM", [y, b.add_constant("axes", np.array([0, 1], np.int32))], [z],
                   ("ReducerOptions", {"keep_dims": True}))
    b.set_outputs([z])
    return b.build()


def input_model(shape, signature=None) -> bytes:
    """x ``shape`` (tensor 0; ``signature``: with dynamic dimensions) -> RELU."""
    b = TfLiteModelBuilder()
    x = b.add_input("x", shape, shape_signature=signature)
    y = b.add_tensor("y", shape, shape_signature=signature)
    b.add_operator("RELU", [x], [y])
    b.set_outputs([y])
    return b.build()


def _tool(*args, limit_bytes: int | None = None):
    """The tool as a process; ``limit_bytes``: its address space limited (ulimit -v) before it starts."""
    prefix = [sys.executable, "-m", "nnhal.cli"]
    if limit_bytes is not None:
        prefix = [sys.executable, "-c", "import os, resource, sys; "
                  f"resource.setrlimit(resource.RLIMIT_AS, ({limit_bytes}, {limit_bytes})); "
                  "os.execv(sys.executable, [sys.executable, '-m', 'nnhal.cli', *sys.argv[1:]])"]
    return subprocess.run([*prefix, *args], capture_output=True, text=True, timeout=300)


def _one_line(r: subprocess.CompletedProcess, start: str, *words: str) -> str:
    """Exit 2 and one line of ours (TFLite's "INFO: Created ... XNNPACK" is not ours), no traceback."""
    lines = [x for x in r.stderr.splitlines() if not x.startswith("INFO: ")]
    assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, (r.returncode, r.stderr)
    assert lines[0].startswith(start) and all(w in lines[0] for w in words), lines[0]
    return lines[0]


def _needs(shape) -> str:
    return f"needs {human_bytes(math.prod(shape) * 4)}"


@pytest.fixture
def nowhere(tmp_path):
    """A service address nothing listens at: the check comes before any delegate is made."""
    return ["--service_address", "unix:" + str(tmp_path / "nobody.sock")]


@pytest.mark.parametrize("tool", sorted(TOOLS))
@pytest.mark.parametrize("where", ["intermediate", "input"])
def test_a_tensor_larger_than_the_machine_is_refused_before_the_run(tmp_path, nowhere, tool, where):
    total = machine_memory()
    if total is None or total > math.prod(HUGE) * 4:
        pytest.skip("this machine's memory is unknown, or holds 894 GiB")
    path = tmp_path / "huge.tflite"
    path.write_bytes(intermediate_model(HUGE) if where == "intermediate" else input_model(HUGE))
    tensor = "tensor 1 ('y'" if where == "intermediate" else "tensor 0 ('x'"
    line = _one_line(_tool(*TOOLS[tool], "--model_file", str(path), *nowhere), f"{PROG[tool]} {path}: ",
                     f"{tensor}, [240000, 1000000] float32) needs 894 GiB: cannot allocate;", "this machine has")
    assert "nobody.sock" not in line  # nothing was tried


@pytest.mark.parametrize("tool", ["benchmark", "inference_diff"])
def test_an_input_resized_beyond_the_machine_is_refused_before_the_run(tmp_path, nowhere, tool):
    total = machine_memory()
    if total is None or total > math.prod(HUGE) * 4:
        pytest.skip("this machine's memory is unknown, or holds 894 GiB")
    path = tmp_path / "dynamic.tflite"
    path.write_bytes(input_model([1, HUGE[1]], signature=[-1, HUGE[1]]))
    _one_line(_tool(*TOOLS[tool], "--model_file", str(path), "--input_layer", "x", "--input_layer_shape",
                    ",".join(map(str, HUGE)), *nowhere),
              f"{PROG[tool]} {path}: ", "tensor 0 ('x', [240000, 1000000] float32) needs 894 GiB: cannot allocate")


@pytest.mark.parametrize("tool", sorted(TOOLS))
@pytest.mark.parametrize("where", ["intermediate", "input"])
def test_a_failed_allocation_is_one_line(server, tmp_path, tool, where):
    """4 GiB tensors in a process limited to 3 GiB: TFLite's allocation fails (LiteRT: an error
    without a message; tflite_runtime: std::bad_alloc), or numpy's drawing the random input does
    (benchmark draws its inputs first). Either way one line: the tensor, its size, the limit."""
    path = tmp_path / "big.tflite"
    path.write_bytes(intermediate_model(BIG) if where == "intermediate" else input_model(BIG))
    tensor = "tensor 1 ('y'" if where == "intermediate" else "tensor 0 ('x'"
    _one_line(_tool(*TOOLS[tool], "--model_file", str(path), "--service_address", server.address,
                    limit_bytes=3 << 30),
              f"{PROG[tool]} {path}: ", tensor, _needs(BIG), "cannot allocate", "may use 3 GiB (ulimit -v)")
