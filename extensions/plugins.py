"""Plugin discovery: the installed vendor extensions, found by entry point, and nnhal's own.

A vendor package exposes its :class:`extensions.registry.Extension` under the entry-point group
``nnhal.extensions``; ``nnhal serve`` and the delegate load every installed one once per process.
"""
from __future__ import annotations

import importlib
import logging
import threading
from dataclasses import dataclass
from importlib import metadata

from extensions import tflite_compat
from extensions.registry import Extension, register

log = logging.getLogger("nnhal.extensions")

ENTRY_POINT_GROUP = "nnhal.extensions"

_lock = threading.Lock()
_plugin_results: list["PluginLoad"] = []


@dataclass
class PluginLoad:
    """What happened to one entry point: loaded, or why not."""

    entry_point: str
    extension: str | None = None
    error: str | None = None




def load_object(spec: str) -> Extension:
    """``package.module:attribute`` -> a registered Extension (attribute may be a factory)."""
    module_name, _, attr = spec.partition(":")
    obj = importlib.import_module(module_name)
    for part in (attr or "EXTENSION").split("."):
        obj = getattr(obj, part)
    if callable(obj) and not isinstance(obj, Extension):
        obj = obj()
    register(obj)
    return obj


def load_plugins(entry_points=None) -> list[PluginLoad]:
    """Load every ``nnhal.extensions`` entry point. A broken plugin is reported, never fatal.
    nnhal's own extension (extensions.tflite_compat: TFLite semantics NNAPI lacks) comes first."""
    tflite_compat.ensure_registered()
    if entry_points is None:
        entry_points = metadata.entry_points(group=ENTRY_POINT_GROUP)
    results = []
    for ep in entry_points:
        label = f"{ep.name} = {ep.value}"
        try:
            obj = ep.load()
            if callable(obj) and not isinstance(obj, Extension):
                obj = obj()
            register(obj)
            results.append(PluginLoad(label, extension=obj.name))
        except Exception as e:  # noqa: BLE001 - a vendor's bug must not take nnhal down
            log.warning("extension plugin %s skipped: %r", label, e)
            results.append(PluginLoad(label, error=f"{type(e).__name__}: {e}"))
    with _lock:
        _plugin_results[:] = results
    return results


def plugin_results() -> list[PluginLoad]:
    with _lock:
        return list(_plugin_results)


_plugins_loaded = False


def ensure_plugins_loaded() -> None:
    """Load the installed plugins once per process (the delegate and the service call this)."""
    global _plugins_loaded
    with _lock:
        if _plugins_loaded:
            return
        _plugins_loaded = True
    load_plugins()
