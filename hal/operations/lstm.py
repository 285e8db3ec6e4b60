"""LSTM: one step of a long short-term memory cell, and the cell rules the sequence LSTMs share.

Types: TENSOR_FLOAT32 (NNAPI 1.0) and TENSOR_FLOAT16 (1.2); every tensor has input 0's type, the
clip scalars are FLOAT32 (FLOAT16 for a TENSOR_FLOAT16 operation), the activation is INT32.

Inputs (23, or 27 since NNAPI 1.2 with the layer normalisation weights):
 0 input [batch, input_size]
 1-4 input_to_{input,forget,cell,output}_weights [num_units, input_size] (1 optional: CIFG)
 5-8 recurrent_to_{input,forget,cell,output}_weights [num_units, output_size] (5 optional: CIFG)
 9-11 cell_to_{input,forget,output}_weights [num_units] (optional: the peephole connections)
 12-15 {input,forget,cell,output}_gate_bias [num_units] (12 omitted with CIFG)
 16 projection_weights [output_size, num_units], 17 projection_bias [output_size] (optional)
 18 output_state_in [batch, output_size], 19 cell_state_in [batch, num_units]
 20 activation (INT32: 0 none, 1 relu, 2 relu1, 3 relu6, 4 tanh, 6 sigmoid), applied to the cell
    input and to the cell state on its way out
 21 cell_clip, 22 proj_clip (> 0: clip the cell state / the projection to [-clip, clip]; 0: no clip)
 23-26 {input,forget,cell,output}_layer_norm_weights [num_units] (optional, 1.2; 23 omitted with
    CIFG): each gate's pre-activation is normalised over num_units, scaled, then biased.
Outputs: 0 scratch_buffer [batch, num_units * 4] ([batch, num_units * 3] with CIFG; its content is
not specified), 1 output_state_out [batch, output_size], 2 cell_state_out [batch, num_units],
3 output [batch, output_size].

Optional groups are all-or-none (AOSP's CheckInputTensorDimensions): input-gate weights (CIFG),
peephole weights (cell_to_input omitted with CIFG), layer norm weights (input one omitted with
CIFG); a projection bias needs projection weights. "Present" means given and not empty: CTS
declares omitted optional tensors as model inputs of shape [0] and leaves them out of the request.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

from hal.operations.common import F16, F32, FLOAT32, INT32, param
from hal.registry import OperationContext, register
from hal.types import FeatureLevel, OperandLifeTime, OperandType, OperationType

LSTM = OperationType.LSTM
TYPES = (F32, F16)
FLOAT16 = OperandType.FLOAT16

INPUT = 0
INPUT_TO_INPUT_WEIGHTS, INPUT_TO_FORGET_WEIGHTS, INPUT_TO_CELL_WEIGHTS, INPUT_TO_OUTPUT_WEIGHTS = 1, 2, 3, 4
RECURRENT_TO_INPUT_WEIGHTS, RECURRENT_TO_FORGET_WEIGHTS = 5, 6
RECURRENT_TO_CELL_WEIGHTS, RECURRENT_TO_OUTPUT_WEIGHTS = 7, 8
CELL_TO_INPUT_WEIGHTS, CELL_TO_FORGET_WEIGHTS, CELL_TO_OUTPUT_WEIGHTS = 9, 10, 11
INPUT_GATE_BIAS, FORGET_GATE_BIAS, CELL_GATE_BIAS, OUTPUT_GATE_BIAS = 12, 13, 14, 15
PROJECTION_WEIGHTS, PROJECTION_BIAS = 16, 17
OUTPUT_STATE_IN, CELL_STATE_IN = 18, 19
ACTIVATION, CELL_CLIP, PROJ_CLIP = 20, 21, 22
INPUT_LAYER_NORM_WEIGHTS, FORGET_LAYER_NORM_WEIGHTS = 23, 24
CELL_LAYER_NORM_WEIGHTS, OUTPUT_LAYER_NORM_WEIGHTS = 25, 26
SCRATCH_BUFFER, OUTPUT_STATE_OUT, CELL_STATE_OUT, OUTPUT = 0, 1, 2, 3


class LstmActivation(enum.IntEnum):
    """TFLite's activation codes as LSTM reads them (a superset of the fused activations)."""

    NONE = 0
    RELU = 1
    RELU1 = 2
    RELU6 = 3
    TANH = 4
    SIGMOID = 6


@dataclass(frozen=True)
class CellTensors:
    """Positions of one cell's tensors among the operation's inputs (-1: the operation has none).
    The same cell appears in LSTM, UNIDIRECTIONAL_SEQUENCE_LSTM and twice in
    BIDIRECTIONAL_SEQUENCE_LSTM, at different positions."""

    input_to_input: int
    input_to_forget: int
    input_to_cell: int
    input_to_output: int
    recurrent_to_input: int
    recurrent_to_forget: int
    recurrent_to_cell: int
    recurrent_to_output: int
    cell_to_input: int
    cell_to_forget: int
    cell_to_output: int
    input_gate_bias: int
    forget_gate_bias: int
    cell_gate_bias: int
    output_gate_bias: int
    projection_weights: int
    projection_bias: int
    output_state_in: int
    cell_state_in: int
    input_layer_norm: int = -1
    forget_layer_norm: int = -1
    cell_layer_norm: int = -1
    output_layer_norm: int = -1
    aux_input_to_input: int = -1
    aux_input_to_forget: int = -1
    aux_input_to_cell: int = -1
    aux_input_to_output: int = -1

    @property
    def input_weights(self) -> tuple[int, int, int, int]:
        return self.input_to_input, self.input_to_forget, self.input_to_cell, self.input_to_output

    @property
    def recurrent_weights(self) -> tuple[int, int, int, int]:
        return self.recurrent_to_input, self.recurrent_to_forget, self.recurrent_to_cell, self.recurrent_to_output

    @property
    def biases(self) -> tuple[int, int, int, int]:
        return self.input_gate_bias, self.forget_gate_bias, self.cell_gate_bias, self.output_gate_bias

    @property
    def peepholes(self) -> tuple[int, int, int]:
        return self.cell_to_input, self.cell_to_forget, self.cell_to_output

    @property
    def layer_norms(self) -> tuple[int, int, int, int]:
        return self.input_layer_norm, self.forget_layer_norm, self.cell_layer_norm, self.output_layer_norm

    @property
    def aux_weights(self) -> tuple[int, int, int, int]:
        return self.aux_input_to_input, self.aux_input_to_forget, self.aux_input_to_cell, self.aux_input_to_output

    def tensors(self) -> tuple[int, ...]:
        return tuple(i for i in (*self.input_weights, *self.recurrent_weights, *self.peepholes, *self.biases,
                                 self.projection_weights, self.projection_bias, self.output_state_in,
                                 self.cell_state_in, *self.layer_norms, *self.aux_weights) if i >= 0)


#: LSTM's cell (UNIDIRECTIONAL_SEQUENCE_LSTM's too, with its layer norm weights one position later).
LSTM_CELL = CellTensors(*range(1, 20), *range(23, 27))


@dataclass(frozen=True)
class CellConfig:
    """One cell as prepared: where its tensors are, its sizes and which options it uses."""

    tensors: CellTensors
    input_size: int
    num_units: int
    output_size: int
    use_cifg: bool
    use_peephole: bool
    use_layer_norm: bool
    use_projection: bool
    use_projection_bias: bool
    use_aux: bool = False  # cross-linked auxiliary input (BIDIRECTIONAL_SEQUENCE_LSTM)
    #: Why the cell cannot run as compiled (a broken all-or-none rule among model inputs that a
    #: request may still omit); "" when it can. See ``check_cell``.
    deferred: str = ""

    @property
    def scratch_units(self) -> int:
        return self.num_units * (3 if self.use_cifg else 4)


@dataclass(frozen=True)
class LstmParams:
    """What every float LSTM kernel needs. Sequences are [max_time, batch, ...] when time_major."""

    cells: tuple[CellConfig, ...]
    activation: int
    cell_clip: float
    proj_clip: float
    batch: int
    max_time: int = 1
    time_major: bool = True
    merge_outputs: bool = False
    state_outputs: bool = False
    aux_input: int = -1  # position of the auxiliary input; -1: none
    parallel_linking: bool = False  # the backward cell reads the auxiliary input instead of input 0


def present(ctx: OperationContext, i: int) -> bool:
    """An optional tensor is used: given, and not declared empty (CTS's [0] placeholders)."""
    return i >= 0 and ctx.has_input(i) and all(d > 0 for d in ctx.input(i).shape) and ctx.input(i).rank_known


def maybe_omitted(ctx: OperationContext, i: int) -> bool:
    """A tensor that is a model input: an execution may omit it (it is optional)."""
    return i >= 0 and ctx.has_input(i) and ctx.input(i).lifetime == OperandLifeTime.SUBGRAPH_INPUT


def dims_match(a: int, b: int) -> bool:
    """Equal, or one of them not known yet (0)."""
    return a == b or a == 0 or b == 0


def check_float_types(ctx: OperationContext, tensor_inputs, scalar_clips=(), num_outputs: int = 0) -> int:
    """Every given tensor input and every output has input 0's type; the clips are FLOAT32 for a
    TENSOR_FLOAT32 operation and FLOAT16 for a TENSOR_FLOAT16 one."""
    t = ctx.input_type(INPUT)
    for i in tensor_inputs:
        if ctx.has_input(i):
            ctx.expect_input_type(i, t)
    for i in scalar_clips:
        ctx.expect_input_type(i, FLOAT16 if t == F16 else FLOAT32)
    for o in range(num_outputs):
        ctx.expect_output_type(o, t)
    return t


def check_cell_ranks(ctx: OperationContext, cell: CellTensors) -> None:
    """Validate-time rank checks on the cell tensors whose shapes are declared."""
    ranks = [(i, 2) for i in (*cell.input_weights, *cell.recurrent_weights, cell.projection_weights,
                              cell.output_state_in, cell.cell_state_in, *cell.aux_weights)]
    ranks += [(i, 1) for i in (*cell.peepholes, *cell.biases, cell.projection_bias, *cell.layer_norms)]
    for i, rank in ranks:
        if present(ctx, i):
            ctx.expect_input_rank(i, rank)


def read_activation(ctx: OperationContext, i: int) -> int | None:
    v = param(ctx, i, INT32)
    if v is None:
        return None
    try:
        return int(LstmActivation(v))
    except ValueError:
        raise ctx.fail(f"input {i}: unsupported LSTM activation {v} (0, 1, 2, 3, 4 or 6)") from None


def read_clip(ctx: OperationContext, i: int, what: str) -> float | None:
    t = FLOAT16 if ctx.input_type(INPUT) == F16 else FLOAT32
    v = param(ctx, i, t)
    if v is None:
        return None
    v = float(v)
    ctx.check(v >= 0, f"{what} must be >= 0, got {v}")  # NaN fails too
    return v


def _check_shape(ctx: OperationContext, i: int, want: tuple[int, ...], name: str) -> None:
    s = ctx.input_shape(i)
    ctx.check(len(s) == len(want) and all(dims_match(a, b) for a, b in zip(s, want)),
              f"{name} (input {i}) has shape {list(s)}, expected {list(want)}")


def check_cell(ctx: OperationContext, cell: CellTensors, batch: int, input_size: int,
               aux_size: int = 0, what: str = "") -> CellConfig:
    """AOSP's CheckInputTensorDimensions for one cell: sizes, and the all-or-none option groups.
    ``aux_size`` > 0 when the cell is cross-linked to an auxiliary input of that size."""
    for i in (cell.input_to_output, cell.recurrent_to_output):
        ctx.check(len(ctx.input_shape(i)) == 2, f"{what}input {i} must be rank 2, got {list(ctx.input_shape(i))}")
    num_units = ctx.input_shape(cell.input_to_output)[0]
    output_size = ctx.input_shape(cell.recurrent_to_output)[1]
    ctx.check(num_units > 0 and output_size > 0,
              f"{what}num_units ({num_units}) and output_size ({output_size}) must be known and > 0")

    deferred: list[str] = []

    def group(ok: bool, message: str, members) -> None:
        """An all-or-none rule. While compiling, a member that is a model input may still be
        omitted by the request (the operation is then prepared again): a broken rule is then
        reported when the operation runs with it broken, not now."""
        if ok:
            return
        if not ctx.validating and any(maybe_omitted(ctx, i) for i in members):
            deferred.append(what + message)
            return
        raise ctx.fail(what + message)

    use_cifg = not present(ctx, cell.input_to_input)
    group(use_cifg == (not present(ctx, cell.recurrent_to_input)),
          "input_to_input_weights and recurrent_to_input_weights must be both given or both omitted",
          (cell.input_to_input, cell.recurrent_to_input))
    for k, i in enumerate(cell.input_weights):
        if k or not use_cifg:
            _check_shape(ctx, i, (num_units, input_size), f"{what}input weights")
    for k, i in enumerate(cell.recurrent_weights):
        if k or not use_cifg or present(ctx, i):
            _check_shape(ctx, i, (num_units, output_size), f"{what}recurrent weights")

    peep = [present(ctx, i) for i in cell.peepholes]
    use_peephole = peep[2]
    group(((peep[0] or use_cifg) and peep[1] and peep[2]) or not any(peep),
          "peephole weights must be all given or all omitted (cell_to_input may be omitted with CIFG)",
          (cell.input_to_input, *cell.peepholes))
    for i in cell.peepholes:
        if present(ctx, i):
            _check_shape(ctx, i, (num_units,), f"{what}peephole weights")

    group(not use_cifg or not present(ctx, cell.input_gate_bias), "input_gate_bias must be omitted with CIFG",
          (cell.input_to_input, cell.input_gate_bias))
    for k, i in enumerate(cell.biases):
        if k or not use_cifg:
            group(present(ctx, i), f"input {i} (gate bias) must have a value", (i, cell.input_to_input))
        if present(ctx, i):
            _check_shape(ctx, i, (num_units,), f"{what}gate bias")

    use_projection = present(ctx, cell.projection_weights)
    use_projection_bias = present(ctx, cell.projection_bias)
    group(use_projection or not use_projection_bias, "projection_bias needs projection_weights",
          (cell.projection_weights, cell.projection_bias))
    if use_projection:
        _check_shape(ctx, cell.projection_weights, (output_size, num_units), f"{what}projection weights")
    else:
        group(output_size == num_units, f"without projection, output_size ({output_size}) must equal "
                                        f"num_units ({num_units})", (cell.projection_weights,))
    if use_projection_bias:
        _check_shape(ctx, cell.projection_bias, (output_size,), f"{what}projection bias")
    _check_shape(ctx, cell.output_state_in, (batch, output_size), f"{what}output state")
    _check_shape(ctx, cell.cell_state_in, (batch, num_units), f"{what}cell state")

    norms = [present(ctx, i) for i in cell.layer_norms]
    use_layer_norm = norms[3]
    group(norms == [use_layer_norm and not use_cifg] + [use_layer_norm] * 3,
          "layer norm weights must be all given or all omitted (the input one omitted with CIFG)",
          (cell.input_to_input, *cell.layer_norms))
    for i in cell.layer_norms:
        if present(ctx, i):
            _check_shape(ctx, i, (num_units,), f"{what}layer norm weights")

    aux = [present(ctx, i) for i in cell.aux_weights]
    use_aux = aux[1]
    group(aux == [use_aux and not use_cifg] + [use_aux] * 3,
          "aux weights must be all given or all omitted (aux_input_to_input omitted with CIFG)",
          (cell.input_to_input, *cell.aux_weights))
    if use_aux:
        ctx.check(aux_size > 0, f"{what}aux weights need an auxiliary input")
        for i in cell.aux_weights:
            if present(ctx, i):
                _check_shape(ctx, i, (num_units, aux_size), f"{what}aux weights")
    return CellConfig(cell, input_size, num_units, output_size, use_cifg, use_peephole, use_layer_norm,
                      use_projection, use_projection_bias, use_aux, "; ".join(deferred))


# ---- LSTM ---------------------------------------------------------------------------------------

def validate(ctx: OperationContext) -> None:
    check_float_types(ctx, list(range(INPUT, CELL_STATE_IN + 1)) + list(range(23, ctx.num_inputs)),
                      (CELL_CLIP, PROJ_CLIP), 4)
    ctx.expect_input_rank(INPUT, 2)
    check_cell_ranks(ctx, LSTM_CELL if ctx.num_inputs == 27 else _V1_0_CELL)
    read_activation(ctx, ACTIVATION)
    read_clip(ctx, CELL_CLIP, "cell_clip")
    read_clip(ctx, PROJ_CLIP, "proj_clip")


#: The NNAPI 1.0 form has no layer normalisation inputs.
_V1_0_CELL = CellTensors(*range(1, 20))


def prepare(ctx: OperationContext) -> LstmParams:
    x = ctx.input_shape(INPUT)
    ctx.check(len(x) == 2, f"input must be rank 2 [batch, input_size], got {list(x)}")
    batch, input_size = x
    cell = check_cell(ctx, LSTM_CELL if ctx.num_inputs == 27 else _V1_0_CELL, batch, input_size)
    scratch = (batch, cell.scratch_units)
    declared = ctx.output(SCRATCH_BUFFER).shape
    if cell.deferred and len(declared) == 2 and all(declared) and declared[1] in (3 * cell.num_units,
                                                                                 4 * cell.num_units):
        scratch = (batch, declared[1])  # CIFG or not is known at execution only
    ctx.set_output_shape(SCRATCH_BUFFER, scratch)
    ctx.set_output_shape(OUTPUT_STATE_OUT, (batch, cell.output_size))
    ctx.set_output_shape(CELL_STATE_OUT, (batch, cell.num_units))
    ctx.set_output_shape(OUTPUT, (batch, cell.output_size))
    return LstmParams((cell,), read_activation(ctx, ACTIVATION), read_clip(ctx, CELL_CLIP, "cell_clip"),
                      read_clip(ctx, PROJ_CLIP, "proj_clip"), batch)


OPTIONAL = (INPUT_TO_INPUT_WEIGHTS, RECURRENT_TO_INPUT_WEIGHTS, CELL_TO_INPUT_WEIGHTS, CELL_TO_FORGET_WEIGHTS,
            CELL_TO_OUTPUT_WEIGHTS, INPUT_GATE_BIAS, PROJECTION_WEIGHTS, PROJECTION_BIAS,
            INPUT_LAYER_NORM_WEIGHTS, FORGET_LAYER_NORM_WEIGHTS, CELL_LAYER_NORM_WEIGHTS, OUTPUT_LAYER_NORM_WEIGHTS)

register(LSTM, validate=validate, prepare=prepare, input_types=TYPES, num_inputs=(23, 27), num_outputs=(4,),
         optional_inputs=OPTIONAL, min_feature_level=FeatureLevel.FL1, type_feature_levels={F16: FeatureLevel.FL3})
