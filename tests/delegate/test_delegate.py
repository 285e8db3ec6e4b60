"""The nnhal delegate inside the real TFLite interpreter, against a real service process."""
from __future__ import annotations

import logging

import numpy as np
import pytest

from delegate import load_delegate
from delegate.simple import PythonDelegate, SimpleDelegateInterface, SimpleDelegateKernel
from tests.delegate.helpers import (
    assert_delegation_refused,
    assert_outputs_equal,
    interpreter,
    random_inputs,
    run,
)
from tests.delegate.models import add_runs, head_model, model_writing_a_constant


@pytest.mark.parametrize("dtype", [np.float32, np.uint8, np.int8])
def test_model_fully_delegated_matches_cpu(server, dtype):
    model = head_model(dtype)
    d = load_delegate(server.address)
    it, ref = interpreter(model, d), interpreter(model)
    rng = np.random.default_rng(1)
    for _ in range(5):
        xs = random_inputs(ref, rng)
        assert_outputs_equal(run(it, xs), run(ref, xs))
    rep = d.report
    assert rep.delegated == len(rep.nodes) == 5 and rep.partitions == [[0, 1, 2, 3, 4]]


def test_unsupported_node_stays_on_cpu(server):
    model = head_model(np.float32, unsupported_middle=True)
    d = load_delegate(server.address, max_delegated_partitions=0, partitioning="largest")
    it, ref = interpreter(model, d), interpreter(model)
    xs = random_inputs(ref, np.random.default_rng(2))
    assert_outputs_equal(run(it, xs), run(ref, xs))
    placement = {n.op: (n.placement, n.reason) for n in d.report.nodes}
    assert placement["COS"][0] == "CPU" and "no NNAPI mapping for COS" in placement["COS"][1]
    assert len(d.report.partitions) == 2 and d.report.delegated == 5
    ops = [o["op_name"] for o in it._get_ops_details()]
    assert ops.count("DELEGATE") == 2


def test_largest_first_keeps_three_partitions_by_default(server):
    model = add_runs(4)  # partitions of 2, 3, 4, 5 ADDs
    d = load_delegate(server.address, partitioning="largest")
    it, ref = interpreter(model, d), interpreter(model)
    xs = random_inputs(ref, np.random.default_rng(3))
    assert_outputs_equal(run(it, xs), run(ref, xs))
    sizes = [len(p) for p in d.report.partitions]
    assert sizes == [5, 4, 3]
    assert any("max_delegated_partitions=3" in (n.reason or "") for n in d.report.nodes)


def test_default_cost_rule_keeps_partitions_too_small_to_pay_on_cpu(server):
    """add_runs' partitions are a few ADDs of [1, 6] tensors: far less work than one invoke of the service,
    so the default rule keeps them all on TFLite's CPU, and says so per node."""
    model = add_runs(4)
    d = load_delegate(server.address)
    it, ref = interpreter(model, d), interpreter(model)
    xs = random_inputs(ref, np.random.default_rng(3))
    assert_outputs_equal(run(it, xs), run(ref, xs))
    rep = d.report
    assert rep.partitions == [] and len(rep.candidates) == 4
    assert all(not e.delegated and e.saving_us < 0 for e in rep.candidates)
    assert all(n.reason.startswith(("kept on CPU: estimated", "no NNAPI mapping")) for n in rep.nodes)
    assert "DELEGATE" not in [o["op_name"] for o in it._get_ops_details()]


def test_manual_node_ranges_and_min_nodes(server):
    model = add_runs(3)  # nodes: 0-1 ADD, 2 COS, 3-5 ADD, 6 COS, 7-10 ADD
    d = load_delegate(server.address, partitions="3-5,7-8", max_delegated_partitions=0, partitioning="largest")
    it, ref = interpreter(model, d), interpreter(model)
    xs = random_inputs(ref, np.random.default_rng(4))
    assert_outputs_equal(run(it, xs), run(ref, xs))
    assert d.report.partitions == [[3, 4, 5], [7, 8]]
    d2 = load_delegate(server.address, min_nodes_per_partition=4, max_delegated_partitions=0, partitioning="largest")
    interpreter(model, d2)
    assert d2.report.partitions == [[7, 8, 9, 10]]


def test_service_unreachable_claims_nothing(tmp_path, caplog):
    model = head_model(np.float32)
    with caplog.at_level(logging.WARNING, logger="nnhal.delegate"):
        d = load_delegate("unix:" + str(tmp_path / "nobody.sock"))
        it, ref = interpreter(model, d), interpreter(model)
    assert any("runs on TFLite's CPU kernels" in r.getMessage() for r in caplog.records), caplog.text
    xs = random_inputs(ref, np.random.default_rng(5))
    assert_outputs_equal(run(it, xs), run(ref, xs))
    assert d.report.delegated == 0 and "nnhal service unreachable" in d.report.nodes[0].reason


def test_service_killed_between_invokes(server):
    model = head_model(np.int8)
    d = load_delegate(server.address)
    it, ref = interpreter(model, d), interpreter(model)
    rng = np.random.default_rng(6)
    xs = random_inputs(ref, rng)
    assert_outputs_equal(run(it, xs), run(ref, xs))
    server.proc.kill()
    server.proc.wait()
    for _ in range(3):
        xs = random_inputs(ref, rng)
        assert_outputs_equal(run(it, xs), run(ref, xs))  # identical: hal runs the partition in-process
    kernel = d.impl.kernels[0]
    assert kernel.fallbacks == 3


def test_second_interpreter_prepares_from_cache(server):
    model = head_model(np.uint8, seed=7)
    d1 = load_delegate(server.address)
    interpreter(model, d1)
    assert d1.impl.kernels[0].from_cache is False
    d2 = load_delegate(server.address)
    it = interpreter(model, d2)
    assert d2.impl.kernels[0].from_cache is True
    ref = interpreter(model)
    xs = random_inputs(ref, np.random.default_rng(8))
    assert_outputs_equal(run(it, xs), run(ref, xs))
    # Same structure, other weights: a different token, so no stale cache hit.
    d3 = load_delegate(server.address)
    interpreter(head_model(np.uint8, seed=9), d3)
    assert d3.impl.kernels[0].from_cache is False


@pytest.mark.parametrize("damage", ["flip a data byte", "truncate the model file", "remove the data file"])
def test_damaged_cache_entry_is_recompiled_transparently(server, damage):
    """The user never sees a bad cache entry: the delegate's prepareModelFromCache is refused, it
    calls prepareModel, outputs equal TFLite CPU, and the next interpreter loads the new entry."""
    import os

    from tests.cache.tamper import replace_file
    model = head_model(np.float32, seed=11)
    cold = load_delegate(server.address)
    interpreter(model, cold)
    data_file = os.path.join(server.cache_dir, cold.impl.kernels[0].token.hex() + ".data")  # the compiled model's
    model_file = data_file[:-5] + ".model"
    if damage == "flip a data byte":
        raw = bytearray(open(data_file, "rb").read())
        raw[len(raw) // 3] ^= 0x40
        replace_file(data_file, bytes(raw))
    elif damage == "truncate the model file":
        replace_file(model_file, open(model_file, "rb").read()[:-7])
    else:
        os.unlink(data_file)
    d = load_delegate(server.address)
    it = interpreter(model, d)
    assert d.impl.kernels[0].from_cache is False and d.report.delegated == len(d.report.nodes)
    ref = interpreter(model)
    xs = random_inputs(ref, np.random.default_rng(12))
    assert_outputs_equal(run(it, xs), run(ref, xs))
    d_again = load_delegate(server.address)
    interpreter(model, d_again)
    assert d_again.impl.kernels[0].from_cache is True


def test_a_tensor_name_past_the_file_fails_delegation(server, tmp_path):
    """TFLite keeps a pointer to each tensor's name in the (unverified) flatbuffer and never reads
    it: in a corrupted file it points past the mapping. The delegate checks before reading it."""
    from tflite.Model import Model

    from nnhal.examples import mobilenet_like
    model = bytearray(mobilenet_like(np.int8, input_size=16, width=4))
    tensor = Model.GetRootAs(bytes(model), 0).Subgraphs(0).Tensors(3)
    name_field = tensor._tab.Pos + tensor._tab.Offset(10)  # Tensor.name: an offset to the string
    model[name_field:name_field + 4] = (0x40000000).to_bytes(4, "little")
    path = tmp_path / "bad_name.tflite"
    path.write_bytes(bytes(model))
    assert_delegation_refused(path, server.address,
                              "NnhalDelegate: corrupted model: tensor 3: its name lies outside the model's memory")


def test_a_node_writing_a_constant_fails_delegation(server, tmp_path):
    """A node writing into a constant that an earlier node reads (a corrupted file's graph, which
    TFLite does not check): the delegation fails with one line, before TFLite's node replacement
    or kernels crash on it."""
    path = tmp_path / "writes_constant.tflite"
    path.write_bytes(model_writing_a_constant())
    assert_delegation_refused(path, server.address, "NnhalDelegate: corrupted model: node 1 writes constant tensor 1")


def test_options_are_checked():
    with pytest.raises(TypeError, match="unknown nnhal delegate option"):
        load_delegate(bogus=1)
    with pytest.raises(ValueError, match="bad node range"):
        load_delegate(partitions="1-x")
    with pytest.raises(ValueError):
        load_delegate(max_delegated_partitions=-1)


class _Broken(SimpleDelegateInterface):
    name = "Broken"

    def is_node_supported(self, context, node_index):
        return None

    def create_kernel(self):
        class K(SimpleDelegateKernel):
            def eval(self, context):
                raise ZeroDivisionError("kernel bug")
        return K()


def test_exception_in_a_kernel_is_a_clean_tflite_error():
    model = head_model(np.float32)
    d = PythonDelegate(_Broken())
    it = interpreter(model, d)
    with pytest.raises(RuntimeError):
        run(it, random_inputs(it, np.random.default_rng(0)))
    assert "ZeroDivisionError: kernel bug" in d.last_error


@pytest.mark.parametrize("dtype", [np.float32, np.uint8, np.int8])
def test_mobilenet_like_through_the_delegate(server, dtype):
    from nnhal.examples import mobilenet_like
    model = mobilenet_like(dtype, input_size=32, width=8)
    d = load_delegate(server.address)
    it, ref = interpreter(model, d), interpreter(model)
    rng = np.random.default_rng(11)
    for _ in range(3):
        xs = random_inputs(ref, rng)
        assert_outputs_equal(run(it, xs), run(ref, xs))  # quantized: bit-exact vs reference kernels
    assert d.report.delegated == len(d.report.nodes) and len(d.report.partitions) == 1


@pytest.mark.any_runtime  # the delegate's connection, not the runtime
def test_reconnects_after_the_service_returns(tmp_path):
    import time as _time

    import delegate.nnhal_delegate as nd
    from tests.service.conftest import ServerProcess
    server = ServerProcess(tmp_path)
    model = head_model(np.float32)
    d = load_delegate(server.address)
    it, ref = interpreter(model, d), interpreter(model)
    rng = np.random.default_rng(12)
    try:
        xs = random_inputs(ref, rng)
        assert_outputs_equal(run(it, xs), run(ref, xs))
        server.stop()
        assert_outputs_equal(run(it, xs), run(ref, xs))  # in-process fallback
        kernel = d.impl.kernels[0]
        assert kernel.remote is None and kernel.fallbacks == 1
        server = ServerProcess(tmp_path)  # same socket path
        kernel._retry_at = _time.monotonic()  # don't wait RECONNECT_INTERVAL_S in a test
        assert nd.RECONNECT_INTERVAL_S > 0
        assert_outputs_equal(run(it, xs), run(ref, xs))
        assert kernel.remote is not None and kernel.fallbacks == 1  # back on the service
    finally:
        server.stop()


@pytest.mark.any_runtime  # the delegate's service start
def test_embedded_service_when_nothing_listens(tmp_path):
    """No address and no service on the default socket: the delegate starts its own and stops it."""
    import subprocess
    import sys
    code = (
        "import numpy as np\n"
        "from delegate import load_delegate\n"
        "from tests.delegate.models import head_model\n"
        "from tests.delegate.helpers import interpreter, run, random_inputs, assert_outputs_equal\n"
        "m = head_model(np.float32); d = load_delegate()\n"
        "it, ref = interpreter(m, d), interpreter(m)\n"
        "xs = random_inputs(ref, np.random.default_rng(0)); assert_outputs_equal(run(it, xs), run(ref, xs))\n"
        "print(d.report.service, d.report.delegated)\n")
    env = {**__import__("os").environ, "XDG_RUNTIME_DIR": str(tmp_path), "XDG_CACHE_HOME": str(tmp_path / "c")}
    try:  # the numba kernels come from this machine's warm cache: a cold compile is not under test here
        from hal.backends.numba_kernels import cache_dir
        env["NNHAL_NUMBA_CACHE_DIR"] = str(cache_dir())
    except ImportError:
        pass
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240, env=env)
    assert r.returncode == 0, r.stderr
    service, delegated = r.stdout.split()
    assert "nnhal-embedded-" in service and delegated == "5"
    assert not (tmp_path / "nnhal" / "nnhal.sock").exists()


@pytest.mark.any_runtime  # the delegate's bounds and in-process run
@pytest.mark.parametrize("local_burst", [True, False], ids=["local-burst", "grpc"])
@pytest.mark.parametrize("bound", ["deadline_ms", "default"])
def test_stopped_service_does_not_hang_invoke(tmp_path, monkeypatch, caplog, local_burst, bound):
    """A service stopped (SIGSTOP) mid-session: invoke gives up after its bound (the deadline plus a
    grace, or the per-execution default, here shortened by $NNHAL_EXECUTE_WAIT_MIN_S), runs the
    partition in-process and treats the connection as lost; once the service resumes, the partition
    goes back to it."""
    from tests.service.conftest import ServerProcess, returns, stopped
    options = {"local_burst": local_burst}
    if bound == "deadline_ms":
        options["deadline_ms"] = 2000
    else:
        monkeypatch.setenv("NNHAL_EXECUTE_WAIT_MIN_S", "2")
    server = ServerProcess(tmp_path)
    try:
        model = head_model(np.float32)
        d = load_delegate(server.address, **options)
        it, ref = interpreter(model, d), interpreter(model)
        kernel = d.impl.kernels[0]
        assert (kernel.burst is not None) == local_burst
        rng = np.random.default_rng(13)
        xs = random_inputs(ref, rng)
        assert_outputs_equal(run(it, xs), run(ref, xs))
        assert kernel.fallbacks == 0
        caplog.set_level("WARNING", logger="nnhal.delegate")
        with stopped(server):
            for _ in range(2):  # the first gives up waiting, the second does not try the lost service
                xs = random_inputs(ref, rng)
                assert_outputs_equal(returns(run, it, xs), run(ref, xs))
            assert kernel.remote is None and kernel.fallbacks == 2
            assert any("did not answer" in r.getMessage() and "in-process" in r.getMessage()
                       for r in caplog.records), [r.getMessage() for r in caplog.records]
        kernel._retry_at = 0.0  # don't wait RECONNECT_INTERVAL_S in a test
        assert_outputs_equal(returns(run, it, xs), run(ref, xs))
        assert kernel.remote is not None and kernel.fallbacks == 2  # back on the service
        del it, d, kernel
        # The abandoned burst and session ended on the service without a traceback (a burst thread
        # once died closing its mapping while views of it were alive).
        assert server.stop() == 0 and "Traceback" not in server.output(), server.output()
    finally:
        server.stop()
