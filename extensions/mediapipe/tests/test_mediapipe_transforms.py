"""Landmarks2TransformMatrix, TransformTensorBilinear and TransformLandmarks (MediaPipe's v2 kernels).

Semantics: mediapipe/util/tflite/operations/landmarks_to_transform_matrix.cc (v2),
transform_tensor_bilinear.cc (v2) and transform_landmarks.cc (v2), registered at version 2 by
mediapipe/util/tflite/cpu_op_resolver.cc; options as TensorFlow's GPU delegate parses them
(tensorflow/lite/delegates/gpu/common/mediapipe/). The references here are written apart from the
kernels: the matrix in closed form (centre + R(-r) diag(scale) (p - out_size / 2)) instead of a
product of four 4x4 matrices, the sampling and the landmark transform as per-pixel / per-landmark
loops.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from flatbuffers import flexbuffers
from hypothesis import given, settings
from hypothesis import strategies as st

from delegate import load_delegate
from delegate.mapping import MappingError, convert_partition
from delegate.runtime import Interpreter
from delegate.tfl import TfLiteModelBuilder, read_model
from hal import compile_model, execute
from hal.errors import HalError
from tests.harness import assert_float_close

L2TM, BILINEAR, LANDMARKS = "Landmarks2TransformMatrix", "TransformTensorBilinear", "TransformLandmarks"


# ---- references --------------------------------------------------------------------------------

def matrix_reference(landmarks, subset, left, right, target, out_h, out_w, scale_x, scale_y):
    """The v2 matrix in closed form: output pixel p -> centre + R(-r) diag(sx, sy) (p - (out_w, out_h) / 2)."""
    pts = [(float(x), float(y)) for x, y, _ in landmarks[0]]
    (lx, ly), (rx, ry) = pts[left], pts[right]
    r = target - math.atan2(ry - ly, rx - lx)
    c, s = math.cos(r), math.sin(r)
    rot = [(c * pts[i][0] - s * pts[i][1], s * pts[i][0] + c * pts[i][1]) for i in subset]
    xs, ys = [p[0] for p in rot], [p[1] for p in rot]
    mx, my = (max(xs) + min(xs)) / 2, (max(ys) + min(ys)) / 2
    cx, cy = c * mx + s * my, -s * mx + c * my  # R(-r) = [[c, s], [-s, c]]
    ax, ay = scale_x * (max(xs) - min(xs)) / out_w, scale_y * (max(ys) - min(ys)) / out_h
    m = np.eye(4)
    m[0, :2], m[1, :2] = (c * ax, s * ay), (-s * ax, c * ay)
    m[0, 3] = cx - (c * ax * out_w / 2 + s * ay * out_h / 2)
    m[1, 3] = cy - (-s * ax * out_w / 2 + c * ay * out_h / 2)
    return m.astype(np.float32).reshape(1, 4, 4)


def bilinear_reference(image, matrix, out_h, out_w):
    """Per output pixel: the corner-corrected matrix's sample position (float32 arithmetic, as the
    C++ float4 dot product), zero outside [0, W-1] x [0, H-1], else bilinear with 0 past the edge."""
    _, h, w, c = image.shape
    m = matrix.reshape(4, 4).astype(np.float32)
    rows = []
    for i in (0, 1):
        corr = float(m[i, 0]) * 0.5 + float(m[i, 1]) * 0.5 - 0.5
        rows.append((m[i, 0], m[i, 1], np.float32(float(m[i, 3]) + corr)))
    out = np.zeros((1, out_h, out_w, c), np.float32)

    def read(y, x):
        return image[0, y, x].astype(np.float64) if 0 <= y < h and 0 <= x < w else np.zeros(c)

    for oy in range(out_h):
        for ox in range(out_w):
            tx, ty = (a * np.float32(ox) + b * np.float32(oy) + t for a, b, t in rows)
            if not (0 <= tx <= w - 1 and 0 <= ty <= h - 1):
                continue
            x0, y0 = math.floor(tx), math.floor(ty)
            fx, fy = float(tx) - x0, float(ty) - y0
            upper = (1 - fx) * read(y0, x0) + fx * read(y0, x0 + 1)
            lower = (1 - fx) * read(y0 + 1, x0) + fx * read(y0 + 1, x0 + 1)
            out[0, oy, ox] = fy * lower + (1 - fy) * upper
    return out


def landmarks_reference(landmarks, matrix):
    m = matrix.reshape(4, 4).astype(np.float64)
    out = landmarks.astype(np.float64).copy()
    for k, (x, y) in enumerate(landmarks[0, :, :2].astype(np.float64)):
        out[0, k, 0] = m[0, 0] * x + m[0, 1] * y + m[0, 3]
        out[0, k, 1] = m[1, 0] * x + m[1, 1] * y + m[1, 3]
    return out.astype(np.float32)


# ---- models ------------------------------------------------------------------------------------

def flex_options(**values) -> bytes:
    """A FlexBuffer map as MediaPipe's converter writes it (int lists as typed vectors)."""
    b = flexbuffers.Builder()
    with b.Map():
        for key, v in values.items():
            if isinstance(v, list):
                b.Key(key)
                b.TypedVectorFromElements(v)
            elif isinstance(v, float):
                b.Float(key, v)
            elif isinstance(v, str):
                b.String(key, v)
            else:
                b.Int(key, v)
    return bytes(b.Finish())


L2TM_OPTIONS = dict(subset_idxs=[0, 1, 2, 3, 4], left_rotation_idx=1, right_rotation_idx=3,
                    target_rotation_radians=0.0, output_height=6, output_width=5, scale_x=1.5, scale_y=1.25)


def l2tm_args(options):
    """matrix_reference's arguments from L2TM options (odd subsets end in a self-pair)."""
    o = {**dict(left_rotation_idx=0, right_rotation_idx=0, target_rotation_radians=0.0), **options}
    subset = o["subset_idxs"] + o["subset_idxs"][-1:] * (len(o["subset_idxs"]) % 2)
    return (subset, o["left_rotation_idx"], o["right_rotation_idx"], o["target_rotation_radians"],
            o["output_height"], o["output_width"], o["scale_x"], o["scale_y"])


def face_crop_model(n=6, image=(1, 8, 7, 2), options=None, l2tm_version=2, bilinear_options=b""):
    """landmarks -> Landmarks2TransformMatrix -> matrix; (image, matrix) -> TransformTensorBilinear;
    (landmarks, matrix) -> TransformLandmarks: the crop step of MediaPipe's face mesh with attention."""
    o = {**L2TM_OPTIONS, **(options or {})}
    b = TfLiteModelBuilder()
    lm = b.add_input("landmarks", [1, n, 3])
    img = b.add_input("image", list(image))
    mat = b.add_tensor("matrix", [1, 4, 4])
    b.add_operator("CUSTOM", [lm], [mat], custom_code=L2TM, custom_options=flex_options(**o), version=l2tm_version)
    crop = b.add_tensor("crop", [1, o["output_height"], o["output_width"], image[3]])
    b.add_operator("CUSTOM", [img, mat], [crop], custom_code=BILINEAR, custom_options=bilinear_options, version=2)
    moved = b.add_tensor("moved", [1, n, 3])
    b.add_operator("CUSTOM", [lm, mat], [moved], custom_code=LANDMARKS, version=2)
    b.set_outputs([mat, crop, moved])
    return b.build()


def face_crop_reference(landmarks, image, options=None):
    o = {**L2TM_OPTIONS, **(options or {})}
    m = matrix_reference(landmarks, *l2tm_args(o))
    return [m, bilinear_reference(image, m, o["output_height"], o["output_width"]), landmarks_reference(landmarks, m)]


def sampler_model(image, out_hw, n_landmarks=None, dims=3, matrix_shape=(1, 4, 4)):
    b = TfLiteModelBuilder()
    img = b.add_input("image", list(image))
    mat = b.add_input("matrix", list(matrix_shape))
    crop = b.add_tensor("crop", [image[0], *out_hw, image[3]])
    b.add_operator("CUSTOM", [img, mat], [crop], custom_code=BILINEAR, version=2)
    outs = [crop]
    if n_landmarks:
        lm = b.add_input("landmarks", [1, n_landmarks, dims])
        moved = b.add_tensor("moved", [1, n_landmarks, dims])
        b.add_operator("CUSTOM", [lm, mat], [moved], custom_code=LANDMARKS, version=2)
        outs.append(moved)
    b.set_outputs(outs)
    return b.build()


def run_in_hal(model: bytes, inputs):
    part = convert_partition(read_model(model))
    return execute(compile_model(part.model), list(inputs))


def random_landmarks(rng, n):
    return (rng.uniform(0, 8, (1, n, 3))).astype(np.float32)


def random_affine(rng):
    """A crop-like 4x4: rotation, scale and shift, sampling partly outside the image."""
    r, s = rng.uniform(-np.pi, np.pi), rng.uniform(0.3, 2.0, 2)
    m = np.eye(4, dtype=np.float32)
    m[:2, :2] = [[math.cos(r) * s[0], -math.sin(r) * s[1]], [math.sin(r) * s[0], math.cos(r) * s[1]]]
    m[:2, 3] = rng.uniform(-3, 8, 2)
    return m.reshape(1, 4, 4)


# ---- kernels against the references ------------------------------------------------------------

@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31), n=st.integers(2, 9), target=st.floats(-3.0, 3.0),
       out_hw=st.tuples(st.integers(1, 9), st.integers(1, 9)), scales=st.tuples(st.floats(0.5, 3), st.floats(0.5, 3)),
       subset_len=st.integers(1, 7))
def test_landmarks_to_transform_matrix_matches_reference(seed, n, target, out_hw, scales, subset_len):
    rng = np.random.default_rng(seed)
    landmarks = random_landmarks(rng, n)
    o = dict(subset_idxs=rng.integers(0, n, subset_len).tolist(), left_rotation_idx=int(rng.integers(n)),
             right_rotation_idx=int(rng.integers(n)), target_rotation_radians=target,
             output_height=out_hw[0], output_width=out_hw[1], scale_x=scales[0], scale_y=scales[1])
    b = TfLiteModelBuilder()
    lm = b.add_input("landmarks", [1, n, 3])
    mat = b.add_tensor("matrix", [1, 4, 4])
    b.add_operator("CUSTOM", [lm], [mat], custom_code=L2TM, custom_options=flex_options(**o), version=2)
    b.set_outputs([mat])
    (got,) = run_in_hal(b.build(), [landmarks])
    want = matrix_reference(landmarks, *l2tm_args(o))
    assert got.shape == (1, 4, 4)
    assert_float_close(got, want, rtol=1e-5, atol=1e-5 * max(1.0, float(np.abs(want).max())))


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31), image=st.tuples(st.integers(1, 7), st.integers(1, 7), st.integers(1, 3)),
       out_hw=st.tuples(st.integers(1, 8), st.integers(1, 8)), n=st.integers(1, 5), dims=st.sampled_from([2, 3]))
def test_sampling_and_landmark_transform_match_reference(seed, image, out_hw, n, dims):
    rng = np.random.default_rng(seed)
    img = rng.standard_normal((1, *image)).astype(np.float32)
    m = random_affine(rng)
    lm = rng.standard_normal((1, n, dims)).astype(np.float32)
    crop, moved = run_in_hal(sampler_model((1, *image), out_hw, n, dims), [img, m, lm])
    assert_float_close(crop, bilinear_reference(img, m, *out_hw))
    assert_float_close(moved, landmarks_reference(lm, m))


def test_identity_sampling_reproduces_the_image_up_to_its_last_row_and_column():
    """The align-corners correction makes the identity matrix sample pixel centres exactly."""
    img = np.arange(1, 1 + 5 * 4 * 2, dtype=np.float32).reshape(1, 5, 4, 2)
    m = np.eye(4, dtype=np.float32).reshape(1, 4, 4)
    (crop,) = run_in_hal(sampler_model(img.shape, (6, 5)), [img, m])
    want = bilinear_reference(img, m, 6, 5)
    np.testing.assert_array_equal(crop, want)
    np.testing.assert_array_equal(crop[0, :5, :4], img[0])  # and the reference agrees with the image


def test_non_finite_matrices_sample_zeros():
    img = np.ones((1, 3, 3, 1), np.float32)
    m = np.full((1, 4, 4), np.nan, np.float32)
    (crop,) = run_in_hal(sampler_model(img.shape, (2, 2)), [img, m])
    np.testing.assert_array_equal(crop, np.zeros((1, 2, 2, 1), np.float32))


# ---- options -----------------------------------------------------------------------------------

@pytest.mark.parametrize("options, message", [
    ({"subset_idxs": []}, "subset_idxs must be a non-empty vector"),
    ({"scale_x": "wide"}, "scale_x must be a number"),
    ({"output_height": 2.5}, "output_height must be a whole number"),
    ({"output_width": 0}, "output_width\\) must be >= 1, got 0"),
    ({"scale_y": -1.0}, "scale_y\\) must be > 0.0"),
    ({"left_rotation_idx": -1}, "left_rotation_idx\\) must be >= 0"),
])
def test_bad_l2tm_options_are_refused(options, message):
    o = {**L2TM_OPTIONS, **options}
    b = TfLiteModelBuilder()
    lm = b.add_input("landmarks", [1, 5, 3])
    mat = b.add_tensor("matrix", [1, 4, 4])
    b.add_operator("CUSTOM", [lm], [mat], custom_code=L2TM, custom_options=flex_options(**o), version=2)
    b.set_outputs([mat])
    with pytest.raises(MappingError, match=message):
        convert_partition(read_model(b.build()))


def test_missing_and_malformed_options_are_refused():
    with pytest.raises(MappingError, match="custom options lack subset_idxs"):
        convert_partition(read_model(_l2tm_only(flex_options(output_height=2, output_width=2))))
    with pytest.raises(MappingError, match="custom options are missing"):
        convert_partition(read_model(_l2tm_only(b"")))
    with pytest.raises(MappingError, match="not a FlexBuffer|must be a FlexBuffer map"):
        convert_partition(read_model(_l2tm_only(b"\x07\x01\x02")))
    with pytest.raises(MappingError, match="version 3 is not supported"):
        convert_partition(read_model(face_crop_model(l2tm_version=3)))
    with pytest.raises(MappingError, match="output_height=3 disagrees with the output tensor"):
        convert_partition(read_model(face_crop_model(bilinear_options=flex_options(output_height=3, output_width=5))))
    # the sizes the GPU delegate reads, when they agree with the tensor, are fine
    convert_partition(read_model(face_crop_model(bilinear_options=flex_options(output_height=6, output_width=5))))


def test_v1_shaped_transform_landmarks_is_refused():
    """The delegate sees every unresolved custom op as version 1; MediaPipe's v1 TransformLandmarks
    takes rank-4 landmarks, which the v2 spec refuses instead of misreading."""
    b = TfLiteModelBuilder()
    lm, mat = b.add_input("landmarks", [1, 1, 1, 15]), b.add_input("matrix", [1, 4, 4])
    out = b.add_tensor("moved", [1, 1, 1, 15])
    b.add_operator("CUSTOM", [lm, mat], [out], custom_code=LANDMARKS, custom_options=flex_options(dimensions=3),
                   version=1)
    b.set_outputs([out])
    with pytest.raises(MappingError, match="input 0 must be rank 3, got 4"):
        convert_partition(read_model(b.build()))


def _l2tm_only(options: bytes) -> bytes:
    b = TfLiteModelBuilder()
    lm = b.add_input("landmarks", [1, 5, 3])
    mat = b.add_tensor("matrix", [1, 4, 4])
    b.add_operator("CUSTOM", [lm], [mat], custom_code=L2TM, custom_options=options, version=2)
    b.set_outputs([mat])
    return b.build()


# ---- validation in hal -------------------------------------------------------------------------

@pytest.mark.parametrize("build, message", [
    (lambda: face_crop_model(options={"subset_idxs": [0, 6]}), "landmark indices must be in \\[0, 6\\)"),
    (lambda: face_crop_model(options={"right_rotation_idx": 9}), "landmark indices must be in"),
    (lambda: sampler_model((2, 4, 4, 1), (3, 3)), "batch of 1"),
    (lambda: sampler_model((1, 4, 4, 1), (3, 3), matrix_shape=(2, 4)), "4x4 matrix \\(16 elements\\)"),
    (lambda: sampler_model((1, 4, 4, 1), (3, 3), n_landmarks=3, dims=4), "2 or 3 coordinates, got 4"),
])
def test_hal_rejects_bad_shapes(build, message):
    part = convert_partition(read_model(build()))
    with pytest.raises(HalError, match=message):
        compile_model(part.model)


def test_l2tm_needs_three_coordinates():
    b = TfLiteModelBuilder()
    lm = b.add_input("landmarks", [1, 5, 2])
    mat = b.add_tensor("matrix", [1, 4, 4])
    b.add_operator("CUSTOM", [lm], [mat], custom_code=L2TM, custom_options=flex_options(**L2TM_OPTIONS), version=2)
    b.set_outputs([mat])
    part = convert_partition(read_model(b.build()))
    with pytest.raises(HalError, match="must be \\[1, N, 3\\] landmarks, got \\[1, 5, 2\\]"):
        compile_model(part.model)


# ---- the face crop step through TFLite with the delegate ---------------------------------------

def test_tflite_alone_cannot_run_the_crop_step():
    with pytest.raises(RuntimeError, match=f"unresolved custom op: {L2TM}"):
        Interpreter(model_content=face_crop_model()).allocate_tensors()


def test_crop_step_runs_fully_delegated(mp_server):
    d = load_delegate(mp_server.address)
    it = Interpreter(model_content=face_crop_model(), experimental_delegates=[d])
    it.allocate_tensors()
    assert d.report.delegated == 3 and d.report.partitions == [[0, 1, 2]], d.report
    rng = np.random.default_rng(3)
    names = {det["name"]: det["index"] for det in it.get_input_details()}
    for _ in range(2):
        lm, img = random_landmarks(rng, 6), rng.standard_normal((1, 8, 7, 2)).astype(np.float32)
        it.set_tensor(names["landmarks"], lm)
        it.set_tensor(names["image"], img)
        it.invoke()
        got = [it.get_tensor(det["index"]) for det in it.get_output_details()]
        for g, w in zip(got, face_crop_reference(lm, img)):
            assert_float_close(g, w, atol=1e-5 * max(1.0, float(np.abs(w).max())))
