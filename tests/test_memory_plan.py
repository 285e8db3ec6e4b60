"""The compiled memory plan: every intermediate tensor is dropped after its last reader."""
from __future__ import annotations

import tracemalloc

import numpy as np

from hal.compiler import compile_model
from hal.executor import execute
from hal.model import ModelBuilder
from hal.serialize import dump_compiled, load_compiled
from hal.types import OperandType as T
from hal.types import OperationType as O
from tests.service.models import add_chain


def _diamond():
    """t1 = x + x; t2 = t1 + x; unused = t1 + t1 (never read); y = t1 + t2."""
    b = ModelBuilder()
    x = b.add_operand(T.TENSOR_FLOAT32, (4,))
    t1, t2, unused, y = (b.add_operand(T.TENSOR_FLOAT32, (4,)) for _ in range(4))
    b.add_operation(O.ADD, [x, x, b.add_int32(0)], [t1])
    b.add_operation(O.ADD, [t1, x, b.add_int32(0)], [t2])
    b.add_operation(O.ADD, [t1, t1, b.add_int32(0)], [unused])
    b.add_operation(O.ADD, [t1, t2, b.add_int32(0)], [y])
    b.identify_inputs_and_outputs([x], [y])
    return b.finish(), (x, t1, t2, unused, y)


def test_release_points_follow_last_use():
    model, (x, t1, t2, unused, y) = _diamond()
    plan = compile_model(model, backend_order=["reference"]).static_plan  # one step per operation
    assert plan.release == [(), (), (unused,), (t1, t2)]  # x is an input, y an output: never released
    out = execute(compile_model(model, backend_order=["reference"]), [np.arange(4, dtype=np.float32)])[0]
    np.testing.assert_array_equal(out, 5 * np.arange(4, dtype=np.float32))


def test_a_partition_step_releases_what_it_consumed():
    """A graph backend's partition is one step of the program: the temporaries inside it never
    reach the executor, and the ones it reads die after it as after any step."""
    model, (x, t1, t2, unused, y) = _diamond()
    plan = compile_model(model, backend_order=["onnxruntime", "reference"]).static_plan
    assert len(plan.program) == 1 and plan.program[0].outputs == (y,) and plan.release == [()]
    out = execute(compile_model(model, backend_order=["onnxruntime", "reference"]), [np.arange(4, dtype=np.float32)])[0]
    np.testing.assert_array_equal(out, 5 * np.arange(4, dtype=np.float32))


def test_cached_plan_has_the_same_releases():
    model, _ = _diamond()
    compiled = compile_model(model)
    loaded = load_compiled(*dump_compiled(compiled))
    assert loaded.static_plan.release == compiled.static_plan.release


def test_peak_memory_of_a_chain_is_bounded():
    """32 ADDs on 1 MiB tensors: without the plan every intermediate stays alive (32 MiB)."""
    n, shape = 32, (512, 512)
    compiled = compile_model(add_chain(n, shape))
    x = np.ones(shape, np.float32)
    tracemalloc.start()
    try:
        out = execute(compiled, [x])[0]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    np.testing.assert_array_equal(out, (n + 1) * x)
    assert peak < 4 * x.nbytes, f"peak {peak / x.nbytes:.1f} tensors alive"
