"""The onnxruntime backend: float partitions compiled into one onnxruntime session at prepareModel.

Like a vendor driver compiling a partition for its accelerator: each run of consecutive
operations this backend lowers (TENSOR_FLOAT32 today) becomes one ONNX graph (weights as
initializers; activations in NCHW, the convolutions' layout, from the first operation that wants
it to the partition's edges: see graph.py) and one ``InferenceSession`` with every graph optimisation
on: convolutions re-laid out as NCHWc with bias, Clip and residual Add fused, threads from
``hal.backends.compute_threads()``. An execution is one ``run`` call for the whole partition.

The compilation cache stores the optimised model in ORT format, so prepareModelFromCache loads it
without building or optimising the graph again. The optimised graph is specific to this CPU (block
size of the NCHWc layout) and onnxruntime version: both are in the backend's version, so a cache
entry made elsewhere is compiled again, never run.

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
from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

from hal import backends
from hal.backends.graph import GraphBackend
from hal.backends.ort.graph import Inputs, OnnxGraph


def _cpu_tag() -> str:
    """What an optimised graph depends on besides onnxruntime: the CPU's instruction set."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith("flags")), "")
    except OSError:
        flags = ""
    import platform
    return hashlib.sha256(f"{platform.machine()}|{' '.join(sorted(flags.split()))}".encode()).hexdigest()[:8]


@dataclass
class OrtArtifact:
    """What the compilation cache keeps of a partition: the optimised model in ORT format and
    the names of its graph inputs and outputs (in the partition's order)."""

    model: np.ndarray  # uint8 bytes of the ORT-format model
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


class Executable:
    """One partition's session: called with the partition's inputs, returns its outputs."""

    def __init__(self, session: ort.InferenceSession, artifact: OrtArtifact):
        self.session = session
        self.inputs = list(artifact.inputs)
        self.outputs = list(artifact.outputs)
        # The public ``run`` re-checks every feed (~15 µs a call); the executor has validated them.
        inner = getattr(session, "_sess", None)
        self._run = inner.run if inner is not None and hasattr(inner, "run") else \
            (lambda names, feeds, options: session.run(names, feeds, options))

    def __call__(self, arrays: list) -> list:
        return self._run(self.outputs, dict(zip(self.inputs, arrays)), None)  # (non-contiguous: copied by ORT)

    def bind(self, inputs: list[np.ndarray], outputs: list[np.ndarray]) -> "BoundRun":
        """A runner over fixed arrays (a local burst's shared-memory slots): inputs read and
        outputs written in place, both bound once, so an execution is one call and no copy."""
        binding = self.session.io_binding()
        for name, a in zip(self.inputs, inputs):
            binding.bind_cpu_input(name, a)
        for name, o in zip(self.outputs, outputs):
            binding.bind_output(name, "cpu", 0, o.dtype, list(o.shape), o.ctypes.data)
        return BoundRun(self.session, binding, (inputs, outputs))


class BoundRun:
    """``Executable.bind``'s runner; holds the bound arrays (their memory must outlive it)."""

    def __init__(self, session: ort.InferenceSession, binding, arrays) -> None:
        # The public run_with_iobinding checks the binding's session and WebGPU graph capture on
        # every call; a CPU session bound here once needs neither: the inner call runs it.
        inner, inner_binding = getattr(session, "_sess", None), getattr(binding, "_iobinding", None)
        if inner is not None and inner_binding is not None and hasattr(inner, "run_with_iobinding"):
            self._run, self._binding = inner.run_with_iobinding, inner_binding
        else:
            self._run, self._binding = (lambda b, options: session.run_with_iobinding(b, options)), binding
        self._keep = binding  # the wrapper owns the inner binding
        self.arrays = arrays

    def __call__(self) -> None:
        self._run(self._binding, None)


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
    fd, path = tempfile.mkstemp(prefix="nnhal-ort-", suffix=".ort")
    os.close(fd)
    try:
        so.optimized_model_filepath = path
        so.add_session_config_entry("session.save_model_format", "ORT")
        session = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        with open(path, "rb") as f:
            optimised = np.frombuffer(f.read(), dtype=np.uint8)
    finally:
        os.unlink(path)
    artifact = OrtArtifact(optimised, input_names, tuple(o.name for o in session.get_outputs()))
    return artifact, Executable(session, artifact)


def load_partition(partition, artifact: OrtArtifact) -> Executable:
    if not isinstance(artifact, OrtArtifact) or not isinstance(artifact.model, np.ndarray):
        raise ValueError("not an onnxruntime partition artifact")
    so = session_options()
    so.add_session_config_entry("session.load_model_format", "ORT")
    # The artifact is the optimised graph: optimising it again changes nothing (tested) and costs
    # up to a third of the load.
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    # Not "session.use_ort_model_bytes_directly" (3x faster to load): through the Python binding
    # the session would point into a temporary copy of the bytes (a service crash, seen).
    session = ort.InferenceSession(artifact.model.tobytes(), so, providers=["CPUExecutionProvider"])
    if [i.name for i in session.get_inputs()] != list(artifact.inputs):
        raise ValueError("the cached model's inputs are not the partition's")
    return Executable(session, artifact)


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
