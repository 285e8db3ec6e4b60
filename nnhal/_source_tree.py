"""In a source checkout: ``nnhal.hal``, ``nnhal.service``, ... are the top-level folders.

The wheel ships hal/ as nnhal/hal/ & co. (build_support/nnhal_namespace.py), so applications and
extension packages import ``nnhal.delegate``, ``nnhal.extensions``, ``nnhal.hal.errors``. In the
source tree those folders stay at the top level and import each other as ``hal``, ``delegate``...;
this finder makes ``nnhal.<folder>[.x]`` the *same module objects* as ``<folder>[.x]`` (never a
second copy: one registry, one HalError class, one set of backends). Not shipped in the wheel.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys

MAPPED = ("hal", "service", "delegate", "extensions", "cache")
_PREFIX = "nnhal."


class _AliasLoader(importlib.abc.Loader):
    """Hands the import system the module already imported under its real name."""

    def __init__(self, real: str, real_spec):
        self.real, self.real_spec = real, real_spec

    def create_module(self, spec):
        return sys.modules[self.real]

    def exec_module(self, module):
        # The import system has just set __spec__ to the alias's spec: give the module its own
        # back (relative imports, importlib.reload and pickling go by it).
        module.__spec__ = self.real_spec


class _AliasFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith(_PREFIX) or fullname[len(_PREFIX):].split(".")[0] not in MAPPED:
            return None
        real = fullname[len(_PREFIX):]
        try:
            module = importlib.import_module(real)
        except ModuleNotFoundError as e:
            if e.name == real:
                return None  # "No module named 'nnhal.hal.x'", as for any missing module
            raise
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(real, module.__spec__),
                                              is_package=hasattr(module, "__path__"))


def install() -> None:
    """Put the aliases first on sys.meta_path (before setuptools' editable finder, which would
    load a second copy of hal/ under the name nnhal.hal)."""
    if not any(isinstance(f, _AliasFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _AliasFinder())
