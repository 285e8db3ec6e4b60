"""SVDF on numpy. Per batch and filter the state is a window of memory_size activations, oldest
first, whose last slot the step fills with this input's feature activation (input · its feature
filter); the window times the filter's time weights gives the filter's value, the rank filters of
a unit are summed, the bias added and the activation applied. The state handed on is the window
shifted one older, its last slot zero (the next step fills it). Sums run in float64, values are
stored as float32; float16 runs through the float32 kernel."""
from __future__ import annotations

import numpy as np

from hal import quant
from hal.backends.reference import BACKEND
from hal.operations.svdf import BIAS, INPUT, STATE_IN, SVDF, WEIGHTS_FEATURE, WEIGHTS_TIME, SvdfParams
from hal.registry import OperationContext


def plan(ctx: OperationContext) -> SvdfParams:
    return ctx.params


def execute(ctx: OperationContext, inputs: list) -> list:
    with np.errstate(all="ignore"):  # non-finite inputs give non-finite outputs, as IEEE says
        return _svdf(ctx.data, inputs)


def _svdf(p: SvdfParams, inputs: list) -> list:
    state = inputs[STATE_IN].astype(np.float32).reshape(p.batch, p.num_filters, p.memory_size).copy()
    feature = inputs[INPUT].astype(np.float64) @ inputs[WEIGHTS_FEATURE].astype(np.float64).T
    state[:, :, -1] = feature.astype(np.float32)
    filtered = np.einsum("bfm,fm->bf", state.astype(np.float64), inputs[WEIGHTS_TIME].astype(np.float64))
    out = filtered.reshape(p.batch, p.num_units, p.rank).sum(axis=-1)
    if inputs[BIAS] is not None:
        out += inputs[BIAS].astype(np.float64)
    out = quant.apply_activation_float(out.astype(np.float32), p.act)
    state[:, :, :-1] = state[:, :, 1:]
    state[:, :, -1] = 0
    return [state.reshape(p.batch, p.num_filters * p.memory_size), out]


BACKEND.register(SVDF, plan=plan, execute=execute)
