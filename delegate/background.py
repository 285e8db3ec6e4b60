"""A call run in a thread started at once, whose answer (or exception) the caller collects later:
what a delegate prepare waits on over the wire (connecting, loading from the cache) overlaps
the work it does meanwhile."""
from __future__ import annotations

import threading
from typing import Any, Callable


class Background:
    """``fn(*args)`` in a daemon thread started now; ``result()`` waits for it and returns its
    value or raises its exception in the caller's thread."""

    def __init__(self, name: str, fn: Callable[..., Any], *args: Any) -> None:
        self._out: list = []
        self._thread = threading.Thread(target=self._run, args=(fn, args), daemon=True, name=name)
        self._thread.start()

    def _run(self, fn: Callable[..., Any], args: tuple) -> None:
        try:
            self._out.append((fn(*args), None))
        except BaseException as e:  # noqa: BLE001 - raised in the caller's thread by result()
            self._out.append((None, e))

    def failed(self) -> bool:
        """Finished, with an exception."""
        return not self._thread.is_alive() and self._out[0][1] is not None

    def result(self) -> Any:
        self._thread.join()
        value, error = self._out[0]
        if error is not None:
            raise error
        return value
