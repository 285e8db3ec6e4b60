"""QUANTIZED_LSTM (NNAPI 1.3, the fully integer LSTM) against TFLite's int8 LSTM in its reference
kernels: outputs and both states bit-exact over several steps with the state fed back, for every
option (CIFG, peephole, projection with and without bias, layer norm, clipping, cell state
scales); and NNAPI's rules (bad models fail with INVALID_ARGUMENT). No CTS vectors exist for it."""
from __future__ import annotations

import numpy as np
import pytest

from hal.compiler import compile_model
from hal.errors import HalError
from hal.executor import execute
from hal.model import ModelBuilder
from hal.types import ErrorStatus, OperandType, OperationType
from tests.ops._qlstm_tflite import POSITIONS, QLstmCase, random_case, run_tflite

QLSTM = OperationType.QUANTIZED_LSTM
QS8 = OperandType.TENSOR_QUANT8_ASYMM_SIGNED
Q8S = OperandType.TENSOR_QUANT8_SYMM
Q16 = OperandType.TENSOR_QUANT16_SYMM
I32 = OperandType.TENSOR_INT32
COVERED = {(QLSTM, QS8)}


def operand_type(name: str) -> int:
    if name in ("proj", "proj_b"):
        return Q8S if name == "proj" else I32
    return {"p": Q16, "l": Q16, "b": I32}.get(name[0], Q8S)


def hal_model(case: QLstmCase, *, drop=(), add=None, types=None, shapes=None, scalars=None, outputs=None):
    """The QUANTIZED_LSTM of ``case``: input 0 and the two states are model inputs, the weights
    constants. ``drop``: tensor names to omit; ``add``: extra {name: array} tensors; ``types``:
    {input position: operand type}; ``shapes``: {input position: shape}; ``scalars``: {input
    position: value} for inputs 24-31; ``outputs``: declared output operand types."""
    b = ModelBuilder()
    n, units, out = case.batch, case.num_units, case.output_size
    types, shapes = types or {}, shapes or {}

    def tensor(pos, t, shape, scale=0.0, zp=0):
        return b.add_operand(types.get(pos, t), shapes.get(pos, shape), scale, zp)

    ins: list[int] = [-1] * 32
    ins[0] = tensor(0, QS8, (n, case.input_size), case.input_scale, case.input_zp)
    tensors = {k: v for k, v in case.tensors.items() if k not in drop}
    tensors.update(add or {})
    for name, pos in POSITIONS.items():
        if name in tensors:
            arr = tensors[name]
            ins[pos] = b.add_constant(types.get(pos, operand_type(name)), arr, scale=case.scales.get(name, 0.001))
        else:
            t = operand_type(name)
            ins[pos] = b.add_operand(t, (0,), 0.0 if t == I32 else 1.0)
            b.set_no_value(ins[pos])
    ins[18] = tensor(18, QS8, (n, out), case.state_scale, case.state_zp)
    ins[19] = tensor(19, Q16, (n, units), case.cell_scale)
    hidden_scale, hidden_zp = case.intermediates[4]
    values = {24: case.cell_clip, 25: case.proj_clip, **dict(zip(range(26, 30), case.gate_intermediate_scales())),
              30: hidden_zp, 31: hidden_scale, **(scalars or {})}
    for pos in range(24, 32):
        ins[pos] = b.add_int32(values[pos]) if pos == 30 else b.add_float32(values[pos])
    o_types = outputs or (QS8, Q16, QS8)
    outs = [b.add_operand(o_types[0], (n, out), case.state_scale, case.state_zp),
            b.add_operand(o_types[1], (n, units), case.cell_scale),
            b.add_operand(o_types[2], (n, out), case.state_scale, case.state_zp)]
    b.add_operation(QLSTM, ins, outs)
    b.identify_inputs_and_outputs([ins[0], ins[18], ins[19]], outs)
    return b.finish()


def random_steps(rng, case: QLstmCase, steps: int):
    xs = [rng.integers(-128, 128, (case.batch, case.input_size)).astype(np.int8) for _ in range(steps)]
    h0 = rng.integers(-128, 128, (case.batch, case.output_size)).astype(np.int8)
    c0 = rng.integers(-6000, 6000, (case.batch, case.num_units)).astype(np.int16)
    return xs, h0, c0


def assert_matches_tflite(case: QLstmCase, rng, steps: int = 4) -> None:
    xs, h0, c0 = random_steps(rng, case, steps)
    want = run_tflite(case, xs, h0, c0)
    compiled = compile_model(hal_model(case))
    h, c = h0, c0
    for k, (x, (w_out, w_h, w_c)) in enumerate(zip(xs, want)):
        h_out, c_out, out = execute(compiled, [x, h, c])
        assert out.dtype == np.int8 and c_out.dtype == np.int16
        np.testing.assert_array_equal(c_out, w_c, err_msg=f"cell state, step {k}")
        np.testing.assert_array_equal(out, w_out, err_msg=f"output, step {k}")
        np.testing.assert_array_equal(h_out, w_h, err_msg=f"output state, step {k}")
        h, c = h_out, c_out


VARIANTS = {
    "basic": {},
    "cifg": dict(cifg=True),
    "peephole": dict(peephole=True),
    "cifg_peephole": dict(cifg=True, peephole=True),
    "projection": dict(projection=True),
    "projection_bias": dict(projection=True, projection_bias=True),
    "layer_norm": dict(layer_norm=True),
    "cifg_layer_norm": dict(cifg=True, layer_norm=True),
    # TFLite's peephole walks the cell state with a stride of output_size: keep it equal to num_units.
    "everything": dict(peephole=True, projection=True, projection_bias=True, layer_norm=True, output_size=4),
    "cifg_everything": dict(cifg=True, peephole=True, projection=True, layer_norm=True, output_size=4),
    "cell_clip": dict(cell_clip=0.3),
    "proj_clip": dict(projection=True, proj_clip=0.2),
    "cell_scale_2^-9": dict(cell_scale_log2=-9, peephole=True),
    "cell_scale_2^-12": dict(cell_scale_log2=-12, layer_norm=True),
    "batch_1_wide": dict(batch=1, input_size=17, num_units=8),
    "batch_5": dict(batch=5, input_size=3, num_units=6, layer_norm=True, projection=True, projection_bias=True),
}


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_bit_exact_with_tflite(variant, seed):
    rng = np.random.default_rng(seed)
    assert_matches_tflite(random_case(rng, **VARIANTS[variant]), rng)


@pytest.mark.parametrize("projection", [False, True])
def test_saturating_hidden_state_with_its_own_zero_point(projection):
    """A hidden scale small enough to saturate int8 and a zero point unrelated to the output
    state's: TFLite adds the zero point to the output, but subtracts it from a hidden state that
    feeds a projection (and adds it back through the projection's bias)."""
    rng = np.random.default_rng(7)
    case = random_case(rng, projection=projection, projection_bias=projection)
    scale, _ = case.intermediates[4]
    case.intermediates[4] = (scale / 3, 7)
    assert_matches_tflite(case, rng)


def assert_invalid(case: QLstmCase, **kwargs) -> None:
    with pytest.raises(HalError) as e:
        compile_model(hal_model(case, **kwargs))
    assert e.value.status == ErrorStatus.INVALID_ARGUMENT


def case_with(**options) -> QLstmCase:
    return random_case(np.random.default_rng(3), **options)


def test_the_valid_models_compile():
    for options in ({}, dict(cifg=True, peephole=True, layer_norm=True, projection=True, projection_bias=True)):
        compile_model(hal_model(case_with(**options)))


@pytest.mark.parametrize("pos, t", [(0, OperandType.TENSOR_QUANT8_ASYMM), (2, QS8), (6, Q16), (10, Q8S),
                                    (13, Q8S), (18, OperandType.TENSOR_QUANT8_ASYMM), (19, I32)])
def test_wrong_input_types(pos, t):
    assert_invalid(case_with(peephole=True), types={pos: t})


def test_wrong_scalar_and_output_types():
    case = case_with()
    assert_invalid(case, outputs=(QS8, QS8, QS8))
    assert_invalid(case, outputs=(Q16, Q16, QS8))


@pytest.mark.parametrize("pos, shape", [(0, (2, 5, 1)), (18, (8,)), (19, (2, 4, 1))])
def test_wrong_ranks(pos, shape):
    assert_invalid(case_with(), shapes={pos: shape})


def test_wrong_sizes():
    case = case_with()
    assert_invalid(case, shapes={18: (case.batch, case.output_size + 1)})
    assert_invalid(case, add={"fx": case.tensors["fx"][:, :-1]})
    assert_invalid(case, add={"bo": case.tensors["bo"][:-1]})


@pytest.mark.parametrize("name", ["fx", "cx", "ox", "fh", "ch", "oh", "bf", "bc", "bo"])
def test_missing_required_input(name):
    assert_invalid(case_with(), drop=(name,))


@pytest.mark.parametrize("options, drop, add", [
    ({}, ("ih",), None),  # CIFG half: input-to-input weights without recurrent-to-input
    ({}, ("ix",), None),
    ({}, ("bi",), None),  # not CIFG: the input gate bias is required
    (dict(cifg=True), (), "bi"),  # CIFG: no input gate bias
    (dict(peephole=True), ("po",), None),
    (dict(peephole=True), ("pi",), None),
    (dict(layer_norm=True), ("lc",), None),
    (dict(layer_norm=True), ("li",), None),
    (dict(cifg=True), (), "li"),  # CIFG: no input layer norm weights
    (dict(projection=True, projection_bias=True), ("proj",), None),  # a bias needs weights
])
def test_optional_groups_all_or_none(options, drop, add):
    case = case_with(**options)
    extra = {add: np.ones(case.num_units, np.int32 if add == "bi" else np.int16)} if add else None
    assert_invalid(case, drop=drop, add=extra)


@pytest.mark.parametrize("pos, value", [(24, -1.0), (25, float("nan")), (28, -0.5), (30, 128), (31, 0.0)])
def test_bad_scalars(pos, value):
    assert_invalid(case_with(), scalars={pos: value})


@pytest.mark.parametrize("cell_scale", [3e-4, 2.0 ** -8])
def test_cell_state_scale_must_be_a_small_power_of_two(cell_scale):
    case = case_with()
    case.cell_scale = cell_scale
    assert_invalid(case)
