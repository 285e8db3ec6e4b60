"""CTS's TENSOR_QUANT8_ASYMM cases as TENSOR_QUANT8_ASYMM_SIGNED ones (NNAPI 1.3 added the signed
type; the corpus stops at 1.2): every stored value and zero point shifted by -128. Operations that
only dequantize, compare or requantize through (q - zero_point) map the shifted inputs exactly onto
the shifted expected outputs, so the corpus's own vectors stay the oracle."""
from __future__ import annotations

import copy
import dataclasses

from nnhal.cts.corpus import Case, load_cases
from nnhal.cts.runner import InProcessTarget, Outcome, run


def signed_variant(case: Case) -> Case:
    raw = copy.deepcopy(case.raw)
    shifted = set()
    for k, operand in enumerate(raw["operands"]):
        if operand["type"] == "TENSOR_QUANT8_ASYMM":
            operand["type"] = "TENSOR_QUANT8_ASYMM_SIGNED"
            operand["zero_point"] -= 128
            if operand.get("value") is not None:
                operand["value"] = [v - 128 for v in operand["value"]]
            shifted.add(k)
    examples = copy.deepcopy(list(case.examples))
    for ex in examples:
        for key in ("inputs", "outputs"):
            for k, values in ex[key].items():
                if int(k) in shifted:
                    ex[key][k] = [v - 128 for v in values]
    return dataclasses.replace(case, name=case.name + "_signed", raw=raw, examples=tuple(examples))


def quant8_cases(operation: str, spec_prefix: str) -> list[Case]:
    """The operation's quant8 cases whose model has no other operation type."""
    return [c for c in load_cases(None, [operation]) if "quant8" in c.variations
            and c.spec.startswith(spec_prefix) and set(c.operation_types) == {operation}]


def run_signed(cases: list[Case]) -> list[str]:
    """Problems (empty when every signed variant passes CTS's judgement)."""
    assert cases
    results = run(InProcessTarget(), [signed_variant(c) for c in cases]).results
    return [f"{r.outcome.value}: {r.case.name}: {r.detail}" for r in results if r.outcome != Outcome.PASS]
