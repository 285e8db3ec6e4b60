"""Issue 19 items 4 and 6: progress bars on a terminal only (never piped, never with --json); one
--log-level / $NNHAL_LOG convention; inference_diff --dump_dir's per-operation outputs."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from nnhal.examples import mobilenet_like
from service.logconfig import resolve_level
from tests.tools.ptyrun import run_on_tty

CLI = [sys.executable, "-m", "nnhal.cli"]


def _env(**changes) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "NNHAL_LOG"}
    env.update(changes)
    return env


def _run(*args, **env):
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=180, env=_env(**env))


@pytest.fixture
def model(tmp_path):
    p = tmp_path / "m.tflite"
    p.write_bytes(mobilenet_like(np.int8, input_size=16, width=4))
    return str(p)


# ---- progress -----------------------------------------------------------------------------------

@pytest.mark.parametrize("args, bar", [
    (("inference-diff", "--num_runs", "5"), "inference_diff:"),
    (("benchmark", "--num_runs", "5", "--min_secs", "0"), "TFLite + nnhal:"),
])
def test_progress_on_a_terminal(server, model, args, bar):
    status, out, tty = run_on_tty([*CLI, *args, "--model_file", model, "--service_address", server.address])
    assert status == 0 and bar in tty and "run/s]" in tty, tty
    assert "run/s" not in out  # the results (stdout) are clean


def test_no_progress_when_piped_or_json(server, model):
    r = _run("inference-diff", "--num_runs", "5", "--model_file", model, "--service_address", server.address)
    assert r.returncode == 0 and "run/s" not in r.stderr, r.stderr
    status, out, tty = run_on_tty([*CLI, "benchmark", "--num_runs", "5", "--min_secs", "0", "--json",
                                   "--model_file", model, "--service_address", server.address])
    assert status == 0 and "run/s" not in tty, tty
    json.loads(out)


_BAR_LEFT_BY_AN_INTERRUPT = """
import sys
from nnhal.tool_support import interrupted, progress_bar
bar = progress_bar(total=10, desc="TFLite + nnhal")  # drawn, never closed: as when Ctrl-C lands in tqdm's __init__
sys.exit(interrupted("nnhal benchmark"))
"""


def test_interrupted_starts_its_own_line_after_a_bar_left_drawn():
    """The race behind a flaky Ctrl-C test: the interrupt arrived after the bar was drawn but before
    ``with`` could erase it, and the message continued the bar's line. What a terminal shows, once
    its control sequences are applied line by line, has the message alone on its line."""
    status, _, tty = run_on_tty([sys.executable, "-c", _BAR_LEFT_BY_AN_INTERRUPT])
    assert status == 130 and "run/s]" in tty, tty
    shown = [line.rsplit("\x1b[K", 1)[-1] for line in re.split(r"[\r\n]+", tty)]
    assert "nnhal benchmark: interrupted" in shown, tty


@pytest.mark.any_runtime
def test_cts_progress_on_a_terminal_only_without_json():
    args = [*CLI, "cts", "--op", "RELU"]
    status, out, tty = run_on_tty(args)
    assert status == 0 and "case/s]" in tty, tty
    status, out, tty = run_on_tty([*args, "--json"])
    assert status == 0 and "case/s" not in tty, tty
    json.loads(out)


# ---- logging ------------------------------------------------------------------------------------

@pytest.mark.any_runtime
def test_level_precedence(monkeypatch):
    monkeypatch.delenv("NNHAL_LOG", raising=False)
    assert resolve_level(None) == "warning" and resolve_level(None, default="info") == "info"
    monkeypatch.setenv("NNHAL_LOG", "DEBUG")
    assert resolve_level(None) == "debug"
    assert resolve_level("error") == "error"  # the flag wins over the environment


@pytest.mark.any_runtime
@pytest.mark.parametrize("args, env, where", [
    (("ops", "--log-level", "loud"), {}, "--log-level"),
    (("ops",), {"NNHAL_LOG": "loud"}, "$NNHAL_LOG"),
    (("serve", "--socket", "/nonexistent/s.sock"), {"NNHAL_LOG": "loud"}, "$NNHAL_LOG"),
    (("cts", "--log-level", "loud"), {}, "--log-level"),
])
def test_invalid_level_is_one_line_exit_2(args, env, where):
    r = _run(*args, **env)
    prog = f"nnhal {args[0]}"
    assert r.returncode == 2 and r.stderr.splitlines() == [f"{prog}: {where}: unknown level 'loud' "
                                                           "(use debug, info, warning, error, critical)"], r.stderr


def test_inference_diff_script_has_log_level(model):
    r = subprocess.run([sys.executable, "-m", "nnhal.inference_diff", "--model_file", model, "--log-level", "x"],
                       capture_output=True, text=True, timeout=60, env=_env())
    assert r.returncode == 2 and r.stderr.startswith("inference_diff: --log-level: unknown level 'x'"), r.stderr


SNIPPET = """
import logging, sys
from nnhal.cli import main
main(sys.argv[1:])
print(logging.getLevelName(logging.getLogger().level), file=sys.stderr)
"""


@pytest.mark.any_runtime
@pytest.mark.parametrize("args, env, level", [
    (("--log-level", "debug"), {}, "DEBUG"),
    ((), {"NNHAL_LOG": "error"}, "ERROR"),
    (("--log-level", "info"), {"NNHAL_LOG": "error"}, "INFO"),
    ((), {}, "WARNING"),
])
def test_tool_level_from_flag_then_environment(args, env, level):
    r = subprocess.run([sys.executable, "-c", SNIPPET, "ops", "--json", *args], capture_output=True, text=True,
                       timeout=60, env=_env(**env))
    assert r.returncode == 0 and r.stderr.splitlines()[-1] == level, r.stderr


LIBRARY = """
import logging, sys
if sys.argv[2] == "app":
    logging.basicConfig(level=logging.ERROR)
from delegate import load_delegate
load_delegate(sys.argv[1])
log = logging.getLogger("nnhal")
print(logging.getLevelName(log.level), len(log.handlers), len(logging.getLogger().handlers))
"""


@pytest.mark.parametrize("app, env, expected", [
    ("none", {"NNHAL_LOG": "info"}, "INFO 1 0"),  # $NNHAL_LOG: the "nnhal" logger only, never root
    ("app", {"NNHAL_LOG": "info"}, "NOTSET 0 1"),  # the application configured logging: left alone
    ("none", {}, "NOTSET 0 0"),
])
def test_delegate_from_python_honours_nnhal_log(server, app, env, expected):
    r = subprocess.run([sys.executable, "-c", LIBRARY, server.address, app], capture_output=True, text=True,
                       timeout=60, env=_env(**env))
    assert r.returncode == 0 and r.stdout.split("\n")[0] == expected, (r.stdout, r.stderr)


# ---- --dump_dir ---------------------------------------------------------------------------------

def test_dump_dir_per_operation_outputs(server, model, tmp_path):
    """With TFLite's reference kernels the int8 model is bit-exact: every paired operation's
    difference is 0, and the index says where each output and its reference are."""
    dump = tmp_path / "dump"
    r = _run("inference-diff", "--num_runs", "2", "--model_file", model, "--service_address", server.address,
             "--reference_kernels", "--dump_dir", str(dump))
    assert r.returncode == 0, r.stderr
    assert f"Dump: 14 operations in {dump} (index.json; no difference)" in r.stdout.splitlines()
    index = json.loads((dump / "index.json").read_text())
    # The dump keeps every tensor (experimental_preserve_all_tensors): LiteRT then gives a delegate's
    # partition to it one node at a time (a kernel per node), tflite-runtime 2.14 as one kernel.
    from delegate.runtime import RUNTIME
    kernels = 14 if RUNTIME == "ai_edge_litert" else 1
    assert index["first_difference"] is None and len(index["partitions"]) == kernels
    assert sorted(n for p in index["partitions"] for n in p["nodes"]) == list(range(14))
    paired = 0
    for row in index["operations"]:
        for out in row["outputs"]:
            value = np.load(dump / out["file"])
            if out["reference_file"]:
                paired += 1
                ref = np.load(dump / out["reference_file"])
                assert value.size == ref.size and out["max_abs_diff"] == 0, (row, out)
            else:
                assert out["reference_overwritten"], (row, out)  # TFLite ran a node in place
    assert paired >= 12 and index["operations"][0]["tflite_op"] == "CONV_2D"


def test_dump_dir_needs_the_delegate(model, tmp_path):
    r = _run("inference-diff", "--model_file", model, "--delegate", "none", "--dump_dir", str(tmp_path / "d"))
    assert r.returncode == 2 and r.stderr.splitlines() == [
        "inference_diff: --dump-dir needs --delegate nnhal (it dumps the delegated operations)"], r.stderr
