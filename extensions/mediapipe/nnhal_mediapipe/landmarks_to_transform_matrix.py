"""Landmarks2TransformMatrix (version 2): the 4x4 matrix that crops a rotated box around landmarks.

Semantics: mediapipe/util/tflite/operations/landmarks_to_transform_matrix.cc (``v2``), options as
TensorFlow's GPU delegate parses them (ParseLandmarksToTransformMatrixV2Attributes). Face mesh
attention models feed its output to TransformTensorBilinear / TransformLandmarks.
- Input [1, N, 3] float32 landmarks (x, y, z); output [1, 4, 4] float32, row-major.
- custom_options, a FlexBuffer map: ``subset_idxs`` (ints, read as pairs; an odd last one is
  paired with itself), ``left_rotation_idx``, ``right_rotation_idx``, ``target_rotation_radians``,
  ``output_height``, ``output_width``, ``scale_x``, ``scale_y``. A missing key reads as 0, as
  flexbuffers does; MediaPipe's Eval then rejects indices < 0, output sizes <= 0 and scales <= 0.
- Arithmetic: ``r = target - atan2(y_right - y_left, x_right - x_left)``; the subset's (x, y) rotated
  by ``R(r)`` give a box (min/max), its size (w, h) and centre, rotated back by ``R(-r)`` to (cx, cy).
  The matrix is ``shift(cx, cy) @ R4(-r) @ scale(scale_x * w / out_w, scale_y * h / out_h)
  @ shift(-out_w / 2, -out_h / 2)`` (4x4, z untouched): output pixel -> input coordinates.

NNAPI operation LANDMARKS_TO_TRANSFORM_MATRIX (type 1): inputs 0 TENSOR_FLOAT32 [1, N, 3],
1 TENSOR_INT32 [K, 2] constant subset pairs, 2-3 INT32 left / right rotation index, 4 FLOAT32 target
rotation, 5-6 INT32 output height / width, 7-8 FLOAT32 scale x / y; output 0 TENSOR_FLOAT32 [1, 4, 4].
Stricter than MediaPipe, which reads out of bounds instead: landmark indices must be < N and the
subset must not be empty.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from nnhal.hal.operations.common import F32, FLOAT32, I32, INT32, param

CODE = "Landmarks2TransformMatrix"
VERSIONS = (1, 2)  # see _tflite: the delegate sees 1


@dataclass
class MatrixData:
    subset: np.ndarray  # landmark indices (pairs flattened)
    left: int
    right: int
    target: float
    out_h: int
    out_w: int
    scale_x: float
    scale_y: float


def _scalars(ctx) -> tuple:
    """(left, right, target, out_h, out_w, scale_x, scale_y), checked as MediaPipe's Eval checks them."""
    kinds = ((2, INT32, "left_rotation_idx", 0), (3, INT32, "right_rotation_idx", 0), (4, FLOAT32, None, None),
             (5, INT32, "output_height", 1), (6, INT32, "output_width", 1),
             (7, FLOAT32, "scale_x", 0.0), (8, FLOAT32, "scale_y", 0.0))
    values = []
    for i, t, name, low in kinds:
        v = param(ctx, i, t)
        if name is not None and v is not None:
            ok = v >= low if t == INT32 else v > low
            ctx.check(ok, f"input {i} ({name}) must be {'>=' if t == INT32 else '>'} {low}, got {v}")
        values.append(v)
    return tuple(values)


def validate(ctx) -> None:
    ctx.expect_num_inputs(9)
    ctx.expect_num_outputs(1)
    ctx.expect_input_type(0, F32)
    ctx.expect_input_rank(0, 3)
    ctx.expect_input_type(1, I32)
    ctx.expect_input_rank(1, 2)
    _scalars(ctx)
    ctx.expect_output_type(0, F32)


def prepare(ctx) -> MatrixData:
    b, n, c = ctx.input_shape(0)
    ctx.check(b == 1 and c == 3, f"input 0 must be [1, N, 3] landmarks, got {[b, n, c]}")
    subset = np.asarray(ctx.constant(1), np.int32)
    ctx.check(subset.ndim == 2 and subset.shape[1] == 2 and subset.size > 0,
              f"input 1 must be a non-empty [K, 2] subset of landmark pairs, got shape {list(subset.shape)}")
    left, right, target, oh, ow, sx, sy = _scalars(ctx)
    indices = np.concatenate([subset.reshape(-1), [left, right]])
    ctx.check(indices.min() >= 0 and indices.max() < n,
              f"landmark indices must be in [0, {n}), got {sorted(set(indices.tolist()))}")
    ctx.set_output_shape(0, (1, 4, 4))
    return MatrixData(subset.reshape(-1).copy(), int(left), int(right), float(target), int(oh), int(ow),
                      float(sx), float(sy))


def _rotation(r: float) -> np.ndarray:
    return np.array([[np.cos(r), -np.sin(r)], [np.sin(r), np.cos(r)]])


def execute(ctx, inputs):
    """The matrix product, composed in float64 (MediaPipe composes in float32; the difference is
    float32 round-off)."""
    d: MatrixData = ctx.data
    pts = inputs[0][0, :, :2].astype(np.float64)
    (lx, ly), (rx, ry) = pts[d.left], pts[d.right]
    r = d.target - np.arctan2(ry - ly, rx - lx)
    rotated = pts[d.subset] @ _rotation(r).T
    lo, hi = rotated.min(axis=0), rotated.max(axis=0)
    centre = _rotation(-r) @ ((lo + hi) / 2)
    size = hi - lo

    def affine(linear, offset):
        m = np.eye(4)
        m[:2, :2], m[:2, 3] = linear, offset
        return m

    scale = np.diag([d.scale_x * size[0] / d.out_w, d.scale_y * size[1] / d.out_h])
    t = affine(np.eye(2), centre) @ affine(_rotation(-r), 0) @ affine(scale, 0) \
        @ affine(np.eye(2), [-d.out_w / 2, -d.out_h / 2])
    return [t.astype(np.float32).reshape(1, 4, 4)]


def map_tflite(ctx, node, code: int) -> None:
    """CUSTOM(Landmarks2TransformMatrix, version 2) + FlexBuffer options -> LANDMARKS_TO_TRANSFORM_MATRIX."""
    from nnhal.hal.types import OperandType

    from nnhal_mediapipe._tflite import expect_node, flexbuffer_options, mapping_error, number
    expect_node(node, CODE, VERSIONS, 1)
    opts = flexbuffer_options(node, CODE, required=("subset_idxs",))
    subset = opts["subset_idxs"]
    if not isinstance(subset, list) or not subset or not all(isinstance(v, int) for v in subset):
        raise mapping_error(f"{CODE}: custom option subset_idxs must be a non-empty vector of ints, got {subset!r}")
    if len(subset) % 2:
        subset = subset + subset[-1:]  # as the parser: the odd last index pairs with itself
    ins = [ctx.tensor(node.inputs[0]),
           ctx.constant(OperandType.TENSOR_INT32, np.array(subset, np.int32).reshape(-1, 2)),
           ctx.int32(number(opts, "left_rotation_idx", CODE, int, 0)),
           ctx.int32(number(opts, "right_rotation_idx", CODE, int, 0)),
           ctx.float32(number(opts, "target_rotation_radians", CODE, float, 0.0)),
           ctx.int32(number(opts, "output_height", CODE, int, 0)),
           ctx.int32(number(opts, "output_width", CODE, int, 0)),
           ctx.float32(number(opts, "scale_x", CODE, float, 0.0)),
           ctx.float32(number(opts, "scale_y", CODE, float, 0.0))]
    ctx.operation(code, ins, [ctx.tensor(node.outputs[0])])
