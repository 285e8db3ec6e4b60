"""Token-keyed compilation cache that never trusts its files.

An entry is two files named by the token: ``<hex>.model`` (header, JSON
payload, HMAC) and ``<hex>.data`` (raw arrays, 64-byte aligned). See
FORMAT.md. Writes are atomic (temp file, fsync, read-only mode, rename,
fsync of the directory); a reader verifies magic, format version, driver
version, capabilities fingerprint, token, lengths, the SHA-256 of the payload, the
BLAKE3 digest of the data file and an HMAC-SHA256 keyed by a per-cache secret
before anything is used. The data file is memory-mapped, not copied: it is
checked to be a read-only regular file of ours first, and its digest is
verified on the mapping (BLAKE3's tree mode hashes it on every core), once per
file: a data file this store verified is not hashed again while its status
(device, inode, size, modification and change times) is unchanged (see
_Verified). A bad entry is removed and reported, never loaded. Storage only:
payloads are opaque bytes plus numpy arrays.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import logging
import mmap
import os
import re
import shutil
import stat
import struct
import threading
import time
from dataclasses import dataclass

import numpy as np

from cache.files import (
    AtomicFile,
    CacheError,
    CacheKeyError,
    digest,
    file_digest,
    is_ours,
    load_or_create_key,
    locked_directory,
    open_regular,
    read_file,
    touch,
    unlink,
)

log = logging.getLogger("nnhal.cache")

MAGIC = b"NNHALCM\0"
FORMAT_VERSION = 2
TOKEN_BYTES = 32
ALIGN = 64
KEY_FILE = "cache.key"
_PREFIX = struct.Struct("<8sII")  # magic, format version, header length
MAX_HEADER = 1 << 20
NUM_MODEL_FILES = 1
NUM_DATA_FILES = 1
_ENTRY_NAME = re.compile(r"([0-9a-f]{64})\.model")
_TMP_NAME = re.compile(r"\.tmp-(key-)?[a-z0-9_]{8}")  # tempfile.mkstemp's names, ours only in our directory
#: What an entry holds, named in its header: a caller's kind never loads as another's (an entry
#: written before kinds existed holds a compiled model).
COMPILED = "compiled"


@dataclass(frozen=True)
class EntryInfo:
    token_hex: str
    model_bytes: int
    data_bytes: int
    last_used: float


class CacheKindError(CacheError):
    """The entry holds another kind than the one asked for: a miss for this caller, and the
    entry stays (it is sound, and is another caller's)."""


class CacheStore:
    def __init__(self, directory: str, *, driver_version: str, capabilities_fingerprint: str,
                 max_bytes: int | None = None, repair_key: bool = False, create: bool = True):
        """``repair_key``: a corrupt or untrusted ``cache.key`` is moved aside and replaced (the
        service does this: the key was already useless); otherwise it is a CacheKeyError.
        ``create``: make the directory and its key when missing (the service). False (`nnhal
        cache`, which inspects): an existing directory only, nothing created — a mistyped path
        must not become an empty cache; without a key, ``key`` is None and get() a CacheKeyError."""
        if max_bytes is not None and max_bytes < 0:
            raise ValueError(f"cache max_bytes must be >= 0, not {max_bytes}")
        self.dir = os.path.abspath(directory)
        if create:
            try:
                os.makedirs(self.dir, mode=0o700, exist_ok=True)
            except OSError as e:
                raise CacheError(f"cannot use cache directory {self.dir}: {e.strerror}") from None
        elif not os.path.isdir(self.dir):
            raise CacheError(f"{self.dir} is not a directory" if os.path.exists(self.dir)
                             else f"cache directory {self.dir} does not exist")
        self.driver_version = driver_version
        self.fingerprint = capabilities_fingerprint
        self.max_bytes = max_bytes
        self.key_path = os.path.join(self.dir, KEY_FILE)
        self.key = load_or_create_key(self.key_path, repair=repair_key) \
            if create or os.path.lexists(self.key_path) else None
        self._lock = threading.Lock()
        self._verified = _Verified()

    # ---- paths --------------------------------------------------------------
    def _paths(self, token: bytes) -> tuple[str, str]:
        if not isinstance(token, (bytes, bytearray)) or len(token) != TOKEN_BYTES:
            raise CacheError(f"token must be {TOKEN_BYTES} bytes")
        h = token.hex()
        return os.path.join(self.dir, h + ".model"), os.path.join(self.dir, h + ".data")

    # ---- write ----------------------------------------------------------------
    def put(self, token: bytes, payload: bytes, arrays: list[np.ndarray], kind: str = COMPILED) -> bool:
        """Store an entry atomically; False (logged) if it alone is larger than ``max_bytes``:
        storing it would only evict every other entry, then itself. Concurrent writers of one
        token: the last rename wins, and each model file names the data digest it was written
        with, so a mixed pair is rejected."""
        model_path, data_path = self._paths(token)
        for path in (model_path, data_path):
            _clear_wrong_type(path)  # a rename cannot replace a directory: it would block the entry forever
        layout, offset = [], 0
        for a in arrays:
            a = np.asarray(a, order="C")
            layout.append({"offset": offset, "nbytes": a.nbytes, "dtype": a.dtype.str, "shape": list(a.shape)})
            offset += (a.nbytes + ALIGN - 1) // ALIGN * ALIGN
        if self.max_bytes is not None:
            data_len = layout[-1]["offset"] + layout[-1]["nbytes"] if layout else 0
            size = data_len + len(self._model_body(token, payload, data_len, "0" * 64, layout, kind)) + 32
            if size > self.max_bytes:
                log.warning("cache entry %s not stored: %d bytes, larger than the cache (max %d bytes)",
                            token.hex()[:16], size, self.max_bytes)
                return False
        # The pair is published under the directory's lock, which eviction takes too: another process
        # sharing the directory never removes one file of the pair between the two renames (that
        # would leave a model file without its data file). Loads take no lock.
        with locked_directory(self.dir):
            with AtomicFile(data_path) as f:
                pos = 0
                for a, entry in zip(arrays, layout):
                    pad = entry["offset"] - pos
                    if pad:
                        f.write(b"\0" * pad)
                    f.write(memoryview(np.asarray(a, order="C").reshape(-1)).cast("B"))  # 1-D: empty arrays too
                    pos = entry["offset"] + entry["nbytes"]
                data_len = pos
                f.flush()
                data_digest = file_digest(f.fileno(), data_len)
            body = self._model_body(token, payload, data_len, data_digest, layout, kind)
            with AtomicFile(model_path) as f:
                f.write(body)
                f.write(hmac.new(self.key, body, hashlib.sha256).digest())
        self.evict(keep=token.hex())  # takes the lock itself (a second flock in one process would wait on the first)
        return True

    def _model_body(self, token: bytes, payload: bytes, data_len: int, data_digest: str, layout: list,
                    kind: str) -> bytes:
        """The model file without its HMAC (its size does not depend on the digest's value)."""
        header = json.dumps({
            "driver_version": self.driver_version, "capabilities": self.fingerprint, "token": token.hex(),
            "kind": kind,
            "payload_length": len(payload), "payload_sha256": hashlib.sha256(payload).hexdigest(),
            "data_length": data_len, "data_blake3": data_digest,
            "arrays": layout,
        }, separators=(",", ":")).encode()
        return _PREFIX.pack(MAGIC, FORMAT_VERSION, len(header)) + header + payload

    # ---- read ---------------------------------------------------------------
    def get(self, token: bytes, kind: str | None = COMPILED) -> tuple[bytes, list[np.ndarray]]:
        """Verified (payload, arrays) of an entry of ``kind`` (None: any), or CacheError after
        removing the entry (CacheKindError: a sound entry of another kind, left in place).

        The model file is read once into private memory and verified there. The data file is
        opened once, checked to be a read-only regular file of ours and mapped; its digest is
        verified on that mapping, which keeps the opened inode: a file renamed over it during or
        after the load changes nothing we use. The arrays are read-only views of the mapping."""
        model_path, data_path = self._paths(token)
        if not os.path.exists(model_path):
            raise CacheError("no cache entry for this token")
        if self.key is None:  # not the entry's fault: it stays
            raise CacheKeyError(f"cache key {self.key_path} is missing: no entry can be authenticated")
        try:
            payload, header = self._read_model(model_path, token)
            if kind is not None and header.get("kind", COMPILED) != kind:
                raise CacheKindError(f"the entry holds a {header.get('kind', COMPILED)!r}, not a {kind!r}")
            data = _map_data(data_path, header, self._verified)
            arrays = []
            for a in header["arrays"]:
                off, n = int(a["offset"]), int(a["nbytes"])
                dtype = np.dtype(a["dtype"])
                if off < 0 or n < 0 or off + n > len(data) or dtype.hasobject or off % ALIGN:
                    raise CacheError(f"array descriptor out of range: {a}")
                arr = np.frombuffer(data, dtype=dtype, count=n // dtype.itemsize, offset=off)
                arrays.append(arr.reshape(a["shape"]))
        except FileNotFoundError:
            raise CacheError("no cache entry for this token (removed meanwhile)") from None
        except CacheKindError:
            raise
        except CacheError as e:
            if isinstance(e, _DataFileMissing) and not os.path.exists(model_path):
                # Evicted by another process (one that shares the directory) between the two
                # files: a miss. Not a rejection: removing now could delete an entry just rewritten.
                raise CacheError("no cache entry for this token (removed meanwhile)") from None
            log.warning("cache entry %s rejected: %s", token.hex()[:16], e)
            self.remove(token)
            raise
        except (ValueError, KeyError, TypeError, OSError) as e:
            log.warning("cache entry %s rejected: %r", token.hex()[:16], e)
            self.remove(token)
            raise CacheError(f"malformed cache entry: {e!r}") from None
        touch(model_path)
        return payload, arrays

    def _read_model(self, path: str, token: bytes) -> tuple[bytes, dict]:
        raw = read_file(path, MAX_HEADER * 64)
        if len(raw) < _PREFIX.size + 32:
            raise CacheError("model file truncated")
        body, mac = raw[:-32], raw[-32:]
        magic, version, hlen = _PREFIX.unpack_from(body)
        if magic != MAGIC:
            raise CacheError("bad magic")
        if version != FORMAT_VERSION:
            raise CacheError(f"format version {version} != {FORMAT_VERSION}")
        if not hmac.compare_digest(hmac.new(self.key, body, hashlib.sha256).digest(), mac):
            raise CacheError("HMAC mismatch (tampered, or written with another key)")
        if hlen > MAX_HEADER or _PREFIX.size + hlen > len(body):
            raise CacheError("header length out of range")
        header = json.loads(body[_PREFIX.size:_PREFIX.size + hlen])
        payload = body[_PREFIX.size + hlen:]
        if header.get("driver_version") != self.driver_version:
            raise CacheError(f"written by driver {header.get('driver_version')!r}, this is {self.driver_version!r}")
        if header.get("capabilities") != self.fingerprint:
            raise CacheError("capabilities fingerprint differs")
        if header.get("token") != token.hex():
            raise CacheError("token inside the file differs from the requested token")
        if header.get("payload_length") != len(payload):
            raise CacheError("payload length mismatch")
        if not hmac.compare_digest(hashlib.sha256(payload).hexdigest(), header.get("payload_sha256", "")):
            raise CacheError("payload checksum mismatch")
        return payload, header

    # ---- maintenance ----------------------------------------------------------
    def remove(self, token: bytes) -> None:
        """Drop an entry's files, whatever they are (a directory where a file belongs included);
        what cannot be removed is logged, never raised: a rejected entry is a miss either way."""
        for p in self._paths(token):
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass
            except IsADirectoryError:
                _clear_wrong_type(p)
            except OSError as e:
                log.warning("cannot remove %s: %s", p, e.strerror or e)

    def entries(self) -> list[EntryInfo]:
        """The entries nnhal wrote (see clear): eviction, ls and verify never touch other files."""
        out = []
        for name in os.listdir(self.dir):
            m = _ENTRY_NAME.fullmatch(name)
            if m is None:
                continue
            h = m.group(1)
            mp, dp = os.path.join(self.dir, name), os.path.join(self.dir, h + ".data")
            if _not_our_model(mp, h):
                continue
            try:
                st = os.stat(mp)
                dsize = os.stat(dp).st_size if os.path.exists(dp) else 0
            except FileNotFoundError:
                continue
            out.append(EntryInfo(h, st.st_size, dsize, st.st_mtime))
        return sorted(out, key=lambda e: e.last_used)

    def total_bytes(self) -> int:
        return sum(e.model_bytes + e.data_bytes for e in self.entries())

    def evict(self, keep: str | None = None) -> list[str]:
        """Drop least-recently-used entries (never ``keep``, the one just written) until the cache
        fits max_bytes."""
        if self.max_bytes is None:
            return []
        removed = []
        with self._lock, locked_directory(self.dir):  # not between another process's two renames (put)
            entries = self.entries()
            total = sum(e.model_bytes + e.data_bytes for e in entries)
            for e in entries:
                if total <= self.max_bytes:
                    break
                if e.token_hex == keep:
                    continue
                self.remove(bytes.fromhex(e.token_hex))
                total -= e.model_bytes + e.data_bytes
                removed.append(e.token_hex)
        return removed

    def verify(self, token: bytes) -> str | None:
        """None if the entry verifies, else the reason (the entry is then removed)."""
        try:
            self.get(token, kind=None)
            return None
        except CacheError as e:
            return str(e)

    def clear(self) -> tuple[int, list[tuple[str, str]]]:
        """Remove every entry this cache can identify as its own; (files removed, [(name, why
        kept)]). A folder given as --cache-dir may hold anyone's files: an entry is ours when its
        model file is a regular file of ours named ``<64 hex>.model`` with nnhal's magic and a
        header naming that token (not its HMAC: entries of a lost key are ours too); its data
        file goes with it. ``cache.key`` stays. A file that cannot be removed (a read-only
        directory) is a CacheError naming it and why."""
        removed, skipped, taken = 0, [], {KEY_FILE}
        names = sorted(os.listdir(self.dir))
        for name in names:
            m = _ENTRY_NAME.fullmatch(name)
            if m is None:
                continue
            taken.add(name)
            why = _not_our_model(os.path.join(self.dir, name), m.group(1))
            if why:
                skipped.append((name, why))
                continue
            data = m.group(1) + ".data"
            taken.add(data)
            removed += unlink(os.path.join(self.dir, name))
            if data in names:
                if is_ours(os.path.join(self.dir, data)):
                    removed += unlink(os.path.join(self.dir, data))
                else:
                    skipped.append((data, "not a regular file of this user"))
        for name in names:
            if name in taken:
                continue
            path = os.path.join(self.dir, name)
            if _TMP_NAME.fullmatch(name) and is_ours(path):
                removed += unlink(path)  # a temp file of an interrupted write
            elif name.endswith(".data") and _ENTRY_NAME.fullmatch(name[:-5] + ".model"):
                skipped.append((name, "no nnhal model file names it"))
            elif name.startswith(KEY_FILE + ".bad-"):
                skipped.append((name, "a bad cache key moved aside by nnhal serve, kept for inspection"))
            else:
                skipped.append((name, "not an nnhal cache file"))
        return removed, skipped


def _not_our_model(path: str, token_hex: str) -> str | None:
    """None if ``path`` is a model file nnhal wrote for ``token_hex``, else why not."""
    try:
        fd, st = open_regular(path, "model file")
    except FileNotFoundError:
        return "removed meanwhile"
    except CacheError as e:
        return str(e)
    with os.fdopen(fd, "rb") as f:
        if st.st_uid != os.geteuid():
            return f"owned by uid {st.st_uid}"
        prefix = f.read(_PREFIX.size)
        magic, _, hlen = _PREFIX.unpack(prefix) if len(prefix) == _PREFIX.size else (b"", 0, 0)
        try:
            header = json.loads(f.read(hlen)) if magic == MAGIC and hlen <= MAX_HEADER else None
        except ValueError:
            header = None
    if header is None:
        return "no nnhal cache header"
    if not isinstance(header, dict) or header.get("token") != token_hex:
        return "its header does not name this token"
    return None


def _clear_wrong_type(path: str) -> None:
    """Remove a directory standing where an entry's file belongs (nnhal never makes one there):
    os.replace cannot rename a file over it, so the entry could never be written again. rmtree
    does not follow symbolic links. Logged, never raised."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        return  # a file, link, FIFO...: os.replace and unlink handle those
    log.info("cache: removing the directory %s, where an entry's file belongs", path)
    try:
        shutil.rmtree(path)
    except OSError as e:
        log.warning("cache: cannot remove %s: %s", path, e.strerror or e)


class _DataFileMissing(CacheError):
    """The model file named a data file that is not there."""


class _Verified:
    """The data files this store hashed, by status: (device, inode, size, mtime, ctime) -> digest.

    Changing a file's bytes (write, truncate, or the chmod an 0400 file needs first) sets its
    change time to the kernel's clock, and a file put in its place is another inode or, reusing
    one, changes it too: a file whose status is as it was when it verified has the bytes it had.
    The kernel stamps with a coarse clock (a tick of a few ms), so a change within one tick of the
    previous one could keep the time: a file is remembered only if its last change was at least
    SETTLED_NS before the status was read."""

    SETTLED_NS = 100_000_000
    LIMIT = 1024  # files remembered (the oldest forgotten first)

    def __init__(self) -> None:
        self._digests: dict[tuple, str] = {}
        self._lock = threading.Lock()

    @staticmethod
    def status(st: os.stat_result) -> tuple:
        return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns

    def known(self, st: os.stat_result, want: str) -> bool:
        with self._lock:
            got = self._digests.get(self.status(st))
        return got is not None and hmac.compare_digest(got, want)

    def remember(self, st: os.stat_result, read_at_ns: int, verified: str) -> None:
        if read_at_ns - st.st_ctime_ns < self.SETTLED_NS:
            return
        with self._lock:
            self._digests[self.status(st)] = verified
            while len(self._digests) > self.LIMIT:
                del self._digests[next(iter(self._digests))]


def _map_data(path: str, header: dict, verified: _Verified):
    """Open, check and map the data file; verify its digest on the mapping (unless ``verified``
    hashed this very file before)."""
    length, want = header["data_length"], header["data_blake3"]
    if not isinstance(length, int) or length < 0 or not isinstance(want, str):
        raise CacheError("data description in the header is malformed")
    read_at_ns = time.time_ns()  # before the status: a change after it has a later change time
    try:
        fd, st = open_regular(path, "data file")
    except FileNotFoundError:
        raise _DataFileMissing("data file missing (wrong number of cache files)") from None
    try:
        if st.st_uid != os.geteuid() or st.st_mode & 0o222:
            raise CacheError(f"data file must be read-only and ours to be mapped (mode {st.st_mode & 0o777:o}, "
                             f"uid {st.st_uid})")
        if st.st_size != length:
            raise CacheError(f"data file has {st.st_size} bytes, header says {length}")
        if length == 0:
            data = b""
        else:
            data = mmap.mmap(fd, length, access=mmap.ACCESS_READ)
    finally:
        os.close(fd)
    if verified.known(st, want):
        return data
    if not hmac.compare_digest(digest(data), want):
        raise CacheError("data file checksum mismatch")
    verified.remember(st, read_at_ns, want)
    return data
