"""Differential testing: a backend's kernels against the reference backend, on the same models.

The reference backend (numpy) is the living definition of every operation; a fast backend must
give the same answers: bit-exact for quantized and integer types, NNAPI CTS's float criteria for
float (TENSOR_FLOAT32: |got - want| <= 1e-5 + 5·2^-23·|want|; float16 or relaxed models: atol =
rtol = 5·2^-10). A NaN must meet a NaN. Two ways to use it:

* ``assert_matches_reference(model, inputs, "numba")`` on any NNAPI model;
* ``NNHAL_DIFF_BACKEND=numba pytest tests/ops`` runs every generated op-test model through the
  named backend too (tests/harness.py's hal_run calls ``check_against_reference``), on top of the
  comparison with TFLite.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from hal.compiler import compile_model
from hal.executor import execute
from hal.model import Model

ENV_VAR = "NNHAL_DIFF_BACKEND"
F32_ATOL, F32_RTOL = 1e-5, 5 * 2.0 ** -23
F16_TOL = 5 * 2.0 ** -10


@dataclass
class DiffResult:
    backend: str
    operations: int  # of the model
    assigned: list[int]  # operation indexes the backend under test ran (the rest fell back)


def tolerance(want: np.ndarray, half: bool) -> np.ndarray:
    """CTS's per-element bound: float16 criteria when ``half`` (float16 data or a relaxed model)."""
    if half:
        return F16_TOL + F16_TOL * np.abs(want.astype(np.float64))
    return F32_ATOL + F32_RTOL * np.abs(want.astype(np.float64))


def compare(got: np.ndarray, want: np.ndarray, relaxed: bool = False) -> str | None:
    """None when ``got`` passes against ``want``, else what differs (first offending element)."""
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"{got.dtype}{list(got.shape)} != reference {want.dtype}{list(want.shape)}"
    if not np.issubdtype(want.dtype, np.floating):
        bad = np.flatnonzero(got.reshape(-1) != want.reshape(-1))
        if bad.size:
            k = bad[0]
            return (f"{bad.size} of {want.size} elements differ (bit-exact required), first at flat index {k}: "
                    f"{got.reshape(-1)[k]} != {want.reshape(-1)[k]}")
        return None
    half = relaxed or want.dtype == np.float16
    g, w = got.astype(np.float64).reshape(-1), want.astype(np.float64).reshape(-1)
    both_nan = np.isnan(g) & np.isnan(w)
    with np.errstate(invalid="ignore"):
        ok = both_nan | (g == w) | (np.abs(g - w) <= tolerance(w, half))  # NaN vs a number fails; inf == inf
    bad = np.flatnonzero(~ok)
    if bad.size:
        k = bad[0]
        return (f"{bad.size} of {w.size} elements outside CTS tolerance, first at flat index {k}: "
                f"{g[k]!r} vs {w[k]!r} (tolerance {float(tolerance(w[k:k + 1], half)[0]):.3g})")
    return None


def assert_matches_reference(model: Model, inputs: list[np.ndarray], backend: str, *,
                             require_assigned: bool = True) -> DiffResult:
    """Run ``model`` with ``backend`` preferred and with the reference backend alone; compare
    every output. ``require_assigned``: fail when the backend ran none of the operations (the
    comparison would then test nothing)."""
    want = execute(compile_model(model, backend_order=["reference"]), inputs)
    compiled = compile_model(model, backend_order=[backend, "reference"])
    assigned = [s.index for s in compiled.static_plan.steps if s.backend == backend] \
        if compiled.static_plan is not None else []
    if require_assigned:
        assert assigned, f"backend {backend!r} ran none of the model's operations"
    got = execute(compiled, inputs)
    relaxed = model.relax_computation_float32_to_float16
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        why = compare(g, w, relaxed)
        assert why is None, f"output {k}: backend {backend!r} vs reference: {why}"
    return DiffResult(backend, len(model.main.operations), assigned)


def check_against_reference(model: Model, inputs: list[np.ndarray]) -> None:
    """The op tests' hook: when $NNHAL_DIFF_BACKEND names a backend, the model must give the
    reference backend's answers through it too (operations it does not take fall back)."""
    backend = os.environ.get(ENV_VAR, "").strip()
    if backend and backend != "reference":
        assert_matches_reference(model, inputs, backend, require_assigned=False)
