"""Float TFLite LSTM models built by hand (TfLiteModelBuilder): LSTM (one step),
UNIDIRECTIONAL_SEQUENCE_LSTM and BIDIRECTIONAL_SEQUENCE_LSTM with every cell option (CIFG,
peephole, projection with or without bias, layer norm, clips), their states as variable tensors.
Weights are seeded: a failure replays."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from delegate.tfl.builder import TfLiteModelBuilder

GATES = "ifco"  # TFLite's (and NNAPI's) order: input, forget, cell, output
TANH = 4  # ActivationFunctionType.TANH, the cell activation of every converted LSTM


@dataclass(frozen=True)
class Cell:
    """One LSTM cell's options and sizes (output_size: num_units unless projected)."""

    num_units: int = 6
    cifg: bool = False
    peephole: bool = False
    projection: int = 0  # output_size when > 0
    projection_bias: bool = False
    layer_norm: bool = False
    diagonal: bool = False  # 1-D recurrent weights (TFLite's diagonal_recurrent_tensors): not mappable
    hybrid: bool = False  # int8 weights with float activations (TFLite's hybrid kernel): not mappable

    @property
    def output_size(self) -> int:
        return self.projection or self.num_units


def add_cell(b: TfLiteModelBuilder, rng: np.random.Generator, cell: Cell, input_size: int, name: str = "",
             aux_size: int = 0) -> dict[str, list[int]]:
    """The cell's constant tensors, as TFLite input lists (-1: absent): ``weights`` are inputs 1-17,
    ``layer_norm`` 20-23, ``aux`` the BIDIRECTIONAL op's aux weights (when ``aux_size``)."""
    units, out = cell.num_units, cell.output_size

    def const(tag, shape, low=-0.5, high=0.5):
        w = rng.uniform(low, high, shape).astype(np.float32)
        if cell.hybrid and tag[0] not in "bl" and tag != "proj_b":  # weights, not biases or layer norm
            return b.add_constant(name + tag, np.round(w * 254).astype(np.int8), scale=1 / 254, zero_point=0)
        return b.add_constant(name + tag, w)

    skip = lambda g: g == "i" and cell.cifg  # noqa: E731 - no input gate with CIFG
    ix = [-1 if skip(g) else const(f"{g}x", (units, input_size)) for g in GATES]
    ih = [-1 if skip(g) else const(f"{g}h", (units,) if cell.diagonal else (units, out)) for g in GATES]
    peep = [-1 if not cell.peephole or skip(g) else const(f"p{g}", (units,)) for g in "ifo"]
    bias = [-1 if skip(g) else const(f"b{g}", (units,), -0.2, 0.2) for g in GATES]
    proj = [const("proj", (out, units)) if cell.projection else -1,
            const("proj_b", (out,), -0.1, 0.1) if cell.projection and cell.projection_bias else -1]
    norm = [-1 if not cell.layer_norm or skip(g) else const(f"l{g}", (units,), 0.5, 1.5) for g in GATES]
    aux = [-1 if not aux_size or skip(g) else const(f"a{g}", (units, aux_size)) for g in GATES]
    return {"weights": ix + ih + peep + bias + proj, "layer_norm": norm, "aux": aux}


def add_states(b: TfLiteModelBuilder, cell: Cell, batch: int, name: str = "") -> list[int]:
    """The output and cell state: variable tensors, zero at the start and after reset_all_variables."""
    return [b.add_tensor(name + "output_state", [batch, cell.output_size], is_variable=True),
            b.add_tensor(name + "cell_state", [batch, cell.num_units], is_variable=True)]


def _options(cell_clip: float, proj_clip: float, **more) -> dict:
    return {"fused_activation_function": TANH, "cell_clip": cell_clip, "proj_clip": proj_clip, **more}


def lstm_model(cell: Cell, *, batch: int = 2, input_size: int = 5, cell_clip: float = 0.0, proj_clip: float = 0.0,
               seed: int = 0, inputs: int = 24) -> bytes:
    """One LSTM step: x [batch, input_size] -> output [batch, output_size]."""
    b, rng = TfLiteModelBuilder(), np.random.default_rng(seed)
    x = b.add_input("x", [batch, input_size])
    t = add_cell(b, rng, cell, input_size)
    y = b.add_tensor("y", [batch, cell.output_size])
    ins = [x, *t["weights"], *add_states(b, cell, batch), *t["layer_norm"]][:inputs]
    b.add_operator("LSTM", ins, [y], ("LSTMOptions", _options(cell_clip, proj_clip)))
    b.set_outputs([y])
    return b.build()


def sequence_shape(time: int, batch: int, size: int, time_major: bool) -> list[int]:
    return [time, batch, size] if time_major else [batch, time, size]


def add_unidirectional(b: TfLiteModelBuilder, rng: np.random.Generator, x: int, cell: Cell, *, time: int,
                       batch: int, input_size: int, time_major: bool = False, cell_clip: float = 0.0,
                       proj_clip: float = 0.0, name: str = "", diagonal_option: bool = False) -> int:
    """A UNIDIRECTIONAL_SEQUENCE_LSTM reading ``x``; returns its output tensor."""
    t = add_cell(b, rng, cell, input_size, name)
    y = b.add_tensor(name + "y", sequence_shape(time, batch, cell.output_size, time_major))
    options = _options(cell_clip, proj_clip, time_major=time_major)
    if diagonal_option:
        options["diagonal_recurrent_tensors"] = True
    b.add_operator("UNIDIRECTIONAL_SEQUENCE_LSTM", [x, *t["weights"], *add_states(b, cell, batch, name),
                                                    *t["layer_norm"]],
                   [y], ("UnidirectionalSequenceLSTMOptions", options))
    return y


def unidirectional_model(cell: Cell, *, time: int = 4, batch: int = 2, input_size: int = 5,
                         time_major: bool = False, seed: int = 0, **kw) -> bytes:
    b, rng = TfLiteModelBuilder(), np.random.default_rng(seed)
    x = b.add_input("x", sequence_shape(time, batch, input_size, time_major))
    y = add_unidirectional(b, rng, x, cell, time=time, batch=batch, input_size=input_size, time_major=time_major,
                           **kw)
    b.set_outputs([y])
    return b.build()


def bidirectional_model(fw: Cell, bw: Cell, *, time: int = 4, batch: int = 2, input_size: int = 5,
                        time_major: bool = True, merge_outputs: bool = False, aux: str = "",
                        aux_size: int = 3, cell_clip: float = 0.0, proj_clip: float = 0.0, seed: int = 0) -> bytes:
    """A BIDIRECTIONAL_SEQUENCE_LSTM. ``aux``: "" none; "cross": an aux input and aux weights in
    both cells (each adds aux_input times its aux weights); "parallel": an aux input alone (the
    backward cell reads it instead of x). TFLite's kernel checks both cells against the forward
    cell's sizes, and the backward input weights against x's size even when it reads aux_input: the
    cells' sizes must agree, and a parallel aux input is as wide as x."""
    if aux == "parallel":
        aux_size = input_size
    b, rng = TfLiteModelBuilder(), np.random.default_rng(seed)
    x = b.add_input("x", sequence_shape(time, batch, input_size, time_major))
    a = b.add_input("aux", sequence_shape(time, batch, aux_size, time_major)) if aux else -1
    cross = aux_size if aux == "cross" else 0
    f = add_cell(b, rng, fw, input_size, "fw_", cross)
    g = add_cell(b, rng, bw, input_size, "bw_", cross)
    states = add_states(b, fw, batch, "fw_") + add_states(b, bw, batch, "bw_")
    if merge_outputs:
        outs = [b.add_tensor("y", sequence_shape(time, batch, fw.output_size + bw.output_size, time_major))]
    else:
        outs = [b.add_tensor("fw_y", sequence_shape(time, batch, fw.output_size, time_major)),
                b.add_tensor("bw_y", sequence_shape(time, batch, bw.output_size, time_major))]
    ins = [x, *f["weights"], *g["weights"], *states, a, *f["aux"], *g["aux"]]
    b.add_operator("BIDIRECTIONAL_SEQUENCE_LSTM", ins, outs,
                   ("BidirectionalSequenceLSTMOptions",
                    _options(cell_clip, proj_clip, merge_outputs=merge_outputs, time_major=time_major)))
    b.set_outputs(outs)
    return b.build()
