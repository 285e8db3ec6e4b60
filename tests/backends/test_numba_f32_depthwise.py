"""The numba backend's float32 DEPTHWISE_CONV_2D (numba_kernels/f32_depthwise.py) against the
reference backend and the CTS, with NNAPI CTS's float criteria: every float32 CTS case it takes;
random layers (3x3 and 5x5 unrolled, other filters and strides, SAME / VALID / explicit and
asymmetric paddings, channel counts off the 16-lane blocks, batches, every activation, inf and
NaN inputs); the bound form (the same bytes as ``execute``, inputs off the cache lines included);
the compilation cache; and the forms it declines, which the reference backend runs."""
from __future__ import annotations

import functools
import logging

import numpy as np
import pytest

pytest.importorskip("hal.backends.numba_kernels")

from hal.backends.numba_kernels import f32_depthwise  # noqa: E402
from hal.backends.numba_kernels.native_chain import NativeRun, chain  # noqa: E402
from hal.bound_program import BoundProgram  # noqa: E402
from hal.compiler import compile_model  # noqa: E402
from hal.executor import bind as hal_bind  # noqa: E402
from hal.executor import execute  # noqa: E402
from hal.model import ModelBuilder  # noqa: E402
from hal.serialize import dump_compiled, load_compiled  # noqa: E402
from hal.types import OperandType, OperationType  # noqa: E402
from tests.backends.differential import compare, float_cts_examples_on  # noqa: E402

F32 = OperandType.TENSOR_FLOAT32
DW = OperationType.DEPTHWISE_CONV_2D
ORDER = ["numba", "reference"]
SAME, VALID = 1, 2


def test_cts_float_cases_it_takes_meet_the_cts_and_the_reference():
    ran = float_cts_examples_on("numba", "DEPTHWISE_CONV_2D", DW, ORDER)
    assert ran >= 20, f"only {ran} float CTS examples ran on the numba kernel"


def _layer(mb, x, shape, k, stride, pad, act, rng, *, kw=None, multiplier=1, dilation=1, nchw=False,
           filter_input=False):
    """A DEPTHWISE_CONV_2D of ``x`` (NHWC ``shape``, or NCHW); ``pad``: an implicit scheme or explicit
    (left, right, top, bottom); returns (its output operand, the filter's input operand or None)."""
    n, h, w, c = shape
    kw = k if kw is None else kw
    out_c = c * multiplier
    weights = rng.uniform(-1, 1, (1, k, kw, out_c)).astype(np.float32)
    wi = mb.add_operand(F32, weights.shape) if filter_input else mb.add_constant(F32, weights)
    b = mb.add_constant(F32, rng.uniform(-0.5, 0.5, out_c).astype(np.float32))
    sw, sh = stride if isinstance(stride, tuple) else (stride, stride)
    scalars = [mb.add_int32(v) for v in pad] if isinstance(pad, tuple) else [mb.add_int32(pad)]
    scalars += [mb.add_int32(v) for v in (sw, sh, multiplier, act)]
    if nchw or dilation != 1:
        scalars += [mb.add_bool(nchw)] + ([mb.add_int32(dilation)] * 2 if dilation != 1 else [])
    y = mb.add_operand(F32, ())
    mb.add_operation(DW, [x, wi, b, *scalars], [y])
    return y, (wi if filter_input else None)


def _model(shape, k, stride, pad, act, seed=0, **kw):
    rng = np.random.default_rng(seed)
    mb = ModelBuilder()
    x = mb.add_operand(F32, (shape[0], shape[3], shape[1], shape[2]) if kw.get("nchw") else shape)
    y, wi = _layer(mb, x, shape, k, stride, pad, act, rng, **kw)
    mb.identify_inputs_and_outputs([x] + ([wi] if wi is not None else []), [y])
    return mb.finish()


def _backend(compiled) -> str:
    (step,) = [s for s in compiled.static_plan.steps if s.ctx.op_type == DW]
    return step.backend


def _check(model, args):
    compiled = compile_model(model, backend_order=ORDER)
    got = execute(compiled, args)
    want = execute(compile_model(model, backend_order=["reference"]), args)
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        why = compare(g, w)
        assert why is None, f"output {k}: {why}"
    return compiled, got


# (batch, height, width, channels), filter size (or (rows, columns)), stride, padding, activation
LAYERS = [
    ((1, 14, 14, 64), 3, 1, SAME, 3),
    ((2, 9, 13, 17), 3, 1, SAME, 0),
    ((1, 7, 23, 40), 3, 1, (0, 2, 1, 0), 1),      # explicit, asymmetric: 23 = 2 groups of 8 + 4 + 2 + 1
    ((1, 12, 12, 3), 3, 2, SAME, 2),
    ((2, 15, 16, 48), 3, 2, (1, 0, 0, 1), 3),
    ((1, 16, 16, 144), 3, 2, VALID, 1),
    ((1, 14, 14, 40), 5, 1, SAME, 0),
    ((2, 11, 9, 17), 5, 1, (2, 1, 0, 2), 3),
    ((1, 28, 28, 32), 5, 2, SAME, 1),
    ((1, 9, 10, 3), 5, 2, (1, 2, 2, 1), 2),
    ((1, 6, 5, 24), 5, 1, SAME, 0),               # the image narrower than a group, every pixel at an edge
    ((1, 1, 1, 16), 3, 1, SAME, 0),               # one pixel: only the centre tap inside
    ((1, 10, 12, 20), 3, 3, SAME, 1),             # stride 3: the runtime tap loop
    ((2, 8, 8, 17), 2, 1, (0, 1, 1, 0), 3),
    ((1, 9, 9, 33), 7, 1, SAME, 0),
    ((1, 7, 11, 18), (3, 1), (1, 2), SAME, 2),
    ((1, 9, 10, 28), 3, 2, SAME, 0),              # a last block of 12 channels: 8 stored whole, 4 masked
    ((1, 8, 7, 46), 3, 1, SAME, 3),               # 14
    ((1, 6, 6, 130), 1, 1, VALID, 1),
    ((1, 13, 17, 160), 3, (2, 1), SAME, 3),       # stride 2 down, 1 across: the unrolled stride-1 form
]


@pytest.mark.parametrize("layer", range(len(LAYERS)))
def test_random_layers_match_the_reference(layer):
    shape, k, stride, pad, act = LAYERS[layer]
    k, kw = k if isinstance(k, tuple) else (k, k)
    rng = np.random.default_rng(layer)
    model = _model(shape, k, stride, pad, act, seed=layer, kw=kw)
    args = [rng.uniform(-2, 2, shape).astype(np.float32)]
    compiled, _ = _check(model, args)
    assert _backend(compiled) == "numba"
    unrolled = k == kw and (k, stride if isinstance(stride, int) else stride[0]) in f32_depthwise.UNROLL
    d = [s for s in compiled.static_plan.steps if s.ctx.op_type == DW][0].ctx.data
    assert (d.kernel < len(f32_depthwise.UNROLL)) == unrolled


@pytest.mark.parametrize("k,stride", [(3, 1), (5, 2), (2, 1)])
def test_infinity_and_nan_propagate_as_in_the_reference(k, stride):
    shape = (1, 10, 11, 20)
    model = _model(shape, k, stride, SAME, 0, seed=7)
    rng = np.random.default_rng(7)
    x = rng.uniform(-2, 2, shape).astype(np.float32)
    x[0, 0, 0, 3] = np.nan      # a corner: inside some windows, at the edge of the others
    x[0, 5, 5, 18] = np.inf     # times weights of both signs in its windows
    x[0, 9, 10, 19] = -np.inf   # in the channel tail block
    _, got = _check(model, [x])
    assert np.isnan(got[0][0, 0, 0, 3]) and np.isinf(got[0]).any()


def _bound_equals_execute(model, shape, offset):
    """Bind with an input ``offset`` floats past a cache line: the same bytes as ``execute``."""
    compiled = compile_model(model, backend_order=ORDER)
    rng = np.random.default_rng(offset)
    size = int(np.prod(shape))
    raw = np.empty(size + 32, np.float32)
    start = (-raw.ctypes.data % 64) // 4 + offset
    x = raw[start:start + size].reshape(shape)
    out_shape = compiled.static_plan.infos[compiled.output_indexes[0]].shape
    out = np.zeros(out_shape, np.float32)
    run = hal_bind(compiled, [x], [out])
    assert isinstance(run, BoundProgram)
    assert all(isinstance(c, functools.partial) and c.func in f32_depthwise.KERNELS for c in run.calls)
    for _ in range(2):
        x[...] = rng.uniform(-2, 2, shape)
        x.reshape(-1)[5] = np.nan
        run()
        want = execute(compiled, [x.copy()])[0]
        assert out.tobytes() == want.tobytes()
        assert compare(out, execute(compile_model(model, backend_order=["reference"]), [x.copy()])[0]) is None


@pytest.mark.parametrize("offset", [0, 4, 12])
@pytest.mark.parametrize("shape,k,stride", [((2, 9, 10, 144), 3, 1), ((1, 14, 14, 128), 5, 2), ((1, 8, 9, 40), 3, 2)])
def test_the_bound_form_gives_the_bytes_of_execute(shape, k, stride, offset):
    _bound_equals_execute(_model(shape, k, stride, SAME, 3, seed=offset), shape, offset)


def test_bound_layers_run_as_one_native_chain():
    """Two layers in a row: both partials of compiled kernels, called by one native loop."""
    rng = np.random.default_rng(21)
    mb = ModelBuilder()
    shape = (1, 12, 12, 32)
    x = mb.add_operand(F32, shape)
    y, _ = _layer(mb, x, shape, 3, 1, SAME, 3, rng)
    z, _ = _layer(mb, y, shape, 5, 2, SAME, 0, rng)
    mb.identify_inputs_and_outputs([x], [z])
    model = mb.finish()
    compiled = compile_model(model, backend_order=ORDER)
    assert [s.backend for s in compiled.static_plan.steps] == ["numba", "numba"]
    runner = hal_bind(compiled, [np.zeros(shape, np.float32)], [np.zeros((1, 6, 6, 32), np.float32)])
    assert isinstance(runner, BoundProgram) and runner.chained
    assert all(isinstance(c, functools.partial) and c.func in f32_depthwise.KERNELS for c in runner.calls)
    chained = chain(list(runner.calls))
    assert len(chained) == 1 and isinstance(chained[0], NativeRun)
    _bound_equals_execute(model, shape, 0)


def test_the_plan_survives_the_compilation_cache():
    shape = (2, 9, 9, 40)
    model = _model(shape, 3, 1, SAME, 1, seed=3)
    compiled = compile_model(model, backend_order=ORDER)
    loaded = load_compiled(*dump_compiled(compiled), backend_order=ORDER)
    assert _backend(loaded) == "numba"
    args = [np.random.default_rng(3).uniform(-2, 2, shape).astype(np.float32)]
    assert execute(loaded, args)[0].tobytes() == execute(compiled, args)[0].tobytes()


@pytest.mark.parametrize("form,reason", [
    ({"multiplier": 2}, "depth multiplier 2"),
    ({"dilation": 2}, "dilation 2x2"),
    ({"nchw": True}, "NCHW layout"),
    ({"filter_input": True}, "filter or bias is not a constant"),
])
def test_forms_it_declines_fall_to_the_reference_with_the_reason(form, reason, caplog):
    shape = (1, 8, 8, 4)
    model = _model(shape, 3, 1, SAME, 0, seed=5, **form)
    rng = np.random.default_rng(5)
    x = rng.uniform(-2, 2, (1, 4, 8, 8) if form.get("nchw") else shape).astype(np.float32)
    args = [x] + ([rng.uniform(-1, 1, (1, 3, 3, 4)).astype(np.float32)] if form.get("filter_input") else [])
    with caplog.at_level(logging.INFO, logger="hal.compiler"):
        compiled, _ = _check(model, args)
    assert _backend(compiled) == "reference"
    assert any("numba declined" in r.getMessage() and reason in r.getMessage() for r in caplog.records), \
        [r.getMessage() for r in caplog.records]
