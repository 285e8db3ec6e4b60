"""com.google.mediapipe: MediaPipe's TFLite custom ops as an nnhal extension.

MediaPipe's models (selfie / hair segmentation, face mesh with attention, ...) carry these as
CUSTOM ops that plain TFLite cannot run; MediaPipe links kernels for them
(mediapipe/util/tflite/operations/, registered by mediapipe/util/tflite/cpu_op_resolver.cc). Each
module here holds one op family: its NNAPI-style spec (validate / prepare), its numpy kernel, its
custom-options decoder and its TFLite mapper, and says which MediaPipe source defines it.

| type | NNAPI operation               | TFLite custom code (version)    | module                        |
|------|-------------------------------|---------------------------------|-------------------------------|
| 0    | CONV_2D_TRANSPOSE_BIAS        | Convolution2DTransposeBias (1)  | transpose_conv_bias           |
| 1    | LANDMARKS_TO_TRANSFORM_MATRIX | Landmarks2TransformMatrix (2)   | landmarks_to_transform_matrix |
| 2    | TRANSFORM_TENSOR_BILINEAR     | TransformTensorBilinear (2)     | transforms                    |
| 3    | TRANSFORM_LANDMARKS           | TransformLandmarks (2)          | transforms                    |

Installed, it registers through the ``nnhal.extensions`` entry point (see pyproject.toml).
"""
from __future__ import annotations

from nnhal.extensions import Extension, ExtensionOperation

from nnhal_mediapipe import landmarks_to_transform_matrix as l2tm
from nnhal_mediapipe import transforms
from nnhal_mediapipe import transpose_conv_bias as tcb
from nnhal_mediapipe._tflite import NAME

CONV_2D_TRANSPOSE_BIAS = 0
LANDMARKS_TO_TRANSFORM_MATRIX = 1
TRANSFORM_TENSOR_BILINEAR = 2
TRANSFORM_LANDMARKS = 3

EXTENSION = Extension(
    name=NAME, version="1.0",
    operations=(
        ExtensionOperation(CONV_2D_TRANSPOSE_BIAS, "CONV_2D_TRANSPOSE_BIAS", tcb.validate, tcb.prepare, tcb.execute,
                           custom_codes=(tcb.CODE,), map_tflite=tcb.map_tflite),
        ExtensionOperation(LANDMARKS_TO_TRANSFORM_MATRIX, "LANDMARKS_TO_TRANSFORM_MATRIX", l2tm.validate,
                           l2tm.prepare, l2tm.execute, custom_codes=(l2tm.CODE,), map_tflite=l2tm.map_tflite),
        ExtensionOperation(TRANSFORM_TENSOR_BILINEAR, "TRANSFORM_TENSOR_BILINEAR", transforms.bilinear_validate,
                           transforms.bilinear_prepare, transforms.bilinear_execute,
                           custom_codes=(transforms.BILINEAR_CODE,), map_tflite=transforms.map_bilinear),
        ExtensionOperation(TRANSFORM_LANDMARKS, "TRANSFORM_LANDMARKS", transforms.landmarks_validate,
                           transforms.landmarks_prepare, transforms.landmarks_execute,
                           custom_codes=(transforms.LANDMARKS_CODE,), map_tflite=transforms.map_landmarks)),
    description="MediaPipe's TFLite custom ops (segmentation decoders, landmark-driven crops)")
