"""The numba backend's integer kernels (VNNI GEMM tiles, vector depthwise, computed ADD/SUB/MUL,
byte lookups) against the reference backend, bit for bit, on random data and on the shapes that
reach every tail: K not a multiple of 4, N not a multiple of 16 nor of 64, row counts that leave
partial tiles, channel counts not a multiple of 16, borders, strides, dilation, per-tensor and
per-channel filters, uint8 and int8, multipliers above one (left shifts) and int32 wrap-around."""
from __future__ import annotations

import numpy as np
import pytest

numba_kernels = pytest.importorskip("hal.backends.numba_kernels")

from hal.backends.numba_kernels import conv, gemm, lut, vnni  # noqa: E402
from hal.compiler import compile_model  # noqa: E402
from hal.model import ModelBuilder, SymmPerChannelQuantParams  # noqa: E402
from hal.types import OperandType, OperationType  # noqa: E402
from tests.backends.differential import assert_matches_reference  # noqa: E402
from tests.harness import random_tensor  # noqa: E402

QU8 = OperandType.TENSOR_QUANT8_ASYMM
QS8 = OperandType.TENSOR_QUANT8_ASYMM_SIGNED
QPC = OperandType.TENSOR_QUANT8_SYMM_PER_CHANNEL
I32 = OperandType.TENSOR_INT32
DTYPE = {QU8: np.uint8, QS8: np.int8}
Op = OperationType


def _filter_values(rng, w_type, shape):
    if w_type == QU8:
        return rng.integers(0, 256, shape).astype(np.uint8)
    return rng.integers(-127, 128, shape).astype(np.int8)


def _weights(mb, rng, x_type, w_type, shape, out_c, x_scale, w_zp, channel_dim=0):
    """(filter operand, bias scale, filter scales): per-tensor (``w_type`` = input type, zero point
    ``w_zp``) or per-channel symmetric."""
    w = _filter_values(rng, w_type, shape)
    if w_type == QPC:
        scales = rng.uniform(0.005, 0.05, out_c).astype(np.float32)
        op = mb.add_constant(QPC, w, channel_quant=SymmPerChannelQuantParams(tuple(map(float, scales)), channel_dim))
        return op, 0.0
    op = mb.add_constant(w_type, w, scale=0.02, zero_point=w_zp)
    return op, float(np.float32(x_scale) * np.float32(0.02))


def _bias(mb, rng, out_c, scale, big=False):
    lo, hi = ((1 << 31) - 4000, (1 << 31) - 1) if big else (-20000, 20000)
    return mb.add_constant(I32, rng.integers(lo, hi, out_c).astype(np.int32), scale=scale)


def _finish(mb, op, inputs, x, y):
    mb.add_operation(op, inputs, [y])
    mb.identify_inputs_and_outputs([x], [y])
    return mb.finish()


def _conv_model(x_type, w_type, x_shape, out_c, k, *, stride=1, dilation=1, pads=(0, 0, 0, 0), groups=1,
                y_scale=0.5, big_bias=False, act=0, seed=0, w_zp=None):
    rng = np.random.default_rng(seed)
    zp = {QU8: 131, QS8: -3}[x_type]
    mb = ModelBuilder()
    x = mb.add_operand(x_type, x_shape, scale=0.05, zero_point=zp)
    in_g = x_shape[3] // groups
    if w_zp is None:
        w_zp = 0 if w_type != QU8 else 119
    w, b_scale = _weights(mb, rng, x_type, w_type, (out_c, k, k, in_g), out_c, 0.05, w_zp)
    b = _bias(mb, rng, out_c, b_scale, big_bias)
    y = mb.add_operand(x_type, (), scale=y_scale, zero_point={QU8: 120, QS8: 5}[x_type])
    params = [mb.add_int32(v) for v in pads] + [mb.add_int32(stride), mb.add_int32(stride)]
    if groups > 1:
        return _finish(mb, Op.GROUPED_CONV_2D, [x, w, b, *params, mb.add_int32(groups), mb.add_int32(act),
                                                mb.add_bool(False)], x, y)
    dw, dh = dilation if isinstance(dilation, tuple) else (dilation, dilation)  # NNAPI's order: width, height
    params += [mb.add_int32(act), mb.add_bool(False), mb.add_int32(dw), mb.add_int32(dh)]
    return _finish(mb, Op.CONV_2D, [x, w, b, *params], x, y)


def _fc_model(x_type, batch, k, n, *, y_scale=0.5, big_bias=False, seed=0):
    rng = np.random.default_rng(seed)
    zp = {QU8: 128, QS8: 0}[x_type]
    mb = ModelBuilder()
    x = mb.add_operand(x_type, (batch, k), scale=0.05, zero_point=zp + 7)
    w, b_scale = _weights(mb, rng, x_type, x_type, (n, k), n, 0.05, zp - 9 if x_type == QU8 else 0)
    b = _bias(mb, rng, n, b_scale, big_bias)
    y = mb.add_operand(x_type, (), scale=y_scale, zero_point=zp - 2)
    return _finish(mb, Op.FULLY_CONNECTED, [x, w, b, mb.add_int32(0)], x, y)


def _depthwise_model(x_type, w_type, x_shape, k, *, stride=1, dilation=1, pads=(1, 1, 1, 1), multiplier=1,
                     y_scale=0.5, act=0, seed=0, w_zp=100):
    rng = np.random.default_rng(seed)
    zp = {QU8: 140, QS8: 9}[x_type]
    out_c = x_shape[3] * multiplier
    mb = ModelBuilder()
    x = mb.add_operand(x_type, x_shape, scale=0.05, zero_point=zp)
    w, b_scale = _weights(mb, rng, x_type, w_type, (1, k, k, out_c), out_c, 0.05, w_zp if w_type == QU8 else 0,
                          channel_dim=3)
    b = _bias(mb, rng, out_c, b_scale)
    y = mb.add_operand(x_type, (), scale=y_scale, zero_point={QU8: 127, QS8: -1}[x_type])
    params = [mb.add_int32(v) for v in pads] + [mb.add_int32(stride), mb.add_int32(stride),
                                                 mb.add_int32(multiplier), mb.add_int32(act), mb.add_bool(False),
                                                 mb.add_int32(dilation), mb.add_int32(dilation)]
    return _finish(mb, Op.DEPTHWISE_CONV_2D, [x, w, b, *params], x, y)


def _data(model):
    steps = compile_model(model, backend_order=["numba", "reference"]).static_plan.steps
    assert steps[0].backend == "numba"
    return steps[0].ctx.data


def _check(model, shape, x_type, seeds=(0, 1)):
    for seed in seeds:
        x = random_tensor(np.random.default_rng(100 + seed), shape, DTYPE[x_type])
        assert_matches_reference(model, [x], "numba")
    lo, hi = np.iinfo(DTYPE[x_type]).min, np.iinfo(DTYPE[x_type]).max
    for v in (lo, hi):  # extreme inputs: the largest sums either way
        assert_matches_reference(model, [np.full(shape, v, DTYPE[x_type])], "numba")


needs_vnni = pytest.mark.skipif(not vnni.AVAILABLE, reason="no AVX-512 VNNI: the float32 BLAS path runs")


@needs_vnni
@pytest.mark.parametrize("x_type", [QU8, QS8])
@pytest.mark.parametrize("batch,k,n", [(1, 1, 1), (5, 3, 17), (13, 5, 33), (7, 16, 16), (9, 64, 70), (6, 131, 65),
                                       (31, 40, 129), (4, 12, 56), (9, 20, 64)])
def test_fully_connected_tails(x_type, batch, k, n):
    model = _fc_model(x_type, batch, k, n, seed=k * n)
    d = _data(model)
    assert isinstance(d, conv.IntGemm) and d.direct == (k % 4 == 0)
    _check(model, (batch, k), x_type)


@needs_vnni
@pytest.mark.parametrize("x_type", [QU8, QS8])
def test_multipliers_above_one_and_int32_wrap_around(x_type):
    """Left shifts (an output scale far below input × filter scale) and a bias near INT32_MAX, so
    the int32 accumulator wraps as TFLite's does."""
    for n in (20, 72):  # 72: the four-panel tiles' packed epilogue too
        for kwargs in (dict(y_scale=1e-5), dict(big_bias=True), dict(y_scale=1e-5, big_bias=True)):
            model = _fc_model(x_type, 11, 24, n, **kwargs)
            if "y_scale" in kwargs:
                assert (_data(model).groups[0].left[:n] > 0).all()
            _check(model, (11, 24), x_type)


@needs_vnni
@pytest.mark.parametrize("x_type,w_type", [(QU8, QU8), (QS8, QS8), (QS8, QPC), (QU8, QPC)])
@pytest.mark.parametrize("case", [
    dict(x_shape=(1, 7, 9, 8), out_c=20, k=1),  # 1x1, read in place
    dict(x_shape=(2, 5, 6, 6), out_c=17, k=1),  # 1x1 with K % 4 != 0: gathered
    dict(x_shape=(1, 9, 11, 3), out_c=33, k=3, stride=2, pads=(1, 1, 1, 1)),
    dict(x_shape=(1, 10, 10, 5), out_c=16, k=3, dilation=2, pads=(2, 1, 0, 2)),
    dict(x_shape=(1, 6, 7, 12), out_c=70, k=2, stride=1, pads=(0, 1, 1, 0), act=1),
    # channels a multiple of 4: taps read in place through gemm.indirection's table
    dict(x_shape=(2, 9, 8, 8), out_c=40, k=3, stride=2, pads=(1, 1, 1, 1)),
    dict(x_shape=(1, 10, 9, 16), out_c=72, k=3, dilation=2, pads=(2, 1, 1, 2)),
    dict(x_shape=(1, 7, 7, 4), out_c=56, k=3, pads=(1, 1, 1, 1), act=1),
    dict(x_shape=(1, 7, 7, 8), out_c=24, k=1, stride=2),
    # other channel counts: each filter row read in place (row_segments), the
    # segments the image's edges cut gathered
    dict(x_shape=(2, 8, 9, 3), out_c=20, k=5, pads=(2, 2, 2, 2), act=1),
    dict(x_shape=(1, 9, 7, 6), out_c=16, k=3, stride=2, pads=(0, 1, 0, 1)),
    dict(x_shape=(1, 6, 5, 5), out_c=36, k=2, pads=(1, 0, 0, 1)),
])
def test_convolutions(x_type, w_type, case):
    model = _conv_model(x_type, w_type, **case)
    d = _data(model)
    assert isinstance(d, conv.IntGemm)
    c = case["x_shape"][3]
    assert d.direct == (case["k"] == 1 and case.get("stride", 1) == 1 and c % 4 == 0)
    assert (d.ind is not None) == (not d.direct and c % 4 == 0)
    assert (d.rows is not None) == (not d.direct and c % 4 != 0 and case.get("dilation", 1) == 1)
    # RELU's clamp and no row term (int8 filters, zero point 0): the tiles' cheaper epilogue
    assert all(g.general == (0 if case.get("act") and w_type != QU8 else 1) for g in d.groups)
    _check(model, case["x_shape"], x_type)


@needs_vnni
@pytest.mark.parametrize("x_type,w_type", [(QU8, QU8), (QS8, QPC)])
@pytest.mark.parametrize("in_c,groups,k", [(8, 2, 1), (6, 2, 1), (12, 3, 3)])
def test_grouped_convolutions(x_type, w_type, in_c, groups, k):
    pads = (1, 1, 1, 1) if k == 3 else (0, 0, 0, 0)
    model = _conv_model(x_type, w_type, (1, 6, 5, in_c), 6 * groups, k, groups=groups, pads=pads)
    assert isinstance(_data(model), conv.IntGemm)
    _check(model, (1, 6, 5, in_c), x_type)


@needs_vnni
@pytest.mark.parametrize("x_type,w_type,w_zp", [(QU8, QU8, 119), (QS8, QS8, 0), (QS8, QS8, 7), (QS8, QPC, 0)])
@pytest.mark.parametrize("in_c,groups", [(16, 1), (16, 2)])
def test_1x1_convolutions_over_several_row_blocks(x_type, w_type, w_zp, in_c, groups):
    """More rows than one of gemm's row blocks (BLOCK_BYTES of the left operand: int8 rows are
    flipped to the tiles' unsigned bytes a block at a time), each block ending in a partial tile:
    rows back to back (one group) and a group's strided rows, with and without a row term (an
    int8 filter's zero point other than 0)."""
    shape = (1, 67, 71, in_c)
    assert shape[1] * shape[2] > 2 * gemm.BLOCK_BYTES // (in_c // groups)
    model = _conv_model(x_type, w_type, shape, 8 * groups, 1, groups=groups, w_zp=w_zp)
    d = _data(model)
    assert isinstance(d, conv.IntGemm) and d.direct
    assert all((g.row_coef != 0) == (w_zp != (128 if w_type == QU8 else 0)) for g in d.groups)
    _check(model, shape, x_type)


@pytest.mark.parametrize("x_type,w_type,w_zp", [(QU8, QU8, 100), (QU8, QU8, 128), (QS8, QPC, 0), (QU8, QPC, 0)])
@pytest.mark.parametrize("case", [
    dict(c=7, k=3), dict(c=16, k=3, stride=2, pads=(0, 1, 0, 1)), dict(c=40, k=3, dilation=2, pads=(2, 2, 2, 2)),
    dict(c=33, k=5, pads=(2, 2, 2, 2)), dict(c=20, k=5, stride=2, pads=(1, 2, 1, 2)), dict(c=5, k=3, pads=(0, 0, 0, 0)),
    dict(c=16, k=3, y_scale=1e-5),  # multipliers above one
    dict(c=48, k=3, stride=3, pads=(1, 1, 1, 1)), dict(c=24, k=3, pads=(2, 0, 1, 2)),  # stride 3; padding 2
    dict(c=18, k=5, pads=(0, 0, 0, 0), act=3),  # RELU6
    dict(c=21, k=5, pads=(2, 2, 2, 2), shape=(1, 3, 4, 21)),  # every window crosses the image's edges
    # 64 channels and more (3x3): dw_plane64 per whole 64, dw_row per 16 of the rest
    dict(c=80, k=3, pads=(1, 1, 1, 1)), dict(c=136, k=3, stride=2, pads=(0, 1, 0, 1), act=3),
    dict(c=64, k=5, pads=(2, 2, 2, 2), y_scale=1e-5), dict(c=128, k=5, stride=2, pads=(1, 2, 1, 2), act=3),
    dict(c=70, k=5, pads=(2, 2, 2, 2), shape=(1, 3, 4, 70)), dict(c=120, k=3, pads=(1, 1, 1, 1), act=3),
])
def test_depthwise(x_type, w_type, w_zp, case):
    """The filter-column kernels (dw_vnni: filter minus zero point within int8, stride 1 or 2 across,
    dilation 1 across) and the per-pixel one (simd.dw_run: the others, and the border columns)."""
    case = dict(case)
    c = case.pop("c")
    shape = case.pop("shape", (2, 9, 8, c))
    model = _depthwise_model(x_type, w_type, shape, w_zp=w_zp, **case)
    d = _data(model)
    assert d.lanes is not None
    by_columns = vnni.AVAILABLE and w_zp != 100 and case.get("dilation", 1) == 1 and case.get("stride", 1) <= 2
    assert (d.rows is not None) == by_columns
    assert (d.rows64 is not None) == (by_columns and case["k"] == 3 and c >= 64)
    assert d.general == (0 if case.get("act") == 3 else 1)  # RELU6's clamp: the cheaper requantization
    _check(model, shape, x_type)


def test_depthwise_multiplier_above_one_takes_the_general_kernel():
    model = _depthwise_model(QS8, QPC, (1, 6, 6, 5), 3, multiplier=2)
    assert _data(model).lanes is None
    _check(model, (1, 6, 6, 5), QS8)


def _binary(op, x_type, a_shape, b_shape, act=0, out_scale=0.2):
    zp = {QU8: 128, QS8: 0}[x_type]
    mb = ModelBuilder()
    a = mb.add_operand(x_type, a_shape, scale=0.1, zero_point=zp)
    b = mb.add_operand(x_type, b_shape, scale=0.07, zero_point=zp - 3)
    y = mb.add_operand(x_type, (), scale=out_scale, zero_point=zp + 1)
    mb.add_operation(op, [a, b, mb.add_int32(act)], [y])
    mb.identify_inputs_and_outputs([a, b], [y])
    return mb.finish()


@pytest.mark.parametrize("op", [Op.ADD, Op.SUB, Op.MUL])
@pytest.mark.parametrize("x_type", [QU8, QS8])
@pytest.mark.parametrize("shapes", [((2, 3, 5, 7), (2, 3, 5, 7)), ((2, 3, 5, 7), (5, 7)), ((1, 1, 1, 19), (3, 4, 19)),
                                    ((1, 4, 4, 33), (1, 4, 4, 33)),
                                    ((1, 6, 5, 40), (1, 1, 1, 40))])  # a per-channel gate: one call, rows of 40
@pytest.mark.parametrize("act,out_scale", [(0, 0.2), (1, 0.2), (0, 0.0075)])  # NNAPI: MUL out scale > s1·s2
def test_binary_operations_are_computed(op, x_type, shapes, act, out_scale):
    a_shape, b_shape = shapes
    model = _binary(op, x_type, a_shape, b_shape, act, out_scale)
    assert _data(model).arith is not None  # the computed kernel reproduced the whole table
    rng = np.random.default_rng(5)
    dt = DTYPE[x_type]
    assert_matches_reference(model, [random_tensor(rng, a_shape, dt), random_tensor(rng, b_shape, dt)], "numba")


def test_a_computed_kernel_that_misses_the_table_is_not_used(monkeypatch):
    """The arithmetic kernel is admitted only by agreeing with the reference on every input pair."""
    monkeypatch.setattr(lut, "tabulate", lambda ctx, n: np.zeros(1 << (8 * n), np.uint8))
    assert _data(_binary(Op.ADD, QU8, (4, 4), (4, 4))).arith is None


@pytest.mark.skipif(not vnni.VBMI, reason="no AVX-512 VBMI")
@pytest.mark.parametrize("n", [1, 63, 64, 65, 200, 4099])
def test_byte_lookups_cover_partial_blocks(n):
    rng = np.random.default_rng(n)
    table = rng.integers(0, 256, 256).astype(np.uint8)
    x = rng.integers(0, 256, n + 70).astype(np.uint8)
    out = np.full(n + 70, 7, np.uint8)
    lut._lookup_bytes(x[:n], table, out[:n])
    np.testing.assert_array_equal(out[:n], table[x[:n]])
    assert (out[n:] == 7).all()  # nothing written past the end


@needs_vnni
def test_gemm_threads_split_rows_like_one_thread(monkeypatch):
    """``--threads``: the rows split over workers give the one-thread result."""
    from hal import backends
    rng = np.random.default_rng(0)
    x = rng.integers(-128, 128, (301, 64)).astype(np.int8)
    w = rng.integers(-127, 128, (64, 50)).astype(np.int8)
    mult = rng.integers(1 << 30, (1 << 31) - 1, 50)
    p = gemm.make_plan(w, 0, rng.integers(-9999, 9999, 50).astype(np.int32), np.int8, 3, mult,
                       -rng.integers(8, 12, 50), -4, -128, 127)
    outs = []
    for threads in (1, 3):
        monkeypatch.setattr(backends, "compute_threads", lambda t=threads: t)
        monkeypatch.setattr(gemm, "PARALLEL_MACS", 0)
        out = np.empty((301, 50), np.int8)
        gemm.run(p, x.reshape(-1).view(np.uint8), 0, 64, 301, out.reshape(-1).view(np.uint8))
        outs.append(out)
    np.testing.assert_array_equal(outs[0], outs[1])


def _lanes_kernel(general=True, planned=False):
    """A kernel applying simd.requantize_lanes to 16 int32 lanes at a time (zero point 0, no clamp;
    ``general=False``: its cheaper form, clamped below at the zero point). ``planned``: the VNNI
    tiles' form instead, simd.multiply_lanes_planned, whose ``right`` is simd.requant_table's."""
    import numba
    from llvmlite import ir
    from numba import types
    from numba.extending import intrinsic

    from hal.backends.numba_kernels import simd

    @intrinsic
    def lanes(typingctx, acc, mult, left, right, out, i):
        def codegen(context, builder, signature, args):
            v32 = ir.VectorType(ir.IntType(32), simd.LANES)

            def load(k):
                ptr = simd._data(context, builder, signature.args[k], args[k], ir.IntType(32))
                return builder.load(builder.bitcast(builder.gep(ptr, [args[5]]), v32.as_pointer()), align=4)
            zero = ir.Constant(v32, [0] * simd.LANES)
            lo = zero if not general else ir.Constant(v32, [-(1 << 31)] * simd.LANES)
            hi = ir.Constant(v32, [(1 << 31) - 1] * simd.LANES)
            if planned:
                i64 = ir.IntType(64)
                table = simd._data(context, builder, signature.args[3], args[3], i64)
                group = builder.mul(builder.sdiv(args[5], ir.Constant(i64, simd.LANES)),
                                    ir.Constant(i64, simd.TABLE_INT64))
                q = simd.multiply_lanes_planned(builder, load(0), load(1), load(2), builder.gep(table, [group]),
                                                general, general)
                q = builder.select(builder.icmp_signed("<", q, lo), lo, q)
                q = builder.select(builder.icmp_signed(">", q, hi), hi, q)
            else:
                q = simd.requantize_lanes(builder, load(0), load(1), load(2), load(3), zero, lo, hi, general)
            ptr = simd._data(context, builder, signature.args[4], args[4], ir.IntType(32))
            builder.store(q, builder.bitcast(builder.gep(ptr, [args[5]]), v32.as_pointer()), align=4)
            return context.get_dummy_value()
        return types.void(acc, mult, left, right, out, i), codegen

    @numba.njit
    def run(acc, mult, left, right, out):
        for i in range(0, acc.shape[0], simd.LANES):
            lanes(acc, mult, left, right, out, i)
    return run


@pytest.mark.parametrize("planned", [False, True])
@pytest.mark.parametrize("general", [True, False])
def test_requantize_lanes_is_multiply_by_quantized_multiplier(general, planned):
    """The vector requantization (one 64-bit rounding of the product) against the scalar steps
    (SaturatingRoundingDoublingHighMul, then RoundingDivideByPOT) on random and edge values: int32
    extremes, every shift, exact halves before and after each rounding. Its cheaper form
    (``general=False``: no left shift, a clamp at the zero point) against the same steps clamped.
    ``planned``: the VNNI tiles' form, its constants from simd.requant_table."""
    from hal.backends.numba_kernels import simd
    from hal.backends.numba_kernels.fixedpoint import multiply_by_quantized_multiplier
    rng = np.random.default_rng(7)
    n = 16 * 40000
    shift = rng.integers(-31, 8, n)
    mult = rng.integers(1 << 30, 1 << 31, n)
    mult[::97] = 0
    mult[1::89] = (1 << 31) - 1
    mult[2::83] = 1 << 30
    acc = rng.integers(-(1 << 31), 1 << 31, n)
    acc[::5] = rng.integers(-5000, 5000, n // 5)
    acc[1::13] = -(1 << 31)
    acc[2::13] = (1 << 31) - 1
    # ties: x·m = (2k + 1)·2^30 (h's rounding) or h = (2j + 1)·2^(e − 1) (the shift's), both signs
    ties = np.arange(3, n, 7)
    acc[ties] = rng.choice([-3, -1, 1, 3, -(1 << 20) - 1, (1 << 20) + 1], ties.size)
    mult[ties] = 1 << 30
    shift[ties] = rng.integers(-12, 1, ties.size)
    if not general:
        shift = np.minimum(shift, 0)
    want = np.array([multiply_by_quantized_multiplier(np.int64(a), np.int64(m), np.int64(s))
                     for a, m, s in zip(acc, mult, shift)], dtype=np.int64)
    assert np.abs(want).max() < 1 << 31
    if not general:
        assert (want[ties] < 0).any()  # the negative halves, where the two forms round apart
        want = np.maximum(want, 0)
    out = np.empty(n, np.int32)
    right = np.maximum(-shift, 0).astype(np.int32)
    _lanes_kernel(general, planned)(acc.astype(np.int32), mult.astype(np.int32), np.maximum(shift, 0).astype(np.int32),
                                    simd.requant_table(mult, right) if planned else right, out)
    np.testing.assert_array_equal(out, want.astype(np.int32))


@pytest.mark.parametrize("x_type", [QU8, QS8])
@pytest.mark.parametrize("shape,paddings", [((1, 5, 6, 24), ((0, 0), (0, 0), (0, 0), (0, 4))),  # a shortcut's channels
                                            ((2, 3, 4, 70), ((1, 0), (2, 1), (0, 3), (5, 66))),  # every dimension
                                            ((3, 7), ((1, 2), (4, 0))), ((9,), ((3, 2),))])
@pytest.mark.parametrize("v2", [False, True])
def test_pad(x_type, shape, paddings, v2):
    """PAD (the zero point) and PAD_V2 (a given value) on the numba backend, rank 1 to 4."""
    mb = ModelBuilder()
    x = mb.add_operand(x_type, shape, scale=0.05, zero_point={QU8: 131, QS8: -3}[x_type])
    pads = mb.add_constant(I32, np.array(paddings, np.int32).reshape(len(shape), 2))
    y = mb.add_operand(x_type, (), scale=0.05, zero_point={QU8: 131, QS8: -3}[x_type])
    inputs = [x, pads, mb.add_int32(77 if x_type == QU8 else -77)] if v2 else [x, pads]
    model = _finish(mb, Op.PAD_V2 if v2 else Op.PAD, inputs, x, y)
    assert _data(model) is not None
    _check(model, shape, x_type)
