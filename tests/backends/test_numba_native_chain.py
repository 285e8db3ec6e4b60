"""native_chain: consecutive calls of compiled kernels made by one native loop. Each chained call
against the same call made through numba's dispatcher (every kind of argument it flattens), the
calls it leaves to Python in their place, a kernel's failure, and a bound program's fallback to
its per-step form, which names the failing step."""
from __future__ import annotations

import functools
import types

import numba
import numpy as np
import pytest

pytest.importorskip("hal.backends.numba_kernels")

from delegate.mapping import convert_partition  # noqa: E402
from delegate.tfl import read_model  # noqa: E402
from hal.backends.numba_kernels import gemm  # noqa: E402
from hal.backends.numba_kernels.native_chain import InOrder, NativeRun, chain  # noqa: E402
from hal.bound_program import BoundProgram, _nothing  # noqa: E402
from hal.compiler import compile_model  # noqa: E402
from hal.errors import HalError  # noqa: E402
from hal.executor import OperationTiming  # noqa: E402
from hal.types import ErrorStatus  # noqa: E402
from nnhal.examples_quantized import small_cnn  # noqa: E402


@numba.njit(nogil=True)
def _digest(a, b, i, f32, f64, flag, small, shape, out):
    """Writes what it was given into ``out`` (each argument kind a flattened slot form)."""
    out[0] = a.sum() + a.shape[0] * 1000 + a.strides[0]
    out[1] = b.sum() + b.shape[0] * 100 + b.shape[1]
    out[2] = i
    out[3] = f32
    out[4] = f64
    out[5] = 1.0 if flag else 0.0
    out[6] = small
    out[7] = shape[0] * 10 + shape[1]
    out[8] = b[b.shape[0] - 1, b.shape[1] - 1]


@numba.njit(numba.void(numba.types.Array(numba.int32, 1, "C", readonly=True), numba.int32, numba.float32,
                       numba.int32[::1]), nogil=True)
def _typed(x, k, scale, out):
    """An explicit signature (read-only input, int32 and float32 parameters) as the kernels have."""
    for j in range(x.shape[0]):
        out[j] = np.int32(x[j] * k * scale)


@numba.njit(nogil=True)
def _add_one(buf):
    buf[0] += 1


@numba.njit(nogil=True)
def _fails(buf):
    if buf[0] > 0:
        raise ValueError("broken")


@numba.njit(nogil=True)
def _returns(buf):
    return buf[0]


def _digest_args(seed: int):
    rng = np.random.default_rng(seed)
    a = rng.integers(-100, 100, 11).astype(np.int16)
    b = rng.standard_normal((3, 5))
    return (a, b, -(2**40) - seed, np.float32(0.1 * seed + 0.3), 1.0 / 3 + seed, bool(seed % 2), np.uint8(200 + seed),
            (7, 9 + seed))


def test_each_kind_of_argument_reaches_the_kernel_as_the_dispatcher_gives_it():
    calls, outs, want = [], [], []
    for seed in range(3):
        args = _digest_args(seed)
        out, expected = np.zeros(9), np.zeros(9)
        _digest(*args, expected)  # through the dispatcher
        calls.append(functools.partial(_digest, *args, out))
        outs.append(out)
        want.append(expected)
    x = np.arange(-5, 6, dtype=np.int32)
    x.setflags(write=False)
    typed_out, typed_want = np.zeros(11, np.int32), np.zeros(11, np.int32)
    _typed(x, 3, np.float32(0.7), typed_want)
    calls.append(functools.partial(_typed, x, 3, 0.7, typed_out))
    chained = chain(calls)
    assert len(chained) == 1 and isinstance(chained[0], NativeRun)
    chained[0]()
    for got, w in zip(outs, want):
        np.testing.assert_array_equal(got, w)
    np.testing.assert_array_equal(typed_out, typed_want)


def test_calls_it_cannot_make_stay_python_calls_in_their_place():
    buf, order = np.zeros(1, np.int64), []

    def python_step() -> None:
        order.append(int(buf[0]))
    one = functools.partial(_add_one, buf)
    runners = [one, one, python_step, InOrder([one, python_step, one, one]), functools.partial(_returns, buf), one]
    chained = chain(runners)
    kinds = [type(c).__name__ if isinstance(c, NativeRun) else c for c in chained]
    assert kinds == ["NativeRun", python_step, one, python_step, "NativeRun", runners[4], one]
    for c in chained:
        c()
    assert order == [2, 3] and buf[0] == 6


def test_a_kernel_that_fails_stops_the_loop_and_raises():
    buf = np.zeros(1, np.int64)
    add, fail = functools.partial(_add_one, buf), functools.partial(_fails, buf)
    runner, = chain([add, fail, add])
    with pytest.raises(RuntimeError, match="native call 1 of 3 failed"):
        runner()
    assert buf[0] == 1  # the call after the failing one was not made


def test_a_bound_program_whose_chained_form_fails_names_the_step_by_running_it_step_by_step():
    buf = np.zeros(1, np.int64)
    compiled = compile_model(convert_partition(read_model(small_cnn(np.int8, 32))).model,
                             backend_order=["numba", "reference"])
    steps = compiled.static_plan.program[:4]  # the program's own steps: numba's
    assert {s.kernel.backend for s in steps} == {"numba"}
    program = BoundProgram([functools.partial(_add_one, buf), _nothing, functools.partial(_fails, buf),
                            functools.partial(_add_one, buf)], steps, OperationTiming)
    assert program.chained
    with pytest.raises(HalError) as e:
        program()
    assert e.value.status == ErrorStatus.GENERAL_FAILURE
    assert e.value.message.startswith(steps[2].ctx.name) and "broken" in e.value.message
    assert buf[0] == 2  # the first step ran in both forms, the last in neither


def test_a_gemm_split_over_threads_stays_a_python_call(monkeypatch):
    from hal import backends
    p = types.SimpleNamespace(k=1000, n=1000, flags=0)
    monkeypatch.setattr(backends, "compute_threads", lambda: 2)
    assert gemm._bound_split(_add_one, (), p, 1000, None).func is gemm._split
    monkeypatch.setattr(backends, "compute_threads", lambda: 1)
    assert gemm._bound_split(_add_one, (), p, 1000, None).func is _add_one
