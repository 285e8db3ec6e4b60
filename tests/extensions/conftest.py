"""The in-tree example extensions, usable whether or not `make setup` installed them.

Tests install nothing: when the example packages are not installed, their source directories
go on sys.path (and on the server's PYTHONPATH) and they are registered / passed to
`nnhal serve --extension` explicitly. Exactly one test checks the installed packages."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "extensions" / "examples"
EXAMPLE_DIRS = [str(p.parent) for p in sorted(EXAMPLES.glob("*/pyproject.toml"))]
EXAMPLE_OBJECTS = ["nnhal_example_fibonacci:EXTENSION", "nnhal_example_maxpool_argmax:EXTENSION"]

for d in EXAMPLE_DIRS:
    if d not in sys.path:
        sys.path.append(d)  # after site-packages: an installed copy wins


@pytest.fixture(autouse=True)
def example_extensions():
    """Register both examples in this process (the delegate and hal see them)."""
    from extensions.plugins import load_object
    for spec in EXAMPLE_OBJECTS:
        load_object(spec)


@pytest.fixture
def ext_server(tmp_path, monkeypatch):
    """`nnhal serve` loading the examples explicitly (`--extension`), installed or not."""
    from tests.service.conftest import ServerProcess
    path = os.pathsep.join(EXAMPLE_DIRS + [os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    monkeypatch.setenv("PYTHONPATH", path)
    args = [a for spec in EXAMPLE_OBJECTS for a in ("--extension", spec)]
    s = ServerProcess(tmp_path, *args)
    yield s
    s.stop()
