"""Host memory a process shares with its clients, made known to the backends that copy it to a device.

A device's copy engine reads and writes only page-locked host memory; a copy from any other memory
goes through a page-locked staging buffer, one more pass of the CPU over the data. A local burst's
shared-memory mapping holds every input and output of its requests for as long as the burst lives,
so its owner pins it once when it maps it (``pin``) and releases it before unmapping it; a backend
whose device can lock host pages registers a ``Pinner`` (the cuda backend: cudaHostRegister), and
its copies then read the inputs and write the outputs in the mapping itself. Without a pinner (no
GPU) ``pin`` does nothing.
"""
from __future__ import annotations

import logging
import threading
from typing import Callable

import numpy as np

log = logging.getLogger(__name__)

#: ``pinner(address, nbytes)`` locks those pages for its device and returns the call that unlocks
#: them, or None where it could not (the memory is then copied through staging, as before).
Pinner = Callable[[int, int], Callable[[], None] | None]

_PINNERS: list[Pinner] = []
_lock = threading.Lock()


def register_pinner(pinner: Pinner) -> None:
    with _lock:
        if pinner not in _PINNERS:
            _PINNERS.append(pinner)


def unregister_pinner(pinner: Pinner) -> None:
    with _lock:
        if pinner in _PINNERS:
            _PINNERS.remove(pinner)


class Pinned:
    """One buffer's pins, released once (``release``) before the buffer is unmapped."""

    def __init__(self, releases: list[Callable[[], None]]):
        self._releases = releases

    def __bool__(self) -> bool:
        return bool(self._releases)

    def release(self) -> None:
        releases, self._releases = self._releases, []
        for release in releases:
            try:
                release()
            except Exception:  # noqa: BLE001 - unpinning must not stop the owner's clean-up
                log.exception("host memory: unpinning failed")


def pin(buffer) -> Pinned:
    """Pin a writable, page-aligned buffer (an mmap) for every registered pinner."""
    with _lock:
        pinners = list(_PINNERS)
    if not pinners:
        return Pinned([])
    view = np.frombuffer(buffer, np.uint8)
    address, nbytes = view.ctypes.data, view.nbytes
    del view  # no export of the buffer outlives this call: its owner can still close it
    releases = []
    for pinner in pinners:
        try:
            release = pinner(address, nbytes)
        except Exception:  # noqa: BLE001 - a pin is an optimisation: the copies stage instead
            log.exception("host memory: pinning %d bytes failed", nbytes)
            continue
        if release is not None:
            releases.append(release)
    return Pinned(releases)


__all__ = ["Pinned", "Pinner", "pin", "register_pinner", "unregister_pinner"]
