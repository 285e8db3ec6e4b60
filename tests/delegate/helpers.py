"""Run a model through TFLite with and without the nnhal delegate."""
from __future__ import annotations

import subprocess
import sys

import numpy as np

from delegate.runtime import Interpreter, OpResolverType
from tests.harness import assert_float_close, random_tensor


def interpreter(model: bytes, delegate=None, reference: bool = True) -> Interpreter:
    kind = OpResolverType.BUILTIN_REF if reference else OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
    it = Interpreter(model_content=model, experimental_delegates=[delegate] if delegate else None,
                     experimental_op_resolver_type=kind)
    it.allocate_tensors()
    return it


def run(it: Interpreter, inputs) -> list[np.ndarray]:
    for d, x in zip(it.get_input_details(), inputs):
        it.set_tensor(d["index"], x)
    it.invoke()
    return [it.get_tensor(d["index"]).copy() for d in it.get_output_details()]


def random_inputs(it: Interpreter, rng) -> list[np.ndarray]:
    return [random_tensor(rng, d["shape"], d["dtype"]) for d in it.get_input_details()]


def assert_outputs_equal(got, want) -> None:
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        if np.issubdtype(w.dtype, np.floating):
            assert_float_close(g, w)
        else:
            np.testing.assert_array_equal(g, w)


_LOAD_WITH_DELEGATE = """
import sys
from delegate import load_delegate
from delegate.runtime import Interpreter
d = load_delegate(sys.argv[2])
try:
    it = Interpreter(model_path=sys.argv[1], experimental_delegates=[d])
    it.allocate_tensors()
    it.invoke()
    print("loaded,", len(d.impl.kernels), "delegated:", d.last_error)
except (RuntimeError, ValueError) as e:
    print("refused:", d.last_error or str(e).splitlines()[0])
"""


def load_in_subprocess(path, service_address: str) -> subprocess.CompletedProcess:
    """Load and invoke a model file in TFLite with the nnhal delegate, in a child process (a crash
    there is a negative return code, not a dead test run); prints "refused: <the delegate's error,
    else TFLite's>" if TFLite refused it, else how many partitions nnhal took."""
    return subprocess.run([sys.executable, "-c", _LOAD_WITH_DELEGATE, str(path), service_address],
                          capture_output=True, text=True, timeout=120)


#: What LiteRT itself refuses before a delegate sees the model: its flatbuffers verifier, and its
#: size check of a tensor whose dimensions multiply past what it can allocate (a negative one).
LITERT_OWN_REFUSALS = ("The model is not a valid Flatbuffer buffer",
                       "tflite/util.cc BytesRequired number of elements overflowed")


def refused_by_the_delegate(r: subprocess.CompletedProcess, why: str) -> bool:
    """The delegate refused the model for ``why`` (one line, no traceback); or LiteRT, which runs
    the flatbuffers verifier and checks tensor sizes when it loads a model, refused the file before
    the delegate saw it."""
    from delegate.runtime import RUNTIME
    if RUNTIME == "ai_edge_litert" and "Traceback" not in r.stderr and any(
            f"refused: {litert}" in r.stdout for litert in LITERT_OWN_REFUSALS):
        return True
    return f"refused: {why}" in r.stdout and why in r.stderr and "Traceback" not in r.stderr


def assert_delegation_refused(path, service_address: str, why: str) -> None:
    """Loading ``path`` with the delegate, in a child process, neither crashes nor hangs: the
    delegate (or LiteRT's own verifier) refuses it for ``why``."""
    r = load_in_subprocess(path, service_address)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    assert refused_by_the_delegate(r, why), r.stdout


def live_and_file_options(model: bytes, node: int = 0) -> tuple[dict, dict]:
    """A node's options as the delegate decodes them from the C struct TFLite hands it (through a
    delegate that claims nothing) and as the flatbuffer stores them, for option-reader tests."""
    from delegate.simple import PythonDelegate, SimpleDelegateInterface
    from delegate.tfl import read_model

    class Probe(SimpleDelegateInterface):
        def initialize(self, context):
            self.graph = context.graph
            return False

    probe = Probe()
    interpreter(model, PythonDelegate(probe))
    return probe.graph.nodes[node].options, read_model(model).nodes[node].options


def stateful_feeds(it: Interpreter, rng, n: int, int_range: tuple[int, int] = (-128, 128)) -> list[list[np.ndarray]]:
    """n feeds for a stateful model; the second and the fourth repeat the first (with the state
    carried the second's outputs differ from the first's; after a reset the fourth's equal them).
    Floats uniform in [-1, 1), integers in ``int_range``."""
    def one():
        return [rng.uniform(-1, 1, d["shape"]).astype(d["dtype"]) if np.issubdtype(d["dtype"], np.floating)
                else rng.integers(*int_range, d["shape"]).astype(d["dtype"]) for d in it.get_input_details()]
    feeds = [one() for _ in range(n)]
    for k in (k for k in (1, 3) if k < n):
        feeds[k] = [x.copy() for x in feeds[0]]
    return feeds


def check_stateful_against_cpu(service, model: bytes, seed: int = 0, n: int = 6, stateful: bool = True,
                               int_range: tuple[int, int] = (-128, 128)):
    """The delegated model's outputs are TFLite's (reference kernels) over ``n`` invokes with a
    reset_all_variables() before invoke 3; every node runs on the service, in one partition.
    ``stateful``: also that the state matters and the reset restores the initial one. Returns the
    delegate (its report and kernels)."""
    from delegate import load_delegate
    d = load_delegate(service.address)
    it, ref = interpreter(model, d), interpreter(model)
    seen = []
    for k, xs in enumerate(stateful_feeds(ref, np.random.default_rng(seed), n, int_range)):
        if k == 3:
            it.reset_all_variables()
            ref.reset_all_variables()
        want = run(ref, xs)
        assert_outputs_equal(run(it, xs), want)
        seen.append(want)
    if stateful:
        assert any(not np.array_equal(a, b) for a, b in zip(seen[0], seen[1]))
        assert all(np.array_equal(a, b) for a, b in zip(seen[0], seen[3]))
    assert d.report.delegated == len(d.report.nodes), [(r.op, r.reason) for r in d.report.nodes]
    assert [k.fallbacks for k in d.impl.kernels] == [0]  # one partition, and the service ran it
    return d
