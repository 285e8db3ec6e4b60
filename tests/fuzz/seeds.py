"""Valid models the fuzzers start from: NNAPI models (parts a, b) and small .tflite files (part c).

Variety matters more than size: the CTS corpus gives every implemented operation with float32,
float16, relaxed, quantized (per-tensor and per-channel), int32 and bool operands, CONSTANT_POOL
and omitted inputs; the delegate's converter adds whole multi-operation models (nnhal.examples,
tests/delegate models); tests/service gives the service's own small models; the example
extensions add extension operation and operand types.
"""
from __future__ import annotations

import gzip
import io
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from hal.model import Model

#: CTS cases the short slice in `make test` starts from (names in cts/): a spread of operand
#: types, lifetimes and operations, cheap to prepare.
SLICE_CTS = (
    "V1_0/add", "V1_0/conv_quant8", "V1_0/depthwise_conv2d_float_weights_as_inputs", "V1_2/concat_float16_1",
    "V1_2/conv2d_per_channel", "V1_2/gather_int32", "V1_2/pad_v2_1_quant8_all_tensors_as_inputs",
    "V1_2/strided_slice_float16", "V1_1/mean_relaxed", "V1_2/select_v1_2_two_dim_int32",
    "V1_2/resize_bilinear_v1_2_shape_nchw_quant8", "V1_2/fully_connected_v1_2_float16", "V1_2/reshape_float16",
    "V1_2/tile_1_all_inputs_as_internal",
)


@dataclass
class Seed:
    """A valid NNAPI model and, when known, inputs it runs on (model input order; None = omitted)."""

    name: str
    model: Model
    inputs: list[np.ndarray | None] | None = None


def _runs_in_process(model: Model, inputs) -> bool:
    """The reference backend prepares and runs it: a seed must be valid and supported."""
    from hal.compiler import compile_model
    from hal.errors import HalError
    from hal.executor import execute
    try:
        compiled = compile_model(model, backend_order=["reference"])
        if inputs is not None:
            execute(compiled, list(inputs))
        return True
    except HalError:
        return False


def cts_seeds(names: Iterable[str] | None = None, per_operation: int = 3,
              rng: np.random.Generator | None = None) -> list[Seed]:
    """CTS cases as seeds: the ``names`` given, else up to ``per_operation`` cases per tested
    operation drawn with ``rng``. Cases CTS expects to fail and operations nnhal does not
    implement are left out."""
    from nnhal.cts.corpus import DEFAULT_CORPUS, CorpusError, build_model, examples, load_cases
    if names is not None:
        keys = tuple(f'{{"name":"{n}",'.encode() for n in names)
        with gzip.open(DEFAULT_CORPUS, "rb") as f:  # the lines wanted, without parsing the others
            lines = b"".join(line for line in f if line.startswith(keys))
        cases = list(load_cases(io.BytesIO(gzip.compress(lines))))
    else:
        by_op = defaultdict(list)
        for c in load_cases():
            if not c.expect_failure:
                by_op[c.operation].append(c)
        rng = rng or np.random.default_rng(0)
        cases = []
        for op in sorted(by_op):
            pool = by_op[op]
            for k in rng.permutation(len(pool))[:per_operation]:
                cases.append(pool[int(k)])
    seeds = []
    for c in cases:
        try:
            model = build_model(c)
            ex = next(iter(examples(c)), None)
        except CorpusError:
            continue
        inputs = list(ex.inputs) if ex is not None else None
        if _runs_in_process(model, inputs):
            seeds.append(Seed(f"cts:{c.name}", model, inputs))
    return seeds


def _converted(name: str, tflite: bytes, rng: np.random.Generator) -> Seed | None:
    """A .tflite model through the delegate's converter (the whole graph as one NNAPI model)."""
    from delegate.mapping import MappingError, convert_partition
    from delegate.tfl import read_model
    from hal.extension_registry import model_prefixes, operand_dtype
    from tests.harness import random_tensor
    try:
        part = convert_partition(read_model(tflite))
    except MappingError:
        return None
    model = part.model
    sg = model.main
    prefixes = model_prefixes(model)
    inputs = [random_tensor(rng, sg.operands[i].dimensions, operand_dtype(sg.operands[i].type, prefixes))
              for i in sg.input_indexes]
    return Seed(name, model, inputs) if _runs_in_process(model, inputs) else None


def converted_seeds(rng: np.random.Generator | None = None) -> list[Seed]:
    """Whole TFLite models (float32, uint8, int8 with per-channel weights) as the delegate sends them."""
    from nnhal.examples import mobilenet_like
    from tests.delegate.models import add_runs, head_model
    rng = rng or np.random.default_rng(0)
    models = [("tflite:head_float32", head_model(np.float32)), ("tflite:head_uint8", head_model(np.uint8)),
              ("tflite:head_int8", head_model(np.int8)), ("tflite:add_runs", add_runs(1, 3)),
              ("tflite:mobilenet_like_float32", mobilenet_like(np.float32, 16, 4, 5)),
              ("tflite:mobilenet_like_int8", mobilenet_like(np.int8, 16, 4, 5))]
    return [s for s in (_converted(n, m, rng) for n, m in models) if s is not None]


def service_seeds() -> list[Seed]:
    """tests/service's models (control flow among them: referenced subgraphs on the wire), and
    the example extensions' models when they are installed."""
    from hal import extension_registry
    from tests.control_flow_models import branches, counter_loop, loop_inputs
    from tests.service.models import add_chain, add_model
    seeds = [Seed("service:add", add_model((2, 3)), None),
             Seed("service:add_constant", add_model((2, 3), np.arange(6, dtype=np.float32).reshape(2, 3)), None),
             Seed("service:add_chain", add_chain(3, (2, 2)), None),
             Seed("service:while", counter_loop().model, loop_inputs(3)),
             Seed("service:if", branches().model,
                  [np.array([True]), np.ones((2, 3), np.float32), np.full((2, 3), 2, np.float32)])]
    from extensions.plugins import ensure_plugins_loaded
    ensure_plugins_loaded()
    if extension_registry.extension("com.example.fibonacci") is not None:
        from tests.extensions.test_registry import fib_model
        seeds.append(Seed("extension:fibonacci_float32", fib_model(prefix=3), [np.arange(5, dtype=np.float32)]))
        seeds.append(Seed("extension:fibonacci_int64", fib_model(prefix=9, int64=True),
                          [np.arange(5, dtype=np.int64)]))
    return [s for s in seeds if _runs_in_process(s.model, s.inputs)]


def model_seeds(full: bool, rng: np.random.Generator) -> list[Seed]:
    """Every seed for parts (a) and (b): the whole CTS spread when ``full``, else the slice's."""
    cts = cts_seeds(rng=rng) if full else cts_seeds(SLICE_CTS)
    return cts + converted_seeds(rng) + service_seeds()


def tflite_seeds() -> list[tuple[str, bytes]]:
    """Small .tflite files for byte-level mutation (part c): small enough that the flatbuffer's
    structure, not weights, takes a good share of the bytes."""
    from nnhal.examples import mobilenet_like
    from tests.delegate.models import add_runs, head_model
    return [("head_float32", head_model(np.float32)), ("head_int8", head_model(np.int8)),
            ("head_uint8", head_model(np.uint8)), ("add_runs", add_runs(2, 2)),
            ("head_float32_cos", head_model(np.float32, unsupported_middle=True)),
            ("mobilenet_like_int8", mobilenet_like(np.int8, 8, 2, 3))]
