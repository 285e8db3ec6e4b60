"""How a partition's torch program runs: eagerly (torch's CPU device), or replayed as a CUDA graph.

``GraphRunner`` (a GPU) keeps, per input shape, one captured CUDA graph over device input and
output buffers allocated once, and page-locked host buffers beside them: an execution copies each
input into its host buffer, queues the host-to-device copies, the replay and the device-to-host
copies on one stream, and waits once. ``bind`` over fixed arrays (a local burst's shared-memory
slots) registers their memory with CUDA instead, so the copies go straight between the slots and
the device. A float16 program converts at the edges inside the graph. One execution at a time
per runner (the buffers are the runner's).

Both are called like the onnxruntime backend's executables: ``runner(arrays) -> outputs`` (new
arrays of the partition's output types) and ``runner.bind(inputs, outputs)``.
"""
from __future__ import annotations

import logging
import threading
from typing import Callable

import numpy as np
import torch

from hal.backends.cuda.program import Program

log = logging.getLogger(__name__)

#: Untimed runs of a program before it is captured (cuDNN picks and caches its algorithms).
WARMUP_RUNS = 2


def _as_tensor(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a))


class EagerRunner:
    """The program run operator by operator on torch's CPU device."""

    loops: tuple[str, ...] = ()

    def __init__(self, program: Program, out_types: list[np.dtype]):
        self.program = program
        self.out_types = out_types

    def _outputs(self, tensors: list[torch.Tensor]) -> list[np.ndarray]:
        # new arrays: an output may be a view of an input or of a weight
        return [np.array(t.detach().cpu().numpy(), dtype=d, copy=True) for t, d in zip(tensors, self.out_types)]

    def __call__(self, arrays: list, limits=None) -> list[np.ndarray]:
        with torch.inference_mode():
            inputs = [_float(_as_tensor(a), self.program.float_type) for a in arrays]
            return self._outputs(self.program(inputs))

    def bind(self, inputs: list[np.ndarray], outputs: list[np.ndarray]) -> Callable[[], None]:
        def run(limits=None) -> None:
            for o, r in zip(outputs, self(inputs)):
                np.copyto(o, r)
        return run


def _float(t: torch.Tensor, float_type: torch.dtype) -> torch.Tensor:
    return t.to(float_type) if t.dtype == torch.float32 and float_type != torch.float32 else t


class _Captured:
    """One input shape's CUDA graph and the buffers it reads and writes."""

    def __init__(self, program: Program, shapes: list[tuple], in_types: list[np.dtype], out_types: list[np.dtype],
                 stream: torch.cuda.Stream):
        device = program.device
        self.device_in = [torch.empty(s, dtype=_torch(t), device=device) for s, t in zip(shapes, in_types)]
        self.host_in = [torch.empty(s, dtype=_torch(t), pin_memory=True) for s, t in zip(shapes, in_types)]

        def body() -> list[torch.Tensor]:
            outs = program([_float(t, program.float_type) for t in self.device_in])
            return [o.to(_torch(d)).contiguous() for o, d in zip(outs, out_types)]

        with torch.inference_mode():
            stream.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(stream):
                for _ in range(WARMUP_RUNS):  # outside the capture: caches filled, algorithms chosen
                    body()
            stream.synchronize()
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph, stream=stream):
                self.device_out = body()
        self.host_out = [torch.empty(o.shape, dtype=o.dtype, pin_memory=True) for o in self.device_out]


def _torch(dtype: np.dtype) -> torch.dtype:
    return torch.from_numpy(np.empty(0, dtype)).dtype


class GraphRunner:
    """The program captured as a CUDA graph per input shape (see the module docstring)."""

    loops: tuple[str, ...] = ()

    def __init__(self, program: Program, in_specs: list[tuple[tuple, np.dtype]], out_types: list[np.dtype]):
        self.program = program
        self.in_types = [np.dtype(d) for _, d in in_specs]
        self.out_types = out_types
        self.stream = torch.cuda.Stream(program.device)
        self._lock = threading.Lock()
        self._captured: dict[tuple, _Captured] = {}
        shapes = [s for s, _ in in_specs]
        if all(s is not None and all(isinstance(n, int) and n > 0 for n in s) for s in shapes):
            self._capture(shapes)  # at prepareModel: the partition's shapes are known

    def _capture(self, shapes: list[tuple]) -> _Captured:
        key = tuple(tuple(s) for s in shapes)
        captured = self._captured.get(key)
        if captured is None:
            captured = self._captured[key] = _Captured(self.program, list(key), self.in_types, self.out_types,
                                                       self.stream)
        return captured

    def __call__(self, arrays: list, limits=None) -> list[np.ndarray]:
        with self._lock:
            c = self._capture([a.shape for a in arrays])
            for h, a in zip(c.host_in, arrays):
                np.copyto(h.numpy(), a, casting="no")
            with torch.cuda.stream(self.stream):
                for d, h in zip(c.device_in, c.host_in):
                    d.copy_(h, non_blocking=True)
                c.graph.replay()
                for h, d in zip(c.host_out, c.device_out):
                    h.copy_(d, non_blocking=True)
            self.stream.synchronize()
            return [h.numpy().copy() for h in c.host_out]

    def bind(self, inputs: list[np.ndarray], outputs: list[np.ndarray]) -> "BoundGraph":
        return BoundGraph(self, inputs, outputs)


class BoundGraph:
    """A GraphRunner over fixed arrays: their memory registered with CUDA (page-locked in place),
    so each execution is the copies in, the replay and the copies out, straight from and to them.
    Where registration is refused the copies go through the runner's own page-locked buffers."""

    def __init__(self, runner: GraphRunner, inputs: list[np.ndarray], outputs: list[np.ndarray]):
        self.runner = runner
        self.arrays = (inputs, outputs)  # their memory must outlive the binding
        self.captured = runner._capture([a.shape for a in inputs])
        self._registered: list[int] = []
        self.host_in = [self._host(a, staged) for a, staged in zip(inputs, self.captured.host_in)]
        self.host_out = [self._host(o, staged) for o, staged in zip(outputs, self.captured.host_out)]
        self._copy_back = [(o, h) for o, h in zip(outputs, self.host_out) if not _aliases(o, h)]
        self._copy_in = [(h, a) for a, h in zip(inputs, self.host_in) if not _aliases(a, h)]

    def _host(self, a: np.ndarray, staged: torch.Tensor) -> torch.Tensor:
        if not a.flags.c_contiguous or a.nbytes == 0:
            return staged
        cudart = torch.cuda.cudart()
        status = cudart.cudaHostRegister(a.ctypes.data, a.nbytes, 0)
        if int(getattr(status, "value", status)) != 0:
            log.info("cuda backend: host memory not registered (status %s): copies are staged", status)
            return staged
        self._registered.append(a.ctypes.data)
        return torch.from_numpy(a)

    def __call__(self, limits=None) -> None:
        c, stream = self.captured, self.runner.stream
        with self.runner._lock:
            for h, a in self._copy_in:
                np.copyto(h.numpy(), a, casting="no")
            with torch.cuda.stream(stream):
                for d, h in zip(c.device_in, self.host_in):
                    d.copy_(h, non_blocking=True)
                c.graph.replay()
                for h, d in zip(self.host_out, c.device_out):
                    h.copy_(d, non_blocking=True)
            stream.synchronize()
            for o, h in self._copy_back:
                np.copyto(o, h.numpy(), casting="no")

    def __del__(self) -> None:
        if self._registered:
            cudart = torch.cuda.cudart()
            for ptr in self._registered:
                cudart.cudaHostUnregister(ptr)


def _aliases(a: np.ndarray, t: torch.Tensor) -> bool:
    return a.ctypes.data == t.data_ptr()
