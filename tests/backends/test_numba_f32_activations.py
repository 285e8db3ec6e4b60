"""The numba backend's float32 LOGISTIC and HARD_SWISH (numba_kernels/f32_activations.py) and its
fused swish against the reference backend with NNAPI CTS's float criteria: every float32 LOGISTIC
case of the CTS (it has none of HARD_SWISH), large tensors holding ±inf, NaN, huge and tiny
magnitudes and the edges of float32's exp range, the bound form giving execute's bytes, hard-swish's
division without one (f32_lanes' ``divide_by_6``) on a sample of every float, and the quantized
kernels kept."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("hal.backends.numba_kernels")

from hal.compiler import compile_model  # noqa: E402
from hal.executor import bind as hal_bind  # noqa: E402
from hal.executor import execute  # noqa: E402
from hal.model import ModelBuilder  # noqa: E402
from hal.types import OperandType, OperationType  # noqa: E402
from tests.backends.differential import compare, float_cts_examples_on  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the reference's inf · 0, NaN casts

F32 = OperandType.TENSOR_FLOAT32
ORDER = ["numba", "reference"]
Op = OperationType


def test_cts_float32_logistic_cases_meet_the_cts_and_the_reference():
    ran = float_cts_examples_on("numba", "LOGISTIC", Op.LOGISTIC, ORDER)
    assert ran >= 10, f"only {ran} float32 CTS examples of LOGISTIC ran on the numba kernel"


def _model(op, shape):
    mb = ModelBuilder()
    x = mb.add_operand(F32, shape)
    y = mb.add_operand(F32, shape)
    mb.add_operation(op, [x], [y])
    mb.identify_inputs_and_outputs([x], [y])
    return mb.finish()


#: Inputs where the arithmetic has edges: exp's overflow (|x| near 88.72) and underflow, sigmoid's
#: rounding to 1, hard-swish's clip points, zeros, denormals, the largest floats, inf and NaN.
SPECIAL = np.array([np.inf, -np.inf, np.nan, -np.nan, 0.0, -0.0, 1e-45, -1e-45, 1e-38, -1e-38, 1e-8, -1e-8,
                    3.0, -3.0, 2.9999998, -3.0000002, 6.0, -6.0, 16.0, -16.0, 17.5, -17.5, 87.0, -87.0, 88.0, -88.0,
                    88.5, -88.5, 88.72283, -88.72283, 88.72284, -88.72284, 89.0, -89.0, 100.0, -100.0, 1e4, -1e4,
                    3.4028235e38, -3.4028235e38], np.float32)


def _inputs(rng, shape):
    x = rng.uniform(-12, 12, shape).astype(np.float32)
    flat = x.reshape(-1)
    flat[:SPECIAL.size] = SPECIAL
    k = rng.integers(SPECIAL.size, flat.size, 4000)
    flat[k] = rng.choice(SPECIAL, k.size)
    wide = rng.integers(SPECIAL.size, flat.size, 4000)  # magnitudes across float32's range
    flat[wide] = (rng.choice([-1, 1], wide.size) * 10.0 ** rng.uniform(-40, 38.5, wide.size)).astype(np.float32)
    return x


@pytest.mark.parametrize("op", [Op.LOGISTIC, Op.HARD_SWISH])
@pytest.mark.parametrize("shape", [(1, 112, 112, 16), (2, 7, 7, 19), (1, 1, 1, 3), (5,), (1, 1, 1, 1152)])
def test_random_and_special_values_against_the_reference(op, shape):
    rng = np.random.default_rng([int(op), len(shape), shape[-1]])
    model = _model(op, shape)
    compiled = compile_model(model, backend_order=ORDER)
    assert [s.backend for s in compiled.static_plan.steps] == ["numba"]
    want_model = compile_model(model, backend_order=["reference"])
    for _ in range(2):
        x = _inputs(rng, shape) if np.prod(shape) > SPECIAL.size else rng.uniform(-9, 9, shape).astype(np.float32)
        got, want = execute(compiled, [x])[0], execute(want_model, [x])[0]
        why = compare(got, want)
        assert why is None, why
        assert np.array_equal(np.isnan(got), np.isnan(want))
        if op == Op.HARD_SWISH:  # the reference's own float32 steps: its bytes, but for subnormal results
            normal = ~(np.abs(want) < np.finfo(np.float32).tiny)
            assert got[normal].tobytes() == want[normal].tobytes()


def test_the_division_by_6_is_numpys_wherever_the_quotient_is_normal():
    """f32_lanes' ``divide_by_6`` (a multiplication and Markstein's correction) on every float32 bit
    pattern of a 1-in-257 sample (inf and NaN included), against numpy's p / 6: its bytes where
    the quotient is a normal float, one subnormal step at most below."""
    import numba

    from hal.backends.numba_kernels.f32_activations import _unary_run
    from hal.backends.numba_kernels.f32_lanes import divide_by_6
    run = _unary_run(divide_by_6)

    @numba.njit
    def divide(x, out):
        run(x, out, out.shape[0])
    p = np.arange(0, 2**32, 257, dtype=np.uint64).astype(np.uint32).view(np.float32)
    got = np.empty_like(p)
    divide(p, got)
    with np.errstate(all="ignore"):
        want = p / np.float32(6)
    normal = ~((np.abs(want) < np.finfo(np.float32).tiny) & (want != 0))
    assert np.array_equal(got[normal], want[normal], equal_nan=True)
    assert np.array_equal(np.signbit(got[normal]), np.signbit(want[normal]))
    assert np.abs(got[~normal] - want[~normal]).max() <= np.float32(1.5e-45)


def test_logistic_over_every_float32_exponent():
    """Every float32 bit pattern of a 1-in-4099 sample (every exponent, both signs): within CTS's
    float tolerance of the reference and a few ULP of it where the result is a normal float."""
    x = (np.arange(0, 2**32, 4099, dtype=np.uint64).astype(np.uint32)).view(np.float32)
    model = _model(Op.LOGISTIC, x.shape)
    got = execute(compile_model(model, backend_order=ORDER), [x])[0]
    want = execute(compile_model(model, backend_order=["reference"]), [x])[0]
    assert compare(got, want) is None
    normal = np.isfinite(want) & (np.abs(want) >= np.finfo(np.float32).tiny) & (got != want)
    ulps = np.abs(got[normal].astype(np.float64) - want[normal]) / np.spacing(want[normal]).astype(np.float64)
    assert ulps.max(initial=0) <= 4


@pytest.mark.parametrize("shape", [(1, 56, 56, 24), (3, 5, 7)])
@pytest.mark.parametrize("x_first", [True, False])
def test_a_swish_is_one_pass(shape, x_first):
    """LOGISTIC(x), then MUL of x and it (either order): one ``swish`` step on numba, x · LOGISTIC(x)
    with the same float32 roundings: within CTS's tolerance of the reference's two operations and
    a few ULP of them where the result is a normal float; the bound form writes the same bytes."""
    mb = ModelBuilder()
    x, s, y = (mb.add_operand(F32, shape) for _ in range(3))
    mb.add_operation(Op.LOGISTIC, [x], [s])
    mb.add_operation(Op.MUL, [x, s, mb.add_int32(0)] if x_first else [s, x, mb.add_int32(0)], [y])
    mb.identify_inputs_and_outputs([x], [y])
    model = mb.finish()
    compiled = compile_model(model, backend_order=ORDER)
    program = compiled.static_plan.program
    assert [(getattr(st.ctx, "pattern", None), st.backend) for st in program] == [("swish", "numba")]
    rng = np.random.default_rng(len(shape))
    xv = _inputs(rng, shape) if np.prod(shape) > 4 * SPECIAL.size else rng.uniform(-30, 30, shape).astype(np.float32)
    got = execute(compiled, [xv])[0]
    want = execute(compile_model(model, backend_order=["reference"]), [xv])[0]
    assert compare(got, want) is None
    assert np.array_equal(np.isnan(got), np.isnan(want))
    normal = np.isfinite(want) & (np.abs(want) >= np.finfo(np.float32).tiny) & (got != want)
    ulps = np.abs(got[normal].astype(np.float64) - want[normal]) / np.spacing(want[normal]).astype(np.float64)
    assert ulps.max(initial=0) <= 5
    out = np.zeros(shape, np.float32)
    runner = hal_bind(compiled, [xv.copy()], [out])
    runner(None, None, None)
    assert out.tobytes() == got.tobytes()


@pytest.mark.parametrize("op", [Op.LOGISTIC, Op.HARD_SWISH])
def test_the_bound_form_writes_executes_bytes(op):
    shape = (1, 56, 56, 24)
    model = _model(op, shape)
    compiled = compile_model(model, backend_order=ORDER)
    x = np.zeros(shape, np.float32)
    out = np.zeros(shape, np.float32)
    runner = hal_bind(compiled, [x], [out])
    rng = np.random.default_rng(int(op))
    for _ in range(2):
        x[...] = _inputs(rng, shape)
        runner(None, None, None)
        assert out.tobytes() == execute(compiled, [x.copy()])[0].tobytes()


def test_a_quantized_logistic_keeps_its_table():
    """A quantized LOGISTIC still runs on numba's lookup table; a float one on the float kernel."""
    from hal.backends.numba_kernels import BACKEND, f32_activations, lut
    kernel = BACKEND.kernel(Op.LOGISTIC)
    assert kernel.runs_type(OperandType.TENSOR_QUANT8_ASYMM) and kernel.runs_type(F32)
    mb = ModelBuilder()
    x = mb.add_operand(OperandType.TENSOR_QUANT8_ASYMM, (1, 4, 4, 8), 0.1, 128)
    y = mb.add_operand(OperandType.TENSOR_QUANT8_ASYMM, (1, 4, 4, 8), 1.0 / 256, 0)
    mb.add_operation(Op.LOGISTIC, [x], [y])
    mb.identify_inputs_and_outputs([x], [y])
    step = compile_model(mb.finish(), backend_order=ORDER).static_plan.steps[0]
    assert step.backend == "numba" and isinstance(step.ctx.data, lut.TableData)
    step = compile_model(_model(Op.LOGISTIC, (3, 5)), backend_order=ORDER).static_plan.steps[0]
    assert step.backend == "numba" and isinstance(step.ctx.data, f32_activations.FloatUnary)
