"""The numba backend's float32 DEPTHWISE_CONV_2D (numba_kernels/f32_depthwise.py) against the
reference backend, with NNAPI CTS's float criteria: every CTS case of float DEPTHWISE_CONV_2D it
takes, 3x3 and 5x5 filters at strides 1 and 2 with implicit and explicit (asymmetric) padding,
channel counts off its 16-channel blocks, batches, activations, NaN and infinity; the bound form;
and the forms it declines."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("hal.backends.numba_kernels")

from hal.model import ModelBuilder  # noqa: E402
from hal.types import OperandType, OperationType  # noqa: E402
from tests.backends.differential import float_cts_examples_on  # noqa: E402
from tests.backends.test_numba_f32_conv import _check, _inputs, compile_model_shape  # noqa: E402

F32 = OperandType.TENSOR_FLOAT32
DW = OperationType.DEPTHWISE_CONV_2D
ORDER = ["numba", "reference"]


def dw_model(shape, k, *, stride=(1, 1), pads=None, scheme=1, act=0, multiplier=1, dilation=(1, 1), nchw=False,
             filter_input=False, rng=None):
    rng = rng or np.random.default_rng(0)
    n, h, w, c = shape
    out_c = c * multiplier
    mb = ModelBuilder()
    x = mb.add_operand(F32, (n, c, h, w) if nchw else shape)
    filt = rng.normal(0, 1 / k, (1, k, k, out_c)).astype(np.float32)
    f = mb.add_operand(F32, filt.shape) if filter_input else mb.add_constant(F32, filt)
    b = mb.add_constant(F32, rng.uniform(-0.5, 0.5, out_c).astype(np.float32))
    geometry = [mb.add_int32(p) for p in pads] if pads is not None else [mb.add_int32(scheme)]
    args = [x, f, b, *geometry, mb.add_int32(stride[1]), mb.add_int32(stride[0]), mb.add_int32(multiplier),
            mb.add_int32(act)]
    if nchw or dilation != (1, 1):
        args += [mb.add_bool(nchw), mb.add_int32(dilation[1]), mb.add_int32(dilation[0])]
    oh, ow = compile_model_shape(shape, out_c, k, k, stride, pads, scheme, dilation)
    y = mb.add_operand(F32, (n, out_c, oh, ow) if nchw else (n, oh, ow, out_c))
    mb.add_operation(DW, args, [y])
    mb.identify_inputs_and_outputs([x, f] if filter_input else [x], [y])
    return mb.finish()


def test_cts_float_cases_it_takes_meet_the_cts_and_the_reference():
    ran = float_cts_examples_on("numba", "DEPTHWISE_CONV_2D", DW, ORDER)
    assert ran >= 4, f"only {ran} float CTS examples ran on the numba kernel"


@pytest.mark.parametrize("shape,k,stride,pads,scheme,act", [
    ((1, 13, 11, 64), 3, (1, 1), None, 1, 0),
    ((2, 9, 10, 17), 3, (2, 2), None, 1, 3),
    ((1, 12, 12, 40), 3, (1, 2), (0, 1, 1, 0), 1, 1),
    ((1, 16, 16, 3), 5, (1, 1), None, 1, 2),
    ((1, 15, 14, 72), 5, (2, 2), None, 1, 0),
    ((1, 8, 9, 24), 5, (1, 1), None, 2, 0),
    ((1, 2, 3, 33), 3, (1, 1), None, 1, 0),  # narrower than the filter: every pixel an edge
])
def test_geometries_match_the_reference(shape, k, stride, pads, scheme, act):
    rng = np.random.default_rng(shape[3] + k)
    model = dw_model(shape, k, stride=stride, pads=pads, scheme=scheme, act=act, rng=rng)
    _check(model, _inputs(model, rng))


def test_nan_and_infinity_propagate_as_in_the_reference():
    rng = np.random.default_rng(4)
    model = dw_model((1, 8, 8, 20), 3, rng=rng)
    x = _inputs(model, rng)
    x[0][0, 3, 3, 2], x[0][0, 0, 7, 19] = np.nan, np.inf
    _, got = _check(model, x)
    assert np.isnan(got[0]).any() and np.isinf(got[0]).any()


@pytest.mark.parametrize("kind,why", [({"multiplier": 2}, "depth multiplier"), ({"dilation": (2, 2)}, "dilation"),
                                      ({"nchw": True}, "NCHW"), ({"filter_input": True}, "not a constant")])
def test_forms_it_declines_run_on_the_reference_backend(kind, why, caplog):
    rng = np.random.default_rng(2)
    model = dw_model((1, 8, 8, 8), 3, rng=rng, **kind)
    with caplog.at_level("INFO", logger="hal.compiler"):
        _check(model, _inputs(model, rng), on_numba=False)
    assert why in caplog.text
