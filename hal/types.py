"""NNAPI enums with the numeric values of the NNAPI NDK / AIDL HAL.

Values are part of the wire format (service proto, cache files), so they are
the real NNAPI codes, never renumbered.
"""
from __future__ import annotations

import enum

import numpy as np


class OperandType(enum.IntEnum):
    FLOAT32 = 0
    INT32 = 1
    UINT32 = 2
    TENSOR_FLOAT32 = 3
    TENSOR_INT32 = 4
    TENSOR_QUANT8_ASYMM = 5
    BOOL = 6
    TENSOR_QUANT16_SYMM = 7
    TENSOR_FLOAT16 = 8
    TENSOR_BOOL8 = 9
    FLOAT16 = 10
    TENSOR_QUANT8_SYMM_PER_CHANNEL = 11
    TENSOR_QUANT16_ASYMM = 12
    TENSOR_QUANT8_SYMM = 13
    TENSOR_QUANT8_ASYMM_SIGNED = 14
    SUBGRAPH = 15


class OperationType(enum.IntEnum):
    ADD = 0
    AVERAGE_POOL_2D = 1
    CONCATENATION = 2
    CONV_2D = 3
    DEPTHWISE_CONV_2D = 4
    DEPTH_TO_SPACE = 5
    DEQUANTIZE = 6
    EMBEDDING_LOOKUP = 7
    FLOOR = 8
    FULLY_CONNECTED = 9
    HASHTABLE_LOOKUP = 10
    L2_NORMALIZATION = 11
    L2_POOL_2D = 12
    LOCAL_RESPONSE_NORMALIZATION = 13
    LOGISTIC = 14
    LSH_PROJECTION = 15
    LSTM = 16
    MAX_POOL_2D = 17
    MUL = 18
    RELU = 19
    RELU1 = 20
    RELU6 = 21
    RESHAPE = 22
    RESIZE_BILINEAR = 23
    RNN = 24
    SOFTMAX = 25
    SPACE_TO_DEPTH = 26
    SVDF = 27
    TANH = 28
    BATCH_TO_SPACE_ND = 29
    DIV = 30
    MEAN = 31
    PAD = 32
    SPACE_TO_BATCH_ND = 33
    SQUEEZE = 34
    STRIDED_SLICE = 35
    SUB = 36
    TRANSPOSE = 37
    ABS = 38
    ARGMAX = 39
    ARGMIN = 40
    AXIS_ALIGNED_BBOX_TRANSFORM = 41
    BIDIRECTIONAL_SEQUENCE_LSTM = 42
    BIDIRECTIONAL_SEQUENCE_RNN = 43
    BOX_WITH_NMS_LIMIT = 44
    CAST = 45
    CHANNEL_SHUFFLE = 46
    DETECTION_POSTPROCESSING = 47
    EQUAL = 48
    EXP = 49
    EXPAND_DIMS = 50
    GATHER = 51
    GENERATE_PROPOSALS = 52
    GREATER = 53
    GREATER_EQUAL = 54
    GROUPED_CONV_2D = 55
    HEATMAP_MAX_KEYPOINT = 56
    INSTANCE_NORMALIZATION = 57
    LESS = 58
    LESS_EQUAL = 59
    LOG = 60
    LOGICAL_AND = 61
    LOGICAL_NOT = 62
    LOGICAL_OR = 63
    LOG_SOFTMAX = 64
    MAXIMUM = 65
    MINIMUM = 66
    NEG = 67
    NOT_EQUAL = 68
    PAD_V2 = 69
    POW = 70
    PRELU = 71
    QUANTIZE = 72
    QUANTIZED_16BIT_LSTM = 73
    RANDOM_MULTINOMIAL = 74
    REDUCE_ALL = 75
    REDUCE_ANY = 76
    REDUCE_MAX = 77
    REDUCE_MIN = 78
    REDUCE_PROD = 79
    REDUCE_SUM = 80
    ROI_ALIGN = 81
    ROI_POOLING = 82
    RSQRT = 83
    SELECT = 84
    SIN = 85
    SLICE = 86
    SPLIT = 87
    SQRT = 88
    TILE = 89
    TOPK_V2 = 90
    TRANSPOSE_CONV_2D = 91
    UNIDIRECTIONAL_SEQUENCE_LSTM = 92
    UNIDIRECTIONAL_SEQUENCE_RNN = 93
    RESIZE_NEAREST_NEIGHBOR = 94
    QUANTIZED_LSTM = 95
    IF = 96
    WHILE = 97
    ELU = 98
    HARD_SWISH = 99
    FILL = 100
    RANK = 101
    # Feature levels 6-7 (Android 12+, NNAPI updatable runtime).
    BATCH_MATMUL = 102
    PACK = 103
    MIRROR_PAD = 104
    REVERSE = 105


#: The last operation type defined by NNAPI 1.3 (feature level 4).
LAST_NNAPI_1_3_OPERATION = OperationType.RANK

#: ANEURALNETWORKS_OEM_OPERATION (deprecated in Android 11, still valid in NNAPI 1.3 models): an
#: opaque vendor operation with no defined semantics. Valid, never supported by this driver (AOSP's
#: validation accepts it unchecked; drivers answer getSupportedOperations false), so it stays out
#: of OperationType, whose members are the operations nnhal implements.
OEM_OPERATION = 10000


class FeatureLevel(enum.IntEnum):
    """NNAPI feature levels (ANEURALNETWORKS_FEATURE_LEVEL_*): 1-4 are NNAPI 1.0-1.3 (Android 8.1-11),
    5-7 the updatable runtime's levels (Android 12+). An operation or operand type exists from one on."""

    FL1 = 1  # NNAPI 1.0
    FL2 = 2  # NNAPI 1.1
    FL3 = 3  # NNAPI 1.2
    FL4 = 4  # NNAPI 1.3
    FL5 = 5
    FL6 = 6
    FL7 = 7


class ErrorStatus(enum.IntEnum):
    NONE = 0
    DEVICE_UNAVAILABLE = 1
    GENERAL_FAILURE = 2
    OUTPUT_INSUFFICIENT_SIZE = 3
    INVALID_ARGUMENT = 4
    MISSED_DEADLINE_TRANSIENT = 5
    MISSED_DEADLINE_PERSISTENT = 6
    RESOURCE_EXHAUSTED_TRANSIENT = 7
    RESOURCE_EXHAUSTED_PERSISTENT = 8


class ExecutionPreference(enum.IntEnum):
    LOW_POWER = 0
    FAST_SINGLE_ANSWER = 1
    SUSTAINED_SPEED = 2


class Priority(enum.IntEnum):
    """AIDL HAL priority (the NDK spells these 90/100/110)."""

    LOW = 0
    MEDIUM = 1
    HIGH = 2


class FusedActivationFunc(enum.IntEnum):
    NONE = 0
    RELU = 1
    RELU1 = 2
    RELU6 = 3


class PaddingScheme(enum.IntEnum):
    """Implicit padding codes (ANEURALNETWORKS_PADDING_*)."""

    SAME = 1
    VALID = 2


class OperandLifeTime(enum.IntEnum):
    TEMPORARY_VARIABLE = 0
    SUBGRAPH_INPUT = 1
    SUBGRAPH_OUTPUT = 2
    CONSTANT_COPY = 3
    CONSTANT_POOL = 4
    NO_VALUE = 5
    SUBGRAPH = 6
    POINTER = 7


class DeviceType(enum.IntEnum):
    OTHER = 1
    CPU = 2
    GPU = 3
    ACCELERATOR = 4


class MeasureTiming(enum.IntEnum):
    NO = 0
    YES = 1


# --- Extension types -------------------------------------------------------
#: Extension operand/operation codes are ``(prefix << 16) | type_within_extension``.
EXTENSION_TYPE_LOW_BITS = 16
EXTENSION_TYPE_MASK = (1 << EXTENSION_TYPE_LOW_BITS) - 1


def encode_extension_type(prefix: int, type_within_extension: int) -> int:
    if not 0 < prefix < (1 << 15):
        raise ValueError(f"extension prefix must be in [1, 32767], got {prefix}")
    if not 0 <= type_within_extension <= EXTENSION_TYPE_MASK:
        raise ValueError(f"type within extension must fit 16 bits, got {type_within_extension}")
    return (prefix << EXTENSION_TYPE_LOW_BITS) | type_within_extension


def decode_extension_type(code: int) -> tuple[int, int]:
    """Split an encoded type into (prefix, type_within_extension); prefix 0 = not an extension."""
    return code >> EXTENSION_TYPE_LOW_BITS, code & EXTENSION_TYPE_MASK


def is_extension_type(code: int) -> bool:
    return code >> EXTENSION_TYPE_LOW_BITS != 0


# --- Operand type facts ----------------------------------------------------
SCALAR_TYPES = frozenset({
    OperandType.FLOAT32, OperandType.INT32, OperandType.UINT32, OperandType.BOOL,
    OperandType.FLOAT16, OperandType.SUBGRAPH,
})

#: numpy dtype of each non-extension operand type's element.
NUMPY_DTYPE: dict[OperandType, np.dtype] = {
    OperandType.FLOAT32: np.dtype(np.float32),
    OperandType.INT32: np.dtype(np.int32),
    OperandType.UINT32: np.dtype(np.uint32),
    OperandType.TENSOR_FLOAT32: np.dtype(np.float32),
    OperandType.TENSOR_INT32: np.dtype(np.int32),
    OperandType.TENSOR_QUANT8_ASYMM: np.dtype(np.uint8),
    OperandType.BOOL: np.dtype(np.bool_),
    OperandType.TENSOR_QUANT16_SYMM: np.dtype(np.int16),
    OperandType.TENSOR_FLOAT16: np.dtype(np.float16),
    OperandType.TENSOR_BOOL8: np.dtype(np.bool_),
    OperandType.FLOAT16: np.dtype(np.float16),
    OperandType.TENSOR_QUANT8_SYMM_PER_CHANNEL: np.dtype(np.int8),
    OperandType.TENSOR_QUANT16_ASYMM: np.dtype(np.uint16),
    OperandType.TENSOR_QUANT8_SYMM: np.dtype(np.int8),
    OperandType.TENSOR_QUANT8_ASYMM_SIGNED: np.dtype(np.int8),
}

QUANT8_TYPES = frozenset({OperandType.TENSOR_QUANT8_ASYMM, OperandType.TENSOR_QUANT8_ASYMM_SIGNED})


def is_scalar_type(t: int) -> bool:
    return t in SCALAR_TYPES


def element_size(t: OperandType) -> int:
    return NUMPY_DTYPE[t].itemsize


def type_name(code: int) -> str:
    """Human name of an operand type code, also for extension and unknown codes."""
    try:
        return OperandType(code).name
    except ValueError:
        if is_extension_type(code):
            p, t = decode_extension_type(code)
            return f"EXTENSION(prefix={p}, type={t})"
        return f"UNKNOWN_OPERAND_TYPE({code})"


def operation_name(code: int) -> str:
    if code == OEM_OPERATION:
        return "OEM_OPERATION"
    try:
        return OperationType(code).name
    except ValueError:
        if is_extension_type(code):
            p, t = decode_extension_type(code)
            return f"EXTENSION(prefix={p}, type={t})"
        return f"UNKNOWN_OPERATION({code})"
