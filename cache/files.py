"""The compilation cache's file primitives: descriptors that refuse what is not a regular file of
ours, atomic writes, digests, and the per-cache HMAC key. Storage mechanics only; the entry
format and its checks are cache.store's."""
from __future__ import annotations

import contextlib
import fcntl
import logging
import mmap
import os
import secrets
import stat
import tempfile
import time

import blake3

log = logging.getLogger("nnhal.cache")

ENTRY_MODE = 0o400  # entries are never modified in place; a mapped data file must stay read-only


class CacheError(Exception):
    """Why an entry was rejected (the entry has been removed), or why the cache cannot be used."""


class CacheKeyError(CacheError):
    """The cache key is missing, corrupt or not trustworthy: no entry can be authenticated."""


def is_ours(path: str) -> bool:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid()


def unlink(path: str) -> int:
    """1 if ``path`` was removed, 0 if it was gone already; CacheError (one line) if it cannot be
    removed (a read-only directory or file system, an immutable file)."""
    try:
        os.unlink(path)
        return 1
    except FileNotFoundError:
        return 0
    except OSError as e:
        raise CacheError(f"cannot remove {os.path.basename(path)} from {os.path.dirname(path)}: "
                         f"{e.strerror or e}") from None


def digest(buf) -> str:
    """BLAKE3 of a buffer, on every core: it bounds how fast a verified entry can load."""
    return blake3.blake3(buf, max_threads=blake3.blake3.AUTO).hexdigest()


def file_digest(fd: int, length: int) -> str:
    """Digest of the first ``length`` bytes of a just-written file (read back from the page cache)."""
    if length == 0:
        return digest(b"")
    with mmap.mmap(fd, length, access=mmap.ACCESS_READ) as m:
        return digest(m)


def open_regular(path: str, what: str) -> tuple[int, os.stat_result]:
    """A descriptor on ``path`` that is a regular file, and its fstat. O_NONBLOCK: a FIFO or device
    planted under an entry's name must be refused, not waited on; O_NOFOLLOW: a symlink is not ours."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise
    except OSError as e:
        raise CacheError(f"{what} cannot be opened: {e.strerror}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise CacheError(f"{what} is not a regular file")
    return fd, st


def read_file(path: str, limit: int) -> bytes:
    fd, st = open_regular(path, os.path.basename(path))
    with os.fdopen(fd, "rb") as f:
        size = st.st_size
        if size > limit:
            raise CacheError(f"{os.path.basename(path)} is larger than allowed ({size} bytes)")
        raw = f.read(size + 1)  # a file that grew since fstat is caught by the length checks
    if len(raw) > limit:
        raise CacheError(f"{os.path.basename(path)} is larger than allowed")
    return raw


def touch(path: str) -> None:
    try:
        os.utime(path)  # last-used time for LRU eviction
    except OSError:
        pass


class AtomicFile:
    """Write to a temp file in the same directory; fsync; rename over the target; fsync the dir."""

    def __init__(self, path: str):
        self.path = path

    def __enter__(self):
        d = os.path.dirname(self.path)
        fd, self.tmp = tempfile.mkstemp(prefix=".tmp-", dir=d)
        self.f = os.fdopen(fd, "wb")
        return self.f

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if exc_type is None:
                self.f.flush()
                os.fsync(self.f.fileno())
                os.fchmod(self.f.fileno(), ENTRY_MODE)
            self.f.close()
            if exc_type is None:
                os.replace(self.tmp, self.path)
                dfd = os.open(os.path.dirname(self.path), os.O_RDONLY)
                try:
                    os.fsync(dfd)
                finally:
                    os.close(dfd)
        finally:
            if os.path.exists(self.tmp):
                os.unlink(self.tmp)


def load_or_create_key(path: str, repair: bool = False) -> bytes:
    """The per-cache HMAC key. With ``repair``, a bad key is renamed ``cache.key.bad-<time>-<pid>``
    (kept, never deleted) and a new one made: entries of the old key then fail their HMAC and are
    recompiled one by one. Under a lock on the directory, so concurrent services repair once."""
    if not os.path.lexists(path):
        _create_key(path)
    try:
        return _read_key(path)
    except CacheKeyError:
        if not repair:
            raise
    with locked_directory(os.path.dirname(path)):
        try:
            return _read_key(path)  # another process repaired it meanwhile
        except CacheKeyError as e:
            reason = str(e)
        aside = f"{path}.bad-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
        try:
            os.rename(path, aside)
        except FileNotFoundError:
            aside = "(it vanished)"
        except OSError as e:
            raise CacheKeyError(f"{reason}, and it cannot be moved aside: {e.strerror}") from None
        _create_key(path)
        key = _read_key(path)
    log.warning("%s: moved to %s, a new key was made; entries written with the old key will be recompiled",
                reason, aside)
    return key


def _create_key(path: str) -> None:
    """32 random bytes in a 0600 file, published atomically (a temp file hard-linked into place),
    so concurrent first users agree on one complete key."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=".tmp-key-", dir=os.path.dirname(path))  # mode 0600
    except OSError as e:
        raise CacheKeyError(f"cache key {path} cannot be created: {e.strerror}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(secrets.token_bytes(32))
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass  # another process published its key first: use that one
    finally:
        os.unlink(tmp)


def _read_key(path: str) -> bytes:
    """The key, if it is exactly 32 bytes in a regular file of ours that nobody else can read:
    anyone who knows it can forge entries."""
    try:
        fd, st = open_regular(path, f"cache key {path}")
    except FileNotFoundError:
        raise CacheKeyError(f"cache key {path} is missing") from None
    except CacheError as e:
        raise CacheKeyError(str(e)) from None
    with os.fdopen(fd, "rb") as f:
        if st.st_uid != os.geteuid():
            raise CacheKeyError(f"cache key {path} is owned by uid {st.st_uid}, not by this user")
        if st.st_mode & 0o077:
            raise CacheKeyError(f"cache key {path} is open to other users (mode {st.st_mode & 0o777:o})")
        key = f.read(33)
    if len(key) != 32:
        raise CacheKeyError(f"cache key {path} is corrupt ({len(key)} bytes, not 32)")
    return key


@contextlib.contextmanager
def locked_directory(directory: str):
    """An exclusive flock on the directory itself, between processes: no lock file to leave behind."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
