"""The shared-memory burst's wire format: NNAPI's fast message queue as one memfd and a doorbell.

The service creates a memfd sealed against shrinking and growing, passes it over a private unix
socket (SCM_RIGHTS); each request and each reply is then announced by a sequence number posted in
the page's last words, and a byte on that socket only to a side that sleeps (``service.doorbell``)::

    page 0 (HEADER_BYTES): request header, input/output descriptors | reply at REPLY_OFFSET |
                           the doorbell's words at WORDS_OFFSET
    DATA_OFFSET...:        the tensors' slots (``service.slots``): inputs, then outputs

This module only encodes and decodes; the client half is ``service.local_burst_client``, the
service half ``service.local_burst_server`` (which executes through ``service.execution``).
"""
from __future__ import annotations

import functools
import socket
import struct
from typing import NamedTuple

from hal.errors import HalError
from hal.executor import OutputShape
from hal.types import ErrorStatus

MAGIC = b"NNHB"
VERSION = 4  # 2: the request carries the loop timeout; 3: the reply carries flags (REPLY_SHARED);
#              4: posted words (service.doorbell)
HEADER_BYTES = 4096
REPLY_OFFSET = 2048
DATA_OFFSET = HEADER_BYTES
MAX_DIMS = 8
MAX_SLOT_BYTES = 1 << 30
HANDSHAKE = struct.Struct("<QI")  # slot memory size, the service's compute threads per execution

REQ = struct.Struct("<4sIQIIIqq")      # magic, version, seq, n_inputs, n_outputs, measure, timeout_ns,
#                                        loop_timeout_ns (0: NNAPI's default)
REQ_SEQ_AT = 8                         # the sequence number's offset in REQ
IN_DESC = struct.Struct("<I8IQQ")      # rank, dims[8], offset, length
OUT_DESC = struct.Struct("<QQ")        # offset, capacity
REP = struct.Struct("<QiIqqI")         # seq, status, message length, time on device, time in driver, flags
REP_STATUS_AT, REP_FLAGS_AT = 8, 32    # the offsets in REP of the fields a native client reads
#: Reply flag: the request the service served before this one was another client's. Clients then
#: block for their reply instead of polling (see ``service.local_burst_client.WaitStrategy``).
REPLY_SHARED = 1
MSG_OFFSET = REPLY_OFFSET + REP.size
MSG_MAX = 512
SHAPE = struct.Struct("<II8I")         # rank, is_sufficient, dims[8]
SHAPES_OFFSET = MSG_OFFSET + MSG_MAX
#: The doorbell's words (``service.doorbell.WORD``): the request's sequence number posted, the
#: service sleeping on the socket, the reply's sequence number posted, the client sleeping.
WORDS_OFFSET = HEADER_BYTES - 32
REQUEST_POSTED, SERVICE_WAITING, REPLY_POSTED, CLIENT_WAITING = (WORDS_OFFSET + 8 * k for k in range(4))


def max_io(n_outputs: int) -> int:
    """How many inputs fit in the request page next to n_outputs output descriptors."""
    return (REPLY_OFFSET - REQ.size - n_outputs * OUT_DESC.size) // IN_DESC.size


@functools.lru_cache(maxsize=256)  # asked for every request
def fits(n_inputs: int, n_outputs: int) -> bool:
    return (n_inputs <= max_io(n_outputs)
            and SHAPES_OFFSET + n_outputs * SHAPE.size <= WORDS_OFFSET)


# ---- requests -------------------------------------------------------------------------------------

class RequestHeader(NamedTuple):
    """A request's header as read (a tuple: decoded for every request)."""

    seq: int
    n_inputs: int
    n_outputs: int
    measure: bool
    timeout_ns: int
    loop_timeout_ns: int
    #: The descriptors' bytes: two requests with equal layouts read and write the same slots.
    layout: bytes


def write_request(view: memoryview, seq: int, inputs: list[tuple[tuple[int, ...], int, int]],
                  outputs: list[tuple[int, int]], measure: bool, timeout_ns: int, loop_timeout_ns: int) -> None:
    """``inputs``: (dims, slot offset, bytes); ``outputs``: (slot offset, capacity); offsets from DATA_OFFSET."""
    write_header(view, seq, len(inputs), len(outputs), measure, timeout_ns, loop_timeout_ns)
    write_descriptors(view, inputs, outputs)


def write_header(view: memoryview, seq: int, n_inputs: int, n_outputs: int, measure: bool, timeout_ns: int,
                 loop_timeout_ns: int) -> None:
    """The request header alone: the descriptors after it stay as the last ``write_descriptors`` left them."""
    REQ.pack_into(view, 0, MAGIC, VERSION, seq, n_inputs, n_outputs, int(measure), timeout_ns, loop_timeout_ns)


def write_descriptors(view: memoryview, inputs: list[tuple[tuple[int, ...], int, int]],
                      outputs: list[tuple[int, int]]) -> None:
    pos = REQ.size
    for dims, off, n in inputs:
        IN_DESC.pack_into(view, pos, len(dims), *dims, *[0] * (MAX_DIMS - len(dims)), off, n)
        pos += IN_DESC.size
    for off, cap in outputs:
        OUT_DESC.pack_into(view, pos, off, cap)
        pos += OUT_DESC.size


def read_request(view: memoryview) -> RequestHeader:
    """The request header; INVALID_ARGUMENT for a header that is not this version's or does not fit."""
    magic, version, seq, n_in, n_out, measure, timeout_ns, loop_ns = REQ.unpack_from(view, 0)
    if magic != MAGIC or version != VERSION:
        raise HalError(ErrorStatus.INVALID_ARGUMENT, f"bad local burst header {magic!r} v{version}")
    if not fits(n_in, n_out):
        raise HalError(ErrorStatus.INVALID_ARGUMENT, f"{n_in} inputs / {n_out} outputs do not fit")
    layout = bytes(view[REQ.size:REQ.size + n_in * IN_DESC.size + n_out * OUT_DESC.size])
    return RequestHeader(seq, n_in, n_out, bool(measure), timeout_ns, loop_ns, layout)


def request_key(view: memoryview, header: RequestHeader) -> tuple[bytes, bytes, int]:
    """The bytes of the request ``header`` was read from (``view``), but its sequence number: what
    ``same_request`` compares a later request with."""
    raw = bytes(view[:REQ.size + len(header.layout)])
    return raw[:REQ_SEQ_AT], raw[REQ_SEQ_AT + 8:], len(raw)


def same_request(view: memoryview, key: tuple[bytes, bytes, int]) -> int | None:
    """The sequence number of the request in ``view`` when it is byte for byte the one ``key`` was
    taken of (``request_key``) but for that number, else None: a burst's every request but the
    first, whose header then needs no decoding."""
    raw = bytes(view[:key[2]])
    if raw.endswith(key[1]) and raw.startswith(key[0]):  # the key's parts are len(raw) bytes but 8
        return int.from_bytes(raw[REQ_SEQ_AT:REQ_SEQ_AT + 8], "little")
    return None


def read_descriptors(header: RequestHeader) -> tuple[list[tuple[tuple[int, ...], int, int]], list[tuple[int, int]]]:
    """The header's (dims, offset, length) per input and (offset, capacity) per output."""
    inputs, pos = [], 0
    for _ in range(header.n_inputs):
        rank, *rest = IN_DESC.unpack_from(header.layout, pos)
        pos += IN_DESC.size
        if rank > MAX_DIMS:
            raise HalError(ErrorStatus.INVALID_ARGUMENT, f"input rank {rank} > {MAX_DIMS}")
        inputs.append((tuple(rest[:rank]), rest[8], rest[9]))
    outputs = []
    for _ in range(header.n_outputs):
        outputs.append(OUT_DESC.unpack_from(header.layout, pos))
        pos += OUT_DESC.size
    return inputs, outputs


# ---- replies --------------------------------------------------------------------------------------

class Reply(NamedTuple):
    """A reply as read (a tuple: decoded for every request)."""

    seq: int
    status: int
    message: str
    shapes: list[tuple[int, ...]]
    time_on_device_ns: int
    time_in_driver_ns: int
    shared: bool
    #: The output shape records as read: equal bytes, equal shapes (see read_reply's ``known``).
    shapes_raw: bytes = b""


#: A Reply from its fields' tuple, without NamedTuple's keyword-handling constructor (every reply is one).
_new_reply = tuple.__new__


def pack_shapes(shapes: list[OutputShape]) -> bytes:
    """The reply's output shape records (a bound execution's are packed once and reused)."""
    out = bytearray()
    for s in shapes[: (WORDS_OFFSET - SHAPES_OFFSET) // SHAPE.size]:
        dims = list(s.dimensions[:MAX_DIMS]) + [0] * (MAX_DIMS - min(len(s.dimensions), MAX_DIMS))
        out += SHAPE.pack(len(s.dimensions), int(s.is_sufficient), *dims)
    return bytes(out)


def write_reply(view: memoryview, seq: int, status: int, message: str, shapes: bytes, t_dev: int,
                t_drv: int, shared: bool) -> None:
    """``shapes``: the output shape records (``pack_shapes``)."""
    raw = message.encode()[:MSG_MAX] if message else b""
    REP.pack_into(view, REPLY_OFFSET, seq, int(status), len(raw), t_dev, t_drv, REPLY_SHARED if shared else 0)
    if raw:
        view[MSG_OFFSET:MSG_OFFSET + len(raw)] = raw
    view[SHAPES_OFFSET:SHAPES_OFFSET + len(shapes)] = shapes


def write_success(view: memoryview, seq: int, t_dev: int, t_drv: int, shared: bool) -> None:
    """A successful reply whose output shape records are already in place (``write_reply`` wrote
    them for an earlier reply, and nothing has written that area since): the fixed part alone."""
    REP.pack_into(view, REPLY_OFFSET, seq, 0, 0, t_dev, t_drv, REPLY_SHARED if shared else 0)


def read_reply(view: memoryview, n_outputs: int, known: tuple[bytes, list[tuple[int, ...]]] | None = None) -> Reply:
    """The reply; ``known``: (raw bytes, shapes) of output shapes read before, reused when the
    reply's shape records are those same bytes (a static model's every reply)."""
    seq, status, mlen, t_dev, t_drv, flags = REP.unpack_from(view, REPLY_OFFSET)
    message = bytes(view[MSG_OFFSET:MSG_OFFSET + min(mlen, MSG_MAX)]).decode(errors="replace") if mlen else ""
    raw = bytes(view[SHAPES_OFFSET:SHAPES_OFFSET + n_outputs * SHAPE.size])
    if known is not None and known[0] == raw:
        shapes = known[1]
    else:
        shapes = []
        for k in range(n_outputs):
            rank, _, *dims = SHAPE.unpack_from(raw, k * SHAPE.size)
            shapes.append(tuple(dims[:min(rank, MAX_DIMS)]))
    return _new_reply(Reply, (seq, status, message, shapes, t_dev, t_drv, bool(flags & REPLY_SHARED), raw))


def read_success(view: memoryview, known: tuple[bytes, list[tuple[int, ...]]]) -> Reply | None:
    """``read_reply`` for the common case: a success whose output shape records are ``known``'s
    bytes, read without copying them or reading a message; None for any other reply."""
    seq, status, _, t_dev, t_drv, flags = REP.unpack_from(view, REPLY_OFFSET)
    raw = known[0]
    if status or view[SHAPES_OFFSET:SHAPES_OFFSET + len(raw)] != raw:
        return None
    return _new_reply(Reply, (seq, 0, "", known[1], t_dev, t_drv, bool(flags & REPLY_SHARED), raw))


# ---- the handshake -------------------------------------------------------------------------------

def recv_exact(conn: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = conn.recv(n - len(buf))
        if not chunk:
            break
        buf += chunk
    return buf
