"""CompiledModel <-> cache payload: outputs identical after a round trip, nothing stored twice."""
from __future__ import annotations

import json

import numpy as np
import pytest

import hal
from delegate.mapping import convert_partition
from delegate.tfl import read_model
from hal.backends.graph import GraphBackend
from hal.serialize import FORMAT_VERSION, SerializationError, _Decoder, _Encoder, dump_compiled, load_compiled
from nnhal.examples import mobilenet_like
from tests.harness import random_tensor


@pytest.mark.parametrize("dtype", [np.float32, np.uint8, np.int8])
def test_round_trip_gives_identical_outputs(dtype):
    model = convert_partition(read_model(mobilenet_like(dtype, input_size=16, width=8))).model
    compiled = hal.compile_model(model)
    payload, arrays = dump_compiled(compiled)
    loaded = load_compiled(payload, [a.copy() for a in arrays])
    x = random_tensor(np.random.default_rng(0), (1, 16, 16, 3), dtype)
    for a, b in zip(hal.execute(compiled, [x]), hal.execute(loaded, [x])):
        np.testing.assert_array_equal(a, b)


def test_packed_weights_are_stored_once():
    """Conv filters and FC weights are kept only in their packed form (what execute reads), with
    per-operation backends (graph backends' partitions: tests/backends/test_ort.py)."""
    model = convert_partition(read_model(mobilenet_like(np.float32, input_size=16, width=8))).model
    per_op = [b.name for b in hal.backends.available() if not isinstance(b, GraphBackend)]
    compiled = hal.compile_model(model, backend_order=per_op)
    payload, arrays = dump_compiled(compiled)
    stored_constants = {int(i) for i, _ in json.loads(payload)["constants"]}
    weights = {s.inputs[p] for s in compiled.static_plan.steps for p in s.kernel.prepacked_inputs}
    assert weights and not weights & stored_constants
    assert set(compiled.constants) - weights <= stored_constants  # everything else is kept
    op_data = _Encoder(tuple(hal.backends.available()))  # every backend admitted: only its arrays count
    for step in compiled.static_plan.steps:
        op_data.value(step.ctx.data)
    assert sum(a.nbytes for a in arrays) < sum(v.nbytes for v in compiled.constants.values()) + \
        sum(a.nbytes for a in op_data.arrays)


def test_bad_payloads_are_rejected_cleanly():
    model = convert_partition(read_model(mobilenet_like(np.int8, input_size=16, width=8))).model
    payload, arrays = dump_compiled(hal.compile_model(model))
    with pytest.raises(SerializationError, match="payload format"):
        load_compiled(payload.replace(f'"format":{FORMAT_VERSION}'.encode(), b'"format":1'), arrays)
    with pytest.raises(SerializationError):
        load_compiled(payload[: len(payload) // 2], arrays)
    with pytest.raises(SerializationError, match="array index"):
        load_compiled(payload, arrays[:1])
    evil = payload.replace(b'"hal.backends.', b'"os.', 1)  # a plan-data class of whichever backend ran
    assert evil != payload
    with pytest.raises(SerializationError):
        load_compiled(evil, arrays)


def test_a_reference_cannot_walk_into_other_modules():
    """The allow-list is checked on what a reference reaches, not only on the module it names:
    a core module's imports (json, numpy, the backends package) are not reachable through it.
    (float32: the reference backend runs every conv, whatever faster backend is installed)"""
    model = convert_partition(read_model(mobilenet_like(np.float32, input_size=16, width=8))).model
    payload, arrays = dump_compiled(hal.compile_model(model, backend_order=["reference"]))
    for forged in (b'"hal.serialize:json.loads"', b'"hal.types:np.load"',
                   b'"hal.serialize:backends.reference.conv.ConvData"'):
        evil = payload.replace(b'"hal.backends.reference.conv:ConvData"', forged, 1)
        assert evil != payload
        with pytest.raises(SerializationError, match="unknown reference|refused reference"):
            load_compiled(evil, arrays, backend_order=["reference"])


def test_slices_round_trip_and_hold_only_ints():
    """A plan may keep basic indexing (PAD's window, STRIDED_SLICE's ranges): a slice must not make
    its model uncacheable, and a payload's slice is built from ints and None only."""
    enc = _Encoder()
    tree = enc.value((slice(1, None, 2), slice(np.int64(3), 7), slice(None)))
    assert _Decoder([]).value(json.loads(json.dumps(tree))) == (slice(1, None, 2), slice(3, 7), slice(None))
    for bad in (slice(0.5, 2), slice("a", None), slice(True, 2)):
        with pytest.raises(SerializationError, match="slice"):
            enc.value(bad)
    for forged in ([1, "x", None], [1, 2], [1.5, None, None], [{"t": "fn", "ref": "hal.types:X"}, 1, 1]):
        with pytest.raises(SerializationError, match="slice"):
            _Decoder([]).value({"t": "slice", "v": forged})


@pytest.mark.parametrize("order", [("reference",), ("numba", "reference")], ids=",".join)
def test_every_operation_family_round_trips_through_the_cache(order):
    """Every model hal compiles statically is cached: dump_compiled never refuses one (a plan
    holding an object the serializer cannot write silently disabled caching for PAD and
    STRIDED_SLICE models), and the loaded copy computes the same outputs bit for bit."""
    from hal.errors import HalError
    from nnhal.cts.corpus import CorpusError, build_model, examples, load_cases
    if any(hal.backends.get(name) is None for name in order):
        pytest.skip(f"backend order {order} not available here")
    done = set()  # (operation, its input types, relaxed): one case each, float and quantized
    for case in load_cases():
        raw = case.raw
        key = (case.operation, case.relaxed,
               tuple(raw["operands"][i]["type"] for i in raw["operations"][-1]["inputs"]))
        if key in done or case.expect_failure:
            continue
        try:
            compiled = hal.compile_model(build_model(case), backend_order=order)
        except (CorpusError, HalError):
            continue  # not supported by these backends (the CTS runner says so)
        if compiled.static_plan is None:
            continue  # planned per execution from runtime values: never cached, by design
        done.add(key)
        payload, arrays = dump_compiled(compiled)
        arrays = [np.array(a) for a in arrays]
        for a in arrays:
            a.setflags(write=False)  # as the cache maps them
        loaded = load_compiled(payload, arrays, backend_order=order)
        inputs = list(next(examples(case)).inputs)
        for got, want in zip(hal.execute(loaded, inputs), hal.execute(compiled, inputs), strict=True):
            np.testing.assert_array_equal(got, want, err_msg=case.name)
    families = {key[0] for key in done}
    assert {"PAD", "PAD_V2", "STRIDED_SLICE", "CONV_2D", "SOFTMAX", "SPLIT"} <= families
    assert len(families) > 70
