"""The nnhal delegate's options, with the names TFLite's NNAPI delegate users already know.

TFLite's NNAPI delegate (StatefulNnApiDelegate::Options) spells some options differently; those
names are accepted as aliases (ALIASES) and land on our fields, so code written for it needs no
renaming: ``load_delegate(accelerator_name="nnhal", model_token=b"app-v3", cache_dir=d,
max_number_delegated_partitions=0, execution_preference="sustained_speed", allow_fp16=True,
disallow_nnapi_cpu=True)``.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field, fields

from delegate.partition import PARTITIONING, parse_node_ranges
from hal.types import ExecutionPreference, Priority
from service import DEVICE_NAME
from service.address import client_address, fleet_addresses, is_fleet
from service.server import check_socket_path
from service.tls import ClientTls, check_tls_address, client_tls

#: TFLite NNAPI delegate option -> our field. ``disallow_nnapi_cpu`` is inverted (True = no
#: in-process fallback); ``max_number_delegated_partitions`` <= 0 means unlimited, as in TFLite.
ALIASES = {
    "model_token": "cache_token",
    "max_number_delegated_partitions": "max_delegated_partitions",
    "disallow_nnapi_cpu": "allow_in_process_fallback",
}


def _enum(cls, v, option: str):
    try:
        return cls[v.upper()] if isinstance(v, str) else cls(v)
    except (KeyError, ValueError):
        raise ValueError(f"unknown {option} {v!r} (one of: {', '.join(m.name.lower() for m in cls)})") from None


def _from_alias(name: str, value):
    if name == "disallow_nnapi_cpu":
        return not value
    if name == "max_number_delegated_partitions" and isinstance(value, int) and value < 0:
        return 0  # TFLite: any value <= 0 is "no limit"; ours spells that 0
    return value


@dataclass
class NnhalOptions:
    #: unix:PATH, a bare socket path (taken as unix:PATH) or HOST:PORT; several services as a
    #: comma-separated list of those or a dns:///HOST:PORT name (service.fleet); None: the per-user
    #: socket, else an embedded service (delegate.embedded).
    service_address: str | None = None
    max_delegated_partitions: int = 3  # 0 = unlimited
    min_nodes_per_partition: int = 1
    partitions: str | None = None
    #: "cost" (the default), "cost_strict" or "largest" (TFLite's rule): delegate.partition.PARTITIONING.
    partitioning: str = "cost"
    #: Mixed into every partition's cache token (service.token.model_token), never a replacement
    #: for it: the token is derived from the partition's structure and weights, so entries are
    #: shared across processes as long as this (and cache_dir) is the same in each; a token that
    #: changes per process (random, a pid) means every process compiles again, as in TFLite.
    cache_token: bytes = b""
    #: TFLite's NNAPI ``cache_dir``: here a key, not storage. The compiled artifacts stay in the
    #: service's cache (the driver owns storage in this design); the directory's real path is mixed
    #: into the token, so two apps with different cache dirs never share compiled entries. It must
    #: exist (as TFLite requires). The tools' flag is TFLite's --delegate_serialize_dir, apart from
    #: `nnhal serve --cache-dir`, the service's storage.
    cache_dir: str | None = None
    execution_preference: ExecutionPreference = ExecutionPreference.FAST_SINGLE_ANSWER
    priority: Priority = Priority.MEDIUM
    allow_fp16: bool = False
    deadline_ms: float | None = None
    #: NNAPI's loop timeout for each delegated WHILE (ANeuralNetworksExecution_setLoopTimeout):
    #: None = NNAPI's default, 2 s; the service caps it at 15 s. A loop that runs longer fails the
    #: invoke with MISSED_DEADLINE (TFLite's CPU WHILE has no bound).
    loop_timeout_ms: float | None = None
    local_burst: bool = True
    #: False (TFLite: disallow_nnapi_cpu=True): a service failing during invoke fails the invoke
    #: with a clear error instead of running the partition in-process on hal's kernels. An
    #: unreachable service at delegation time still delegates nothing (TFLite's CPU runs the model).
    allow_in_process_fallback: bool = True
    #: TFLite's ``accelerator_name``: the one device this delegate reaches is DEVICE_NAME.
    accelerator_name: str | None = None
    #: TLS to a TCP service_address (PEM files): the CA to trust, and a client certificate and
    #: its key for a service that requires one (`nnhal serve --tls-client-ca`).
    tls_ca_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    tls: ClientTls | None = field(default=None, init=False, repr=False)  # the files' bytes, read once

    @classmethod
    def from_kwargs(cls, **kw) -> "NnhalOptions":
        names = {f.name for f in fields(cls) if f.init}
        unknown = set(kw) - names - set(ALIASES)
        if unknown:
            raise TypeError(f"unknown nnhal delegate option(s): {', '.join(sorted(unknown))}")
        for alias, canonical in ALIASES.items():
            if alias in kw:
                if canonical in kw:
                    raise ValueError(f"give {alias} or {canonical}, not both (the same option)")
                kw[canonical] = _from_alias(alias, kw.pop(alias))
        o = cls(**kw)
        if isinstance(o.cache_token, str):
            o.cache_token = o.cache_token.encode()
        o.execution_preference = _enum(ExecutionPreference, o.execution_preference, "execution_preference")
        o.priority = _enum(Priority, o.priority, "priority")
        if o.max_delegated_partitions < 0 or o.min_nodes_per_partition < 1:
            raise ValueError("max_delegated_partitions must be >= 0 and min_nodes_per_partition >= 1")
        for name in ("deadline_ms", "loop_timeout_ms"):
            v = getattr(o, name)
            if v is not None and not v > 0:
                raise ValueError(f"{name} must be > 0, not {v}")
        if o.accelerator_name is not None and o.accelerator_name != DEVICE_NAME:
            raise ValueError(f"unknown accelerator_name {o.accelerator_name!r} (available: {DEVICE_NAME})")
        if o.cache_dir is not None:
            if not o.cache_dir or not os.path.isdir(o.cache_dir):
                raise ValueError(f"cache_dir {o.cache_dir!r} is not a directory")
            o.cache_dir = os.path.realpath(o.cache_dir)
        parse_node_ranges(o.partitions)  # validate early
        if o.partitioning not in PARTITIONING:
            raise ValueError(f"unknown partitioning {o.partitioning!r} (one of: {', '.join(PARTITIONING)})")
        if o.service_address:  # a bare socket path becomes unix:PATH (service.address); a list each
            replicas = fleet_addresses(o.service_address) if is_fleet(o.service_address) \
                else [client_address(o.service_address)]
            o.service_address = ",".join(replicas)
            for replica in replicas:
                if replica.startswith("unix:"):
                    check_socket_path(replica.removeprefix("unix:").removeprefix("//"))
        o.tls = client_tls(o.tls_ca_file, o.tls_cert_file, o.tls_key_file)  # a bad file: ValueError now
        if o.tls is not None:
            check_tls_address(o.service_address, "tls_ca_file/tls_cert_file/tls_key_file")
        return o

    def token_salt(self) -> bytes:
        """The user's part of the cache token: cache_token, plus cache_dir's real path when given
        (length-prefixed, so no token/path pair can spell another)."""
        if self.cache_dir is None:
            return self.cache_token  # tokens made before cache_dir existed stay valid
        return len(self.cache_token).to_bytes(8, "little") + self.cache_token + os.fsencode(self.cache_dir)

    def token_options(self) -> dict:
        """Options that change compilation (and therefore the cache token)."""
        return {"allow_fp16": self.allow_fp16, "preference": int(self.execution_preference)}
