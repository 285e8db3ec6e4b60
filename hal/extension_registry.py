"""Vendor extensions in hal: each registered extension's operand types and operation specs,
resolved per model through its prefix -> name map (prefixes are assigned by each model, not
globally), and each extension's identity (what the compilation cache checks).

The ``extensions`` package registers these; hal's core (validation, compiler, serialisation)
resolves extension codes through here, never through the package.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hal.errors import HalError
from hal.registry import OperationSpec, lookup
from hal.types import NUMPY_DTYPE, ErrorStatus, OperandType


@dataclass(frozen=True)
class ExtensionOperandType:
    """An operand type an extension defines: its numpy element type and whether it is a tensor."""

    type: int  # within the extension
    dtype: np.dtype
    is_tensor: bool = True


@dataclass(frozen=True)
class ExtensionTypes:
    """What hal knows of one vendor extension (the ``extensions`` package registers these): its
    operand types and its operations' specs. Its kernels form a backend named after it."""

    name: str
    operand_types: dict[int, ExtensionOperandType]
    operations: dict[int, OperationSpec]  # keyed by type within the extension
    #: Modules implementing the extension (specs and kernels): its identity hashes their files.
    modules: frozenset[str] = frozenset()


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
    return set(ext.modules) | {fn.__module__ for spec in ext.operations.values() for fn in (spec.validate, spec.prepare)
                               if fn is not None}


def file_digest(path: str | None) -> bytes:
    """SHA-256 of a code file (identities of backends and extensions are made of these)."""
    import hashlib
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).digest()
    except (TypeError, OSError):
        return hashlib.sha256(b"<no file>").digest()


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
        h.update(f"|{module}:".encode() + file_digest(path))
    _IDENTITIES[name] = (ext, h.hexdigest())
    return _IDENTITIES[name][1]


_IDENTITIES: dict[str, tuple[ExtensionTypes, str]] = {}  # per registered object: sources are read once


def resolve_extension_type(code: int, prefixes: dict[int, str]) -> tuple[ExtensionTypes | None, int]:
    """(extension, type within it) for an encoded code, given the model's prefix -> name map."""
    ext = _EXTENSIONS.get(prefixes.get(code >> 16, ""))
    return ext, code & 0xFFFF


def extension_name(code: int, prefixes: dict[int, str]) -> str | None:
    """Name of the extension an encoded operation or operand code belongs to in this model."""
    return prefixes.get(code >> 16) if code >> 16 else None


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


def lookup_in_model(op_type: int, prefixes: dict[int, str]) -> OperationSpec | None:
    """Spec of a builtin code, or of an extension code resolved through the model's prefixes."""
    if op_type >> 16:
        ext, t = resolve_extension_type(op_type, prefixes)
        return None if ext is None else ext.operations.get(t)
    return lookup(op_type)
