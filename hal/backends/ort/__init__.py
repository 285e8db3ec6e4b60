"""The onnxruntime backend: float partitions compiled into one onnxruntime session at prepareModel.

Like a vendor driver compiling a partition for its accelerator: each run of consecutive
operations this backend lowers (TENSOR_FLOAT32 today) becomes one ONNX graph (weights as
initializers; activations in NCHW, the convolutions' layout, from the first operation that wants
it to the partition's edges: see graph.py) and one ``InferenceSession`` with every graph optimisation
on: convolutions re-laid out as NCHWc with bias, Clip and residual Add fused, threads from
``hal.backends.compute_threads()``. An execution is one ``run`` call for the whole partition.

The compilation cache stores the optimised model (ONNX, every graph optimisation applied) with its
large initializers apart, as arrays of the cache entry: prepareModelFromCache parses a graph of a
few tens of KiB with optimisations off and hands onnxruntime the weights as external initializers,
read in place from the entry's read-only mapping (no copy; onnxruntime never writes initializers).
The optimised graph is specific to this CPU (block size of the NCHWc layout) and onnxruntime
version: both are in the backend's version, so a cache entry made elsewhere is compiled again,
never run.

Operations it does not lower (quantized types, ops without a lowering, forms a lowering declines)
run on the next backend of the preference order. Every lowering is tested against the reference
backend with NNAPI CTS's float criteria (tests/backends/test_ort.py, and the CTS corpus).
"""
from __future__ import annotations

import hashlib
import importlib
import os
import pkgutil
import tempfile
import time
from dataclasses import dataclass

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper

from hal import backends
from hal.backends.graph import GraphBackend
from hal.backends.ort.graph import Inputs, OnnxGraph
from hal.backends.ort.watchdog import WATCHDOG
from hal.errors import HalError
from hal.types import ErrorStatus


def _cpu_tag() -> str:
    """What an optimised graph depends on besides onnxruntime: the CPU's instruction set."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith("flags")), "")
    except OSError:
        flags = ""
    import platform
    return hashlib.sha256(f"{platform.machine()}|{' '.join(sorted(flags.split()))}".encode()).hexdigest()[:8]


#: Initializers of at least this many bytes are kept apart from the graph (external initializers).
EXTERNAL_MIN_BYTES = 1024
#: Where an external initializer's bytes are said to be: never read, each is supplied at load.
_SUPPLIED = "nnhal-supplied-at-load"
#: The file onnxruntime writes the optimised graph's large initializers to, beside the graph.
_WEIGHTS_FILE = "weights.bin"


@dataclass
class OrtArtifact:
    """What the compilation cache keeps of a partition: the optimised model (ONNX) without its
    large initializers, those initializers by name, and the names of its graph inputs and outputs
    (in the partition's order)."""

    model: np.ndarray  # uint8 bytes of the ONNX model, large initializers external (_SUPPLIED)
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    initializer_names: tuple[str, ...] = ()
    initializers: tuple[np.ndarray, ...] = ()
    #: The WHILE operations lowered into the graph as Loop nodes (their names; nested ones not
    #: counted): a run is bounded by the loop timeout once per loop (``limited_run``).
    loops: tuple[str, ...] = ()


#: NNAPI's default loop timeout, for a caller that gives no limits (the executor always does).
_DEFAULT_LOOP_TIMEOUT_NS = 2_000_000_000


def limited_run(run, loops: tuple[str, ...], limits: tuple[int | None, int] | None):
    """``run(options)`` stopped, as the executor stops a WHILE, when it outlasts the execution's
    ``limits`` (deadline_ns or None, loop timeout in ns): MISSED_DEADLINE_TRANSIENT. onnxruntime
    does not say which Loop was running, so the partition's run as a whole gets the loop
    timeout once per loop it holds (one loop: that loop's own bound, to the watchdog's period)."""
    deadline_ns, loop_timeout_ns = limits if limits is not None else (None, _DEFAULT_LOOP_TIMEOUT_NS)
    options = ort.RunOptions()
    options.log_severity_level = 4  # a stopped run is reported here, not on the service's stderr
    started = time.monotonic_ns()
    until = started + loop_timeout_ns * len(loops)
    if deadline_ns is not None:
        until = min(until, deadline_ns)
    WATCHDOG.watch(options, until)
    try:
        return run(options)
    except Exception:
        if not options.terminate:
            raise
        names = " or ".join(loops)
        if deadline_ns is not None and until == deadline_ns:
            raise HalError(ErrorStatus.MISSED_DEADLINE_TRANSIENT, f"{names}: deadline passed in the loop") from None
        raise HalError(ErrorStatus.MISSED_DEADLINE_TRANSIENT,
                       f"{names}: the loop ran longer than the loop timeout ({loop_timeout_ns / 1e9:g} s)") from None
    finally:
        WATCHDOG.unwatch(options)


class Executable:
    """One partition's session: called with the partition's inputs, returns its outputs."""

    def __init__(self, session: ort.InferenceSession, artifact: OrtArtifact, supplied: tuple = ()):
        self.session = session
        self._supplied = supplied  # external initializers' OrtValues: the session reads their memory
        self.inputs = list(artifact.inputs)
        self.outputs = list(artifact.outputs)
        #: Names of the WHILE operations it runs as loops: called with the execution's limits.
        self.loops = tuple(artifact.loops)
        # The public ``run`` re-checks every feed (~15 µs a call); the executor has validated them.
        inner = getattr(session, "_sess", None)
        self._run = inner.run if inner is not None and hasattr(inner, "run") else \
            (lambda names, feeds, options: session.run(names, feeds, options))

    def __call__(self, arrays: list, limits: tuple[int | None, int] | None = None) -> list:
        """``limits`` (deadline_ns or None, loop timeout ns): required when it runs loops."""
        feeds = dict(zip(self.inputs, arrays))  # (non-contiguous: copied by ORT)
        if not self.loops:
            return self._run(self.outputs, feeds, None)
        return limited_run(lambda options: self._run(self.outputs, feeds, options), self.loops, limits)

    def bind(self, inputs: list[np.ndarray], outputs: list[np.ndarray]) -> "BoundRun":
        """A runner over fixed arrays (a local burst's shared-memory slots): inputs read and
        outputs written in place, both bound once, so an execution is one call and no copy."""
        binding = self.session.io_binding()
        for name, a in zip(self.inputs, inputs):
            binding.bind_cpu_input(name, a)
        for name, o in zip(self.outputs, outputs):
            binding.bind_output(name, "cpu", 0, o.dtype, list(o.shape), o.ctypes.data)
        return BoundRun(self.session, binding, (inputs, outputs), self.loops)


class BoundRun:
    """``Executable.bind``'s runner; holds the bound arrays (their memory must outlive it)."""

    def __init__(self, session: ort.InferenceSession, binding, arrays, loops: tuple[str, ...] = ()) -> None:
        # The public run_with_iobinding checks the binding's session and WebGPU graph capture on
        # every call; a CPU session bound here once needs neither: the inner call runs it.
        inner, inner_binding = getattr(session, "_sess", None), getattr(binding, "_iobinding", None)
        if inner is not None and inner_binding is not None and hasattr(inner, "run_with_iobinding"):
            self._run, self._binding = inner.run_with_iobinding, inner_binding
        else:
            self._run, self._binding = (lambda b, options: session.run_with_iobinding(b, options)), binding
        self._keep = binding  # the wrapper owns the inner binding
        self.arrays = arrays
        self.loops = loops

    def __call__(self, limits: tuple[int | None, int] | None = None) -> None:
        """``limits``: as ``Executable``'s."""
        if not self.loops:
            self._run(self._binding, None)
        else:
            limited_run(lambda options: self._run(self._binding, options), self.loops, limits)


def session_options() -> ort.SessionOptions:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    # never set (an in-process caller): 1, as `nnhal serve --threads` defaults and TFLite's default
    so.intra_op_num_threads = backends.compute_threads() or 1
    so.inter_op_num_threads = 1
    so.log_severity_level = 3  # errors only: onnxruntime's warnings are about its own choices
    # Idle pool threads sleep instead of spinning: on a small machine a spinning pool takes the
    # core the client (or another model) needs.
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return so


def _lower(backend: GraphBackend, partition) -> tuple[OnnxGraph, tuple[str, ...]]:
    g = OnnxGraph(partition.infos)
    for i in partition.inputs:
        g.bind(i, f"in{i}")
    for step in partition.members:
        lowering = backend.lowering_for(step.ctx.op_type)
        outs = lowering.lower(g, step.ctx, Inputs(g, step.inputs))
        if len(outs) != len(step.outputs):
            raise RuntimeError(f"{step.ctx.name}: lowering gave {len(outs)} outputs for {len(step.outputs)}")
        for o, name in zip(step.outputs, outs):
            g.bind(o, name)
    return g, tuple(f"in{i}" for i in partition.inputs)


def compile_partition(backend: GraphBackend, partition) -> tuple[OrtArtifact, Executable]:
    g, input_names = _lower(backend, partition)
    model = g.model(partition.inputs, partition.outputs)
    so = session_options()
    with tempfile.TemporaryDirectory(prefix="nnhal-ort-") as folder:
        path = os.path.join(folder, "optimised.onnx")
        so.optimized_model_filepath = path
        # onnxruntime writes the large initializers of the optimised graph into a file of their own:
        # the graph parsed here is small, and the weights are sliced from one read of that file.
        so.add_session_config_entry("session.optimized_model_external_initializers_file_name", _WEIGHTS_FILE)
        so.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes",
                                    str(EXTERNAL_MIN_BYTES))
        session = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        optimised = onnx.load(path, load_external_data=False)
        weights_path = os.path.join(folder, _WEIGHTS_FILE)
        weights = b""  # no file: no initializer was large enough
        if os.path.exists(weights_path):
            with open(weights_path, "rb") as f:
                weights = f.read()
        names, arrays = _externalise(optimised, weights)
    artifact = OrtArtifact(np.frombuffer(optimised.SerializeToString(), dtype=np.uint8), input_names,
                           tuple(o.name for o in session.get_outputs()), names, arrays, tuple(g.loops))
    return artifact, Executable(session, artifact)


def _externalise(model: onnx.ModelProto, weights: bytes) -> tuple[tuple[str, ...], tuple[np.ndarray, ...]]:
    """The initializers onnxruntime wrote to ``weights`` (their names and values, read-only views of
    it); each is then marked in ``model`` as supplied at load."""
    names, arrays = [], []
    for init in model.graph.initializer:
        if init.data_location != onnx.TensorProto.EXTERNAL:
            continue
        where = {e.key: e.value for e in init.external_data}
        if where.get("location") != _WEIGHTS_FILE:
            raise ValueError(f"initializer {init.name} is stored in {where.get('location')!r}")
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(init.data_type))
        offset, length = int(where.get("offset", 0)), int(where["length"])
        count = int(np.prod(init.dims, dtype=np.int64))
        if count * dtype.itemsize != length or offset + length > len(weights):
            raise ValueError(f"initializer {init.name}: {length} bytes at {offset} do not hold {list(init.dims)}")
        names.append(init.name)
        arrays.append(np.frombuffer(weights, dtype, count, offset).reshape(tuple(init.dims)))
        del init.external_data[:]
        init.external_data.add(key="location", value=_SUPPLIED)
    return tuple(names), tuple(arrays)


def load_partition(partition, artifact: OrtArtifact) -> Executable:
    if not isinstance(artifact, OrtArtifact) or not isinstance(artifact.model, np.ndarray) \
            or len(artifact.initializer_names) != len(artifact.initializers) \
            or not all(isinstance(a, np.ndarray) for a in artifact.initializers):
        raise ValueError("not an onnxruntime partition artifact")
    so = session_options()
    # The artifact is the optimised graph: optimising it again changes nothing (tested) and costs
    # most of the load.
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    # The weights in place (read-only views of the cache entry's mapping, kept by the prepared
    # model): onnxruntime reads them through these OrtValues, which the executable keeps.
    supplied = tuple(ort.OrtValue.ortvalue_from_numpy(a) for a in artifact.initializers)
    if supplied:
        so.add_external_initializers(list(artifact.initializer_names), list(supplied))
    session = ort.InferenceSession(artifact.model.tobytes(), so, providers=["CPUExecutionProvider"])
    if [i.name for i in session.get_inputs()] != list(artifact.inputs):
        raise ValueError("the cached model's inputs are not the partition's")
    return Executable(session, artifact, supplied)


class OrtBackend(GraphBackend):
    def compile(self, partition) -> tuple[OrtArtifact, Executable]:
        return compile_partition(self, partition)

    def load(self, partition, artifact: OrtArtifact) -> Executable:
        return load_partition(partition, artifact)


BACKEND = backends.register_backend(OrtBackend(
    "onnxruntime", f"{ort.__version__}-cpu{_cpu_tag()}", modules=("hal.backends.ort",), priority=20,
    description="float partitions compiled into one onnxruntime session (graph optimisations, NCHWc)"))


# Every lowering family of this package registers itself on import.
for _m in pkgutil.iter_modules(__path__):
    if _m.name != "graph":
        importlib.import_module(f"{__name__}.{_m.name}")
