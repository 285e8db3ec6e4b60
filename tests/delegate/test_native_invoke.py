"""The delegate's native invoke (delegate.native_invoke over service.native_burst) in TFLite, on a
real service: steady invokes run without Python and give TFLite's results; tensors TFLite moves,
a service killed or stopped while they run, and the switch that turns it off."""
from __future__ import annotations

import numpy as np
import pytest

from delegate import load_delegate
from delegate.native_invoke import trampoline_address
from service import native_burst
from tests.delegate.helpers import assert_outputs_equal, interpreter, random_inputs, run
from tests.delegate.models import head_model

pytestmark = pytest.mark.skipif(trampoline_address() is None or native_burst.steady_address() is None,
                                reason="native code unavailable here (not x86-64 Linux, or NNHAL_NATIVE_INVOKE=0)")


def _native_invokes(it, ref, kernel, rng, at_least: int = 20, limit: int = 400) -> None:
    """Invoke (each result checked against TFLite's reference kernels) until at least ``at_least``
    invokes ran natively; the strategy polls only where a core is free for it."""
    for _ in range(limit):
        xs = random_inputs(ref, rng)
        assert_outputs_equal(run(it, xs), run(ref, xs))
        if kernel.burst.channel.native_runs >= at_least:
            return
    channel = kernel.burst.channel
    pytest.skip(f"no native invokes: the client's wait strategy does not poll here (core free: "
                f"{channel.wait.core_free}, expected {channel.wait.expected_s})")


def _delegated(address: str, dtype=np.float32):
    """head_model through the delegate and on TFLite's reference kernels: (the delegate's
    Interpreter, the reference's, its one kernel)."""
    model = head_model(dtype)
    d = load_delegate(address)
    return interpreter(model, d), interpreter(model), d.impl.kernels[0]


@pytest.mark.parametrize("dtype", [np.float32, np.int8])
def test_steady_invokes_run_natively_with_tflites_results(server, dtype):
    it, ref, kernel = _delegated(server.address, dtype)
    assert kernel.native_invoke is not None
    _native_invokes(it, ref, kernel, np.random.default_rng(1))
    # TFLite allocating again may move every buffer: the trampoline sees it and Python runs and re-arms
    it.allocate_tensors()
    before = kernel.burst.channel.native_runs
    _native_invokes(it, ref, kernel, np.random.default_rng(2), at_least=before + 20)


def test_the_switch_keeps_every_invoke_in_python(server, monkeypatch):
    monkeypatch.setenv("NNHAL_NATIVE_INVOKE", "0")
    it, ref, kernel = _delegated(server.address)
    assert kernel.native_invoke is None
    rng = np.random.default_rng(3)
    for _ in range(50):
        xs = random_inputs(ref, rng)
        assert_outputs_equal(run(it, xs), run(ref, xs))
    assert kernel.burst.channel.native_runs == 0


def test_service_killed_while_invokes_run_natively(server):
    it, ref, kernel = _delegated(server.address)
    rng = np.random.default_rng(4)
    _native_invokes(it, ref, kernel, rng)
    server.proc.kill()
    server.proc.wait()
    for _ in range(3):
        xs = random_inputs(ref, rng)
        assert_outputs_equal(run(it, xs), run(ref, xs))  # hal runs the partition in-process
    assert kernel.fallbacks >= 1 and kernel.remote is None


def test_service_stopped_while_invokes_run_natively(tmp_path, monkeypatch):
    """SIGSTOP: the native polling hands the invoke back, Python waits out its bound, runs the
    partition in-process; once the service resumes, invokes go back to it and native again."""
    from tests.service.conftest import ServerProcess, returns, stopped
    monkeypatch.setenv("NNHAL_EXECUTE_WAIT_MIN_S", "1")
    server = ServerProcess(tmp_path)
    try:
        it, ref, kernel = _delegated(server.address)
        rng = np.random.default_rng(5)
        _native_invokes(it, ref, kernel, rng)
        with stopped(server):
            xs = random_inputs(ref, rng)
            assert_outputs_equal(returns(run, it, xs), run(ref, xs))
            assert kernel.remote is None and kernel.fallbacks == 1
        kernel._retry_at = 0.0  # don't wait RECONNECT_INTERVAL_S in a test
        xs = random_inputs(ref, rng)
        assert_outputs_equal(returns(run, it, xs), run(ref, xs))
        assert kernel.remote is not None and kernel.fallbacks == 1
        _native_invokes(it, ref, kernel, rng)
        del it, kernel
        assert server.stop() == 0 and "Traceback" not in server.output(), server.output()
    finally:
        server.stop()
