"""Server construction (`create_server`, used by tests) and `nnhal serve`'s main loop."""
from __future__ import annotations

import ipaddress
import logging
import os
import signal
import socket
import stat
import threading
from concurrent import futures
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from cache.store import CacheError, CacheStore, locked_directory
from hal.errors import HalError
from service.driver import Driver, capabilities_fingerprint
from service.proto import nnhal_pb2_grpc as pb_grpc
from service.scheduler import Scheduler
from service.servicer import DeviceServicer, PreparedModelServicer, grpc_options

log = logging.getLogger("nnhal.service")

SERVICE_NAMES = ("nnhal.v1.Device", "nnhal.v1.PreparedModel")


def default_socket_path() -> str:
    """Per-user socket: $XDG_RUNTIME_DIR/nnhal/nnhal.sock, else /tmp/nnhal-<uid>/nnhal.sock."""
    base = os.environ.get("XDG_RUNTIME_DIR")
    root = os.path.join(base, "nnhal") if base else f"/tmp/nnhal-{os.getuid()}"
    return os.path.join(root, "nnhal.sock")


def default_address() -> str:
    return "unix:" + default_socket_path()


@dataclass
class RunningServer:
    server: grpc.Server
    address: str  # what clients pass to grpc: unix:/path or host:port
    driver: Driver
    scheduler: Scheduler
    health: health.HealthServicer
    prepared_servicer: PreparedModelServicer
    socket_path: str | None = None
    socket_id: tuple[int, int] | None = None  # (st_dev, st_ino) of the socket we bound

    def stop(self, grace: float | None = 10.0) -> None:
        """Graceful stop: refuse new RPCs, let in-flight ones finish, remove the socket."""
        for name in ("",) + SERVICE_NAMES:
            self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        self.server.stop(grace).wait()
        self.prepared_servicer.close_local_bursts()
        self.scheduler.shutdown()
        if self.socket_path:
            try:  # grpcio (1.85) already unlinked it, by path; if not, remove it only if still ours
                st = os.lstat(self.socket_path)
                if (st.st_dev, st.st_ino) == self.socket_id:
                    os.unlink(self.socket_path)
            except FileNotFoundError:
                pass


def _check_socket_dir(d: str) -> None:
    """Refuse a socket directory others can write or own (as ssh and X11 do): they could replace
    our socket with theirs, and clients (and local bursts, whose sockets live there too) would
    trust it. Root may own it: root can do anything anyway."""
    try:
        os.makedirs(d, mode=0o700, exist_ok=True)
        st = os.stat(d)
    except OSError as e:
        raise ValueError(f"socket directory {d}: {e.strerror}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise ValueError(f"socket directory {d} is not a directory")
    if st.st_uid not in (os.geteuid(), 0):
        raise ValueError(f"socket directory {d} is owned by uid {st.st_uid}, not by this user: refusing to use it")
    if st.st_mode & 0o022:
        raise ValueError(f"socket directory {d} is writable by group or others (mode {st.st_mode & 0o7777:o}): "
                         "they could replace the socket; use a private directory (mode 0700)")


def _claim_socket_path(path: str) -> None:
    """Make ``path`` free to bind: nothing there, or a stale socket (nothing answers), which is
    removed. Anything else is refused: a file that is not a socket, or a live server's socket."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise ValueError(f"{path} exists and is not a socket: refusing to replace it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(5.0)  # a live server with a full backlog: do not wait forever
    try:
        probe.connect(path)
    except ConnectionRefusedError:
        pass  # stale: left by a server that died
    except FileNotFoundError:
        return
    except OSError as e:
        raise ValueError(f"cannot tell whether a server is listening on {path} ({e.strerror or 'no answer'}): "
                         "refusing to replace it") from None
    else:
        raise ValueError(f"another server is already listening on {path}")
    finally:
        probe.close()
    os.unlink(path)


def default_cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "nnhal")


def create_server(socket_path: str | None = None, listen: str | None = None, *, workers: int = 2,
                  tls: tuple[bytes, bytes] | None = None, insecure: bool = False,
                  cache_dir: str | None = None, cache_max_bytes: int | None = None,
                  backends: str | None = None) -> RunningServer:
    """Start a server on a unix socket (default) or on HOST:PORT (TLS, or insecure loopback only).

    ``cache_dir=None`` disables compilation caching. ``backends`` is the compute backend
    preference ("numba,reference"; default $NNHAL_BACKENDS, else every available backend by
    priority); an unknown name is a ValueError before anything listens."""
    if listen is None and socket_path is None:
        socket_path = default_socket_path()
    if listen is None:  # refuse early, before the backends load; checked again under the lock
        socket_dir = os.path.dirname(os.path.abspath(socket_path))
        _check_socket_dir(socket_dir)
        _claim_socket_path(socket_path)
    try:
        driver = Driver(None, backends)
    except HalError as e:
        raise ValueError(e.message) from None
    cache = None
    if cache_dir is not None:
        try:  # a bad key is moved aside and replaced: it made every entry useless already
            cache = CacheStore(cache_dir, driver_version=Driver.version_string(), repair_key=True,
                               capabilities_fingerprint=capabilities_fingerprint(), max_bytes=cache_max_bytes)
        except CacheError as e:
            raise ValueError(f"compilation cache: {e}") from None
    driver.cache = cache
    scheduler = Scheduler(workers)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=max(8, 4 * workers), thread_name_prefix="nnhal-rpc"),
                         options=grpc_options())
    pb_grpc.add_DeviceServicer_to_server(DeviceServicer(driver), server)
    prepared_servicer = PreparedModelServicer(
        driver, scheduler, os.path.dirname(socket_path) if listen is None else None)
    pb_grpc.add_PreparedModelServicer_to_server(prepared_servicer, server)
    hs = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(hs, server)
    if listen is not None:
        host = listen.rsplit(":", 1)[0].strip("[]")
        if tls is not None:
            port = server.add_secure_port(listen, grpc.ssl_server_credentials([(tls[1], tls[0])]))
        elif insecure:
            if not _is_loopback(host):
                raise ValueError(f"--insecure is only allowed on loopback addresses, not {host!r}")
            port = server.add_insecure_port(listen)
        else:
            raise ValueError("--listen needs --tls-cert/--tls-key, or --insecure on a loopback address")
        address = f"{listen.rsplit(':', 1)[0]}:{port}"
        server.start()
        socket_id = None
    else:
        with locked_directory(socket_dir):  # servers starting on one directory: check-bind-listen in turn
            _check_socket_dir(socket_dir)
            _claim_socket_path(socket_path)
            old = os.umask(0o077)  # the socket file is created 0600
            try:
                server.add_insecure_port("unix:" + socket_path)
            except RuntimeError as e:
                raise ValueError(f"cannot listen on {socket_path}: {e}") from None
            finally:
                os.umask(old)
            server.start()  # listening before the lock is released: the next server sees it live
        os.chmod(socket_path, 0o600)
        st = os.lstat(socket_path)
        socket_id = (st.st_dev, st.st_ino)
        address = "unix:" + socket_path
    for name in ("",) + SERVICE_NAMES:
        hs.set(name, health_pb2.HealthCheckResponse.SERVING)
    return RunningServer(server, address, driver, scheduler, hs, prepared_servicer,
                         socket_path if listen is None else None, socket_id)


def _is_loopback(host: str) -> bool:
    if host in ("localhost",):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def serve(socket_path: str | None, listen: str | None, workers: int, tls: tuple[bytes, bytes] | None,
          insecure: bool, cache_dir: str | None = None, cache_max_bytes: int | None = None,
          ready: threading.Event | None = None, backends: str | None = None) -> int:
    """Run until SIGTERM/SIGINT; then stop gracefully (in-flight executions finish)."""
    running = create_server(socket_path, listen, workers=workers, tls=tls, insecure=insecure,
                            cache_dir=cache_dir, cache_max_bytes=cache_max_bytes, backends=backends)
    stop = threading.Event()

    def on_signal(signum, frame):
        log.info("signal %d: shutting down", signum)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    log.info("nnhal service listening on %s (backends: %s)", running.address,
             ",".join(running.driver.backend_order))
    print(f"nnhal service listening on {running.address}", flush=True)
    if ready is not None:
        ready.set()
    stop.wait()
    running.stop(grace=10.0)
    return 0
