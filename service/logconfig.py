"""One logging convention for the service, the delegate and the tools: ``--log-level``, else
$NNHAL_LOG, else a default; one format; everything on stderr."""
from __future__ import annotations

import logging
import os
import sys

ENV = "NNHAL_LOG"
LEVELS = ("debug", "info", "warning", "error", "critical")
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
#: The loggers nnhal's code logs to ("nnhal.service", "nnhal.delegate", ...).
LOGGER = "nnhal"


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
