"""Stops onnxruntime runs that are past their limit: a partition whose graph loops (an ONNX Loop
lowered from a WHILE) may never end by itself.

onnxruntime checks a run's ``RunOptions.terminate`` before every node, nodes of a Loop's body
included, and fails the run once it is set. One daemon thread per process sets it: it wakes
every ``PERIOD_S`` while some run is watched and ends after ``IDLE_S`` without one, so an
execution pays two dictionary operations, never a thread or a timer of its own.
"""
from __future__ import annotations

import threading
import time

#: How often watched runs are checked: how late past its limit a run may be stopped.
PERIOD_S = 0.005
#: The thread ends after this long with nothing to watch (the next watched run starts it again).
IDLE_S = 1.0


class Watchdog:
    def __init__(self) -> None:
        self._runs: dict[int, tuple[int, object]] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def watch(self, options, until_ns: int) -> None:
        """Set ``options.terminate`` once time.monotonic_ns() passes ``until_ns`` (until ``unwatch``)."""
        self._runs[id(options)] = (until_ns, options)
        # Registered before the thread is looked at, and the thread lets go of itself before it
        # looks at the runs (``_patrol``): a run is never left without a thread to watch it.
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._patrol, name="nnhal-loop-watchdog", daemon=True)
                    self._thread.start()

    def unwatch(self, options) -> None:
        self._runs.pop(id(options), None)

    def _patrol(self) -> None:
        idle = 0.0
        while True:
            time.sleep(PERIOD_S)
            now = time.monotonic_ns()
            for until, options in list(self._runs.values()):
                if now > until:
                    options.terminate = True
            if self._runs:
                idle = 0.0
                continue
            idle += PERIOD_S
            if idle < IDLE_S:
                continue
            with self._lock:
                self._thread = None
                if not self._runs:
                    return
                self._thread = threading.current_thread()  # a run came in meanwhile: go on
                idle = 0.0


WATCHDOG = Watchdog()
