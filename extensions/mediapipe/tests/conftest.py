"""The com.google.mediapipe extension, usable whether or not it is installed.

As tests/extensions/conftest.py does for the examples, tests install nothing: the package's source
directory goes on sys.path (after site-packages: an installed copy wins) and the extension is
registered in this process. Services and tools started in subprocesses discover it the way an
installed package is discovered: through an ``nnhal.extensions`` entry point, here in a temporary
``*.dist-info`` written from this package's own pyproject.toml.
"""
from __future__ import annotations

import os
import sys
import tomllib
from pathlib import Path

import pytest
from hypothesis import settings

# tests/conftest.py's hypothesis profiles (a fixed sequence in CI), also when this directory runs alone
settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("dev", print_blob=True)
settings.load_profile("ci" if os.environ.get("CI") else "dev")

PACKAGE_DIR = Path(__file__).resolve().parents[1]
if str(PACKAGE_DIR) not in sys.path:
    sys.path.append(str(PACKAGE_DIR))


@pytest.fixture(autouse=True)
def mediapipe_extension():
    from extensions.plugins import load_object
    return load_object("nnhal_mediapipe:EXTENSION")


def write_dist_info(site: Path) -> None:
    """An 'installed' distribution: METADATA + entry_points.txt taken from pyproject.toml."""
    project = tomllib.loads((PACKAGE_DIR / "pyproject.toml").read_text())["project"]
    dist = site / f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
    lines = [f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items())
             for group, eps in project["entry-points"].items()]
    (dist / "entry_points.txt").write_text("\n".join(lines))


@pytest.fixture
def dist_info(tmp_path) -> Path:
    """A directory holding the package's dist-info (put it on sys.path to 'install' the entry point)."""
    site = tmp_path / "dist-info-site"
    write_dist_info(site)
    return site


@pytest.fixture
def discovery_env(tmp_path, monkeypatch):
    """PYTHONPATH for subprocesses: the package sources and a dist-info naming its entry point."""
    site = tmp_path / "site"
    write_dist_info(site)
    path = os.pathsep.join([str(site), str(PACKAGE_DIR), os.getcwd(), os.environ.get("PYTHONPATH", "")])
    monkeypatch.setenv("PYTHONPATH", path.rstrip(os.pathsep))
    return dict(os.environ)


@pytest.fixture
def mp_server(tmp_path, discovery_env):
    """`nnhal serve` that finds the extension through its entry point (no --extension)."""
    from tests.service.conftest import ServerProcess
    s = ServerProcess(tmp_path)
    yield s
    s.stop()
