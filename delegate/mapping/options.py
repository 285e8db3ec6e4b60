"""Reading a node's TFLite options from the C struct TFLite hands a delegate (``builtin_data``).

Each mapper module keeps the reader of its builtins' structs beside its mapper (``@mapper(...,
options=OptionsReader(...))``): what a mapper reads and what it was read from change together.
Keys are the flatbuffer schema's snake_case field names and values use the schema's enum codes
(C's TfLitePadding is SAME=1/VALID=2; the schema's Padding is SAME=0/VALID=1), so a mapper sees
the same options whether the node came from a .tflite file (delegate.tfl.reader) or from a live
interpreter. Only fields present since the op's first version are read: later-added fields are at
the end of each struct and do not move the ones read here.
"""
from __future__ import annotations

import ctypes as C
from dataclasses import dataclass
from typing import Callable

PADDING = {1: 0, 2: 1}  # kTfLitePaddingSame/Valid -> schema Padding.SAME/VALID


@dataclass(frozen=True)
class OptionsReader:
    """``table``: the schema's options table the fields come from (None: the builtin has none).
    ``read(builtin_data address) -> dict``; ``fields`` is False for builtins whose struct holds
    nothing a mapper reads (TFLite may then pass no builtin_data at all)."""

    table: str | None
    read: Callable[[int], dict]
    fields: bool = True


def no_options(table: str | None = None) -> OptionsReader:
    return OptionsReader(table, lambda address: {}, fields=False)


def ints(addr: int, n: int) -> list[int]:
    return list((C.c_int * n).from_address(addr))


def bools(addr: int, n: int) -> list[bool]:
    return [bool(b) for b in (C.c_bool * n).from_address(addr)]


def c_float(addr: int) -> float:
    return C.c_float.from_address(addr).value


def activation_only(addr: int) -> dict:
    """Structs whose first field is the fused activation (TfLiteAddParams, TfLiteSubParams...)."""
    return {"fused_activation_function": C.c_int.from_address(addr).value}


def decode(reader: OptionsReader | None, builtin_data: int | None) -> dict | None:
    """Options of a node, or None when they cannot be read (no reader, or no struct to read)."""
    if reader is None:
        return None
    if not builtin_data:
        return {} if not reader.fields else None
    return reader.read(builtin_data)
