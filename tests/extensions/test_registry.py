"""Extension registration and plugin discovery; validation of extension models; custom options."""
from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from importlib import metadata

import numpy as np
import pytest
from flatbuffers import flexbuffers

import extensions
from extensions.options import CustomOptionsError, flexbuffer_map, pack_pool_params, tflite_pool_params
from extensions.plugins import load_plugins
from extensions.registry import Extension, ExtensionOperation, OperandTypeSpec
from hal import extension_registry
from hal.compiler import compile_model
from hal.errors import HalError
from hal.executor import execute
from hal.model import ExtensionNameAndPrefix, ModelBuilder
from hal.types import OperandType, encode_extension_type


@dataclass
class _EP:  # the part of importlib.metadata.EntryPoint load_plugins uses
    name: str
    value: str
    obj: object

    def load(self):
        if isinstance(self.obj, BaseException):
            raise self.obj
        return self.obj


def _write_plugin_dist(site, *, good=True, broken=True):
    """A vendor package 'installed' into a temporary directory: module + dist-info with entry points."""
    (site / "vendor_ext_pkg.py").write_text(textwrap.dedent("""
        import numpy as np
        from extensions import Extension, ExtensionOperation, OperandTypeSpec
        EXTENSION = Extension("com.vendor.test", "3.1", operand_types=(OperandTypeSpec(0, "V_INT16", np.int16),),
                              operations=(ExtensionOperation(0, "V_OP", None, None, None, custom_codes=("VOp",)),))
        def factory():
            raise RuntimeError("vendor bug")
        """))
    dist = site / "vendor_ext_pkg-3.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: vendor-ext-pkg\nVersion: 3.1\n")
    lines = ["[nnhal.extensions]"]
    if good:
        lines.append("com.vendor.test = vendor_ext_pkg:EXTENSION")
    if broken:
        lines += ["missing = no_such_module_xyz:EXTENSION", "raises = vendor_ext_pkg:factory",
                  "wrong = vendor_ext_pkg:np"]
    (dist / "entry_points.txt").write_text("\n".join(lines) + "\n")


def test_discovery_through_a_dist_info_entry_point(tmp_path, monkeypatch):
    """Real importlib.metadata discovery; broken plugins are reported with the reason and skipped."""
    _write_plugin_dist(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        results = {r.entry_point.split(" =")[0]: r for r in load_plugins()}
        assert results["com.vendor.test"].extension == "com.vendor.test" and results["com.vendor.test"].error is None
        assert "ModuleNotFoundError" in results["missing"].error
        assert "RuntimeError: vendor bug" in results["raises"].error
        assert "expected an extensions.Extension" in results["wrong"].error
        assert extensions.lookup("com.vendor.test").version == "3.1"
        assert extensions.by_custom_code("VOp")[0].name == "com.vendor.test"
        assert extension_registry.extension("com.vendor.test").operand_types[0].dtype == np.int16
    finally:
        extensions.unregister("com.vendor.test")
        sys.modules.pop("vendor_ext_pkg", None)


def test_extensions_cli_lists_loaded_and_failed_plugins(tmp_path):
    _write_plugin_dist(tmp_path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.getcwd()])}
    out = subprocess.run([sys.executable, "-m", "nnhal.cli", "extensions", "--json"], capture_output=True,
                         text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    ext = {e["name"]: e for e in data["extensions"]}["com.vendor.test"]
    assert ext["version"] == "3.1"
    assert ext["operand_types"] == [{"type": 0, "name": "V_INT16", "dtype": "int16", "is_tensor": True,
                                     "byte_size": 2}]
    assert ext["operations"] == [{"type": 0, "name": "V_OP", "custom_codes": ["VOp"]}]
    failed = {f["entry_point"].split(" =")[0]: f["error"] for f in data["failed"]}
    assert set(failed) == {"missing", "raises", "wrong"}
    text = subprocess.run([sys.executable, "-m", "nnhal.cli", "extensions"], capture_output=True, text=True,
                          timeout=60, env=env).stdout
    assert "com.vendor.test 3.1" in text and "operation 0: V_OP" in text and "TFLite custom code: VOp" in text
    assert "FAILED missing" in text


def test_installed_examples_are_discovered():
    """The one test that needs `make setup` (the example packages installed in the venv)."""
    try:
        metadata.distribution("nnhal-example-fibonacci")
        metadata.distribution("nnhal-example-maxpool-argmax")
    except metadata.PackageNotFoundError:
        pytest.skip("make setup installs the example extensions")
    names = {r.extension for r in load_plugins() if r.error is None}
    assert {"com.example.fibonacci", "com.nnhal.maxpool_argmax"} <= names


def test_injected_entry_points():
    good = Extension("com.test.good", "1", operations=(ExtensionOperation(0, "OP", None, None, None),))
    results = load_plugins([_EP("bad", "x:y", ImportError("no module x")), _EP("junk", "a:b", 42),
                            _EP("good", "c:d", good)])
    assert [(r.extension, bool(r.error)) for r in results] == [(None, True), (None, True), ("com.test.good", False)]
    assert "ImportError: no module x" in results[0].error
    extensions.unregister("com.test.good")
    assert extensions.lookup("com.test.good") is None and extension_registry.extension("com.test.good") is None


@pytest.mark.parametrize("kwargs, message", [
    ({"name": "nodots"}, "reverse-domain"),
    ({"operations": (ExtensionOperation(1, "A", None, None, None), ExtensionOperation(1, "B", None, None, None))},
     "unique"),
    ({"operand_types": (OperandTypeSpec(70000, "T", np.int8),)}, "< 65536"),
])
def test_extension_definitions_are_checked(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Extension(**{"name": "com.test.x", "version": "1", **kwargs})


def fib_model(prefix_name="com.example.fibonacci", prefix=3, op_type=0, operand_type=0, int64=False, n=5):
    b = ModelBuilder()
    t = encode_extension_type(prefix, operand_type) if int64 else OperandType.TENSOR_FLOAT32
    x = b.add_operand(t, (n,))
    y = b.add_operand(t, (n,))
    b.add_operation(encode_extension_type(prefix, op_type), [x], [y])
    b.identify_inputs_and_outputs([x], [y])
    m = b.finish()
    m.extension_name_to_prefix = [ExtensionNameAndPrefix(prefix_name, prefix)]
    return m


def python_fib(n: int) -> int:
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


@pytest.mark.parametrize("int64", [False, True])
def test_fibonacci_runs_in_hal_with_any_prefix(int64):
    for prefix in (1, 77, 32767):
        compiled = compile_model(fib_model(prefix=prefix, int64=int64))
        n = np.array([0, 1, 2, 10, 92 if int64 else 40], np.int64 if int64 else np.float32)
        out = execute(compiled, [n])[0]
        assert out.dtype == n.dtype
        want = np.array([python_fib(int(k)) for k in n], dtype=object).astype(n.dtype)  # float32 rounds F(40)
        np.testing.assert_array_equal(out, want)


def test_two_extensions_with_swapped_prefixes_in_two_models():
    """Prefixes belong to the model: the same code means different extensions in two models."""
    for fib_prefix, pool_prefix in ((1, 2), (2, 1)):
        m = fib_model(prefix=fib_prefix)
        m.extension_name_to_prefix.append(ExtensionNameAndPrefix("com.nnhal.maxpool_argmax", pool_prefix))
        out = execute(compile_model(m), [np.array([3, 4, 5, 6, 7], np.float32)])[0]
        np.testing.assert_array_equal(out, [2, 3, 5, 8, 13])


@pytest.mark.parametrize("kwargs, message", [
    ({"prefix_name": "com.unknown.ext"}, "unknown extension 'com.unknown.ext': not registered"),
    ({"op_type": 9}, "has no operation type 9"),
    ({"operand_type": 5, "int64": True}, "has no operand type 5"),
])
def test_bad_extension_models(kwargs, message):
    with pytest.raises(HalError, match=message):
        compile_model(fib_model(**kwargs))


def test_prefix_collision_is_rejected():
    m = fib_model()
    m.extension_name_to_prefix.append(ExtensionNameAndPrefix("com.nnhal.maxpool_argmax", 3))
    with pytest.raises(HalError, match="prefix 3 is assigned twice"):
        compile_model(m)


def test_out_of_range_input_is_an_error_not_a_crash():
    compiled = compile_model(fib_model())
    with pytest.raises(HalError, match=r"n must be in \[0, 92\]"):
        execute(compiled, [np.array([1, 2, 3, 4, 100], np.float32)])


def test_operand_dtype_resolves_extension_types_per_model():
    prefixes = {9: "com.example.fibonacci"}
    assert extension_registry.operand_dtype(encode_extension_type(9, 0), prefixes) == np.int64
    assert extension_registry.operand_dtype(int(OperandType.TENSOR_INT32), prefixes) == np.int32
    with pytest.raises(HalError, match="no registered extension defines it"):
        extension_registry.operand_dtype(encode_extension_type(8, 0), prefixes)


def test_flexbuffer_options():
    opts = flexbuffer_map(flexbuffers.Dumps({"ksize": [1, 2, 2, 1], "padding": "SAME", "alpha": 0.5}), "Op",
                          required=("ksize", "padding"))
    assert opts == {"ksize": [1, 2, 2, 1], "padding": "SAME", "alpha": 0.5}
    for bad, message in [(None, "missing"), (b"\x00\x01\x02\x03garbage", "not a FlexBuffer|FlexBuffer map"),
                         (flexbuffers.Dumps([1, 2]), "must be a FlexBuffer map"),
                         (flexbuffers.Dumps({"ksize": 1}), "lack padding")]:
        with pytest.raises(CustomOptionsError, match=message):
            flexbuffer_map(bad, "Op", required=("ksize", "padding"))


def test_pool_params_struct_options():
    # The bytes TF's converter writes for filter 4x2, stride 2x1, SAME (its own test vector).
    raw = bytes([1, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 2, 0, 0, 0, 4, 0, 0, 0] + [0] * 20)
    p = tflite_pool_params(raw, "MaxPoolingWithArgmax2D")
    fields = ("padding", "stride_width", "stride_height", "filter_width", "filter_height")
    assert tuple(p[k] for k in fields) == (1, 1, 2, 2, 4)
    assert pack_pool_params(1, 1, 2, 2, 4) == raw
    for bad, message in [(raw[:24], "40-byte TfLitePoolParams"), (pack_pool_params(0, 1, 1, 2, 2), "padding"),
                         (pack_pool_params(1, 0, 1, 2, 2), "stride_width"),
                         (pack_pool_params(1, 1, 1, 2, 2, activation=4), "fused activation"),
                         (struct.pack("<10i", *[-1] * 10), "must be >= 1")]:
        with pytest.raises(CustomOptionsError, match=message):
            tflite_pool_params(bad, "MaxPoolingWithArgmax2D")
