"""Where tensors go in a block of shared memory: one 64-byte-aligned slot each, in order.

The client's scratch pool (``service.transfer``) and the shared-memory burst's data area
(``service.local_burst_client`` / ``service.local_burst_server``) lay their tensors out this way.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

#: Every slot starts on a cache line (and on any dtype's alignment).
ALIGN = 64


def slot_bytes(nbytes: int) -> int:
    """A tensor of ``nbytes`` takes this many bytes of the block (its slot, rounded up to ALIGN)."""
    return (nbytes + ALIGN - 1) // ALIGN * ALIGN


@dataclass(frozen=True)
class SlotLayout:
    """The offset of each tensor's slot; None for a tensor given no slot (its size was None)."""

    offsets: tuple[int | None, ...]
    sizes: tuple[int | None, ...]
    #: Bytes the slots take in all.
    total: int

    @classmethod
    def of(cls, sizes: Iterable[int | None]) -> "SlotLayout":
        sizes = tuple(sizes)
        offsets, end = [], 0
        for n in sizes:
            offsets.append(None if n is None else end)
            end += 0 if n is None else slot_bytes(n)
        return cls(tuple(offsets), sizes, end)


__all__ = ["ALIGN", "SlotLayout", "slot_bytes"]
