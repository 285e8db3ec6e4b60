"""NNAPI CTS conformance (cts/): every case, judged by CTS's criteria, in-process (one test per
operation), and every kind of case through a real service; and the support table kept honest against the results.

"Claimed": every operation of the case has its (operation, input-0 operand type) in `nnhal ops`.
A claimed case must pass, an unclaimed one must be reported unsupported (or refused, when CTS
expects a refusal): nothing claimed that fails, nothing passing or failing unclaimed.
"""
from __future__ import annotations

import functools
import json
import os
import subprocess
import sys

import pytest

from nnhal.cts.corpus import Case, load_cases
from nnhal.cts.runner import InProcessTarget, Outcome, Result, ServiceTarget, run, run_case
from nnhal.ops_table import ops_matrix

#: Cases whose outcome differs from the claim for a stated reason (case name -> reason).
EXCEPTIONS: dict[str, str] = {}


@functools.cache
def _cases() -> tuple[Case, ...]:
    return tuple(load_cases())


def _operations() -> list[str]:
    return sorted({c.operation for c in _cases()})


@functools.cache
def _matrix() -> frozenset[tuple[str, str]]:
    return frozenset((r["operation"], r["operand_type"]) for r in ops_matrix())


def claimed(case: Case) -> bool:
    return _pairs(case) <= _matrix()


def _problems(results: list[Result]) -> list[str]:
    bad = []
    for r in results:
        c = r.case
        if c.name in EXCEPTIONS:
            continue
        if r.outcome in (Outcome.WRONG, Outcome.REJECTED, Outcome.CRASH):
            bad.append(f"{r.outcome.value}: {c.name}: {r.detail}")
        elif claimed(c) and r.outcome != Outcome.PASS:
            bad.append(f"claimed by `nnhal ops` but {r.outcome.value}: {c.name}: {r.detail}")
        elif not claimed(c) and r.outcome == Outcome.PASS and not c.expect_failure:
            bad.append(f"passes but `nnhal ops` does not claim it: {c.name}")
    return bad


@pytest.mark.parametrize("operation", _operations())
def test_cts_in_process(operation):
    results = run(InProcessTarget(), [c for c in _cases() if c.operation == operation]).results
    bad = _problems(results)
    assert not bad, f"{len(bad)} of {len(results)} {operation} cases:\n" + "\n".join(bad[:30])


#: Cases of each kind through the service (test_cts_through_a_service_matches_in_process).
PER_KIND = 2


def _wire_sample() -> list[int]:
    """Indexes of the first PER_KIND cases of each kind: operation, the set of operand types,
    relaxed or not, expected to fail or not. What the wire could lose or change is an encoding
    (a type, a shape, a scalar, a flag), and each kind carries its own; the whole corpus through a
    service is `make cts` (`nnhal cts --service`)."""
    taken: dict[tuple, int] = {}
    picked = []
    for i, c in enumerate(_cases()):
        kind = (c.operation, frozenset(o["type"] for o in c.raw["operands"]), bool(c.raw.get("relax_fp32_to_fp16")),
                c.expect_failure)
        if taken.get(kind, 0) < PER_KIND:
            taken[kind] = taken.get(kind, 0) + 1
            picked.append(i)
    return picked


def test_cts_through_a_service_matches_in_process():
    """Every kind of case (_wire_sample) through a real `nnhal serve` (gRPC, unix socket): the
    same outcome as in-process, so nothing is lost or changed on the wire."""
    picked = _wire_sample()
    target = ServiceTarget()
    try:
        remote = run(target, [_cases()[i] for i in picked]).results
    finally:
        target.close()
    local = run(InProcessTarget(), [_cases()[i] for i in picked]).results
    differ = [f"{a.case.name}: in-process {a.outcome.value} ({a.detail[:120]}), service {b.outcome.value} "
              f"({b.detail[:120]})" for a, b in zip(local, remote) if a.outcome != b.outcome]
    assert not differ, "\n".join(differ[:30])
    assert not _problems(remote)


def test_every_claimed_combination_with_cts_vectors_passes_some_case():
    """Each (operation, type) `nnhal ops` lists that CTS has vectors for passes at least one case
    (each pair's cases run in-process until one passes)."""
    target, outcomes = InProcessTarget(), {}

    def passes(i: int) -> bool:
        if i not in outcomes:
            outcomes[i] = run_case(target, _cases()[i]).outcome
        return outcomes[i] == Outcome.PASS

    with_vectors = _matrix() & cts_combinations()
    cases_of: dict[tuple[str, str], list[int]] = {pair: [] for pair in with_vectors}
    for i, c in enumerate(_cases()):
        if not c.expect_failure:
            for pair in _pairs(c) & with_vectors:
                cases_of[pair].append(i)
    missing = sorted(pair for pair, cases in cases_of.items() if not any(passes(i) for i in cases))
    assert not missing, f"claimed, CTS has vectors, none passes: {missing}"


def _pairs(c: Case) -> set[tuple[str, str]]:
    """The case's (operation, input-0 type) pairs."""
    operands = c.raw["operands"]
    return {(op["type"], operands[op["inputs"][0]]["type"]) for op in c.raw["operations"]}


def cts_combinations() -> frozenset[tuple[str, str]]:
    """(operation, input-0 type) pairs the corpus has cases for."""
    return frozenset(pair for c in _cases() for pair in _pairs(c))


def test_cts_backend_option_runs_the_order_named():
    """`nnhal cts --backend NAMES`: in-process and in the private service. The cuda backend on
    torch's CPU device is opt-in (never in a default order): the RELU cases pass only where the
    order named reached the process that runs them (elsewhere "unknown backend 'cuda'")."""
    pytest.importorskip("torch")
    env = {**os.environ, "NNHAL_CUDA_DEVICE": "cpu", "NNHAL_BACKENDS": ""}
    for extra in ((), ("--service",)):
        r = subprocess.run([sys.executable, "-m", "nnhal.cli", "cts", "--backend", "cuda", "--op", "RELU", "--json",
                            *extra], capture_output=True, text=True, timeout=180, env=env)
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        assert out["operations"]["RELU"]["pass"] > 0 and not out["failures"], out
        if not extra:
            assert out["target"] == "in-process (cuda,reference)"


@pytest.mark.parametrize("operations,name", [(["ABS"], None), (["CONV_2D"], None), (["add", "MUL"], None),
                                             (None, "relu"), (["DEPTHWISE_CONV_2D"], "quant8"), (None, "V1_0/add")])
def test_a_filtered_load_reads_the_cases_a_whole_load_filters(operations, name):
    """load_cases skips lines that cannot match before parsing them: it must skip no case that does."""
    wanted = {o.upper() for o in operations or ()}
    expected = [c.name for c in _cases()
                if (not wanted or c.operation in wanted) and (name is None or name in c.name)]
    assert expected
    assert [c.name for c in load_cases(operations=operations, name_contains=name)] == expected
