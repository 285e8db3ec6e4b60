"""The operation registry: NNAPI op code -> (validate, prepare, execute).

AndroidNN's NN_REGISTER_OPERATION in Python. An op family module registers its
codes with :func:`register`; several codes may share one implementation.

Phases (as in AOSP's OperationResolver and TFLite's Prepare/Eval):

* ``validate(ctx)``: input/output counts and types, ranks, what can be known
  from types, static shapes and constant scalars. Raises HalError.
* ``prepare(ctx)``: calls ``ctx.set_output_shape`` for every output and returns
  the op's precomputed data (multipliers, shifts, repacked weights...).
* ``execute(ctx, inputs)``: numpy work only; ``ctx.data`` is what prepare
  returned, ``inputs[i]`` the i-th input array (None for an omitted optional
  input). Returns the output arrays.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from hal.errors import HalError
from hal.types import (
    NUMPY_DTYPE,
    ErrorStatus,
    OperandLifeTime,
    OperandType,
    OperationType,
    operation_name,
    type_name,
)


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
    value: np.ndarray | None = None  # decoded constant, if constant
    index: int = -1  # operand index in the subgraph
    extension_dtype: np.dtype | None = None  # element type of an extension operand type

    @property
    def is_constant(self) -> bool:
        return self.value is not None

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def dtype(self) -> np.dtype:
        if self.extension_dtype is not None:
            return self.extension_dtype
        return NUMPY_DTYPE[OperandType(self.type)]

    @property
    def fully_specified(self) -> bool:
        return all(d > 0 for d in self.shape)


class OperationContext:
    """Per-operation view used by validate, prepare and execute.

    Error messages always start with ``operation <index> (<NAME>)`` so a
    client can tell which node of its graph is at fault.
    """

    def __init__(self, index: int, op_type: int, inputs: Sequence[OperandInfo | None],
                 outputs: Sequence[OperandInfo]):
        self.index = index
        self.op_type = op_type
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self.output_shapes: list[tuple[int, ...] | None] = [None] * len(self.outputs)
        self.data: Any = None
        #: False while answering getSupportedOperations: prepare must still check everything and set
        #: shapes, but may skip repacking constant weights (execute packs what prepare did not).
        self.packing = True

    # ---- naming and failure -------------------------------------------------
    @property
    def name(self) -> str:
        return f"operation {self.index} ({operation_name(self.op_type)})"

    def fail(self, message: str, status: ErrorStatus = ErrorStatus.INVALID_ARGUMENT) -> HalError:
        return HalError(status, f"{self.name}: {message}")

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

    def expect_input_rank(self, i: int, *ranks: int) -> None:
        r = self.input(i).rank
        if r not in ranks:
            want = " or ".join(str(x) for x in ranks)
            raise self.fail(f"input {i} must be rank {want}, got {r}")

    def expect_max_input_rank(self, i: int, max_rank: int) -> None:
        r = self.input(i).rank
        if r > max_rank:
            raise self.fail(f"input {i} must have rank <= {max_rank}, got {r}")

    def expect_same_quantization(self, i: int, out: int = 0) -> None:
        """NNAPI requires scale/zero point of input i and output ``out`` to match for some ops."""
        a, b = self.input(i), self.output(out)
        if a.scale != b.scale or a.zero_point != b.zero_point:
            raise self.fail(
                f"output {out} quantization (scale={b.scale}, zero_point={b.zero_point}) must equal "
                f"input {i} quantization (scale={a.scale}, zero_point={a.zero_point})")

    # ---- constant parameters -----------------------------------------------
    def is_constant(self, i: int) -> bool:
        return self.has_input(i) and self.inputs[i].is_constant

    def constant(self, i: int) -> np.ndarray:
        info = self.input(i)
        if info.value is None:
            raise self.fail(f"input {i} must be a constant operand for this driver",
                            ErrorStatus.INVALID_ARGUMENT)
        return info.value

    def scalar(self, i: int, *types: int) -> Any:
        """Value of constant scalar input i as a Python number (checking its type if given)."""
        if types:
            self.expect_input_type(i, *types)
        v = self.constant(i)
        if v.shape != ():
            raise self.fail(f"input {i} must be a scalar, got shape {list(v.shape)}")
        return v.item()

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
Execute = Callable[[OperationContext, list], list]


@dataclass(frozen=True)
class OperationRegistration:
    type: int  # OperationType, or an extension-encoded code
    validate: Validate
    prepare: Prepare
    execute: Execute
    #: Input-0 operand types this op supports (the `nnhal ops` matrix).
    supported_types: tuple[OperandType, ...]
    #: Input positions whose *constant* value execute never reads: prepare packed it into the op
    #: data (conv filters as GEMM matrices...). The compilation cache then stores only the packed form.
    prepacked_inputs: tuple[int, ...] = ()

    @property
    def name(self) -> str:
        return operation_name(self.type)


_REGISTRY: dict[int, OperationRegistration] = {}


def register(op_types: OperationType | Iterable[OperationType], *, validate: Validate,
             prepare: Prepare, execute: Execute, supported_types: Iterable[OperandType],
             prepacked_inputs: Iterable[int] = ()) -> None:
    if isinstance(op_types, OperationType):
        op_types = [op_types]
    for t in op_types:
        if int(t) in _REGISTRY:
            raise RuntimeError(f"operation {t.name} registered twice")
        _REGISTRY[int(t)] = OperationRegistration(int(t), validate, prepare, execute,
                                                  tuple(supported_types), tuple(prepacked_inputs))


def lookup(op_type: int) -> OperationRegistration | None:
    """Registration for an op code (builtin or extension), or None."""
    _ensure_loaded()
    return _REGISTRY.get(int(op_type))


@dataclass(frozen=True)
class ExtensionOperandType:
    """An operand type an extension defines: its numpy element type and whether it is a tensor."""

    type: int  # within the extension
    dtype: np.dtype
    is_tensor: bool = True


@dataclass(frozen=True)
class ExtensionTypes:
    """What hal knows of one vendor extension (the ``extensions`` package registers these)."""

    name: str
    operand_types: dict[int, ExtensionOperandType]
    operations: dict[int, OperationRegistration]  # keyed by type within the extension


_EXTENSIONS: dict[str, ExtensionTypes] = {}


def register_extension(ext: ExtensionTypes) -> None:
    """Plug a vendor extension into hal. Its codes are resolved per model, through the model's
    extension_name_to_prefix: prefixes are assigned by each model, not globally."""
    _EXTENSIONS[ext.name] = ext


def unregister_extension(name: str) -> None:
    _EXTENSIONS.pop(name, None)


def extension(name: str) -> ExtensionTypes | None:
    return _EXTENSIONS.get(name)


def extensions() -> list[ExtensionTypes]:
    return [_EXTENSIONS[k] for k in sorted(_EXTENSIONS)]


def extension_modules(ext: ExtensionTypes) -> set[str]:
    """Modules whose functions implement an extension's operations."""
    return {fn.__module__ for reg in ext.operations.values() for fn in (reg.validate, reg.prepare, reg.execute)}


def extension_identity(name: str) -> str | None:
    """Digest of what an extension is now: its operand and operation types and the files of the
    modules implementing them. A compiled model that used another identity must be recompiled."""
    import hashlib
    import sys

    ext = _EXTENSIONS.get(name)
    if ext is None:
        return None
    known = _IDENTITIES.get(name)
    if known is not None and known[0] is ext:
        return known[1]
    h = hashlib.sha256(name.encode())
    for t in sorted(ext.operand_types.values(), key=lambda t: t.type):
        h.update(f"|{t.type}:{t.dtype.str}:{t.is_tensor}".encode())
    h.update(("|ops:" + ",".join(str(t) for t in sorted(ext.operations))).encode())
    for module in sorted(extension_modules(ext)):
        path = getattr(sys.modules.get(module), "__file__", None)  # source or a compiled library alike
        try:
            with open(path, "rb") as f:
                code = f.read()
        except (TypeError, OSError):
            code = b"<no file>"
        h.update(f"|{module}:".encode() + hashlib.sha256(code).digest())
    _IDENTITIES[name] = (ext, h.hexdigest())
    return _IDENTITIES[name][1]


_IDENTITIES: dict[str, tuple[ExtensionTypes, str]] = {}  # per registered object: sources are read once


def resolve_extension_type(code: int, prefixes: dict[int, str]) -> tuple[ExtensionTypes | None, int]:
    """(extension, type within it) for an encoded code, given the model's prefix -> name map."""
    ext = _EXTENSIONS.get(prefixes.get(code >> 16, ""))
    return ext, code & 0xFFFF


def model_prefixes(model) -> dict[int, str]:
    """A model's prefix -> extension name map (prefixes are per model, not per driver)."""
    return {e.prefix: e.name for e in model.extension_name_to_prefix}


def extension_dtype(code: int, prefixes: dict[int, str]) -> np.dtype | None:
    """numpy element type of an extension operand type; None for builtin or undefined codes."""
    if not code >> 16:
        return None
    ext, t = resolve_extension_type(code, prefixes)
    info = None if ext is None else ext.operand_types.get(t)
    return None if info is None else info.dtype


def operand_dtype(code: int, prefixes: dict[int, str]) -> np.dtype:
    """numpy element type of a builtin or extension operand type; the service and the client size
    and decode request arguments with it, extension types included."""
    if code >> 16:
        dtype = extension_dtype(code, prefixes)
        if dtype is None:
            raise HalError(ErrorStatus.INVALID_ARGUMENT, f"operand type {code} (prefix {code >> 16}, "
                                                         f"type {code & 0xFFFF}): no registered extension defines it")
        return dtype
    try:
        return NUMPY_DTYPE[OperandType(code)]
    except (ValueError, KeyError):
        raise HalError(ErrorStatus.INVALID_ARGUMENT, f"operand type {code} has no element type") from None


def lookup_in_model(op_type: int, prefixes: dict[int, str]) -> OperationRegistration | None:
    """Registration for a builtin code, or an extension code resolved through the model's prefixes."""
    if op_type >> 16:
        ext, t = resolve_extension_type(op_type, prefixes)
        return None if ext is None else ext.operations.get(t)
    return lookup(op_type)


def registrations() -> list[OperationRegistration]:
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
