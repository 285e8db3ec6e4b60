"""TFLite builtin_data C structs -> the options dict the mappers read.

The readers live beside their mappers (delegate/mapping/<family>.py, see
delegate.mapping.options); this module is the lookup the live-graph reader uses.
A builtin without a mapper has no reader and is never delegated: a mapper must not
run on options it cannot see.
"""
from __future__ import annotations

from delegate.mapping.core import options_reader
from delegate.mapping.options import decode


def decode_options(builtin_code: int, builtin_data: int | None) -> dict | None:
    """Options of a node, or None when this builtin's params are not understood here."""
    return decode(options_reader(builtin_code), builtin_data)
