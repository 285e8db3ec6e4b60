"""A keyword-spotting model of the LSTM kind (Zhang et al., "Hello Edge", 2017: an LSTM over the
MFCC frames of one second of audio, a classifier on its last output), built with seeded weights:

    mfcc [1, 49, 10] -> UNIDIRECTIONAL_SEQUENCE_LSTM (64 units, projection to 32, batch-major)
      -> STRIDED_SLICE (the last time step, [1, 32]) -> FULLY_CONNECTED (12) -> SOFTMAX

12 classes: silence, unknown and the ten words of the Speech Commands task. The LSTM's states are
variable tensors, as the TFLite converter leaves them: a stream of one-second windows carries them
from one invoke to the next unless reset_all_variables() is called.
"""
from __future__ import annotations

import numpy as np

from delegate.tfl.builder import TfLiteModelBuilder
from tests.delegate.lstm_models import Cell, add_unidirectional

FRAMES, FEATURES, CLASSES = 49, 10, 12
CELL = Cell(num_units=64, projection=32, projection_bias=True)


def kws_model(seed: int = 2017, cell: Cell = CELL) -> bytes:
    rng = np.random.default_rng(seed)
    b = TfLiteModelBuilder(description="kws-lstm")
    x = b.add_input("mfcc", [1, FRAMES, FEATURES])
    seq = add_unidirectional(b, rng, x, cell, time=FRAMES, batch=1, input_size=FEATURES, time_major=False,
                             cell_clip=10.0, proj_clip=5.0, name="lstm/")
    out = cell.output_size
    last = b.add_tensor("last_step", [1, out])
    begin, end, strides = (b.add_constant(f"slice/{k}", np.array(v, np.int32)) for k, v in (
        ("begin", [0, FRAMES - 1, 0]), ("end", [1, FRAMES, out]), ("strides", [1, 1, 1])))
    b.add_operator("STRIDED_SLICE", [seq, begin, end, strides], [last],
                   ("StridedSliceOptions", {"shrink_axis_mask": 0b010}))
    w = b.add_constant("fc/w", rng.uniform(-0.4, 0.4, (CLASSES, out)).astype(np.float32))
    bias = b.add_constant("fc/b", rng.uniform(-0.1, 0.1, CLASSES).astype(np.float32))
    logits = b.add_tensor("logits", [1, CLASSES])
    b.add_operator("FULLY_CONNECTED", [last, w, bias], [logits], ("FullyConnectedOptions", {}))
    probs = b.add_tensor("probs", [1, CLASSES])
    b.add_operator("SOFTMAX", [logits], [probs], ("SoftmaxOptions", {"beta": 1.0}))
    b.set_outputs([probs])
    return b.build()


def mfcc_like(rng: np.random.Generator, windows: int = 1) -> list[np.ndarray]:
    """MFCC-shaped features: a large first coefficient, decaying higher ones, slowly varying in time."""
    scale = np.float32(1.0) / (1 + np.arange(FEATURES, dtype=np.float32))
    out = []
    for _ in range(windows):
        walk = np.cumsum(rng.normal(0, 0.3, (FRAMES, FEATURES)), axis=0)
        out.append((walk * scale * 4).astype(np.float32)[None])
    return out
