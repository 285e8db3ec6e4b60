"""Part (a): VTS-style model validation. One field of a valid model changed per case, at the wire
level (the proto the client sends, so values a hal dataclass would never hold get through:
unknown lifetimes and types, uint64 offsets, NaN scales), then getSupportedOperations,
prepareModel and, when prepared, one execution through the client library. A prepared model's
outputs must equal hal's reference backend's on the same mutated model, in this process.

Mutations follow AOSP's VTS ValidateModel (operand type, rank, scale, zero point, lifetime,
location, operation type, operand indexes, removed / added operands, operations, inputs and
outputs, execution order) plus what nnhal's wire adds (pools, extension prefixes and codes,
per-channel parameters, prepare options).
"""
from __future__ import annotations

import time

import numpy as np

from hal.errors import HalError
from hal.types import SCALAR_TYPES, ErrorStatus, OperandType, OperationType
from service import convert
from service.proto import nnhal_pb2 as pb
from tests.fuzz.core import Death, Hang, Service, Tally, call, compare, status_outcome
from tests.fuzz.seeds import Seed

U32 = [0, 1, 2, 3, 7, 255, 256, 65535, 65536, 2**31 - 1, 2**31, 2**32 - 1]
I32 = [0, 1, -1, 2, 127, 128, 255, 256, -128, -129, 32767, -32768, 65535, 2**31 - 1, -2**31]
U64 = [0, 1, 4, 63, 64, 4096, 2**31, 2**32 - 1, 2**32, 2**63 - 1, 2**63, 2**64 - 1]
F32 = [0.0, -0.0, 1.0, -1.0, 0.5, 1e-45, 1e-38, 3.4e38, float("inf"), float("-inf"), float("nan"), 1e-3, 255.0]
OPERAND_TYPES = [int(t) for t in OperandType]
OPERATION_TYPES = [int(t) for t in OperationType]


def _pick(rng, seq):
    return seq[int(rng.integers(len(seq)))]


def _u32(rng, current: int) -> int:
    return int(_pick(rng, U32 + [current + 1, max(current - 1, 0), current * 2]) % 2**32)


def _index_value(rng, n: int) -> int:
    """An operand index: mostly valid ones (other operands), sometimes out of range."""
    return int(rng.integers(n)) if rng.random() < 0.7 else int(_pick(rng, [n, n + 1, 2**31, 2**32 - 1]))


def _ext_code(rng, m: pb.Model) -> int:
    prefixes = [e.prefix for e in m.extension_name_to_prefix] or [1]
    return (int(_pick(rng, prefixes + [0x7FFF, 5])) << 16) | int(_pick(rng, [0, 1, 2, 7, 0xFFFF]))


# ---- mutators: each changes one thing in (model, prepare request), returns what it did ----------
def m_operand_type(rng, m, req):
    i, o = _operand(rng, m)
    r = rng.random()
    o.type = (_pick(rng, [t for t in OPERAND_TYPES if t != o.type]) if r < 0.7 else
              _pick(rng, [16, 17, 100, -1, 2**31 - 1]) if r < 0.85 else _ext_code(rng, m))
    return f"operand {i} type -> {o.type}"


def m_operand_rank(rng, m, req):
    i, o = _operand(rng, m)
    dims = list(o.dimensions)
    r = rng.random()
    if dims and r < 0.4:
        del dims[int(rng.integers(len(dims)))]
    elif r < 0.9:
        dims.insert(int(rng.integers(len(dims) + 1)), int(_pick(rng, [1, 1, 2, 3])))
    else:
        dims = []
    o.ClearField("dimensions")
    o.dimensions.extend(dims)
    return f"operand {i} dimensions -> {dims}"


def m_operand_dimension(rng, m, req):
    i, o = _operand(rng, m, lambda o: len(o.dimensions) > 0)
    if o is None:
        return None
    a = int(rng.integers(len(o.dimensions)))
    o.dimensions[a] = _u32(rng, o.dimensions[a])
    return f"operand {i} dimension {a} -> {o.dimensions[a]}"


def m_operand_scale(rng, m, req):
    i, o = _operand(rng, m)
    o.scale = float(_pick(rng, F32 + [o.scale * 2, o.scale / 2, -o.scale]))
    return f"operand {i} scale -> {o.scale}"


def m_operand_zero_point(rng, m, req):
    i, o = _operand(rng, m)
    o.zero_point = int(_pick(rng, I32 + [o.zero_point + 1, o.zero_point - 1]))
    return f"operand {i} zero_point -> {o.zero_point}"


def m_operand_lifetime(rng, m, req):
    i, o = _operand(rng, m)
    o.lifetime = int(_pick(rng, [v for v in range(8) if v != o.lifetime] + [8, 100, -1]))
    return f"operand {i} lifetime -> {o.lifetime}"


def m_operand_location(rng, m, req):
    i, o = _operand(rng, m, lambda o: o.lifetime in (3, 4)) if rng.random() < 0.8 else _operand(rng, m)
    if o is None:
        return None
    f = _pick(rng, ["pool_index", "offset", "length"])
    cur = getattr(o.location, f)
    v = _pick(rng, (U32 if f == "pool_index" else U64) + [cur + 1, max(cur - 1, 0), cur + 4])
    setattr(o.location, f, int(v) % (2**32 if f == "pool_index" else 2**64))
    return f"operand {i} location.{f} -> {getattr(o.location, f)}"


def m_channel_quant(rng, m, req):
    i, o = _operand(rng, m, lambda o: o.HasField("channel_quant"))
    if o is None:
        i, o = _operand(rng, m)
    if not o.HasField("channel_quant") or rng.random() < 0.1:
        o.channel_quant.scales.extend([0.5] * int(rng.integers(1, 4)))
        return f"operand {i} gets channel_quant"
    cq = o.channel_quant
    r = rng.random()
    if r < 0.3 and len(cq.scales):
        del cq.scales[int(rng.integers(len(cq.scales)))]
    elif r < 0.5:
        cq.scales.append(0.25)
    elif r < 0.8 and len(cq.scales):
        cq.scales[int(rng.integers(len(cq.scales)))] = float(_pick(rng, F32))
    else:
        cq.channel_dim = _u32(rng, cq.channel_dim)
    return f"operand {i} channel_quant -> {list(cq.scales)[:6]} dim {cq.channel_dim}"


def m_extension_params(rng, m, req):
    i, o = _operand(rng, m)
    o.extension = bytes(int(rng.integers(0, 9)))
    return f"operand {i} extension params {len(o.extension)} bytes"


def m_operation_type(rng, m, req):
    k, op = _operation(rng, m)
    r = rng.random()
    op.type = (_pick(rng, [t for t in OPERATION_TYPES if t != op.type]) if r < 0.7 else
               _pick(rng, [106, 200, 0xFFFF, -1, 2**31 - 1]) if r < 0.85 else _ext_code(rng, m))
    return f"operation {k} type -> {op.type}"


def m_operation_index(rng, m, req):
    k, op = _operation(rng, m)
    what = "input" if rng.random() < 0.7 or not op.outputs else "output"
    field = getattr(op, what + "s")
    if not field:
        return None
    j = int(rng.integers(len(field)))
    field[j] = _index_value(rng, len(m.main.operands)) % 2**32
    return f"operation {k} {what} {j} -> operand {field[j]}"


def m_operation_arity(rng, m, req):
    k, op = _operation(rng, m)
    what = "input" if rng.random() < 0.6 else "output"
    field = getattr(op, what + "s")
    if len(field) and rng.random() < 0.5:
        j = int(rng.integers(len(field)))
        del field[j]
        return f"operation {k} loses {what} {j}"
    field.append(_index_value(rng, len(m.main.operands)) % 2**32)
    return f"operation {k} gets extra {what} operand {field[-1]}"


def m_operation_order(rng, m, req):
    ops = m.main.operations
    r = rng.random()
    if len(ops) > 1 and r < 0.4:
        i, j = rng.choice(len(ops), 2, replace=False)
        a, b = pb.Operation(), pb.Operation()
        a.CopyFrom(ops[int(i)])
        b.CopyFrom(ops[int(j)])
        ops[int(i)].CopyFrom(b)
        ops[int(j)].CopyFrom(a)
        return f"operations {int(i)} and {int(j)} swapped"
    if r < 0.7:
        k = int(rng.integers(len(ops)))
        del ops[k]
        return f"operation {k} removed"
    k = int(rng.integers(len(ops)))
    ops.add().CopyFrom(ops[k])
    return f"operation {k} duplicated"


def m_remove_operand(rng, m, req):
    """VTS removeOperandTest: drop operand i; references to later operands shift down."""
    sg = m.main
    i = int(rng.integers(len(sg.operands)))
    del sg.operands[i]

    def shift(field):
        vals = [v - 1 if v > i else v for v in field]
        del field[:]
        field.extend(vals)
    for op in sg.operations:
        shift(op.inputs)
        shift(op.outputs)
    shift(sg.input_indexes)
    shift(sg.output_indexes)
    return f"operand {i} removed"


def m_io_lists(rng, m, req):
    sg = m.main
    what = "inputs" if rng.random() < 0.5 else "outputs"
    field = getattr(sg, what[:-1] + "_indexes")
    r = rng.random()
    if len(field) and r < 0.3:
        del field[int(rng.integers(len(field)))]
    elif r < 0.55:
        field.append(_index_value(rng, len(sg.operands)) % 2**32)
    elif len(field) and r < 0.75:
        field.append(field[int(rng.integers(len(field)))])
    elif len(field) > 1 and r < 0.9:
        vals = list(field)
        rng.shuffle(vals)
        del field[:]
        field.extend(vals)
    elif len(field):
        field[int(rng.integers(len(field)))] = _index_value(rng, len(sg.operands)) % 2**32
    return f"model {what} -> {list(field)[:8]}"


def m_operand_values(rng, m, req):
    v = m.operand_values
    r = rng.random()
    m.operand_values = (v[:int(rng.integers(len(v) + 1))] if r < 0.5 and v else
                        v + bytes(int(rng.integers(1, 9))) if r < 0.8 else b"")
    return f"operand_values {len(v)} -> {len(m.operand_values)} bytes"


def m_pools(rng, m, req):
    r = rng.random()
    if len(m.pools) and r < 0.25:
        k = int(rng.integers(len(m.pools)))
        del m.pools[k]
        return f"pool {k} removed"
    if len(m.pools) and r < 0.45:
        p = m.pools[int(rng.integers(len(m.pools)))]
        if p.WhichOneof("kind") == "inline_data":
            p.inline_data = p.inline_data[:int(rng.integers(len(p.inline_data) + 1))]
            return f"pool truncated to {len(p.inline_data)} bytes"
    target = m.pools[int(rng.integers(len(m.pools)))] if len(m.pools) and r < 0.8 else m.pools.add()
    kind = _pick(rng, ["shared", "driver_buffer", "burst_pool", "inline_data"])
    if kind == "shared":
        target.shared.name = _pick(rng, ["nnhal-fuzz-missing", "../../etc/passwd", "", "/", "x" * 300, "nnhal-\0x"])
        target.shared.size = int(_pick(rng, U64))
    elif kind == "driver_buffer":
        target.driver_buffer = int(_pick(rng, U64))
    elif kind == "burst_pool":
        target.burst_pool = int(_pick(rng, U64))
    else:
        target.inline_data = bytes(int(rng.integers(0, 64)))
    return f"a pool becomes {kind}"


def m_extensions(rng, m, req):
    ext = m.extension_name_to_prefix
    r = rng.random()
    if len(ext) and r < 0.3:
        ext[int(rng.integers(len(ext)))].prefix = int(_pick(rng, [0, 1, 0x7FFF, 0x8000, 2**32 - 1]))
    elif len(ext) and r < 0.5:
        ext.add(name=ext[0].name, prefix=ext[0].prefix + 1)
    elif len(ext) and r < 0.65:
        del ext[0]
    elif len(ext) and r < 0.8:
        ext[0].name = _pick(rng, ["com.example.unknown", "", "com.nnhal.maxpool_argmax"])
    else:
        ext.add(name=_pick(rng, ["com.example.unknown", "com.nnhal.maxpool_argmax", "com.example.fibonacci"]),
                prefix=int(_pick(rng, [1, 2, 3, 9, 0x7FFF])))
    return f"extension_name_to_prefix -> {[(e.name, e.prefix) for e in ext]}"


def m_constant_value(rng, m, req):
    """A constant's bytes (a scalar parameter: padding code, stride, axis, activation; or one
    element of a weight tensor): still a valid model, often, with other semantics."""
    i, o = _operand(rng, m, lambda o: o.lifetime == 3 and o.location.length > 0)
    if o is None:
        return None
    v = bytearray(m.operand_values)
    size = 1 if o.type in (6, 9) else 2 if o.type in (7, 8, 10, 12) else 1 if o.type in (5, 11, 13, 14) else 4
    start, n = o.location.offset, o.location.length
    if start + n > len(v) or n < size:
        return None
    at = start + int(rng.integers(n // size)) * size
    if o.type in (0, 3):  # float32
        val = np.float32(_pick(rng, F32 + [2.0, -3.0])).tobytes()
    elif size == 4:
        val = int(_pick(rng, I32 + [3, 4, 5, 10, 100]) & 0xFFFFFFFF).to_bytes(4, "little")
    else:
        val = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
    v[at:at + size] = val
    m.operand_values = bytes(v)
    return f"operand {i} value at byte {at - start} -> {val.hex()}"


def m_prepare_options(rng, m, req):
    f = _pick(rng, ["preference", "priority", "token", "timeout_ns", "relax", "referenced"])
    if f in ("preference", "priority"):
        setattr(req, f, int(_pick(rng, [-1, 0, 2, 3, 100, 2**31 - 1])))
    elif f == "token":
        req.token = bytes(rng.integers(0, 256, int(_pick(rng, [1, 31, 32, 32, 33]))).astype(np.uint8))
    elif f == "timeout_ns":
        req.timeout_ns = int(_pick(rng, [1, -1, 1000, 2**63 - 1]))
    elif f == "relax":
        m.relax_computation_float32_to_float16 = not m.relax_computation_float32_to_float16
    else:
        m.referenced.add().CopyFrom(m.main)
    return f"prepare option {f} changed"


MUTATORS = {f.__name__[2:]: f for f in (
    m_operand_type, m_operand_rank, m_operand_dimension, m_operand_scale, m_operand_zero_point, m_operand_lifetime,
    m_operand_location, m_channel_quant, m_extension_params, m_operation_type, m_operation_index, m_operation_arity,
    m_operation_order, m_remove_operand, m_io_lists, m_operand_values, m_pools, m_extensions, m_prepare_options,
    m_constant_value)}
#: Operand fields are where most of a model's surface is: they are drawn more often.
WEIGHTS = {"operand_type": 3, "operand_rank": 2, "operand_dimension": 3, "operand_scale": 2, "operand_zero_point": 2,
           "operand_lifetime": 2, "operand_location": 2, "operation_type": 2, "operation_index": 2,
           "constant_value": 4}

def _operand(rng, m, want=None):
    """(index, operand) of a random operand (one ``want`` accepts), or (-1, None)."""
    ops = m.main.operands
    choices = [i for i in range(len(ops)) if want is None or want(ops[i])]
    if not choices:
        return -1, None
    i = int(_pick(rng, choices))
    return i, ops[i]


def _operation(rng, m):
    k = int(rng.integers(len(m.main.operations)))
    return k, m.main.operations[k]


# ---- one case --------------------------------------------------------------------------------
def _hal_model(proto: pb.Model):
    """The mutated model as hal sees it in this process (inline pools only: anything else has no
    bytes here, and the service must refuse it)."""
    def resolve(mem: pb.Memory):
        if mem.WhichOneof("kind") != "inline_data":
            raise HalError(ErrorStatus.INVALID_ARGUMENT, "not an inline pool")
        return mem.inline_data
    return convert.model_from_proto(proto, resolve)


def make_inputs(model, seed: Seed, rng) -> list | None:
    """Inputs for the (mutated) model: the seed's where they still fit its operand, else random
    values of the operand's type and shape (unknown dimensions: 1-3). None: the inputs cannot be
    built (an input type without an element type)."""
    from hal.extension_registry import model_prefixes, operand_dtype
    known = dict(zip(seed.model.main.input_indexes, seed.inputs or []))
    prefixes = model_prefixes(model)
    out = []
    for idx in model.main.input_indexes:
        op = model.main.operands[idx]
        try:
            dtype = operand_dtype(op.type, prefixes)
        except HalError:
            return None
        x = known.get(idx, "absent")
        if x is None and idx in known:
            out.append(None)
            continue
        scalar = op.type in SCALAR_TYPES
        dims = tuple(op.dimensions)
        if isinstance(x, np.ndarray) and x.dtype == dtype and (
                (scalar and x.shape == ()) or (not scalar and (not dims or (
                    len(dims) == x.ndim and all(d in (0, s) for d, s in zip(dims, x.shape)))))):
            out.append(x)
            continue
        shape = () if scalar else tuple(d or int(rng.integers(1, 4)) for d in (dims or (2,)))
        if np.prod(shape, dtype=np.float64) * dtype.itemsize > 16 << 20:
            return None  # a mutated dimension made the input huge: not worth a case
        if dtype.kind == "f":
            x = rng.uniform(-2, 2, shape).astype(dtype)
        elif dtype.kind == "b":
            x = rng.random(shape) < 0.5
        elif dtype in (np.int32, np.int64, np.uint32):
            x = rng.integers(0, 4, shape).astype(dtype)
        else:
            info = np.iinfo(dtype)
            x = rng.integers(info.min, info.max, shape, endpoint=True).astype(dtype)
        out.append(x)
    return out


def _reference(model, inputs):
    """hal's reference backend on the mutated model, in this process: outputs, or the refusal."""
    from hal.compiler import compile_model
    from hal.executor import execute
    try:
        return execute(compile_model(model, backend_order=["reference"]), inputs), None
    except HalError as e:
        return None, f"reference refuses: {e}"
    except Exception as e:  # noqa: BLE001 - hal raising anything else in-process is worth listing
        return None, f"reference raised {e!r}"


def run_case(service: Service, seed: Seed, rng, tally: Tally, where: str) -> None:
    mutation = _pick(rng, [n for n in MUTATORS for _ in range(WEIGHTS.get(n, 1))])
    proto = convert.model_to_proto(seed.model)
    req = pb.PrepareModelRequest(preference=1, priority=1)
    what = MUTATORS[mutation](rng, proto, req)
    if what is None:
        mutation, what = "operand_type", m_operand_type(rng, proto, req)
    req.model.CopyFrom(proto)
    where = f"{where} {seed.name}: {what}"
    outcome, detail = _prepare_and_run(service, seed, proto, req, rng)
    tally.add(outcome, mutation, where, detail)


def _prepare_and_run(service: Service, seed: Seed, proto: pb.Model, req: pb.PrepareModelRequest, rng):
    from service.client import RemotePreparedModel, ServiceError, ServiceTimeoutError, ServiceUnavailableError
    c = service.client
    try:
        sup = call(c.device.GetSupportedOperations, pb.SupportedOperationsRequest(model=proto))
        if sup is not None and sup.status.code and status_outcome(sup.status.code, sup.status.message) != "refused":
            return status_outcome(sup.status.code, sup.status.message), f"getSupportedOperations: {sup.status.message}"
        reply = call(c.device.PrepareModel, req, client=c)
    except Hang as e:
        return "hang", f"prepare: {e}"
    except Death as e:
        return ("death" if service.check("prepare") else "transport_error"), f"prepare: {e}"
    if reply is None:
        return "refused", "over the message size limit"
    if reply.status.code:
        return status_outcome(reply.status.code, reply.status.message), reply.status.message
    pm = None
    try:
        model = _hal_model(proto)
        inputs = make_inputs(model, seed, rng)
        if inputs is None:
            return "unverified", "prepared, but no inputs can be built for it"
        pm = RemotePreparedModel(c, reply.prepared_model_id, model)
        t0 = time.monotonic()
        try:
            got = pm.execute(inputs).outputs
        except ServiceTimeoutError as e:
            return "hang", f"execute ({time.monotonic() - t0:.0f} s): {e}"
        except ServiceUnavailableError as e:
            return ("death" if service.check("execute") else "transport_error"), f"execute: {e}"
        except ServiceError as e:
            return status_outcome(int(e.status), e.message), e.message
        want, why = _reference(model, inputs)
        if want is None:
            return "unverified", f"the service ran it; {why}"
        loose = model.relax_computation_float32_to_float16 or any(
            o.type in (OperandType.TENSOR_FLOAT16, OperandType.FLOAT16) for o in model.main.operands)
        for k, (g, w) in enumerate(zip(got, want)):
            msg = compare(g, w, loose)
            if msg:
                return "wrong", f"output {k}: {msg}"
        return "ok", ""
    except HalError as e:
        return "unverified", f"client-side: {e}"
    finally:
        if pm is not None:
            try:
                pm.release()
            except Exception:  # noqa: BLE001 - a dead service: counted above
                pass
