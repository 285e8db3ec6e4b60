"""The numba backend against the reference backend: bit-exact on every CTS case of the operations
it takes, on generated whole models, and on the paths the CTS does not reach (chunked GEMMs,
broadcasting); and its compilation stays off the execution path and survives a corrupt cache."""
from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest

numba_kernels = pytest.importorskip("hal.backends.numba_kernels")

from delegate.mapping import convert_partition  # noqa: E402
from delegate.mapping.host_runtime import TFLITE_RUNTIME_2_14  # noqa: E402
from delegate.tfl import TfLiteModelBuilder, read_model  # noqa: E402
from hal.compiler import compile_model  # noqa: E402
from hal.executor import execute  # noqa: E402
from nnhal.cts.corpus import build_model, examples, load_cases  # noqa: E402
from nnhal.examples import efficientnet_b0, mobilenet_like  # noqa: E402
from nnhal.examples_quantized import blazeface_quantized, small_cnn  # noqa: E402
from tests.backends.differential import assert_matches_reference, compare  # noqa: E402
from tests.harness import random_tensor  # noqa: E402

BACKEND = numba_kernels.BACKEND
#: Models of NNAPI operations whatever TFLite runtime is installed: LiteRT's quantized FULLY_CONNECTED
#: maps to an extension operation, which only its extension's backend runs.
NNAPI_ARITHMETIC = TFLITE_RUNTIME_2_14
TAKEN = {int(t) for t in BACKEND.kernels}


def _cts_cases():
    from hal.types import OperationType
    names = {OperationType(t).name for t in TAKEN}
    return [c for c in load_cases() if set(c.operation_types) & names and not c.expect_failure]


def test_every_cts_case_of_its_operations_matches_the_reference_bit_for_bit():
    checked = ran = 0
    for case in _cts_cases():
        model = build_model(case)
        try:
            want_model = compile_model(model, backend_order=["reference"])
        except Exception:  # noqa: BLE001 - unsupported by the driver: nothing to compare
            continue
        compiled = compile_model(model, backend_order=["numba", "reference"])
        steps = compiled.static_plan.steps if compiled.static_plan is not None else []
        ran += any(s.backend == "numba" for s in steps)
        for ex in examples(case):
            if any(x is None for x in ex.inputs):
                continue
            got, want = execute(compiled, list(ex.inputs)), execute(want_model, list(ex.inputs))
            for g, w in zip(got, want):
                assert compare(g, w, model.relax_computation_float32_to_float16) is None, case.name
                if not np.issubdtype(w.dtype, np.floating):
                    np.testing.assert_array_equal(g, w, err_msg=case.name)
            checked += 1
    assert ran > 300, f"the numba backend ran only {ran} CTS cases"
    assert checked >= ran


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("build,size", [(lambda d: mobilenet_like(d, 32, 16), 32),
                                        (lambda d: efficientnet_b0(d, 32), 32),
                                        (lambda d: blazeface_quantized(d, 64), 64), (lambda d: small_cnn(d, 32), 32)],
                         ids=["mobilenet_like", "efficientnet_b0", "blazeface", "small_cnn"])
def test_whole_models_match_the_reference(build, size, dtype):
    model = convert_partition(read_model(build(dtype)), runtime=NNAPI_ARITHMETIC).model
    for seed in range(2):
        x = [random_tensor(np.random.default_rng(seed), (1, size, size, 3), dtype)]
        result = assert_matches_reference(model, x, "numba")
    assert len(result.assigned) >= result.operations * 0.7


def _fc(dtype, k, units, seed, out_scale=2.0):
    rng = np.random.default_rng(seed)
    m = TfLiteModelBuilder()
    zp = 128 if dtype == np.uint8 else 0
    x = m.add_input("x", [2, k], dtype, scale=0.05, zero_point=zp)
    w = rng.integers(0 if dtype == np.uint8 else -127, 256 if dtype == np.uint8 else 128, (units, k)).astype(dtype)
    wt = m.add_constant("w", w, scale=0.01, zero_point=zp)
    b = m.add_constant("b", rng.integers(-5000, 5000, units).astype(np.int32), scale=0.0005, zero_point=0)
    y = m.add_tensor("y", [2, units], dtype, scale=out_scale, zero_point=zp)
    m.add_operator("FULLY_CONNECTED", [x, wt, b], [y], ("FullyConnectedOptions", {"fused_activation_function": 0}))
    m.set_outputs([y])
    return convert_partition(read_model(m.build()), runtime=NNAPI_ARITHMETIC).model


@pytest.mark.parametrize("dtype,k", [(np.int8, 1032), (np.int8, 3000), (np.uint8, 514), (np.uint8, 2000)])
def test_long_reductions_split_into_exact_chunks(dtype, k):
    """K beyond what one float32 GEMM sums exactly: extreme values make any rounding visible."""
    model = _fc(dtype, k, 7, k)
    lo, hi = (0, 255) if dtype == np.uint8 else (-128, 127)
    for x in (np.full((2, k), lo, dtype), np.full((2, k), hi, dtype),
              random_tensor(np.random.default_rng(k), (2, k), dtype)):
        assert_matches_reference(model, [x], "numba")


@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
def test_output_multipliers_above_one_take_the_general_requantization(dtype):
    """An output scale below input scale x filter scale: a left shift, the general kernel."""
    model = _fc(dtype, 40, 9, 5, out_scale=1e-4)
    compiled = compile_model(model, backend_order=["numba", "reference"])
    data = compiled.static_plan.steps[0].ctx.data
    shifts = data.groups[0].left[:9] if hasattr(data, "groups") else data.shifts  # the VNNI plan or BLAS's
    assert (shifts > 0).all()
    for seed in range(3):
        assert_matches_reference(model, [random_tensor(np.random.default_rng(seed), (2, 40), dtype)], "numba")


def _binary(op, dtype, a_shape, b_shape, b_const=False):
    m = TfLiteModelBuilder()
    zp = 128 if dtype == np.uint8 else 0
    a = m.add_input("a", a_shape, dtype, scale=0.1, zero_point=zp)
    if b_const:
        b = m.add_constant("b", random_tensor(np.random.default_rng(1), b_shape, dtype), scale=0.07, zero_point=zp - 3)
    else:
        b = m.add_input("b", b_shape, dtype, scale=0.07, zero_point=zp - 3)
    y = m.add_tensor("y", np.broadcast_shapes(tuple(a_shape), tuple(b_shape)), dtype, scale=0.2, zero_point=zp + 1)
    m.add_operator(op, [a, b], [y], (f"{op.capitalize()}Options", {"fused_activation_function": 0}))
    m.set_outputs([y])
    return convert_partition(read_model(m.build())).model


@pytest.mark.parametrize("op", ["ADD", "SUB", "MUL"])
@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("shapes", [((2, 3, 4, 5), (2, 3, 4, 5)), ((2, 3, 4, 5), (1, 1, 1, 5)), ((2, 3, 4, 5), (4, 5)),
                                    ((1, 1, 1, 5), (2, 3, 4, 5)), ((2, 3, 4, 5), (1,)), ((2, 3, 4, 5), (2, 1, 4, 1)),
                                    ((3, 1, 5), (1, 4, 1))])
def test_table_driven_binary_operations_broadcast_like_the_reference(op, dtype, shapes):
    a_shape, b_shape = shapes
    model = _binary(op, dtype, a_shape, b_shape)
    rng = np.random.default_rng(7)
    assert_matches_reference(model, [random_tensor(rng, a_shape, dtype), random_tensor(rng, b_shape, dtype)], "numba")


def test_no_kernel_compiles_on_the_execution_path():
    """Every kernel is compiled for its signatures at import; a call with other types is an error,
    never a compilation in the middle of an execution."""
    import numba
    dispatchers = [obj for mod in list(sys.modules.values()) if mod and mod.__name__.startswith(numba_kernels.__name__)
                   for obj in vars(mod).values() if isinstance(obj, numba.core.registry.CPUDispatcher)]
    dispatchers = [d for d in dispatchers if d.targetoptions.get("inline") != "always"]  # inlined helpers
    assert dispatchers
    for d in dispatchers:
        assert d.signatures and not d._can_compile, d.py_func.__qualname__


def test_a_corrupt_cache_file_costs_its_module_a_compilation_not_the_backend(tmp_path):
    """Every cache file of lut (which conv and others import: the failure surfaces while importing
    another module) is garbage: lut's kernels are compiled again, every other module's files are
    loaded as they were, and the backend has all its kernels."""
    cache = pathlib.Path(numba_kernels.CACHE)
    copy = tmp_path / "numba" / cache.name
    shutil.copytree(cache, copy)
    mine = [f for f in copy.rglob("lut.*") if f.suffix in (".nbi", ".nbc")]
    others = {f: f.read_bytes() for f in copy.rglob("*") if f.suffix in (".nbi", ".nbc") and f not in mine}
    assert mine and others
    for f in mine:
        f.write_bytes(b"garbage")
    env = dict(os.environ, NNHAL_NUMBA_CACHE_DIR=str(tmp_path / "numba"), PYTHONPATH=os.getcwd())
    code = "import hal.backends.numba_kernels as k; print(len(k.BACKEND.kernels))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout.strip()) == len(BACKEND.kernels)
    assert "numba cache of hal.backends.numba_kernels.lut unreadable" in out.stderr, out.stderr
    assert out.stderr.count("unreadable") == 1, out.stderr  # lut alone: not the whole cache
    rewritten = [f for f in copy.rglob("lut.*") if f.suffix in (".nbi", ".nbc")]
    assert rewritten and all(f.read_bytes() != b"garbage" for f in rewritten)
    assert all(f.read_bytes() == data for f, data in others.items())  # loaded, not compiled again
