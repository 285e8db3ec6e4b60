"""The numba backend against the reference backend: bit-exact on every CTS case of the operations
it takes, on generated whole models, and on the paths the CTS does not reach (chunked GEMMs,
broadcasting); and its compilation stays off the execution path and survives a corrupt cache."""
from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import time

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


def _kernels() -> list:
    """Every compiled (not inlined) kernel the package's modules declare."""
    import numba
    modules = [m for m in list(sys.modules.values()) if m and m.__name__.startswith(numba_kernels.__name__)]
    found = {id(obj): obj for m in modules for obj in vars(m).values()
             if isinstance(obj, numba.core.registry.CPUDispatcher)}
    return [d for d in found.values() if d.targetoptions.get("inline") != "always"]


def test_no_kernel_compiles_on_the_execution_path():
    """Every kernel is declared with its signatures and, loaded, runs those alone: a call with
    other types is an error, never a compilation in the middle of an execution; and loading them
    from the filled cache compiles none."""
    from hal.backends.numba_kernels import lazy
    assert lazy.materialize_all() == len(lazy._declared)
    kernels = _kernels()
    assert kernels and all(isinstance(d, lazy.LazyDispatcher) for d in kernels), \
        [d.py_func.__qualname__ for d in kernels if not isinstance(d, lazy.LazyDispatcher)]
    for d in kernels:
        assert d.signatures and not d._can_compile, d.py_func.__qualname__
        assert len(d.signatures) == len(d._declared_signatures), d.py_func.__qualname__
        assert not any(d._cache_misses.values()), f"{d.py_func.__qualname__} was compiled, not loaded"


def test_a_started_process_loads_a_kernel_when_it_is_first_used():
    """Importing the package over a filled cache loads no kernel; a kernel's first call loads
    its declared signatures (and only those: a call with other types is numba's TypeError)."""
    one = next(d for d in _kernels() if len(d._declared_signatures) == 1 and "." not in d.py_func.__qualname__)
    module, qualname = one.py_func.__module__, one.py_func.__qualname__
    arity = len(one._declared_signatures[0].args)
    code = (f"import sys, importlib\nfrom hal.backends.numba_kernels import lazy\n"
            f"k = getattr(importlib.import_module({module!r}), {qualname!r})\n"
            "print(lazy.pending() == len(lazy._declared), len(k.signatures))\n"
            f"try:\n    k(*['not its types'] * {arity})\nexcept TypeError:\n    print('TypeError')\n"
            "print(len(k.signatures), k._can_compile, lazy.pending() == len(lazy._declared) - 1)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, PYTHONPATH=os.getcwd()))
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "0", "TypeError", "1", "False", "True"], out.stdout + out.stderr


def _blocked_lock_requests(pid: int) -> list[str]:
    """/proc/locks' lines of ``pid``'s waiting (``->``) flock requests."""
    return [line for line in pathlib.Path("/proc/locks").read_text().splitlines()
            if "->" in line and "FLOCK" in line and line.split()[5:6] == [str(pid)]]


@pytest.mark.skipif(not pathlib.Path("/proc/locks").exists(), reason="reads the kernel's lock table")
def test_unreadable_or_missing_kernels_cost_their_compilation_under_the_exclusive_lock(tmp_path):
    """In a filled copy of the cache, every file of lut is garbage and pad's are gone. A process
    loads every other kernel as it was, under the shared lock; waits for the exclusive one (numba's
    cache is not safe for processes writing it at once) while a reader holds the directory; then
    compiles lut's (with a warning naming them) and pad's, and has every kernel."""
    import fcntl
    cache = pathlib.Path(numba_kernels.CACHE)
    copy = tmp_path / "numba" / cache.name
    shutil.copytree(cache, copy)

    def files(stem: str) -> list[pathlib.Path]:
        return [f for f in copy.rglob(stem + ".*") if f.suffix in (".nbi", ".nbc")]

    lut, pad = files("lut"), files("pad")
    others = {f: f.read_bytes() for f in copy.rglob("*") if f.suffix in (".nbi", ".nbc") and f not in lut + pad}
    assert lut and pad and others and (copy / numba_kernels.FILLED_MARKER).exists()
    for f in lut:
        f.write_bytes(b"garbage")
    for f in pad:
        f.unlink()
    reader = os.open(copy / ".lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(reader, fcntl.LOCK_SH)
    code = ("import hal.backends.numba_kernels as k\nfrom hal.backends.numba_kernels import lazy\n"
            "print(len(k.BACKEND.kernels), lazy.materialize_all() == len(lazy._declared), lazy.pending())")
    env = dict(os.environ, NNHAL_NUMBA_CACHE_DIR=str(tmp_path / "numba"), PYTHONPATH=os.getcwd())
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=env)
    try:
        deadline = time.monotonic() + 300
        while not _blocked_lock_requests(child.pid) and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        waiting = _blocked_lock_requests(child.pid)
        assert waiting and all(" WRITE " in line for line in waiting), (waiting, child.poll())
        assert not files("pad") and all(f.read_bytes() == b"garbage" for f in files("lut")), \
            "compiled into the directory while a reader held it"
    finally:
        os.close(reader)  # lets the child take the exclusive lock
        out, err = child.communicate(timeout=600)
    assert child.returncode == 0, err
    assert out.split() == [str(len(BACKEND.kernels)), "True", "0"], out + err
    warned = [line for line in err.splitlines() if "unreadable" in line]
    assert warned and all("numba cache of hal.backends.numba_kernels.lut." in line for line in warned), err
    assert files("lut") and all(f.read_bytes() != b"garbage" for f in files("lut"))
    assert [f for f in files("pad") if f.suffix == ".nbc"], "pad's kernels were not saved"
    assert all(f.read_bytes() == data for f, data in others.items())  # loaded, not compiled again


_FIRST_USE = """
import pickle, sys
import numpy as np
from delegate.mapping import convert_partition
from delegate.mapping.host_runtime import TFLITE_RUNTIME_2_14
from delegate.tfl import read_model
from hal import backends
from hal.compiler import compile_model
from hal.executor import bind, execute
from hal.serialize import dump_compiled, load_compiled
from hal.backends.numba_kernels import lazy
from nnhal.examples import mlp, mobilenet_like
from nnhal.examples_quantized import small_cnn
backends.set_compute_threads(1)
step, path = sys.argv[1], sys.argv[2]
models = {"int8 cnn": (small_cnn(np.int8, 32), np.int8, (1, 32, 32, 3)),
          "float cnn": (mobilenet_like(np.float32, 32, 16), np.float32, (1, 32, 32, 3)),
          "float mlp": (mlp(), np.float32, (1, 256))}
dumped = {} if step == "compile" else pickle.load(open(path, "rb"))
for name, (tfl, dtype, shape) in models.items():
    start = lazy.pending()
    if step == "compile":
        compiled = compile_model(convert_partition(read_model(tfl), runtime=TFLITE_RUNTIME_2_14).model)
        dumped[name] = dump_compiled(compiled)
    else:
        compiled = load_compiled(*dumped[name])
    prepared = lazy.pending()
    plan = compiled.static_plan
    x = np.random.default_rng(0).integers(-128, 127, shape).astype(dtype)
    execute(compiled, [x])
    outs = [np.empty(plan.infos[o].shape, plan.infos[o].dtype) for o in compiled.output_indexes]
    bind(compiled, [x], outs)()
    numba_steps = sum(s.backend == "numba" for s in plan.steps)
    print(f"{name}|{numba_steps}|{start - prepared}|{prepared - lazy.pending()}")
if step == "compile":
    pickle.dump(dumped, open(path, "wb"))
"""


def test_a_model_prepared_or_loaded_from_the_cache_runs_without_loading_a_kernel(tmp_path):
    """Kernels load when a plan that runs them is made or loaded from the compilation cache
    (Backend.ready), not in its first execution, whose time would then hold the loading (and
    whose slowest time a client's wait bound is made of). Fresh processes: nothing loaded before."""
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    for step in ("compile", "load"):
        out = subprocess.run([sys.executable, "-c", _FIRST_USE, step, str(tmp_path / "plans.pickle")], env=env,
                             capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr
        rows = [line.split("|") for line in out.stdout.splitlines()]
        assert len(rows) == 3, out.stdout + out.stderr
        for name, numba_steps, _, in_executions in rows:
            assert int(numba_steps) > 0, f"{step} {name}: no step on numba"
            assert int(in_executions) == 0, f"{step} {name}: {in_executions} kernels loaded by executions"
        assert sum(int(r[2]) for r in rows) > 0, f"{step}: no kernel loaded at all"
