"""The numba backend's ``expand_depthwise`` (numba_kernels/f32_expand.py): a 1x1 CONV_2D (with its
clamp, or a hard-swish or swish epilogue) whose output only a DEPTHWISE_CONV_2D reads (with a PAD
before it, an activation after it), run as one step: the unfused steps' bytes, the reference's
results within NNAPI CTS's float criteria, the bound form's bytes, and the forms left unfused."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("hal.backends.numba_kernels")

from hal import backends  # noqa: E402
from hal.compiler import compile_model  # noqa: E402
from hal.executor import bind as hal_bind  # noqa: E402
from hal.executor import execute  # noqa: E402
from hal.model import ModelBuilder  # noqa: E402
from hal.types import OperandType, OperationType  # noqa: E402
from tests.backends.differential import compare  # noqa: E402

F32 = OperandType.TENSOR_FLOAT32
ORDER = ["numba", "reference"]
Op = OperationType


def block_model(shape, expand, k, stride, *, conv_act=3, activation=None, dw_act=0, pads=None, border=None,
                also_read=False, rng=None):
    """x -> CONV_2D 1x1 to ``expand`` channels (fused ``conv_act``; then ``activation``:
    "hard_swish" or "swish") -> [PAD ``border``] -> DEPTHWISE_CONV_2D k x k at ``stride``
    (explicit ``pads`` left, right, top, bottom, else SAME; ``dw_act``) -> [``activation``].
    ``also_read``: the expansion is a model output too."""
    rng = rng or np.random.default_rng(0)
    n, h, w, c = shape
    mb = ModelBuilder()
    x = mb.add_operand(F32, shape)

    def act(y, out_shape):
        if activation == "hard_swish":
            z = mb.add_operand(F32, out_shape)
            mb.add_operation(Op.HARD_SWISH, [y], [z])
            return z
        if activation == "swish":
            s, z = mb.add_operand(F32, out_shape), mb.add_operand(F32, out_shape)
            mb.add_operation(Op.LOGISTIC, [y], [s])
            mb.add_operation(Op.MUL, [y, s, mb.add_int32(0)], [z])
            return z
        return y
    filt = (rng.standard_normal((expand, 1, 1, c)) / np.sqrt(c)).astype(np.float32)
    t = mb.add_operand(F32, (n, h, w, expand))
    mb.add_operation(Op.CONV_2D, [x, mb.add_constant(F32, filt), mb.add_constant(F32, rng.uniform(
        -0.5, 0.5, expand).astype(np.float32)), mb.add_int32(1), mb.add_int32(1), mb.add_int32(1),
        mb.add_int32(conv_act)], [t])
    t = act(t, (n, h, w, expand))
    expansion = t
    if border is not None:
        h, w = h + sum(border[1]), w + sum(border[2])
        padded = mb.add_operand(F32, (n, h, w, expand))
        mb.add_operation(Op.PAD, [t, mb.add_constant(OperandType.TENSOR_INT32, np.array(border, np.int32))],
                         [padded])
        t = padded
    geometry = [mb.add_int32(p) for p in pads] if pads is not None else [mb.add_int32(1)]
    if pads is not None:
        left, right, top, bottom = pads
        oh, ow = (h + top + bottom - k) // stride + 1, (w + left + right - k) // stride + 1
    else:
        oh, ow = -(-h // stride), -(-w // stride)
    y = mb.add_operand(F32, (n, oh, ow, expand))
    dw = (rng.standard_normal((1, k, k, expand)) / k).astype(np.float32)
    mb.add_operation(Op.DEPTHWISE_CONV_2D, [t, mb.add_constant(F32, dw), mb.add_constant(
        F32, rng.uniform(-0.5, 0.5, expand).astype(np.float32)), *geometry, mb.add_int32(stride),
        mb.add_int32(stride), mb.add_int32(1), mb.add_int32(dw_act)], [y])
    y = act(y, (n, oh, ow, expand))
    mb.identify_inputs_and_outputs([x], [y, expansion] if also_read else [y])
    return mb.finish()


@pytest.fixture
def any_size(monkeypatch):
    """Blocks of test size fused (by default only expansions that outgrow L2 are, and only on a
    machine whose L2 holds the ring: ``FUSES``)."""
    from hal.backends.numba_kernels import f32_expand
    monkeypatch.setattr(f32_expand, "FUSES", True)
    monkeypatch.setattr(f32_expand, "MIN_BYTES", 0)
    monkeypatch.setattr(f32_expand, "MIN_WIDTH", 1)


def _patterns(compiled) -> list:
    return [getattr(s.ctx, "pattern", None) for s in compiled.static_plan.program]


def _run(model, x):
    compiled = compile_model(model, backend_order=ORDER)
    got = execute(compiled, [x])
    plan = compiled.static_plan
    outs = [np.zeros(plan.infos[i].shape, plan.infos[i].dtype) for i in compiled.output_indexes]
    hal_bind(compiled, [x.copy()], outs)(None, None, None)
    assert all(np.array_equal(o, g, equal_nan=True) for o, g in zip(outs, got)), "bound form"
    return compiled, got


@pytest.mark.parametrize("shape,expand,k,stride,kw", [
    ((1, 13, 11, 16), 96, 3, 2, {}),  # MobileNetV2's first block (SAME, stride 2)
    ((2, 9, 10, 24), 144, 3, 1, {}),  # stride 1, two images; blocks on the output's lines
    ((1, 12, 12, 16), 72, 3, 2, {"border": ((0, 0), (0, 1), (0, 1), (0, 0)), "pads": (0, 0, 0, 0),
                                 "activation": "hard_swish", "conv_act": 0}),  # MobileNetV3's, PAD fused
    ((1, 10, 9, 40), 120, 5, 1, {"activation": "hard_swish", "conv_act": 0}),  # 5x5
    ((1, 8, 8, 16), 40, 3, 1, {"activation": "swish", "conv_act": 0}),  # EfficientNet's, a masked block
    ((1, 6, 7, 8), 24, 4, 2, {"pads": (2, 2, 2, 2)}),  # the general depthwise kernel, wide padding
    ((1, 5, 6, 16), 32, 3, 1, {"border": ((0, 0), (3, 3), (3, 3), (0, 0)), "pads": (0, 0, 0, 0)}),  # rows of zeros
])
@pytest.mark.parametrize("ring_bytes", [1, None])  # 1: the fewest rows (2·kh), moved every few output rows
def test_the_fused_block_gives_the_unfused_steps_bytes(shape, expand, k, stride, kw, ring_bytes, monkeypatch,
                                                       any_size):
    from hal.backends.numba_kernels import f32_expand
    if ring_bytes is not None:
        monkeypatch.setattr(f32_expand, "RING_BYTES", ring_bytes)
    rng = np.random.default_rng(expand + k)
    model = block_model(shape, expand, k, stride, rng=rng, **kw)
    x = rng.uniform(-3, 3, shape).astype(np.float32)
    x.reshape(-1)[5] = np.nan
    compiled, got = _run(model, x)
    assert _patterns(compiled) == ["expand_depthwise"], _patterns(compiled)
    assert {s.backend for s in compiled.static_plan.program} == {"numba"}
    want = execute(compile_model(model, backend_order=["reference"]), [x])
    assert all(compare(g, w) is None for g, w in zip(got, want)), [compare(g, w) for g, w in zip(got, want)]
    monkeypatch.setitem(backends.get("numba").fusions, "expand_depthwise", ())
    unfused, steps = _run(model, x)
    assert "expand_depthwise" not in _patterns(unfused)
    assert all(np.array_equal(g, s, equal_nan=True) for g, s in zip(got, steps))


@pytest.mark.parametrize("shape,expand,fused", [((1, 28, 28, 32), 192, False), ((1, 56, 56, 24), 144, True),
                                                ((1, 14, 14, 160), 1440, False)])
@pytest.mark.parametrize("l2_holds_the_ring", [True, False])
def test_only_expansions_that_outgrow_the_cache_are_fused(shape, expand, fused, l2_holds_the_ring, monkeypatch):
    """MobileNetV2's 56x56x144 expansion (1.8 MB) is fused; its 28x28x192 one (0.6 MB) is not, nor
    a 14-pixel-wide one whatever its size; none is where the core's L2 cannot hold the ring."""
    from hal.backends.numba_kernels import f32_expand
    monkeypatch.setattr(f32_expand, "FUSES", l2_holds_the_ring)
    model = block_model(shape, expand, 3, 1, rng=np.random.default_rng(2))
    patterns = _patterns(compile_model(model, backend_order=ORDER))
    assert ("expand_depthwise" in patterns) == (fused and l2_holds_the_ring), patterns


@pytest.mark.parametrize("text,size", [("512K", 512 << 10), ("2048K\n", 2 << 20), ("32M", 32 << 20), ("64", 64)])
def test_cache_sizes_read_as_sysfs_writes_them(text, size):
    from hal.backends.numba_kernels.simd import cache_size_bytes, l2_bytes
    assert cache_size_bytes(text) == size
    assert l2_bytes() is None or l2_bytes() >= 64 << 10


def test_an_expansion_read_elsewhere_stays_its_own_step(any_size):
    rng = np.random.default_rng(1)
    model = block_model((1, 8, 8, 16), 48, 3, 1, also_read=True, rng=rng)
    x = rng.uniform(-3, 3, (1, 8, 8, 16)).astype(np.float32)
    compiled, got = _run(model, x)
    assert "expand_depthwise" not in _patterns(compiled)
    want = execute(compile_model(model, backend_order=["reference"]), [x])
    assert all(compare(g, w) is None for g, w in zip(got, want))


def test_a_cached_plan_fuses_again(any_size):
    """The compilation cache stores one step per operation; loading it fuses the block again, with
    the same results."""
    from hal.serialize import dump_compiled, load_compiled
    rng = np.random.default_rng(3)
    model = block_model((1, 12, 12, 16), 72, 3, 2, activation="hard_swish", conv_act=0, rng=rng)
    x = rng.uniform(-3, 3, (1, 12, 12, 16)).astype(np.float32)
    compiled, got = _run(model, x)
    loaded = load_compiled(*dump_compiled(compiled), backend_order=ORDER)
    assert _patterns(loaded) == _patterns(compiled) == ["expand_depthwise"]
    assert all(np.array_equal(a, b, equal_nan=True) for a, b in zip(execute(loaded, [x]), got))
