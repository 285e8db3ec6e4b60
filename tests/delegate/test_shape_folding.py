"""Shape arithmetic folded at delegation time (delegate.mapping.folding) computes what TFLite's own
kernels compute: each fold is checked against TFLite running the same one-node model on constants.
(Flatten of a dynamic batch, the pattern it exists for: tests/delegate/test_dynamic_shapes.py.)"""
from __future__ import annotations

import numpy as np
import pytest

from delegate.mapping.folding import fold_constants
from delegate.tfl import TfLiteModelBuilder, read_model
from tests.delegate.helpers import interpreter


def _one_node(op: str, inputs: list[np.ndarray], options, out_shape, *, out_dtype=np.int32) -> bytes:
    """A model computing ``op`` on constant ``inputs``; its output is the graph's output."""
    b = TfLiteModelBuilder()
    ins = [b.add_constant(f"c{k}", a) for k, a in enumerate(inputs)]
    y = b.add_tensor("y", out_shape, out_dtype)
    b.add_operator(op, ins, [y], options)
    b.set_outputs([y])
    return b.build()


def _tflite(op, inputs, options) -> np.ndarray:
    """What TFLite's reference kernels compute (the output's declared shape is TFLite's own)."""
    it = interpreter(_one_node(op, inputs, options, [1]))
    it.invoke()
    return it.get_tensor(it.get_output_details()[0]["index"])


def _folded(op, inputs, options, out_shape, out_dtype=np.int32) -> np.ndarray | None:
    graph, nodes = fold_constants(read_model(_one_node(op, inputs, options, out_shape, out_dtype=out_dtype)))
    return graph.tensors[graph.nodes[0].outputs[0]].data if nodes == {0} else None


def _strided(begin, end, strides, **masks):
    opts = {"begin_mask": 0, "end_mask": 0, "shrink_axis_mask": 0, **masks}
    vec = [np.array(v, np.int32) for v in (begin, end, strides)]
    return vec, ("StridedSliceOptions", opts)


STRIDED_CASES = {
    "batch of a shape (shrink)": ([0], [1], [1], {"shrink_axis_mask": 1}),
    "last dim (negative shrink)": ([-1], [0], [1], {"shrink_axis_mask": 1}),
    "tail": ([1], [4], [1], {}),
    "end masked": ([1], [0], [1], {"end_mask": 1}),
    "reversed": ([-1], [-5], [-1], {}),
    "every other, begin masked": ([3], [4], [2], {"begin_mask": 1}),
    "clamped": ([-9], [9], [1], {}),
    "2-D, shrink row": ([1, 0], [2, 3], [1, 1], {"shrink_axis_mask": 1}),
}


@pytest.mark.parametrize("case", sorted(STRIDED_CASES))
def test_strided_slice_fold_equals_tflite(case):
    begin, end, strides, masks = STRIDED_CASES[case]
    x = np.array([7, 3, 5, 11], np.int32) if len(begin) == 1 else np.arange(12, dtype=np.int32).reshape(4, 3)
    vec, options = _strided(begin, end, strides, **masks)
    want = _tflite("STRIDED_SLICE", [x, *vec], options)
    got = _folded("STRIDED_SLICE", [x, *vec], options, want.shape)
    assert got is not None and got.dtype == np.int32 and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_pack_fold_equals_tflite(axis):
    inputs = [np.array([1, 2, 3], np.int32), np.array([4, 5, 6], np.int32)]
    options = ("PackOptions", {"values_count": 2, "axis": axis})
    want = _tflite("PACK", inputs, options)
    got = _folded("PACK", inputs, options, want.shape)
    np.testing.assert_array_equal(got, want)
    assert got.shape == want.shape


def test_pack_of_scalars_and_concatenation_fold_equal_tflite():
    scalars = [np.array(3, np.int32), np.array(64, np.int32)]
    options = ("PackOptions", {"values_count": 2, "axis": 0})
    np.testing.assert_array_equal(_folded("PACK", scalars, options, [2]), _tflite("PACK", scalars, options))
    parts = [np.array([-1], np.int32), np.array([8, 8], np.int32)]
    options = ("ConcatenationOptions", {"axis": 0, "fused_activation_function": 0})
    np.testing.assert_array_equal(_folded("CONCATENATION", parts, options, [3]),
                                  _tflite("CONCATENATION", parts, options))


def test_what_is_not_folded():
    """Left to the mappers: float data (not shape arithmetic), a result that does not fit the
    declared output, an ellipsis mask, a SHAPE whose input TFLite sizes only at run time."""
    import dataclasses
    f = [np.array([1.0, 2.0], np.float32), np.array([3.0, 4.0], np.float32)]
    assert _folded("PACK", f, ("PackOptions", {"values_count": 2, "axis": 0}), [2, 2], np.float32) is None
    ints = [np.array([1, 2], np.int32), np.array([3, 4], np.int32)]
    assert _folded("PACK", ints, ("PackOptions", {"values_count": 2, "axis": 0}), [4]) is None
    vec, options = _strided([0], [1], [1], ellipsis_mask=1)
    assert _folded("STRIDED_SLICE", [np.array([1, 2], np.int32), *vec], options, [1]) is None

    b = TfLiteModelBuilder()
    x = b.add_input("x", [2, 3])
    s = b.add_tensor("s", [2], np.int32)
    b.add_operator("SHAPE", [x], [s], ("ShapeOptions", {"out_type": 2}))
    b.set_outputs([s])
    graph = read_model(b.build())
    assert fold_constants(graph)[0].tensors[s].data.tolist() == [2, 3]
    tensors = list(graph.tensors)
    tensors[x] = dataclasses.replace(tensors[x], runtime_shape=True)
    assert fold_constants(dataclasses.replace(graph, tensors=tensors))[1] == set()
