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


def constant_params(model, inputs: list) -> tuple:
    """``model`` with every INT32 model input read only as an operation's parameter (an input
    other than 0) made a constant holding this example's value, and the inputs left."""
    import copy

    from hal.model import DataLocation
    from hal.types import OperandLifeTime, OperandType
    sg = model.main
    params = {i for op in sg.operations for i in op.inputs[1:]} - {i for op in sg.operations for i in op.inputs[:1]}
    convert = [k for k, i in enumerate(sg.input_indexes) if i in params and inputs[k] is not None
               and sg.operands[i].type in (OperandType.TENSOR_INT32, OperandType.INT32)]
    if not convert:
        return model, inputs
    m = copy.deepcopy(model)
    blob = bytearray(m.operand_values)
    for k in convert:
        value = np.ascontiguousarray(inputs[k])
        blob += b"\0" * (-len(blob) % 8)
        operand = m.main.operands[sg.input_indexes[k]]
        operand.lifetime = OperandLifeTime.CONSTANT_COPY
        operand.location = DataLocation(0, len(blob), value.nbytes)
        operand.dimensions = tuple(value.shape)
        blob += value.tobytes()
    m.operand_values = bytes(blob)
    m.main.input_indexes = [i for k, i in enumerate(sg.input_indexes) if k not in convert]
    return m, [x for k, x in enumerate(inputs) if k not in convert]


def graph_backend_cts_runs(backend, operation: str, cases, order: list[str]) -> list[tuple]:
    """Each example of each CTS case of ``operation`` planned with ``order`` (``backend``, a graph
    backend, first): nothing ``backend`` claims may fall back; where its partition ran the
    operation, every output must meet CTS's criteria against the reference. Returns (model,
    compiled) of those runs. Invalid cases (the CTS tests judge them) are passed over."""
    from hal.types import OperationType
    from nnhal.cts.corpus import build_model, examples
    ran = []
    for case in cases:
        try:
            model = build_model(case)
            compile_model(model, backend_order=["reference"])
        except Exception:  # noqa: BLE001 - invalid for hal: the CTS tests judge that
            continue
        for n, ex in enumerate(examples(case)):
            # a parameter given as a model input (SLICE's begin/size, TILE's multiples) is planned
            # per execution, operation by operation: made a constant, the case is a static model
            variant, inputs = constant_params(model, list(ex.inputs))
            compiled = compile_model(variant, backend_order=order)
            if compiled.static_plan is None:
                continue
            fell = [s.ctx.name for s in compiled.static_plan.steps
                    if s.backend != backend.name and backend.claim(s.ctx) is None]
            assert not fell, f"{case.name}: {fell} fell back"
            if not any(s.backend == backend.name and s.ctx.op_type == OperationType[operation]
                       for s in compiled.static_plan.steps):
                continue
            ran.append((variant, compiled))
            got, want = execute(compiled, inputs), execute(compile_model(variant, backend_order=["reference"]), inputs)
            for k, (g, w) in enumerate(zip(got, want, strict=True)):
                why = compare(g, w, model.relax_computation_float32_to_float16)
                assert why is None, f"{case.name} example {n} output {k}: {why}"
    return ran


def check_cached_load(compiled, payload: str, arrays: list, order: list[str], inputs: list):
    """A compiled model's cache payload loads (the caller has made lowering fail: a cached partition
    is never lowered again), computes bit-identical outputs, and a damaged ONNX model inside it is a
    failed load (a cache miss), never a crash. Returns the loaded model."""
    import pytest

    from hal.serialize import SerializationError, load_compiled
    loaded = load_compiled(payload, [a.copy() for a in arrays], backend_order=order)
    for g, w in zip(execute(loaded, inputs), execute(compiled, inputs), strict=True):
        np.testing.assert_array_equal(g, w)
    model_array = next(i for i, a in enumerate(arrays) if a.dtype == np.uint8 and a.size > 100)
    broken = [a.copy() for a in arrays]
    broken[model_array][len(broken[model_array]) // 3:] = 7
    with pytest.raises(SerializationError, match="could not load"):
        load_compiled(payload, broken, backend_order=order)
    return loaded


def check_against_reference(model: Model, inputs: list[np.ndarray]) -> None:
    """The op tests' hook: when $NNHAL_DIFF_BACKEND names a backend, the model must give the
    reference backend's answers through it too (operations it does not take fall back)."""
    backend = os.environ.get(ENV_VAR, "").strip()
    if backend and backend != "reference":
        assert_matches_reference(model, inputs, backend, require_assigned=False)


def float_cts_examples_on(backend: str, operation: str, op_type: int, order: list[str]) -> int:
    """Every float32 CTS case of ``operation`` (NNAPI name) compiled with ``order``: each example
    against the reference backend (CTS's float criteria) and against the CTS; returns how many
    examples ran ``op_type`` on ``backend`` (a test asserts a minimum: cases it declines do not count)."""
    from hal.executor import OperationTiming
    from hal.types import OperandType
    from nnhal.cts.corpus import CorpusError, build_model, examples, load_cases
    from nnhal.cts.judge import judge
    ran = 0
    for case in (c for c in load_cases(operations=[operation]) if not c.expect_failure):
        try:
            model = build_model(case)
        except CorpusError:
            continue
        sg = model.main
        if sg.operands[sg.operations[-1].inputs[0]].type != OperandType.TENSOR_FLOAT32:
            continue
        compiled = compile_model(model, backend_order=order)
        want_model = compile_model(model, backend_order=["reference"])
        for n, ex in enumerate(examples(case)):
            if any(x is None for x in ex.inputs):
                continue
            timings: list[OperationTiming] = []
            got = execute(compiled, list(ex.inputs), timings)
            ran += any(t.backend == backend and t.type == op_type for t in timings)
            for k, (g, w) in enumerate(zip(got, execute(want_model, list(ex.inputs)), strict=True)):
                why = compare(g, w, model.relax_computation_float32_to_float16)
                assert why is None, f"{case.name} example {n} output {k} vs the reference backend: {why}"
            why = judge(case, ex, got)
            assert why is None, f"{case.name} example {n} vs the CTS: {why}"
    return ran
