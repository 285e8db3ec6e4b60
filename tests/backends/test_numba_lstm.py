"""The numba backend's float sequence LSTMs against the reference backend: every CTS case of
UNIDIRECTIONAL_SEQUENCE_LSTM and BIDIRECTIONAL_SEQUENCE_LSTM (CIFG, peepholes, layer norm,
projection, auxiliary inputs, merged outputs, float16, relaxed; weights as constants and as
model inputs) runs on the numba backend and meets CTS's float criteria against the reference
backend's outputs and the CTS's own expected outputs; and a keyword-spotting LSTM (49 steps, the
states carried between runs) matches the reference backend run after run."""
from __future__ import annotations

import functools

import numpy as np
import pytest

numba_backend = pytest.importorskip("hal.backends.numba_kernels")

from hal.compiler import compile_model  # noqa: E402
from hal.executor import execute  # noqa: E402
from hal.types import OperationType  # noqa: E402
from nnhal.cts.corpus import CorpusError, build_model, examples, load_cases  # noqa: E402
from nnhal.cts.judge import judge  # noqa: E402
from tests.backends.differential import compare  # noqa: E402

OPERATIONS = ("UNIDIRECTIONAL_SEQUENCE_LSTM", "BIDIRECTIONAL_SEQUENCE_LSTM")
ORDER = ["numba", "reference"]


@functools.cache
def _cases(operation: str) -> tuple:
    return tuple(c for c in load_cases(operations=[operation]) if not c.expect_failure)


@pytest.mark.parametrize("operation", OPERATIONS)
def test_cts_cases_run_on_numba_and_match_the_reference_and_the_cts(operation):
    ran = set()
    for case in _cases(operation):
        try:
            model = build_model(case)
        except CorpusError:
            continue
        for n, ex in enumerate(examples(case)):
            timings = []
            got = execute(compile_model(model, backend_order=ORDER), list(ex.inputs), timings)
            backends = [t.backend for t in timings if t.type == OperationType[operation]]
            assert backends == ["numba"], f"{case.name}: ran on {backends}"
            want = execute(compile_model(model, backend_order=["reference"]), list(ex.inputs))
            relaxed = model.relax_computation_float32_to_float16
            for k, (g, w) in enumerate(zip(got, want, strict=True)):
                why = compare(g, w, relaxed)
                assert why is None, f"{case.name} example {n} output {k} vs the reference backend: {why}"
            why = judge(case, ex, got)  # as CTS judges (its ignored outputs ignored)
            assert why is None, f"{case.name} example {n} vs the CTS: {why}"
            ran.add(case.name)
    assert any(name.endswith("_all_inputs_as_internal") for name in ran), "weights as model inputs never ran"
    assert any(not name.endswith("_all_inputs_as_internal") for name in ran), "constant weights never ran"


def test_keyword_spotting_lstm_matches_the_reference():
    """49 steps of a projected, clipped LSTM (tests/delegate/kws_model.py) as the delegate maps it;
    the LSTM step must be the numba backend's (and the last time step's STRIDED_SLICE, the
    classifier's FULLY_CONNECTED, batch 1, and SOFTMAX)."""
    from delegate.mapping import convert_partition
    from delegate.tfl.reader import read_model
    from tests.backends.differential import assert_matches_reference
    from tests.delegate.kws_model import kws_model, mfcc_like
    model = convert_partition(read_model(kws_model())).model
    sg = model.main
    rng = np.random.default_rng(5)
    for n, x in enumerate(mfcc_like(rng, windows=3)):  # the states: zero, then as a stream carries them
        states = [rng.uniform(-1, 1, sg.operands[i].dimensions).astype(np.float32) * (n > 0)
                  for i in sg.input_indexes[1:]]
        result = assert_matches_reference(model, [x, *states], "numba")
        ops = model.main.operations
        assert [ops[i].type for i in result.assigned] == [OperationType.UNIDIRECTIONAL_SEQUENCE_LSTM,
                                                          OperationType.STRIDED_SLICE,
                                                          OperationType.FULLY_CONNECTED, OperationType.SOFTMAX]
