"""LSTM, UNIDIRECTIONAL_SEQUENCE_LSTM, BIDIRECTIONAL_SEQUENCE_LSTM and QUANTIZED_16BIT_LSTM beyond
the CTS vectors (which cover float32/float16/relaxed, CIFG, peephole, projection, layer norm,
time_major, merge_outputs, cross-linked aux inputs): every option combination against a plain
per-row step written here, the NNAPI 1.3 variants (state outputs, parallel linking), the
compilation cache, bit-exactness of the quantized op on the CTS vectors, and NNAPI's rules (bad
models fail with INVALID_ARGUMENT)."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hal.backends.reference import fixedpoint16 as fp
from hal.compiler import compile_model
from hal.errors import HalError
from hal.executor import execute
from hal.model import ModelBuilder
from hal.serialize import dump_compiled, load_compiled
from hal.types import ErrorStatus, OperandType, OperationType
from nnhal.cts.corpus import build_model, examples, load_cases

F32 = OperandType.TENSOR_FLOAT32
F16 = OperandType.TENSOR_FLOAT16
QU8 = OperandType.TENSOR_QUANT8_ASYMM
LSTM = OperationType.LSTM
UNI = OperationType.UNIDIRECTIONAL_SEQUENCE_LSTM
BIDI = OperationType.BIDIRECTIONAL_SEQUENCE_LSTM
QLSTM = OperationType.QUANTIZED_16BIT_LSTM
FAST = settings(max_examples=12, deadline=None)

GATES = "ifco"  # NNAPI's order: input, forget, cell, output
ACT = {0: lambda v: v, 1: lambda v: np.maximum(v, 0), 3: lambda v: np.clip(v, 0, 6), 4: np.tanh,
       6: lambda v: 1 / (1 + np.exp(-v))}


def sigmoid(v):
    return 1 / (1 + np.exp(-v))


# ---- an independent step: one batch row at a time, named tensors --------------------------------

def naive_step(x, h, c, t, act, cell_clip=0.0, proj_clip=0.0, aux=None):
    """x [batch, input], h [batch, output], c [batch, units]; ``t`` maps names (ix, fh, pi, bo, li,
    proj, proj_b, ax...) to arrays, missing names are absent options."""
    hs, cs = [], []
    for b in range(x.shape[0]):
        pre = {}
        for g in GATES:
            if g + "x" not in t:
                continue
            v = np.dot(t[g + "x"].astype(np.float64), x[b]) + np.dot(t[g + "h"].astype(np.float64), h[b])
            if aux is not None and "a" + g in t:
                v = v + np.dot(t["a" + g].astype(np.float64), aux[b])
            pre[g] = v

        def finish(g, v):
            if "l" + g in t:  # layer norm, then the bias
                v = (v - v.mean()) / np.sqrt(v.var() + 1e-8) * t["l" + g]
            return v + t["b" + g]

        f = sigmoid(finish("f", pre["f"] + (t["pf"] * c[b] if "pf" in t else 0)))
        i = 1 - f if "ix" not in t else sigmoid(finish("i", pre["i"] + (t["pi"] * c[b] if "pi" in t else 0)))
        new_c = f * c[b] + i * ACT[act](finish("c", pre["c"]))
        if cell_clip > 0:
            new_c = np.clip(new_c, -cell_clip, cell_clip)
        o = sigmoid(finish("o", pre["o"] + (t["po"] * new_c if "po" in t else 0)))
        out = o * ACT[act](new_c)
        if "proj" in t:
            out = t["proj"] @ out + t.get("proj_b", 0)
            if proj_clip > 0:
                out = np.clip(out, -proj_clip, proj_clip)
        hs.append(out)
        cs.append(new_c)
    return np.array(hs, np.float32), np.array(cs, np.float32)


def random_cell(rng, units, output, input_size, batch, *, cifg, peephole, projection, projection_bias,
                layer_norm, aux_size=0):
    u = lambda *s: rng.uniform(-0.6, 0.6, s).astype(np.float32)  # noqa: E731
    t = {}
    for g in GATES:
        if g == "i" and cifg:
            continue
        t[g + "x"], t[g + "h"], t["b" + g] = u(units, input_size), u(units, output), u(units)
        if layer_norm:
            t["l" + g] = u(units)
        if aux_size:
            t["a" + g] = u(units, aux_size)
    if peephole:
        for g in "ifo":
            if not (g == "i" and cifg):
                t["p" + g] = u(units)
    if projection:
        t["proj"] = u(output, units)
        if projection_bias:
            t["proj_b"] = u(output)
    return t, u(batch, output), u(batch, units)


def cell_inputs(t, h, c):
    """The 19 cell tensors in NNAPI order (None where absent), then the 4 layer norm weights."""
    g = t.get
    cell = [g("ix"), g("fx"), g("cx"), g("ox"), g("ih"), g("fh"), g("ch"), g("oh"), g("pi"), g("pf"), g("po"),
            g("bi"), g("bf"), g("bc"), g("bo"), g("proj"), g("proj_b"), h, c]
    return cell, [g("li"), g("lf"), g("lc"), g("lo")]


def build(op, inputs, out_shapes, t=F32):
    """One-op model. Inputs: arrays (model inputs), None (NO_VALUE) or ("i32"|"f32"|"f16"|"bool", v)."""
    b = ModelBuilder()
    idx, model_inputs, args = [], [], []
    for x in inputs:
        if isinstance(x, tuple):
            kind, v = x
            idx.append({"i32": b.add_int32, "f32": b.add_float32, "bool": b.add_bool,
                        "f16": lambda v: b.add_scalar(OperandType.FLOAT16, np.float16(v))}[kind](v))
        elif x is None:
            i = b.add_operand(t, (0,))
            b.set_no_value(i)
            idx.append(i)
        else:
            i = b.add_operand(t, x.shape)
            idx.append(i)
            model_inputs.append(i)
            args.append(x.astype(np.float16 if t == F16 else np.float32))
    outs = [b.add_operand(t, s) for s in out_shapes]
    b.add_operation(op, idx, outs)
    b.identify_inputs_and_outputs(model_inputs, outs)
    return b.finish(), args


def run(op, inputs, out_shapes, t=F32):
    model, args = build(op, inputs, out_shapes, t)
    compiled = compile_model(model)
    return compiled, args, execute(compiled, args)


OPTIONS = dict(cifg=st.booleans(), peephole=st.booleans(), projection=st.booleans(), projection_bias=st.booleans(),
               layer_norm=st.booleans())


@FAST
@given(seed=st.integers(0, 2**32 - 1), act=st.sampled_from(sorted(ACT)), clips=st.booleans(), **OPTIONS)
def test_lstm_matches_a_per_row_step(seed, act, clips, cifg, peephole, projection, projection_bias, layer_norm):
    rng = np.random.default_rng(seed)
    batch, isz, units = 2, 3, 4
    output = 3 if projection else units
    t, h, c = random_cell(rng, units, output, isz, batch, cifg=cifg, peephole=peephole, projection=projection,
                          projection_bias=projection and projection_bias, layer_norm=layer_norm)
    x = rng.uniform(-1, 1, (batch, isz)).astype(np.float32)
    cell_clip, proj_clip = (0.3, 0.2) if clips else (0.0, 0.0)
    cell, norms = cell_inputs(t, h, c)
    inputs = [x, *cell, ("i32", act), ("f32", cell_clip), ("f32", proj_clip)] + (norms if layer_norm else [])
    outs = [(batch, units * (3 if cifg else 4)), (batch, output), (batch, units), (batch, output)]
    _, _, (_, h_out, c_out, out) = run(LSTM, inputs, outs)
    want_h, want_c = naive_step(x, h, c, t, act, cell_clip, proj_clip)
    np.testing.assert_allclose(c_out, want_c, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(h_out, want_h, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(out, h_out)


@FAST
@given(seed=st.integers(0, 2**32 - 1), time_major=st.booleans(), steps=st.integers(1, 4), **OPTIONS)
def test_unidirectional_with_state_outputs_loops_the_step(seed, time_major, steps, cifg, peephole, projection,
                                                          projection_bias, layer_norm):
    rng = np.random.default_rng(seed)
    batch, isz, units = 2, 3, 4
    output = 2 if projection else units
    t, h, c = random_cell(rng, units, output, isz, batch, cifg=cifg, peephole=peephole, projection=projection,
                          projection_bias=projection and projection_bias, layer_norm=layer_norm)
    xs = rng.uniform(-1, 1, (steps, batch, isz)).astype(np.float32)
    cell, norms = cell_inputs(t, h, c)
    x = xs if time_major else xs.swapaxes(0, 1).copy()
    inputs = [x, *cell, ("i32", 4), ("f32", 0.0), ("f32", 0.0), ("bool", time_major), *norms]
    seq = (steps, batch, output) if time_major else (batch, steps, output)
    _, _, (out, h_out, c_out) = run(UNI, inputs, [seq, (batch, output), (batch, units)])
    want = []
    for s in range(steps):
        h, c = naive_step(xs[s], h, c, t, 4)
        want.append(h)
    want = np.stack(want)
    np.testing.assert_allclose(out, want if time_major else want.swapaxes(0, 1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(h_out, h, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(c_out, c, rtol=1e-5, atol=1e-6)


def _bidi_inputs(x, fw, bw, aux, fw_aux, bw_aux, time_major, merge):
    (tf, hf, cf), (tb, hb, cb) = fw, bw
    fw_cell, fw_norms = cell_inputs(tf, hf, cf)
    bw_cell, bw_norms = cell_inputs(tb, hb, cb)
    aux_w = lambda t: [t.get("a" + g) for g in GATES] if t is not None else [None] * 4  # noqa: E731
    return [x, *fw_cell[:17], *bw_cell[:17], hf, cf, hb, cb, aux, *aux_w(fw_aux), *aux_w(bw_aux),
            ("i32", 4), ("f32", 0.0), ("f32", 0.0), ("bool", merge), ("bool", time_major), *fw_norms, *bw_norms]


@FAST
@given(seed=st.integers(0, 2**32 - 1), merge=st.booleans(), time_major=st.booleans(),
       linking=st.sampled_from(["none", "parallel", "cross"]), cifg=st.booleans())
def test_bidirectional_linking_and_state_outputs(seed, merge, time_major, linking, cifg):
    rng = np.random.default_rng(seed)
    steps, batch, isz, aux_size, units = 3, 2, 3, 2, 4
    xs = rng.uniform(-1, 1, (steps, batch, isz)).astype(np.float32)
    auxs = rng.uniform(-1, 1, (steps, batch, aux_size)).astype(np.float32)
    opts = dict(cifg=cifg, peephole=True, projection=False, projection_bias=False, layer_norm=False)
    cross = aux_size if linking == "cross" else 0
    fw = random_cell(rng, units, units, isz, batch, aux_size=cross, **opts)
    bw = random_cell(rng, 3, 3, aux_size if linking == "parallel" else isz, batch, aux_size=cross, **opts)
    major = (lambda a: a) if time_major else (lambda a: a.swapaxes(0, 1).copy())
    aux_in = None if linking == "none" else major(auxs)
    inputs = _bidi_inputs(major(xs), fw, bw, aux_in, fw[0] if cross else None, bw[0] if cross else None,
                          time_major, merge)
    seq = (steps, batch) if time_major else (batch, steps)
    outs = [(*seq, units + 3)] if merge else [(*seq, units), (*seq, 3)]
    outs += [(batch, units), (batch, units), (batch, 3), (batch, 3)]
    _, _, got = run(BIDI, inputs, outs)

    def walk(xs_, cell, order, aux):
        t, h, c = cell
        out = [None] * steps
        for s in order:
            h, c = naive_step(xs_[s], h, c, t, 4, aux=None if aux is None else aux[s])
            out[s] = h
        return np.stack(out), h, c

    fw_out, fw_h, fw_c = walk(xs, fw, range(steps), auxs if cross else None)
    bw_out, bw_h, bw_c = walk(auxs if linking == "parallel" else xs, bw, range(steps - 1, -1, -1),
                              auxs if cross else None)
    want = [np.concatenate([fw_out, bw_out], -1)] if merge else [fw_out, bw_out]
    for g, w in zip(got, [major(w) for w in want] + [fw_h, fw_c, bw_h, bw_c]):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_lstm_plan_survives_the_compilation_cache():
    rng = np.random.default_rng(5)
    t, h, c = random_cell(rng, 4, 4, 3, 2, cifg=True, peephole=True, projection=False, projection_bias=False,
                          layer_norm=True)
    cell, norms = cell_inputs(t, h, c)
    x = rng.uniform(-1, 1, (2, 3)).astype(np.float32)
    inputs = [x, *cell, ("i32", 4), ("f32", 0.0), ("f32", 0.0), *norms]
    compiled, args, outs = run(LSTM, inputs, [(2, 12), (2, 4), (2, 4), (2, 4)])
    payload, arrays = dump_compiled(compiled)
    loaded = load_compiled(payload, [np.array(a) for a in arrays])
    for got, want in zip(execute(loaded, args), outs):
        np.testing.assert_array_equal(got, want)


def test_float16_lstm_uses_float16_clips():
    rng = np.random.default_rng(6)
    t, h, c = random_cell(rng, 4, 4, 3, 2, cifg=False, peephole=False, projection=False, projection_bias=False,
                          layer_norm=False)
    t = {k: v.astype(np.float16) for k, v in t.items()}
    h, c = h.astype(np.float16), c.astype(np.float16)
    x = rng.uniform(-1, 1, (2, 3)).astype(np.float16)
    cell, _ = cell_inputs(t, h, c)
    _, _, (_, h_out, c_out, _) = run(LSTM, [x, *cell, ("i32", 4), ("f16", 0.25), ("f16", 0.0)],
                                     [(2, 16), (2, 4), (2, 4), (2, 4)], t=F16)
    assert h_out.dtype == np.float16
    f32 = {k: v.astype(np.float32) for k, v in t.items()}
    want_h, want_c = naive_step(x.astype(np.float32), h.astype(np.float32), c.astype(np.float32), f32, 4, 0.25)
    np.testing.assert_allclose(c_out.astype(np.float32), want_c, rtol=5 * 2**-10, atol=5 * 2**-10)
    np.testing.assert_allclose(h_out.astype(np.float32), want_h, rtol=5 * 2**-10, atol=5 * 2**-10)


def test_option_groups_among_model_inputs_are_checked_when_run():
    """CTS declares every optional tensor as a model input and omits some per request: a model
    whose groups are broken as declared compiles, runs when the request omits the right inputs,
    and fails with INVALID_ARGUMENT when it gives them all."""
    rng = np.random.default_rng(7)
    t, h, c = random_cell(rng, 4, 4, 3, 1, cifg=False, peephole=True, projection=False, projection_bias=False,
                          layer_norm=False)
    x = rng.uniform(-1, 1, (1, 3)).astype(np.float32)
    cell, _ = cell_inputs(t, h, c)
    cell[8] = np.zeros((0,), np.float32)  # cell_to_input declared empty: the peepholes look broken
    model, args = build(LSTM, [x, *cell, ("i32", 4), ("f32", 0.0), ("f32", 0.0)], [(1, 12), (1, 4), (1, 4), (1, 4)])
    compiled = compile_model(model)
    given_all = [a if a.size else None for a in args]
    with pytest.raises(HalError) as e:
        execute(compiled, given_all)
    assert e.value.status == ErrorStatus.INVALID_ARGUMENT
    cifg = list(given_all)
    for k in (1, 5, 12):  # input_to_input, recurrent_to_input, input_gate_bias
        cifg[k] = None
    _, h_out, c_out, _ = execute(compiled, cifg)
    del t["ix"], t["ih"], t["bi"], t["pi"]
    want_h, want_c = naive_step(x, h, c, t, 4)
    np.testing.assert_allclose(h_out, want_h, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(c_out, want_c, rtol=1e-5, atol=1e-6)


# ---- QUANTIZED_16BIT_LSTM -------------------------------------------------------------------------

def test_quantized_lstm_is_bit_exact_on_the_cts_vectors():
    cases = list(load_cases(None, ["QUANTIZED_16BIT_LSTM"]))
    assert cases
    for case in cases:
        compiled = compile_model(build_model(case))
        for ex in examples(case):
            for got, want in zip(execute(compiled, list(ex.inputs)), ex.outputs):
                np.testing.assert_array_equal(got.ravel(), want, err_msg=case.name)


def test_fixedpoint16_logistic_and_tanh_track_the_real_functions():
    raw = np.arange(-32768, 32768, dtype=np.int64)
    for bits in (3, 4):
        real = raw / 2.0 ** (15 - bits)
        np.testing.assert_allclose(fp.logistic(raw, bits) / 32768.0, sigmoid(real), atol=2e-4)
        np.testing.assert_allclose(fp.tanh(raw, bits) / 32768.0, np.tanh(real), atol=4e-4)
    a = np.array([-32768, -32768, 32767, -1, 12345])
    b = np.array([-32768, 32767, 32767, 1, -321])
    assert fp.mul(a, b).tolist() == [32767, -32767, 32766, 0, -121]


def _qlstm_model(batch=2, isz=2, out=4, *, input_scale=1 / 128, bias_scale=None, state_scale=2**-11, wzp=100):
    b = ModelBuilder()
    ws = 0.00408021
    bias_scale = ws / 128 if bias_scale is None else bias_scale
    ins = [b.add_operand(QU8, (batch, isz), input_scale, 128)]
    ins += [b.add_operand(QU8, (out, isz), ws, wzp) for _ in range(4)]
    ins += [b.add_operand(QU8, (out, out), ws, 100) for _ in range(4)]
    ins += [b.add_operand(OperandType.TENSOR_INT32, (out,), bias_scale, 0) for _ in range(4)]
    ins += [b.add_operand(OperandType.TENSOR_QUANT16_SYMM, (batch, out), state_scale, 0),
            b.add_operand(QU8, (batch, out), 1 / 128, 128)]
    outs = [b.add_operand(OperandType.TENSOR_QUANT16_SYMM, (batch, out), 2**-11, 0),
            b.add_operand(QU8, (batch, out), 1 / 128, 128)]
    b.add_operation(QLSTM, ins, outs)
    b.identify_inputs_and_outputs(ins, outs)
    return b.finish()


@pytest.mark.parametrize("kwargs", [dict(input_scale=1 / 64), dict(bias_scale=1e-3), dict(state_scale=2**-12),
                                    dict(wzp=99)])
def test_quantized_lstm_rejects_other_quantizations(kwargs):
    compile_model(_qlstm_model())  # the valid one compiles
    with pytest.raises(HalError) as e:
        compile_model(_qlstm_model(**kwargs))
    assert e.value.status == ErrorStatus.INVALID_ARGUMENT


# ---- NNAPI's rules --------------------------------------------------------------------------------

def _lstm_inputs(**change):
    rng = np.random.default_rng(0)
    t, h, c = random_cell(rng, 4, 4, 3, 2, cifg=False, peephole=False, projection=False, projection_bias=False,
                          layer_norm=False)
    cell, _ = cell_inputs(t, h, c)
    inputs = [rng.uniform(-1, 1, (2, 3)).astype(np.float32), *cell, ("i32", 4), ("f32", 0.0), ("f32", 0.0)]
    for k, v in change.items():
        inputs[int(k[1:])] = v
    return inputs


def _invalid(op, inputs, out_shapes, match, t=F32):
    with pytest.raises(HalError, match=match) as e:
        run(op, inputs, out_shapes, t)
    assert e.value.status == ErrorStatus.INVALID_ARGUMENT


LSTM_OUTS = [(2, 16), (2, 4), (2, 4), (2, 4)]
_z = lambda *s: np.zeros(s, np.float32)  # noqa: E731


@pytest.mark.parametrize("change, match", [
    (dict(i0=_z(2, 3, 1)), "rank"),
    (dict(i2=_z(4, 5)), "input weights"),
    (dict(i6=_z(4, 3)), "recurrent weights"),
    (dict(i13=_z(5)), "gate bias"),
    (dict(i19=_z(3, 4)), "cell state"),
    (dict(i20=("i32", 5)), "activation"),
    (dict(i21=("f32", -1.0)), "cell_clip"),
    (dict(i22=("f32", float("nan"))), "proj_clip"),
    (dict(i1=None), "input_to_input_weights and recurrent_to_input_weights"),  # half CIFG
    (dict(i9=_z(4)), "peephole"),  # cell_to_input alone
    (dict(i17=_z(4)), "projection_bias needs projection_weights"),
    (dict(i16=_z(3, 4)), "projection weights"),  # output_size 4 ≠ projection rows 3
    (dict(i21=("i32", 0)), "FLOAT32"),
])
def test_lstm_rejects(change, match):
    _invalid(LSTM, _lstm_inputs(**change), LSTM_OUTS, match)


def test_lstm_rejects_wrong_counts_and_partial_layer_norm():
    _invalid(LSTM, _lstm_inputs()[:22], LSTM_OUTS, "23 or 27 inputs")
    _invalid(LSTM, _lstm_inputs() + [_z(4), _z(4), _z(4), None], LSTM_OUTS, "layer norm")
    _invalid(LSTM, _lstm_inputs(), LSTM_OUTS[:3], "outputs")


def test_float16_lstm_needs_float16_clips():
    inputs = [a.astype(np.float16) if isinstance(a, np.ndarray) else a for a in _lstm_inputs()]
    _invalid(LSTM, inputs, LSTM_OUTS, "FLOAT16", t=F16)


def test_sequence_lstms_reject():
    seq = _lstm_inputs()
    seq[0] = np.zeros((5, 2, 3), np.float32)
    uni = seq + [("i32", 1), None, None, None, None]  # time_major must be BOOL
    _invalid(UNI, uni, [(5, 2, 4)], "BOOL")
    _invalid(UNI, seq + [("bool", True), None, None, None, None], [(5, 2, 4), (2, 4)], "outputs")
    rng = np.random.default_rng(1)
    opts = dict(cifg=False, peephole=False, projection=False, projection_bias=False, layer_norm=False)
    cell = random_cell(rng, 4, 4, 3, 2, **opts)
    x = np.zeros((5, 2, 3), np.float32)
    # merge_outputs with two sequence outputs; 3 outputs; aux weights without an aux input
    _invalid(BIDI, _bidi_inputs(x, cell, cell, None, None, None, True, True), [(5, 2, 8), (5, 2, 4)],
             "merge_outputs")
    _invalid(BIDI, _bidi_inputs(x, cell, cell, None, None, None, True, False), [(5, 2, 4)] * 3, "outputs")
    aux_cell = random_cell(rng, 4, 4, 3, 2, aux_size=3, **opts)[0]
    inputs = _bidi_inputs(x, cell, cell, None, aux_cell, aux_cell, True, False)
    _invalid(BIDI, inputs, [(5, 2, 4), (5, 2, 4)], "aux")
    # an aux input of another length
    inputs = _bidi_inputs(x, cell, cell, np.zeros((4, 2, 3), np.float32), aux_cell, aux_cell, True, False)
    _invalid(BIDI, inputs, [(5, 2, 4), (5, 2, 4)], "aux_input")
