"""TFLite Support metadata: the ``TFLITE_METADATA`` entry of a .tflite, read for the input ranges
the tools draw random inputs from.

A model's ``metadata`` vector names buffers; the one named ``TFLITE_METADATA`` holds a
ModelMetadata flatbuffer (file identifier ``M001``) of tflite-support's
``tensorflow_lite_support/metadata/metadata_schema.fbs``. Neither the ``tflite`` package (TFLite's
schema.fbs only) nor ``flatbuffers`` (a runtime, no schema) reads it, and tflite-support is a large
native wheel the project does not need, so this is a minimal reader of the few fields the tools use.
Its every read is bounds-checked: the Python flatbuffers runtime checks nothing, and metadata is
not covered by delegate.tfl.verify, so a truncated or corrupted entry must be a MetadataError (the
tools warn and fall back), never an IndexError, a struct.error or garbage.

Field ids are metadata_schema.fbs's declaration order (it gives no ``id:`` attributes); a union
field takes two ids, its type then its value. Vtable slot of field ``i``: ``4 + 2 * i``.
"""
from __future__ import annotations

import math
import struct
from dataclasses import dataclass

import numpy as np

METADATA_NAME = "TFLITE_METADATA"
FILE_IDENTIFIER = b"M001"

# TFLite schema.fbs (the model): Model.buffers, Model.metadata; Metadata.name, .buffer;
# Buffer.data, .offset, .size (offset/size: the data stored after the flatbuffer, models > 2 GB).
MODEL_BUFFERS, MODEL_METADATA = 4, 6
METADATA_ENTRY_NAME, METADATA_ENTRY_BUFFER = 0, 1
BUFFER_DATA, BUFFER_OFFSET, BUFFER_SIZE = 0, 1, 2
# metadata_schema.fbs
MODEL_METADATA_SUBGRAPHS = 3           # ModelMetadata: name, description, version, subgraph_metadata
SUBGRAPH_INPUTS = 2                    # SubGraphMetadata: name, description, input_tensor_metadata
TENSOR_NAME, TENSOR_CONTENT, TENSOR_PROCESS_UNITS, TENSOR_STATS = 0, 3, 4, 5  # TensorMetadata
CONTENT_PROPERTIES_TYPE = 0            # Content: content_properties (union: type 0, value 1), range
PROCESS_UNIT_OPTIONS_TYPE, PROCESS_UNIT_OPTIONS = 0, 1  # ProcessUnit: options (union)
NORMALIZATION_MEAN, NORMALIZATION_STD = 0, 1              # NormalizationOptions: mean, std
STATS_MAX, STATS_MIN = 0, 1                               # Stats: max, min (max first)
#: ContentProperties union members (0: NONE).
CONTENT_KINDS = {1: "feature", 2: "image", 3: "bounding_box", 4: "audio"}
#: ProcessUnitOptions union member NormalizationOptions.
NORMALIZATION_OPTIONS = 1
#: The pixel range TFLite's image pipeline feeds (tflite_support metadata_info.InputImageTensorMd
#: _MIN_PIXEL / _MAX_PIXEL; the Task Library's ImagePreprocessor reads uint8 frames).
PIXEL_RANGE = (0.0, 255.0)


class MetadataError(ValueError):
    """The metadata cannot be read or says something impossible (std 0, min > max)."""


@dataclass(frozen=True)
class TensorMetadata:
    """What the tools use of one TensorMetadata (None: not given)."""

    name: str | None = None
    content: str | None = None  # CONTENT_KINDS' names, "unknown(N)", None: no Content
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    stats_min: tuple[float, ...] | None = None
    stats_max: tuple[float, ...] | None = None


class _Table:
    """A flatbuffer table at ``pos`` of ``buf``, every read checked against the buffer's end."""

    def __init__(self, buf: bytes, pos: int, what: str):
        self.buf, self.pos, self.what = buf, pos, what
        self.vtable = pos - _read(buf, "<i", pos, what)
        self.vsize = _read(buf, "<H", self.vtable, f"{what} vtable")
        if self.vsize < 4 or self.vsize % 2:
            raise MetadataError(f"{what}: bad vtable size {self.vsize}")
        _check(buf, self.vtable, self.vsize, f"{what} vtable")

    def _field(self, fid: int) -> int | None:
        slot = 4 + 2 * fid
        if slot >= self.vsize:
            return None
        off = _read(self.buf, "<H", self.vtable + slot, self.what)
        return self.pos + off if off else None

    def scalar(self, fid: int, fmt: str, default=0):
        p = self._field(fid)
        return default if p is None else _read(self.buf, fmt, p, self.what)

    def _target(self, fid: int) -> int | None:
        p = self._field(fid)
        return None if p is None else p + _read(self.buf, "<I", p, self.what)

    def table(self, fid: int, what: str) -> _Table | None:
        p = self._target(fid)
        return None if p is None else _Table(self.buf, p, f"{self.what}.{what}")

    def _vector(self, fid: int, elem: int, what: str) -> tuple[int, int] | None:
        p = self._target(fid)
        if p is None:
            return None
        n = _read(self.buf, "<I", p, f"{self.what}.{what}")
        _check(self.buf, p + 4, n * elem, f"{self.what}.{what} ({n} items)")
        return p + 4, n

    def tables(self, fid: int, what: str) -> list[_Table]:
        v = self._vector(fid, 4, what)
        if v is None:
            return []
        start, n = v
        return [_Table(self.buf, start + 4 * k + _read(self.buf, "<I", start + 4 * k, what), f"{self.what}.{what}[{k}]")
                for k in range(n)]

    def floats(self, fid: int, what: str) -> tuple[float, ...] | None:
        v = self._vector(fid, 4, what)
        return None if v is None else struct.unpack_from(f"<{v[1]}f", self.buf, v[0])

    def bytes(self, fid: int, what: str) -> bytes | None:
        v = self._vector(fid, 1, what)
        return None if v is None else bytes(self.buf[v[0]:v[0] + v[1]])

    def string(self, fid: int, what: str) -> str | None:
        b = self.bytes(fid, what)
        return None if b is None else b.decode("utf-8", errors="replace")


def _check(buf: bytes, pos: int, size: int, what: str) -> None:
    if pos < 0 or size < 0 or pos + size > len(buf):
        raise MetadataError(f"{what}: bytes {pos}..{pos + size} outside the {len(buf)}-byte buffer (truncated?)")


def _read(buf: bytes, fmt: str, pos: int, what: str):
    _check(buf, pos, struct.calcsize(fmt), what)
    return struct.unpack_from(fmt, buf, pos)[0]


def _root(buf: bytes, what: str) -> _Table:
    return _Table(buf, _read(buf, "<I", 0, what), what)


def metadata_buffer(model: bytes) -> bytes | None:
    """The bytes of the model's ``TFLITE_METADATA`` entry, None when it has none."""
    m = _root(model, "Model")
    for entry in m.tables(MODEL_METADATA, "metadata"):
        if entry.string(METADATA_ENTRY_NAME, "name") != METADATA_NAME:
            continue
        index = entry.scalar(METADATA_ENTRY_BUFFER, "<I")
        buffers = m.tables(MODEL_BUFFERS, "buffers")
        if index >= len(buffers):
            raise MetadataError(f"the {METADATA_NAME} entry names buffer {index}; the model has {len(buffers)}")
        b = buffers[index]
        offset, size = b.scalar(BUFFER_OFFSET, "<Q"), b.scalar(BUFFER_SIZE, "<Q")
        if offset > 1:  # schema.fbs: offset > 1 means the data follows the flatbuffer
            _check(model, offset, size, f"buffer {index}")
            return bytes(model[offset:offset + size])
        return b.bytes(BUFFER_DATA, "data") or b""
    return None


def parse_input_metadata(data: bytes) -> list[TensorMetadata]:
    """SubGraphMetadata 0's input_tensor_metadata of a ModelMetadata flatbuffer (MetadataError if
    it is not one or is damaged)."""
    if len(data) < 8 or data[4:8] != FILE_IDENTIFIER:
        raise MetadataError(f"not a ModelMetadata flatbuffer (file identifier {bytes(data[4:8])!r}, "
                            f"expected {FILE_IDENTIFIER!r})")
    subgraphs = _root(data, "ModelMetadata").tables(MODEL_METADATA_SUBGRAPHS, "subgraph_metadata")
    if not subgraphs:
        return []
    inputs = []
    for t in subgraphs[0].tables(SUBGRAPH_INPUTS, "input_tensor_metadata"):
        content = t.table(TENSOR_CONTENT, "content")
        kind = None
        if content is not None:
            code = content.scalar(CONTENT_PROPERTIES_TYPE, "<B")
            kind = CONTENT_KINDS.get(code, f"unknown({code})") if code else None
        mean = std = None
        for unit in t.tables(TENSOR_PROCESS_UNITS, "process_units"):
            if unit.scalar(PROCESS_UNIT_OPTIONS_TYPE, "<B") == NORMALIZATION_OPTIONS:
                options = unit.table(PROCESS_UNIT_OPTIONS, "options")
                if options is not None:
                    mean = options.floats(NORMALIZATION_MEAN, "mean")
                    std = options.floats(NORMALIZATION_STD, "std")
                break  # the first one, as the Task Library's GetNormalizationOptionsIfAny
        stats = t.table(TENSOR_STATS, "stats")
        inputs.append(TensorMetadata(
            t.string(TENSOR_NAME, "name"), kind, mean, std,
            stats.floats(STATS_MIN, "min") if stats else None, stats.floats(STATS_MAX, "max") if stats else None))
    return inputs


def read_input_metadata(model: bytes) -> list[TensorMetadata] | None:
    """The inputs' metadata of a .tflite (None: no TFLITE_METADATA entry; MetadataError: unreadable)."""
    data = metadata_buffer(model)
    return None if data is None else parse_input_metadata(data)


def _common_range(lows, highs, what: str) -> tuple[float, float]:
    """One range for all channels: the values every channel takes (the intersection, as the
    tools do for several QUANTIZE consumers), else, when channels do not overlap, their hull."""
    if any(not math.isfinite(v) for v in (*lows, *highs)):
        raise MetadataError(f"{what}: not finite ({list(lows)}, {list(highs)})")
    if any(lo > hi for lo, hi in zip(lows, highs)):
        raise MetadataError(f"{what}: min {list(lows)} > max {list(highs)}")
    low, high = max(lows), min(highs)
    return (float(low), float(high)) if low <= high else (float(min(lows)), float(max(highs)))


def _per_channel(a: tuple[float, ...], b: tuple[float, ...], what: str):
    """Pairs of two per-channel vectors; one value stands for every channel (metadata_schema.fbs)."""
    if not a or not b or (len(a) != len(b) and 1 not in (len(a), len(b))):
        raise MetadataError(f"{what}: {len(a)} and {len(b)} values (expected the same number, or one)")
    n = max(len(a), len(b))
    return [(a[k % len(a)], b[k % len(b)]) for k in range(n)]


def input_range(meta: TensorMetadata, dtype) -> tuple[tuple[float, float], str] | None:
    """The range of values the tensor takes, per its metadata, and which part said so:

    - ``Stats`` min/max: the tensor's own per-channel value range (in the tensor's units, as the
      metadata writers fill it: [0, 255] for a uint8 image input).
    - else ``NormalizationOptions`` of an image input (or one without Content): TFLite's image
      pipeline feeds pixels in [0, 255] - the Task Library's ImagePreprocessor writes them as they
      are into a uint8 tensor and ``(pixel - mean) / std`` into a float32 one - and
      tflite_support's metadata writer (metadata_info.InputImageTensorMd) derives the Stats the same
      way: float32 ``[(0 - mean) / std, (255 - mean) / std]`` per channel (here any float type),
      uint8 [0, 255]. So mean
      127.5, std 127.5 is a float input in [-1, 1] (raw pixels [0, 255]); mean 0, std 1 a float
      input in [0, 255]. An int8 tensor gets [-128, 127] (the schema's comment: int8 image data is
      scaled to [-128, 127]); other types, and feature/audio inputs, whose raw range the metadata
      does not say, get nothing from it.

    Per-channel ranges become one by _common_range. A value the metadata cannot mean (NaN, std 0,
    min > max, mismatched lengths) is a MetadataError."""
    dtype = np.dtype(dtype)
    if meta.stats_min or meta.stats_max:
        if not (meta.stats_min and meta.stats_max):
            raise MetadataError("Stats: min and max must both be given")
        pairs = _per_channel(meta.stats_min, meta.stats_max, "Stats")
        return _common_range([lo for lo, _ in pairs], [hi for _, hi in pairs], "Stats"), "metadata Stats"
    if (meta.mean is None and meta.std is None) or meta.content not in (None, "image"):
        return None
    pairs = _per_channel(meta.mean or (), meta.std or (), "NormalizationOptions mean/std")
    if any(not math.isfinite(m) or not math.isfinite(s) or s == 0 for m, s in pairs):
        raise MetadataError(f"NormalizationOptions: mean {list(meta.mean)}, std {list(meta.std)} (std must be "
                            f"finite and non-zero)")
    source = "metadata NormalizationOptions"
    if dtype == np.uint8 or dtype == np.int8:
        info = np.iinfo(dtype)
        return (float(info.min), float(info.max)), source
    if not np.issubdtype(dtype, np.floating):
        return None
    ends = [sorted(((PIXEL_RANGE[0] - m) / s, (PIXEL_RANGE[1] - m) / s)) for m, s in pairs]
    return _common_range([lo for lo, _ in ends], [hi for _, hi in ends], "NormalizationOptions"), source
