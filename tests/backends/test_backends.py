"""Backends and specs apart: preference order, assignment, fallback, reasons, the service and
the delegate seeing them, and specs validating without buffers from validateModel."""
from __future__ import annotations

import ast
import json
import logging
import subprocess
import sys

import numpy as np
import pytest

import hal
from delegate.mapping import InvalidNnapiOperation, convert_partition
from delegate.support_probe import supported_nodes
from delegate.tfl import TfLiteModelBuilder, read_model
from delegate.tfl.schema import ActivationFunctionType as Act
from delegate.tfl.schema import Padding
from extensions.registry import Extension, ExtensionOperation, OperandTypeSpec, register, unregister
from hal import backends
from hal.backends.graph import GraphBackend
from hal.compiler import compile_model
from hal.errors import HalError
from hal.executor import OperationTiming, execute
from hal.model import DataLocation, ExtensionNameAndPrefix, ModelBuilder
from hal.support import support_reasons
from hal.types import ErrorStatus, OperandLifeTime, OperandType, OperationType
from hal.validation import validate_model
from nnhal.ops_table import ops_matrix
from service.client import Client
from service.driver import perf_name
from tests.backends import fake_backends
from tests.delegate.models import head_model
from tests.service.models import add_model, unimplemented_operation

F32 = OperandType.TENSOR_FLOAT32


@pytest.fixture
def twin_add():
    """A backend with the reference ADD and SUB kernels only, preferred over the reference backend."""
    backends.register_backend(fake_backends.twin("twin", ops=[OperationType.ADD, OperationType.SUB]))
    yield
    backends.unregister_backend("twin")


def _add_then_softmax(op=OperationType.ADD):
    b = ModelBuilder()
    x = b.add_operand(F32, (2, 3))
    s = b.add_operand(F32, (2, 3))
    y = b.add_operand(F32, (2, 3))
    b.add_operation(op, [x, x, b.add_int32(0)], [s])
    b.add_operation(OperationType.SOFTMAX, [s, b.add_float32(1.0)], [y])
    b.identify_inputs_and_outputs([x], [y])
    return b.finish()


def test_preference_parsing():
    assert backends.parse_preference("reference") == ("reference",)
    with pytest.raises(HalError, match="unknown backend 'nope' \\(available: .*reference"):
        backends.parse_preference("nope,reference")
    with pytest.raises(HalError, match="listed twice"):
        backends.parse_preference(["reference", "reference"])


def test_preferred_backend_gets_what_it_runs_the_rest_falls_back(twin_add):
    model = _add_then_softmax()
    compiled = compile_model(model, backend_order=["twin"])
    assert [s.backend for s in compiled.static_plan.steps] == ["twin", "reference"]
    timings: list[OperationTiming] = []
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    out = execute(compiled, [x], timings)[0]
    assert [t.backend for t in timings] == ["twin", "reference"]
    np.testing.assert_array_equal(out, execute(compile_model(model, backend_order=["reference"]), [x])[0])
    # with no preference set, every available backend by priority (the twin's 5 beats reference's 0;
    # numba, when installed, takes float ADD and SOFTMAX but not float SUB)
    assert backends.preference()[-2:] == ("twin", "reference")
    per_op = [n for n in backends.preference() if not isinstance(backends.get(n), GraphBackend)]
    sub = _add_then_softmax(OperationType.SUB)
    softmax_on = "numba" if "numba" in per_op else "reference"
    assert [s.backend for s in compile_model(sub, backend_order=per_op).static_plan.steps] == ["twin", softmax_on]
    assert {s.backend for s in compile_model(model, backend_order=["reference"]).static_plan.steps} == {"reference"}


def test_environment_chooses_the_preference(twin_add, monkeypatch):
    monkeypatch.setenv(backends.ENV_VAR, "twin,reference")
    assert backends.preference() == ("twin", "reference")
    assert compile_model(_add_then_softmax()).static_plan.steps[0].backend == "twin"
    backends.set_preference("reference")  # an explicit setting wins over the environment
    try:
        assert compile_model(_add_then_softmax()).static_plan.steps[0].backend == "reference"
    finally:
        backends.set_preference(None)
    monkeypatch.setenv(backends.ENV_VAR, "nope")
    with pytest.raises(HalError, match="unknown backend 'nope'"):
        compile_model(_add_then_softmax())


def test_serve_refuses_an_unknown_backend(tmp_path):
    out = subprocess.run([sys.executable, "-m", "nnhal.cli", "serve", "--socket", str(tmp_path / "s.sock"),
                          "--no-cache", "--backend", "nope"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "unknown backend 'nope'" in out.stderr, out.stderr
    assert not (tmp_path / "s.sock").exists()


def test_backends_cli():
    rows = json.loads(subprocess.run([sys.executable, "-m", "nnhal.cli", "backends", "--json"], check=True,
                                     capture_output=True, text=True, timeout=60).stdout)
    ref = next(b for b in rows["backends"] if b["name"] == "reference")
    assert ref["identity"].startswith("reference@") and ref["enabled"] and rows["preference"][-1] == "reference"
    assert sum(len(o["operand_types"]) for o in ref["operations"]) == len(ops_matrix())
    # The speeds getCapabilities states for this preference (hal.performance), and each backend's own.
    from hal.performance import exec_times, stated
    from hal.types import OperandType
    assert rows["exec_time"] == {OperandType(t).name: v for t, v in exec_times(rows["preference"]).items()}
    for b in rows["backends"]:
        assert b["performance"] == {OperandType(t).name: v for t, v in stated(b["name"]).items()}


def test_relaxed_float32_is_the_float_backends_float16_figure_where_it_states_one(monkeypatch):
    """getCapabilities' relaxed figure: the float32 backend's own (hal.performance.RELAXED), else
    its float32 figure, since it computes a relaxed model in float32."""
    from hal import performance
    from hal.types import OperandType
    order = [n for n in ("onnxruntime", "reference") if backends.get(n) is not None]
    times, f32 = performance.exec_times(order), int(OperandType.TENSOR_FLOAT32)
    assert performance.relaxed_exec_time(order, times) == times[f32]
    monkeypatch.setitem(performance.RELAXED, order[0], times[f32] / 2)
    assert performance.relaxed_exec_time(order, times) == times[f32] / 2


def test_service_reports_the_assignment_and_reasons(server):
    with Client.connect(server.address) as c:
        remote = c.prepare_model(_add_then_softmax())
        ops = remote.perf_info().operations  # before any execution: the assignment is known
        # as this process's compiler assigns them (same default preference): a graph backend's
        # partition is one record, named PARTITION(n ops)
        program = compile_model(_add_then_softmax()).static_plan.program
        assert [(o.name, o.backend, o.count, o.executions) for o in ops] == [
            (perf_name(s.ctx.op_type, len(s.operations)), s.backend, len(s.operations), 0) for s in program]
        remote.execute([np.ones((2, 3), np.float32)])
        assert [o.executions for o in remote.perf_info().operations] == [1] * len(program)
        reasons = c.get_support_reasons(_unsupported_variants())
    assert reasons[0] is None
    assert reasons[1] is None  # a shape given as a model input: planned at execution, from its value
    assert reasons[2] == "operation 2 (OEM_OPERATION): not supported by this driver"


def _unsupported_variants():
    """ADD (supported); RESHAPE whose shape is a model input (planned per execution);
    OEM_OPERATION (valid, never supported)."""
    b = ModelBuilder()
    x = b.add_operand(F32, (2, 3))
    s = b.add_operand(F32, (2, 3))
    shape = b.add_operand(OperandType.TENSOR_INT32, (2,))
    r = b.add_operand(F32, (3, 2))
    f = b.add_operand(F32, (2, 3))
    b.add_operation(OperationType.ADD, [x, x, b.add_int32(0)], [s])
    b.add_operation(OperationType.RESHAPE, [s, shape], [r])
    b.add_operation(unimplemented_operation(), [x], [f])
    b.identify_inputs_and_outputs([x, shape], [r, f])
    return b.finish()


def test_report_names_the_backend_per_node(server, tmp_path):
    path = tmp_path / "m.tflite"
    path.write_bytes(head_model(np.float32))
    out = subprocess.run([sys.executable, "-m", "nnhal.cli", "report", "--model_file", str(path),
                          "--service_address", server.address, "--json"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    nodes = json.loads(out.stdout)["nodes"]
    # the compiler's assignment in this process (same default preference as the service): one
    # NNAPI operation per node of this model
    model = convert_partition(read_model(head_model(np.float32))).model
    assigned = [s.backend for s in compile_model(model).static_plan.steps]
    assert len(nodes) == len(assigned)
    assert all(n["placement"] == "nnhal" for n in nodes)
    assert [n["backend"] for n in nodes] == assigned


def test_validate_model_runs_every_operation_whatever_the_shapes():
    """An invalid operation is refused by validateModel even when input shapes are unknown."""
    m = add_model(shape=(0, 3))
    validate_model(m)  # valid with unknown dimensions
    assert m.main.operands[3].lifetime == OperandLifeTime.CONSTANT_COPY and m.main.operands[3].location.offset == 0
    m.operand_values = (9).to_bytes(4, "little")  # fused activation 9
    with pytest.raises(HalError, match=r"operation 0 \(ADD\): input 2: unknown fused activation 9"):
        validate_model(m)


def test_an_omitted_input_must_be_declared_optional():
    m = add_model()
    m.main.operands[3].lifetime = OperandLifeTime.NO_VALUE  # ADD's activation
    m.main.operands[3].location = DataLocation()
    with pytest.raises(HalError, match=r"operation 0 \(ADD\): input 2 must have a value \(it is omitted\)"):
        validate_model(m)


def test_validate_reading_a_tensor_value_is_a_driver_bug():
    def validate(ctx):
        ctx.constant(0)

    ext = Extension("com.test.peeking", "1", operations=(
        ExtensionOperation(0, "PEEK", validate, lambda ctx: ctx.set_output_shape(0, ctx.input_shape(0)),
                           lambda ctx, inputs: [inputs[0]]),))
    register(ext)
    try:
        b = ModelBuilder()
        b.model.extension_name_to_prefix.append(ExtensionNameAndPrefix("com.test.peeking", 1))
        w = b.add_constant(F32, np.ones(3, np.float32))
        y = b.add_operand(F32, (3,))
        b.add_operation((1 << 16) | 0, [w], [y])
        b.identify_inputs_and_outputs([], [y])
        with pytest.raises(HalError) as e:
            validate_model(b.finish())
        assert e.value.status == ErrorStatus.GENERAL_FAILURE and "must not read tensor values" in e.value.message
    finally:
        unregister("com.test.peeking")


def test_zero_sized_inputs_need_the_flag():
    """STRIDED_SLICE may produce an empty tensor; MAXIMUM does not accept zero-sized inputs."""
    b = ModelBuilder()
    x = b.add_operand(F32, (2, 3))
    sl = b.add_operand(F32, ())
    y = b.add_operand(F32, ())
    vec = lambda v: b.add_constant(OperandType.TENSOR_INT32, np.array(v, np.int32))  # noqa: E731
    b.add_operation(OperationType.STRIDED_SLICE, [x, vec([0, 0]), vec([0, 3]), vec([1, 1]), b.add_int32(0),
                                                  b.add_int32(0), b.add_int32(0)], [sl])
    b.add_operation(OperationType.MAXIMUM, [sl, sl], [y])
    b.identify_inputs_and_outputs([x], [y])
    with pytest.raises(HalError, match=r"operation 1 \(MAXIMUM\): input 0 is zero-sized \(\[0, 3\]\)"):
        compile_model(b.finish())


def test_delegate_reports_hal_messages_not_its_own():
    """A TFLite node whose NNAPI form breaks NNAPI's rules is refused with hal's validate message;
    one NNAPI allows but nnhal cannot run gets the service's (here: hal's) support reason."""
    tb = TfLiteModelBuilder()
    x = tb.add_input("x", [1, 3, 3, 1], np.uint8, scale=0.5, zero_point=1)
    y = tb.add_tensor("y", [1, 2, 2, 1], np.uint8, scale=0.5, zero_point=1)
    tb.add_operator("L2_POOL_2D", [x], [y], ("Pool2DOptions", {
        "padding": Padding.VALID, "stride_w": 1, "stride_h": 1, "filter_width": 2, "filter_height": 2,
        "fused_activation_function": Act.NONE}))
    tb.set_outputs([y])
    graph = read_model(tb.build())
    reason = supported_nodes(graph, None)[0]
    assert reason == ("NNAPI L2_POOL_2D rejects it: input 0 must be of type TENSOR_FLOAT32, TENSOR_FLOAT16, got "
                      "TENSOR_QUANT8_ASYMM")
    with pytest.raises(InvalidNnapiOperation):
        convert_partition(graph)


def test_support_reasons_in_process():
    reasons = support_reasons(_unsupported_variants())
    assert reasons[0] is None and reasons[2].endswith("not supported by this driver")
    assert hal.supported_operations(_unsupported_variants()) == [True, True, False]


def test_importing_the_delegate_loads_no_kernel():
    """The delegate maps and validates with hal's specs only: no backend module is imported."""
    code = ("import sys\n"
            "import delegate.nnhal_delegate, delegate.report\n"
            "from delegate.mapping import convert_partition\n"
            "from delegate.tfl import read_model\n"
            "from tests.delegate.models import head_model\n"
            "import numpy as np\n"
            "convert_partition(read_model(head_model(np.int8)))\n"
            "print(sorted(m for m in sys.modules if m.startswith('hal.backends.')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    loaded = ast.literal_eval(out.stdout.strip())
    framework = {"hal.backends.backend", "hal.backends.graph", "hal.backends.host_memory", "hal.backends.kernel",
                 "hal.backends.policy", "hal.backends.registry"}
    assert set(loaded) <= framework, loaded  # the framework, no backend's kernels


def test_unknown_dimensions_are_not_zero_sized():
    """In a declared shape 0 means "not specified yet": such an ADD is supported, and runs."""
    m = add_model(shape=(0, 3))
    assert support_reasons(m) == [None]
    x = np.ones((2, 3), np.float32)
    np.testing.assert_array_equal(execute(compile_model(m), [x, x])[0], x + x)


def test_an_unknown_rank_made_known_is_validated_again():
    """A temporary declared without dimensions had an unknown rank for validateModel; once shape
    inference makes it rank 0, FULLY_CONNECTED's rank rule applies."""
    b = ModelBuilder()
    c = b.add_constant(F32, np.array(2.0, np.float32), dimensions=())
    t = b.add_operand(F32, ())
    out = b.add_operand(F32, ())
    b.add_operation(OperationType.ADD, [c, c, b.add_int32(0)], [t])
    b.add_operation(OperationType.FULLY_CONNECTED, [t, b.add_constant(F32, np.ones((1, 1), np.float32)),
                                                   b.add_constant(F32, np.zeros(1, np.float32)), b.add_int32(0)],
                    [out])
    b.identify_inputs_and_outputs([], [out])
    with pytest.raises(HalError, match=r"operation 1 \(FULLY_CONNECTED\): input 0 must have rank >= 2, got 0"):
        compile_model(b.finish())


@pytest.mark.backend_failure
def test_a_backend_bug_hands_the_operation_to_the_reference_backend(caplog):
    ref_add = backends.get("reference").kernel(OperationType.ADD)

    def broken_plan(ctx):
        raise ValueError("a bug in a fast backend")

    buggy = backends.Backend("buggy", "1", priority=9)
    buggy.register(OperationType.ADD, plan=broken_plan, execute=ref_add.execute)
    backends.register_backend(buggy)
    try:
        with caplog.at_level(logging.INFO, logger="hal.compiler"):
            steps = compile_model(_add_then_softmax(), backend_order=["buggy"]).static_plan.steps
        assert [s.backend for s in steps] == ["reference", "reference"]
        said = [r for r in caplog.records if r.name == "hal.compiler"]
        assert [r.levelno for r in said] == [logging.WARNING]  # said once, with the reason
        assert "operation 0 (ADD): backend buggy: plan failed (ValueError('a bug in a fast backend'))" \
            in said[0].getMessage()
    finally:
        backends.unregister_backend("buggy")


def test_a_declining_backend_says_why_when_compiling_not_when_asked(caplog):
    """A backend with a kernel for the operation and its type that declines the parameters is named
    in the log with its reason (the operation then runs slower elsewhere); support queries, and
    backends without a kernel for the type, say nothing."""
    ref_add = backends.get("reference").kernel(OperationType.ADD)
    picky = backends.Backend("picky", "1", priority=9)
    picky.register(OperationType.ADD, plan=ref_add.plan, execute=ref_add.execute, types=[F32],
                   supports=lambda ctx: "fused activations are not implemented" if ctx.params.act else None)
    backends.register_backend(picky)
    b = ModelBuilder()
    x, s, y = (b.add_operand(F32, (2, 3)) for _ in range(3))
    b.add_operation(OperationType.ADD, [x, x, b.add_int32(1)], [s])  # RELU: declined
    b.add_operation(OperationType.ADD, [s, x, b.add_int32(0)], [y])
    b.identify_inputs_and_outputs([x], [y])
    model = b.finish()
    try:
        with caplog.at_level(logging.INFO, logger="hal.compiler"):
            support_reasons(model, ["picky"])
            assert not [r for r in caplog.records if r.name == "hal.compiler"]
            steps = compile_model(model, backend_order=["picky"]).static_plan.steps
        assert [s.backend for s in steps] == ["reference", "picky"]
        said = [r.getMessage() for r in caplog.records if r.name == "hal.compiler"]
        assert said == ["operation 0 (ADD): backend picky declined it (fused activations are not implemented); "
                        "the next backend of the order takes it"]
    finally:
        backends.unregister_backend("picky")


@pytest.mark.backend_failure
def test_a_backend_whose_supports_raises_declines(caplog):
    """A fast backend's supports() bug (e.g. reading params a runtime-planned operation does not
    have) declines the operation; the reference backend takes it, and support queries hold."""
    ref_add = backends.get("reference").kernel(OperationType.ADD)

    def broken_supports(ctx):
        return ctx.params.axes  # AttributeError: ADD's params have no axes

    buggy = backends.Backend("buggy_supports", "1", priority=9)
    buggy.register(OperationType.ADD, plan=ref_add.plan, execute=ref_add.execute, supports=broken_supports)
    backends.register_backend(buggy)
    try:
        with caplog.at_level(logging.WARNING, logger="hal.compiler"):
            steps = compile_model(_add_then_softmax(), backend_order=["buggy_supports"]).static_plan.steps
        assert [s.backend for s in steps] == ["reference", "reference"]
        assert "backend buggy_supports: supports failed (AttributeError(" in caplog.text
        assert support_reasons(_add_then_softmax(), ["buggy_supports"]) == [None, None]
    finally:
        backends.unregister_backend("buggy_supports")


def test_reference_must_come_last(twin_add):
    with pytest.raises(HalError, match="must come last"):
        backends.parse_preference("reference,twin")


def test_a_tflite_scalar_is_not_mapped_as_an_unknown_rank():
    """NNAPI has rank-0 tensors only as constants: a non-constant TFLite scalar stays on CPU
    (HARD_SWISH would otherwise be claimed, then fail at execution)."""
    tb = TfLiteModelBuilder()
    x = tb.add_input("x", [], np.float32)
    y = tb.add_tensor("y", [], np.float32)
    tb.add_operator("HARD_SWISH", [x], [y])
    tb.set_outputs([y])
    reason = supported_nodes(read_model(tb.build()), None)[0]
    assert "rank-0 (scalar) tensor" in reason


def test_extension_scalar_parameters_are_read_in_validate():
    """A constant of an extension's non-tensor operand type is a parameter validate may read."""
    def validate(ctx):
        n = ctx.known_scalar(1)
        ctx.check(n is None or n >= 0, f"input 1 must be >= 0, got {n}")

    def prepare(ctx):
        ctx.set_output_shape(0, ctx.input_shape(0))
        return int(ctx.scalar(1))

    ext = Extension("com.test.param", "1",
                    operand_types=(OperandTypeSpec(0, "COUNT", np.int32, is_tensor=False),),
                    operations=(ExtensionOperation(0, "REPEAT", validate, prepare,
                                                   lambda ctx, inputs: [inputs[0] * ctx.data]),))
    register(ext)
    try:
        def model(n):
            b = ModelBuilder()
            b.model.extension_name_to_prefix.append(ExtensionNameAndPrefix("com.test.param", 3))
            x = b.add_operand(F32, (2,))
            count = b.add_operand((3 << 16) | 0)
            b.set_constant(count, np.array([n], np.int32))
            y = b.add_operand(F32, (2,))
            b.add_operation((3 << 16) | 0, [x, count], [y])
            b.identify_inputs_and_outputs([x], [y])
            return b.finish()
        np.testing.assert_array_equal(execute(compile_model(model(3)), [np.ones(2, np.float32)])[0], [3, 3])
        with pytest.raises(HalError, match="input 1 must be >= 0, got -1"):
            validate_model(model(-1))
    finally:
        unregister("com.test.param")


def test_compute_threads_limit_the_blas_pool():
    threadpoolctl = pytest.importorskip("threadpoolctl")
    before = backends.policy._compute_threads  # 0 (never set) in a test process: kept so
    try:
        assert backends.set_compute_threads(1) == 1
        blas = [p for p in threadpoolctl.threadpool_info() if p["user_api"] == "blas"]
        assert blas and all(p["num_threads"] == 1 for p in blas)
    finally:
        backends.set_compute_threads(0)  # every core for BLAS again
        backends.policy._compute_threads = before  # later tests plan as an unset process does


def test_serve_refuses_negative_threads(tmp_path):
    out = subprocess.run([sys.executable, "-m", "nnhal.cli", "serve", "--socket", str(tmp_path / "s.sock"),
                          "--no-cache", "--threads", "-1"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--threads must be >= 0" in out.stderr


def test_an_operation_registered_again_for_other_types_runs_on_the_kernel_of_its_input_type():
    """A backend's quantized and float kernels of one operation live in two modules: the second
    registration for disjoint types makes one kernel that picks by input-0 type; overlapping types
    are still a double registration."""
    from hal.backends import Backend
    from hal.registry import OperandInfo, OperationContext
    from hal.types import OperandType
    b = Backend("typed-twin", "1")
    f32, u8 = OperandType.TENSOR_FLOAT32, OperandType.TENSOR_QUANT8_ASYMM
    b.register(OperationType.ADD, plan=lambda ctx: "q-plan", execute=lambda ctx, xs: ["q"], types=(u8,),
               supports=lambda ctx: "q declines")
    b.register(OperationType.ADD, plan=lambda ctx: "f-plan", execute=lambda ctx, xs: ["f"], types=(f32,),
               bind=lambda ctx, i, o: "f-runner")
    k = b.kernel(OperationType.ADD)

    def ctx_of(t):
        info = OperandInfo(type=t, shape=(2,), scale=0.5 if t == u8 else 0.0, zero_point=0)
        return OperationContext(0, OperationType.ADD, [info, info], [info])
    assert k.types == (u8, f32)
    assert (k.plan(ctx_of(u8)), k.execute(ctx_of(u8), []), k.unsupported(ctx_of(u8))) == ("q-plan", ["q"], "q declines")
    assert (k.plan(ctx_of(f32)), k.execute(ctx_of(f32), []), k.unsupported(ctx_of(f32))) == ("f-plan", ["f"], None)
    assert k.bind(ctx_of(f32), [], []) == "f-runner" and k.bind(ctx_of(u8), [], []) is None
    assert "not implemented" in k.unsupported(ctx_of(OperandType.TENSOR_INT32))
    with pytest.raises(RuntimeError, match="registered twice"):
        b.register(OperationType.ADD, plan=lambda ctx: None, execute=lambda ctx, xs: [], types=(f32,))
