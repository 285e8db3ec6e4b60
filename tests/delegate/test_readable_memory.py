"""The delegate's check that a pointer TFLite hands it lies in readable memory (delegate.live_graph)."""
from __future__ import annotations

import ctypes as C
import mmap

import pytest

from delegate.live_graph import ReadableMemory


@pytest.fixture
def pages():
    """Three pages of one anonymous mapping, made read-write | read-only | inaccessible: /proc/self/maps
    lists them as three mappings (as it lists the heap, which a ``model_content`` buffer can
    straddle); yields the first page's address."""
    libc = C.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = [C.c_void_p, C.c_size_t, C.c_int]
    page = mmap.PAGESIZE
    m = mmap.mmap(-1, 3 * page)
    anchor = C.c_char.from_buffer(m)
    addr = C.addressof(anchor)
    assert libc.mprotect(addr + page, page, mmap.PROT_READ) == 0
    assert libc.mprotect(addr + 2 * page, page, 0) == 0
    yield addr
    assert libc.mprotect(addr, 3 * page, mmap.PROT_READ | mmap.PROT_WRITE) == 0
    del anchor
    m.close()


def test_a_range_across_adjacent_readable_mappings_is_readable(pages):
    page = mmap.PAGESIZE
    memory = ReadableMemory()
    assert memory.readable(pages + 100, page)  # read-write page into the read-only one
    assert memory.readable(pages + page, page)


def test_a_range_reaching_an_inaccessible_page_is_not(pages):
    page = mmap.PAGESIZE
    memory = ReadableMemory()
    assert not memory.readable(pages + 100, 2 * page)
    assert not memory.readable(pages + 2 * page, 1)
