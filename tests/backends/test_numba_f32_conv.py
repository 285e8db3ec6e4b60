"""The numba backend's float32 CONV_2D (numba_kernels/f32_conv.py) against the reference backend,
with NNAPI CTS's float criteria: every CTS case of float CONV_2D it takes, and geometries covering
its three ways of finding the rows (1x1 in place, whole input rows for a landmark head, gathered
windows: strides, explicit and implicit padding, dilation), channel counts off its tiles, batches,
activations, NaN and infinity; the ``conv_epilogue`` (residual ADD, PRELU, hard-swish, swish, a
zero PAD before) on each way; the bound form; and the forms it declines."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("hal.backends.numba_kernels")

from hal.backends.numba_kernels import f32_conv  # noqa: E402
from hal.compiler import compile_model  # noqa: E402
from hal.executor import OperationTiming, execute  # noqa: E402
from hal.executor import bind as hal_bind  # noqa: E402
from hal.model import ModelBuilder  # noqa: E402
from hal.types import OperandType, OperationType  # noqa: E402
from tests.backends.differential import compare, float_cts_examples_on  # noqa: E402

F32 = OperandType.TENSOR_FLOAT32
CONV = OperationType.CONV_2D
ORDER = ["numba", "reference"]


def conv_model(shape, out_c, k, *, stride=(1, 1), pads=None, scheme=1, dilation=(1, 1), act=0, nchw=False,
               filter_input=False, rng=None, kw=None):
    """A one-CONV_2D model: input ``shape`` (NHWC), ``out_c`` filters of k x kw; explicit ``pads``
    (left, right, top, bottom) or an implicit ``scheme`` (1 SAME, 2 VALID)."""
    rng = rng or np.random.default_rng(0)
    kw = kw or k
    n, h, w, c = shape
    mb = ModelBuilder()
    x = mb.add_operand(F32, (n, c, h, w) if nchw else shape)
    filt = (rng.standard_normal((out_c, k, kw, c)) / np.sqrt(k * kw * c)).astype(np.float32)
    f = mb.add_operand(F32, filt.shape) if filter_input else mb.add_constant(F32, filt)
    b = mb.add_constant(F32, rng.uniform(-0.5, 0.5, out_c).astype(np.float32))
    geometry = [mb.add_int32(p) for p in pads] if pads is not None else [mb.add_int32(scheme)]
    args = [x, f, b, *geometry, mb.add_int32(stride[1]), mb.add_int32(stride[0]), mb.add_int32(act)]
    if nchw or dilation != (1, 1):
        args += [mb.add_bool(nchw), mb.add_int32(dilation[1]), mb.add_int32(dilation[0])]
    compiled_shape = compile_model_shape(shape, out_c, k, kw, stride, pads, scheme, dilation)
    y = mb.add_operand(F32, (n, out_c, *compiled_shape) if nchw else (n, *compiled_shape, out_c))
    mb.add_operation(CONV, args, [y])
    mb.identify_inputs_and_outputs([x, f] if filter_input else [x], [y])
    return mb.finish()


def compile_model_shape(shape, out_c, k, kw, stride, pads, scheme, dilation):
    _, h, w, _ = shape
    eff_h, eff_w = (k - 1) * dilation[0] + 1, (kw - 1) * dilation[1] + 1
    if pads is not None:
        left, right, top, bottom = pads
        return (h + top + bottom - eff_h) // stride[0] + 1, (w + left + right - eff_w) // stride[1] + 1
    if scheme == 1:
        return -(-h // stride[0]), -(-w // stride[1])
    return (h - eff_h) // stride[0] + 1, (w - eff_w) // stride[1] + 1


def _inputs(model, rng):
    sg = model.main
    return [rng.uniform(-2, 2, sg.operands[i].dimensions).astype(np.float32) for i in sg.input_indexes]


def _check(model, args, *, on_numba=True):
    compiled = compile_model(model, backend_order=ORDER)
    timings: list[OperationTiming] = []
    got = execute(compiled, args, timings)
    assert (timings[0].backend == "numba") == on_numba, timings
    want = execute(compile_model(model, backend_order=["reference"]), args)
    for g, w in zip(got, want, strict=True):
        why = compare(g, w)
        assert why is None, why
    plan = compiled.static_plan
    outs = [np.empty(plan.infos[i].shape, plan.infos[i].dtype) for i in compiled.output_indexes]
    runner = hal_bind(compiled, [a.copy() for a in args], outs)
    if runner is not None:  # the bound form writes the same bytes as execute
        runner(None, None, None)
        assert all(np.array_equal(o, g, equal_nan=True) for o, g in zip(outs, got))
    return compiled, got


def test_cts_float_cases_it_takes_meet_the_cts_and_the_reference():
    ran = float_cts_examples_on("numba", "CONV_2D", CONV, ORDER)
    assert ran >= 10, f"only {ran} float CTS examples ran on the numba kernel"


@pytest.mark.parametrize("shape,out_c,k,kw_,stride,pads,scheme,dilation,act,mode", [
    ((1, 9, 7, 16), 32, 1, 1, (1, 1), None, 1, (1, 1), 0, f32_conv.IN_PLACE),
    ((2, 5, 6, 40), 70, 1, 1, (1, 1), (0, 0, 0, 0), 1, (1, 1), 3, f32_conv.IN_PLACE),  # narrow last tile, RELU6
    ((1, 11, 13, 3), 64, 3, 3, (2, 2), None, 1, (1, 1), 1, f32_conv.GATHERED),  # a stem
    ((1, 10, 10, 17), 33, 3, 3, (1, 1), (2, 0, 1, 2), 1, (1, 1), 2, f32_conv.GATHERED),  # asymmetric pads, RELU1
    ((2, 12, 12, 8), 20, 3, 3, (1, 2), None, 2, (2, 2), 0, f32_conv.GATHERED),  # dilation, VALID, strides
    ((1, 8, 8, 5), 16, 5, 3, (2, 1), None, 1, (1, 1), 0, f32_conv.GATHERED),  # rectangular kernel
    ((1, 9, 9, 12), 24, 1, 1, (2, 2), None, 1, (1, 1), 0, f32_conv.GATHERED),  # strided 1x1
    # windows inside the image read in place (_windows_row), the edge pixels and rows gathered:
    ((1, 24, 26, 3), 16, 3, 3, (2, 2), (1, 1, 1, 1), 1, (1, 1), 0, f32_conv.GATHERED),  # padded stem, narrow
    ((2, 17, 19, 3), 24, 5, 5, (2, 2), None, 1, (1, 1), 0, f32_conv.GATHERED),  # 5x5 stem, partial tile
    ((1, 7, 10, 6), 40, 3, 3, (1, 3), (0, 2, 1, 0), 1, (1, 1), 1, f32_conv.GATHERED),  # stride 3, right pad
    ((1, 5, 3, 4), 8, 3, 5, (1, 1), (2, 2, 1, 1), 1, (1, 1), 0, f32_conv.GATHERED),  # wider than the image
    ((1, 30, 21, 32), 72, 3, 3, (1, 1), None, 1, (1, 1), 0, f32_conv.GATHERED),  # two tiles and a narrow one
    # row counts that end in blocks of 4-7 rows (f32_conv._row_split), and one-row maps:
    ((1, 7, 7, 24), 40, 1, 1, (1, 1), None, 1, (1, 1), 0, f32_conv.IN_PLACE),  # 49 rows: 5 x 8, 4, 5
    ((2, 3, 3, 20), 36, 1, 1, (1, 1), None, 1, (1, 1), 3, f32_conv.IN_PLACE),  # 18 rows: 8, 5, 5
    ((1, 1, 1, 96), 200, 1, 1, (1, 1), None, 1, (1, 1), 1, f32_conv.IN_PLACE),  # a squeeze-excite's 1x1 map
    ((3, 1, 1, 40), 24, 1, 1, (1, 1), None, 1, (1, 1), 0, f32_conv.IN_PLACE),  # 3 rows: 2, 1
    ((1, 9, 9, 16), 48, 3, 3, (1, 1), None, 1, (1, 1), 0, f32_conv.GATHERED),  # rows of 7 windows in place
    ((1, 4, 4, 64), 213, 4, 4, (1, 1), None, 2, (1, 1), 0, f32_conv.WHOLE_ROWS),  # a landmark head
    ((3, 6, 5, 7), 15, 2, 5, (2, 1), None, 2, (1, 1), 1, f32_conv.WHOLE_ROWS),  # as wide as the map, 3 rows out
])
def test_geometries_match_the_reference(shape, out_c, k, kw_, stride, pads, scheme, dilation, act, mode):
    rng = np.random.default_rng(out_c)
    model = conv_model(shape, out_c, k, kw=kw_, stride=stride, pads=pads, scheme=scheme, dilation=dilation,
                       act=act, rng=rng)
    compiled, _ = _check(model, _inputs(model, rng))
    assert int(compiled.static_plan.steps[0].ctx.data.geometry[15]) == mode


@pytest.mark.parametrize("rows", [*range(1, 40), 49, 63, 64, 99, 196])
def test_a_row_split_covers_every_row_in_compiled_blocks(rows):
    full, a, b = f32_conv._row_split(rows)
    assert 8 * full + a + b == rows
    assert {a, b} - {0} <= set(f32_conv.ROW_BLOCKS)
    if rows >= 4:  # no tail block too short to keep the multiply-adds busy
        assert all(m == 0 or m >= 4 for m in (a, b)), (full, a, b)


def test_nan_and_infinity_propagate_as_in_the_reference():
    rng = np.random.default_rng(5)
    for k in (1, 3):
        model = conv_model((1, 6, 6, 8), 20, k, rng=rng)
        x = _inputs(model, rng)
        x[0][0, 2, 3, 1] = np.nan
        x[0][0, 4, 1, 5] = np.inf
        _, got = _check(model, x)
        assert np.isnan(got[0]).any()


def epilogue_model(shape, out_c, k, stride, pads, members, add_act=0, rng=None, *, border=None, pad_value=0.0,
                   depthwise=False):
    """CONV_2D (explicit ``pads`` left, right, top, bottom, or SAME for None) then, as
    ``members`` says, an ADD of its output and a second input (``add_act``), then a PRELU with
    per-channel slopes of both signs, then "hard_swish" or "swish" (LOGISTIC, then MUL of its
    input and output): the ``conv_epilogue`` pattern. ``border``: a PAD (PAD_V2 of ``pad_value``
    where that is not 0) of the input first, [[before, after], ...] per dimension. ``depthwise``:
    a DEPTHWISE_CONV_2D (multiplier 1: ``out_c`` is the input's channels)."""
    rng = rng or np.random.default_rng(0)
    mb = ModelBuilder()
    x = mb.add_operand(F32, shape)
    inputs, src = [x], x
    if border is not None:
        shape = tuple(d + b + a for d, (b, a) in zip(shape, border))
        src = mb.add_operand(F32, shape)
        pad_args = [x, mb.add_constant(OperandType.TENSOR_INT32, np.array(border, np.int32))]
        if pad_value:
            pad_args.append(mb.add_float32(pad_value))
        mb.add_operation(OperationType.PAD_V2 if pad_value else OperationType.PAD, pad_args, [src])
    n, h, w, c = shape
    filt = (rng.standard_normal((1, k, k, c) if depthwise else (out_c, k, k, c)) / np.sqrt(k * k * c)) \
        .astype(np.float32)
    geometry = [mb.add_int32(p) for p in pads] if pads is not None else [mb.add_int32(1)]
    args = [src, mb.add_constant(F32, filt), mb.add_constant(F32, rng.uniform(-0.5, 0.5, out_c).astype(np.float32)),
            *geometry, mb.add_int32(stride[1]), mb.add_int32(stride[0]), *([mb.add_int32(1)] if depthwise else []),
            mb.add_int32(0)]
    oh, ow = compile_model_shape(shape, out_c, k, k, stride, pads, 1, (1, 1))
    out_shape = (n, oh, ow, out_c)
    y = mb.add_operand(F32, out_shape)
    mb.add_operation(OperationType.DEPTHWISE_CONV_2D if depthwise else CONV, args, [y])
    if "add" in members:
        r, z = mb.add_operand(F32, out_shape), mb.add_operand(F32, out_shape)
        mb.add_operation(OperationType.ADD, [y, r, mb.add_int32(add_act)], [z])
        inputs.append(r)
        y = z
    if "prelu" in members:
        alpha = mb.add_constant(F32, rng.uniform(-0.5, 1.5, (1, 1, out_c)).astype(np.float32))
        z = mb.add_operand(F32, out_shape)
        mb.add_operation(OperationType.PRELU, [y, alpha], [z])
        y = z
    if "hard_swish" in members:
        z = mb.add_operand(F32, out_shape)
        mb.add_operation(OperationType.HARD_SWISH, [y], [z])
        y = z
    if "swish" in members:
        s, z = mb.add_operand(F32, out_shape), mb.add_operand(F32, out_shape)
        mb.add_operation(OperationType.LOGISTIC, [y], [s])
        mb.add_operation(OperationType.MUL, [s, y, mb.add_int32(0)], [z])  # either order is a swish
        y = z
    mb.identify_inputs_and_outputs(inputs, [y])
    return mb.finish()


def _operations(members) -> int:
    return sum({"swish": 2}.get(m, 1) for m in members)


@pytest.mark.parametrize("shape,out_c,k,stride,pads,members,add_act", [
    ((1, 9, 11, 24), 40, 1, (1, 1), None, ("add", "prelu"), 0),  # 1x1 in place: a tile and a narrow one
    ((2, 6, 7, 16), 16, 1, (1, 1), None, ("add",), 3),  # residual with RELU6 only
    ((1, 5, 9, 32), 70, 1, (1, 1), None, ("prelu",), 0),  # PRELU only, 70 channels
    ((2, 10, 13, 8), 20, 3, (1, 1), None, ("add", "prelu"), 2),  # 3x3 SAME: edge pixels gathered, RELU1
    ((1, 24, 26, 3), 16, 3, (2, 2), (1, 1, 1, 1), ("prelu",), 0),  # a padded stem and its PRELU
    ((1, 4, 4, 16), 33, 4, (1, 1), (0, 0, 0, 0), ("add", "prelu"), 0),  # a head as wide as its map
    ((1, 9, 11, 24), 40, 1, (1, 1), None, ("hard_swish",), 0),  # MobileNetV3's expansions
    ((1, 24, 26, 3), 16, 3, (2, 2), (0, 1, 0, 1), ("hard_swish",), 0),  # its stem: windows and gathered edges
    ((1, 4, 4, 16), 33, 4, (1, 1), (0, 0, 0, 0), ("hard_swish",), 0),  # a head: after the whole row
    ((2, 7, 5, 16), 48, 1, (1, 1), None, ("swish",), 0),  # EfficientNet's
    ((1, 10, 13, 8), 20, 3, (1, 1), None, ("swish",), 0),
    ((2, 6, 7, 16), 16, 1, (1, 1), None, ("add", "prelu", "hard_swish"), 0),  # all four
    ((1, 7, 7, 24), 40, 1, (1, 1), None, ("add", "prelu"), 0),  # 49 rows: the fused blocks of 4 and 5
    ((1, 1, 1, 64), 72, 1, (1, 1), None, ("add", "hard_swish"), 0),  # a 1x1 map: one row, then the epilogue
])
def test_the_epilogue_matches_the_reference(shape, out_c, k, stride, pads, members, add_act):
    """The residual ADD, the PRELU and the activation applied to the convolution's sums (in
    registers where the windows are read in place, else on the rows just computed): the same
    results as the operations on the reference backend, NaN and infinity in the residual and
    beyond the activations' edges included."""
    rng = np.random.default_rng(out_c + k + len(members))
    model = epilogue_model(shape, out_c, k, stride, pads, members, add_act, rng)
    compiled = compile_model(model, backend_order=ORDER)
    program = compiled.static_plan.program
    assert [getattr(s.ctx, "pattern", None) for s in program] == ["conv_epilogue"], program
    assert len(program[0].operations) == 1 + _operations(members)
    args = _inputs(model, rng)
    args[0] *= 4  # sums beyond hard-swish's clip points and into the logistic's tails
    if "add" in members:
        args[1][0, 0, 0, :3] = (np.nan, np.inf, -np.inf)
    _, got = _check(model, args)
    if "add" in members:
        assert np.isnan(got[0][0, 0, 0, 0])


@pytest.mark.parametrize("shape,k,stride,members", [
    ((1, 12, 13, 16), 3, (1, 1), ("hard_swish",)),
    ((2, 9, 11, 40), 5, (2, 2), ("hard_swish",)),  # a masked last block
    ((1, 8, 9, 144), 3, (2, 2), ("swish",)),  # blocks on the output's cache lines
    ((1, 7, 7, 24), 4, (1, 1), ("swish",)),  # the general kernel
])
def test_a_depthwise_layers_activation_is_its_epilogue(shape, k, stride, members):
    rng = np.random.default_rng(shape[-1] + k)
    model = epilogue_model(shape, shape[-1], k, stride, None, members, 0, rng, depthwise=True)
    compiled = compile_model(model, backend_order=ORDER)
    program = compiled.static_plan.program
    assert [getattr(s.ctx, "pattern", None) for s in program] == ["conv_epilogue"], program
    assert len(program[0].operations) == 1 + _operations(members)
    args = _inputs(model, rng)
    args[0] *= 4
    args[0][0, 1, 2, :3] = (np.nan, np.inf, -np.inf)
    _check(model, args)


@pytest.mark.parametrize("border,pads,stride,members", [
    (((0, 0), (0, 1), (0, 1), (0, 0)), (0, 0, 0, 0), (2, 2), ("hard_swish",)),  # Keras' ZeroPadding2D, stride 2
    (((0, 0), (1, 1), (2, 0), (0, 0)), (1, 0, 0, 1), (1, 1), ("add", "prelu")),  # both pads at once
    (((0, 0), (3, 3), (3, 3), (0, 0)), None, (1, 1), ()),  # a border wider than the filter
])
@pytest.mark.parametrize("depthwise", [False, True])
def test_a_zero_pad_before_the_convolution_is_its_padding(border, pads, stride, members, depthwise):
    """PAD, then the convolution reading only the padded tensor: one step, reading the unpadded
    input, with the reference's results."""
    if depthwise and ("add" in members or "prelu" in members):
        members = ("hard_swish",)
    rng = np.random.default_rng(len(border) + stride[0])
    shape, c = (1, 9, 10, 16), 16
    model = epilogue_model(shape, c, 3, stride, pads, members, 0, rng, border=border, depthwise=depthwise)
    compiled = compile_model(model, backend_order=ORDER)
    program = compiled.static_plan.program
    assert [getattr(s.ctx, "pattern", None) for s in program] == ["conv_epilogue"], program
    assert len(program[0].operations) == 2 + _operations(members)
    _check(model, _inputs(model, rng))


@pytest.mark.parametrize("border,pad_value", [
    (((0, 0), (1, 1), (1, 1), (0, 0)), 1.0),  # not zeros
    (((0, 0), (1, 1), (1, 1), (0, 2)), 0.0),  # channels padded too
])
def test_other_pads_stay_their_own_step(border, pad_value):
    rng = np.random.default_rng(3)
    model = epilogue_model((1, 6, 7, 8), 8, 3, (1, 1), (0, 0, 0, 0), (), 0, rng, border=border, pad_value=pad_value)
    compiled = compile_model(model, backend_order=ORDER)
    assert [s.ctx.op_type for s in compiled.static_plan.program] == [
        OperationType.PAD_V2 if pad_value else OperationType.PAD, CONV]
    _check(model, _inputs(model, rng))


@pytest.mark.parametrize("kind,why", [("nchw", "NCHW"), ("filter_input", "not a constant")])
def test_forms_it_declines_run_on_the_reference_backend(kind, why, caplog):
    rng = np.random.default_rng(2)
    model = conv_model((1, 6, 6, 8), 8, 3, rng=rng, **{kind: True})
    with caplog.at_level("INFO", logger="hal.compiler"):
        _check(model, _inputs(model, rng), on_numba=False)
    assert why in caplog.text
