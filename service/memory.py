"""Memory pools shared between client and service (NNAPI's memory pools).

Clients create POSIX shared-memory segments (``multiprocessing.shared_memory``)
and send their names. The service never maps them: a client can shrink its
segment at any moment (ftruncate), and a mapped page past the new end faults
the whole service with SIGBUS. So the service opens the segment and moves bytes
with ``pread``/``pwrite`` on the descriptor, which return short or grow the
file instead of faulting: one copy per tensor, and no client can take the
service down through its memory. (The local-burst path, where copies would
matter, uses a memfd the service creates and seals against shrinking:
``service.local_burst_server``.)

Naming a file is a capability only a client of the same user on the same machine may use: the
service opens /dev/shm/<name> with its own rights, so a name is as good as a path. The servicer
accepts shared-memory pools only on its unix socket (whose 0700 directory admits only the
service's user: SECURITY.md), never over TCP, and a segment must look like one an nnhal client
made (``check_segment``): the ``nnhal-`` prefix, a regular file with one link, owned by the
service's user, mode 0600 or narrower. Anything else in /dev/shm (another program's segment, a
file shared with the group) is refused even to a same-user client: it was not made to be handed
to the service.
"""
from __future__ import annotations

import os
import re
import stat

from hal.errors import HalError
from hal.types import ErrorStatus

_NAME = re.compile(r"^/?[A-Za-z0-9_.\-]{1,200}$")
#: The prefix of every segment an nnhal client creates (service.transfer, the fuzzers).
PREFIX = "nnhal-"
SHM_DIR = "/dev/shm"


def _invalid(message: str) -> HalError:
    return HalError(ErrorStatus.INVALID_ARGUMENT, message)


def check_segment(st: os.stat_result) -> str | None:
    """Why a segment (its fstat) is not one a same-user client made for the service; None if it is."""
    if not stat.S_ISREG(st.st_mode):
        return "is not a memory segment"
    if st.st_uid != os.geteuid():
        return f"is owned by uid {st.st_uid}, not by the service's user"
    if st.st_mode & 0o077:
        return f"is readable or writable by others (mode {st.st_mode & 0o7777:o}); a client's segment is 0600"
    if st.st_nlink != 1:
        return f"has {st.st_nlink} links (a segment has exactly one)"
    return None


class ClientPool:
    """A client's shared-memory segment, opened (not mapped) by the service.

    ``size`` is what the client claims; it is checked against the segment when
    opened, and every read checks it again (the segment may shrink later)."""

    def __init__(self, name: str, size: int):
        self.fd = -1
        if not _NAME.match(name or ""):
            raise _invalid(f"invalid shared memory name {name!r}")
        if size <= 0:
            raise _invalid(f"shared memory {name!r}: size must be > 0")
        self.name = name.lstrip("/")
        if not self.name.startswith(PREFIX):
            raise _invalid(f"shared memory {name!r}: only segments named {PREFIX}* (made by an nnhal client) "
                           f"are accepted")
        try:  # O_NOFOLLOW/O_NONBLOCK: never follow a link, never block on a FIFO someone put there
            self.fd = os.open(os.path.join(SHM_DIR, self.name),
                              os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            raise _invalid(f"shared memory {name!r} does not exist") from None
        except OSError as e:
            raise _invalid(f"cannot open shared memory {name!r}: {e.strerror}") from None
        st = os.fstat(self.fd)
        why = check_segment(st)
        if why:
            self.close()
            raise _invalid(f"shared memory {name!r} {why}")
        if st.st_size < size:
            self.close()
            raise _invalid(f"shared memory {name!r} has {st.st_size} bytes, the client claims {size}")
        self.size = size

    def check_range(self, offset: int, length: int, what: str) -> None:
        if offset < 0 or length < 0 or offset + length > self.size:
            raise _invalid(f"{what}: bytes [{offset}, {offset + length}) are outside shared memory "
                           f"{self.name!r} of {self.size} bytes")

    def read(self, offset: int, length: int, what: str = "read") -> bytes:
        """A private copy of [offset, offset + length); INVALID_ARGUMENT if the segment shrank."""
        self.check_range(offset, length, what)
        chunks, done = [], 0
        while done < length:  # one pread moves at most ~2 GiB
            chunk = os.pread(self.fd, min(length - done, 1 << 30), offset + done)
            if not chunk:
                raise _invalid(f"{what}: shared memory {self.name!r} shrank to {offset + done} bytes "
                               f"while being read (< {offset + length})")
            chunks.append(chunk)
            done += len(chunk)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)  # b"" for length 0

    def write(self, offset: int, data, what: str = "write") -> None:
        """Copy ``data`` to [offset, ...). A segment that shrank is refused, not regrown."""
        view = memoryview(data).cast("B")
        self.check_range(offset, len(view), what)
        if os.fstat(self.fd).st_size < offset + len(view):
            raise _invalid(f"{what}: shared memory {self.name!r} shrank below {offset + len(view)} bytes")
        done = 0
        while done < len(view):
            done += os.pwrite(self.fd, view[done:], offset + done)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
