"""The wheel's dependency ranges are the tested ones: every version either lock file pins satisfies
what pyproject.toml asks (the base dependencies, and the tflite-runtime extra for its lock)."""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _pins(lock: str) -> dict[str, str]:
    pins = {}
    for line in (ROOT / lock).read_text().splitlines():
        m = re.fullmatch(r"([A-Za-z0-9_.\-]+)==(\S+)", line.strip())
        if m:
            pins[canonicalize_name(m.group(1))] = m.group(2)
    return pins


@pytest.mark.parametrize("lock, extras", [("requirements.lock", []),
                                          ("requirements-tflite-runtime.lock", ["tflite-runtime"])])
def test_each_lock_satisfies_the_wheels_requirements(lock, extras):
    pins = _pins(lock)
    wanted = [Requirement(r) for r in PROJECT["dependencies"]]
    wanted += [Requirement(r) for e in extras for r in PROJECT["optional-dependencies"][e]]
    checked, unmet = 0, []
    for req in wanted:
        name = canonicalize_name(req.name)
        if name == "ai-edge-litert" and lock != "requirements.lock":
            continue  # the tflite-runtime venv runs without LiteRT (the extra adds, never removes)
        assert name in pins, f"{lock} does not pin {req.name}, a dependency of the wheel"
        checked += 1
        if not req.specifier.contains(pins[name], prereleases=True):
            unmet.append(f"{req.name}=={pins[name]} not in {req.specifier}")
    assert checked and not unmet, unmet


def test_the_cuda_lock_satisfies_the_cuda_extra():
    """requirements-cuda.lock (what `make setup` adds where a GPU is, or NNHAL_CUDA=1) pins what
    ``nnhal[cuda]`` asks for."""
    pins = _pins("requirements-cuda.lock")
    for r in PROJECT["optional-dependencies"]["cuda"]:
        req = Requirement(r)
        name = canonicalize_name(req.name)
        assert name in pins and req.specifier.contains(pins[name]), f"{r}: {pins.get(name)}"


def test_the_default_lock_is_litert():
    assert "ai-edge-litert" in _pins("requirements.lock") and "tflite-runtime" not in _pins("requirements.lock")


def test_make_setup_installs_the_mediapipe_extension():
    """`make setup` installs extensions/mediapipe (editable) beside nnhal: its entry point is there,
    so MediaPipe's custom-op models run after the README's two commands."""
    from importlib.metadata import distribution
    dist = distribution("nnhal-mediapipe")
    points = {ep.name: ep.value for ep in dist.entry_points if ep.group == "nnhal.extensions"}
    assert points == {"com.google.mediapipe": "nnhal_mediapipe:EXTENSION"}
    makefile = (ROOT / "Makefile").read_text()
    assert "-e extensions/mediapipe" in makefile and "extensions/mediapipe" in makefile.split("wheel:", 1)[0]
