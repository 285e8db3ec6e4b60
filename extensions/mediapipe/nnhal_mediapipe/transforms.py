"""TransformTensorBilinear and TransformLandmarks (version 2): apply a 4x4 matrix's first two rows.

Both take the matrix Landmarks2TransformMatrix makes (output pixel -> input coordinates) and read
only its first two rows, ``m[0, :]`` and ``m[1, :]``; z enters as 0, w as 1.

TransformTensorBilinear - mediapipe/util/tflite/operations/transform_tensor_bilinear.cc (``v2``,
registered under this name; ``TransformTensor`` is the v1 kernel without the corner correction):
- Inputs: 0 data [1, H, W, C], 1 the matrix; output [1, out_h, out_w, C] float32, its size taken
  from the output tensor (the CPU kernel ignores the ``output_height`` / ``output_width`` options
  the GPU delegate reads; nnhal refuses a model where they disagree with the tensor).
- Align-corners correction: ``m[i, 3] += 0.5 * (m[i, 0] + m[i, 1]) - 0.5`` for rows 0 and 1.
- Each output pixel (x, y) samples the input at ``(tx, ty) = m[:2] @ (x, y, 0, 1)``: zero when
  ``tx`` is outside [0, W - 1] or ``ty`` outside [0, H - 1]; otherwise bilinear between the pixels
  at floor and floor + 1 (a neighbour past the edge reads as 0, with weight 0 there).

TransformLandmarks - mediapipe/util/tflite/operations/transform_landmarks.cc (``v2``):
- Inputs: 0 landmarks [1, N, D] with D = 2 or 3, 1 the matrix; output of the input's shape.
- ``(x, y) <- m[:2] @ (x, y, 0, 1)``; z (when D = 3) is copied. Options are not read.

Both process batch 0 only (MediaPipe writes nothing else), so nnhal requires a batch of 1, and a
matrix of 16 elements (MediaPipe reads 8 floats without checking). Non-finite sample coordinates
give 0 (MediaPipe's float -> int conversion of them is undefined).

NNAPI operations of com.google.mediapipe: TRANSFORM_TENSOR_BILINEAR (type 2): inputs 0-1
TENSOR_FLOAT32, 2-3 INT32 output height / width; TRANSFORM_LANDMARKS (type 3): inputs 0-1
TENSOR_FLOAT32. One TENSOR_FLOAT32 output each.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from nnhal.hal.operations.common import F32, INT32, param

BILINEAR_CODE = "TransformTensorBilinear"
LANDMARKS_CODE = "TransformLandmarks"
VERSIONS = (1, 2)  # see _tflite: the delegate sees 1


@dataclass
class SampleData:
    out_h: int
    out_w: int


def _check_matrix(ctx, i: int = 1) -> None:
    size = int(np.prod(ctx.input_shape(i)))
    ctx.check(size == 16, f"input {i} must be a 4x4 matrix (16 elements), got shape {list(ctx.input_shape(i))}")


def _rows(matrix: np.ndarray) -> np.ndarray:
    return matrix.reshape(4, 4)[:2].astype(np.float32)


def bilinear_validate(ctx) -> None:
    ctx.expect_num_inputs(4)
    ctx.expect_num_outputs(1)
    ctx.expect_input_type(0, F32)
    ctx.expect_input_rank(0, 4)
    ctx.expect_input_type(1, F32)
    for i in (2, 3):
        v = param(ctx, i, INT32)
        ctx.check(v is None or v >= 1, f"input {i}: output size must be >= 1, got {v}")
    ctx.expect_output_type(0, F32)


def bilinear_prepare(ctx) -> SampleData:
    b, h, w, c = ctx.input_shape(0)
    ctx.check(b == 1, f"input 0 must have a batch of 1 (MediaPipe samples batch 0 only), got {b}")
    _check_matrix(ctx)
    oh, ow = param(ctx, 2, INT32), param(ctx, 3, INT32)
    ctx.set_output_shape(0, (1, oh, ow, c))
    return SampleData(int(oh), int(ow))


def bilinear_execute(ctx, inputs):
    d: SampleData = ctx.data
    image = inputs[0][0]
    h, w, c = image.shape
    m = _rows(inputs[1])
    m64 = m.astype(np.float64)  # the correction is computed in double, as the C++ does, then stored as float
    m[:, 3] = m64[:, 3] + (m64[:, 0] * 0.5 + m64[:, 1] * 0.5 - 0.5)
    ys, xs = np.meshgrid(np.arange(d.out_h, dtype=np.float32), np.arange(d.out_w, dtype=np.float32), indexing="ij")
    tx = m[0, 0] * xs + m[0, 1] * ys + m[0, 3]
    ty = m[1, 0] * xs + m[1, 1] * ys + m[1, 3]
    inside = (tx >= 0) & (tx <= w - 1) & (ty >= 0) & (ty <= h - 1)  # False for NaN
    tx, ty = np.where(inside, tx, 0), np.where(inside, ty, 0)
    x0, y0 = np.floor(tx), np.floor(ty)
    fx, fy = (tx - x0)[..., None], (ty - y0)[..., None]
    x0, y0 = x0.astype(np.int64), y0.astype(np.int64)
    padded = np.zeros((h + 1, w + 1, c), np.float32)  # the +1 row / column: neighbours past the edge read 0
    padded[:h, :w] = image
    upper = (1 - fx) * padded[y0, x0] + fx * padded[y0, x0 + 1]
    lower = (1 - fx) * padded[y0 + 1, x0] + fx * padded[y0 + 1, x0 + 1]
    out = np.where(inside[..., None], fy * lower + (1 - fy) * upper, np.float32(0))
    return [out.astype(np.float32)[None]]


def landmarks_validate(ctx) -> None:
    ctx.expect_num_inputs(2)
    ctx.expect_num_outputs(1)
    ctx.expect_input_type(0, F32)
    ctx.expect_input_rank(0, 3)
    ctx.expect_input_type(1, F32)
    ctx.expect_output_type(0, F32)


def landmarks_prepare(ctx) -> None:
    b, n, dims = ctx.input_shape(0)
    ctx.check(b == 1, f"input 0 must have a batch of 1 (MediaPipe transforms batch 0 only), got {b}")
    ctx.check(dims in (2, 3), f"input 0 landmarks must have 2 or 3 coordinates, got {dims}")
    _check_matrix(ctx)
    ctx.set_output_shape(0, (b, n, dims))
    return None


def landmarks_execute(ctx, inputs):
    pts, m = inputs[0], _rows(inputs[1])
    out = pts.astype(np.float32, copy=True)
    xy = pts[..., :2]
    out[..., :2] = xy @ m[:, :2].T + m[:, 3]
    return [out]


def map_bilinear(ctx, node, code: int) -> None:
    """CUSTOM(TransformTensorBilinear, version 2) -> TRANSFORM_TENSOR_BILINEAR, sized by the output tensor."""
    from nnhal_mediapipe._tflite import expect_node, flexbuffer_options, mapping_error, number
    expect_node(node, BILINEAR_CODE, VERSIONS, 2)
    out = ctx.output_tensor(0)
    if len(out.shape) != 4:
        raise mapping_error(f"{BILINEAR_CODE}: the output tensor must be rank 4, got {list(out.shape)}")
    oh, ow = int(out.shape[1]), int(out.shape[2])
    if node.custom_options:  # the GPU delegate's size; the CPU kernel uses the tensor's
        opts = flexbuffer_options(node, BILINEAR_CODE)
        for key, size in (("output_height", oh), ("output_width", ow)):
            if key in opts and number(opts, key, BILINEAR_CODE, int) != size:
                raise mapping_error(f"{BILINEAR_CODE}: custom option {key}={opts[key]} disagrees with the "
                                    f"output tensor {list(out.shape)}")
    ins = [ctx.tensor(node.inputs[0]), ctx.tensor(node.inputs[1]), ctx.int32(oh), ctx.int32(ow)]
    ctx.operation(code, ins, [ctx.tensor(node.outputs[0])])


def map_landmarks(ctx, node, code: int) -> None:
    """CUSTOM(TransformLandmarks, version 2) -> TRANSFORM_LANDMARKS (options unused, as in MediaPipe)."""
    from nnhal_mediapipe._tflite import expect_node
    expect_node(node, LANDMARKS_CODE, VERSIONS, 2)
    ctx.operation(code, [ctx.tensor(node.inputs[0]), ctx.tensor(node.inputs[1])], [ctx.tensor(node.outputs[0])])
