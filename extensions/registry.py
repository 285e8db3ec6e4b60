"""The extension registry (plugin discovery: ``extensions.plugins``).

An extension is a name (``com.example.fibonacci``), operand types and operations;
each operation is a validate / prepare / execute triple, plus the TFLite
custom_code(s) it implements and a mapper that turns such a CUSTOM node into the
NNAPI operation. Registering plugs it into hal as hal's own operations are split:
validate and prepare become the operation's spec in hal's registry (validate runs
from validateModel, so it must not read tensor values), execute becomes the
kernel of a backend named after the extension (prepare's result is its plan
data). hal resolves ``(prefix << 16) | type`` through each model's
extension_name_to_prefix.
"""
from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from hal import backends as hal_backends
from hal import extension_registry
from hal.extension_registry import ExtensionOperandType, ExtensionTypes
from hal.registry import OperationSpec

log = logging.getLogger("nnhal.extensions")

@dataclass(frozen=True)
class OperandTypeSpec:
    type: int  # within the extension (< 2^16)
    name: str
    dtype: Any  # numpy dtype of one element
    is_tensor: bool = True


@dataclass(frozen=True)
class ExtensionOperation:
    type: int  # within the extension
    name: str
    validate: Callable
    prepare: Callable
    execute: Callable
    custom_codes: tuple[str, ...] = ()
    #: map_tflite(ctx: delegate.mapping.MappingContext, node, operation_code) emits the NNAPI op.
    map_tflite: Callable | None = None


@dataclass(frozen=True)
class Extension:
    name: str
    version: str
    operand_types: tuple[OperandTypeSpec, ...] = ()
    operations: tuple[ExtensionOperation, ...] = ()
    description: str = ""

    def __post_init__(self) -> None:
        if not self.name or "." not in self.name:
            raise ValueError(f"extension name must be reverse-domain style (com.vendor.x), got {self.name!r}")
        for what, items in (("operand type", self.operand_types), ("operation", self.operations)):
            codes = [i.type for i in items]
            if len(set(codes)) != len(codes) or any(not 0 <= c < (1 << 16) for c in codes):
                raise ValueError(f"{self.name}: {what} codes must be unique and < 65536, got {codes}")

    def hal_types(self) -> ExtensionTypes:
        """Operand types and operation specs, as hal's registry holds them."""
        return ExtensionTypes(
            self.name,
            {t.type: ExtensionOperandType(t.type, np.dtype(t.dtype), t.is_tensor) for t in self.operand_types},
            {op.type: OperationSpec((1 << 16) | op.type, op.validate, op.prepare, input_types=None,
                                    optional_inputs=None, allow_zero_sized_inputs=True,  # execute decides
                                    name_override=f"{self.name}:{op.name}")
             for op in self.operations},
            modules=frozenset(fn.__module__ for op in self.operations for fn in (op.validate, op.prepare, op.execute)
                              if fn is not None))

    def backend(self) -> hal_backends.ExtensionBackend:
        """The extension's kernels: each operation's prepare result is its plan data."""
        b = hal_backends.ExtensionBackend(self.name, self.version)
        for op in self.operations:
            b.register(op.type, plan=_prepared_data, execute=op.execute)
        return b


def _prepared_data(ctx):
    """An extension's prepare returns what its execute needs (the one-function API of extensions)."""
    return ctx.params


_lock = threading.Lock()
_registered: dict[str, Extension] = {}


def register(ext: Extension) -> None:
    if not isinstance(ext, Extension):
        raise TypeError(f"expected an extensions.Extension, got {type(ext).__name__}")
    with _lock:
        _registered[ext.name] = ext
        extension_registry.register_extension(ext.hal_types())
        hal_backends.register_backend(ext.backend())


def unregister(name: str) -> None:
    with _lock:
        _registered.pop(name, None)
        extension_registry.unregister_extension(name)
        b = hal_backends.extension_backend(name)
        if b is not None:
            hal_backends.unregister_backend(name)


def registered() -> list[Extension]:
    with _lock:
        return [_registered[k] for k in sorted(_registered)]


def lookup(name: str) -> Extension | None:
    """The registered extension called ``name``, or None."""
    with _lock:
        return _registered.get(name)


def by_custom_code(code: str | None) -> tuple[Extension, ExtensionOperation] | None:
    if not code:
        return None
    for ext in registered():
        for op in ext.operations:
            if code in op.custom_codes:
                return ext, op
    return None


@dataclass(frozen=True)
class Installable:
    """An extension nnhal knows of but does not include: the custom codes it implements and the
    distribution that provides it, so a model needing it can name the pip command."""

    extension: str
    distribution: str
    extra: str  # nnhal's optional dependency that installs it: pip install 'nnhal[extra]'
    source: str  # its folder in nnhal's source tree, relative to extensions/
    custom_codes: tuple[str, ...]

    def pip_command(self) -> str:
        """``pip install 'nnhal[x]'``, and from a source checkout the folder to install."""
        command = f"pip install 'nnhal[{self.extra}]' (the {self.distribution} distribution)"
        folder = os.path.join(os.path.dirname(os.path.abspath(__file__)), self.source)
        if os.path.isfile(os.path.join(folder, "pyproject.toml")):  # a source checkout
            relative = os.path.relpath(folder)
            command += f"; in this source checkout: pip install -e {folder if relative.startswith('..') else relative}"
        return command


#: Extensions distributed apart from nnhal (extensions/<source>, each its own distribution and an
#: extra of nnhal's pyproject.toml). Tests check each entry against the extension it names.
INSTALLABLE = (
    Installable("com.google.mediapipe", "nnhal-mediapipe", "mediapipe", "mediapipe",
                ("Convolution2DTransposeBias", "Landmarks2TransformMatrix", "TransformTensorBilinear",
                 "TransformLandmarks")),
)


def installable_for(code: str | None) -> Installable | None:
    """The known extension that implements custom code ``code``, installed or not."""
    return next((i for i in INSTALLABLE if code in i.custom_codes), None)
