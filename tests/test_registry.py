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
NOT_YET: set[str] = set()  # issue 16 added the last ones (sequence models, detection, control flow)


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


def test_every_supported_combination_is_tested_against_tflite_or_cts():
    """A combination is tested by a one-op TFLite test (COVERED in tests/ops) or by CTS vectors,
    which tests/cts/ requires to pass for everything `nnhal ops` claims."""
    from tests.cts.test_cts import cts_combinations
    listed = {(r["operation"], r["operand_type"]) for r in ops_matrix()}
    missing = listed - _covered() - cts_combinations()
    assert not missing, f"listed by `nnhal ops`, neither COVERED by a TFLite test nor in CTS: {sorted(missing)}"


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
