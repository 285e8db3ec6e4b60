"""The cuda backend: float partitions as torch programs, captured as CUDA graphs on a GPU.

Like the onnxruntime backend it compiles each run of consecutive operations it takes into one
executable at prepareModel, and it takes them through the same lowerings: a partition becomes the
ONNX graph ``hal.backends.ort`` lowers it to (NNAPI's semantics are written once), run by
``program.Program`` with torch operators. On a CUDA device the program is captured once per input
shape as a CUDA graph over device buffers allocated once (``runner``); an execution copies the
inputs in and the outputs out, nothing else. The compilation cache keeps the lowered graph and its
weights, so prepareModelFromCache builds the program without lowering again; the backend's version
names torch, CUDA, the driver and the GPU, so an entry made elsewhere is a miss.

Precision: float32 with TF32 off (NNAPI CTS's float32 criteria); a model that relaxes float32 to
float16 (``relaxComputationFloat32toFloat16``, the delegate's ``allow_fp16``) runs in float16 on a
GPU. WHILE and IF are not taken: a data-dependent loop cannot be captured (they run on the next
backend of the order).
"""
from __future__ import annotations

import logging
import re
import threading
from dataclasses import dataclass

import numpy as np
import onnx
import torch
from onnx import numpy_helper

from hal import backends
from hal.backends import host_memory
from hal.backends.cuda import fusion, ops_math, ops_nn, ops_resize, ops_tensor  # noqa: F401  (register the operators)
from hal.backends.cuda.device import driver_version
from hal.backends.cuda.program import Program
from hal.backends.cuda.runner import EagerRunner, GraphRunner, pin
from hal.backends.graph import GraphBackend
from hal.backends.ort import BACKEND as ORT_BACKEND
from hal.backends.ort import lower_partition
from hal.types import OperationType

log = logging.getLogger(__name__)

#: The artifact's form, in the backend's version.
PROGRAM_FORM = 1
#: Operations the backend leaves to the next one: control flow cannot be captured in a CUDA graph.
NOT_TAKEN = frozenset({OperationType.WHILE, OperationType.IF})


@dataclass
class CudaArtifact:
    """What the compilation cache keeps of a partition: the lowered ONNX graph (uint8 bytes)
    without its initializers, those by name, the partition's input and output names (its order),
    and whether it computes in float16 (a relaxed model on a GPU)."""

    model: np.ndarray
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    initializer_names: tuple[str, ...]
    initializers: tuple[np.ndarray, ...]
    half: bool = False


def _numpy_dtype(onnx_type: int) -> np.dtype:
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(onnx_type))


class CudaBackend(GraphBackend):
    """See the module docstring. ``device``: a torch device name (``cuda``, ``cuda:1``, ``cpu``).
    ``float16``: whether a relaxed model computes in float16 (default: on a GPU; the tests ask for
    it on torch's CPU device too)."""

    def __init__(self, device: str, float16: bool | None = None):
        self.device = torch.device(device)
        self.on_gpu = self.device.type == "cuda"
        self.float16 = self.on_gpu if float16 is None else float16
        super().__init__("cuda", f"torch{torch.__version__}-{_device_tag(self.device)}-p{PROGRAM_FORM}",
                         modules=("hal.backends.cuda", "hal.backends.ort"), priority=30 if self.on_gpu else 0,
                         description=f"float partitions as torch programs on {self.device}"
                                     + (", captured as CUDA graphs" if self.on_gpu else " (tests)"),
                         opt_in=not self.on_gpu)
        # the onnxruntime backend's lowerings: one lowering per operation family
        self.lowerings = {t: lw for t, lw in ORT_BACKEND.lowerings.items() if t not in NOT_TAKEN}
        self._lock = threading.Lock()  # torch's settings and a first CUDA context, once

    def compile(self, partition) -> tuple[CudaArtifact, object]:
        g, inputs = lower_partition(self, partition)
        model = g.model(partition.inputs, partition.outputs)
        names = tuple(t.name for t in model.graph.initializer)
        values = tuple(np.ascontiguousarray(numpy_helper.to_array(t)) for t in model.graph.initializer)
        del model.graph.initializer[:]
        half = self.float16 and bool(partition.model.relax_computation_float32_to_float16)
        artifact = CudaArtifact(np.frombuffer(model.SerializeToString(), np.uint8), inputs,
                                tuple(o.name for o in model.graph.output), names, values, half)
        return artifact, self.load(partition, artifact)

    def load(self, partition, artifact: CudaArtifact):
        if not isinstance(artifact, CudaArtifact) or not isinstance(artifact.model, np.ndarray) \
                or len(artifact.initializer_names) != len(artifact.initializers) \
                or not all(isinstance(a, np.ndarray) for a in artifact.initializers):
            raise ValueError("not a cuda partition artifact")
        model = onnx.load_from_string(artifact.model.tobytes())
        if [vi.name for vi in model.graph.input if vi.name not in artifact.initializer_names] != list(artifact.inputs) \
                or [vi.name for vi in model.graph.output] != list(artifact.outputs):
            raise ValueError("the cached graph's inputs and outputs are not the partition's")
        float_type = torch.float16 if artifact.half else torch.float32
        # float32 only: in float16, cuDNN's fused call was slower than the operators apart (lent H200)
        rewrite = fusion.rewrite if self.on_gpu and fusion.ENABLED and not artifact.half else None
        program = Program(model, dict(zip(artifact.initializer_names, artifact.initializers)), self.device, float_type,
                          rewrite)
        out_types = [_numpy_dtype(vi.type.tensor_type.elem_type) for vi in model.graph.output]
        if not self.on_gpu:
            # torch's CPU kernels take the threads the graph backends are given (process-wide)
            torch.set_num_threads(backends.compute_threads() or 1)
            return EagerRunner(program, out_types)
        self._settings()
        in_specs = [(tuple(partition.infos[i].shape), partition.infos[i].dtype) for i in partition.inputs]
        return GraphRunner(program, in_specs, out_types)

    def _settings(self) -> None:
        with self._lock:
            # float32 means float32: TF32 tensor-core products round the operands to 10 bits
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False


def _device_tag(device: torch.device) -> str:
    """torch's CUDA, the driver and the GPU (name, compute capability): what compiled code and
    captured graphs depend on; ``cpu`` for torch's CPU device."""
    if device.type != "cuda":
        return "cpu"
    index = device.index or 0
    props = torch.cuda.get_device_properties(index)
    name = re.sub(r"[^A-Za-z0-9]+", "_", props.name).strip("_")
    return f"cuda{torch.version.cuda}-drv{driver_version() or 'unknown'}-{name}-sm{props.major}{props.minor}"


def register(device: str) -> CudaBackend | None:
    """Register the backend on ``device`` (None, logged, where torch cannot use it)."""
    try:
        if torch.device(device).type == "cuda" and not torch.cuda.is_available():
            log.warning("cuda backend: torch %s sees no CUDA device; not registered", torch.__version__)
            return None
        backend = CudaBackend(device)
    except (RuntimeError, ValueError) as e:
        log.warning("cuda backend on %r not registered: %s", device, e)
        return None
    if backend.on_gpu:
        host_memory.register_pinner(pin)  # a local burst's slots: copied to and from the GPU in place
    return backends.register_backend(backend)
