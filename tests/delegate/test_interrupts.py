"""Ctrl-C during a TFLite call that runs the delegate (issue 33, item 4): the application's
``except KeyboardInterrupt`` fires, and nothing else is said: no ctypes "Exception ignored", no
RuntimeError from TFLite, no log line, no fallback (delegate.interrupts)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from delegate.partition import PartitionOptions
from delegate.runtime import Interpreter
from delegate.simple import PythonDelegate, SimpleDelegateInterface, SimpleDelegateKernel
from delegate.tfl import TfLiteModelBuilder
from delegate.tfl.schema import builtin_code
from nnhal.examples import mobilenet_like
from tests.delegate.helpers import interpreter
from tests.delegate.models import add_runs, head_model
from tests.service.conftest import HANG_LIMIT_S

# ---- where the interrupt lands: each callback TFLite runs from C ----------------------------------
# A KeyboardInterrupt raised by the delegate's own code stands in for SIGINT's Python handler, which
# raises it in whatever Python code the main thread runs: during a TFLite call, a callback.


class Tripwire(SimpleDelegateInterface):
    """Claims every node; raises KeyboardInterrupt once in ``where`` while ``armed``."""

    partition_options = PartitionOptions(partitioning="largest")

    def __init__(self, where: str):
        self.where, self.armed = where, True

    def trip(self, where: str) -> None:
        if self.armed and where == self.where:
            self.armed = False
            raise KeyboardInterrupt

    def initialize(self, context) -> bool:
        self.trip("delegate prepare")
        return True

    def is_node_supported(self, context, node_index):
        return None

    def create_kernel(self):
        return TripwireKernel(self)


class TripwireKernel(SimpleDelegateKernel):
    def __init__(self, owner: Tripwire):
        self.owner = owner

    def free(self) -> None:
        self.owner.trip("kernel free")

    def init(self, context, params) -> None:
        self.owner.trip("kernel init")

    def prepare(self, context) -> None:
        self.owner.trip("kernel prepare")

    def eval(self, context) -> None:
        self.owner.trip("kernel eval")


MODEL = head_model(np.float32)
CONVERTED = Path(__file__).parents[1] / "converted"


def _quiet(capfd, delegate: PythonDelegate) -> None:
    err = capfd.readouterr().err
    assert "Exception ignored" not in err and "Traceback" not in err and "failed" not in err, err
    assert delegate.last_error is None  # nothing went wrong: the user stopped it
    assert sys.gettrace() is None  # the trace function that re-raised it is gone


@pytest.mark.parametrize("where", ["delegate prepare", "kernel init", "kernel prepare"])
def test_interrupt_while_the_interpreter_is_created(capfd, where):
    d = PythonDelegate(Tripwire(where))
    with pytest.raises(KeyboardInterrupt):
        Interpreter(model_content=MODEL, experimental_delegates=[d])
    _quiet(capfd, d)
    it = interpreter(MODEL, d)  # the next one delegates as usual
    it.invoke()
    assert len(d.kernels) == 1


@pytest.mark.parametrize("where", ["delegate prepare", "kernel init", "kernel prepare"])
def test_interrupt_in_allocate_tensors(capfd, where):
    """After a resize TFLite delegates the graph again when it allocates (the delegate does not
    allow dynamic tensors): every callback runs inside allocate_tensors."""
    impl = Tripwire(where)
    d = PythonDelegate(impl)
    impl.armed = False
    it = Interpreter(model_content=add_runs(1), experimental_delegates=[d])
    it.resize_tensor_input(0, [2, 6])
    impl.armed = True
    with pytest.raises(KeyboardInterrupt):
        it.allocate_tensors()
    _quiet(capfd, d)
    it.allocate_tensors()
    it.invoke()


def test_interrupt_in_invoke(capfd):
    impl = Tripwire("kernel eval")
    d = PythonDelegate(impl)
    impl.armed = False
    it = interpreter(MODEL, d)
    it.invoke()
    impl.armed = True
    with pytest.raises(KeyboardInterrupt):
        it.invoke()
    _quiet(capfd, d)
    it.invoke()  # the interpreter goes on working


def test_interrupt_in_a_signature_runner(capfd):
    """A signature runner calls TFLite's Invoke itself, not through Interpreter.invoke."""
    impl = Tripwire("kernel eval")
    d = PythonDelegate(impl)
    impl.armed = False
    it = Interpreter(model_path=str(CONVERTED / "cnn_float32.tflite"), experimental_delegates=[d])
    run = it.get_signature_runner()
    x = {"image": np.zeros(it.get_input_details()[0]["shape"], np.float32)}
    run(**x)
    impl.armed = True
    with pytest.raises(KeyboardInterrupt):
        run(**x)
    _quiet(capfd, d)
    assert list(run(**x)) == ["output_0"]


def test_interrupt_while_the_interpreter_is_freed(capfd):
    """TFLite frees the kernels from the Interpreter's __del__: the code that let the Interpreter go
    gets the KeyboardInterrupt, right after that statement."""
    impl = Tripwire("kernel free")
    d = PythonDelegate(impl)
    it = interpreter(MODEL, d)
    reached = False
    with pytest.raises(KeyboardInterrupt):
        del it
        reached = True
    assert not reached and d.kernels == {}
    _quiet(capfd, d)


def test_an_application_that_catches_it_and_goes_on(capfd):
    """The interrupt comes once per Ctrl-C: the invoke after it is not interrupted again."""
    impl = Tripwire("kernel eval")
    d = PythonDelegate(impl)
    impl.armed = False
    it = interpreter(MODEL, d)
    caught = 0
    for k in range(4):
        impl.armed = k == 1
        try:
            it.invoke()
        except KeyboardInterrupt:
            caught += 1
    assert caught == 1
    _quiet(capfd, d)


# ---- a real SIGINT while TFLite runs its own kernels between two delegated partitions ------------
# Python raises the KeyboardInterrupt in the first Python code that runs after the signal: the
# next callback, as it starts, before its own try (delegate.interrupts.guard).

SLOW_ELEMENTS = 1 << 22


def _partitions_around_slow_cpu_ops() -> bytes:
    """ADD (delegated) -> 60 x COS on 4M floats (TFLite's CPU) -> ADD (delegated)."""
    b = TfLiteModelBuilder()
    x = b.add_input("x", [1, SLOW_ELEMENTS])
    add = ("AddOptions", {"fused_activation_function": 0})
    cur = b.add_tensor("a0", [1, SLOW_ELEMENTS])
    b.add_operator("ADD", [x, x], [cur], add)
    for k in range(60):
        nxt = b.add_tensor(f"c{k}", [1, SLOW_ELEMENTS])
        b.add_operator("COS", [cur], [nxt])
        cur = nxt
    out = b.add_tensor("out", [1, SLOW_ELEMENTS])
    b.add_operator("ADD", [cur, x], [out], add)
    b.set_outputs([out])
    return b.build()


class AddsOnly(SimpleDelegateInterface):
    """Claims the ADDs; the first partition's eval tells ``entered`` that the CPU ops come next."""

    partition_options = PartitionOptions(partitioning="largest")

    def __init__(self):
        self.entered = threading.Event()

    def is_node_supported(self, context, node_index):
        return None if context.graph.nodes[node_index].builtin_code == builtin_code("ADD") else "not an ADD"

    def create_kernel(self):
        return AddKernel(self)


class AddKernel(SimpleDelegateKernel):
    def __init__(self, owner: AddsOnly):
        self.owner = owner

    def eval(self, context) -> None:
        self.owner.entered.set()


def test_sigint_while_tflite_runs_its_own_kernels(capfd):
    impl = AddsOnly()
    d = PythonDelegate(impl)
    it = Interpreter(model_content=_partitions_around_slow_cpu_ops(), experimental_delegates=[d])
    it.allocate_tensors()
    cpu_s = float("inf")  # almost all of an invoke is in the COS ops
    for _ in range(3):
        start = time.perf_counter()
        it.invoke()
        cpu_s = min(cpu_s, time.perf_counter() - start)
    assert len(d.kernels) == 2

    def interrupt():
        impl.entered.wait()
        time.sleep(cpu_s / 3)  # inside the COS ops: no Python runs until the second partition's callback
        os.kill(os.getpid(), signal.SIGINT)

    impl.entered.clear()
    sender = threading.Thread(target=interrupt)
    sender.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            it.invoke()
    finally:
        sender.join()
    _quiet(capfd, d)
    it.invoke()  # the interpreter goes on working


# ---- a real Ctrl-C, in a user's own script, against a real service ----------------------------------

USER_SCRIPT = """
import sys
import numpy as np
from delegate import load_delegate
from delegate.runtime import Interpreter
model_path, address, local_burst = sys.argv[1], sys.argv[2], sys.argv[3] == "burst"
d = load_delegate(address, local_burst=local_burst)
it = Interpreter(model_path=model_path, experimental_delegates=[d])
it.allocate_tensors()
x = np.random.default_rng(0).uniform(-1, 1, it.get_input_details()[0]["shape"]).astype(np.float32)
it.set_tensor(it.get_input_details()[0]["index"], x)
it.invoke()
invokes = 0
try:
    print("ready", flush=True)
    while True:
        it.invoke()
        invokes += 1
except KeyboardInterrupt:
    print("KeyboardInterrupt caught", flush=True)
it.invoke()  # the delegate goes on working, on the service
got = it.get_tensor(it.get_output_details()[0]["index"])
cpu = Interpreter(model_path=model_path)
cpu.allocate_tensors()
cpu.set_tensor(cpu.get_input_details()[0]["index"], x)
cpu.invoke()
want = cpu.get_tensor(cpu.get_output_details()[0]["index"])
print("difference", float(np.max(np.abs(got - want))))
print("fallbacks", sum(k.fallbacks for k in d.impl.kernels), "delegated", d.report.delegated, len(d.report.nodes))
"""


@pytest.mark.parametrize("transport", ["burst", "grpc"])
def test_ctrl_c_in_a_users_invoke_loop(server, tmp_path, transport):
    """The model runs whole on the service, a few milliseconds per invoke: a Ctrl-C lands almost
    surely while the delegate waits for the service (in the local burst, or in a gRPC call)."""
    path = tmp_path / "model.tflite"
    path.write_bytes(mobilenet_like(np.float32, input_size=224, width=16))
    p = subprocess.Popen([sys.executable, "-c", USER_SCRIPT, str(path), server.address, transport],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline() == "ready\n", p.communicate(timeout=HANG_LIMIT_S)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=HANG_LIMIT_S)
    finally:
        p.kill()
    lines = out.splitlines()
    assert p.returncode == 0 and lines[0] == "KeyboardInterrupt caught", (out, err)
    noise = [x for x in err.splitlines() if not x.startswith("INFO: ")]  # TFLite's own XNNPACK line
    assert noise == [], err  # no "Exception ignored", Traceback, "failed to invoke", "local burst broken"
    assert float(lines[1].split()[1]) < 1e-4, lines
    assert lines[2] == "fallbacks 0 delegated 14 14", lines  # never ran in-process
