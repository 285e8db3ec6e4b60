"""NNAPI CTS cases (cts/*.jsonl.gz) as hal Models and numpy examples.

Each case is one generated test of AOSP's NNAPI CTS (a spec file × one variation: data type,
layout, relaxed float, inputs turned into internal operands, …). ``build_model`` rebuilds it
through hal's public model API only (ModelBuilder, Operand, pools), the way an NNAPI client
builds a model, so the runner judges the driver, not a test shortcut.
"""
from __future__ import annotations

import gzip
import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hal.model import DataLocation, Model, ModelBuilder, SymmPerChannelQuantParams
from hal.types import NUMPY_DTYPE, SCALAR_TYPES, OperandLifeTime, OperandType

#: The corpus carried in the project (NNAPI 1.0–1.2 specs; see cts/NOTICE).
DEFAULT_CORPUS = Path(__file__).resolve().parents[2] / "cts" / "cts-v1_0-v1_2.jsonl.gz"

_LIFETIMES = {
    "TEMPORARY_VARIABLE": OperandLifeTime.TEMPORARY_VARIABLE,
    "SUBGRAPH_INPUT": OperandLifeTime.SUBGRAPH_INPUT,
    "SUBGRAPH_OUTPUT": OperandLifeTime.SUBGRAPH_OUTPUT,
    "CONSTANT_COPY": OperandLifeTime.CONSTANT_COPY,
    "CONSTANT_REFERENCE": OperandLifeTime.CONSTANT_POOL,
    "NO_VALUE": OperandLifeTime.NO_VALUE,
    "SUBGRAPH": OperandLifeTime.SUBGRAPH,
}


class CorpusError(ValueError):
    """A case this reader cannot turn into a model (a corpus defect, not a driver verdict)."""


@dataclass(frozen=True)
class Example:
    """One input → expected output pair. ``inputs[k]`` is None when input k is omitted."""

    inputs: tuple[np.ndarray | None, ...]   # in model input order
    outputs: tuple[np.ndarray, ...]          # in model output order (flat: shapes are output_dims)
    output_dims: tuple[tuple[int, ...] | None, ...]


@dataclass(frozen=True)
class Case:
    name: str                 # e.g. "V1_2/conv2d_v1_2_nchw_quant8"
    spec: str                 # the CTS spec file, e.g. "conv2d_v1_2"
    version: str              # "V1_0" … "V1_2"
    variations: tuple[str, ...]
    raw: dict                 # the case's JSON model
    examples: tuple[dict, ...]
    ignored_outputs: frozenset[int]   # positions among the model outputs
    expect_failure: bool
    multinomial_tolerance: float

    @property
    def operation_types(self) -> tuple[str, ...]:
        return tuple(o["type"] for o in self.raw["operations"])

    @property
    def operation(self) -> str:
        """The operation the case tests: its model's last operation (the variations that turn
        inputs into internal operands or make tensors zero-sized add producers before it)."""
        return self.raw["operations"][-1]["type"]

    @property
    def relaxed(self) -> bool:
        return bool(self.raw["relax_fp32_to_fp16"])

    @property
    def has_float16(self) -> bool:
        return any(o["type"] in ("TENSOR_FLOAT16", "FLOAT16") for o in self.raw["operands"])

    def output_types(self) -> list[OperandType]:
        ops = self.raw["operands"]
        return [OperandType[ops[i]["type"]] for i in self.raw["outputs"]]


def load_cases(path: Path | str | None = None, operations: Iterable[str] | None = None,
               name_contains: str | None = None) -> Iterator[Case]:
    """Cases of the corpus, optionally only those testing ``operations`` (NNAPI names)."""
    wanted = {o.upper() for o in operations} if operations else None
    # A wanted case's line holds the text of its operation's name, quoted, and of ``name_contains``
    # where JSON writes that as is (letters, digits, '_', '-', '.': a writer may escape others, '/'):
    # lines without them are skipped unparsed (parsing every line was most of a one-operation load).
    quoted = tuple(f'"{o}"' for o in wanted or ())
    plain = name_contains if name_contains and re.fullmatch(r"[\w.\-]+", name_contains, re.ASCII) else None
    with gzip.open(path or DEFAULT_CORPUS, "rt", encoding="utf-8") as f:
        for line in f:
            if (quoted and not any(q in line for q in quoted)) or (plain and plain not in line):
                continue
            c = json.loads(line)
            m = c["model"]
            if wanted is not None and m["operations"][-1]["type"] not in wanted:
                continue
            if name_contains and name_contains not in c["name"]:
                continue
            positions = {idx: k for k, idx in enumerate(m["outputs"])}
            yield Case(name=c["name"], spec=c["spec"], version=c["version"],
                       variations=tuple(str(v) for v in c["variations"] if v is not None), raw=m,
                       examples=tuple(c["examples"]),
                       ignored_outputs=frozenset(positions[i] for i in c["ignored_outputs"] if i in positions),
                       expect_failure=bool(c["expect_failure"]),
                       multinomial_tolerance=float(c.get("multinomial_tolerance") or 0))


def _values(type_: OperandType, values: list) -> np.ndarray:
    dtype = NUMPY_DTYPE[type_]
    if dtype.kind == "f":
        return np.array([float(v) for v in values], dtype=dtype)  # "inf", "-inf", "nan" included
    return np.array(values, dtype=np.int64).astype(dtype) if dtype.kind != "b" else np.array(values, dtype=dtype)


def build_model(case: Case) -> Model:
    """The case's model through hal's model-building API (CONSTANT_REFERENCE → a memory pool)."""
    m = case.raw
    if m.get("referenced_subgraphs"):
        raise CorpusError(f"{case.name}: referenced subgraphs are not read by this corpus reader yet")
    b = ModelBuilder()
    pool = bytearray()
    for i, o in enumerate(m["operands"]):
        try:
            t = OperandType[o["type"]]
        except KeyError:
            raise CorpusError(f"{case.name}: operand {i} has unknown type {o['type']}") from None
        cq = o.get("channel_quant")
        idx = b.add_operand(t, () if t in SCALAR_TYPES else o["dimensions"], o.get("scale") or 0.0,
                            o.get("zero_point") or 0,
                            SymmPerChannelQuantParams(tuple(float(s) for s in cq["scales"]), int(cq["channel_dim"]))
                            if cq else None)
        lifetime = _LIFETIMES[o["lifetime"]]
        if lifetime == OperandLifeTime.CONSTANT_COPY:
            b.set_constant(idx, _values(t, o["value"]).tobytes())
        elif lifetime == OperandLifeTime.CONSTANT_POOL:
            data = _values(t, o["value"]).tobytes()
            pool.extend(b"\0" * (-len(pool) % 64))
            b.operands[idx].lifetime = lifetime
            b.operands[idx].location = DataLocation(pool_index=0, offset=len(pool), length=len(data))
            pool.extend(data)
        elif lifetime == OperandLifeTime.NO_VALUE:
            b.set_no_value(idx)
        elif lifetime == OperandLifeTime.TEMPORARY_VARIABLE:
            pass
        elif lifetime not in (OperandLifeTime.SUBGRAPH_INPUT, OperandLifeTime.SUBGRAPH_OUTPUT):
            raise CorpusError(f"{case.name}: operand {i} has lifetime {o['lifetime']}")
    for op in m["operations"]:
        b.add_operation(_operation_code(case, op["type"]), op["inputs"], op["outputs"])
    b.identify_inputs_and_outputs(m["inputs"], m["outputs"])
    model = b.finish()
    if pool:
        model.pools = [bytes(pool)]
    model.relax_computation_float32_to_float16 = case.relaxed
    return model


def _operation_code(case: Case, name: str) -> int:
    from hal.types import OperationType
    try:
        return int(OperationType[name])
    except KeyError:
        raise CorpusError(f"{case.name}: unknown operation {name}") from None


def examples(case: Case) -> Iterator[Example]:
    """The case's examples as arrays in model order (inputs shaped by their operands)."""
    m = case.raw
    ops = m["operands"]
    for ex in case.examples:
        inputs: list[np.ndarray | None] = []
        for idx in m["inputs"]:
            o = ops[idx]
            t = OperandType[o["type"]]
            flat = ex["inputs"].get(str(idx), [])
            if not flat:
                inputs.append(None)  # omitted optional input (the corpus's empty list)
                continue
            arr = _values(t, flat)
            inputs.append(arr.reshape(()) if t in SCALAR_TYPES else arr.reshape(o["dimensions"]))
        outputs, dims = [], []
        for idx in m["outputs"]:
            t = OperandType[ops[idx]["type"]]
            outputs.append(_values(t, ex["outputs"].get(str(idx), [])))
            d = (ex.get("output_dims") or {}).get(str(idx))
            dims.append(tuple(d) if d is not None else None)
        yield Example(tuple(inputs), tuple(outputs), tuple(dims))
