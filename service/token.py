"""Client-side cache token: covers the model's weights, not just its structure.

TFLite's NNAPI delegate derives its token from the graph structure only, so two
models with the same structure and different weights share a token and the
second silently runs the first one's weights. Here the token is

    SHA-256(domain tag, user token, canonical model structure, BLAKE3 of every
            constant buffer, length-prefixed (operand_values, then each pool),
            compilation options)

The weights digest is BLAKE3 on every core, read in place: copying and hashing
MobileNetV2's 14 MB of weights with SHA-256 took 11 ms of every delegate
prepare, cached or not; the token now takes ~4 ms in all.
"""
from __future__ import annotations

import hashlib
import json

import blake3

from hal.model import Model
from service import convert
from service.proto import nnhal_pb2 as pb

_TAG = b"nnhal-cache-token-v2\0"


def model_token(model: Model, user_token: bytes = b"", options: dict | None = None) -> bytes:
    structure = convert.model_to_proto(model, pools=[pb.Memory() for _ in model.pools], with_values=False)
    weights = blake3.blake3(max_threads=blake3.blake3.AUTO)
    for buf in (model.operand_values, *model.pools):  # length-prefixed: pool boundaries count
        view = memoryview(buf).cast("B")
        weights.update(len(view).to_bytes(8, "little"))
        weights.update(view)
    h = hashlib.sha256(_TAG)
    for part in (user_token, structure.SerializeToString(deterministic=True), weights.digest(),
                 json.dumps(options or {}, sort_keys=True, default=str).encode()):
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return h.digest()
