"""The parts of a fleet (service.fleet): a Replica (one service and its session) and a prepared model
placed on one replica, moved to another when that one fails (prepared there again, from the cache by
token when it is there)."""
from __future__ import annotations

import logging
import threading
import weakref
from dataclasses import dataclass, field

import grpc
import numpy as np

from hal.model import Model
from service.client import Client, ExecutionOutput, RemotePreparedModel, ServiceError, ServiceUnavailableError
from service.fleet_burst import FleetBurst
from service.proto import nnhal_pb2 as pb

log = logging.getLogger("nnhal.fleet")


@dataclass(eq=False)
class Replica:
    """One service of the fleet."""

    address: str
    tls_host: str | None
    probe: grpc.Channel  # health checks (and stateless calls when no round_robin target covers the fleet)
    healthy: bool = False
    listed: bool = True  # False: its dns: name no longer resolves to it (no new models go there)
    why: str = "not checked yet"
    client: Client | None = None  # the session, opened when a prepared model is first placed here
    lock: threading.Lock = field(default_factory=threading.Lock)
    bursts: weakref.WeakSet = field(default_factory=weakref.WeakSet)  # FleetBursts open here

    def drop_session(self) -> None:
        """The replica stopped answering: end the session (a stopped service releases this client's
        models when it resumes) and the bursts' connections, so that calls waiting on it fail now
        and move instead of waiting out their bound."""
        with self.lock:
            client, self.client = self.client, None
        self._end(client)

    def drop_session_of(self, client: Client | None) -> None:
        """As drop_session, when ``client`` is still the session (a call on it failed)."""
        with self.lock:
            if self.client is client:
                self.client = None
        self._end(client)

    def _end(self, client: Client | None) -> None:
        for burst in list(self.bursts):
            burst.abort(self)
        if client is not None:
            client.close()


class FleetPreparedModel:
    """A prepared model on one replica of a FleetClient, moved to another when that one fails
    (RemotePreparedModel's interface: the delegate uses either). ``client``: the
    service.fleet.FleetClient that placed it (not imported: that module imports this one)."""

    def __init__(self, client, model: Model, token: bytes, options: dict):
        self.client = client
        self.model, self.token, self._options = model, token, options
        self.replica: Replica | None = None
        self.remote: RemotePreparedModel | None = None
        self.slowest_s = 0.0
        self._lock = threading.RLock()

    @property
    def id(self) -> str:
        return self.remote.id if self.remote is not None else ""

    def _place(self, exclude: tuple[Replica, ...], first: tuple[Replica, ...], from_cache: bool) -> None:
        """Prepare on the first replica that answers (``first``, then client.place()'s order).
        from_cache: prepareModelFromCache only (a miss is the caller's ServiceError); otherwise by
        token from the cache when there, else compiled (and stored under the token)."""
        tried: list[str] = []
        for r in first + tuple(self.client.place(exclude + first, rotate=not first)):
            session = None
            try:
                session = self.client.session(r)
                self.remote = self._prepare_on(session, from_cache)
                self.replica = r
                self.remote.observe(self.slowest_s)
                return
            except ServiceUnavailableError as e:
                self.client.lost(r, session)
                tried.append(f"{r.address}: {e.message}")
            except ServiceError as e:
                if from_cache:
                    self.client._last_miss = (self.token, r)
                raise e from None
        raise ServiceUnavailableError(f"no nnhal service of {self.client.address} could prepare the model ("
                                      + ("; ".join(tried) or "none is healthy") + ")")

    def _prepare_on(self, session: Client, from_cache: bool) -> RemotePreparedModel:
        if from_cache:
            return session.prepare_model_from_cache(self.model, self.token, **self._options)
        if self.token:
            try:
                return session.prepare_model_from_cache(self.model, self.token, **self._options)
            except ServiceError as e:
                if isinstance(e, ServiceUnavailableError):
                    raise
        return session.prepare_model(self.model, token=self.token, **self._options)

    def current(self) -> RemotePreparedModel:
        """The prepared model on a replica still holding its session: one whose session was
        dropped (health check failed, another model's call failed) is moved before it is used."""
        remote, r = self.remote, self.replica
        if remote is None or r is None or r.client is not remote.client:
            with self._lock:
                if self.remote is remote:
                    self._move(why="its replica's session ended")
            remote = self.remote
        return remote

    def _move(self, why: str, failed: RemotePreparedModel | None = None) -> None:
        old = self.replica
        if failed is not None and old is not None:
            self.client.lost(old, failed.client)
        log.info("moving a prepared model off %s (%s)", old.address if old else "nowhere", why)
        self.remote = None
        self._place(exclude=(old,) if old is not None else (), first=(), from_cache=False)
        self.client.failovers += 1

    def observe(self, seconds: float) -> None:
        self.slowest_s = max(self.slowest_s, seconds)
        if self.remote is not None:
            self.remote.observe(seconds)

    def wait_s(self, timeout_s: float | None, loop_timeout_s: float | None = None) -> float:
        return self.current().wait_s(timeout_s, loop_timeout_s)

    def execute(self, inputs: list[np.ndarray], outputs: list[np.ndarray] | None = None,
                **kw) -> ExecutionOutput:
        """RemotePreparedModel.execute on the model's replica; retried once on another replica when
        that one is unavailable (dead, disconnected, or silent past the client's bound)."""
        remote = self.current()
        try:
            return remote.execute(inputs, outputs, **kw)
        except ServiceUnavailableError as e:
            with self._lock:
                if self.remote is remote:
                    self._move(str(e), failed=remote)
            return self.current().execute(inputs, outputs, **kw)

    def burst(self) -> "FleetBurst":
        return FleetBurst(self, local=False)

    def local_burst(self, extra_slot_bytes: int = 0) -> "FleetBurst":
        return FleetBurst(self, local=True, extra_slot_bytes=extra_slot_bytes)

    def perf_info(self) -> pb.PerfInfoReply:
        return self.current().perf_info()

    def reset_perf_info(self) -> None:
        self.current().reset_perf_info()

    def release(self, timeout_s: float | None = None) -> None:
        """Release on the replica; nothing to do where its session ended (the service released it)."""
        with self._lock:
            remote, replica, self.remote, self.replica = self.remote, self.replica, None, None
        if remote is not None and replica is not None and replica.client is remote.client:
            remote.release(timeout_s)
