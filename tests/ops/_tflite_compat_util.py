"""Shared by the tests of nnhal's com.nnhal.tflite operations (QUANTIZED_MEAN, REQUANTIZE,
RELU_REQUANTIZED): what a TFLite model maps to, and 8-bit inputs and quantizations to draw."""
import numpy as np
from hypothesis import strategies as st

from delegate.mapping import convert_partition
from delegate.tfl import read_model


def operation_types(model: bytes) -> list[int]:
    """The NNAPI operation codes the whole TFLite model maps to."""
    return [op.type for op in convert_partition(read_model(model)).model.main.operations]


def is_compat_operation(code: int, type_within: int) -> bool:
    """An extension operation code whose type within its extension is ``type_within``."""
    return code >> 16 != 0 and code & 0xFFFF == type_within


def every_value(dtype, shape=(2, 128)) -> np.ndarray:
    """Every value of an 8-bit type, once."""
    info = np.iinfo(dtype)
    return np.arange(info.min, info.max + 1).astype(dtype).reshape(shape)


@st.composite
def quant(draw, dtype, scale=None) -> dict:
    """A float32-representable power-of-two-ish scale (unless given) and any zero point of ``dtype``."""
    info = np.iinfo(dtype)
    if scale is None:
        scale = float(np.float32(2.0 ** draw(st.floats(-12, 4))))
    return {"scale": scale, "zero_point": draw(st.integers(int(info.min), int(info.max)))}
