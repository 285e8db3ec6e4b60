"""A fully integer TFLite LSTM (int8 input, state and weights, int16 cell state, the 5 intermediate
tensors of the "8x8_16" kernel) and how to run it in TFLite's reference kernels, one step per
invocation with the state fed back. The oracle of QUANTIZED_LSTM (there are no CTS vectors for
it); a delegate mapping of this builtin can reuse ``random_case``, ``tflite_model`` and
``run_tflite``.

TFLite's LSTM (24 inputs) vs NNAPI's QUANTIZED_LSTM (32 inputs): TFLite inputs 0-17 are NNAPI
inputs 0-17; TFLite 18 (output state, a variable tensor) and 19 (cell state, a variable tensor)
are NNAPI 18 and 19; TFLite's layer norm coefficients 20-23 are NNAPI 20-23; LSTMOptions'
cell_clip and proj_clip are NNAPI 24 and 25; the operator's intermediates 0-3 give NNAPI 26-29
(their scale; without layer norm TFLite ignores them and uses 2^-12, so NNAPI gets 2^-12), and
intermediate 4 gives NNAPI 30 (its zero point) and 31 (its scale). NNAPI's outputs 0 (output
state) and 2 (output) are TFLite's output and the new output state; output 1 the new cell state.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from delegate.runtime import Interpreter, OpResolverType
from delegate.tfl import TfLiteModelBuilder

GATES = "ifco"  # input, forget, cell, output
#: The LSTM builtin's fused activation for the cell (TANH): the only one the integer kernel runs.
TANH = 4
LSTM_VERSION = 4  # LSTM's op version for the fully integer kernel


@dataclass
class QLstmCase:
    """One int8 LSTM cell: tensors by short name (``ix`` input-to-input weights, ``fh``
    recurrent-to-forget, ``pi`` peephole, ``bc`` cell gate bias, ``lo`` output layer norm,
    ``proj``, ``proj_b``), each with its scale; absent names are absent options."""

    batch: int
    input_size: int
    num_units: int
    output_size: int
    input_scale: float
    input_zp: int
    state_scale: float  # output state and output
    state_zp: int
    cell_scale: float  # a power of two
    tensors: dict[str, np.ndarray] = field(default_factory=dict)
    scales: dict[str, float] = field(default_factory=dict)
    #: The 5 intermediates' (scale, zero point): 4 gate matmul sums, then the hidden state.
    intermediates: list[tuple[float, int]] = field(default_factory=list)
    cell_clip: float = 0.0
    proj_clip: float = 0.0

    @property
    def layer_norm(self) -> bool:
        return "lf" in self.tensors

    def gate_intermediate_scales(self) -> list[float]:
        """The intermediate scales TFLite's kernel uses: the tensors' with layer norm, else Q3.12."""
        return [s for s, _ in self.intermediates[:4]] if self.layer_norm else [2.0 ** -12] * 4


def random_case(rng: np.random.Generator, *, batch: int = 2, input_size: int = 5, num_units: int = 4,
                output_size: int | None = None, cifg: bool = False, peephole: bool = False,
                projection: bool = False, projection_bias: bool = False, layer_norm: bool = False,
                cell_clip: float = 0.0, proj_clip: float = 0.0, cell_scale_log2: int = -11) -> QLstmCase:
    """Random weights and quantization of realistic magnitudes (gate sums of a few units)."""
    output_size = output_size or (num_units + 2 if projection else num_units)
    u = rng.uniform
    in_scale, st_scale = float(u(0.008, 0.02)), float(u(0.006, 0.01))
    hidden = (st_scale, -int(rng.integers(-5, 6)))
    if projection:
        hidden = (float(u(0.006, 0.01)), int(rng.integers(-5, 6)))
    case = QLstmCase(batch, input_size, num_units, output_size, in_scale, int(rng.integers(-10, 11)), st_scale,
                     -hidden[1] if not projection else int(rng.integers(-5, 6)), 2.0 ** cell_scale_log2,
                     cell_clip=cell_clip, proj_clip=proj_clip)
    gate_scales = [float(2.0 ** -10 * u(0.5, 2.0)) for _ in range(4)]
    case.intermediates = [(s, 0) for s in gate_scales] + [hidden]
    t, s = case.tensors, case.scales

    def int8(name, shape, real_max):
        t[name] = rng.integers(-127, 128, shape).astype(np.int8)
        s[name] = real_max / 127.0

    def int16(name, shape, real_max, low=-32767):
        t[name] = rng.integers(low, 32768, shape).astype(np.int16)
        s[name] = real_max / 32767.0

    for g in GATES:
        if g == "i" and cifg:
            continue
        int8(g + "x", (num_units, input_size), float(u(0.3, 0.6)))
        int8(g + "h", (num_units, output_size), float(u(0.3, 0.6)))
        if layer_norm:
            int16("l" + g, (num_units,), float(u(1.0, 1.5)), low=16000)
            bias_scale = s["l" + g] / 1024.0
        else:
            bias_scale = in_scale * s[g + "x"]
        s["b" + g] = bias_scale
        t["b" + g] = np.round(rng.uniform(-0.5, 0.5, num_units) / bias_scale).astype(np.int32)
        if peephole and g != "c":
            int16("p" + g, (num_units,), float(u(0.2, 0.5)))
    if projection:
        int8("proj", (output_size, num_units), float(u(0.3, 0.6)))
        if projection_bias:
            s["proj_b"] = hidden[0] * s["proj"]
            t["proj_b"] = np.round(rng.uniform(-0.2, 0.2, output_size) / s["proj_b"]).astype(np.int32)
    return case


@dataclass(frozen=True)
class TfLiteLstm:
    model: bytes
    input: int
    output_state: int
    cell_state: int
    output: int


#: TFLite's LSTM input positions of the named tensors (NNAPI's QUANTIZED_LSTM uses the same ones).
POSITIONS = {"ix": 1, "fx": 2, "cx": 3, "ox": 4, "ih": 5, "fh": 6, "ch": 7, "oh": 8, "pi": 9, "pf": 10, "po": 11,
             "bi": 12, "bf": 13, "bc": 14, "bo": 15, "proj": 16, "proj_b": 17, "li": 20, "lf": 21, "lc": 22,
             "lo": 23}


def tflite_model(case: QLstmCase, steps: int | None = None, time_major: bool = False) -> TfLiteLstm:
    """The LSTM builtin; with ``steps``, UNIDIRECTIONAL_SEQUENCE_LSTM over that many time steps
    (input [batch, steps, input_size], or [steps, batch, input_size] when ``time_major``)."""
    b = TfLiteModelBuilder()
    n, units, out = case.batch, case.num_units, case.output_size

    def sequence(size: int) -> list[int]:
        return [n, size] if steps is None else [steps, n, size] if time_major else [n, steps, size]

    x = b.add_input("input", sequence(case.input_size), np.int8, scale=case.input_scale, zero_point=case.input_zp)
    inputs = [x] + [-1] * 23
    for name, pos in POSITIONS.items():
        if name in case.tensors:
            inputs[pos] = b.add_constant(name, case.tensors[name], scale=case.scales[name], zero_point=0)
    inputs[18] = b.add_tensor("output_state", [n, out], np.int8, scale=case.state_scale, zero_point=case.state_zp,
                              is_variable=True)
    inputs[19] = b.add_tensor("cell_state", [n, units], np.int16, scale=case.cell_scale, zero_point=0,
                              is_variable=True)
    inter = [b.add_tensor(f"intermediate_{k}", [n, units], np.int16 if k < 4 else np.int8, scale=sc, zero_point=zp)
             for k, (sc, zp) in enumerate(case.intermediates)]
    y = b.add_tensor("output", sequence(out), np.int8, scale=case.state_scale, zero_point=case.state_zp)
    options = {"fused_activation_function": TANH, "cell_clip": case.cell_clip, "proj_clip": case.proj_clip}
    if steps is None:
        b.add_operator("LSTM", inputs, [y], ("LSTMOptions", options), version=LSTM_VERSION, intermediates=inter)
    else:
        b.add_operator("UNIDIRECTIONAL_SEQUENCE_LSTM", inputs, [y],
                       ("UnidirectionalSequenceLSTMOptions", {**options, "time_major": time_major}),
                       intermediates=inter)
    b.set_outputs([y])
    return TfLiteLstm(b.build(), x, inputs[18], inputs[19], y)


def run_tflite(case: QLstmCase, xs: list[np.ndarray], h0: np.ndarray, c0: np.ndarray,
               model: TfLiteLstm | None = None) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """(output, output state, cell state) after each step, in TFLite's reference kernels; the
    states start at h0, c0 and carry over between steps (the LSTM's variable tensors)."""
    model = model or tflite_model(case)
    it = Interpreter(model_content=model.model, experimental_op_resolver_type=OpResolverType.BUILTIN_REF)
    it.allocate_tensors()
    it.set_tensor(model.output_state, h0.astype(np.int8))
    it.set_tensor(model.cell_state, c0.astype(np.int16))
    steps = []
    for x in xs:
        it.set_tensor(model.input, x.astype(np.int8))
        it.invoke()
        steps.append((it.get_tensor(model.output).copy(), it.get_tensor(model.output_state).copy(),
                      it.get_tensor(model.cell_state).copy()))
    return steps
