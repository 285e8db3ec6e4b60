"""Part (b): request mutation. Valid prepared models; each case builds a valid request (arguments
inline or in a shared-memory pool of the case's own, the rest of the pool filled with canary
bytes), changes one thing (an offset, length, pool index, pool reference, capacity, dimensions,
argument count, has_no_value, the execution's fields, a burst's pool registration) and sends it
as a raw ExecuteRequest, unary or on a burst stream.

The oracle is this module's own reading of the request under NNAPI's rules (``expect``): refused,
or these outputs (hal's reference backend on the inputs the request designates). The service
must refuse or give exactly those; either way it must not write the pool outside the output
ranges the request gave it.
"""
from __future__ import annotations

import math
import os
import queue
import uuid
from dataclasses import dataclass
from multiprocessing import shared_memory

import grpc
import numpy as np

from hal.errors import HalError
from hal.types import SCALAR_TYPES, OperandType
from service.proto import nnhal_pb2 as pb
from service.proto import nnhal_pb2_grpc as pb_grpc
from tests.fuzz.core import CALL_BOUND_S, Death, Hang, Service, Tally, call, compare, status_outcome
from tests.fuzz.models import U32, U64, _pick, make_inputs
from tests.fuzz.seeds import Seed

MAX_MESSAGE_BYTES = 64 << 20  # the service's inline limit (service.servicer.MAX_MESSAGE_BYTES)
BURST_POOL = 1


@dataclass
class Prepared:
    seed: Seed
    id: str
    ref: object  # hal CompiledModel on the reference backend
    inputs: list
    in_ops: list
    out_ops: list
    out_nbytes: list[int]
    loose: bool


#: Prepared-model ids of another session of the service under test (set by PreparedSeeds).
FOREIGN_IDS: list[str] = []


class PreparedSeeds:
    """Up to ``limit`` seeds prepared once on the service for every case of the part."""

    def __init__(self, service: Service, seeds: list[Seed], limit: int = 16):
        from hal.compiler import compile_model
        from hal.executor import execute
        from service.client import Client
        self.client = Client.connect(service.address)  # its own session: released at exit
        self.items: list[Prepared] = []
        step = max(1, len(seeds) // limit)
        rng = np.random.default_rng(0)
        for seed in seeds[::step][:limit]:
            m = seed.model
            inputs = make_inputs(m, seed, rng)
            if inputs is None:
                continue
            try:
                ref = compile_model(m, backend_order=["reference"])
                outs = execute(ref, inputs)
                pm = self.client.prepare_model(m)
            except Exception:  # noqa: BLE001 - a seed the service does not take is not a request case
                continue
            sg = m.main
            loose = m.relax_computation_float32_to_float16 or any(
                o.type in (OperandType.TENSOR_FLOAT16, OperandType.FLOAT16) for o in sg.operands)
            self.items.append(Prepared(seed, pm.id, ref, inputs, [sg.operands[i] for i in sg.input_indexes],
                                       [sg.operands[i] for i in sg.output_indexes], [o.nbytes for o in outs], loose))
        if not self.items:
            raise RuntimeError("no seed model could be prepared for request mutation")
        # Another client's prepared model (issue 34): its id, named by this client, must be unknown.
        self.other = Client.connect(service.address)
        FOREIGN_IDS[:] = [self.other.prepare_model(self.items[0].seed.model).id]

    def __enter__(self) -> "PreparedSeeds":
        return self

    def __exit__(self, *exc) -> None:
        FOREIGN_IDS.clear()
        for c in (self.client, self.other):
            try:
                c.close()
            except Exception:  # noqa: BLE001 - a service that died: counted by the cases
                pass


# ---- the valid request and its pool ------------------------------------------------------------
class CasePool:
    """The case's shared memory: arguments at 64-byte aligned offsets, canary bytes elsewhere."""

    def __init__(self, rng, size: int):
        self.shm = shared_memory.SharedMemory(name=f"nnhal-fuzz-{uuid.uuid4().hex[:12]}", create=True, size=size)
        self.size = size
        self.shm.buf[:size] = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
        self.before = b""
        self.decoys: dict[str, bytes] = {}
        self.metadata: list | None = None  # the call's metadata when a mutation replaces the session

    def snapshot(self) -> None:
        self.before = bytes(self.shm.buf[:self.size])

    def ref(self) -> pb.Memory:
        return pb.Memory(shared=pb.SharedMemoryRef(name=self.shm.name, size=self.size))

    def decoy(self, rng) -> str:
        """A file in /dev/shm a client must never get the service to read or write (issue 34): a
        same-user 0600 file without nnhal's prefix, an nnhal-named one others may read (0644), or
        a second link to this very pool. Its bytes are checked unchanged when the case closes."""
        kind = _pick(rng, ["unprefixed", "wide", "link"])
        name = f"{'fuzz-victim' if kind == 'unprefixed' else 'nnhal-fuzz-' + kind}-{uuid.uuid4().hex[:12]}"
        path = os.path.join("/dev/shm", name)
        if kind == "link":
            os.link(os.path.join("/dev/shm", self.shm.name), path)
        else:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600 if kind == "unprefixed" else 0o644)
            with os.fdopen(fd, "wb") as f:
                f.write(rng.integers(0, 256, self.size, dtype=np.uint8).tobytes())
            os.chmod(path, 0o600 if kind == "unprefixed" else 0o644)  # whatever the umask
        with open(path, "rb") as f:
            self.decoys[path] = f.read()
        return name

    def decoys_changed(self) -> str | None:
        """A decoy whose bytes changed (the service wrote where no client may make it write)."""
        for path, before in self.decoys.items():
            with open(path, "rb") as f:
                if f.read() != before:
                    return f"decoy {path} was written"
        return None

    def close(self) -> None:
        for path in self.decoys:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        self.shm.close()
        self.shm.unlink()


def build(p: Prepared, rng) -> tuple[pb.Request, CasePool]:
    sizes = [0 if x is None else x.nbytes for x in p.inputs] + list(p.out_nbytes)
    where = ["pool" if rng.random() < 0.6 else "inline" for _ in sizes]
    offsets, off = [], int(rng.integers(0, 3)) * 64
    for s in sizes:
        offsets.append(off)
        off += (s + 63) // 64 * 64 + int(rng.integers(0, 2)) * 64
    pool = CasePool(rng, off + 64)
    req = pb.Request(pools=[pool.ref()])
    for k, x in enumerate(p.inputs):
        if x is None:
            req.inputs.add(has_no_value=True)
        elif where[k] == "pool":
            pool.shm.buf[offsets[k]:offsets[k] + x.nbytes] = x.tobytes()
            req.inputs.add(location=pb.DataLocation(pool_index=0, offset=offsets[k], length=x.nbytes),
                           dimensions=list(x.shape))
        else:
            req.inputs.add(data=x.tobytes(), dimensions=list(x.shape))
    for j, n in enumerate(p.out_nbytes):
        k = len(p.inputs) + j
        if where[k] == "pool":
            req.outputs.add(location=pb.DataLocation(pool_index=0, offset=offsets[k], length=n))
        else:
            req.outputs.add(inline_capacity=n)
    return req, pool


# ---- mutations -------------------------------------------------------------------------------
def _arg(rng, req, kind=None, where=None):
    """(list name, index, argument) of a random input/output argument, optionally by kind/place."""
    cands = [(name, k, a) for name in ("inputs", "outputs") if kind in (None, name)
             for k, a in enumerate(getattr(req, name)) if where is None or a.WhichOneof("where") == where]
    return cands[int(rng.integers(len(cands)))] if cands else (None, -1, None)


def mu_location(rng, req, ex, burst, pool):
    name, k, a = _arg(rng, req, where="location")
    if a is None:
        return None
    f = _pick(rng, ["offset", "length", "pool_index"])
    cur = getattr(a.location, f)
    vals = U32 if f == "pool_index" else U64 + [cur + 1, max(cur - 1, 0), cur + 64]
    setattr(a.location, f, int(_pick(rng, vals)) % (2**32 if f == "pool_index" else 2**64))
    return f"{name[:-1]} {k} location.{f} -> {getattr(a.location, f)}"


def mu_pool(rng, req, ex, burst, pool):
    r = rng.random()
    if r < 0.15:
        del req.pools[:]
        return "no pools"
    if r < 0.3:
        req.pools.add(inline_data=b"x") if rng.random() < 0.5 else req.pools.add(driver_buffer=int(_pick(rng, U64)))
        return "an extra pool of another kind"
    p = req.pools[0]
    if p.WhichOneof("kind") != "shared":
        p.burst_pool = int(_pick(rng, [0, 2, 2**64 - 1]))
        return f"burst pool id -> {p.burst_pool}"
    f = _pick(rng, ["name", "size", "size", "kind", "decoy"])
    if f == "decoy":  # the trust boundary: a segment no client made for the service
        p.shared.name = pool.decoy(rng)
    elif f == "name":
        p.shared.name = _pick(rng, ["nnhal-fuzz-missing", "", "/", "../" + p.shared.name, "a" * 255,
                                    p.shared.name + "x", "/dev/zero", "null"])
    elif f == "size":
        p.shared.size = int(_pick(rng, U64 + [p.shared.size + 1, p.shared.size - 1, p.shared.size * 2]))
    else:
        p.burst_pool = BURST_POOL
    return f"pool 0 {f} changed"


def mu_capacity(rng, req, ex, burst, pool):
    name, k, a = _arg(rng, req, "outputs", "inline_capacity")
    if a is None:
        return None
    a.inline_capacity = int(_pick(rng, [0, 1, max(a.inline_capacity - 1, 0), a.inline_capacity + 1,
                                        MAX_MESSAGE_BYTES + 1, 2**63, 2**64 - 1]))
    return f"output {k} inline capacity -> {a.inline_capacity}"


def mu_dimensions(rng, req, ex, burst, pool):
    name, k, a = _arg(rng, req)
    dims = list(a.dimensions)
    r = rng.random()
    if dims and r < 0.3:
        dims[int(rng.integers(len(dims)))] = int(_pick(rng, U32))
    elif r < 0.5:
        dims.append(int(_pick(rng, [1, 2])))
    elif dims and r < 0.7:
        dims.pop()
    else:
        dims = [int(_pick(rng, [0, 1, 2, 3, 2**31])) for _ in range(int(rng.integers(1, 5)))]
    a.ClearField("dimensions")
    a.dimensions.extend(dims)
    return f"{name[:-1]} {k} dimensions -> {dims}"


def mu_arity(rng, req, ex, burst, pool):
    name = _pick(rng, ["inputs", "outputs"])
    field = getattr(req, name)
    if len(field) and rng.random() < 0.5:
        del field[int(rng.integers(len(field)))]
        return f"one of the {name} removed"
    field.add().CopyFrom(field[int(rng.integers(len(field)))] if len(field) else pb.RequestArgument())
    return f"an extra argument among the {name}"


def mu_no_value(rng, req, ex, burst, pool):
    name, k, a = _arg(rng, req)
    a.has_no_value = not a.has_no_value
    return f"{name[:-1]} {k} has_no_value -> {a.has_no_value}"


def mu_where(rng, req, ex, burst, pool):
    name, k, a = _arg(rng, req)
    r = rng.random()
    if r < 0.3:
        a.ClearField(a.WhichOneof("where") or "data")
        return f"{name[:-1]} {k} has neither data nor location"
    if name == "inputs":
        if a.WhichOneof("where") == "data" and r < 0.7:
            a.data = a.data[:int(rng.integers(len(a.data) + 1))] if rng.random() < 0.6 else a.data + b"\0" * 4
            return f"input {k} data -> {len(a.data)} bytes"
        a.inline_capacity = 16
        return f"input {k} given an inline capacity"
    a.data = b"\0" * 8
    return f"output {k} given data"


def mu_execution(rng, req, ex, burst, pool):
    f = _pick(rng, ["prepared_model_id", "timeout_ns", "loop_timeout_ns", "measure_timing", "session"])
    if f == "session":  # no session, or one the service never gave: refused (service.access)
        pool.metadata = _pick(rng, [[], [("nnhal-session", "")], [("nnhal-session", uuid.uuid4().hex)]])
    elif f == "prepared_model_id":
        ex.prepared_model_id = _pick(rng, ["", "0" * 32, ex.prepared_model_id + "x", "\0", "x" * 10000,
                                           *FOREIGN_IDS])  # another session's: never this client's to run
    elif f == "timeout_ns":
        ex.timeout_ns = int(_pick(rng, [1, -1, 1000, 2**63 - 1]))
    elif f == "loop_timeout_ns":
        ex.loop_timeout_ns = int(_pick(rng, [1, -1, 2**63 - 1]))
    else:
        ex.measure_timing = True
    return f"execution {f} changed"


def mu_valid_layout(rng, req, ex, burst, pool):
    """A change NNAPI allows: the result must not change."""
    r = rng.random()
    name, k, a = _arg(rng, req, "outputs")
    if r < 0.3 and a.WhichOneof("where") == "inline_capacity":
        a.inline_capacity += int(rng.integers(1, 4096))
        return f"output {k} inline capacity grown to {a.inline_capacity}"
    if r < 0.5:
        name, k, a = _arg(rng, req, "inputs")
        if a is not None and not a.has_no_value:
            a.ClearField("dimensions")  # the model's own dimensions apply
            return f"input {k} without dimensions"
    if r < 0.7 and len(req.pools):
        req.pools.add().CopyFrom(req.pools[0])
        return "pool 0 listed twice"
    if r < 0.85:
        ex.measure_timing = True
        return "measure_timing"
    name, k, a = _arg(rng, req, "outputs", "location")
    if a is None:
        return None
    a.location.length += 1
    return f"output {k} location one byte longer"


BURST_MUTATIONS = ("register_kind", "register_name", "release_first", "unregistered_id", "no_registration")


def mu_burst(rng, req, ex, burst, pool):
    if burst is None:
        return None
    burst["mutation"] = _pick(rng, BURST_MUTATIONS)
    return f"burst: {burst['mutation']}"


MUTATORS = {f.__name__[3:]: f for f in (mu_location, mu_pool, mu_capacity, mu_dimensions, mu_arity, mu_no_value,
                                         mu_where, mu_execution, mu_burst, mu_valid_layout)}
WEIGHTS = {"location": 4, "pool": 2, "dimensions": 2, "burst": 2, "valid_layout": 3}


# ---- the oracle ------------------------------------------------------------------------------
class Refuse(Exception):
    """The request is invalid: the service must refuse it."""


def expect(p: Prepared, ex: pb.ExecuteRequest, pool: CasePool, burst_pools: dict[int, bool], real_id: str):
    """("ok", outputs, output places) | ("either", None, places): what NNAPI allows for the request.
    Raises Refuse when the service must refuse it."""
    from hal.executor import execute
    req = ex.request
    if pool.metadata is not None:
        raise Refuse("no valid session")
    if ex.prepared_model_id != real_id:
        raise Refuse("unknown prepared model")
    sizes = []
    for m in req.pools:
        kind = m.WhichOneof("kind")
        if kind == "shared" and m.shared.name == pool.shm.name and 0 < m.shared.size <= pool.size:
            sizes.append(m.shared.size)
        elif kind == "burst_pool" and burst_pools.get(m.burst_pool):
            sizes.append(pool.size)
        else:
            raise Refuse(f"pool of kind {kind} cannot be resolved")
    if len(req.inputs) != len(p.in_ops) or len(req.outputs) != len(p.out_ops):
        raise Refuse("argument count")

    def located(a, what):
        loc = a.location
        if loc.pool_index >= len(sizes) or loc.offset + loc.length > sizes[loc.pool_index]:
            raise Refuse(f"{what} outside its pool")
        return loc.offset, loc.length

    def check_dims(op, dims, what):
        if dims and op.dimensions and op.type not in SCALAR_TYPES:
            if len(dims) != len(op.dimensions) or any(d and d != g for d, g in zip(op.dimensions, dims)):
                raise Refuse(f"{what} dimensions")

    inputs = []
    for k, (a, op) in enumerate(zip(req.inputs, p.in_ops)):
        if a.has_no_value:
            inputs.append(None)
            continue
        where = a.WhichOneof("where")
        if where == "data":
            raw = a.data
        elif where == "location":
            off, n = located(a, f"input {k}")
            raw = pool.before[off:off + n]
        else:
            raise Refuse(f"input {k} without data")
        dims = tuple(a.dimensions)
        check_dims(op, dims, f"input {k}")
        dtype = p.ref.input_info(k).dtype
        if op.type in SCALAR_TYPES:
            shape = ()
        else:
            shape = dims or tuple(op.dimensions)
            if not shape or 0 in shape:
                raise Refuse(f"input {k} shape")
        if len(raw) != dtype.itemsize * math.prod(shape):
            raise Refuse(f"input {k} length")
        inputs.append(np.frombuffer(raw, dtype).reshape(shape))
    places, either = [], ex.timeout_ns > 0 or ex.loop_timeout_ns != 0
    for k, (a, op) in enumerate(zip(req.outputs, p.out_ops)):
        where = a.WhichOneof("where")
        if a.has_no_value or where == "data":
            raise Refuse(f"output {k} omitted or with data")
        check_dims(op, tuple(a.dimensions), f"output {k}")
        if where == "location":
            places.append(("pool",) + located(a, f"output {k}"))
        else:
            cap = a.inline_capacity if where == "inline_capacity" else 0
            if cap > MAX_MESSAGE_BYTES:
                raise Refuse("inline capacity over the message limit")
            places.append(("inline", 0, cap))
    try:
        outs = execute(p.ref, inputs)
    except HalError as e:
        raise Refuse(f"the reference refuses: {e}") from None
    for k, (out, (_, _, cap)) in enumerate(zip(outs, places)):
        if out.nbytes > cap:
            raise Refuse(f"output {k} does not fit")
        dims = tuple(req.outputs[k].dimensions)
        if dims and dims != out.shape:
            either = True  # NNAPI leaves a wrong output shape hint to the driver
    ranges = sorted((off, off + n) for kind, off, n in places if kind == "pool")
    if any(a[1] > b[0] for a, b in zip(ranges, ranges[1:])):
        either = True  # overlapping outputs: the last written wins
    return ("either" if either else "ok"), outs, places


# ---- one case --------------------------------------------------------------------------------
def run_case(service: Service, prepared: PreparedSeeds, rng, tally: Tally, where: str) -> None:
    p = prepared.items[int(rng.integers(len(prepared.items)))]
    burst = {"mutation": None} if rng.random() < 0.3 else None
    req, pool = build(p, rng)
    try:
        if burst is not None:
            req.pools[0].burst_pool = BURST_POOL
        ex = pb.ExecuteRequest(prepared_model_id=p.id)
        names = [n for n in MUTATORS for _ in range(WEIGHTS.get(n, 1))]
        what = None
        while what is None:
            mutation = _pick(rng, names)
            what = MUTATORS[mutation](rng, req, ex, burst, pool)
        ex.request.CopyFrom(req)
        pool.snapshot()
        where = f"{where} {p.seed.name} ({'burst' if burst else 'unary'}): {what}"
        outcome, detail = _send_and_judge(service, prepared, p, ex, pool, burst)
        tally.add(outcome, mutation, where, detail)
    finally:
        pool.close()


def _send_and_judge(service, prepared, p, ex, pool, burst):
    try:
        if burst is None:
            # the seeds' own client: only the session that prepared a model may execute it
            reply = call(_stub(prepared.client, pool).Execute, ex, client=prepared.client, metadata=pool.metadata)
            registered = {}
        else:
            reply, registered = _burst(prepared.client, ex, pool, burst["mutation"])
    except Hang as e:
        return "hang", str(e)
    except Death as e:
        return ("death" if service.check("execute") else "transport_error"), str(e)
    after = bytes(pool.shm.buf[:pool.size])
    try:
        verdict, want, places = expect(p, ex, pool, registered, p.id)
    except Refuse as why:
        verdict, want, places = "refuse", None, []
        refusal = str(why)
    written = _outside_outputs(pool.before, after, ex.request, registered, pool) or pool.decoys_changed()
    if written:
        return "wrong", written
    if reply is None:
        return "refused", "over the message size limit"
    if reply.status.code:
        outcome = status_outcome(reply.status.code, reply.status.message)
        if outcome == "refused" and verdict == "ok":
            return "refused_valid", reply.status.message
        return outcome, reply.status.message
    if verdict == "refuse":
        return "accepted_invalid", f"the service ran it; expected a refusal: {refusal}"
    if verdict == "either":
        return "ok", ""
    for k, (w, (kind, off, _)) in enumerate(zip(want, places)):
        dims = tuple(reply.output_shapes[k].dimensions) if k < len(reply.output_shapes) else None
        if dims != w.shape:
            return "wrong", f"output {k}: shape {dims}, expected {w.shape}"
        raw = reply.outputs[k] if kind == "inline" and k < len(reply.outputs) else after[off:off + w.nbytes]
        if len(raw) != w.nbytes:
            return "wrong", f"output {k}: {len(raw)} bytes returned, expected {w.nbytes}"
        msg = compare(np.frombuffer(raw, w.dtype).reshape(w.shape), w, p.loose)
        if msg:
            return "wrong", f"output {k}: {msg}"
    return "ok", ""


def _stub(client, pool: CasePool):
    """The client's stub, or with a mutated session (pool.metadata) the bare channel's: nothing added."""
    return client.prepared if pool.metadata is None else pb_grpc.PreparedModelStub(client.channel)


def _outside_outputs(before: bytes, after: bytes, req: pb.Request, registered, pool) -> str | None:
    """A change of the pool outside every output range the request names (in any pool index
    resolving to this pool): the service wrote where it had no right to."""
    if before == after:
        return None
    allowed = np.zeros(len(before), bool)
    for a in req.outputs:
        if a.WhichOneof("where") == "location":
            lo = min(a.location.offset, len(before))
            allowed[lo:min(a.location.offset + a.location.length, len(before))] = True
    diff = np.frombuffer(before, np.uint8) != np.frombuffer(after, np.uint8)
    bad = np.flatnonzero(diff & ~allowed)
    if bad.size:
        return f"{bad.size} pool bytes changed outside the output ranges (first at offset {int(bad[0])})"
    return None


def _burst(client, ex: pb.ExecuteRequest, pool: CasePool, mutation: str | None):
    """One execution on a fresh burst stream of ``client`` (the owner of the prepared model). Returns
    (its reply, the pool ids registered)."""
    reg = pb.PoolRegistration(pool_id=BURST_POOL, memory=pool.ref())
    registered = {BURST_POOL: True}
    first = pb.BurstRequest(serial=0)
    if mutation == "register_kind":
        reg.memory.CopyFrom(pb.Memory(inline_data=b"\0" * 8))
        registered = {}
    elif mutation == "register_name":
        reg.memory.shared.name = "nnhal-fuzz-missing"
        registered = {}
    elif mutation == "unregistered_id":
        reg.pool_id = BURST_POOL + 1
        registered = {BURST_POOL + 1: True}
    if mutation != "no_registration":
        first.register_pools.append(reg)
    else:
        registered = {}
    second = pb.BurstRequest(serial=1, execute=ex)
    if mutation == "release_first":
        second.release_pools.append(BURST_POOL)
        registered = {}
    send: queue.Queue = queue.Queue()
    stream = _stub(client, pool).ExecuteBurst(iter(send.get, None), timeout=CALL_BOUND_S, metadata=pool.metadata)
    try:
        send.put(first)
        send.put(second)
        refused = None
        for reply in stream:  # a reply to the registration only when it failed
            if reply.serial == 1:
                return reply.result, registered
            if reply.result.status.code:
                registered, refused = {}, reply.result
        if refused is not None and pool.metadata is not None:  # the whole stream refused: no valid session
            return refused, registered
        raise Death("the service ended the burst stream without a reply")
    except grpc.RpcError as e:
        if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
            raise Hang(f"no burst reply within {CALL_BOUND_S:g} s") from None
        raise Death(f"burst stream: {e.code()}: {e.details()}") from None
    finally:
        send.put(None)
        stream.cancel()
