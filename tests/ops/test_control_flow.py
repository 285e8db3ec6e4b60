"""IF and WHILE vs TFLite's IF / WHILE kernels: TFLite models with referenced subgraphs (built with
the project's builder) converted to NNAPI models and run by hal in-process, equal to TFLite CPU.
CTS (NNAPI 1.0-1.2 here) has no control-flow cases; hal's own semantics (loop timeout, nested and
growing loops, validation) are in tests/test_control_flow.py, the delegate's in tests/delegate."""
import numpy as np
import pytest

import hal
from delegate.mapping import convert_partition
from delegate.tfl import read_model
from hal.types import OperandType, OperationType
from tests.delegate.control_flow_models import counter_loop_model, if_feeds, if_model, loop_feeds
from tests.delegate.helpers import assert_outputs_equal, interpreter, run

COVERED = {(OperationType.IF, OperandType.TENSOR_BOOL8), (OperationType.WHILE, OperandType.SUBGRAPH)}


@pytest.mark.parametrize("model, feeds", [
    (counter_loop_model(), loop_feeds), (counter_loop_model(scalar_cond=True), loop_feeds),
    (if_model(), if_feeds), (if_model(nested_while=True), if_feeds)],
    ids=["while", "while_scalar_cond", "if", "while_in_if"])
def test_converted_model_matches_tflite(model, feeds):
    """The whole graph (read from the file) converted and run by hal equals TFLite CPU."""
    graph = read_model(model)
    part = convert_partition(graph)
    assert part.model.referenced and part.input_tensors == graph.inputs
    compiled = hal.compile_model(part.model)
    ref = interpreter(model)
    for xs in feeds(np.random.default_rng(0)):
        got = hal.execute(compiled, xs)
        assert_outputs_equal([got[part.output_tensors.index(t)] for t in graph.outputs], run(ref, xs))
