"""The numba backend's float32 MEAN and NHWC RESIZE_BILINEAR (numba_kernels/f32_reduce_resize.py)
against the reference backend with NNAPI CTS's float criteria: every float32 CTS case of both (and
the CTS's own judgement), random shapes (the spatial mean of squeeze-excite blocks with keep_dims
either way, every other axis set, 2x upsamplings and odd sizes in each coordinate mode, inf and
NaN), the bound form giving execute's bytes, and NCHW resizes declined to the reference."""
from __future__ import annotations

import logging

import numpy as np
import pytest

pytest.importorskip("hal.backends.numba_kernels")

from hal.compiler import compile_model  # noqa: E402
from hal.executor import bind as hal_bind  # noqa: E402
from hal.executor import execute  # noqa: E402
from hal.model import ModelBuilder  # noqa: E402
from hal.types import OperandType, OperationType  # noqa: E402
from tests.backends.differential import assert_matches_reference, compare, float_cts_examples_on  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the reference's inf - inf, overflows

F32, I32 = OperandType.TENSOR_FLOAT32, OperandType.TENSOR_INT32
Op = OperationType
ORDER = ["numba", "reference"]
MODES = [(False, False), (True, False), (False, True)]  # (align_corners, half_pixel_centers)


@pytest.mark.parametrize("name,op,minimum", [("MEAN", Op.MEAN, 26), ("RESIZE_BILINEAR", Op.RESIZE_BILINEAR, 24)])
def test_cts_float32_cases_meet_the_cts_and_the_reference(name, op, minimum):
    ran = float_cts_examples_on("numba", name, op, ORDER)
    assert ran >= minimum, f"only {ran} float32 CTS examples of {name} ran on the numba kernel"


def _mean(shape, axes, keep):
    red = {a % len(shape) for a in axes}
    out = tuple(1 if i in red else d for i, d in enumerate(shape) if keep or i not in red) or (1,)
    mb = ModelBuilder()
    x = mb.add_operand(F32, shape)
    y = mb.add_operand(F32, out)
    mb.add_operation(Op.MEAN, [x, mb.add_constant(I32, np.asarray(axes, np.int32)), mb.add_int32(int(keep))], [y])
    mb.identify_inputs_and_outputs([x], [y])
    return mb.finish()


def _resize(shape, size, mode, nchw=False):
    n, h, w, c = shape
    out = (n, c, *size) if nchw else (n, *size, c)
    mb = ModelBuilder()
    x = mb.add_operand(F32, (n, c, h, w) if nchw else shape)
    y = mb.add_operand(F32, out)
    ins = [x, mb.add_int32(size[1]), mb.add_int32(size[0]), *(mb.add_bool(v) for v in (nchw, *mode))]
    mb.add_operation(Op.RESIZE_BILINEAR, ins, [y])
    mb.identify_inputs_and_outputs([x], [y])
    return mb.finish()


def _input(rng, model, special=True):
    x = rng.uniform(-3, 3, model.main.operands[model.main.input_indexes[0]].dimensions).astype(np.float32)
    if special and x.size >= 8:
        flat = x.reshape(-1)
        flat[rng.integers(0, flat.size, 3)] = [np.inf, -np.inf, np.nan]
        flat[rng.integers(0, flat.size, 2)] = [3e38, -1e30]
    return [x]


def _backends(model) -> list[str]:
    return [s.backend for s in compile_model(model, backend_order=ORDER).static_plan.steps]


@pytest.mark.parametrize("shape,axes", [
    ((1, 56, 56, 72), [1, 2]), ((2, 7, 7, 1280), [1, 2]), ((1, 112, 112, 16), [2, 1]), ((3, 5, 1, 40), [1, 2]),
    ((4, 6, 33), [-1]), ((2, 3, 4, 5), [3]), ((257,), [0]), ((2, 3, 4, 5), [1, 2, 3]), ((2, 3, 4, 5), [0, 1]),
    ((2, 3, 4, 5), [0, 2]), ((2, 3, 4, 5), [1, 3]), ((2, 3, 4, 5), [0, 3]), ((2, 3, 4, 5), [0, 1, 2, 3]),
    ((4, 3, 2), [1, 0, -3, -3]), ((1, 9, 9, 3), [3, 1]),
], ids=lambda v: "x".join(map(str, v)) if isinstance(v, tuple) else str(v))
def test_mean_every_axis_set_and_keep_dims(shape, axes):
    rng = np.random.default_rng([len(shape), sum(shape), len(axes)])
    for keep in (False, True):
        model = _mean(shape, axes, keep)
        assert _backends(model) == ["numba"]
        for special in (False, True):
            assert_matches_reference(model, _input(rng, model, special), "numba")


def test_mean_of_an_empty_reduction_is_nan_as_the_reference():
    """A zero-sized reduced axis (the CTS reaches it only behind an operation of a zero-sized
    output): NaN, as the reference's (TFLite's fill)."""
    from types import SimpleNamespace

    from hal.backends.numba_kernels import f32_reduce_resize
    from hal.backends.reference import reduce as reference
    from hal.operations.reduce import ReduceParams
    x = np.zeros((2, 0, 3), np.float32)
    ctx = SimpleNamespace(params=ReduceParams((1,), False, (2, 3)), input=lambda k: SimpleNamespace(shape=x.shape))
    ctx.data = f32_reduce_resize.plan_mean(ctx)
    got = f32_reduce_resize.execute_mean(ctx, [x])[0]
    want = reference.execute_mean(SimpleNamespace(data=reference.MeanData((1,), (2, 3), 0),
                                                  outputs=[SimpleNamespace(type=F32)]), [x])[0]
    assert got.shape == want.shape == (2, 3) and np.isnan(got).all() and np.isnan(want).all()


@pytest.mark.parametrize("mode", MODES, ids=["plain", "align_corners", "half_pixel"])
def test_resize_every_coordinate_mode_gives_the_references_bytes(mode):
    rng = np.random.default_rng([int(mode[0]), int(mode[1])])
    cases = [((1, 16, 16, 32), (32, 32)), ((1, 8, 8, 48), (16, 16)), ((2, 5, 7, 3), (9, 4)), ((1, 1, 1, 3), (5, 7)),
             ((1, 3, 3, 17), (1, 1)), ((1, 10, 6, 24), (23, 31)), ((1, 5, 5, 8), (5, 5)), ((1, 2, 3, 5), (65, 9))]
    for _ in range(6):
        cases.append(((int(rng.integers(1, 3)), *(int(v) for v in rng.integers(1, 12, 2)), int(rng.integers(1, 40))),
                      tuple(int(v) for v in rng.integers(1, 30, 2))))
    for shape, size in cases:
        model = _resize(shape, size, mode)
        assert _backends(model) == ["numba"]
        compiled = compile_model(model, backend_order=ORDER)
        reference = compile_model(model, backend_order=["reference"])
        for special in (False, True):
            x = _input(rng, model, special)
            got, want = execute(compiled, x)[0], execute(reference, x)[0]
            assert compare(got, want) is None and got.tobytes() == want.tobytes(), (shape, size)


@pytest.mark.parametrize("model", [
    lambda: _mean((1, 28, 28, 40), [1, 2], True), lambda: _mean((1, 7, 7, 96), [1, 2], False),
    lambda: _mean((2, 3, 4, 5), [0, 2], True), lambda: _mean((6, 50), [1], False),
    *[lambda m=m: _resize((1, 8, 8, 48), (16, 16), m) for m in MODES],
], ids=["mean-keep", "mean-squeeze", "mean-scattered", "mean-last-axis", "resize", "resize-align", "resize-half"])
def test_the_bound_form_writes_executes_bytes(model):
    model = model()
    compiled = compile_model(model, backend_order=ORDER)
    sg = model.main
    x = np.zeros(sg.operands[sg.input_indexes[0]].dimensions, np.float32)
    out = np.zeros(sg.operands[sg.output_indexes[0]].dimensions, np.float32)
    runner = hal_bind(compiled, [x], [out])
    rng = np.random.default_rng(2)
    for special in (False, True):
        x[...] = _input(rng, model, special)[0]
        runner(None, None, None)
        assert out.tobytes() == execute(compiled, [x.copy()])[0].tobytes()


def test_an_nchw_resize_falls_to_the_reference_with_a_reason(caplog):
    model = _resize((1, 4, 6, 5), (8, 12), (False, True), nchw=True)
    with caplog.at_level(logging.INFO, logger="hal.compiler"):
        assert _backends(model) == ["reference"]
    assert any("backend numba declined" in r.getMessage() and "NCHW" in r.getMessage() for r in caplog.records), \
        [r.getMessage() for r in caplog.records]
    assert_matches_reference(model, _input(np.random.default_rng(0), model), "numba", require_assigned=False)


def test_quantized_mean_and_resize_keep_their_kernels():
    from hal.backends.numba_kernels import BACKEND, f32_reduce_resize, reduce
    for op in (Op.MEAN, Op.RESIZE_BILINEAR):
        assert BACKEND.kernel(op).runs_type(OperandType.TENSOR_QUANT8_ASYMM) and BACKEND.kernel(op).runs_type(F32)
    mb = ModelBuilder()
    x = mb.add_operand(OperandType.TENSOR_QUANT8_ASYMM, (1, 4, 4, 8), 0.1, 3)
    y = mb.add_operand(OperandType.TENSOR_QUANT8_ASYMM, (1, 8), 0.1, 3)
    mb.add_operation(Op.MEAN, [x, mb.add_constant(I32, np.array([1, 2], np.int32)), mb.add_int32(0)], [y])
    mb.identify_inputs_and_outputs([x], [y])
    step = compile_model(mb.finish(), backend_order=ORDER).static_plan.steps[0]
    assert step.backend == "numba" and isinstance(step.ctx.data, reduce.MeanData)
    step = compile_model(_mean((1, 4, 4, 8), [1, 2], False), backend_order=ORDER).static_plan.steps[0]
    assert step.backend == "numba" and isinstance(step.ctx.data, f32_reduce_resize.FloatMean)


def test_float_cnns_plan_every_step_on_numba():
    """EfficientNet-B0 (LOGISTIC, MEAN), MobileNetV3-small (HARD_SWISH, MEAN) and the pose network
    (RESIZE_BILINEAR): no float operation left to the reference backend."""
    from delegate.mapping import convert_partition
    from delegate.tfl import read_model
    from nnhal.examples import efficientnet_b0, pose_landmark_like
    from nnhal.examples_mobilenet_v3 import mobilenet_v3_small
    builds = [lambda: efficientnet_b0(np.float32, 64, 10), lambda: mobilenet_v3_small(np.float32, 64, 10),
              lambda: pose_landmark_like(128)]
    for build in builds:
        steps = compile_model(convert_partition(read_model(build())).model, backend_order=ORDER).static_plan.steps
        assert {s.backend for s in steps} == {"numba"}, sorted({(Op(s.ctx.op_type).name, s.backend) for s in steps})

