"""SVDF beyond the CTS vectors: a sequence fed step by step (state_out back into state_in) against
SVDF's definition as a time convolution, written here independently of the kernel: output[t] =
act(bias + sum over the unit's rank filters f and the last memory_size steps m of
weights_time[f, m] * (weights_feature[f] . input[t - memory_size + 1 + m])), inputs before the
first step being zero. Plus NNAPI's rules."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hal.compiler import compile_model
from hal.errors import HalError
from hal.executor import execute
from hal.model import ModelBuilder
from hal.types import ErrorStatus, OperandType, OperationType

F32 = OperandType.TENSOR_FLOAT32
SVDF = OperationType.SVDF
ACTS = {0: lambda v: v, 1: lambda v: np.maximum(v, 0), 2: lambda v: np.clip(v, -1, 1), 3: lambda v: np.clip(v, 0, 6)}


def _compile(batch, input_size, units, rank, memory, act, bias=True, state_shape=None):
    filters = units * rank
    b = ModelBuilder()
    x = b.add_operand(F32, (batch, input_size))
    wf = b.add_operand(F32, (filters, input_size))
    wt = b.add_operand(F32, (filters, memory))
    bias_i = b.add_operand(F32, (units,))
    if not bias:
        b.set_no_value(bias_i)
    s = b.add_operand(F32, state_shape or (batch, memory * filters))
    params = [b.add_int32(rank), b.add_int32(act)]
    s_out = b.add_operand(F32, (batch, memory * filters))
    out = b.add_operand(F32, (batch, units))
    b.add_operation(SVDF, [x, wf, wt, bias_i, s, *params], [s_out, out])
    b.identify_inputs_and_outputs([x, wf, wt] + ([bias_i] if bias else []) + [s], [s_out, out])
    return compile_model(b.finish())


def time_convolution(xs, wf, wt, bias, rank, act):
    """Every step's output from the whole input sequence xs [T, batch, input_size]."""
    steps, batch, _ = xs.shape
    filters, memory = wt.shape
    padded = np.concatenate([np.zeros((memory - 1, *xs.shape[1:])), xs.astype(np.float64)])
    outs = []
    for t in range(steps):
        window = padded[t:t + memory]  # [memory, batch, input_size], oldest first
        per_filter = np.einsum("mbi,fi,fm->bf", window, wf.astype(np.float64), wt.astype(np.float64))
        total = per_filter.reshape(batch, filters // rank, rank).sum(-1) + (0 if bias is None else bias)
        outs.append(ACTS[act](total))
    return outs


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), batch=st.integers(1, 3), input_size=st.integers(1, 4),
       units=st.integers(1, 3), rank=st.integers(1, 3), memory=st.integers(1, 4), steps=st.integers(1, 6),
       act=st.sampled_from(list(ACTS)), bias=st.booleans())
def test_sequence_matches_time_convolution(seed, batch, input_size, units, rank, memory, steps, act, bias):
    rng = np.random.default_rng(seed)
    filters = units * rank
    xs = rng.uniform(-1, 1, (steps, batch, input_size)).astype(np.float32)
    wf = rng.uniform(-1, 1, (filters, input_size)).astype(np.float32)
    wt = rng.uniform(-1, 1, (filters, memory)).astype(np.float32)
    b = rng.uniform(-1, 1, units).astype(np.float32) if bias else None
    compiled = _compile(batch, input_size, units, rank, memory, act, bias)
    state = np.zeros((batch, memory * filters), np.float32)
    want = time_convolution(xs, wf, wt, b, rank, act)
    for t in range(steps):
        state, out = execute(compiled, [xs[t], wf, wt] + ([b] if bias else []) + [state])
        np.testing.assert_allclose(out, want[t], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kwargs, match", [
    ({"units": 3, "rank": 0}, "rank must be >= 1"),
    ({"state_shape": (2, 7)}, "state_in"),
    ({"act": 9}, "fused activation"),
])
def test_rejects(kwargs, match):
    args = {"batch": 2, "input_size": 3, "units": 2, "rank": 2, "memory": 3, "act": 0} | kwargs
    with pytest.raises(HalError, match=match) as e:
        _compile(**args)
    assert e.value.status == ErrorStatus.INVALID_ARGUMENT


def test_rejects_filters_not_a_multiple_of_rank():
    b = ModelBuilder()
    ops = [b.add_operand(F32, s) for s in ((1, 2), (5, 2), (5, 3), (2,), (1, 15))]
    out = [b.add_operand(F32, (1, 15)), b.add_operand(F32, (1, 2))]
    b.add_operation(SVDF, ops + [b.add_int32(2), b.add_int32(0)], out)
    b.identify_inputs_and_outputs(ops, out)
    with pytest.raises(HalError, match="not a multiple of rank") as e:
        compile_model(b.finish())
    assert e.value.status == ErrorStatus.INVALID_ARGUMENT
