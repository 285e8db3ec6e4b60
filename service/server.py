"""Server construction (`create_server`, used by tests) and `nnhal serve`'s main loop."""
from __future__ import annotations

import ipaddress
import logging
import math
import os
import signal
import socket
import stat
import threading
from concurrent import futures
from dataclasses import dataclass
from typing import Iterable

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from cache.files import locked_directory
from cache.store import CacheError, CacheStore
from hal import performance
from hal.errors import HalError
from service.access import Access
from service.driver import Driver, capabilities_fingerprint
from service.peer_gate import PEER_SUFFIX, PeerGate, Tickets, peer_socket_path
from service.proto import nnhal_pb2_grpc as pb_grpc
from service.scheduler import Scheduler
from service.servicer import DeviceServicer, PreparedModelServicer, grpc_options
from service.sessions import DEFAULT_CLIENT_MAX_BYTES, DEFAULT_MAX_CLIENTS, Sessions
from service.tls import ServerTls

log = logging.getLogger("nnhal.service")

SERVICE_NAMES = ("nnhal.v1.Device", "nnhal.v1.PreparedModel")


#: Ping idle connections: a client whose machine vanished (TCP) is detected within ~80 s and its
#: session ends; on a unix socket a dead client's socket closes at once.
KEEPALIVE = [("grpc.keepalive_time_ms", 60_000), ("grpc.keepalive_timeout_ms", 20_000)]
#: gRPC binds TCP ports with SO_REUSEPORT by default: a second `nnhal serve --listen` on a port a
#: live service holds would start, and the kernel would split the clients between the two. Off,
#: the second one's bind fails ("cannot listen on HOST:PORT: the address is in use").
NO_REUSEPORT = [("grpc.so_reuseport", 0)]


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
    peer_gate: PeerGate | None = None  # the unix socket's handshake (service.peer_gate)
    peer_socket_id: tuple[int, int] | None = None

    def stop(self, grace: float | None = 10.0) -> None:
        """Graceful stop: refuse new RPCs, let in-flight ones finish, remove the sockets."""
        for name in ("",) + SERVICE_NAMES:
            self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        self.driver.sessions_closing.set()  # session streams end now instead of holding the grace period
        if self.peer_gate is not None:
            self.peer_gate.stop()
        self.server.stop(grace).wait()
        self.prepared_servicer.close_local_bursts()
        self.scheduler.shutdown()
        if self.socket_path:  # grpcio (1.85) already unlinked its socket, by path
            _unlink_if_ours(self.socket_path, self.socket_id)
            _unlink_if_ours(peer_socket_path(self.socket_path), self.peer_socket_id)


def _unlink_if_ours(path: str, ours: tuple[int, int] | None) -> None:
    """Remove the socket we bound at ``path``, not one another server put there since."""
    try:
        st = os.lstat(path)
        if (st.st_dev, st.st_ino) == ours:
            os.unlink(path)
    except FileNotFoundError:
        pass


#: How often the main thread looks for a SIGTERM/SIGINT its (lock-free) handler recorded.
SIGNAL_POLL_S = 0.1

#: sockaddr_un's sun_path is 108 bytes on Linux, with the terminating NUL; the handshake socket
#: next to the service's (PATH.peer, service.peer_gate) must fit too.
MAX_SOCKET_PATH_BYTES = 107 - len(PEER_SUFFIX)


def check_socket_path(path: str) -> None:
    """A path longer than AF_UNIX allows: one clear error, before grpc fails obscurely on it."""
    if not path:
        raise ValueError("empty socket path")
    n = len(os.fsencode(path))
    if n > MAX_SOCKET_PATH_BYTES:
        raise ValueError(f"socket path {path} is {n} bytes long; a unix socket path may have at most "
                         f"{MAX_SOCKET_PATH_BYTES}: use a shorter one")


class _MalformedMessageLog(logging.Filter):
    """grpc logs a request it cannot parse with a full traceback, once per message: a client sending
    garbage would flood the log. One line instead, with the parser's reason."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg == "Exception deserializing message!" and record.exc_info:
            reason = " ".join(str(record.exc_info[1]).split()) or type(record.exc_info[1]).__name__
            record.msg, record.args = "dropped a malformed request: %s", (reason,)
            record.exc_info = record.exc_text = None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


_MALFORMED_MESSAGE_LOG = _MalformedMessageLog()


def _check_socket_dir(d: str, others: bool = False, warn: bool = False) -> None:
    """Refuse a socket directory others can write or own (as ssh and X11 do): they could replace
    our socket with theirs, and clients (and local bursts, whose sockets live there too) would
    trust it. Root may own it: root can do anything anyway. With ``others`` (--allow-uid names
    other users) it is made traversable by them (0711: they can reach the socket, not list or
    write the directory); ``warn``: say so when a directory above it keeps them out."""
    try:
        os.makedirs(d, mode=0o700, exist_ok=True)
        st = os.stat(d)
    except (FileExistsError, NotADirectoryError):
        raise ValueError(f"socket directory {d} is not a directory (or a path component is not)") from None
    except OSError as e:
        raise ValueError(f"socket directory {d}: {e.strerror}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise ValueError(f"socket directory {d} is not a directory")
    if st.st_uid not in (os.geteuid(), 0):
        raise ValueError(f"socket directory {d} is owned by uid {st.st_uid}, not by this user: refusing to use it")
    if st.st_mode & 0o022:
        raise ValueError(f"socket directory {d} is writable by group or others (mode {st.st_mode & 0o7777:o}): "
                         "they could replace the socket; use a private directory (mode 0700)")
    if others and st.st_mode & 0o011 != 0o011:
        try:
            os.chmod(d, st.st_mode & 0o7777 | 0o011)
        except OSError as e:
            raise ValueError(f"socket directory {d}: the users --allow-uid names must be able to reach the socket "
                             f"(mode 0711), and it cannot be made so: {e.strerror}") from None
    if others and warn:
        blocked = _closed_ancestor(d)
        if blocked:
            log.warning("--allow-uid: other users cannot reach %s (mode %o, not searchable by others): "
                        "the uids it names cannot connect", blocked, os.stat(blocked).st_mode & 0o7777)


def _closed_ancestor(d: str) -> str | None:
    """The first directory above ``d`` that others cannot search, if any."""
    path = os.path.abspath(d)
    while os.path.dirname(path) != path:
        path = os.path.dirname(path)
        if not os.stat(path).st_mode & 0o001:
            return path
    return None


def _allow_list(allow_uids: Iterable[int] | None) -> frozenset[int]:
    """--allow-uid's uids (default: the service's own); ValueError for one that is not a uid."""
    if allow_uids is None:
        return frozenset({os.geteuid()})
    uids = frozenset(allow_uids)
    bad = [u for u in uids if not isinstance(u, int) or isinstance(u, bool) or not 0 <= u < 2**32 - 1]
    if bad or not uids:
        raise ValueError(f"--allow-uid takes user ids (integers >= 0), not {sorted(map(str, bad)) or 'nothing'}")
    return uids


def _listen_peer_socket(path: str) -> socket.socket:
    """Bind and listen on the handshake socket (the caller holds the directory's lock and umask)."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(path)
        listener.listen(64)
    except OSError as e:
        listener.close()
        raise ValueError(f"cannot listen on {path}: {e.strerror}") from None
    return listener


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


def _refuse_live_tcp_port(listen: str) -> None:
    """A live server on HOST:PORT: one clear error before anything loads (the bind itself fails too,
    SO_REUSEPORT being off, but gRPC says so only in a C log line)."""
    host, _, port = listen.rpartition(":")
    if not port.isdigit() or int(port) == 0:
        return
    try:
        probe = socket.create_connection((host.strip("[]"), int(port)), timeout=2.0)
    except OSError:
        return  # refused (free), or not ours to tell: the bind decides
    probe.close()
    raise ValueError(f"cannot listen on {listen}: another server is already listening there")


def default_cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "nnhal")


def create_server(socket_path: str | None = None, listen: str | None = None, *, workers: int = 2,
                  tls: ServerTls | tuple[bytes, bytes] | None = None, insecure: bool = False,
                  cache_dir: str | None = None, cache_max_bytes: int | None = None,
                  backends: str | None = None, max_clients: int = DEFAULT_MAX_CLIENTS,
                  client_max_bytes: int = DEFAULT_CLIENT_MAX_BYTES,
                  relative_speed: float | None = None, performance_file: str | None = None,
                  allow_uids: Iterable[int] | None = None) -> RunningServer:
    """Start a server on a unix socket (default) or on HOST:PORT (TLS, or insecure loopback only).

    ``allow_uids``: on the unix socket, the users who may open a session (checked by their
    SO_PEERCRED, service.peer_gate; default: the service's own uid). Naming others makes the socket
    directory 0711 and the sockets 0666: the uid check is then the gate.

    ``cache_dir=None`` disables compilation caching. ``backends`` is the compute backend
    preference ("numba,reference"; default $NNHAL_BACKENDS, else every available backend by
    priority); an unknown name is a ValueError before anything listens. ``relative_speed``: the
    exec_time the capabilities report for every operand type (the device's time relative to the
    CPU's, > 0); None: what the backends measured (hal.performance), or with ``performance_file``
    the figures it holds (hal.performance.read_measured)."""
    if relative_speed is not None and not (math.isfinite(relative_speed) and relative_speed > 0):
        raise ValueError(f"--relative-speed must be a number > 0, not {relative_speed}")
    if relative_speed is not None and performance_file is not None:
        raise ValueError("give --relative-speed or --performance, not both")
    measured = None if performance_file is None else performance.read_measured(performance_file)
    if listen is not None and allow_uids is not None:
        raise ValueError("--allow-uid applies to the unix socket; over TCP, TLS client certificates decide "
                         "who connects (--tls-client-ca)")
    allowed = _allow_list(allow_uids)
    others = bool(allowed - {os.geteuid()})
    if listen is None and socket_path is None:
        socket_path = default_socket_path()
    if listen is None:  # refuse early, before the backends load; checked again under the lock
        check_socket_path(socket_path)
        socket_dir = os.path.dirname(os.path.abspath(socket_path))
        _check_socket_dir(socket_dir, others, warn=True)
        _claim_socket_path(socket_path)
        _claim_socket_path(peer_socket_path(socket_path))
    else:
        _refuse_live_tcp_port(listen)
    try:
        driver = Driver(None, backends, Sessions(max_clients, client_max_bytes))
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
    scheduler = driver.scheduler = Scheduler(workers)
    # Each connected client's session stream holds a thread, each gRPC burst another: room for
    # both on top of the threads that serve unary calls.
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2 * max_clients + max(8, 4 * workers),
                                                    thread_name_prefix="nnhal-rpc"),
                         options=grpc_options() + KEEPALIVE + NO_REUSEPORT)
    unix_server = listen is None  # sessions by ticket, shared memory only there (service.access)
    tickets = Tickets() if unix_server else None
    access = Access(driver, unix_server, tickets)
    device_servicer = DeviceServicer(driver, access, relative_speed, measured)
    pb_grpc.add_DeviceServicer_to_server(device_servicer, server)
    prepared_servicer = PreparedModelServicer(driver, access, os.path.dirname(socket_path) if unix_server else None)
    device_servicer.bursts = prepared_servicer
    pb_grpc.add_PreparedModelServicer_to_server(prepared_servicer, server)
    hs = health.HealthServicer()
    logging.getLogger("grpc._common").addFilter(_MALFORMED_MESSAGE_LOG)  # once: a filter is added only once
    health_pb2_grpc.add_HealthServicer_to_server(hs, server)
    if listen is not None:
        host = listen.rsplit(":", 1)[0].strip("[]")
        if tls is None and not insecure:
            raise ValueError("--listen needs --tls-cert/--tls-key, or --insecure on a loopback address")
        if tls is None and not _is_loopback(host):
            raise ValueError(f"--insecure is only allowed on loopback addresses, not {host!r}")
        try:
            if tls is not None:
                port = server.add_secure_port(listen, (tls if isinstance(tls, ServerTls) else ServerTls(*tls))
                                              .credentials())
            else:
                port = server.add_insecure_port(listen)
        except RuntimeError:  # grpc says only "Failed to bind"; its C log line has the detail
            why = "the address is in use or not this machine's" + (
                ", or the --tls-key does not match the --tls-cert" if tls is not None else "")
            raise ValueError(f"cannot listen on {listen}: {why}") from None
        address = f"{listen.rsplit(':', 1)[0]}:{port}"
        server.start()
        socket_id = peer_socket_id = gate = None
    else:
        peer_path = peer_socket_path(socket_path)
        with locked_directory(socket_dir):  # servers starting on one directory: check-bind-listen in turn
            _check_socket_dir(socket_dir, others)
            _claim_socket_path(socket_path)
            _claim_socket_path(peer_path)
            old = os.umask(0o077)  # the socket files are created 0600
            try:
                # The handshake socket first: once the gRPC socket answers, clients can get tickets.
                peer_listener = _listen_peer_socket(peer_path)
                try:
                    server.add_insecure_port("unix:" + socket_path)
                except RuntimeError as e:
                    peer_listener.close()
                    os.unlink(peer_path)
                    raise ValueError(f"cannot listen on {socket_path}: {e}") from None
            finally:
                os.umask(old)
            gate = PeerGate(peer_listener, allowed, tickets)
            server.start()  # listening before the lock is released: the next server sees it live
        mode = 0o666 if others else 0o600  # others connect, and their uid is checked (service.peer_gate)
        os.chmod(socket_path, mode)
        os.chmod(peer_path, mode)
        st, st_peer = os.lstat(socket_path), os.lstat(peer_path)
        socket_id, peer_socket_id = (st.st_dev, st.st_ino), (st_peer.st_dev, st_peer.st_ino)
        address = "unix:" + socket_path
    for name in ("",) + SERVICE_NAMES:
        hs.set(name, health_pb2.HealthCheckResponse.SERVING)
    return RunningServer(server, address, driver, scheduler, hs, prepared_servicer,
                         socket_path if listen is None else None, socket_id, gate, peer_socket_id)


def _stop_with_parent(pid: int, stop: threading.Event) -> None:
    """Set ``stop`` when process ``pid`` exits (a pidfd becomes readable; no polling)."""
    try:
        fd = os.pidfd_open(pid)
    except (OSError, AttributeError) as e:  # gone already, or a kernel without pidfds
        log.info("parent %d not watchable (%s): stopping", pid, e)
        stop.set()
        return
    if os.getppid() != pid:  # it died before the pidfd was opened (and the pid may be reused)
        os.close(fd)
        log.info("parent process %d is gone: stopping", pid)
        stop.set()
        return

    def watch():
        import select
        try:
            select.select([fd], [], [])
            log.info("parent process %d exited: shutting down", pid)
        finally:
            os.close(fd)
            stop.set()
    threading.Thread(target=watch, name="nnhal-parent-watch", daemon=True).start()


def _is_loopback(host: str) -> bool:
    if host in ("localhost",):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def serve(socket_path: str | None, listen: str | None, workers: int, tls: ServerTls | None,
          insecure: bool, cache_dir: str | None = None, cache_max_bytes: int | None = None,
          ready: threading.Event | None = None, backends: str | None = None, *,
          parent_pid: int | None = None, **limits) -> int:
    """Run until SIGTERM/SIGINT (or, with ``parent_pid``, until that process exits: an embedded
    service must not outlive the program that started it); then stop gracefully (in-flight
    executions finish). ``limits``: max_clients, client_max_bytes, relative_speed, performance_file,
    allow_uids (create_server)."""
    running = create_server(socket_path, listen, workers=workers, tls=tls, insecure=insecure,
                            cache_dir=cache_dir, cache_max_bytes=cache_max_bytes, backends=backends, **limits)
    stop = threading.Event()
    if parent_pid is not None:
        _stop_with_parent(parent_pid, stop)

    signals: list[int] = []

    def on_signal(signum, frame):
        # No locks here (no Event.set, no logging): a handler runs on the main thread between any two
        # bytecodes, also inside another handler's Event.set(), and would wait forever for the lock
        # its own thread holds. Two SIGTERMs in a row deadlocked the service that way.
        signals.append(signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    log.info("nnhal service listening on %s (backends: %s)", running.address,
             ",".join(running.driver.backend_order))
    print(f"nnhal service listening on {running.address}", flush=True)
    if ready is not None:
        ready.set()
    while not signals and not stop.wait(SIGNAL_POLL_S):
        pass
    if signals:
        log.info("signal %d: shutting down", signals[0])
    running.stop(grace=10.0)
    for signum in (signal.SIGTERM, signal.SIGINT):  # stopped: a repeated signal has nothing left to stop,
        signal.signal(signum, signal.SIG_IGN)      # and would find Python's default action back, exiting
    if parent_pid is not None and running.socket_path:
        try:  # the private directory its parent made for it: gone with the service, if empty
            os.rmdir(os.path.dirname(running.socket_path))
        except OSError:
            pass
    return 0
