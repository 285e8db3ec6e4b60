"""`nnhal benchmark` and `nnhal inference-diff` on models with MediaPipe's custom ops (issue 33,
item 2): the delegated run is measured and compared although TFLite alone cannot run the model; the
reference runs the custom ops on nnhal's reference backend (nnhal.reference); and an unresolved
custom op says what would run it, the pip command included when the extension is not installed.

The tools run as real processes against a real service (started here, or the embedded one they
start), finding the extension the way an installed one is found (conftest's dist-info).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest
from nnhal_mediapipe import EXTENSION
from test_mediapipe_transforms import (
    BILINEAR,
    L2TM,
    L2TM_OPTIONS,
    LANDMARKS,
    face_crop_model,
    face_crop_reference,
    flex_options,
    random_landmarks,
)
from test_mediapipe_transpose_conv_bias import CODE, decoder_models, decoder_reference

from delegate import embedded
from delegate.runtime import Interpreter, OpResolverType
from delegate.tfl import TfLiteModelBuilder
from extensions.registry import INSTALLABLE, installable_for
from nnhal.reference import reference_interpreter
from tests.harness import assert_float_close

PACKAGE_DIR = Path(__file__).resolve().parents[1]
REPO = PACKAGE_DIR.parents[1]


def crop_between_builtins_model() -> bytes:
    """MediaPipe's crop step between builtin ops, nodes in this order: 0 MUL (image * 0.5),
    1 Landmarks2TransformMatrix, 2 TransformTensorBilinear, 3 LOGISTIC of the crop, 4 TransformLandmarks.
    Outputs: the matrix, the activated crop, the moved landmarks."""
    o = L2TM_OPTIONS
    b = TfLiteModelBuilder()
    lm = b.add_input("landmarks", [1, 6, 3])
    img = b.add_input("image", [1, 8, 7, 2])
    scaled = b.add_tensor("scaled", [1, 8, 7, 2])
    b.add_operator("MUL", [img, b.add_constant("half", np.array([0.5], np.float32))], [scaled],
                   ("MulOptions", {"fused_activation_function": 0}))
    mat = b.add_tensor("matrix", [1, 4, 4])
    b.add_operator("CUSTOM", [lm], [mat], custom_code=L2TM, custom_options=flex_options(**o), version=2)
    crop = b.add_tensor("crop", [1, o["output_height"], o["output_width"], 2])
    b.add_operator("CUSTOM", [scaled, mat], [crop], custom_code=BILINEAR, version=2)
    active = b.add_tensor("active", [1, o["output_height"], o["output_width"], 2])
    b.add_operator("LOGISTIC", [crop], [active])
    moved = b.add_tensor("moved", [1, 6, 3])
    b.add_operator("CUSTOM", [lm, mat], [moved], custom_code=LANDMARKS, version=2)
    b.set_outputs([mat, active, moved])
    return b.build()


CUSTOM_NODES = [1, 2, 4]


def _tool(env, *args):
    return subprocess.run([sys.executable, "-m", "nnhal.cli", *args], capture_output=True, text=True, timeout=300,
                          env=env)


def _embedded_env(env: dict, tmp_path) -> dict:
    """No service at the default socket: the tools start the embedded one (its cache in tmp_path)."""
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    env = {**env, "XDG_RUNTIME_DIR": str(run), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    try:  # the numba kernels from this machine's warm cache: a cold compile is not under test
        from hal.backends.numba_kernels import cache_dir
        env["NNHAL_NUMBA_CACHE_DIR"] = str(cache_dir())
    except ImportError:
        pass
    return env


# ---- the reference itself ------------------------------------------------------------------------

def test_reference_runs_only_the_custom_ops_on_the_reference_service(tmp_path, discovery_env):
    """The reference interpreter gives the oracle the nodes TFLite has no kernel for, and those
    compute what the independent numpy references of the extension's tests compute."""
    model = face_crop_model()

    def build(oracle):
        it = Interpreter(model_content=model, experimental_delegates=oracle)
        it.allocate_tensors()
        return it
    ref = reference_interpreter_of(tmp_path, model, build)
    assert ref.oracle_nodes == [0, 1, 2] and sorted(ref.oracle_codes) == sorted([L2TM, BILINEAR, LANDMARKS])
    assert "nnhal-reference-" in ref.oracle.report.service
    cmdline = open(f"/proc/{embedded._reference.pid}/cmdline", "rb").read().split(b"\0")
    assert b"--backend" in cmdline and cmdline[cmdline.index(b"--backend") + 1] == b"reference"
    assert b"--no-cache" in cmdline
    it, rng = ref.interpreter, np.random.default_rng(5)
    names = {d["name"]: d["index"] for d in it.get_input_details()}
    lm, img = random_landmarks(rng, 6), rng.standard_normal((1, 8, 7, 2)).astype(np.float32)
    it.set_tensor(names["landmarks"], lm)
    it.set_tensor(names["image"], img)
    it.invoke()
    for d, want in zip(it.get_output_details(), face_crop_reference(lm, img)):
        assert_float_close(it.get_tensor(d["index"]), want, atol=1e-5 * max(1.0, float(np.abs(want).max())))


def test_reference_keeps_tflite_kernels_where_tflite_has_them(tmp_path, discovery_env):
    """With TFLite's reference kernels (no Convolution2DTransposeBias among them) only that node goes
    to the oracle: CONV_2D and LOGISTIC stay TFLite's, and the whole matches the numpy reference."""
    conv_only, model, up = decoder_models()

    def build(oracle):
        it = Interpreter(model_content=model, experimental_delegates=oracle,
                         experimental_op_resolver_type=OpResolverType.BUILTIN_REF)
        it.allocate_tensors()
        return it
    ref = reference_interpreter_of(tmp_path, model, build)
    assert ref.oracle_nodes == [1] and ref.oracle_codes == [CODE]
    x = np.random.default_rng(2).standard_normal((1, 6, 4, 3)).astype(np.float32)
    it = ref.interpreter
    it.set_tensor(it.get_input_details()[0]["index"], x)
    it.invoke()
    assert_float_close(it.get_tensor(it.get_output_details()[0]["index"]), decoder_reference(conv_only, up, x))


def reference_interpreter_of(tmp_path, model: bytes, build):
    """nnhal.reference reads the model from a file, as the tools have it."""
    path = tmp_path / "model.tflite"
    path.write_bytes(model)
    return reference_interpreter(str(path), build)


# ---- the tools, as processes --------------------------------------------------------------------

@pytest.mark.parametrize("service", ["embedded", "service_address"])
def test_benchmark_and_inference_diff_run_the_custom_op_model(tmp_path, discovery_env, service):
    path = tmp_path / "crop.tflite"
    path.write_bytes(crop_between_builtins_model())
    if service == "embedded":
        env, address, server = _embedded_env(discovery_env, tmp_path), [], None
    else:
        from tests.service.conftest import ServerProcess
        env, server = discovery_env, ServerProcess(tmp_path)
        address = ["--service_address", server.address]
    ranges = ["--input_layer_value_range", "landmarks,0,8"]  # pixel coordinates, as the face mesh gives
    try:
        bench = _tool(env, "benchmark", "--graph", str(path), "--num_runs", "2", "--warmup_runs", "1",
                      "--min_secs", "0", "--enable_op_profiling", *ranges, *address)
        out = tmp_path / "diff.json"
        diff = _tool(env, "inference-diff", "--model_file", str(path), "--num_runs", "3", "--output_file_path",
                     str(out), *ranges, *address)
    finally:
        if server is not None:
            server.stop()
    assert bench.returncode == 0, bench.stderr
    rows = {line[:16].strip(): line[16:] for line in bench.stdout.splitlines()
            if line.startswith(("TFLite CPU", "TFLite + nnhal"))}
    cpu = rows["TFLite CPU"]
    assert cpu.startswith("not available: TFLite has no kernel for custom op '") and "com.google.mediapipe" in cpu, cpu
    mean, std, p50, p90 = map(float, rows["TFLite + nnhal"].split())
    assert mean > 0 and p90 >= p50 > 0
    assert "ratio nnhal/CPU (mean): n/a   delegated 5/5 nodes in 1 partition(s)" in bench.stdout
    by_backend = bench.stdout.split("by backend:")[1]
    assert "com.google.mediapipe" in by_backend  # the custom ops were timed on the service

    assert diff.returncode == 0, diff.stderr
    m = json.loads(out.read_text())
    assert m["delegation"]["delegated_nodes"] == m["delegation"]["total_nodes"] == 5
    assert m["reference"] == {"oracle_nodes": CUSTOM_NODES, "oracle_custom_ops": m["reference"]["oracle_custom_ops"]}
    assert sorted(m["reference"]["oracle_custom_ops"]) == sorted([L2TM, BILINEAR, LANDMARKS])
    matrix, active, moved = m["output_errors"]
    # The custom ops run the extension's kernel on both sides, fed the same values: equal.
    assert matrix["max_abs_error"] == moved["max_abs_error"] == 0.0, m["output_errors"]
    # LOGISTIC is TFLite's on the reference side, the service's backend on the other: within
    # tests.harness.assert_float_close's criterion (1e-5 relative plus 1e-6 absolute; |sigmoid| <= 1).
    assert active["max_abs_error"] <= 1e-5 + 1e-6, active
    assert "Reference: TFLite's kernels, and nnhal's reference backend for node(s) 1,2,4" in diff.stdout


# ---- what an unresolved custom op says ---------------------------------------------------------

def _two_custom_ops_model() -> bytes:
    """Landmarks2TransformMatrix (the MediaPipe extension's) and a code no extension has."""
    b = TfLiteModelBuilder()
    lm = b.add_input("landmarks", [1, 6, 3])
    mat = b.add_tensor("matrix", [1, 4, 4])
    b.add_operator("CUSTOM", [lm], [mat], custom_code=L2TM, custom_options=flex_options(**L2TM_OPTIONS), version=2)
    out = b.add_tensor("out", [1, 4, 4])
    b.add_operator("CUSTOM", [mat], [out], custom_code="NobodysOp")
    b.set_outputs([out])
    return b.build()


def _hidden_env(tmp_path) -> dict:
    """The extension not installed, even where it is: a dist-info of the same name without the
    entry point, first on the path (importlib.metadata takes the first distribution of a name)."""
    project = tomllib.loads((PACKAGE_DIR / "pyproject.toml").read_text())["project"]
    site = tmp_path / "hidden"
    dist = site / f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO)])}


@pytest.mark.parametrize("installed", [True, False], ids=["installed", "not-installed"])
def test_unresolved_custom_op_says_what_runs_it(tmp_path, discovery_env, installed):
    path = tmp_path / "two.tflite"
    path.write_bytes(_two_custom_ops_model())
    env = discovery_env if installed else _hidden_env(tmp_path)
    r = _tool(env, "report", "--model_file", str(path), "--service_address", "unix:" + str(tmp_path / "nobody.sock"))
    assert r.returncode == 2
    (line,) = [x for x in r.stderr.splitlines() if x.startswith("nnhal report: cannot load")]
    assert "unresolved custom op" in line and "Traceback" not in r.stderr
    assert "custom op 'NobodysOp': no installed nnhal extension implements it" in line
    if installed:
        assert (f"custom op '{L2TM}' is provided by extension com.google.mediapipe (installed): TFLite has no "
                f"kernel for it, the nnhal delegate runs it on an nnhal service") in line, line
    else:
        pip = installable_for(L2TM).pip_command()
        assert pip.startswith("pip install 'nnhal[mediapipe]' (the nnhal-mediapipe distribution)")
        assert f"custom op '{L2TM}' is provided by extension com.google.mediapipe, not installed: {pip}" in line, line


def test_the_table_of_installable_extensions_matches_the_extension():
    """nnhal's entry for the MediaPipe extension (what a model needing it is told to install) names
    every custom code the extension implements, its distribution, and nnhal's extra installing it."""
    (entry,) = [i for i in INSTALLABLE if i.extension == EXTENSION.name]
    assert sorted(entry.custom_codes) == sorted(c for op in EXTENSION.operations for c in op.custom_codes)
    assert entry.distribution == tomllib.loads((PACKAGE_DIR / "pyproject.toml").read_text())["project"]["name"]
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(dep.startswith(entry.distribution) for dep in extras[entry.extra])
    assert (REPO / "extensions" / entry.source).resolve() == PACKAGE_DIR
