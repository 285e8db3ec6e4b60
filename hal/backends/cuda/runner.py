"""How a partition's torch program runs: eagerly (torch's CPU device), or replayed as a CUDA graph.

``GraphRunner`` (a GPU) keeps, per input shape, one captured CUDA graph over device input and
output buffers allocated once, and page-locked host buffers beside them: an execution copies each
input into its host buffer, queues the host-to-device copies (DMA from page-locked memory), the
replay and the device-to-host copies on one stream, and waits once. A bound run (a local burst's
shared-memory slots) copies straight between the slots and the device where the slots are
page-locked: the burst pins its whole mapping once (``hal.backends.host_memory``, with ``pin``
below), not slot by slot, since neighbouring slots share pages and CUDA refuses a page twice.
Slots that are not page-locked go through the host buffers. A float16 program converts at the
edges inside the graph. One execution at a time per runner (the buffers are the runner's).

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
_CAPTURE_LOCK = threading.Lock()


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
    """One input shape's CUDA graph and the buffers it reads and writes. Where the program cannot
    be captured (an operator that synchronises with the host), ``replay`` runs it eagerly on the
    device into the same output buffers, and says so once in the log."""

    def __init__(self, program: Program, shapes: list[tuple], in_types: list[np.dtype], out_types: list[np.dtype],
                 stream: torch.cuda.Stream):
        device = program.device
        self.device_in = [torch.empty(s, dtype=_torch(t), device=device) for s, t in zip(shapes, in_types)]
        self.host_in = [torch.empty(s, dtype=_torch(t), pin_memory=True) for s, t in zip(shapes, in_types)]

        def body() -> list[torch.Tensor]:
            outs = program([_float(t, program.float_type) for t in self.device_in])
            return [o.to(_torch(d)).contiguous() for o, d in zip(outs, out_types)]

        self._body = body
        # no_grad, not inference_mode: a first capture under inference_mode fails in some torch
        # releases (pytorch/pytorch#166792: "Inplace update to inference tensor outside InferenceMode")
        with torch.no_grad():
            stream.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(stream):
                for _ in range(WARMUP_RUNS):  # outside the capture: caches filled, algorithms chosen
                    self.device_out = body()
            stream.synchronize()
            try:
                graph = torch.cuda.CUDAGraph()
                # one capture at a time; other threads' executions go on meanwhile (thread_local:
                # only this thread's calls are checked against the capture)
                with _CAPTURE_LOCK, torch.cuda.graph(graph, stream=stream, capture_error_mode="thread_local"):
                    self.device_out = body()
                self.graph = graph
            except RuntimeError as e:
                log.warning("cuda backend: a partition for input shapes %s runs uncaptured: %s", shapes, e)
                torch.cuda.synchronize(device)
                self.graph = self
        self.host_out = [torch.empty(o.shape, dtype=o.dtype, pin_memory=True) for o in self.device_out]

    def replay(self) -> None:
        """The uncaptured program, on the current stream, into the output buffers."""
        with torch.no_grad():
            for d, r in zip(self.device_out, self._body()):
                d.copy_(r)


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
        if all(s is not None and all(n is not None and int(n) > 0 for n in s) for s in shapes):
            self._capture([tuple(int(n) for n in s) for s in shapes])  # at prepareModel: the shapes are known

    def _capture(self, shapes: list[tuple]) -> _Captured:
        key = tuple(tuple(s) for s in shapes)
        captured = self._captured.get(key)
        if captured is None:
            captured = self._captured[key] = _Captured(self.program, list(key), self.in_types, self.out_types,
                                                       self.stream)
        return captured

    def _run(self, c: _Captured, sources: list[torch.Tensor], targets: list[torch.Tensor]) -> None:
        """One execution: the page-locked ``sources`` copied into the graph's inputs, the replay,
        its outputs copied into the page-locked ``targets``, waited for (lock held)."""
        with torch.cuda.stream(self.stream):
            for d, h in zip(c.device_in, sources):
                d.copy_(h, non_blocking=True)
            c.graph.replay()
            for h, d in zip(targets, c.device_out):
                h.copy_(d, non_blocking=True)
        self.stream.synchronize()

    def __call__(self, arrays: list, limits=None) -> list[np.ndarray]:
        with self._lock:
            c = self._capture([a.shape for a in arrays])
            for h, a in zip(c.host_in, arrays):
                np.copyto(h.numpy(), a, casting="no")
            self._run(c, c.host_in, c.host_out)
            return [h.numpy().copy() for h in c.host_out]

    def bind(self, inputs: list[np.ndarray], outputs: list[np.ndarray]) -> Callable[[], None]:
        """A runner over fixed arrays (a local burst's shared-memory slots): the graph for their
        shapes captured now; each run copies the inputs' current contents in and the outputs out,
        straight from and into each array that is page-locked, else through the host buffers."""
        with self._lock:
            c = self._capture([a.shape for a in inputs])
        direct_in = [_page_locked(a, h.dtype) for a, h in zip(inputs, c.host_in)]
        direct_out = [_page_locked(o, h.dtype) for o, h in zip(outputs, c.host_out)]
        sources = [d if d is not None else h for d, h in zip(direct_in, c.host_in)]
        targets = [d if d is not None else h for d, h in zip(direct_out, c.host_out)]
        staged_in = [(h.numpy(), a) for d, h, a in zip(direct_in, c.host_in, inputs) if d is None]
        staged_out = [(o, h.numpy()) for d, h, o in zip(direct_out, c.host_out, outputs) if d is None]

        def run(limits=None) -> None:
            with self._lock:
                for h, a in staged_in:
                    np.copyto(h, a, casting="no")
                self._run(c, sources, targets)
                for o, h in staged_out:
                    np.copyto(o, h, casting="no")
        run.arrays = (inputs, outputs)  # type: ignore[attr-defined]  (their memory outlives the binding)
        run.direct = (len(inputs) - len(staged_in), len(outputs) - len(staged_out))  # type: ignore[attr-defined]
        return run


def _page_locked(a: np.ndarray, dtype: torch.dtype) -> torch.Tensor | None:
    """``a`` as a tensor over its own memory where a copy engine can read and write it directly
    (contiguous, writable, of the graph's type, page-locked), else None."""
    if not (a.flags.c_contiguous and a.flags.writeable) or a.size == 0:
        return None
    t = torch.from_numpy(a)
    return t if t.dtype == dtype and t.is_pinned() else None


#: cudaHostRegisterPortable: page-locked for every CUDA context (the backend's GPU need not be the
#: calling thread's current one).
_PORTABLE = 1


def pin(address: int, nbytes: int) -> Callable[[], None] | None:
    """``hal.backends.host_memory``'s pinner for CUDA: the pages registered (cudaHostRegister), so
    copies between them and a device are DMA; returns their unregistration, or None if refused."""
    cudart = torch.cuda.cudart()
    status = cudart.cudaHostRegister(address, nbytes, _PORTABLE)
    if int(status) != 0:
        log.warning("cuda backend: %d bytes of shared memory not page-locked (%s): copies are staged",
                    nbytes, status)
        _consume_error()
        return None
    return lambda: cudart.cudaHostUnregister(address)


def _consume_error() -> None:
    """A refused runtime call leaves its error for the thread's next check, which torch makes
    after its next kernel launch: one launch here takes it, so no execution reports it."""
    try:
        torch.empty(1, device="cuda").fill_(0)
    except RuntimeError:
        pass
