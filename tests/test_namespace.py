"""The nnhal namespace: the build's import rewrite (build_support/nnhal_namespace.py) and the
source tree's aliases (nnhal/_source_tree.py). The built wheel itself: tests/test_wheel.py."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "build_support"))
from nnhal_namespace import Rewriter, source_packages, wheel_layout  # noqa: E402

sys.path.remove(str(ROOT / "build_support"))


@pytest.fixture
def rewrite():
    return Rewriter(ROOT).rewrite


@pytest.mark.parametrize("before, after", [
    ("from hal.errors import HalError\n", "from nnhal.hal.errors import HalError\n"),
    ("from hal import backends\n", "from nnhal.hal import backends\n"),
    ("from service.client import (\n    Client,\n)\n", "from nnhal.service.client import (\n    Client,\n)\n"),
    ("import hal\n", "from nnhal import hal\n"),
    ("import hal.operations  # noqa: F401\n", 'hal = __import__("nnhal.hal.operations").hal  # noqa: F401\n'),
    ("import delegate.tfl as tfl\n", "import nnhal.delegate.tfl as tfl\n"),
    ("import os, cache\n", "import os; from nnhal import cache\n"),
    ("def f():\n    import delegate.mapping\n",
     'def f():\n    delegate = __import__("nnhal.delegate.mapping").delegate\n'),
    # module paths as strings: import_module names, backend module lists, prefixes, module:attr
    ('M = ("hal.backends.reference", "hal.backends.ort")\n',
     'M = ("nnhal.hal.backends.reference", "nnhal.hal.backends.ort")\n'),
    ('P = "hal."\n', 'P = "nnhal.hal."\n'),
    ("n = f'hal.operations.{m}'\n", "n = f'nnhal.hal.operations.{m}'\n"),
    ('x = "extensions.registry:load_object"\n', 'x = "nnhal.extensions.registry:load_object"\n'),
    # left alone: words and file names that merely look like paths, relative and foreign imports
    ('KEY = "cache.key"\nF = ("delegate", 1)\nc = "cache"\n', None),
    ('s = "hal.nonexistent"\nt = f"hal{x}"\nu = b"hal.errors"\n', None),
    ("from . import registry\nfrom .types import X\nimport numpy.linalg\nfrom halo import x\n", None),
    ('"""Docstring: from hal.errors import HalError."""\n', None),
])
def test_rewrite(rewrite, before, after):
    assert rewrite(before) == (before if after is None else after)


def test_rewrite_is_idempotent(rewrite):
    src = (ROOT / "hal" / "serialize.py").read_text()
    once = rewrite(src)
    assert once != src and rewrite(once) == once


def test_layouts():
    """The wheel: everything under nnhal; the editable install: the source tree as it is. Directories
    with their own pyproject.toml (example extensions) are in neither."""
    packages, package_dir = wheel_layout(ROOT)
    assert all(p == "nnhal" or p.startswith("nnhal.") for p in packages)
    assert {"nnhal.hal", "nnhal.hal.backends.reference", "nnhal.service.proto", "nnhal.delegate.mapping",
            "nnhal.extensions", "nnhal.cache", "nnhal.cts"} <= set(packages)
    assert package_dir["nnhal.hal"] == "hal"
    assert not any("examples" in p or "mediapipe" in p for p in packages)
    src = source_packages(ROOT)
    assert {"hal", "service", "delegate", "extensions", "cache", "nnhal"} <= set(src)
    assert len(src) == len(packages)


def test_source_tree_aliases_are_the_same_modules():
    import importlib

    import nnhal.delegate
    import nnhal.hal.errors
    import nnhal.service.proto.nnhal_pb2 as pb
    from nnhal.delegate import load_delegate
    from nnhal.extensions import Extension

    import delegate
    import extensions
    import hal.errors
    import service.proto.nnhal_pb2
    assert nnhal.hal.errors is hal.errors and nnhal.hal.errors.HalError is hal.errors.HalError
    assert load_delegate is delegate.load_delegate and Extension is extensions.Extension
    assert pb is service.proto.nnhal_pb2
    assert hal.errors.__spec__.name == "hal.errors"  # the module keeps its own spec
    assert importlib.import_module("nnhal.hal.backends.reference") is importlib.import_module("hal.backends.reference")
    with pytest.raises(ModuleNotFoundError, match="nnhal.hal.no_such_module"):
        importlib.import_module("nnhal.hal.no_such_module")
