"""The burst of a prepared model placed on one replica of several services (service.fleet): opened
again on the replica the model moves to."""
from __future__ import annotations

import socket

import numpy as np

from service.client import ExecutionOutput, RemotePreparedModel, ServiceError, ServiceUnavailableError


class FleetBurst:
    """A burst on the prepared model's current replica, opened again on the replica it moves to.
    ``local``: the shared-memory burst (unix sockets), else the gRPC stream; where a local burst
    cannot be opened (TCP) the model's own execute is used."""

    def __init__(self, pm, local: bool, extra_slot_bytes: int = 0):
        """``pm``: service.fleet.FleetPreparedModel (not imported: that module imports this one)."""
        self.pm, self._local, self._extra = pm, local, extra_slot_bytes
        self._remote: RemotePreparedModel | None = None
        self._replica = None  # the service.fleet.Replica the inner burst is open on
        self._inner = None
        self._open(pm.current(), first=True)

    def _open(self, remote: RemotePreparedModel, first: bool = False) -> None:
        self._remote = remote
        if self._replica is not None:
            self._replica.bursts.discard(self)
        self._replica = self.pm.replica
        if self._replica is not None:
            self._replica.bursts.add(self)  # service.fleet.Replica: aborts it when the replica is lost
        try:
            local = self._local and remote.client.shared_memory  # another user's replica: the gRPC stream
            self._inner = remote.local_burst(self._extra) if local else remote.burst()
        except ServiceUnavailableError:
            raise
        except ServiceError:
            if first:  # the first open says why (the delegate then uses execute)
                raise
            self._inner = None

    def _close_inner(self) -> None:
        inner, self._inner = self._inner, None
        if inner is not None:
            try:
                inner.close()
            except (OSError, BufferError):
                pass

    def execute(self, inputs: list[np.ndarray], outputs: list[np.ndarray] | None = None, **kw) -> ExecutionOutput:
        """The inner burst's execute; when its replica is unavailable, once more on the replica the
        prepared model moves to, through a burst opened there."""
        remote = self.pm.current()
        if remote is not self._remote:  # moved meanwhile (another path failed over)
            self._close_inner()
            self._open(remote)
        try:
            return (self._inner or remote).execute(inputs, outputs, **kw)
        except ServiceUnavailableError as e:
            self._close_inner()
            with self.pm._lock:
                if self.pm.remote is remote:
                    self.pm._move(str(e), failed=remote)
            remote = self.pm.current()
            self._open(remote)
            return (self._inner or remote).execute(inputs, outputs, **kw)

    def arm_native(self, inputs: list[np.ndarray], outputs: list[np.ndarray], **kw) -> None:
        """None: no native round trip (``LocalBurst.arm_native``) across a fleet, whose every
        execution may fail over to another replica (``execute``)."""
        return None

    def abort(self, replica) -> None:
        """Wake an execution waiting on a local burst on ``replica``, which was lost: its socket is
        shut down, the wait ends as a broken connection, the slots are never read again (it moves)."""
        inner = self._inner
        if self._replica is not replica:  # moved meanwhile: its burst elsewhere is fine
            return
        channel = getattr(inner, "channel", None)  # a LocalBurst's service.local_burst_client channel
        if channel is not None:
            try:
                channel.sock.shutdown(socket.SHUT_RDWR)
            except OSError:  # closed meanwhile
                pass

    def close(self) -> None:
        self._close_inner()

    def __enter__(self) -> "FleetBurst":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
