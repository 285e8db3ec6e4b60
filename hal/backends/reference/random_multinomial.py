"""RANDOM_MULTINOMIAL on numpy: inverse-CDF sampling in float64, as NNAPI's CPU kernel samples.

Per batch, the CDF of exp(logit - max finite logit) over the finite logits; each sample is the
first class whose cumulative weight exceeds uniform[0, 1) times the total. The uniforms come from
numpy's Philox counter-based generator (the family TensorFlow's kernel uses) keyed by the two
seeds, so equal seeds reproduce the samples; seeds (0, 0) draw a fresh key from the OS, as
TensorFlow does. A row with no finite logit has no distribution: it yields class 0."""
from __future__ import annotations

import numpy as np

from hal.backends.reference import BACKEND
from hal.operations.random_multinomial import INPUT, RANDOM_MULTINOMIAL, SEEDS, RandomMultinomialParams
from hal.registry import OperationContext


def plan(ctx: OperationContext) -> RandomMultinomialParams:
    return ctx.params


def generator(seeds: np.ndarray) -> np.random.Generator:
    s0, s1 = (int(v) & 0xFFFFFFFF for v in np.asarray(seeds).reshape(-1)[:2])
    if s0 == 0 and s1 == 0:
        return np.random.Generator(np.random.Philox())
    return np.random.Generator(np.random.Philox(key=s0 | (s1 << 32)))


def execute(ctx: OperationContext, inputs: list) -> list:
    p: RandomMultinomialParams = ctx.data
    logits = inputs[INPUT].astype(np.float64).reshape(p.batches, p.classes)
    rng = generator(inputs[SEEDS])
    out = np.zeros((p.batches, p.sample_count), np.int32)
    for b, row in enumerate(logits):
        finite = np.isfinite(row)
        if not finite.any():
            continue
        weights = np.where(finite, np.exp(row - row[finite].max()), 0.0)
        cdf = np.cumsum(weights)
        targets = rng.random(p.sample_count) * cdf[-1]
        out[b] = np.minimum(np.searchsorted(cdf, targets, side="right"), p.classes - 1)
    return [out]


BACKEND.register(RANDOM_MULTINOMIAL, plan=plan, execute=execute)
