"""At most ``workers`` executions at once, queued work served highest priority first.

NNAPI orders queued work by priority. Executions run on the calling gRPC handler
thread: with a free slot they start at once (no thread hop: a cross-thread
wake-up costs ~70 µs on a VM vCPU, more than a small model's whole execution);
otherwise the caller waits in a priority queue (FIFO within one priority) and
is handed a slot directly by the execution that finishes.
"""
from __future__ import annotations

import heapq
import itertools
import threading
from typing import Any, Callable


class Scheduler:
    def __init__(self, workers: int):
        if workers < 1:
            raise ValueError("workers must be >= 1")
        self.workers = workers
        self._lock = threading.Lock()
        self._free = workers
        self._waiting: list[tuple[int, int, threading.Event]] = []
        self._seq = itertools.count()
        self._closed = False

    def run(self, priority: int, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` in a slot, waiting behind higher-priority (and earlier equal-priority) work."""
        self.admit(priority)
        try:
            return fn()
        finally:
            self.release()

    def admit(self, priority: int) -> None:
        """Take a slot, waiting behind higher-priority (and earlier equal-priority) work; every
        ``admit`` is paired with one ``release``. With a slot free and nobody queued this is one
        uncontended lock: the hot path of every execution."""
        with self._lock:
            if self._closed:
                raise RuntimeError("scheduler is shut down")
            if self._free > 0 and not self._waiting:
                self._free -= 1
                return
            turn = threading.Event()
            heapq.heappush(self._waiting, (-int(priority), next(self._seq), turn))
        turn.wait()

    def release(self) -> None:
        with self._lock:
            if self._waiting:
                heapq.heappop(self._waiting)[2].set()  # the slot passes straight to the next in line
            else:
                self._free += 1

    @property
    def queued(self) -> int:
        with self._lock:
            return len(self._waiting)

    def shutdown(self) -> None:
        """Refuse new work; executions in progress or queued finish (gRPC's grace period covers them)."""
        with self._lock:
            self._closed = True
