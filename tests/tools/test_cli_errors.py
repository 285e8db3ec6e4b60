"""Clear errors, no tracebacks (issue 18, finding 7): every bad input to the command line is one
line and exit 2, found before any run; Ctrl-C is one line and exit 130; a malformed gRPC message
is one line in the service's log."""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys

import grpc
import numpy as np
import pytest

from delegate import load_delegate
from delegate.tfl import TfLiteModelBuilder
from nnhal.examples import mobilenet_like
from service.client import Client
from service.server import MAX_SOCKET_PATH_BYTES
from tests.service.conftest import HANG_LIMIT_S, ServerProcess
from tests.tools.ptyrun import run_on_tty


def _cli(*args, timeout=HANG_LIMIT_S):
    return subprocess.run([sys.executable, "-m", "nnhal.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


def _one_line_error(r: subprocess.CompletedProcess, *words: str, status: int = 2) -> str:
    """The command failed with ``status`` and said so in one line holding ``words``. TFLite's own
    "INFO: Created TensorFlow Lite XNNPACK delegate" line is not ours to count."""
    lines = [x for x in r.stderr.splitlines() if not x.startswith("INFO: ")]
    assert r.returncode == status and len(lines) == 1 and "Traceback" not in r.stderr, (r.returncode, r.stderr)
    assert all(w in lines[0] for w in words), lines[0]
    return lines[0]


@pytest.fixture
def model(tmp_path):
    p = tmp_path / "m.tflite"
    p.write_bytes(mobilenet_like(np.int8, input_size=16, width=4))
    return p


def _private_dir(tmp_path, name="run"):
    d = tmp_path / name
    d.mkdir(mode=0o700)
    return d


# ---- models TFLite cannot load -----------------------------------------------------------------

TOOLS = {"report": ("report",), "inference_diff": ("inference-diff", "--num_runs", "1"),
         "benchmark": ("benchmark", "--runs", "1", "--warmup", "0")}


@pytest.mark.parametrize("tool", sorted(TOOLS))
def test_custom_op_tflite_cannot_load_is_one_line(server, tmp_path, tool):
    b = TfLiteModelBuilder()
    x = b.add_input("x", [1, 8])
    y = b.add_tensor("y", [1, 8])
    b.add_operator("CUSTOM", [x], [y], custom_code="MyUnknownOp")
    b.set_outputs([y])
    path = tmp_path / "custom.tflite"
    path.write_bytes(b.build())
    line = _one_line_error(_cli(*TOOLS[tool], "--model_file", str(path), "--service_address", server.address),
                           "unresolved custom op: MyUnknownOp", "no installed nnhal extension implements it")
    assert line.count("unresolved custom op") == 1, line  # TFLite's reporter says it twice


# ---- bad option values and files, found before the run -------------------------------------------

def test_bad_output_file_path_is_refused_before_the_run(model, tmp_path):
    for bad, why in ((tmp_path / "no-such-dir" / "out.json", "no such directory"), (tmp_path, "is a directory")):
        r = _cli("inference-diff", "--model_file", str(model), "--num_runs", "1", "--delegate", "none",
                 "--output_file_path", str(bad))
        _one_line_error(r, "--output_file_path", why)
        assert r.stdout == ""  # nothing ran


@pytest.mark.any_runtime
@pytest.mark.parametrize("args, words", [
    (("benchmark", "--runs", "0"), ("--num_runs must be >= 1, not 0",)),
    (("benchmark", "--warmup", "-1"), ("--warmup_runs must be >= 0",)),
    (("benchmark", "--threads", "0"), ("--num_threads must be >= 1",)),
    (("benchmark", "--min_secs=-1"), ("--min_secs must be >= 0",)),
    (("benchmark", "--max_secs=0"), ("--max_secs must be > 0",)),
    (("inference-diff", "--num_runs", "0"), ("--num_runs must be >= 1",)),
    (("inference-diff", "--num_interpreter_threads", "-2"), ("--num_interpreter_threads must be >= 1",)),
    (("inference-diff", "--delegate", "gpu"), ("unknown --delegate 'gpu'",)),
    (("report", "--max_delegated_partitions", "-1"), ("max_delegated_partitions must be >= 0",)),
    (("report", "--min_nodes_per_partition", "0"), ("min_nodes_per_partition >= 1",)),
    (("report", "--partitions", "5-2"), ("nnhal report: ",)),
    (("benchmark", "--execution_preference", "fastest"),
     ("unknown execution_preference 'fastest'", "sustained_speed")),
    (("inference-diff", "--priority", "urgent"), ("unknown priority 'urgent'", "low, medium, high")),
])
def test_bad_tool_option_values(model, tmp_path, args, words):
    r = _cli(*args, "--model_file", str(model), "--service_address", f"unix:{tmp_path}/none.sock")
    line = _one_line_error(r, *words)
    assert "cannot load" not in line  # the flag is wrong, not the model
    assert r.stdout == ""


@pytest.mark.any_runtime
def test_unknown_delegate_option_values_are_value_errors():
    with pytest.raises(ValueError, match="unknown execution_preference 'fastest' \\(one of: low_power"):
        load_delegate(execution_preference="fastest")
    with pytest.raises(ValueError, match="unknown priority 7"):
        load_delegate(priority=7)
    with pytest.raises(ValueError, match="deadline_ms must be > 0"):
        load_delegate(deadline_ms=-5)


@pytest.mark.any_runtime
@pytest.mark.parametrize("args, words", [
    (("--workers", "0"), ("workers must be >= 1",)),
    (("--threads", "-1"), ("--threads must be >= 0",)),
    (("--backend", "nope"), ("unknown backend 'nope'",)),
])
def test_bad_serve_option_values(tmp_path, args, words):
    _one_line_error(_cli("serve", "--socket", str(_private_dir(tmp_path) / "s.sock"), "--no-cache", *args), *words)


@pytest.mark.any_runtime
def test_unknown_backend_in_the_environment(tmp_path):
    r = subprocess.run([sys.executable, "-m", "nnhal.cli", "serve", "--socket", str(_private_dir(tmp_path) / "s.sock"),
                        "--no-cache"], capture_output=True, text=True, timeout=HANG_LIMIT_S,
                       env={**os.environ, "NNHAL_BACKENDS": "nope"})
    _one_line_error(r, "unknown backend 'nope'")


# ---- socket and cache paths ----------------------------------------------------------------------

def _long_socket_path(tmp_path) -> str:
    """A socket path one byte over AF_UNIX's limit, in a private folder whatever TMPDIR is."""
    d = _private_dir(tmp_path, "s" * 40)
    name = "n" * max(1, MAX_SOCKET_PATH_BYTES + 1 - len(os.fsencode(str(d))) - 1)
    path = os.path.join(d, name)
    assert len(os.fsencode(path)) > MAX_SOCKET_PATH_BYTES
    return path


def test_socket_path_longer_than_af_unix_allows(tmp_path, model):
    path = _long_socket_path(tmp_path)
    _one_line_error(_cli("serve", "--socket", path, "--no-cache"), "socket path", f"at most {MAX_SOCKET_PATH_BYTES}")
    assert os.listdir(os.path.dirname(path)) == []
    with pytest.raises(ValueError, match=f"at most {MAX_SOCKET_PATH_BYTES}"):
        load_delegate("unix:" + path)
    _one_line_error(_cli("benchmark", "--model_file", str(model), "--service_address", "unix:" + path),
                    f"at most {MAX_SOCKET_PATH_BYTES}")


@pytest.mark.any_runtime
def test_bad_socket_paths(tmp_path):
    f = _private_dir(tmp_path) / "file"
    f.write_text("x")
    _one_line_error(_cli("serve", "--socket", str(f / "s.sock"), "--no-cache"), str(f), "is not a directory")
    _one_line_error(_cli("serve", "--socket", "", "--no-cache"), "empty socket path")


@pytest.mark.any_runtime
def test_listen_on_a_port_in_use(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        listen = f"127.0.0.1:{s.getsockname()[1]}"
        r = _cli("serve", "--listen", listen, "--insecure", "--no-cache")
    lines = [x for x in r.stderr.splitlines() if not re.match(r"[EIW]\d{4} ", x)]  # grpc's own C log lines
    assert r.returncode == 2 and lines == [f"nnhal serve: cannot listen on {listen}: another server is already "
                                           f"listening there"], r.stderr


@pytest.mark.any_runtime
def test_cts_with_no_service_at_the_address(tmp_path):
    _one_line_error(_cli("cts", "--service", f"unix:{tmp_path}/none.sock", "--op", "RELU"),
                    "nnhal cts: ", "no nnhal service answers")


@pytest.mark.any_runtime
def test_cts_with_a_missing_corpus(tmp_path):
    _one_line_error(_cli("cts", "--corpus", str(tmp_path / "none.jsonl.gz")),
                    "nnhal cts: cannot read the corpus ", "give --corpus FILE")


@pytest.mark.any_runtime
def test_cts_backend_names_are_checked_before_anything_runs(tmp_path):
    _one_line_error(_cli("cts", "--backend", "nosuch", "--op", "RELU"), "nnhal cts: ", "unknown backend 'nosuch'")
    _one_line_error(_cli("cts", "--backend", "reference", "--service", f"unix:{tmp_path}/s.sock", "--op", "RELU"),
                    "nnhal cts: --backend: ", "nnhal serve --backend")


@pytest.mark.any_runtime
def test_bad_cache_paths(tmp_path):
    f = _private_dir(tmp_path) / "file"
    f.write_text("x")
    sock = str(_private_dir(tmp_path, "sock") / "s.sock")
    _one_line_error(_cli("serve", "--socket", sock, "--cache-dir", str(f)), str(f))
    for action, cache_dir in (("ls", f / "sub"), ("clear", f)):
        _one_line_error(_cli("cache", action, "--cache-dir", str(cache_dir)), "nnhal cache: ", str(cache_dir))
    assert f.read_text() == "x"


# ---- Ctrl-C --------------------------------------------------------------------------------------

@pytest.mark.parametrize("tool, args", [
    ("benchmark", ("--runs", "40000", "--warmup", "0")),
    ("inference-diff", ("--num_runs", "100000")),
])
def test_ctrl_c_during_a_delegated_run_is_one_line(server, model, tool, args):
    """Mostly inside the delegate's ctypes callbacks, where a KeyboardInterrupt used to be swallowed
    (printed as "Exception ignored", the node failed, exit 2). On a terminal, so the progress bar
    says when the timed runs have started."""
    status, _, err = run_on_tty([sys.executable, "-m", "nnhal.cli", tool, "--model_file", str(model), *args,
                                 "--service_address", server.address], timeout=HANG_LIMIT_S, marker="run/s]",
                                on_marker=lambda proc: os.killpg(proc.pid, signal.SIGINT))
    lines = [x.strip() for x in re.split(r"[\r\n]+", re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", err))]
    lines = [x for x in lines if x and "run/s]" not in x and not x.startswith("INFO: ")]
    assert status == 130 and "Traceback" not in err and "Exception ignored" not in err, err
    assert lines == [f"{'nnhal benchmark' if tool == 'benchmark' else 'inference_diff'}: interrupted"], err
    with Client.connect(server.address) as c:  # the service is unharmed
        assert c.get_version_string().startswith("nnhal-")


@pytest.mark.any_runtime
def test_ctrl_c_stops_serve_cleanly(tmp_path):
    s = ServerProcess(tmp_path)
    os.kill(s.proc.pid, signal.SIGINT)
    assert s.proc.wait(HANG_LIMIT_S) == 0
    s.stop()
    assert "Traceback" not in s.output() and not os.path.exists(s.socket)


@pytest.mark.any_runtime
def test_ops_into_a_closed_pipe_ends_quietly():
    """`nnhal ops | head -1`."""
    p = subprocess.Popen([sys.executable, "-m", "nnhal.cli", "ops"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.readline()
    p.stdout.close()
    _, err = p.communicate(timeout=HANG_LIMIT_S)
    assert p.returncode in (0, 141) and err == b"", err.decode()


# ---- malformed gRPC messages ---------------------------------------------------------------------

@pytest.mark.any_runtime
def test_malformed_grpc_message_is_one_log_line(server):
    methods = ("/nnhal.v1.Device/PrepareModel", "/nnhal.v1.Device/GetSupportedOperations",
               "/nnhal.v1.PreparedModel/Execute")
    with grpc.insecure_channel(server.address) as ch:
        for method in methods:
            call = ch.unary_unary(method)  # no serializers: raw bytes on the wire
            with pytest.raises(grpc.RpcError) as e:
                call(b"\xff\xff\xff\xff not a protobuf" * 3, timeout=HANG_LIMIT_S)
            assert e.value.code() == grpc.StatusCode.INTERNAL
    with Client.connect(server.address) as c:  # still serving
        assert c.get_version_string().startswith("nnhal-")
    log = server.output()
    dropped = [x for x in log.splitlines() if "malformed request" in x]
    assert len(dropped) == len(methods) and "Traceback" not in log, log
    assert all("WARNING" in x and "Error parsing message" in x for x in dropped), dropped
