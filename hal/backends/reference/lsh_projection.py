"""LSH_PROJECTION on numpy and Python integers: one FarmHash Fingerprint64 per (seed, input row),
the key being the seed as float32 bytes followed by the row's bytes as stored (so a float16 input
hashes its float16 bytes: the kernel takes float16 operands itself rather than widened). Scores are
summed in double, row by row, as NNAPI's reference does."""
from __future__ import annotations

import numpy as np

from hal.backends.reference import BACKEND
from hal.backends.reference.farmhash import fingerprint64
from hal.operations.lsh_projection import HASH, INPUT, LSH_PROJECTION, WEIGHT, LshProjectionParams, LshProjectionType
from hal.registry import OperationContext

_SIGN = 1 << 63


def plan(ctx: OperationContext) -> LshProjectionParams:
    return ctx.params


def _sign_bit(seed: np.float32, rows: list[bytes], weights: list[float] | None) -> int:
    """1 when the (weighted) sum of the rows' signed fingerprints under this seed is positive."""
    prefix = np.float32(seed).tobytes()
    score = 0.0
    for r, row in enumerate(rows):
        h = fingerprint64(prefix + row)
        value = float(h - (1 << 64) if h & _SIGN else h)  # int64, as a double
        score += value if weights is None else weights[r] * value
    return 1 if score > 0 else 0


def execute(ctx: OperationContext, inputs: list) -> list:
    p: LshProjectionParams = ctx.data
    seeds = inputs[HASH].astype(np.float32).reshape(p.num_hash, p.num_bits)
    x = np.ascontiguousarray(inputs[INPUT])
    rows = [x[r].tobytes() for r in range(p.rows)]
    w = inputs[WEIGHT]
    weights = None if w is None else [float(v) for v in w.astype(np.float32)]
    bits = np.array([[_sign_bit(s, rows, weights) for s in row] for row in seeds], dtype=np.int64)
    bits = bits.reshape(p.num_hash, p.num_bits)
    if p.type == LshProjectionType.DENSE:
        return [bits.reshape(-1).astype(np.int32)]
    codes = np.zeros(p.num_hash, np.int64)
    for j in range(p.num_bits):
        codes = (codes << 1) | bits[:, j]
    if p.type == LshProjectionType.SPARSE:
        codes += np.arange(p.num_hash, dtype=np.int64) << p.num_bits
    return [(codes & 0xFFFFFFFF).astype(np.uint32).view(np.int32)]  # wraps as int32 arithmetic does


BACKEND.register(LSH_PROJECTION, plan=plan, execute=execute, native_float16=True)
