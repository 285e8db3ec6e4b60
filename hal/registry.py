"""The operation registry: NNAPI op code -> OperationSpec, NNAPI's rules without arithmetic.

AndroidNN's NN_REGISTER_OPERATION in Python, split as AOSP splits it. A family module in
``hal/operations/`` registers each code's spec; the arithmetic lives in backends
(``hal.backends``), which register kernels for the codes they run.

Phases:

* ``validate(ctx)``: input/output counts, operand types, ranks, constant scalar parameters. It
  sees no tensor values (no buffers) and may see unknown dimensions (0) and unknown ranks: it runs
  from validateModel for every operation, whatever the input shapes, and again at compilation
  with the inferred shapes. A failure means the model is invalid (INVALID_ARGUMENT).
* ``prepare(ctx) -> params``: shape inference. Calls ``ctx.set_output_shape`` for every output,
  reads constant parameters (tensors too: a shape, an axis list), checks what the actual shapes
  must satisfy and returns backend-neutral parameters (``ctx.params``). A failure here on a valid
  model means "not supported" (a parameter this driver needs constant, a shape it cannot take).

A backend then plans (``ctx.data``) and executes; see ``hal.backends``. Vendor extensions' specs
are resolved per model in ``hal.extension_registry``.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from hal.errors import HalError, RuntimeValueNeeded
from hal.types import (
    NUMPY_DTYPE,
    SCALAR_TYPES,
    ErrorStatus,
    FeatureLevel,
    OperandLifeTime,
    OperandType,
    OperationType,
    operation_name,
    type_name,
)

_CONSTANT_LIFETIMES = (OperandLifeTime.CONSTANT_COPY, OperandLifeTime.CONSTANT_POOL)


@dataclass
class OperandInfo:
    """What an op sees of one operand before execution."""

    type: int
    shape: tuple[int, ...]
    scale: float = 0.0
    zero_point: int = 0
    channel_scales: np.ndarray | None = None  # per-channel quantization (float32)
    channel_dim: int = 0
    lifetime: OperandLifeTime = OperandLifeTime.TEMPORARY_VARIABLE
    value: np.ndarray | None = None  # decoded constant (validation sees scalars only)
    index: int = -1  # operand index in the subgraph
    extension_dtype: np.dtype | None = None  # element type of an extension operand type
    #: False for a non-constant tensor declared with no dimensions while validating: its rank is
    #: unknown until shapes are inferred (NNAPI's dimensionCount 0).
    rank_known: bool = True

    @property
    def is_constant(self) -> bool:
        return self.lifetime in _CONSTANT_LIFETIMES or self.value is not None

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def dtype(self) -> np.dtype:
        if self.extension_dtype is not None:
            return self.extension_dtype
        dtype = NUMPY_DTYPE.get(self.type)  # IntEnum keys: a plain int finds its type (no enum made per call)
        return dtype if dtype is not None else NUMPY_DTYPE[OperandType(self.type)]

    @property
    def fully_specified(self) -> bool:
        return self.rank_known and all(d > 0 for d in self.shape)


class OperationContext:
    """Per-operation view used by validate, prepare, a backend's plan and execute.

    Error messages always start with ``operation <index> (<NAME>)`` so a
    client can tell which node of its graph is at fault.
    """

    def __init__(self, index: int, op_type: int, inputs: Sequence[OperandInfo | None],
                 outputs: Sequence[OperandInfo], *, validating: bool = False):
        self.index = index
        self.op_type = op_type
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self.output_shapes: list[tuple[int, ...] | None] = [None] * len(self.outputs)
        #: True inside validateModel: no tensor values, possibly unknown shapes.
        self.validating = validating
        self.params: Any = None  # what the spec's prepare returned (backend-neutral)
        self.data: Any = None  # what the assigned backend's plan returned
        self.backend: str = ""  # name of the backend assigned at compilation
        #: False while answering getSupportedOperations: plans must still check everything, but may
        #: skip repacking constant weights (execute packs what plan did not).
        self.packing = True
        #: The model's referenced subgraphs (hal.model.Subgraph), which IF and WHILE name.
        self.subgraphs: Sequence[Any] = ()
        self._subgraph_info: Callable[[int, int], OperandInfo] | None = None
        #: IF and WHILE being compiled: the model's compiled referenced subgraphs
        #: (``hal.compiler.Subgraphs``), for a graph backend that lowers the loop or branches whole.
        self.compiled_subgraphs: Any = None

    def subgraph_operand_info(self, subgraph: int, i: int) -> OperandInfo:
        """Operand i of referenced subgraph ``subgraph``, as validation sees operands."""
        if self._subgraph_info is None:
            raise self.fail("the model's referenced subgraphs are not available here")
        return self._subgraph_info(subgraph, i)

    # ---- naming and failure -------------------------------------------------
    @property
    def name(self) -> str:
        return f"operation {self.index} ({operation_name(self.op_type)})"

    def fail(self, message: str, status: ErrorStatus = ErrorStatus.INVALID_ARGUMENT) -> HalError:
        err = HalError(status, f"{self.name}: {message}")
        err.detail = message
        return err

    def check(self, cond: Any, message: str, status: ErrorStatus = ErrorStatus.INVALID_ARGUMENT) -> None:
        if not cond:
            raise self.fail(message, status)

    # ---- signature checks ---------------------------------------------------
    @property
    def num_inputs(self) -> int:
        return len(self.inputs)

    @property
    def num_outputs(self) -> int:
        return len(self.outputs)

    def expect_num_inputs(self, *allowed: int) -> None:
        if self.num_inputs not in allowed:
            want = " or ".join(str(a) for a in allowed)
            raise self.fail(f"expected {want} inputs, got {self.num_inputs}")

    def expect_num_outputs(self, *allowed: int) -> None:
        if self.num_outputs not in allowed:
            want = " or ".join(str(a) for a in allowed)
            raise self.fail(f"expected {want} outputs, got {self.num_outputs}")

    def has_input(self, i: int) -> bool:
        """True when optional input i exists and is not NO_VALUE."""
        return i < len(self.inputs) and self.inputs[i] is not None

    def input(self, i: int) -> OperandInfo:
        if i >= len(self.inputs):
            raise self.fail(f"input {i} is missing (operation has {len(self.inputs)} inputs)")
        info = self.inputs[i]
        if info is None:
            raise self.fail(f"input {i} must have a value (it is omitted)")
        return info

    def output(self, i: int) -> OperandInfo:
        if i >= len(self.outputs):
            raise self.fail(f"output {i} is missing (operation has {len(self.outputs)} outputs)")
        return self.outputs[i]

    def input_type(self, i: int) -> int:
        return self.input(i).type

    def input_shape(self, i: int) -> tuple[int, ...]:
        return self.input(i).shape

    def expect_input_type(self, i: int, *allowed: int) -> None:
        t = self.input(i).type
        if t not in allowed:
            want = ", ".join(type_name(a) for a in allowed)
            raise self.fail(f"input {i} must be of type {want}, got {type_name(t)}")

    def expect_output_type(self, i: int, *allowed: int) -> None:
        t = self.output(i).type
        if t not in allowed:
            want = ", ".join(type_name(a) for a in allowed)
            raise self.fail(f"output {i} must be of type {want}, got {type_name(t)}")

    def rank_known(self, i: int) -> bool:
        return self.input(i).rank_known

    def expect_input_rank(self, i: int, *ranks: int) -> None:
        info = self.input(i)
        if info.rank_known and info.rank not in ranks:
            want = " or ".join(str(x) for x in ranks)
            raise self.fail(f"input {i} must be rank {want}, got {info.rank}")

    def expect_max_input_rank(self, i: int, max_rank: int) -> None:
        info = self.input(i)
        if info.rank_known and info.rank > max_rank:
            raise self.fail(f"input {i} must have rank <= {max_rank}, got {info.rank}")

    def expect_input_rank_between(self, i: int, low: int, high: int | None) -> None:
        info = self.input(i)
        if not info.rank_known:
            return
        if high is None:
            if info.rank < low:
                raise self.fail(f"input {i} must have rank >= {low}, got {info.rank}")
        elif not low <= info.rank <= high:
            raise self.fail(f"input {i} must have rank {low} to {high}, got {info.rank}")

    def expect_same_quantization(self, i: int, out: int = 0) -> None:
        """NNAPI requires scale/zero point of input i and output ``out`` to match for some ops."""
        a, b = self.input(i), self.output(out)
        if a.scale != b.scale or a.zero_point != b.zero_point:
            raise self.fail(
                f"output {out} quantization (scale={b.scale}, zero_point={b.zero_point}) must equal "
                f"input {i} quantization (scale={a.scale}, zero_point={a.zero_point})")

    def expect_output_quantization(self, out: int, scale: float, zero_point: int) -> None:
        """NNAPI's fixed output quantization (LOGISTIC, TANH, SOFTMAX), compared in float32."""
        o = self.output(out)
        if np.float32(o.scale) != np.float32(scale) or o.zero_point != zero_point:
            raise self.fail(f"output {out} quantization must be scale={scale}, zero_point={zero_point} "
                            f"(got scale={o.scale}, zero_point={o.zero_point})")

    # ---- constant parameters -----------------------------------------------
    def is_constant(self, i: int) -> bool:
        return self.has_input(i) and self.inputs[i].is_constant

    def constant(self, i: int) -> np.ndarray:
        info = self.input(i)
        if info.value is None:
            if self.validating and info.is_constant and info.type not in SCALAR_TYPES:
                raise self.fail(f"input {i}: validate must not read tensor values (no buffers); read "
                                f"them in prepare", ErrorStatus.GENERAL_FAILURE)
            if not self.validating and not info.is_constant:
                err = RuntimeValueNeeded(f"{self.name}: input {i} is not a constant: its value is known "
                                         f"only at execution", info.index)
                err.detail = f"input {i} is not a constant"
                raise err
            raise self.fail(f"input {i} must be a constant operand for this driver",
                            ErrorStatus.INVALID_ARGUMENT)
        return info.value

    def _scalar_value(self, i: int, info: OperandInfo, types: tuple) -> Any:
        """Type check, then the value of a constant scalar (None when it is not a constant)."""
        if types and info.type not in types:
            self.expect_input_type(i, *types)  # raises with the message
        v = info.value
        if v is None:
            return None
        if v.shape != ():
            raise self.fail(f"input {i} must be a scalar, got shape {list(v.shape)}")
        return v.item()

    def scalar(self, i: int, *types: int) -> Any:
        """Value of constant scalar input i as a Python number (checking its type if given)."""
        v = self._scalar_value(i, self.input(i), types)
        if v is None:
            self.constant(i)  # raises: not a constant (or, while validating, a tensor)
        return v

    def known_scalar(self, i: int, *types: int) -> Any:
        """For validate: the scalar's value when it is a constant, None when it is computed or a
        model input (NNAPI allows that; whether this driver supports it is prepare's question)."""
        return self._scalar_value(i, self.input(i), types)

    def optional_scalar(self, i: int, default: Any, *types: int) -> Any:
        return self.scalar(i, *types) if self.has_input(i) else default

    # ---- prepare ------------------------------------------------------------
    def set_output_shape(self, i: int, shape: Iterable[int]) -> None:
        shape = tuple(int(d) for d in shape)
        if any(d < 0 for d in shape):
            raise self.fail(f"output {i} would have a negative dimension: {list(shape)}")
        declared = self.output(i).shape
        if declared:
            if len(declared) != len(shape) or any(d and d != s for d, s in zip(declared, shape)):
                raise self.fail(f"output {i} shape {list(declared)} is incompatible with the "
                                f"computed shape {list(shape)}")
        self.output_shapes[i] = shape


Validate = Callable[[OperationContext], None]
Prepare = Callable[[OperationContext], Any]


@dataclass(frozen=True)
class OperationSpec:
    """NNAPI's definition of one operation code, with no arithmetic in it.

    ``input_types`` are the input-0 types the operation is defined for here; the framework checks
    them before ``validate`` runs, and the support table (``nnhal ops``) is what they and the
    backends' kernels have in common. ``optional_inputs`` are the positions NNAPI lets a model
    omit (NO_VALUE); any other omitted input is invalid. ``allow_zero_sized_inputs`` says whether an
    input may have a 0 dimension at execution (AOSP's allowZeroSizedInput).
    ``data_dependent_outputs``: some output's size depends on the input values (BOX_WITH_NMS_LIMIT,
    GENERATE_PROPOSALS): prepare sets a 0 in each dimension only the kernel knows, models using it
    are planned per execution and the executor takes those shapes from the kernel's results (see
    ``hal.compiler.make_plan``)."""

    type: int  # OperationType, or an extension-encoded code
    validate: Validate
    prepare: Prepare
    input_types: tuple[int, ...] | None = None  # None: validate checks types itself (extensions)
    num_inputs: tuple[int, ...] | None = None  # accepted input counts; None: validate checks them
    min_inputs: int = 0  # for variadic operations (CONCATENATION): at least this many inputs
    num_outputs: tuple[int, ...] | None = None
    optional_inputs: frozenset[int] | None = frozenset()  # None: validate decides (extensions)
    allow_zero_sized_inputs: bool = False
    min_feature_level: FeatureLevel = FeatureLevel.FL1
    #: Feature level from which each input type exists for this operation (default: min_feature_level).
    type_feature_levels: tuple[tuple[int, FeatureLevel], ...] = ()
    name_override: str = ""
    data_dependent_outputs: bool = False

    @property
    def name(self) -> str:
        return self.name_override or operation_name(self.type)

    def check_signature(self, ctx: OperationContext) -> None:
        """The declarative part of validation: input and output counts, omitted inputs, then the
        input-0 type, in that order (each later check relies on the earlier ones)."""
        if self.num_inputs is not None:
            ctx.expect_num_inputs(*self.num_inputs)
        if ctx.num_inputs < self.min_inputs:
            raise ctx.fail(f"expected at least {self.min_inputs} inputs, got {ctx.num_inputs}")
        if self.num_outputs is not None:
            ctx.expect_num_outputs(*self.num_outputs)
        for i, info in enumerate(ctx.inputs):
            if info is None and self.optional_inputs is not None and i not in self.optional_inputs:
                raise ctx.fail(f"input {i} must have a value (it is omitted)")
        if self.input_types is not None and ctx.inputs:
            ctx.expect_input_type(0, *self.input_types)

    def run_validate(self, ctx: OperationContext) -> None:
        self.check_signature(ctx)
        self.validate(ctx)


_REGISTRY: dict[int, OperationSpec] = {}


def register(op_types: OperationType | Iterable[OperationType], *, validate: Validate, prepare: Prepare,
             input_types: Iterable[int], num_inputs: Iterable[int] | None = None, min_inputs: int = 0,
             num_outputs: Iterable[int] | None = (1,), optional_inputs: Iterable[int] | None = (),
             allow_zero_sized_inputs: bool = False, min_feature_level: FeatureLevel = FeatureLevel.FL1,
             type_feature_levels: dict[int, FeatureLevel] | None = None,
             data_dependent_outputs: bool = False) -> None:
    """Register the spec of one or more op codes (several codes may share validate and prepare)."""
    if isinstance(op_types, OperationType):
        op_types = [op_types]
    for t in op_types:
        if int(t) in _REGISTRY:
            raise RuntimeError(f"operation {t.name} registered twice")
        _REGISTRY[int(t)] = OperationSpec(
            int(t), validate, prepare, tuple(input_types),
            None if num_inputs is None else tuple(num_inputs), min_inputs,
            None if num_outputs is None else tuple(num_outputs),
            None if optional_inputs is None else frozenset(optional_inputs),
            allow_zero_sized_inputs, FeatureLevel(min_feature_level),
            tuple(sorted((type_feature_levels or {}).items())),
            data_dependent_outputs=data_dependent_outputs)


def lookup(op_type: int) -> OperationSpec | None:
    """Spec of a builtin op code, or None."""
    _ensure_loaded()
    return _REGISTRY.get(int(op_type))


def registrations() -> list[OperationSpec]:
    _ensure_loaded()
    return [r for code, r in sorted(_REGISTRY.items()) if code < (1 << 16)]


_loaded = False
_load_lock = threading.RLock()


def _ensure_loaded() -> None:
    """Import every op family once. Thread-safe: a server's first requests arrive concurrently,
    and no thread may see a half-filled registry."""
    global _loaded
    if _loaded:
        return
    with _load_lock:
        if not _loaded:
            import hal.operations  # noqa: F401  (registers every family)
            _loaded = True
