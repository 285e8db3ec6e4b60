"""The support table never lies: registry vs OperationType, and every listed entry is tested."""
import importlib
import json
import pkgutil
import subprocess
import sys

import tests.ops
from hal.registry import lookup, registrations
from hal.types import LAST_NNAPI_1_3_OPERATION, OperandType, OperationType
from nnhal.ops_table import ops_matrix

#: Operations nnhal does not execute yet (getSupportedOperations answers False for them).
NOT_YET = {
    "EMBEDDING_LOOKUP", "FLOOR", "HASHTABLE_LOOKUP", "L2_NORMALIZATION",
    "LOCAL_RESPONSE_NORMALIZATION", "LSH_PROJECTION", "LSTM", "RNN", "SVDF", "BATCH_TO_SPACE_ND",
    "SPACE_TO_BATCH_ND", "ABS", "ARGMAX", "ARGMIN", "AXIS_ALIGNED_BBOX_TRANSFORM",
    "BIDIRECTIONAL_SEQUENCE_LSTM", "BIDIRECTIONAL_SEQUENCE_RNN", "BOX_WITH_NMS_LIMIT",
    "CHANNEL_SHUFFLE", "DETECTION_POSTPROCESSING", "EQUAL", "EXP", "EXPAND_DIMS", "GATHER",
    "GENERATE_PROPOSALS", "GREATER", "GREATER_EQUAL", "GROUPED_CONV_2D", "HEATMAP_MAX_KEYPOINT",
    "INSTANCE_NORMALIZATION", "LESS", "LESS_EQUAL", "LOG", "LOGICAL_AND", "LOGICAL_NOT",
    "LOGICAL_OR", "LOG_SOFTMAX", "NEG", "NOT_EQUAL", "PAD_V2", "POW", "QUANTIZED_16BIT_LSTM",
    "RANDOM_MULTINOMIAL", "REDUCE_ALL", "REDUCE_ANY", "REDUCE_MAX", "REDUCE_MIN", "REDUCE_PROD",
    "REDUCE_SUM", "ROI_ALIGN", "ROI_POOLING", "RSQRT", "SELECT", "SIN", "SLICE", "SPLIT", "SQRT",
    "TILE", "TOPK_V2", "TRANSPOSE_CONV_2D", "UNIDIRECTIONAL_SEQUENCE_LSTM",
    "UNIDIRECTIONAL_SEQUENCE_RNN", "QUANTIZED_LSTM", "IF", "WHILE", "ELU", "FILL", "RANK",
    "BATCH_MATMUL", "PACK", "MIRROR_PAD", "REVERSE",
}


def test_nnapi_codes():
    assert LAST_NNAPI_1_3_OPERATION == OperationType.RANK == 101
    assert len([t for t in OperationType if t <= LAST_NNAPI_1_3_OPERATION]) == 102
    assert OperationType.REVERSE == 105
    assert OperandType.TENSOR_QUANT8_ASYMM_SIGNED == 14 and OperandType.SUBGRAPH == 15


def test_every_operation_registered_or_listed_not_yet():
    for t in OperationType:
        registered = lookup(t) is not None
        assert registered != (t.name in NOT_YET), (
            f"{t.name}: {'registered and also' if registered else 'neither registered nor'} "
            f"listed in NOT_YET")


def _covered() -> set[tuple[str, str]]:
    covered = set()
    for info in pkgutil.iter_modules(tests.ops.__path__):
        mod = importlib.import_module(f"tests.ops.{info.name}")
        for op, t in getattr(mod, "COVERED", ()):
            covered.add((OperationType(op).name, OperandType(t).name))
    return covered


def test_every_supported_combination_is_tested_against_tflite():
    listed = {(r["operation"], r["operand_type"]) for r in ops_matrix()}
    missing = listed - _covered()
    assert not missing, f"listed by `nnhal ops` but not declared COVERED by a test: {sorted(missing)}"


def test_registrations_name_their_types():
    for r in registrations():
        assert r.input_types, f"{r.name} registers no operand types"


def test_ops_json_cli():
    out = subprocess.run([sys.executable, "-m", "nnhal.cli", "ops", "--json"], check=True,
                         capture_output=True, text=True).stdout
    rows = json.loads(out)
    assert rows == ops_matrix()
    for r in rows:
        assert set(r) == {"operation", "code", "operand_type"}
        assert OperationType[r["operation"]] == r["code"]
        assert r["operand_type"] in OperandType.__members__
    assert {"operation": "ADD", "code": 0, "operand_type": "TENSOR_QUANT8_ASYMM"} in rows


def test_ops_table_cli():
    out = subprocess.run([sys.executable, "-m", "nnhal.cli", "ops"], check=True,
                         capture_output=True, text=True).stdout
    assert "ADD" in out and "(operation, type) combinations" in out
