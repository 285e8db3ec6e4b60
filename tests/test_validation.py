"""Every validateModel rule: a model that breaks it, and the message naming the culprit.

Built on a valid two-ADD model (operands: 0 a, 1 b, 2 act, 3 t, 4 c (const), 5 act, 6 y);
each case mutates one thing. Plus a fuzzer: random corruptions give a HalError or a model
that compiles, never another exception.
"""
from __future__ import annotations

import copy

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from hal import extension_registry
from hal.compiler import compile_model
from hal.errors import HalError
from hal.executor import execute
from hal.extension_registry import ExtensionOperandType, ExtensionTypes
from hal.model import (
    DataLocation,
    ExtensionNameAndPrefix,
    Model,
    ModelBuilder,
    Operand,
    Subgraph,
    SymmPerChannelQuantParams,
)
from hal.support import supported_operations
from hal.types import ErrorStatus, OperandLifeTime, OperandType, OperationType, encode_extension_type
from hal.validation import validate_model
from tests.service.models import unimplemented_operation

LT = OperandLifeTime


def base_model():
    b = ModelBuilder()
    a = b.add_operand(OperandType.TENSOR_FLOAT32, (2, 3))
    x = b.add_operand(OperandType.TENSOR_FLOAT32, (2, 3))
    act = b.add_int32(0)
    t = b.add_operand(OperandType.TENSOR_FLOAT32, (2, 3))
    b.add_operation(OperationType.ADD, [a, x, act], [t])
    c = b.add_constant(OperandType.TENSOR_FLOAT32, np.ones((2, 3), np.float32))
    act2 = b.add_int32(1)
    y = b.add_operand(OperandType.TENSOR_FLOAT32, (2, 3))
    b.add_operation(OperationType.ADD, [t, c, act2], [y])
    b.identify_inputs_and_outputs([a, x], [y])
    return b.finish()


def op(m, i):
    return m.main.operands[i]


def _setattr(obj, **kw):
    for k, v in kw.items():
        setattr(obj, k, v)


CASES = {
    # operand types, ranks, sizes
    "unknown operand type": (lambda m: _setattr(op(m, 0), type=77), "operand 0: unknown operand type 77"),
    "non-integer type": (lambda m: _setattr(op(m, 0), type="x"), "operand type must be an integer"),
    "negative dimension": (lambda m: _setattr(op(m, 0), dimensions=(2, -1)), "dimensions must be non-negative"),
    "non-integer dimension": (lambda m: _setattr(op(m, 0), dimensions=(2.0, 3)),
                              "dimensions must be non-negative integers, got [2.0, 3]"),
    "rank over limit": (lambda m: _setattr(op(m, 0), dimensions=(1,) * 9), "rank 9 exceeds the maximum of 8"),
    "scalar with dims": (lambda m: _setattr(op(m, 2), dimensions=(1,)), "a scalar must have no dimensions"),
    "oversized operand": (lambda m: _setattr(op(m, 0), dimensions=(1 << 20, 1 << 20)), "over the"),
    "non-finite scale": (lambda m: _setattr(op(m, 0), scale=float("nan")), "scale must be finite"),
    "float with scale": (lambda m: _setattr(op(m, 0), scale=0.5), "scale and zero_point must be 0"),
    "int32 with zero point": (lambda m: _setattr(op(m, 0), type=OperandType.TENSOR_INT32, zero_point=3),
                              "TENSOR_INT32): scale must be >= 0 and zero_point 0"),
    "quant8 scale zero": (lambda m: _setattr(op(m, 0), type=OperandType.TENSOR_QUANT8_ASYMM, scale=0.0),
                          "scale must be > 0"),
    "quant8 zero point range": (lambda m: _setattr(op(m, 0), type=OperandType.TENSOR_QUANT8_ASYMM, scale=0.1,
                                                   zero_point=256), "zero_point must be in [0, 255], got 256"),
    "quant16 zero point range": (lambda m: _setattr(op(m, 0), type=OperandType.TENSOR_QUANT16_ASYMM, scale=0.1,
                                                    zero_point=65536), "zero_point must be in [0, 65535], got 65536"),
    "quant8 negative scale": (lambda m: _setattr(op(m, 0), type=OperandType.TENSOR_QUANT8_ASYMM_SIGNED, scale=-0.5),
                              "scale must be > 0, got -0.5"),
    "scalar with scale": (lambda m: _setattr(op(m, 2), scale=1.0), "INT32): scale and zero_point must be 0"),
    "signed zero point range": (lambda m: _setattr(op(m, 0), type=OperandType.TENSOR_QUANT8_ASYMM_SIGNED,
                                                   scale=0.1, zero_point=-129), "zero_point must be in [-128, 127]"),
    "symm with zero point": (lambda m: _setattr(op(m, 0), type=OperandType.TENSOR_QUANT8_SYMM, scale=0.1,
                                                zero_point=1), "zero_point must be in [0, 0]"),
    "per-channel missing params": (lambda m: _setattr(op(m, 0), type=OperandType.TENSOR_QUANT8_SYMM_PER_CHANNEL),
                                   "missing per-channel quantization parameters"),
    "per-channel bad dim": (lambda m: _setattr(op(m, 0), type=OperandType.TENSOR_QUANT8_SYMM_PER_CHANNEL,
                                               channel_quant=SymmPerChannelQuantParams((0.1, 0.1), 5)),
                            "channel_dim 5 out of range for rank 2"),
    "per-channel scale count": (lambda m: _setattr(op(m, 0), type=OperandType.TENSOR_QUANT8_SYMM_PER_CHANNEL,
                                                   channel_quant=SymmPerChannelQuantParams((0.1,), 1)),
                                "1 scales for dimension 1 of size 3"),
    "per-channel scale not positive": (lambda m: _setattr(
        op(m, 0), type=OperandType.TENSOR_QUANT8_SYMM_PER_CHANNEL,
        channel_quant=SymmPerChannelQuantParams((0.1, 0.0, 0.1), 1)), "every channel scale must be > 0"),
    "per-channel with scale": (lambda m: _setattr(op(m, 0), type=OperandType.TENSOR_QUANT8_SYMM_PER_CHANNEL,
                                                  scale=0.5), "scales are per channel"),
    "channel params on other type": (lambda m: _setattr(op(m, 0), channel_quant=SymmPerChannelQuantParams((1.0,), 0)),
                                     "per-channel parameters are only valid"),
    # lifetimes and locations
    "unknown lifetime": (lambda m: _setattr(op(m, 3), lifetime=42), "unknown lifetime 42"),
    "negative location": (lambda m: _setattr(op(m, 4), location=DataLocation(0, -4, 24)), "negative field"),
    "constant copy pool": (lambda m: _setattr(op(m, 4), location=DataLocation(1, 0, 24)),
                           "CONSTANT_COPY location must use pool 0"),
    "constant copy out of range": (lambda m: _setattr(op(m, 4), location=DataLocation(0, 10_000, 24)),
                                   "is outside operand_values"),
    "constant pool missing": (lambda m: _setattr(op(m, 4), lifetime=LT.CONSTANT_POOL, location=DataLocation(3, 0, 24)),
                              "uses pool 3, but the model has 0 pools"),
    "constant pool out of range": (lambda m: (m.pools.append(bytes(8)), _setattr(
        op(m, 4), lifetime=LT.CONSTANT_POOL, location=DataLocation(0, 0, 24))), "outside pool 0 of 8 bytes"),
    "constant wrong length": (lambda m: _setattr(op(m, 4), location=DataLocation(0, op(m, 4).location.offset, 20)),
                              "constant has 20 bytes, [2, 3] needs 24"),
    "constant unknown dims": (lambda m: _setattr(op(m, 4), dimensions=(2, 0)),
                              "a constant must have fully specified dimensions"),
    "no-value with location": (lambda m: _setattr(op(m, 3), lifetime=LT.NO_VALUE, location=DataLocation(0, 4, 4)),
                               "NO_VALUE operand must have an empty location"),
    "negative pool index": (lambda m: _setattr(op(m, 4), location=DataLocation(-1, 0, 24)), "negative field"),
    "pointer lifetime": (lambda m: _setattr(op(m, 3), lifetime=LT.POINTER), "POINTER lifetime cannot cross"),
    "temporary with location": (lambda m: _setattr(op(m, 3), location=DataLocation(0, 4, 4)),
                                "must have an empty location"),
    "subgraph lifetime wrong type": (lambda m: _setattr(op(m, 3), lifetime=LT.SUBGRAPH),
                                     "SUBGRAPH lifetime requires type SUBGRAPH"),
    "subgraph reference out of range": (lambda m: _setattr(op(m, 3), type=OperandType.SUBGRAPH, dimensions=(),
                                                           lifetime=LT.SUBGRAPH, location=DataLocation(0, 2, 0)),
                                        "references subgraph 2, but the model has 0"),
    # model inputs and outputs
    "input index out of range": (lambda m: m.main.input_indexes.append(99), "model input 2 refers to operand 99"),
    "input wrong lifetime": (lambda m: _setattr(m.main, input_indexes=[0, 3]),
                             "model input 1 (operand 3) must have lifetime SUBGRAPH_INPUT"),
    "output wrong lifetime": (lambda m: _setattr(m.main, output_indexes=[3]),
                              "model output 0 (operand 3) must have lifetime SUBGRAPH_OUTPUT"),
    "output index out of range": (lambda m: m.main.output_indexes.append(99), "model output 1 refers to operand 99"),
    "negative input index": (lambda m: _setattr(m.main, input_indexes=[0, -1]), "model input 1 refers to operand -1"),
    "output listed twice": (lambda m: _setattr(m.main, output_indexes=[6, 6]), "listed twice among the model outputs"),
    "unlisted output": (lambda m: _setattr(m.main, output_indexes=[]),
                        "operand 6 has lifetime SUBGRAPH_OUTPUT but is not a model output"),
    "input listed twice": (lambda m: _setattr(m.main, input_indexes=[0, 0]), "listed twice among the model inputs"),
    "unlisted input": (lambda m: _setattr(m.main, input_indexes=[0]),
                       "operand 1 has lifetime SUBGRAPH_INPUT but is not"),
    # operations
    "unknown operation": (lambda m: _setattr(m.main.operations[0], type=9999), "unknown operation type 9999"),
    "operation operand out of range": (lambda m: _setattr(m.main.operations[0], inputs=(0, 1, 50)),
                                       "operation 0 (ADD): input 2 refers to operand 50"),
    "operation output out of range": (lambda m: _setattr(m.main.operations[1], outputs=(70,)),
                                      "operation 1 (ADD): output 0 refers to operand 70, but there are 7 operands"),
    "writes a model input": (lambda m: _setattr(m.main.operations[0], outputs=(1,)),
                             "output 0 (operand 1) has lifetime SUBGRAPH_INPUT"),
    "writes a constant": (lambda m: _setattr(m.main.operations[1], outputs=(4,)),
                          "output 0 (operand 4) has lifetime CONSTANT_COPY"),
    "written twice": (lambda m: _setattr(m.main.operations[1], outputs=(3,)),
                      "operation 1 (ADD): output 0 (operand 3) is already written by operation 0"),
    "read before written": (lambda m: m.main.operations.reverse(),
                            "is read before operation 1 writes it: operations must be in execution order"),
    "never written": (lambda m: m.main.operations.pop(0), "input 0 (operand 3) is never written"),
    "output never written": (lambda m: m.main.operations.pop(), "operand 6 is a model output but no operation"),
    # extensions
    "unregistered extension": (lambda m: m.extension_name_to_prefix.append(ExtensionNameAndPrefix("com.no.such", 1)),
                               "unknown extension 'com.no.such': not registered with this driver"),
    "undeclared extension operand": (lambda m: _setattr(op(m, 3), type=(5 << 16) | 1),
                                     "uses prefix 5, which the model's extension_name_to_prefix does not declare"),
    "undeclared extension operation": (lambda m: _setattr(m.main.operations[0], type=(6 << 16) | 2),
                                       "extension prefix 6 is not declared"),
    "extension declared twice": (lambda m: m.extension_name_to_prefix.extend(
        [ExtensionNameAndPrefix("com.a", 1), ExtensionNameAndPrefix("com.a", 2)]), "'com.a' is declared twice"),
    "prefix assigned twice": (lambda m: m.extension_name_to_prefix.extend(
        [ExtensionNameAndPrefix("com.a", 1), ExtensionNameAndPrefix("com.b", 1)]), "prefix 1 is assigned twice"),
    "prefix out of range": (lambda m: m.extension_name_to_prefix.append(ExtensionNameAndPrefix("com.a", 0)),
                            "prefix 0 out of range"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_validation_rule(case):
    mutate, message = CASES[case]
    m = base_model()
    validate_model(m)  # the base is valid
    mutate(m)
    with pytest.raises(HalError) as e:
        validate_model(m)
    assert e.value.status == ErrorStatus.INVALID_ARGUMENT
    assert message in e.value.message, e.value.message


def test_referenced_subgraphs_are_validated():
    m = base_model()
    m.referenced.append(Subgraph(operands=copy.deepcopy(m.main.operands[:1]), input_indexes=[5]))
    with pytest.raises(HalError, match="referenced subgraph 0: model input 0 refers to operand 5"):
        validate_model(m)


def test_operation_signature_is_checked_at_compile():
    m = base_model()
    m.main.operations[0].inputs = (0, 1)
    with pytest.raises(HalError, match=r"operation 0 \(ADD\): expected 3 inputs, got 2"):
        compile_model(m)


def test_unimplemented_operation_is_reported_not_crashed():
    b = ModelBuilder()
    x = b.add_operand(OperandType.TENSOR_FLOAT32, (4,))
    y = b.add_operand(OperandType.TENSOR_FLOAT32, (4,))
    op = unimplemented_operation()
    b.add_operation(op, [x], [y])
    b.identify_inputs_and_outputs([x], [y])
    m = b.finish()
    validate_model(m)
    assert supported_operations(m) == [False]
    with pytest.raises(HalError, match=r"operation 0 \(OEM_OPERATION\): not supported by this driver"):
        compile_model(m)


def test_validate_model_needs_a_model():
    with pytest.raises(HalError, match="expected a Model, got dict"):
        validate_model({})


def test_supported_operations_of_a_valid_model():
    assert supported_operations(base_model()) == [True, True]


def test_unimplemented_operation_is_refused_at_compile_with_dynamic_shapes():
    """With unknown input dimensions no plan is made at compile time; support is still checked."""
    b = ModelBuilder()
    x = b.add_operand(OperandType.TENSOR_FLOAT32, (0, 4))
    y = b.add_operand(OperandType.TENSOR_FLOAT32, (0, 4))
    op = unimplemented_operation()
    b.add_operation(op, [x], [y])
    b.identify_inputs_and_outputs([x], [y])
    with pytest.raises(HalError, match=r"operation 0 \(OEM_OPERATION\): not supported by this driver"):
        compile_model(b.finish())


# ---- extension operand and operation types (a private extension, registered per test) ----

EXT = "com.test.validation"


@pytest.fixture
def extension():
    extension_registry.register_extension(ExtensionTypes(EXT, {0: ExtensionOperandType(0, np.dtype(np.int64))}, {}))
    yield
    extension_registry.unregister_extension(EXT)


def _with_extension(m, prefix=1):
    m.extension_name_to_prefix.append(ExtensionNameAndPrefix(EXT, prefix))
    return m


def test_extension_operand_type_must_exist(extension):
    m = _with_extension(base_model())
    m.main.operands[3].type = encode_extension_type(1, 7)
    with pytest.raises(HalError, match="operand 3: extension 'com.test.validation' has no operand type 7"):
        validate_model(m)


def test_extension_operation_type_must_exist(extension):
    m = _with_extension(base_model())
    m.main.operations[0].type = encode_extension_type(1, 9)
    with pytest.raises(HalError, match="extension 'com.test.validation' has no operation type 9"):
        validate_model(m)


def test_extension_operation_without_implementation_is_not_supported(extension):
    """A declared extension operand type is valid; the op using it is reported unsupported."""
    m = _with_extension(base_model())
    m.main.operands.append(Operand(encode_extension_type(1, 0), (3,)))
    m.main.operations.append(type(m.main.operations[0])(unimplemented_operation(), (3,), (7,)))
    validate_model(m)
    assert supported_operations(m) == [True, True, False]


# ---- rules found missing by the validation fuzzer/review, now enforced ----

def test_empty_model_is_invalid():
    with pytest.raises(HalError, match="empty model"):
        validate_model(Model())


def test_unwritten_temporary_is_invalid():
    m = base_model()
    m.main.operands.append(Operand(OperandType.TENSOR_FLOAT32, (2, 3)))
    with pytest.raises(HalError, match="operand 7 is never written"):
        validate_model(m)


def test_subgraph_type_needs_subgraph_lifetime():
    b = ModelBuilder()
    a = b.add_operand(OperandType.TENSOR_FLOAT32, (2,))
    s = b.add_operand(OperandType.SUBGRAPH)
    y = b.add_operand(OperandType.TENSOR_FLOAT32, (2,))
    b.add_operation(OperationType.ADD, [a, a, b.add_int32(0)], [y])
    b.identify_inputs_and_outputs([a, s], [y])
    with pytest.raises(HalError, match="SUBGRAPH"):
        execute(compile_model(b.finish()), [np.zeros(2, np.float32), np.zeros((), np.float32)])


def test_subgraph_reference_location_is_checked():
    m = base_model()
    m.referenced.append(Subgraph())
    m.main.operands.append(Operand(OperandType.SUBGRAPH, lifetime=LT.SUBGRAPH, location=DataLocation(3, 0, 7)))
    with pytest.raises(HalError, match="SUBGRAPH"):
        validate_model(m)


def test_extension_constant_location_is_checked(extension):
    m = _with_extension(base_model())
    m.main.operands.append(Operand(encode_extension_type(1, 0), (4,), lifetime=LT.CONSTANT_COPY,
                                   location=DataLocation(0, 10_000, 3)))
    with pytest.raises(HalError, match="outside operand_values"):
        compile_model(m)


@pytest.mark.parametrize("lifetime", [LT.POINTER, 42])
def test_extension_operand_lifetime_is_checked(extension, lifetime):
    m = _with_extension(base_model())
    m.main.operands.append(Operand(encode_extension_type(1, 0), (4,), lifetime=lifetime))
    with pytest.raises(HalError, match="lifetime"):
        validate_model(m)


# ---- fuzzing ---------------------------------------------------------------------------------

#: Small and boundary values, so mutations often land on something meaningful.
_INTERESTING = st.one_of(st.sampled_from([-(2**31), -1, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 14, 24, 127, 128, 255,
                                          256, 2**15, 2**16, 2**31 - 1]), st.integers(-(2**31), 2**31 - 1))
# SUBGRAPH (15) is left out of operand types: see test_subgraph_type_needs_subgraph_lifetime.
_TYPES = st.one_of(st.sampled_from([int(t) for t in OperandType if t != OperandType.SUBGRAPH]),
                   _INTERESTING.filter(lambda v: v != OperandType.SUBGRAPH))
_OPERAND_MUTATION = st.one_of(
    st.tuples(st.just("type"), _TYPES),
    st.tuples(st.just("dimensions"), st.lists(st.one_of(st.integers(-2, 7), _INTERESTING), max_size=9).map(tuple)),
    st.tuples(st.just("scale"), st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.5, 0.0]))),
    st.tuples(st.just("zero_point"), _INTERESTING),
    st.tuples(st.just("lifetime"), st.one_of(st.integers(0, 7), _INTERESTING)),
    st.tuples(st.just("location"), st.builds(DataLocation, st.integers(-1, 2), _INTERESTING, _INTERESTING)),
    st.tuples(st.just("channel_quant"), st.builds(SymmPerChannelQuantParams,
                                                  st.lists(st.floats(-1, 2), max_size=4).map(tuple),
                                                  st.integers(-1, 3))),
)
_INDEX = st.integers(-2, 9)
_MODEL_MUTATION = st.one_of(
    st.tuples(st.just("operand"), st.integers(0, 6), _OPERAND_MUTATION),
    st.tuples(st.just("op_input"), st.integers(0, 1), st.integers(0, 3), _INDEX),
    st.tuples(st.just("op_output"), st.integers(0, 1), st.integers(0, 1), _INDEX),
    st.tuples(st.just("op_type"), st.integers(0, 1), st.one_of(st.sampled_from([0, 16, 18, 36, 105, 106]),
                                                                _INTERESTING)),
    st.tuples(st.just("model_inputs"), st.lists(_INDEX, max_size=3)),
    st.tuples(st.just("model_outputs"), st.lists(_INDEX, max_size=3)),
    st.tuples(st.just("pool"), st.integers(0, 64)),
    st.tuples(st.just("new_operand"), _OPERAND_MUTATION),
)


def _apply(m, mutation) -> None:
    kind, *args = mutation
    sg = m.main
    if kind == "operand":
        i, (field, value) = args
        setattr(sg.operands[i], field, value)
    elif kind in ("op_input", "op_output"):
        k, pos, target = args
        operation = sg.operations[k]
        attr = "inputs" if kind == "op_input" else "outputs"
        idxs = list(getattr(operation, attr))
        if pos < len(idxs):
            idxs[pos] = target
        else:
            idxs.append(target)
        setattr(operation, attr, tuple(idxs))
    elif kind == "op_type":
        sg.operations[args[0]].type = args[1]
    elif kind == "model_inputs":
        sg.input_indexes = list(args[0])
    elif kind == "model_outputs":
        sg.output_indexes = list(args[0])
    elif kind == "pool":
        m.pools.append(bytes(args[0]))
    else:  # a new TEMPORARY_VARIABLE operand with one field mutated
        field, value = args[0]
        sg.operands.append(Operand(OperandType.TENSOR_FLOAT32, (2, 3)))
        setattr(sg.operands[-1], field, value)


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_MODEL_MUTATION, min_size=1, max_size=4))
def test_fuzzed_models_never_crash(mutations):
    """Corrupted models give a HalError (validation, compilation or execution) or run: never another
    exception. Extension codes stay undeclared here (their known crash is tested above)."""
    m = base_model()
    for mutation in mutations:
        _apply(m, mutation)
    stage = "validate"
    try:
        validate_model(m)
        stage = "compile"
        supported_operations(m)
        compiled = compile_model(m)
        infos = [compiled.input_info(k) for k in range(len(compiled.input_indexes))]
        stage = "execute"
        if all(i.fully_specified and np.prod(i.shape, dtype=float) < 1e6 for i in infos):
            execute(compiled, [np.zeros(i.shape, i.dtype) for i in infos])
        stage = "ran"
    except HalError:
        pass
    event(f"stopped at {stage}")
