"""RNN, UNIDIRECTIONAL_SEQUENCE_RNN and BIDIRECTIONAL_SEQUENCE_RNN beyond the CTS vectors (which
cover float32/float16/relaxed, time_major, merge_outputs and cross-linked aux inputs): the NNAPI 1.3
variants (final-state outputs, parallel linking) against a plain per-step loop written here,
the compilation cache round trip, and NNAPI's rules (bad models fail with INVALID_ARGUMENT)."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hal.compiler import compile_model
from hal.errors import HalError
from hal.executor import execute
from hal.model import ModelBuilder
from hal.serialize import dump_compiled, load_compiled
from hal.types import ErrorStatus, OperandType, OperationType

F32 = OperandType.TENSOR_FLOAT32
F16 = OperandType.TENSOR_FLOAT16
RNN = OperationType.RNN
UNI = OperationType.UNIDIRECTIONAL_SEQUENCE_RNN
BIDI = OperationType.BIDIRECTIONAL_SEQUENCE_RNN
ACTS = {0: lambda v: v, 1: lambda v: np.maximum(v, 0), 2: lambda v: np.clip(v, -1, 1), 3: lambda v: np.clip(v, 0, 6)}
FAST = settings(max_examples=15, deadline=None)


def naive_sequence(xs, h, w, r, b, act, aux=None, aux_w=None, reverse=False):
    """Time-major xs [T, B, I]: the outputs [T, B, U] and the final state, one step at a time."""
    outs = [None] * len(xs)
    order = range(len(xs) - 1, -1, -1) if reverse else range(len(xs))
    for t in order:
        total = xs[t].astype(np.float64) @ w.T.astype(np.float64) + h.astype(np.float64) @ r.T + b
        if aux is not None:
            total = total + aux[t].astype(np.float64) @ aux_w.T.astype(np.float64)
        h = ACTS[act](total).astype(np.float32)
        outs[t] = h
    return np.stack(outs), h


def _cell(rng, units, input_size, batch):
    return [rng.uniform(-0.5, 0.5, s).astype(np.float32)
            for s in ((units, input_size), (units, units), (units,), (batch, units))]


def _run(op, tensors, scalars, out_shapes, omitted=(), t=F32):
    """One-op model: ``tensors`` (None = omitted input) as model inputs, ``scalars`` as constants."""
    b = ModelBuilder()
    ins, args = [], []
    for k, x in enumerate(tensors):
        i = b.add_operand(t, x.shape if x is not None else (0,))
        if x is None:
            b.set_no_value(i)
        else:
            args.append(x.astype(np.float16 if t == F16 else np.float32))
            ins.append(i)
        tensors[k] = i
    params = [b.add_bool(v) if isinstance(v, bool) else b.add_int32(v) for v in scalars]
    outs = [b.add_operand(t, s) for s in out_shapes]
    b.add_operation(op, tensors + params, outs)
    b.identify_inputs_and_outputs(ins, outs)
    compiled = compile_model(b.finish())
    return compiled, args, execute(compiled, args)


@FAST
@given(seed=st.integers(0, 2**32 - 1), act=st.sampled_from(list(ACTS)), time_major=st.booleans(),
       batch=st.integers(1, 3), steps=st.integers(1, 4), units=st.integers(1, 5), input_size=st.integers(1, 4))
def test_unidirectional_with_state_output_matches_step_loop(seed, act, time_major, batch, steps, units, input_size):
    rng = np.random.default_rng(seed)
    xs = rng.uniform(-1, 1, (steps, batch, input_size)).astype(np.float32)
    w, r, b, h = _cell(rng, units, input_size, batch)
    x = xs if time_major else xs.swapaxes(0, 1).copy()
    out_shape = (steps, batch, units) if time_major else (batch, steps, units)
    _, _, (out, state) = _run(UNI, [x, w, r, b, h], [act, int(time_major)], [out_shape, (batch, units)])
    want, want_state = naive_sequence(xs, h, w, r, b, act)
    np.testing.assert_allclose(out, want if time_major else want.swapaxes(0, 1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(state, want_state, rtol=1e-5, atol=1e-6)


def test_rnn_outputs_state_and_output_equal():
    rng = np.random.default_rng(1)
    x = rng.uniform(-1, 1, (2, 3)).astype(np.float32)
    w, r, b, h = _cell(rng, 4, 3, 2)
    _, _, (state, out) = _run(RNN, [x, w, r, b, h], [1], [(2, 4), (2, 4)])
    want, _ = naive_sequence(x[None], h, w, r, b, 1)
    np.testing.assert_allclose(out, want[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(state, out)


@FAST
@given(seed=st.integers(0, 2**32 - 1), merge=st.booleans(), time_major=st.booleans(),
       linking=st.sampled_from(["none", "parallel", "cross"]), fw_units=st.integers(1, 4), bw_units=st.integers(1, 4))
def test_bidirectional_linking_and_state_outputs(seed, merge, time_major, linking, fw_units, bw_units):
    rng = np.random.default_rng(seed)
    steps, batch, isz, aux_size = 3, 2, 3, 2
    xs = rng.uniform(-1, 1, (steps, batch, isz)).astype(np.float32)
    aux = rng.uniform(-1, 1, (steps, batch, aux_size)).astype(np.float32)
    fw = _cell(rng, fw_units, isz, batch)
    bw = _cell(rng, bw_units, aux_size if linking == "parallel" else isz, batch)
    fw_aux = rng.uniform(-0.5, 0.5, (fw_units, aux_size)).astype(np.float32)
    bw_aux = rng.uniform(-0.5, 0.5, (bw_units, aux_size)).astype(np.float32)
    major = (lambda a: a) if time_major else (lambda a: a.swapaxes(0, 1).copy())
    aux_in = {"none": [None, None, None], "parallel": [major(aux), None, None],
              "cross": [major(aux), fw_aux, bw_aux]}[linking]
    seq = (steps, batch) if time_major else (batch, steps)
    outs = [(*seq, fw_units + bw_units)] if merge else [(*seq, fw_units), (*seq, bw_units)]
    outs += [(batch, fw_units), (batch, bw_units)]
    _, _, got = _run(BIDI, [major(xs), *fw, *bw, *aux_in], [1, time_major, merge], outs)
    cross = linking == "cross"
    want_fw, fw_state = naive_sequence(xs, fw[3], *fw[:3], 1, aux if cross else None, fw_aux if cross else None)
    want_bw, bw_state = naive_sequence(aux if linking == "parallel" else xs, bw[3], *bw[:3], 1,
                                       aux if cross else None, bw_aux if cross else None, reverse=True)
    want = [np.concatenate([want_fw, want_bw], -1)] if merge else [want_fw, want_bw]
    for g, w_ in zip(got, [major(w_) for w_ in want] + [fw_state, bw_state]):
        np.testing.assert_allclose(g, w_, rtol=1e-5, atol=1e-6)


def test_bidirectional_plan_survives_the_compilation_cache():
    rng = np.random.default_rng(3)
    xs = rng.uniform(-1, 1, (3, 2, 2)).astype(np.float32)
    fw, bw = _cell(rng, 3, 2, 2), _cell(rng, 2, 2, 2)
    compiled, args, outs = _run(BIDI, [xs, *fw, *bw, None, None, None], [1, True, True], [(3, 2, 5)])
    payload, arrays = dump_compiled(compiled)
    loaded = load_compiled(payload, [np.array(a) for a in arrays])
    np.testing.assert_array_equal(execute(loaded, args)[0], outs[0])


def test_float16_sequence_rounds_like_float32():
    rng = np.random.default_rng(4)
    xs = rng.uniform(-1, 1, (3, 2, 2)).astype(np.float16)
    w, r, b, h = (a.astype(np.float16) for a in _cell(rng, 3, 2, 2))
    _, _, (out,) = _run(UNI, [xs, w, r, b, h], [0, 1], [(3, 2, 3)], t=F16)
    assert out.dtype == np.float16
    want, _ = naive_sequence(xs.astype(np.float32), h.astype(np.float32), w.astype(np.float32),
                             r.astype(np.float32), b.astype(np.float32), 0)
    np.testing.assert_allclose(out.astype(np.float32), want, rtol=5 * 2**-10, atol=5 * 2**-10)


# ---- NNAPI's rules --------------------------------------------------------------------------------

def _invalid(op, tensors, scalars, out_shapes, match):
    with pytest.raises(HalError, match=match) as e:
        _run(op, tensors, scalars, out_shapes)
    assert e.value.status == ErrorStatus.INVALID_ARGUMENT


def _z(*shape):
    return np.zeros(shape, np.float32)


@pytest.mark.parametrize("tensors, scalars, match", [
    ([_z(2, 3, 1), _z(4, 3), _z(4, 4), _z(4), _z(2, 4)], [0], "rank"),  # input rank 3
    ([_z(2, 3), _z(4, 5), _z(4, 4), _z(4), _z(2, 4)], [0], "input size"),  # weights [4, 5]
    ([_z(2, 3), _z(4, 3), _z(4, 3), _z(4), _z(2, 4)], [0], "recurrent"),
    ([_z(2, 3), _z(4, 3), _z(4, 4), _z(5), _z(2, 4)], [0], "bias"),
    ([_z(2, 3), _z(4, 3), _z(4, 4), _z(4), _z(3, 4)], [0], "hidden state"),
    ([_z(2, 3), _z(4, 3), _z(4, 4), _z(4), _z(2, 4)], [7], "fused activation"),
])
def test_rnn_rejects(tensors, scalars, match):
    _invalid(RNN, tensors, scalars, [(2, 4), (2, 4)], match)


def test_unidirectional_rejects_bad_time_major_and_rank():
    cell = [_z(4, 3), _z(4, 4), _z(4), _z(2, 4)]
    _invalid(UNI, [_z(5, 2, 3), *cell], [0, 2], [(5, 2, 4)], "time_major")
    _invalid(UNI, [_z(2, 3), *cell], [0, 1], [(5, 2, 4)], "rank")


def test_bidirectional_rejects():
    x, cell = _z(5, 2, 3), [_z(4, 3), _z(4, 4), _z(4), _z(2, 4)]
    # aux weights without aux input: not a linking mode NNAPI defines
    _invalid(BIDI, [x, *cell, *cell, None, _z(4, 3), _z(4, 3)], [0, True, False], [(5, 2, 4), (5, 2, 4)], "aux")
    # merge_outputs with two sequence outputs
    _invalid(BIDI, [x, *cell, *cell, None, None, None], [0, True, True], [(5, 2, 8), (5, 2, 4)], "merge_outputs")
    # cross-linking aux input of another length
    _invalid(BIDI, [x, *cell, *cell, _z(4, 2, 3), _z(4, 3), _z(4, 3)], [0, True, False], [(5, 2, 4), (5, 2, 4)],
             "aux_input")
