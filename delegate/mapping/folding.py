"""Converter patterns folded at delegation time, as TFLite's NNAPI delegate does.

fp16-weight models carry DEQUANTIZE(float16 constant) -> float32 weights, some
int8 models DEQUANTIZE(int8 constant), and sparse models DENSIFY(sparse
constant); folding turns those outputs into plain constants, so such models
delegate whole and the weights are sent once, not per invoke. The folded node
stays in the partition (TFLite removes it) and emits no NNAPI operation.

Shape arithmetic folds too: Keras' Flatten of a dynamic batch becomes SHAPE(x) ->
STRIDED_SLICE (the batch, a scalar) -> PACK(batch, features) -> RESHAPE(x, that). SHAPE of a
tensor whose shape is known is a constant of *these* shapes, and the integer STRIDED_SLICE /
PACK / CONCATENATION over constants after it are constants too, so the RESHAPE gets a constant
shape and NNAPI never sees the scalars. Such a constant is only valid for the shapes it was
folded at: fold_constants recomputes every folded tensor from the graph it is given (a
partition converted again for resized shapes folds again, and its model, hence its token,
changes with them).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from delegate.mapping.core import unresolved_shape
from delegate.tfl.graph import Sparsity, TfLiteGraph, TfLiteNode, TfLiteTensor
from delegate.tfl.schema import BuiltinOperator, TensorType
from hal.operations.strided_slice import axis_range


def fold_constants(graph: TfLiteGraph) -> tuple[TfLiteGraph, set[int]]:
    """A graph whose foldable outputs carry data (constant-input DEQUANTIZE / DENSIFY, SHAPE of a
    tensor of known shape, integer STRIDED_SLICE / PACK / CONCATENATION of constants); and those
    node indexes.

    Nodes are visited in run order, so chains fold too (DENSIFY -> DEQUANTIZE, SHAPE ->
    STRIDED_SLICE -> PACK). Data a foldable node's output carries from an earlier folding is
    dropped first and computed again from this graph's shapes: folding a graph twice is folding
    it once, and a graph whose shapes changed gets constants of its new shapes."""
    tensors = list(graph.tensors)
    changed = False
    for node in graph.nodes:  # a node's output holds data only because it was folded before
        if node.builtin_code in _FOLDABLE:
            for t in node.outputs:
                if 0 <= t < len(tensors) and tensors[t].data is not None:
                    tensors[t] = dataclasses.replace(tensors[t], data=None)
                    changed = True
    folded: set[int] = set()
    for node in graph.nodes:
        if node.builtin_code in _SHAPE_FOLDS:
            data = _fold_shape_arithmetic(node, tensors)
            if data is not None:
                dst = tensors[node.outputs[0]]
                tensors[dst.index] = dataclasses.replace(dst, data=data)
                folded.add(node.index)
            continue
        if node.builtin_code not in (BuiltinOperator.DEQUANTIZE, BuiltinOperator.DENSIFY):
            continue
        if len(node.inputs) != 1 or len(node.outputs) != 1 or not 0 <= node.inputs[0] < len(tensors):
            continue
        src, dst = tensors[node.inputs[0]], tensors[node.outputs[0]]
        if not src.is_constant:
            continue
        if node.builtin_code == BuiltinOperator.DENSIFY:
            try:
                data = densify(src.data, dst.shape, src.sparsity) if src.sparse else None
            except (ValueError, IndexError):
                data = None  # malformed sparsity: leave the node to TFLite
        elif src.sparse or dst.type != TensorType.FLOAT32:
            continue
        else:
            data = _dequantize(src)
        if data is None or data.size != int(np.prod(dst.shape)):
            continue
        tensors[dst.index] = dataclasses.replace(dst, data=data.reshape(dst.shape))
        folded.add(node.index)
    if not folded and not changed:
        return graph, folded
    return dataclasses.replace(graph, tensors=tensors), folded


#: Integer tensor types shape arithmetic is folded for (TFLite's SHAPE gives int32 or int64).
_INT_TYPES = {TensorType.INT32: np.int32, TensorType.INT64: np.int64}


def _fold_shape(node: TfLiteNode, ins: list[TfLiteTensor]) -> np.ndarray | None:
    """SHAPE: the input's dimensions, when TFLite knows them now (not sized at run time, no
    dimension unresolved). The input need not be a constant: only its shape is read."""
    x = ins[0]
    if x.sparse or unresolved_shape(x) is not None:
        return None
    return np.asarray(x.shape, np.int64)


def _fold_strided_slice(node: TfLiteNode, ins: list[TfLiteTensor]) -> np.ndarray | None:
    """TFLite's STRIDED_SLICE over constants: masks, negative indexes and shrink axes (which make
    the scalars of SHAPE -> STRIDED_SLICE); ellipsis / new-axis masks and ``offset`` are left to
    TFLite (the node then goes through the mapper)."""
    o = node.options
    if len(ins) != 4 or o.get("ellipsis_mask", 0) or o.get("new_axis_mask", 0) or o.get("offset", False):
        return None
    x = ins[0].data
    begin, end, strides = (np.asarray(t.data).reshape(-1).tolist() for t in ins[1:])
    if not len(begin) == len(end) == len(strides) == x.ndim or 0 in strides:
        return None
    index = []
    for k, dim in enumerate(x.shape):
        bit = 1 << k
        if o.get("shrink_axis_mask", 0) & bit:
            i = begin[k] + dim if begin[k] < 0 else begin[k]
            if o.get("begin_mask", 0) & bit:  # TFLite honours it on a shrink axis too
                i = 0 if strides[k] > 0 else dim - 1
            if not 0 <= i < dim:
                return None
            index.append(i)
            continue
        start, stop = axis_range(dim, begin[k], end[k], strides[k], bool(o.get("begin_mask", 0) & bit),
                                 bool(o.get("end_mask", 0) & bit))
        index.append(slice(start, None if stop < 0 else stop, strides[k]))
    return np.asarray(x[tuple(index)])


def _fold_pack(node: TfLiteNode, ins: list[TfLiteTensor]) -> np.ndarray | None:
    arrays = [np.asarray(t.data) for t in ins]
    if not arrays or node.options.get("values_count", len(arrays)) != len(arrays) or \
            len({a.shape for a in arrays}) != 1:
        return None
    rank = arrays[0].ndim + 1
    axis = int(node.options.get("axis", 0))
    return np.stack(arrays, axis % rank) if -rank <= axis < rank else None


def _fold_concatenation(node: TfLiteNode, ins: list[TfLiteTensor]) -> np.ndarray | None:
    arrays = [np.asarray(t.data) for t in ins]
    if not arrays or node.options.get("fused_activation_function", 0) or len({a.ndim for a in arrays}) != 1:
        return None
    rank = arrays[0].ndim
    axis = int(node.options.get("axis", 0))
    if not -rank <= axis < rank:
        return None
    try:
        return np.concatenate(arrays, axis % rank)
    except ValueError:  # mismatched shapes: TFLite's error, not a constant
        return None


_SHAPE_FOLDS = {BuiltinOperator.SHAPE: _fold_shape, BuiltinOperator.STRIDED_SLICE: _fold_strided_slice,
                BuiltinOperator.PACK: _fold_pack, BuiltinOperator.CONCATENATION: _fold_concatenation}
_FOLDABLE = {BuiltinOperator.DEQUANTIZE, BuiltinOperator.DENSIFY, *_SHAPE_FOLDS}


def _fold_shape_arithmetic(node: TfLiteNode, tensors: list[TfLiteTensor]) -> np.ndarray | None:
    """The constant an integer shape-arithmetic node computes, or None (it is left to the mapper).

    Only integer outputs, and only when every input is a constant (SHAPE: has a known shape), the
    result has the output tensor's declared shape and fits its type."""
    if len(node.outputs) != 1 or not 0 <= node.outputs[0] < len(tensors) or \
            any(not 0 <= t < len(tensors) for t in node.inputs):
        return None
    dst = tensors[node.outputs[0]]
    ins = [tensors[t] for t in node.inputs]
    if dst.type not in _INT_TYPES or dst.is_quantized:
        return None
    if node.builtin_code != BuiltinOperator.SHAPE and any(
            not t.is_constant or t.sparse or t.type not in _INT_TYPES or t.is_quantized for t in ins):
        return None
    try:
        data = _SHAPE_FOLDS[node.builtin_code](node, ins)
    except (ValueError, TypeError, IndexError, OverflowError):  # malformed node: left to the mapper
        return None
    dtype = _INT_TYPES[dst.type]
    if data is None or tuple(data.shape) != tuple(dst.shape) or (
            data.size and (data.min() < np.iinfo(dtype).min or data.max() > np.iinfo(dtype).max)):
        return None
    return data.astype(dtype)


def densify(values: np.ndarray, shape, sp: Sparsity) -> np.ndarray:
    """TFLite's sparse format (traversal order, block map, DENSE / SPARSE_CSR levels) to a dense array.

    Level by level, vectorised: each level expands the set of visited positions (a DENSE level by
    its size, a CSR level by its segment), carrying the coordinate of the dimension it walks.
    """
    rank = len(shape)
    levels = len(sp.traversal_order)
    if levels != len(sp.dim_metadata) or sorted(sp.traversal_order) != list(range(levels)):
        raise ValueError("inconsistent sparsity parameters")
    coords = np.zeros((levels, 1), np.int64)  # expanded-dimension coordinates of each visited position
    prev = np.zeros(1, np.int64)
    for level, dim in enumerate(sp.traversal_order):
        meta = sp.dim_metadata[level]
        if meta.format == 0:  # DENSE
            size = meta.dense_size
            prev = (prev[:, None] * size + np.arange(size)).reshape(-1)
            coords = np.repeat(coords, size, axis=1)
            coords[dim] = np.tile(np.arange(size), len(prev) // max(size, 1))
        else:  # SPARSE_CSR
            seg = np.asarray(sp.dim_metadata[level].segments, np.int64)
            idx = np.asarray(meta.indices, np.int64)
            counts = seg[prev + 1] - seg[prev]
            starts = np.repeat(seg[prev] - np.concatenate(([0], np.cumsum(counts)[:-1])), counts)
            prev = starts + np.arange(int(counts.sum()))
            coords = np.repeat(coords, counts, axis=1)
            coords[dim] = idx[prev]
    if coords.shape[1] != values.size:
        raise ValueError(f"{values.size} stored values for {coords.shape[1]} sparse positions")
    dense_index = []
    for d in range(rank):
        c = coords[d]
        if d in sp.block_map:
            j = sp.block_map.index(d)
            block = sp.dim_metadata[sp.traversal_order.index(rank + j)].dense_size
            c = c * block + coords[rank + j]
        dense_index.append(c)
    out = np.zeros(shape, values.dtype)
    out[tuple(dense_index)] = values
    return out


def _dequantize(t) -> np.ndarray | None:
    """TFLite's dequantize: float16 widened; 8-bit as float(scale * (q - zero_point))."""
    if t.type == TensorType.FLOAT16:
        return t.data.astype(np.float32)
    if t.type in (TensorType.INT8, TensorType.UINT8) and t.scales:
        q = t.data.astype(np.int32)
        scales = np.asarray(t.scales, np.float32)
        zps = np.asarray(t.zero_points or [0] * len(scales), np.int32)
        if len(scales) > 1:
            shape = [1] * q.ndim
            shape[t.quantized_dimension] = -1
            scales, zps = scales.reshape(shape), zps.reshape(shape)
        return ((q - zps).astype(np.float32) * scales).astype(np.float32)
    return None
