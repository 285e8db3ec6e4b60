"""One client over several nnhal services (replicas): a list of addresses or a ``dns:`` name.

    client = FleetClient.connect("unix:/run/a.sock,unix:/run/b.sock")   # or "h1:50051,h2:50051",
    pm = client.prepare_model_from_cache(model, token)                  # or "dns:///nnhal:50051"
    pm.execute([x]);  with pm.local_burst() as b: b.execute([x])        # as service.client's

Why not one gRPC channel with ``round_robin`` for everything: a prepared model, its bursts and its
buffers live in one service's session, so a call about them must reach that service. So:

- Stateless calls (capabilities, support queries, version) go through one channel over every
  replica with gRPC's own ``round_robin`` policy and health checking (service config), when the
  replicas fit one gRPC target (a ``dns:`` name, unix sockets, IP literals of one family without
  TLS); otherwise to a healthy replica's probe channel.
- Each replica has a probe channel that a thread health-checks (``grpc.health.v1``) every
  HEALTH_INTERVAL_S; a ``dns:`` name is resolved again every RESOLVE_INTERVAL_S and whenever no
  replica is healthy, so replicas started later are reached (a listed one too, once it answers).
- A prepared model is placed on a healthy replica, round-robin, and prepared there (by token from
  the compilation cache, which replicas may share: cache.store). Its session (service.client.Client)
  on that replica is opened on first use and dropped when the replica stops answering health checks.
- An execution whose replica died, broke the connection or did not answer within the client's bound
  is retried once on another replica, where the model is prepared (from the cache by token when it
  is there) and its burst opened again: executions are idempotent, and the first attempt's output
  is never used (service.client abandons its scratch memory, a local burst closes). When no other
  replica can take it, the error reaches the caller (the delegate then runs the partition on the CPU).

One address is not a fleet: service.client.Client serves it, unchanged (no per-call cost added).
"""
from __future__ import annotations

import itertools
import json
import logging
import random
import threading
import time
import weakref

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from hal.model import Model
from hal.types import DeviceType, ExecutionPreference, Priority
from service.address import is_fleet, resolve, stateless_target
from service.client import (
    Client,
    ServiceUnavailableError,
    _check,
    _rpc,
)
from service.fleet_burst import FleetBurst
from service.fleet_model import FleetPreparedModel, Replica
from service.proto import nnhal_pb2 as pb
from service.proto import nnhal_pb2_grpc as pb_grpc
from service.servicer import grpc_options

log = logging.getLogger("nnhal.fleet")

#: How often each replica is health-checked, and how long a check may take before the replica
#: counts as not serving (a stopped process accepts connections but answers nothing).
HEALTH_INTERVAL_S = 0.5
HEALTH_TIMEOUT_S = 1.0
#: How often a ``dns:`` name is resolved again (also whenever no replica is healthy).
RESOLVE_INTERVAL_S = 5.0
#: Opening a session on a replica that passed its last health check.
SESSION_TIMEOUT_S = 2.0
#: gRPC's own balancing for the stateless calls: round_robin over the healthy addresses, and gRPC's
#: retry of a call whose replica went away under it (UNAVAILABLE: those calls only read).
ROUND_ROBIN_CONFIG = json.dumps({
    "loadBalancingConfig": [{"round_robin": {}}],
    "healthCheckConfig": {"serviceName": ""},
    "methodConfig": [{"name": [{"service": "nnhal.v1.Device"}],
                      "retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.05s", "maxBackoff": "0.5s",
                                      "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}}]})

#: Where the next prepared model goes, shared by every FleetClient of this process and started at
#: random: processes (and delegates) that each place one model spread over the replicas.
_placement = itertools.count(random.randrange(1 << 16))


class FleetClient:
    """IDevice over several services (see the module docstring)."""

    #: No one service's version: the delegate keeps no delegation record for a fleet (a record lives
    #: in one service's cache; delegate.delegation_record) and delegates from a cold start.
    version = ""

    def __init__(self, address: str, tls: dict, *, resolver=resolve):
        self.address = address
        self._tls = {k: v for k, v in tls.items() if v is not None}
        self._resolver = resolver
        self.replicas: dict[str, Replica] = {}
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._resolved_at = 0.0
        self._last_miss: tuple[bytes, Replica] | None = None  # prepare_model follows a cache miss there
        self._refresh(force=True)
        target = stateless_target(address, list(self.replicas), tls=bool(self._tls))
        self._stateless = self._stateless_channel = None
        if target is not None:
            self._stateless_channel = self._channel(target, None, [("grpc.service_config", ROUND_ROBIN_CONFIG)])
            self._stateless = pb_grpc.DeviceStub(self._stateless_channel)
        self.failovers = 0  # executions retried on another replica
        weakref.finalize(self, _close_channels, self._closed, self.replicas, self._stateless_channel)
        threading.Thread(target=_health_loop, args=(weakref.ref(self), self._closed), daemon=True,
                         name="nnhal-fleet-health").start()

    @classmethod
    def connect(cls, address: str, timeout_s: float = 5.0, root_certificates: bytes | None = None,
                private_key: bytes | None = None, certificate_chain: bytes | None = None,
                *, resolver=resolve) -> "FleetClient":
        """A client over the replicas ``address`` names, once one of them is healthy within
        ``timeout_s``; ServiceUnavailableError (with each replica's reason) otherwise. ``resolver``:
        address -> [(replica address, TLS host)] (resolve: the list, or the dns: name's IPs)."""
        client = cls(address, dict(root_certificates=root_certificates, private_key=private_key,
                                   certificate_chain=certificate_chain), resolver=resolver)
        deadline = time.monotonic() + timeout_s
        while True:
            client.check_health(min(HEALTH_TIMEOUT_S, max(deadline - time.monotonic(), 0.05)))
            if client.healthy():
                return client
            if time.monotonic() >= deadline:
                why = "; ".join(f"{r.address}: {r.why}" for r in client.replicas.values()) or "it resolves to nothing"
                client.close()
                raise ServiceUnavailableError(f"no nnhal service of {address} answers ({why})")
            time.sleep(0.05)

    # ---- replicas ---------------------------------------------------------------
    def _channel(self, target: str, tls_host: str | None, options: list | None = None) -> grpc.Channel:
        opts = grpc_options() + (options or []) + ([("grpc.ssl_target_name_override", tls_host)] if tls_host else [])
        if self._tls:
            creds = grpc.ssl_channel_credentials(self._tls.get("root_certificates"), self._tls.get("private_key"),
                                                 self._tls.get("certificate_chain"))
            return grpc.secure_channel(target, creds, options=opts)
        return grpc.insecure_channel(target, options=opts)

    def _refresh(self, force: bool = False) -> None:
        """Resolve the address again (a list resolves to itself): new replicas are added, those no
        longer named get no new models."""
        now = time.monotonic()
        if not force and now - self._resolved_at < RESOLVE_INTERVAL_S:
            return
        self._resolved_at = now
        found = self._resolver(self.address)
        with self._lock:
            for addr, host in found:
                if addr not in self.replicas:
                    self.replicas[addr] = Replica(addr, host, self._channel(addr, host))
                    log.info("replica %s of %s", addr, self.address)
            for addr, r in self.replicas.items():
                r.listed = any(a == addr for a, _ in found)

    def check_health(self, timeout_s: float = HEALTH_TIMEOUT_S) -> None:
        """Ask every replica's health service at once; each answer (or its absence) marks it."""
        if not self.healthy():
            self._refresh(force=self.address.startswith("dns:"))
        else:
            self._refresh()
        with self._lock:
            replicas = list(self.replicas.values())
        calls = []
        for r in replicas:
            stub = health_pb2_grpc.HealthStub(r.probe)
            try:
                calls.append((r, stub.Check.future(health_pb2.HealthCheckRequest(service=""), timeout=timeout_s)))
            except ValueError:  # the probe channel was closed: the client is closing
                return
        for r, call in calls:
            try:
                serving = call.result().status == health_pb2.HealthCheckResponse.SERVING
                why = "serving" if serving else "its health service says NOT_SERVING"
            except grpc.RpcError as e:
                serving, why = False, f"{e.code().name}: {e.details()}"
            if r.healthy and not serving:
                log.warning("nnhal replica %s lost (%s)", r.address, why)
                r.drop_session()
            r.healthy, r.why = serving, why

    @property
    def shared_memory(self) -> bool:
        """Whether executions may use shared memory (local bursts): a fleet of unix sockets. Each
        replica's session still decides for itself (Client.shared_memory: a service of another user
        gets tensors inline)."""
        return self.address.startswith("unix:")

    def healthy(self) -> list[Replica]:
        with self._lock:
            return [r for r in self.replicas.values() if r.healthy and r.listed]

    def place(self, exclude: tuple[Replica, ...] = (), rotate: bool = True) -> list[Replica]:
        """The replicas a model may be placed on, in the order to try them: the healthy ones
        round-robin (shared placement counter; ``rotate`` False: as listed, the counter untouched),
        then those whose last check failed (it may be stale)."""
        healthy = [r for r in self.healthy() if r not in exclude]
        if healthy and rotate:
            k = next(_placement) % len(healthy)
            healthy = healthy[k:] + healthy[:k]
        with self._lock:
            rest = [r for r in self.replicas.values() if r not in exclude and r not in healthy and r.listed]
        return healthy + rest

    def session(self, replica: Replica) -> Client:
        """This client's session on ``replica``, opened on first use; ServiceUnavailableError."""
        with replica.lock:
            if replica.client is None:
                opts = (("grpc.ssl_target_name_override", replica.tls_host),) if replica.tls_host else ()
                replica.client = Client.connect(replica.address, timeout_s=SESSION_TIMEOUT_S,
                                                channel_options=opts, **self._tls)
            return replica.client

    def lost(self, replica: Replica, client: Client | None) -> None:
        """A call on ``replica`` failed as unavailable: no new models there until it answers a check."""
        replica.healthy, replica.why = False, "a call failed as unavailable"
        replica.drop_session_of(client)  # the other models' bursts waiting there fail now too

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            replicas = list(self.replicas.values())
        for r in replicas:
            r.drop_session()
            r.probe.close()
        if self._stateless_channel is not None:
            self._stateless_channel.close()

    def __enter__(self) -> "FleetClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- stateless calls (IDevice) ----------------------------------------------------
    def _device(self):
        if self._stateless is not None:
            return self._stateless
        for r in self.place():
            return pb_grpc.DeviceStub(r.probe)
        raise ServiceUnavailableError(f"no nnhal service of {self.address} is known")

    def _call(self, name: str, request):
        try:
            reply = _rpc(getattr(self._device(), name), request)
        except ServiceUnavailableError:  # its replica went away under it: once more, elsewhere
            reply = _rpc(getattr(self._device(), name), request)
        _check(reply)
        return reply

    def get_capabilities(self) -> pb.Capabilities:
        return self._call("GetCapabilities", pb.Empty()).capabilities

    def get_type(self) -> DeviceType:
        return DeviceType(self._call("GetType", pb.Empty()).device_type)

    def get_version_string(self, timeout_s: float | None = None) -> str:
        return self._call("GetVersionString", pb.Empty()).version

    def get_supported_extensions(self) -> list[pb.Extension]:
        return list(self._call("GetSupportedExtensions", pb.Empty()).extensions)

    def get_number_of_cache_files_needed(self) -> tuple[int, int]:
        reply = self._call("GetNumberOfCacheFilesNeeded", pb.Empty())
        return reply.num_model_cache, reply.num_data_cache

    def get_supported_operations(self, model: Model) -> list[bool]:
        return [r is None for r in self.get_support_reasons(model)]

    def get_support_reasons(self, model: Model) -> list[str | None]:
        """As Client.get_support_reasons (every replica runs the same build: one answers). Through a
        replica's session, not the round_robin channel: a unix-socket service answers the support
        query only within a session (service.access)."""
        for replica in self.place(rotate=False)[:2]:  # a second one if the first went away under it
            client = None
            try:
                client = self.session(replica)
                return client.get_support_reasons(model)
            except ServiceUnavailableError:  # its replica went away under it: once more, elsewhere
                self.lost(replica, client)
        raise ServiceUnavailableError(f"no nnhal service of {self.address} answered the support query")

    # ---- prepared models -----------------------------------------------------------
    def prepare_model(self, model: Model, *, preference: ExecutionPreference = ExecutionPreference.FAST_SINGLE_ANSWER,
                      priority: Priority = Priority.MEDIUM, timeout_s: float | None = None,
                      token: bytes = b"") -> "FleetPreparedModel":
        """Prepared on one replica (where the cache just missed for this token, else the next one)."""
        pm = FleetPreparedModel(self, model, token, dict(preference=preference, priority=priority, timeout_s=timeout_s))
        miss, self._last_miss = self._last_miss, None
        prefer = (miss[1],) if miss and token and miss[0] == token and miss[1].healthy else ()
        pm._place(exclude=(), first=prefer, from_cache=False)
        return pm

    def prepare_model_from_cache(self, model: Model, token: bytes, *,
                                 preference: ExecutionPreference = ExecutionPreference.FAST_SINGLE_ANSWER,
                                 priority: Priority = Priority.MEDIUM,
                                 timeout_s: float | None = None, local_burst: bool = False) -> "FleetPreparedModel":
        """From the cache of one replica; a miss there is a ServiceError (call prepare_model, which
        compiles on that same replica). ``local_burst`` is not asked ahead here: a FleetBurst opens
        its own on whichever replica holds the model then."""
        pm = FleetPreparedModel(self, model, token, dict(preference=preference, priority=priority, timeout_s=timeout_s))
        pm._place(exclude=(), first=(), from_cache=True)
        return pm


def _close_channels(closed: threading.Event, replicas: dict, stateless: grpc.Channel | None) -> None:
    """A FleetClient collected without close(): its health thread stops, its channels close (each
    replica's session closes with its own Client's finalizer)."""
    closed.set()
    for r in list(replicas.values()):
        r.probe.close()
    if stateless is not None:
        stateless.close()


def _health_loop(ref: "weakref.ref[FleetClient]", closed: threading.Event) -> None:
    """Checks the fleet's replicas until the client is closed or collected (holds no reference to it
    between rounds)."""
    while not closed.wait(HEALTH_INTERVAL_S):
        client = ref()
        if client is None:
            return
        try:
            client.check_health()
        except Exception:  # noqa: BLE001 - a round that failed is retried; the thread must live
            log.exception("health check round failed")
        del client


def probe_health(address: str, timeout_s: float = 2.0, server_name: str | None = None, **tls) -> str | None:
    """None when the service at ``address`` says SERVING on gRPC health, else why not (`nnhal health`:
    a Kubernetes exec probe, since kubelet's own gRPC probe speaks no TLS). ``server_name``: the
    name its TLS certificate is checked against (a pod probed on 127.0.0.1 holds the Service's name)."""
    opts = grpc_options() + ([("grpc.ssl_target_name_override", server_name)] if server_name else [])
    if any(v is not None for v in tls.values()):
        channel = grpc.secure_channel(address, grpc.ssl_channel_credentials(
            tls.get("root_certificates"), tls.get("private_key"), tls.get("certificate_chain")), options=opts)
    else:
        channel = grpc.insecure_channel(address, options=opts)
    try:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout_s)
    except grpc.RpcError as e:
        return f"{e.code().name}: {e.details()}"
    finally:
        channel.close()
    if reply.status != health_pb2.HealthCheckResponse.SERVING:
        return f"its health service says {health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)}"
    return None


def connect(address: str, timeout_s: float = 5.0, **tls) -> Client | FleetClient:
    """Client for one address (service.client.Client, unchanged), FleetClient for a list or a dns: name."""
    if is_fleet(address):
        return FleetClient.connect(address, timeout_s, **tls)
    return Client.connect(address, timeout_s=timeout_s, **tls)


__all__ = ["FleetClient", "FleetPreparedModel", "FleetBurst", "Replica", "connect", "probe_health"]
