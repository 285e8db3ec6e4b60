"""CTS's accuracy criteria (AOSP TestHarness), applied to one example's outputs.

Per element ``|actual − expected| ≤ atol + rtol·|expected|``, NaN never passing:
TENSOR_FLOAT32 atol 1e-5, rtol 5·2⁻²³; TENSOR_FLOAT16 — and TENSOR_FLOAT32 in a model that is
relaxed or has any float16 operand — atol = rtol = 5·2⁻¹⁰; INT32 and quantized types 1 step;
BOOL8 exact. Output dimensions are checked before values. RANDOM_MULTINOMIAL cases compare class
frequencies with softmax(input) instead.
"""
from __future__ import annotations

import numpy as np

from hal.types import OperandType
from nnhal.cts.corpus import Case, Example

FLOAT32_CRITERIA = (1e-5, 5 * 2.0 ** -23)
FLOAT16_CRITERIA = (5 * 2.0 ** -10, 5 * 2.0 ** -10)
_STEP_TYPES = frozenset({OperandType.TENSOR_INT32, OperandType.INT32, OperandType.TENSOR_QUANT8_ASYMM,
                         OperandType.TENSOR_QUANT8_ASYMM_SIGNED, OperandType.TENSOR_QUANT8_SYMM,
                         OperandType.TENSOR_QUANT8_SYMM_PER_CHANNEL, OperandType.TENSOR_QUANT16_ASYMM,
                         OperandType.TENSOR_QUANT16_SYMM, OperandType.UINT32})


def criteria(case: Case, t: OperandType) -> tuple[float, float]:
    """(atol, rtol) for an output of type ``t`` in ``case``."""
    if t in (OperandType.TENSOR_FLOAT16, OperandType.FLOAT16):
        return FLOAT16_CRITERIA
    if t in (OperandType.TENSOR_FLOAT32, OperandType.FLOAT32):
        return FLOAT16_CRITERIA if case.relaxed or case.has_float16 else FLOAT32_CRITERIA
    if t in _STEP_TYPES:
        return (1.0, 0.0)
    return (0.0, 0.0)  # BOOL8, BOOL: exact


def judge(case: Case, example: Example, outputs: list[np.ndarray]) -> str | None:
    """None when ``outputs`` pass, else what is wrong (the first failing output)."""
    types = case.output_types()
    if len(outputs) != len(types):
        return f"{len(outputs)} outputs, the model has {len(types)}"
    for k, (t, got, want, dims) in enumerate(zip(types, outputs, example.outputs, example.output_dims)):
        # CTS marks RANDOM_MULTINOMIAL's output ignored for the value check, then judges its distribution
        if k in case.ignored_outputs and case.multinomial_tolerance <= 0:
            continue
        got = np.asarray(got)
        if dims is not None and tuple(got.shape) != dims:
            return f"output {k}: dimensions {list(got.shape)}, expected {list(dims)}"
        if got.size != want.size:
            return f"output {k}: {got.size} elements, expected {want.size}"
        if case.multinomial_tolerance > 0:
            msg = _judge_multinomial(case, example, got)
            if msg:
                return f"output {k}: {msg}"
            continue
        msg = _compare(got.reshape(-1), want, *criteria(case, t))
        if msg:
            return f"output {k} ({t.name}): {msg}"
    return None


def _compare(got: np.ndarray, want: np.ndarray, atol: float, rtol: float) -> str | None:
    if want.dtype.kind == "b" or got.dtype.kind == "b":
        bad = got.astype(bool) != want.astype(bool)
    else:
        g = got.astype(np.float64)
        w = want.astype(np.float64)
        with np.errstate(invalid="ignore"):
            ok = np.abs(g - w) <= atol + rtol * np.abs(w)
        ok |= (g == w) & np.isinf(w)  # an expected ±inf matched exactly
        bad = ~ok  # NaN never passes
    if not bad.any():
        return None
    i = int(np.flatnonzero(bad)[0])
    return (f"{int(bad.sum())} of {bad.size} elements out of tolerance (atol {atol:g}, rtol {rtol:g}); "
            f"first at {i}: got {got[i]!r}, expected {want[i]!r}")


def _judge_multinomial(case: Case, example: Example, got: np.ndarray) -> str | None:
    """CTS's RANDOM_MULTINOMIAL check: each class's frequency among the samples of a batch is within
    the tolerance of softmax(logits)."""
    logits = next(x for x in example.inputs if x is not None and x.dtype.kind == "f").astype(np.float64)
    logits = logits.reshape(logits.shape[0], -1)
    batches = got.reshape(logits.shape[0], -1)
    for b, (row, samples) in enumerate(zip(logits, batches)):
        if samples.size and (samples.min() < 0 or samples.max() >= row.size):
            worst = samples.min() if samples.min() < 0 else samples.max()
            return f"batch {b}: class {int(worst)} is not in [0, {row.size})"
        p = np.exp(row - row.max())
        p /= p.sum()
        freq = np.bincount(samples.astype(np.int64), minlength=row.size)[:row.size] / max(samples.size, 1)
        worst = float(np.max(np.abs(freq - p)))
        if worst > case.multinomial_tolerance:
            return f"batch {b}: class frequency off softmax by {worst:.3f} > {case.multinomial_tolerance}"
    return None
