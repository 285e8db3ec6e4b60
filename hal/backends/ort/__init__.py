"""The onnxruntime backend: float partitions compiled into one onnxruntime session at prepareModel.

Like a vendor driver compiling a partition for its accelerator: each run of consecutive
operations this backend lowers (TENSOR_FLOAT32 today) becomes one ONNX graph (weights as
initializers; activations in NCHW, the convolutions' layout, from the first operation that wants
it to the partition's edges: see graph.py) and one ``InferenceSession`` with every graph optimisation
on: convolutions re-laid out as NCHWc with bias, Clip and residual Add fused, and the element-wise
operations between them moved onto the NCHWc tensors too (blocked.py), threads from
``hal.backends.compute_threads()``. An execution is one ``run`` call for the whole partition.

The compilation cache stores the optimised model (ONNX, every graph optimisation applied) with its
large initializers apart, as arrays of the cache entry, and the session runs that stored form at
prepareModel and prepareModelFromCache alike: a graph of a few tens of KiB, parsed with
optimisations off, whose large weights are graph inputs fed on every run from those arrays (at
prepareModelFromCache, read-only views of the entry's mapping). onnxruntime copies every
initializer it is given into memory of its own (external initializers included), and faulting in
a fresh copy of the weights was most of a load; an input is read in place. The weights of up to
PREPACK_MAX_BYTES a kernel pre-packs (a Gemm's or MatMul's B, a ConvTranspose's filter) stay
initializers, handed over as external initializers: pre-packing copies them anyway, and the
packed layout is what makes a small matrix fast on one row (an MLP's layers). A larger one is an
input: on one row its kernel reads it as fast unpacked, and a copy of it costs a load more than
packing gains. The optimised graph
is specific to this CPU (block size of the NCHWc layout), onnxruntime version and artifact form:
all three are in the backend's version, so a cache entry made elsewhere or before is compiled
again, never run.

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
import threading
import time
from dataclasses import dataclass

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

from hal import backends
from hal.backends.graph import GraphBackend
from hal.backends.ort.blocked import keep_blocked, value_shapes
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


#: Initializers of at least this many bytes are kept apart from the graph (fed as graph inputs).
EXTERNAL_MIN_BYTES = 1024
#: Where a pre-packed weight's bytes are said to be: never read, each is supplied at load.
_SUPPLIED = "nnhal-supplied-at-load"
#: Operators whose onnxruntime CPU kernels pre-pack a constant input (MLAS packed B, ConvTranspose's
#: transposed filter): their weights stay initializers.
PREPACKING_OPS = frozenset({"Gemm", "MatMul", "FusedGemm", "FusedMatMul", "ConvTranspose"})
#: The largest weight pre-packed (MobileNetV2's 5 MB classifier is not: copying it at load cost
#: more than packing gained per run).
PREPACK_MAX_BYTES = 1 << 20
#: The artifact's form, in the backend's version: 3 = element-wise operations between NCHWc
#: convolutions rewritten onto the blocked layout (blocked.py); 2 = large weights are graph inputs
#: unless a kernel pre-packs them (1 held all as external initializers, which onnxruntime copies at load).
ARTIFACT_FORM = 3
#: The file onnxruntime writes the optimised graph's large initializers to, beside the graph.
_WEIGHTS_FILE = "weights.bin"


@dataclass
class OrtArtifact:
    """What the compilation cache keeps of a partition: the optimised model (ONNX) without its
    large initializers, those initializers by name, and the names of the partition's inputs and
    outputs (in the partition's order). The first ``prepacked`` initializers are the model's
    external initializers (_SUPPLIED); the others are graph inputs after the partition's own."""

    model: np.ndarray  # uint8 bytes of the ONNX model
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    initializer_names: tuple[str, ...] = ()
    initializers: tuple[np.ndarray, ...] = ()
    prepacked: int = 0
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

    def __init__(self, session: ort.InferenceSession, artifact: OrtArtifact):
        self.session = session
        #: The large weights fed on every run (the session reads them in place; they keep the
        #: cache entry's mapping alive).
        k = artifact.prepacked
        self.weights = dict(zip(artifact.initializer_names[k:], artifact.initializers[k:]))
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
        feeds = dict(self.weights)
        feeds.update(zip(self.inputs, arrays))  # (non-contiguous: copied by ORT)
        if not self.loops:
            return self._run(self.outputs, feeds, None)
        return limited_run(lambda options: self._run(self.outputs, feeds, options), self.loops, limits)

    def bind(self, inputs: list[np.ndarray], outputs: list[np.ndarray]) -> "BoundRun":
        """A runner over fixed arrays (a local burst's shared-memory slots): inputs read and
        outputs written in place, both bound once, so an execution is one call and no copy."""
        binding = self.session.io_binding()
        for name, a in (*self.weights.items(), *zip(self.inputs, inputs)):
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


_arena_lock = threading.Lock()
_arena_registered: bool | None = None  # None: not tried yet


def _shared_arena() -> bool:
    """Register one CPU arena for every session of this process (once): a session loaded from the
    cache runs first on memory an earlier session already touched, instead of growing (and
    page-faulting) an arena of its own. The arena keeps the largest footprint it has served.
    False if onnxruntime refuses it: then each session keeps its own arena."""
    global _arena_registered
    with _arena_lock:
        if _arena_registered is None:
            try:
                ort.create_and_register_allocator(
                    ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT),
                    ort.OrtArenaCfg(0, -1, -1, -1))  # onnxruntime's defaults: no limit, its growth rule
                _arena_registered = True
            except (AttributeError, RuntimeError, ort.capi.onnxruntime_pybind11_state.Fail):
                _arena_registered = False  # not asked again
        return _arena_registered


def session_options() -> ort.SessionOptions:
    so = ort.SessionOptions()
    if _shared_arena():
        so.add_session_config_entry("session.use_env_allocators", "1")
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


def lower_partition(backend: GraphBackend, partition) -> tuple[OnnxGraph, tuple[str, ...]]:
    """The partition as one ONNX graph (by ``backend``'s lowerings) and its input names."""
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
    g, input_names = lower_partition(backend, partition)
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
        keep_blocked(optimised, value_shapes(model), lambda init: _stored(init, weights))
        names, arrays, prepacked = _externalise(optimised, weights)
    artifact = OrtArtifact(np.frombuffer(optimised.SerializeToString(), dtype=np.uint8), input_names,
                           tuple(o.name for o in session.get_outputs()), names, arrays, prepacked, tuple(g.loops))
    del session  # optimising was its purpose: the partition runs the artifact, as a cached one does
    return artifact, load_partition(partition, artifact)


def _externalise(model: onnx.ModelProto, weights: bytes) -> tuple[tuple[str, ...], tuple[np.ndarray, ...], int]:
    """The initializers onnxruntime wrote to ``weights`` (their names and values, 64-byte aligned
    copies), those a kernel pre-packs (up to PREPACK_MAX_BYTES) first, and how many those are. Those
    stay in ``model`` marked as supplied at load; each other one leaves its initializers and becomes
    a graph input of its type and shape, as does an inline one of EXTERNAL_MIN_BYTES or more."""
    packed = _prepacked_reads(model.graph)
    found, kept = [], []
    for init in model.graph.initializer:
        if init.data_location != onnx.TensorProto.EXTERNAL:
            # a large one made after onnxruntime wrote the file (blocked.py's constants): the same
            if init.name in packed or len(init.raw_data) < EXTERNAL_MIN_BYTES:
                kept.append(init)
                continue
            value = numpy_helper.to_array(init)
            found.append((True, init.name, _aligned(value, value.shape)))
            model.graph.input.append(helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
            continue
        value = _stored(init, weights)
        length = value.nbytes
        prepacked = init.name in packed and length <= PREPACK_MAX_BYTES
        found.append((not prepacked, init.name, _aligned(value, tuple(init.dims))))
        if prepacked:
            kept.append(init)
            del init.external_data[:]
            init.external_data.add(key="location", value=_SUPPLIED)
        else:
            model.graph.input.append(helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    found.sort(key=lambda f: f[0])  # stable: the pre-packed first, each group in the model's order
    return tuple(f[1] for f in found), tuple(f[2] for f in found), sum(not f[0] for f in found)


def _prepacked_reads(graph: onnx.GraphProto) -> set[str]:
    """The names a pre-packing kernel reads, in ``graph`` and its Loop bodies and If branches (a
    weight read across a Loop's trips is packed once, when the session is made)."""
    names: set[str] = set()
    for n in graph.node:
        if n.op_type in PREPACKING_OPS:
            names.update(n.input)
        for attr in n.attribute:
            for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                names |= _prepacked_reads(sub)
    return names


def _stored(init: onnx.TensorProto, weights: bytes) -> np.ndarray:
    """The value of an initializer onnxruntime wrote to ``weights`` (a view of those bytes)."""
    where = {e.key: e.value for e in init.external_data}
    if where.get("location") != _WEIGHTS_FILE:
        raise ValueError(f"initializer {init.name} is stored in {where.get('location')!r}")
    dtype = np.dtype(helper.tensor_dtype_to_np_dtype(init.data_type))
    offset, length = int(where.get("offset", 0)), int(where["length"])
    count = int(np.prod(init.dims, dtype=np.int64))
    if count * dtype.itemsize != length or offset + length > len(weights):
        raise ValueError(f"initializer {init.name}: {length} bytes at {offset} do not hold {list(init.dims)}")
    return np.frombuffer(weights, dtype, count, offset).reshape(tuple(init.dims))


def _aligned(values: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """A copy of ``values`` at a 64-byte aligned address, as the cache entry's arrays are: the
    kernels read a fed weight where it is, and misaligned vector loads made them slower."""
    buf = np.empty(values.nbytes + 64, np.uint8)
    start = -buf.ctypes.data % 64
    out = buf[start:start + values.nbytes].view(values.dtype).reshape(shape)
    out[...] = values.reshape(shape)
    return out


def load_partition(partition, artifact: OrtArtifact) -> Executable:
    if not isinstance(artifact, OrtArtifact) or not isinstance(artifact.model, np.ndarray) \
            or len(artifact.initializer_names) != len(artifact.initializers) \
            or not all(isinstance(a, np.ndarray) for a in artifact.initializers) \
            or not isinstance(artifact.prepacked, int) or not 0 <= artifact.prepacked <= len(artifact.initializers) \
            or not isinstance(artifact.loops, tuple) or not all(isinstance(n, str) for n in artifact.loops):
        raise ValueError("not an onnxruntime partition artifact")
    so = session_options()
    # The artifact is the optimised graph: optimising it again changes nothing (tested) and costs
    # most of the load.
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    k = artifact.prepacked
    if k:  # onnxruntime copies them (and checks their shapes): the pre-packing kernels' weights only
        so.add_external_initializers(list(artifact.initializer_names[:k]),
                                     [ort.OrtValue.ortvalue_from_numpy(a) for a in artifact.initializers[:k]])
    session = ort.InferenceSession(artifact.model.tobytes(), so, providers=["CPUExecutionProvider"])
    declared = session.get_inputs()
    if [i.name for i in declared] != [*artifact.inputs, *artifact.initializer_names[k:]]:
        raise ValueError("the cached model's inputs are not the partition's and its weights")
    for i, a in zip(declared[len(artifact.inputs):], artifact.initializers[k:]):
        # onnxruntime checks a fed input only when it runs: a weight that does not fit is a failed load
        if i.shape != list(a.shape) or i.type != _ONNX_TYPE.get(a.dtype.str) or not a.flags.c_contiguous:
            raise ValueError(f"weight {i.name}: {a.dtype}{list(a.shape)} given, the graph takes {i.type}{i.shape}")
    return Executable(session, artifact)


#: onnxruntime's name of each numpy type a weight can have.
_ONNX_TYPE = {np.dtype(t).str: f"tensor({n})" for t, n in (
    (np.float32, "float"), (np.float16, "float16"), (np.float64, "double"), (np.int8, "int8"), (np.uint8, "uint8"),
    (np.int16, "int16"), (np.uint16, "uint16"), (np.int32, "int32"), (np.int64, "int64"), (np.bool_, "bool"))}


class OrtBackend(GraphBackend):
    def compile(self, partition) -> tuple[OrtArtifact, Executable]:
        return compile_partition(self, partition)

    def load(self, partition, artifact: OrtArtifact) -> Executable:
        return load_partition(partition, artifact)


BACKEND = backends.register_backend(OrtBackend(
    "onnxruntime", f"{ort.__version__}-cpu{_cpu_tag()}-a{ARTIFACT_FORM}", modules=("hal.backends.ort",), priority=20,
    description="float partitions compiled into one onnxruntime session (graph optimisations, NCHWc)"))


# Every lowering family of this package registers itself on import.
for _m in pkgutil.iter_modules(__path__):
    if _m.name != "graph":
        importlib.import_module(f"{__name__}.{_m.name}")
