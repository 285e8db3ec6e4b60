"""The delegate's record of how it delegated a graph, kept by the service for the next start.

A delegation maps every node to NNAPI to ask the service which it runs (the support probe), then
converts each chosen partition and hashes it into its cache token: most of what an Interpreter
waits for when the compiled partitions are already in the service's cache. The record keeps the
results: each node's support answer, and per partition the boundary TFLite handed the kernel,
what the kernel needs to run it (its NNAPI inputs and outputs, tensor order) and its token. A
start that finds the record skips the probe and the conversion and loads each partition by token;
the partition is converted only if the service no longer has it compiled (or the kernel falls back
in-process).

The record is found by a key that covers everything the delegation depends on: the graph as TFLite
hands it (every tensor's type, shape, quantization and constant bytes; every node's operator,
options and tensors), the delegate's options, the service (version and capabilities, which carry
its supported operations and speeds), and this side's code (delegate, extensions, hal sources, the
installed extension plugins, the TFLite runtime). Any change is another key: a miss, and a cold
delegation that stores a new record. The service keeps records in its compilation cache
(authenticated, checksummed; a damaged one is a miss).
"""
from __future__ import annotations

import base64
import dataclasses
import functools
import hashlib
import json
import logging
import os
from dataclasses import dataclass
from typing import Callable

import blake3
import numpy as np

import extensions
import hal
from delegate.tfl.graph import TfLiteGraph
from delegate.tfl.schema import builtin_code
from hal.model import Model, Subgraph
from service import convert
from service.client import Client, ServiceError
from service.proto import nnhal_pb2 as pb

log = logging.getLogger("nnhal.delegate")

_KEY_TAG = b"nnhal-delegation-record-key-v1\0"
FORMAT = 1

#: TFLite operators that name other subgraphs: their mapping reads those too, which the graph
#: fingerprint does not cover, so such graphs are delegated afresh each time.
_CONTROL_FLOW = frozenset(builtin_code(n) for n in ("IF", "WHILE", "CALL_ONCE"))


@dataclass
class PartitionRecord:
    """One kernel's partition as the cold start converted it."""

    nodes: list[int]            # KernelParams as TFLite handed them to the kernel
    inputs: list[int]
    outputs: list[int]
    input_tensors: list[int]    # the converted partition's TFLite tensors, in NNAPI order
    output_tensors: list[int]
    state_tensors: list[int]
    node_operations: dict[int, tuple[int, int]]
    token: bytes
    #: The partition model's input and output operands only: what a request is laid out from.
    io_model: Model


@dataclass
class DelegationRecord:
    reasons: dict[int, str | None]  # node index -> None (supported) or why not
    partitions: list[PartitionRecord]

    def partition(self, nodes: list[int], inputs: list[int], outputs: list[int]) -> PartitionRecord | None:
        for p in self.partitions:
            if p.nodes == nodes and p.inputs == inputs and p.outputs == outputs:
                return p
        return None

    def encode(self) -> bytes:
        return json.dumps({
            "format": FORMAT,
            "reasons": [[k, v] for k, v in sorted(self.reasons.items())],
            "partitions": [{
                "nodes": p.nodes, "inputs": p.inputs, "outputs": p.outputs,
                "input_tensors": p.input_tensors, "output_tensors": p.output_tensors,
                "state_tensors": p.state_tensors,
                "node_operations": [[k, lo, hi] for k, (lo, hi) in sorted(p.node_operations.items())],
                "token": p.token.hex(),
                "io_model": base64.b64encode(convert.model_to_proto(p.io_model).SerializeToString()).decode(),
            } for p in self.partitions],
        }, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes) -> "DelegationRecord":
        """ValueError for anything but a record this code wrote."""
        try:
            tree = json.loads(data)
            if tree["format"] != FORMAT:
                raise ValueError(f"record format {tree['format']!r}")
            reasons = {_int(k): None if v is None else str(v) for k, v in tree["reasons"]}
            parts = []
            for p in tree["partitions"]:
                model = convert.model_from_proto(pb.Model.FromString(base64.b64decode(p["io_model"])), _no_pools)
                parts.append(PartitionRecord(
                    _ints(p["nodes"]), _ints(p["inputs"]), _ints(p["outputs"]), _ints(p["input_tensors"]),
                    _ints(p["output_tensors"]), _ints(p["state_tensors"]),
                    {_int(k): (_int(lo), _int(hi)) for k, lo, hi in p["node_operations"]},
                    bytes.fromhex(p["token"]), model))
            return cls(reasons, parts)
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ValueError(f"malformed delegation record: {e!r}") from None
        except Exception as e:  # noqa: BLE001 - protobuf's DecodeError and the like: not a record of ours
            raise ValueError(f"malformed delegation record: {e!r}") from None


def fetch_record(client: Client, key: bytes, nodes: int) -> DelegationRecord | None:
    """The service's record under ``key`` for a graph of ``nodes`` nodes; None: none usable."""
    try:
        data = client.get_delegation_record(key)
        record = None if data is None else DelegationRecord.decode(data)
    except (ServiceError, ValueError) as e:
        log.info("delegation record unavailable: %s", e)
        return None
    if record is not None and sorted(record.reasons) != list(range(nodes)):
        log.info("delegation record ignored: it answers for other nodes than the graph's")
        return None
    return record


def record_of(reasons: dict[int, str | None], kernels: list) -> DelegationRecord | None:
    """The record of a delegation that probed ``reasons`` and made ``kernels`` (NnhalKernel);
    None unless it is complete: every answer from the service, every partition converted, with
    operations and without constant outputs (which a record does not carry)."""
    if any(why is not None and why.startswith("service error") for why in reasons.values()) or \
            any(k._part is None or k.folded_only or k.constant_outputs for k in kernels):
        return None
    return DelegationRecord(dict(reasons), [PartitionRecord(
        list(k.params.nodes), list(k.params.inputs), list(k.params.outputs), list(k.inputs), list(k.outputs),
        list(k.state_tensors), dict(k.node_operations), k.token, io_model(k._part.model)) for k in kernels])


def io_model(model: Model) -> Model:
    """``model`` reduced to its main inputs and outputs (no operations, no values)."""
    main = model.main
    io = list(main.input_indexes) + list(main.output_indexes)
    operands = [dataclasses.replace(main.operands[i]) for i in io]
    n = len(main.input_indexes)
    return Model(main=Subgraph(operands=operands, operations=[], input_indexes=list(range(n)),
                               output_indexes=list(range(n, len(io)))),
                 extension_name_to_prefix=list(model.extension_name_to_prefix))


def recordable(graph: TfLiteGraph) -> bool:
    """Whether a record can stand for this graph's delegation (see _CONTROL_FLOW)."""
    return not any(n.builtin_code in _CONTROL_FLOW for n in graph.nodes)


def graph_fingerprint(graph: TfLiteGraph, weights: bytes | Callable[[], bytes] | None = None) -> bytes:
    """Digest of everything the mapping reads of ``graph``: the constants' bytes (``weights``:
    weights_digest's, or a call that waits for it, called once the rest is hashed; computed here
    if not given) and every other field of its tensors and nodes."""
    described = []
    for t in graph.tensors:
        data = None if t.data is None else (t.data.dtype.str, t.data.shape)
        described.append((t.index, t.name, t.type, t.shape, t.shape_signature, t.scales, t.zero_points,
                          t.quantized_dimension, data, t.is_variable, t.sparsity, t.runtime_shape))
    for n in graph.nodes:
        described.append((n.index, n.builtin_code, n.inputs, n.outputs, _canonical(n.options), n.custom_code,
                          n.custom_options, n.version, n.intermediates))
    h = hashlib.sha256(repr(described).encode())
    h.update(weights_digest(graph) if weights is None else weights if isinstance(weights, bytes) else weights())
    return h.digest()


def weights_digest(graph: TfLiteGraph) -> bytes:
    """BLAKE3 of every constant's bytes, read in place. Where the snapshot has the memory holding them
    all (``constant_bytes``), that memory in one call (which runs without the GIL, so the thread
    computing it is not held up by the delegate's Python meanwhile) after each constant's position
    and length in it; else each constant after its length. The two spellings never meet: each
    begins with its own tag."""
    weights = blake3.blake3(max_threads=blake3.blake3.AUTO)
    span = graph.constant_bytes
    if span is not None:
        lo, memory = span
        table = []
        for t in graph.tensors:
            if t.data is not None:
                at = t.data.__array_interface__["data"][0] - lo if t.data.nbytes else 0
                if not 0 <= at <= len(memory) - t.data.nbytes or not t.data.flags.c_contiguous:
                    break  # not in that memory (a rewritten graph): each constant on its own
                table += (t.index, at, t.data.nbytes)
        else:
            weights.update(b"in place\0")
            weights.update(np.array(table, dtype="<i8").tobytes())
            weights.update(memory)
            return weights.digest()
    weights.update(b"each\0")
    for t in graph.tensors:
        data = t.data
        if data is not None:
            view = memoryview(data if data.flags.c_contiguous else data.copy()).cast("B")
            weights.update(len(view).to_bytes(8, "little"))
            weights.update(view)
    return weights.digest()


def record_key(fingerprint: bytes, options: object, salt: bytes, service_version: str,
               capabilities: bytes) -> bytes:
    """The record's key: the graph, the options (their repr names every field), the cache token's
    salt, the service and this side's code (code_identity)."""
    h = hashlib.sha256(_KEY_TAG)
    for part in (fingerprint, repr(options).encode(), salt, service_version.encode(), capabilities,
                 code_identity().encode()):
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return h.digest()


@functools.cache
def code_identity() -> str:
    """This side of a delegation: the sources of delegate, extensions and hal (each file's path,
    size and modification time, as Python's own bytecode cache tells an edited source; once per
    process), the installed extension plugins and the TFLite runtime the mapping follows."""
    from delegate.mapping.host_runtime import host_runtime
    from extensions.plugins import plugin_results
    h = hashlib.sha256()
    for package, root in (("delegate", os.path.dirname(os.path.abspath(__file__))),
                          ("extensions", os.path.dirname(extensions.__file__)), ("hal", os.path.dirname(hal.__file__))):
        for folder, dirs, files in sorted(os.walk(root)):
            dirs.sort()
            for name in sorted(files):
                if name.endswith(".py"):
                    st = os.stat(f"{folder}/{name}")
                    h.update(f"{folder[len(root):]}/{name}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
        h.update(package.encode())
    h.update(repr([(r.entry_point, r.extension, r.error) for r in plugin_results()]).encode())
    h.update(repr(host_runtime()).encode())
    return h.hexdigest()


def _canonical(value):
    """``value`` with every array spelled out in full (numpy's repr elides long ones)."""
    if isinstance(value, dict):
        return sorted((k, _canonical(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    if isinstance(value, np.ndarray):
        return ("ndarray", value.dtype.str, value.shape, value.tobytes())
    return value


def _int(v) -> int:
    if type(v) is not int:
        raise ValueError(f"{v!r} is not an integer")
    return v


def _ints(vs) -> list[int]:
    return [_int(v) for v in vs]


def _no_pools(memory):
    raise ValueError("a record's model holds no memory pools")
