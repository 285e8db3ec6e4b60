"""The wheel: only the ``nnhal`` import namespace, and it works outside the source tree.

Builds the wheel (and the fibonacci example extension's) from a copy of the sources, installs
them with --no-deps into a fresh venv whose third-party packages come from the project's .venv
through a .pth line (a .pth line adds a directory but does not run the .pth files inside it, so
the project's own editable install stays invisible: checked), then from a directory outside the
source tree runs a model through ``nnhal.delegate.load_delegate`` with an embedded service and
compares it with TFLite's reference kernels. ``-m 'not wheel'`` deselects it.
"""
from __future__ import annotations

import ast
import fcntl
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import zipfile
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.wheel

ROOT = Path(__file__).resolve().parents[1]
#: What a build reads: the packaging files and the packages (incl. the generated protobuf code).
SOURCES = ("setup.py", "pyproject.toml", "README.md", "build_support",
           "nnhal", "hal", "service", "delegate", "extensions", "cache")
MAPPED = ("hal", "service", "delegate", "extensions", "cache")
_IGNORE = shutil.ignore_patterns("__pycache__", "*.egg-info", "build", "dist", "tests")


def _run(*args, cwd=None, env=None, timeout=300) -> subprocess.CompletedProcess:
    r = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"{' '.join(map(str, args))} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}"
    return r


def _build(src: Path, out: Path) -> Path:
    _run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", out, src)
    (wheel,) = out.glob("*.whl")  # out is this build's own directory
    return wheel


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(the nnhal wheel, the fresh venv's python, a working directory outside the source tree).
    Built once per session: pytest-xdist workers share it (under a lock) instead of each building."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # the session's directory, shared by the workers
    tmp = base / "wheel-install"
    with open(base / "wheel-install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (tmp / "done").exists():
            shutil.rmtree(tmp, ignore_errors=True)
            _install(tmp)
            (tmp / "done").touch()
    return next((tmp / "dist").glob("*.whl")), tmp / "venv" / "bin" / "python", tmp / "elsewhere"


def _install(tmp: Path) -> None:
    src = tmp / "src"
    src.mkdir(parents=True)
    for name in SOURCES:  # a copy: the build's build/ and egg-info stay out of the working tree
        p = ROOT / name
        if p.is_dir():
            shutil.copytree(p, src / name, ignore=_IGNORE)
        else:
            shutil.copy2(p, src / name)
    wheel = _build(src, tmp / "dist")
    examples = []  # the example extensions: each its own distribution
    for project in sorted((ROOT / "extensions" / "examples").glob("*/pyproject.toml")):
        copy = tmp / "examples" / project.parent.name
        shutil.copytree(project.parent, copy, ignore=_IGNORE)
        examples.append(_build(copy, tmp / f"dist-{project.parent.name}"))

    venv = tmp / "venv"
    _run(sys.executable, "-m", "venv", "--without-pip", venv)
    python = venv / "bin" / "python"
    site = Path(_run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip())
    (site / "project_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _run(sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", "--no-index",
         wheel, *examples)
    (tmp / "elsewhere").mkdir()
    (tmp / "run").mkdir()


def _env(work: Path) -> dict:
    """Children's environment. The installed copy's numba kernels are new files to numba's cache
    (keyed by path and mtime): compiling them costs ~20 s of CPU, minutes on a loaded machine, and
    says nothing about packaging. So numba runs uncompiled (the backend still imports and
    registers from the wheel) and the model runs on the reference backend, the oracle that is
    bit-exact with TFLite's reference kernels."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSAFEPATH")}
    # (both beside the working directory, not in it: `python -c` imports from there)
    env["XDG_RUNTIME_DIR"] = str(work.parent / "run")  # no default socket: the delegate starts a service
    env["XDG_CACHE_HOME"] = str(work.parent / "xdg-cache")  # the service's compilation cache: not the user's
    env["NUMBA_DISABLE_JIT"] = "1"
    env["NNHAL_BACKENDS"] = "reference"
    env["NNHAL_LOG"] = "warning"
    return env


def test_wheel_holds_only_the_nnhal_namespace(installed):
    wheel, _, _ = installed
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert tops == {"nnhal", "nnhal-0.1.0.dist-info"}, tops
    assert all(n.endswith(".py") for n in names if n.startswith("nnhal/")), "code only"
    for generated in ("nnhal/service/proto/nnhal_pb2.py", "nnhal/service/proto/nnhal_pb2_grpc.py"):
        assert generated in names
    for top in MAPPED:
        assert f"nnhal/{top}/__init__.py" in names
    assert "nnhal/_source_tree.py" not in names  # the source checkout's aliases
    assert not any("/examples/" in n or "mediapipe" in n for n in names), "extensions are their own wheels"
    z = zipfile.ZipFile(wheel)
    assert z.read("nnhal-0.1.0.dist-info/top_level.txt").decode().split() == ["nnhal"]
    eps = z.read("nnhal-0.1.0.dist-info/entry_points.txt").decode()
    assert "nnhal = nnhal.cli:main" in eps and "inference_diff = nnhal.inference_diff:main" in eps
    # no absolute import of a mapped folder survives the build's rewrite
    for n in names:
        if n.endswith(".py"):
            for node in ast.walk(ast.parse(z.read(n), n)):
                if isinstance(node, ast.Import):
                    modules = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0:
                    modules = [node.module]
                else:
                    continue
                assert not any(m.split(".")[0] in MAPPED for m in modules), f"{n}:{node.lineno}: {modules}"


_ISOLATION = """
import importlib.util, json, sys
import nnhal
from nnhal.hal import backends
from nnhal.hal.serialize import _in_core, _known_modules
backends.ensure_loaded()
print(json.dumps({
    "nnhal": nnhal.__file__,
    "top_level": {n: bool(importlib.util.find_spec(n)) for n in %r},
    "finders": [type(f).__module__ for f in sys.meta_path],
    "path": sys.path,
    # what backend identities hash (cache validity): every file found, under the installed nnhal
    "backend_files": {b.name: [p for _, p in b.source_files()] for b in backends.available()},
    "known_modules": sorted(_known_modules()),
    "in_core": _in_core("nnhal.hal.types") and not _in_core("nnhal.hal.backends.reference"),
}))
"""


def test_fresh_venv_sees_the_wheel_not_the_source_tree(installed):
    _, python, work = installed
    r = _run(python, "-c", _ISOLATION % (MAPPED,), cwd=work, env=_env(work))
    info = json.loads(r.stdout)
    assert info["nnhal"].startswith(str(python.parents[1])), info["nnhal"]
    assert not any(info["top_level"].values()), info["top_level"]
    assert not any("editable" in f for f in info["finders"]), info["finders"]  # .venv's .pth files did not run
    assert not any(p.rstrip("/") == str(ROOT) for p in info["path"])
    installed_pkg = str(Path(info["nnhal"]).parent)
    assert set(info["backend_files"]) >= {"reference", "numba", "onnxruntime"}, info["backend_files"]
    for name, paths in info["backend_files"].items():
        assert paths and all(p and p.startswith(installed_pkg) for p in paths), (name, paths)
    assert info["known_modules"] and all(m.startswith("nnhal.hal.") for m in info["known_modules"])
    assert info["in_core"]


def test_console_scripts_run(installed):
    _, python, work = installed
    for script in ("nnhal", "inference_diff"):
        r = _run(python.parent / script, "--help", cwd=work, env=_env(work))
        assert "usage" in r.stdout.lower()
    # the example extensions' own wheels, found through their entry points (group nnhal.extensions)
    r = _run(python.parent / "nnhal", "extensions", "--json", cwd=work, env=_env(work))
    loaded = {e["name"] for e in json.loads(r.stdout)["extensions"]}
    assert {"com.example.fibonacci", "com.nnhal.maxpool_argmax"} <= loaded, r.stdout


_RUN_MODEL = """
import json, sys
import numpy as np
from nnhal.delegate.runtime import Interpreter, OpResolverType
from nnhal.delegate import load_delegate
import nnhal.delegate.embedded as embedded

model, inputs = sys.argv[1], np.load(sys.argv[2])
def run(delegates):
    it = Interpreter(model_path=model, experimental_delegates=delegates,
                     experimental_op_resolver_type=OpResolverType.BUILTIN_REF)
    it.allocate_tensors()
    for i, d in enumerate(it.get_input_details()):
        it.set_tensor(d["index"], inputs[f"arr_{i}"])
    it.invoke()
    return it, [it.get_tensor(d["index"]).copy() for d in it.get_output_details()]
d = load_delegate()
it, got = run([d])
partitions = len(d.impl.kernels)  # while its interpreter lives
_, want = run(None)
child = embedded._child
cmdline = open(f"/proc/{child.pid}/cmdline", "rb").read().split(b"\\0")
print(json.dumps({"partitions": partitions, "error": d.last_error,
                  "child_python": cmdline[0].decode(), "child_module": cmdline[2].decode(),
                  "equal": all(g.dtype == w.dtype and g.shape == w.shape and (g == w).all()
                               for g, w in zip(got, want)),
                  "got": [g.tolist() for g in got], "want": [w.tolist() for w in want]}))
"""


def test_model_through_the_installed_delegate_matches_tflite(installed):
    """An int8 model (ADD, AVERAGE_POOL_2D, RESHAPE, FULLY_CONNECTED, SOFTMAX) through the
    wheel's delegate and a service it starts itself (``python -m nnhal.cli serve`` from the
    wheel), bit-exact with TFLite's reference kernels."""
    from tests.delegate.models import head_model
    _, python, work = installed
    model = work / "head_int8.tflite"
    model.write_bytes(head_model(np.int8))
    rng = np.random.default_rng(7)
    inputs = work / "inputs.npz"
    np.savez(inputs, rng.integers(-128, 128, (1, 4, 4, 8)).astype(np.int8),
             rng.integers(-128, 128, (1, 4, 4, 8)).astype(np.int8))
    r = _run(python, "-c", textwrap.dedent(_RUN_MODEL), model, inputs, cwd=work, env=_env(work), timeout=240)
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["partitions"] >= 1 and out["error"] in (None, ""), out
    assert out["child_python"] == str(python) and out["child_module"] == "nnhal.cli", out
    assert out["equal"], (out["got"], out["want"])
