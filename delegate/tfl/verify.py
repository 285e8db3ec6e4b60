"""Bounds-checked verification of a .tflite flatbuffer, before TFLite or nnhal reads it.

TFLite's Python Interpreter builds a model from a file without running the flatbuffers verifier,
and the Python ``flatbuffers`` package has none: a truncated or corrupted file makes TFLite read
outside the buffer (SIGSEGV) or loop. ``verify_model`` does what flatbuffers' C++ ``Verifier``
does for TFLite's schema (``tflite::VerifyModelBuffer``): every table, vtable, field, vector,
string and union reachable from the root lies inside the buffer, strings are terminated, offsets
are non-zero, nesting depth and table count are bounded (alignment is not checked: it cannot
make a read leave the buffer). It also checks that a
buffer stored outside the flatbuffer (``Buffer.offset``/``size``, large models) lies in the file.

The schema is not written out by hand: it is read from the pinned ``tflite`` package's generated
accessors, whose code names each field's vtable slot and what the field holds (a scalar of some
width, a string, a table of some class, a vector of those, a union), so every table of the
schema is covered, all builtin options included.
"""
from __future__ import annotations

import ast
import functools
import importlib
import inspect
import struct
from dataclasses import dataclass

import flatbuffers.number_types as nt


class ModelFormatError(ValueError):
    """The bytes are not a TFLite model we can read."""


MAX_BUFFER = 2**31 - 1   # FLATBUFFERS_MAX_BUFFER_SIZE: no vector is larger
MAX_DEPTH = 64           # flatbuffers::Verifier's defaults
MAX_TABLES = 1_000_000

# Unions whose enum is not named like the field holding them (class, field) -> enum module.
_UNION_ENUMS = {("QuantizationParameters", "Details"): "QuantizationDetails",
                ("DimensionMetadata", "ArraySegments"): "SparseIndexVector",
                ("DimensionMetadata", "ArrayIndices"): "SparseIndexVector"}


@dataclass(frozen=True)
class _Field:
    name: str
    slot: int            # byte offset of the field's entry in the vtable
    kind: str            # scalar | string | table | union | vector | unknown
    size: int = 1        # scalar width, or a vector's element width
    element: str = ""    # vector elements: scalar | string | table
    cls: str = ""        # table class, or a union's enum module


def _flags_width(name: str) -> int:
    return getattr(nt, name).bytewidth


@functools.cache
def _schema(cls_name: str) -> tuple[_Field, ...]:
    """The fields of a generated table class, from the source of its accessors."""
    try:
        mod = importlib.import_module(f"tflite.{cls_name}")
        cls = getattr(mod, cls_name)
        tree = ast.parse(inspect.getsource(cls))
    except (ImportError, AttributeError, OSError, TypeError, SyntaxError):
        return ()
    fields = []
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef) or fn.name.endswith(("AsNumpy", "Length", "IsNone")):
            continue
        slot, calls, flags, target = None, set(), None, ""
        for node in ast.walk(fn):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                calls.add(node.func.attr)
                if node.func.attr == "Offset" and node.args and isinstance(node.args[0], ast.Constant):
                    slot = node.args[0].value
            elif isinstance(node, ast.Attribute) and node.attr.endswith("Flags") and flags is None \
                    and node.attr != "UOffsetTFlags":
                flags = node.attr
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tflite."):
                target = node.names[0].name
        if not isinstance(slot, int):
            continue
        if "Union" in calls:
            enum = _UNION_ENUMS.get((cls_name, fn.name), fn.name)
            fields.append(_Field(fn.name, slot, "union", 4, cls=enum))
        elif "Vector" in calls:
            if "Indirect" in calls:
                fields.append(_Field(fn.name, slot, "vector", 4, "table", target))
            elif "String" in calls:
                fields.append(_Field(fn.name, slot, "vector", 4, "string"))
            else:
                fields.append(_Field(fn.name, slot, "vector", _flags_width(flags) if flags else 1, "scalar"))
        elif "String" in calls:
            fields.append(_Field(fn.name, slot, "string", 4))
        elif "Indirect" in calls:
            fields.append(_Field(fn.name, slot, "table", 4, cls=target))
        elif flags is not None:
            fields.append(_Field(fn.name, slot, "scalar", _flags_width(flags)))
        else:  # a struct (the schema has none today): its bytes must at least lie in the buffer
            fields.append(_Field(fn.name, slot, "unknown", 1))
    return tuple(fields)


@functools.cache
def _union_members(enum_module: str) -> dict[int, str]:
    try:
        enum = getattr(importlib.import_module(f"tflite.{enum_module}"), enum_module)
    except (ImportError, AttributeError):
        return {}
    return {v: k for k, v in vars(enum).items() if not k.startswith("_") and isinstance(v, int) and v}


class _Verifier:
    def __init__(self, buf: bytes):
        self.buf = memoryview(buf)
        self.n = len(buf)
        self.depth = 0
        self.tables = 0

    def fail(self, msg: str):
        raise ModelFormatError(f"malformed TFLite model: {msg}")

    def need(self, pos: int, size: int, what: str) -> None:
        if pos < 0 or size < 0 or pos + size > self.n:
            self.fail(f"{what} at byte {pos} (+{size}) is outside the file ({self.n} bytes)")

    def read(self, fmt: str, pos: int, what: str) -> int:
        self.need(pos, struct.calcsize(fmt), what)
        return struct.unpack_from(fmt, self.buf, pos)[0]

    def offset(self, pos: int, what: str) -> int:
        """The position a uoffset at ``pos`` points to (non-zero, forward, inside the buffer)."""
        o = self.read("<I", pos, what)
        if o == 0 or o >= 2**31:
            self.fail(f"{what}: bad offset {o} at byte {pos}")
        self.need(pos + o, 1, what)
        return pos + o

    def vector(self, pos: int, width: int, what: str) -> tuple[int, int]:
        """(position of the first element, length) of the vector at ``pos``."""
        n = self.read("<I", pos, f"{what} length")
        if width and n >= MAX_BUFFER // width:
            self.fail(f"{what}: {n} elements")
        self.need(pos + 4, n * width, what)
        return pos + 4, n

    def string(self, pos: int, what: str) -> None:
        start, n = self.vector(pos, 1, what)
        self.need(start + n, 1, f"{what} terminator")
        if self.buf[start + n] != 0:
            self.fail(f"{what} at byte {pos} is not terminated")

    def table(self, pos: int, cls: str, what: str) -> None:
        """Verify the table at ``pos`` (of generated class ``cls``) and everything it references."""
        self.tables += 1
        if self.tables > MAX_TABLES or self.depth >= MAX_DEPTH:
            self.fail(f"{what}: too many or too deeply nested tables")
        self.depth += 1
        vt = pos - self.read("<i", pos, f"{what} vtable offset")
        vsize = self.read("<H", vt, f"{what} vtable")
        if vsize < 4 or vsize & 1:
            self.fail(f"{what}: vtable size {vsize}")
        self.need(vt, vsize, f"{what} vtable")
        self.need(pos, self.read("<H", vt + 2, f"{what} vtable"), what)
        fields = _schema(cls)
        for f in fields:
            at = self.field(pos, vt, vsize, f.slot)
            if at is None:
                continue
            name = f"{what}.{f.name}"
            if f.kind in ("scalar", "unknown"):
                self.need(at, f.size, name)
            elif f.kind == "string":
                self.string(self.offset(at, name), name)
            elif f.kind == "table":
                self.table(self.offset(at, name), f.cls, name)
            elif f.kind == "vector":
                self.elements(self.offset(at, name), f, name)
            elif f.kind == "union":
                type_field = next((g for g in fields if g.name == f.name + "Type"), None)
                t_at = self.field(pos, vt, vsize, type_field.slot) if type_field is not None else None
                kind = self.read("<B", t_at, f"{name} type") if t_at is not None else 0
                # NONE: never read (as flatbuffers skips it). An unknown member type (a newer
                # schema) is accepted as flatbuffers does, its table checked with no fields known.
                if kind:
                    self.table(self.offset(at, name), _union_members(f.cls).get(kind, ""), name)
        self.check_semantics(cls, pos, vt, vsize, what)
        self.depth -= 1

    def field(self, pos: int, vt: int, vsize: int, slot: int) -> int | None:
        if slot + 2 > vsize:
            return None
        fo = self.read("<H", vt + slot, "vtable entry")
        return pos + fo if fo else None

    def elements(self, pos: int, f: _Field, what: str) -> None:
        start, n = self.vector(pos, f.size, what)
        if f.element == "scalar":
            return
        for k in range(n):
            at = self.offset(start + 4 * k, f"{what}[{k}]")
            if f.element == "string":
                self.string(at, f"{what}[{k}]")
            else:
                self.table(at, f.cls, f"{what}[{k}]")

    def check_semantics(self, cls: str, pos: int, vt: int, vsize: int, what: str) -> None:
        """A buffer kept outside the flatbuffer (offset > 1) must lie in the file: TFLite reads it
        at base + offset without checking."""
        if cls != "Buffer":
            return
        fields = {f.name: f for f in _schema("Buffer")}
        values = []
        for name in ("Offset", "Size"):
            f = fields.get(name)
            at = self.field(pos, vt, vsize, f.slot) if f is not None else None
            values.append(self.read("<Q", at, f"{what}.{name}") if at is not None else 0)
        offset, size = values
        if offset > 1 and offset + size > self.n:
            self.fail(f"{what}: data at bytes [{offset}, {offset + size}) is outside the file ({self.n} bytes)")


def verify_model(data: bytes) -> None:
    """Raise ModelFormatError (one line) unless ``data`` is a structurally sound TFLite model."""
    n = len(data)
    if n < 8 or bytes(data[4:8]) != b"TFL3":
        raise ModelFormatError("not a TFLite model (missing the TFL3 file identifier)")
    v = _Verifier(data)
    v.table(v.offset(0, "root"), "Model", "Model")


def check_dataflow(graph) -> None:
    """Each tensor written by at most one operator, never into a constant, and before every
    operator reading it. TFLite does not check this and crashes on such a graph."""
    writer: dict[int, int] = {}
    for node in graph.nodes:
        for t in node.outputs:
            tensor = graph.tensors[t]
            if tensor.data is not None and not tensor.is_variable:
                raise ModelFormatError(f"malformed TFLite model: operator {node.index} writes constant tensor {t}")
            if t in writer:
                raise ModelFormatError(f"malformed TFLite model: tensor {t} is written by operators {writer[t]} "
                                       f"and {node.index}")
            writer[t] = node.index
    for node in graph.nodes:
        for t in node.inputs:
            if writer.get(t, -1) >= node.index:
                raise ModelFormatError(f"malformed TFLite model: operator {node.index} reads tensor {t} before "
                                       f"operator {writer[t]} writes it")
