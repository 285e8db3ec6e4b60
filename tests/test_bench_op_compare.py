"""bench/op_compare.py: a model cut into one-operator models computes what the whole model
computes, operator by operator; nnhal's side times every bound step."""
from __future__ import annotations

import numpy as np

from bench import op_compare
from delegate.runtime import Interpreter
from delegate.tfl import read_model
from hal import backends
from nnhal.examples import mobilenet_like


def test_each_one_operator_model_computes_the_whole_models_tensor():
    data = mobilenet_like(np.float32, input_size=32)
    graph = read_model(data)
    whole = Interpreter(model_content=data, num_threads=1, experimental_preserve_all_tensors=True)
    whole.allocate_tensors()
    x = np.random.default_rng(0).uniform(-1, 1, whole.get_input_details()[0]["shape"]).astype(np.float32)
    whole.set_tensor(whole.get_input_details()[0]["index"], x)
    whole.invoke()
    pieces = op_compare.one_operator_models(data)
    assert [kind for kind, _, _ in pieces] == [op_compare.builtin_name(n.builtin_code) for n in graph.nodes]
    for node, (kind, shape, model) in zip(graph.nodes, pieces, strict=True):
        one = Interpreter(model_content=model, num_threads=1)
        one.allocate_tensors()
        feeds = [i for i in node.inputs if i >= 0 and graph.tensors[i].data is None]
        for d, i in zip(one.get_input_details(), feeds, strict=True):
            one.set_tensor(d["index"], whole.get_tensor(i))
        one.invoke()
        want = whole.get_tensor(node.outputs[0])
        assert shape == want.shape
        np.testing.assert_allclose(one.get_tensor(one.get_output_details()[0]["index"]), want, rtol=1e-6,
                                   atol=1e-6, err_msg=kind)


def test_the_report_has_both_sides():
    backends.ensure_loaded()
    data = mobilenet_like(np.float32, input_size=32)
    x = [np.random.default_rng(1).uniform(-1, 1, (1, 32, 32, 3)).astype(np.float32)]
    ours, whole = op_compare.nnhal_times(data, x)
    assert ours and whole > 0 and all(t.us > 0 for t in ours)
    lite = op_compare.litert_times(data, np.random.default_rng(2))
    assert len(lite) == len(read_model(data).nodes)
    text = op_compare.report("mobilenet_like", lite, op_compare.litert_whole_us(data, x), ours, whole)
    assert "LiteRT by kind:" in text and "nnhal by kind:" in text and "CONV_2D" in text
