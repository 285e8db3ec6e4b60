"""The driver's state behind the gRPC surface: prepared models, buffers, execution.

Everything here speaks hal types; ``service.servicer`` converts to and from proto.
"""
from __future__ import annotations

import functools
import hashlib
import json
import logging
import math
import mmap
import secrets
import threading
import uuid

import hal
from cache.store import NUM_DATA_FILES, NUM_MODEL_FILES, TOKEN_BYTES, CacheError, CacheKindError, CacheStore
from hal import backends
from hal.compiler import CompiledModel, compile_model
from hal.errors import HalError
from hal.model import Model
from hal.serialize import SerializationError, dump_compiled, load_compiled
from hal.support import support_reasons
from hal.types import (
    NUMPY_DTYPE,
    DeviceType,
    ErrorStatus,
    ExecutionPreference,
    OperandType,
    Priority,
    operation_name,
)
from service.execution import PreparedModel, check_deadline
from service.scheduler import Scheduler
from service.sessions import Session, Sessions, return_memory

VERSION = "nnhal-0.1.0"


def core_source_files() -> list:
    """hal's core sources (specs, compiler, serialisation, quantization math, the backend
    framework), not its backends: each cache entry names the backends it used with their own
    identity, so a kernel edit invalidates only the entries that ran through that backend."""
    import pathlib
    root = pathlib.Path(hal.__file__).parent
    files = []
    for p in sorted(root.rglob("*.py")):
        parts = p.relative_to(root).parts
        if parts[0] == "backends" and len(parts) > 2:
            continue  # a backend's own package: in its identity, not in the driver's (hal/backends/*.py
            # is the framework every backend runs in)
        files.append(p)
    return files


@functools.cache
def _source_digest() -> str:
    """Digest of hal's core sources (see core_source_files), read once: it names the code this
    process imported, which a later edit on disk does not change (a restarted service reads it again)."""
    import pathlib
    h = hashlib.sha256()
    root = pathlib.Path(hal.__file__).parent
    for p in core_source_files():
        h.update(p.relative_to(root).as_posix().encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:12]


def capabilities_fingerprint() -> str:
    """What a cache entry's compilation assumed: the supported operation matrix."""
    rows = [[int(spec.type), sorted(int(t) for t in types)] for spec, types in backends.support_matrix()]
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()


log = logging.getLogger("nnhal.service")


class Driver:
    """IDevice's state: prepared models by id, driver-allocated buffers by token, the cache."""

    def __init__(self, cache: CacheStore | None = None, backend_order: str | list[str] | None = None,
                 sessions: Sessions | None = None, scheduler: Scheduler | None = None) -> None:
        self.cache = cache
        #: Admission of every execution of every prepared model (None: no limit, in-process use).
        self.scheduler = scheduler
        #: Who owns what: every prepared model and buffer belongs to a client session.
        self.sessions = sessions or Sessions()
        #: Set when the service stops: open session streams end.
        self.sessions_closing = threading.Event()
        #: Called with a prepared model's id when it is released (its local bursts stop).
        self.release_hooks: list = []
        #: Backend preference for every compilation (``nnhal serve --backend``); raises on unknown names.
        self.backend_order = (backends.parse_preference(backend_order) if backend_order is not None
                              else backends.preference())
        self._lock = threading.Lock()
        self._prepared: dict[str, PreparedModel] = {}
        self._buffers: dict[int, mmap.mmap] = {}
        #: The session id owning each prepared model and buffer ("" for an in-process caller's).
        #: A gRPC caller names its session (``caller``) and reaches only what that session owns:
        #: another client's id or token is "unknown", as if it did not exist (issue 34).
        self._prepared_owner: dict[str, str] = {}
        self._buffer_owner: dict[int, str] = {}

    # ---- IDevice ------------------------------------------------------------
    @staticmethod
    def device_type() -> DeviceType:
        return DeviceType.CPU  # honest: the kernels run on this machine's CPU

    @staticmethod
    def version_string() -> str:
        return f"{VERSION}+{_source_digest()}"

    def cache_files_needed(self) -> tuple[int, int]:
        return (NUM_MODEL_FILES, NUM_DATA_FILES) if self.cache is not None else (0, 0)

    def supported_operations(self, model: Model) -> list[bool]:
        return [r is None for r in self.support_reasons(model)]

    def support_reasons(self, model: Model) -> list[str | None]:
        return support_reasons(model, self.backend_order)

    def prepare(self, model: Model, preference: int, priority: int, deadline_ns: int | None,
                token: bytes = b"", *, session: Session | None = None) -> PreparedModel:
        """Compile ``model``; the entry belongs to ``session`` (None: an in-process caller)."""
        pref = _enum(ExecutionPreference, preference, "execution preference")
        prio = _enum(Priority, priority, "priority")
        nbytes = footprint(model)
        if session is not None:
            self.sessions.charge(session, nbytes, "this model")
        check_deadline(deadline_ns, "before compilation")
        with backends.thread_limit(_threads_for(pref)):
            compiled = compile_model(model, copy_constants=False,  # the service owns model's buffers
                                     backend_order=self.backend_order)
        check_deadline(deadline_ns, "during compilation")
        if token and self.cache is not None:
            self._store(token, compiled)
        return self._register(session, compiled, pref, prio, nbytes)

    def prepare_from_cache(self, token: bytes, preference: int, priority: int,
                           deadline_ns: int | None, *, session: Session | None = None) -> PreparedModel:
        """Load a verified cache entry; any doubt is GENERAL_FAILURE (the client recompiles)."""
        pref = _enum(ExecutionPreference, preference, "execution preference")
        prio = _enum(Priority, priority, "priority")
        if self.cache is None:
            raise HalError(ErrorStatus.GENERAL_FAILURE, "compilation caching is disabled on this service")
        if len(token) != TOKEN_BYTES:
            raise HalError(ErrorStatus.INVALID_ARGUMENT, f"cache token must be {TOKEN_BYTES} bytes, got {len(token)}")
        check_deadline(deadline_ns, "before loading from cache")
        try:
            payload, arrays = self.cache.get(token)
            with backends.thread_limit(_threads_for(pref)):
                compiled = load_compiled(payload, arrays, self.backend_order)
        except CacheError as e:
            raise HalError(ErrorStatus.GENERAL_FAILURE, f"cache entry rejected: {e}") from None
        except OSError as e:  # the file system refused (EIO, EACCES...): a miss, not an internal error
            log.warning("cache entry %s unreadable: %s", token.hex()[:16], e.strerror or e)
            raise HalError(ErrorStatus.GENERAL_FAILURE, f"cache entry unreadable: {e.strerror or e}") from None
        except SerializationError as e:
            self.cache.remove(token)
            log.warning("cache entry %s rejected: %s", token.hex()[:16], e)
            raise HalError(ErrorStatus.GENERAL_FAILURE, f"cache entry rejected: {e}") from None
        check_deadline(deadline_ns, "while loading from cache")
        nbytes = footprint(compiled.model)
        if session is not None:
            self.sessions.charge(session, nbytes, "this model")
        return self._register(session, compiled, pref, prio, nbytes)

    # ---- the delegate's records (kept beside the compiled models) ---------------
    def delegation_record(self, key: bytes) -> bytes | None:
        """The verified record stored under ``key``; None when caching is off or there is none
        (a damaged or stale one is removed by the cache: a miss, the client delegates afresh)."""
        if self.cache is None:
            return None
        _check_record_key(key)
        try:
            payload, _ = self.cache.get(key, DELEGATION_RECORD)
        except CacheKindError as e:  # a compiled model's token: not this caller's to read or drop
            log.info("delegation record %s: %s", key.hex()[:16], e)
            return None
        except CacheError:  # no entry, or removed by the cache (logged there)
            return None
        except OSError as e:
            log.warning("delegation record %s unreadable: %s", key.hex()[:16], e.strerror or e)
            return None
        return payload

    def store_delegation_record(self, key: bytes, record: bytes) -> bool:
        """Keep ``record`` under ``key``; False when caching is off or the write failed (logged)."""
        if self.cache is None:
            return False
        _check_record_key(key)
        if len(record) > MAX_DELEGATION_RECORD_BYTES:
            raise HalError(ErrorStatus.INVALID_ARGUMENT, f"delegation record of {len(record)} bytes, more than "
                                                         f"{MAX_DELEGATION_RECORD_BYTES}")
        try:
            return self.cache.put(key, record, [], DELEGATION_RECORD)
        except (CacheError, OSError) as e:
            log.warning("delegation record write failed: %s", e)
            return False

    def _store(self, token: bytes, compiled: CompiledModel) -> None:
        try:
            payload, arrays = dump_compiled(compiled)
            self.cache.put(token, payload, arrays)
        except SerializationError as e:
            log.info("not cached: %s", e)
        except (CacheError, OSError) as e:
            log.warning("cache write failed: %s", e)
        except Exception:  # a bug in writing must not fail a compilation that succeeded
            log.exception("cache write failed unexpectedly; the model is prepared, not cached")

    def _register(self, session: Session | None, compiled: CompiledModel, pref: ExecutionPreference, prio: Priority,
                  nbytes: int) -> PreparedModel:
        entry = PreparedModel(uuid.uuid4().hex, compiled, pref, prio, self.scheduler)
        with self._lock:
            self._prepared[entry.id] = entry
            self._prepared_owner[entry.id] = session.id if session is not None else ""
        if session is not None and not self.sessions.record_prepared(session, entry.id, nbytes):
            self.release(entry.id)
            raise HalError(ErrorStatus.INVALID_ARGUMENT, "the client's session closed during preparation")
        return entry

    def get(self, prepared_id: str, caller: str | None = None) -> PreparedModel:
        """The prepared model ``prepared_id``; with ``caller`` (a gRPC caller's session id, "" for
        none) only if that session owns it. None: an in-process caller, who owns everything."""
        with self._lock:
            entry = self._prepared.get(prepared_id)
            if entry is not None and not _owns(caller, self._prepared_owner.get(prepared_id)):
                entry = None
        if entry is None:
            raise HalError(ErrorStatus.INVALID_ARGUMENT, f"unknown prepared model id {prepared_id!r}")
        return entry

    def release(self, prepared_id: str, caller: str | None = None) -> None:
        with self._lock:
            if prepared_id not in self._prepared or not _owns(caller, self._prepared_owner.get(prepared_id)):
                raise HalError(ErrorStatus.INVALID_ARGUMENT, f"unknown prepared model id {prepared_id!r}")
            del self._prepared[prepared_id]
            self._prepared_owner.pop(prepared_id, None)
        self.sessions.forget_prepared(prepared_id)
        self._released([prepared_id])

    def _released(self, prepared_ids: list[str]) -> None:
        for hook in self.release_hooks:
            for pid in prepared_ids:
                hook(pid)
        return_memory()

    def open_session(self, peer: str, uid: int | None = None) -> Session:
        return self.sessions.open(peer, uid)

    def close_session(self, session_id: str) -> None:
        """The client is gone (or said goodbye): drop everything it owned. Not while the service
        stops: its executions in flight finish, and everything goes with the process anyway."""
        if self.sessions_closing.is_set():
            return
        session = self.sessions.close(session_id)
        if session is None:
            return
        with self._lock:
            for pid in session.prepared:
                self._prepared.pop(pid, None)
                self._prepared_owner.pop(pid, None)
            for token in session.buffers:
                self._buffers.pop(token, None)  # in-flight executions keep their reference
                self._buffer_owner.pop(token, None)
        if session.prepared or session.buffers:  # a client that held nothing costs no heap trim
            log.info("client %s gone: released %d prepared model(s), %d buffer(s)", session.peer,
                     len(session.prepared), len(session.buffers))
            self._released(list(session.prepared))

    def allocate(self, operand_type: int, dimensions: tuple[int, ...], roles: list[tuple[str, int, bool]], *,
                 session: Session | None = None) -> int:
        """A driver-managed buffer usable as a request memory pool; roles are (model id, io index, is_input)."""
        try:
            t = OperandType(operand_type)
            dtype = NUMPY_DTYPE[t]
        except (ValueError, KeyError):
            raise HalError(ErrorStatus.INVALID_ARGUMENT, f"cannot allocate operand type {operand_type}") from None
        for model_id, io_index, is_input in roles:
            entry = self.get(model_id, session.id if session is not None else None)
            n = len(entry.compiled.input_indexes if is_input else entry.compiled.output_indexes)
            if io_index >= n:
                raise HalError(ErrorStatus.INVALID_ARGUMENT,
                               f"role {'input' if is_input else 'output'} {io_index} out of range ({n})")
        if not roles:
            raise HalError(ErrorStatus.INVALID_ARGUMENT, "allocate needs at least one role")
        if not dimensions or any(d == 0 for d in dimensions):
            raise HalError(ErrorStatus.INVALID_ARGUMENT, f"allocate needs full dimensions, got {list(dimensions)}")
        size = dtype.itemsize * math.prod(dimensions)
        if size > hal.validation.MAX_OPERAND_BYTES:
            raise HalError(ErrorStatus.RESOURCE_EXHAUSTED_PERSISTENT, f"buffer of {size} bytes is too large")
        if session is not None:
            self.sessions.charge(session, size, "this buffer")
        # Anonymous memory: zero pages are committed only when written (a bytearray commits at once).
        buf = mmap.mmap(-1, size)
        with self._lock:
            token = secrets.randbits(63) or 1  # unguessable: a token is a capability, like an id
            self._buffers[token] = buf
            self._buffer_owner[token] = session.id if session is not None else ""
        if session is not None and not self.sessions.record_buffer(session, token, size):
            self.release_buffer(token)
            raise HalError(ErrorStatus.INVALID_ARGUMENT, "the client's session closed during allocation")
        return token

    def release_buffer(self, token: int, caller: str | None = None) -> None:
        with self._lock:
            if token not in self._buffers or not _owns(caller, self._buffer_owner.get(token)):
                raise HalError(ErrorStatus.INVALID_ARGUMENT, f"unknown driver buffer {token}")
            del self._buffers[token]
            self._buffer_owner.pop(token, None)
        self.sessions.forget_buffer(token)

    def buffer(self, token: int, caller: str | None = None) -> mmap.mmap:
        """As ``get``, for a driver buffer."""
        with self._lock:
            buf = self._buffers.get(token)
            if buf is not None and not _owns(caller, self._buffer_owner.get(token)):
                buf = None
        if buf is None:
            raise HalError(ErrorStatus.INVALID_ARGUMENT, f"unknown driver buffer {token}")
        return buf


#: The cache entry kind of the delegate's records (cache.store: kinds never load as each other).
DELEGATION_RECORD = "delegation"
#: A record describes a graph's delegation (reasons, partitions' boundaries and tokens), not weights.
MAX_DELEGATION_RECORD_BYTES = 1 << 20


def _check_record_key(key: bytes) -> None:
    if len(key) != TOKEN_BYTES:
        raise HalError(ErrorStatus.INVALID_ARGUMENT, f"delegation record key must be {TOKEN_BYTES} bytes, "
                                                     f"got {len(key)}")


def _owns(caller: str | None, owner: str | None) -> bool:
    """Whether ``caller`` (a session id; None: in-process) may use what ``owner`` owns. A gRPC
    caller without a session ("") owns nothing, not even what in-process callers made."""
    return caller is None or (bool(caller) and caller == owner)


def footprint(model: Model) -> int:
    """What a prepared model is charged to its client: an estimate of 3x its weights (the model's
    copy, the kernels' prepared copies, a graph backend's own) plus 1 MiB of working memory."""
    weights = len(model.operand_values) + sum(len(p) for p in model.pools)
    return 3 * weights + (1 << 20)


def _threads_for(pref: ExecutionPreference) -> int | None:
    """LOW_POWER: one intra-op thread for the model's partitions (the other preferences get
    ``nnhal serve --threads``)."""
    return 1 if pref == ExecutionPreference.LOW_POWER else None


def _enum(cls, value: int, what: str):
    try:
        return cls(value)
    except ValueError:
        raise HalError(ErrorStatus.INVALID_ARGUMENT, f"unknown {what} {value}") from None


def perf_name(type_code: int, count: int = 1) -> str:
    """An operation's name, ``PARTITION(n ops)`` for a graph backend's partition (type -1), or the
    first operation's name and how many follow it for a fused step (hal.fusion: its first's type)."""
    if type_code == -1:
        return f"PARTITION({count} ops)"
    return operation_name(type_code) if count <= 1 else f"{operation_name(type_code)} (+{count - 1} fused)"


__all__ = ["Driver", "footprint", "perf_name"]
