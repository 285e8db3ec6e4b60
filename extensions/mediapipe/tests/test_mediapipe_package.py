"""The package registers as installed packages do: its pyproject.toml entry point, found by
importlib.metadata, loads an Extension that names MediaPipe's custom codes."""
from __future__ import annotations

import sys

from extensions.plugins import load_plugins
from extensions.registry import by_custom_code

CUSTOM_CODES = ["Convolution2DTransposeBias", "Landmarks2TransformMatrix", "TransformTensorBilinear",
                "TransformLandmarks"]


def test_entry_point_discovery(dist_info, monkeypatch):
    monkeypatch.syspath_prepend(str(dist_info))
    ours = [r for r in load_plugins() if r.entry_point.startswith("com.google.mediapipe =")]
    assert ours and all(r.error is None and r.extension == "com.google.mediapipe" for r in ours), ours
    assert "nnhal_mediapipe" in sys.modules


def test_every_custom_code_has_an_operation_and_a_mapper():
    found = [by_custom_code(code) for code in CUSTOM_CODES]
    assert all(f is not None and f[0].name == "com.google.mediapipe" and f[1].map_tflite for f in found)
    assert sorted(op.type for _, op in found) == [0, 1, 2, 3]


def test_prepared_data_survives_the_compilation_cache():
    """Each op's prepare result (dataclasses of the extension's modules, a numpy subset) is stored
    and reloaded by hal.serialize, the compilation cache's format, with the same results."""
    import numpy as np
    from test_mediapipe_transforms import face_crop_model
    from test_mediapipe_transpose_conv_bias import SAME, transpose_model

    from delegate.mapping import convert_partition
    from delegate.tfl import read_model
    from hal.compiler import compile_model
    from hal.executor import execute
    from hal.serialize import dump_compiled, load_compiled
    rng = np.random.default_rng(0)
    filt, bias = rng.standard_normal((2, 3, 3, 2)).astype(np.float32), rng.standard_normal(2).astype(np.float32)
    cases = [(transpose_model((1, 4, 4, 2), filt, bias, 2, 2, SAME), [rng.standard_normal((1, 4, 4, 2))]),
             (face_crop_model(), [rng.uniform(0, 8, (1, 6, 3)), rng.standard_normal((1, 8, 7, 2))])]
    for model, inputs in cases:
        compiled = compile_model(convert_partition(read_model(model)).model)
        loaded = load_compiled(*dump_compiled(compiled))
        inputs = [x.astype(np.float32) for x in inputs]
        for got, want in zip(execute(loaded, inputs), execute(compiled, inputs)):
            np.testing.assert_array_equal(got, want)
