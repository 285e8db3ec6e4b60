"""One logging convention for the service, the delegate and the tools: ``--log-level``, else
$NNHAL_LOG, else a default; one format; everything on stderr; a message that repeats on every
call said once, then counted (RepeatedMessages)."""
from __future__ import annotations

import logging
import os
import sys
import threading
import time

ENV = "NNHAL_LOG"
LEVELS = ("debug", "info", "warning", "error", "critical")
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
#: The loggers nnhal's code logs to ("nnhal.service", "nnhal.delegate", ...).
LOGGER = "nnhal"
#: A repeated message's count is logged at most this often (RepeatedMessages).
REPEAT_INTERVAL_S = 10.0


def resolve_level(flag: str | None, default: str = "warning") -> str:
    """The level to use: the flag, else $NNHAL_LOG, else ``default``. A bad value is a one-line
    ValueError naming where it came from."""
    for source, value in (("--log-level", flag), (f"${ENV}", os.environ.get(ENV))):
        if value:
            name = value.strip().lower()
            if name not in LEVELS:
                raise ValueError(f"{source}: unknown level {value!r} (use {', '.join(LEVELS)})")
            return name
    return default


def configure_logging(level: str | None, default: str = "warning") -> str:
    """For a command-line tool (it owns the process): the root logger to stderr at the resolved
    level, so library messages (grpc, numba) follow the same flag. Returns the level name."""
    name = resolve_level(level, default)
    logging.basicConfig(level=getattr(logging, name.upper()), format=FORMAT, stream=sys.stderr, force=True)
    return name


def configure_library_logging() -> None:
    """For the delegate used from a Python application: honour $NNHAL_LOG on the "nnhal" logger
    only, and only if the application has not configured logging itself (its root logger, its
    "nnhal" logger): an application's own configuration always wins. A bad value: ignored."""
    value = os.environ.get(ENV)
    nnhal_log = logging.getLogger(LOGGER)
    if not value or logging.getLogger().handlers or nnhal_log.handlers:
        return
    try:
        name = resolve_level(value)
    except ValueError as e:
        print(f"nnhal: {e}; ignored", file=sys.stderr)
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(FORMAT))
    nnhal_log.addHandler(handler)
    nnhal_log.setLevel(getattr(logging, name.upper()))
    nnhal_log.propagate = False  # its handler is the only one: no second copy if the app configures root later


def add_log_level_argument(p) -> None:
    p.add_argument("--log-level", default=None, metavar="LEVEL",
                   help=f"{', '.join(LEVELS)} (default ${ENV}, else warning; serve: info)")


class RepeatedMessages:
    """Log a message that may come on every call (a node failing on each invoke while the service
    is gone): the first time as it is; its repeats only as a count, at most once per
    ``interval_s``, when another message comes, and at flush() (its owner's end, or exit).
    Thousands of identical lines a second would bury everything else."""

    def __init__(self, logger: logging.Logger, level: int = logging.ERROR,
                 interval_s: float = REPEAT_INTERVAL_S):
        self.logger, self.level, self.interval_s = logger, level, interval_s
        self._lock = threading.Lock()
        self._last: str | None = None
        self._repeats = 0  # of _last, not logged yet
        self._said_at = 0.0  # when _last or its count was last logged

    def log(self, message: str) -> None:
        with self._lock:
            now = time.monotonic()
            if message == self._last:
                self._repeats += 1
                if now - self._said_at >= self.interval_s:
                    self._say_repeats(now)
                return
            self._say_repeats(now)
            self._last, self._said_at = message, now
            self.logger.log(self.level, "%s", message)

    def flush(self) -> None:
        """Log the count of repeats not said yet."""
        with self._lock:
            self._say_repeats(time.monotonic())

    def _say_repeats(self, now: float) -> None:
        if self._repeats:
            lines = self._last.splitlines() or [""]
            gist = lines[0] if len(lines) == 1 else f"{lines[0]} ... {lines[-1].strip()}"  # a traceback's ends
            self.logger.log(self.level, "%s (repeated %d more %s)", gist, self._repeats,
                            "time" if self._repeats == 1 else "times")
            self._repeats, self._said_at = 0, now
