"""Input ranges from a model's TFLite Support metadata (TFLITE_METADATA): Stats, an image input's
NormalizationOptions, the precedence flag > metadata > quantization > default, and damaged
metadata as a warning with a fallback, never a crash.

The ModelMetadata flatbuffers are written here with the flatbuffers Builder from
tflite-support's tensorflow_lite_support/metadata/metadata_schema.fbs directly (field ids: the
declaration order; a union takes two, type then value), not from delegate.tfl.metadata's
constants, so a wrong id in the reader fails here. The NormalizationOptions expectation is
tflite_support's own rule (metadata_writers/metadata_info.py, InputImageTensorMd): float32 Stats
``[(0 - mean) / std, (255 - mean) / std]`` per channel, uint8 [0, 255].
"""
from __future__ import annotations

import json
import logging
import subprocess
import sys

import flatbuffers
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from delegate.runtime import Interpreter
from delegate.tfl import TfLiteModelBuilder
from delegate.tfl.metadata import MetadataError, metadata_buffer, parse_input_metadata
from nnhal.tool_inputs import input_sources, parse_input_flags
from tests.tools.test_tflite_flags import quantize_first_model

# metadata_schema.fbs field ids
MODEL_METADATA_FIELDS, MM_SUBGRAPH_METADATA = 9, 3   # name, description, version, subgraph_metadata, ...
SUBGRAPH_FIELDS, SG_INPUT_TENSOR_METADATA = 10, 2    # name, description, input_tensor_metadata, ...
TENSOR_FIELDS = 7                                    # name, description, dimension_names, content,
TM_NAME, TM_CONTENT, TM_PROCESS_UNITS, TM_STATS = 0, 3, 4, 5  # process_units, stats, associated_files
CONTENT_FIELDS = 3                                   # content_properties (type, value), range
CONTENT_KIND = {"feature": 1, "image": 2}            # union ContentProperties
PROCESS_UNIT_FIELDS, NORMALIZATION_OPTIONS = 2, 1    # options (type, value); union ProcessUnitOptions
# NormalizationOptions: mean 0, std 1; Stats: max 0, min 1

IMAGENET_MEAN, IMAGENET_STD = [123.675, 116.28, 103.53], [58.395, 57.12, 57.375]


def model_metadata(inputs: list[dict], identifier: bytes = b"M001") -> bytes:
    """A ModelMetadata with one SubGraphMetadata; per input dict: name, content ("image",
    "feature"), mean/std (a NormalizationOptions process unit), min/max (Stats)."""
    b = flatbuffers.Builder(256)

    def floats(vals):
        b.StartVector(4, len(vals), 4)
        for v in reversed(vals):
            b.PrependFloat32(v)
        return b.EndVector()

    def offsets(offs):
        b.StartVector(4, len(offs), 4)
        for o in reversed(offs):
            b.PrependUOffsetTRelative(o)
        return b.EndVector()

    tensors = []
    for spec in inputs:
        name = b.CreateString(spec.get("name", "input"))
        units = stats = content = None
        if "mean" in spec:
            mean, std = floats(spec["mean"]), floats(spec["std"])
            b.StartObject(2)
            b.PrependUOffsetTRelativeSlot(0, mean, 0)
            b.PrependUOffsetTRelativeSlot(1, std, 0)
            norm = b.EndObject()
            b.StartObject(PROCESS_UNIT_FIELDS)
            b.PrependUint8Slot(0, NORMALIZATION_OPTIONS, 0)
            b.PrependUOffsetTRelativeSlot(1, norm, 0)
            units = offsets([b.EndObject()])
        if "min" in spec:
            hi, lo = floats(spec["max"]), floats(spec["min"])
            b.StartObject(2)
            b.PrependUOffsetTRelativeSlot(0, hi, 0)
            b.PrependUOffsetTRelativeSlot(1, lo, 0)
            stats = b.EndObject()
        if "content" in spec:
            b.StartObject(0)  # FeatureProperties / ImageProperties with no field set
            props = b.EndObject()
            b.StartObject(CONTENT_FIELDS)
            b.PrependUint8Slot(0, CONTENT_KIND[spec["content"]], 0)
            b.PrependUOffsetTRelativeSlot(1, props, 0)
            content = b.EndObject()
        b.StartObject(TENSOR_FIELDS)
        b.PrependUOffsetTRelativeSlot(TM_NAME, name, 0)
        for slot, off in ((TM_CONTENT, content), (TM_PROCESS_UNITS, units), (TM_STATS, stats)):
            if off is not None:
                b.PrependUOffsetTRelativeSlot(slot, off, 0)
        tensors.append(b.EndObject())
    tv = offsets(tensors)
    b.StartObject(SUBGRAPH_FIELDS)
    b.PrependUOffsetTRelativeSlot(SG_INPUT_TENSOR_METADATA, tv, 0)
    sgv = offsets([b.EndObject()])
    mname = b.CreateString("test model")
    b.StartObject(MODEL_METADATA_FIELDS)
    b.PrependUOffsetTRelativeSlot(0, mname, 0)
    b.PrependUOffsetTRelativeSlot(MM_SUBGRAPH_METADATA, sgv, 0)
    b.Finish(b.EndObject(), file_identifier=identifier)
    return bytes(b.Output())


def image_model(dtype=np.float32, metadata: bytes | None = None, name: str = "TFLITE_METADATA") -> bytes:
    """x [1, 2, 2, 3] (float: RELU; uint8/int8: DEQUANTIZE with scale 1, zero point 0) -> out."""
    b = TfLiteModelBuilder()
    if np.dtype(dtype) == np.float32:
        x = b.add_input("x", [1, 2, 2, 3])
        op = "RELU"
    else:
        x = b.add_input("x", [1, 2, 2, 3], dtype, scale=1.0, zero_point=0)
        op = "DEQUANTIZE"
    out = b.add_tensor("out", [1, 2, 2, 3])
    b.add_operator(op, [x], [out])
    b.set_outputs([out])
    if metadata is not None:
        b.add_metadata(name, metadata)
    return b.build()


def _model(metadata: bytes | None = None) -> bytes:
    """test_tflite_flags' model with scale 1/255 (its quantization says x is in [0, 1])."""
    return quantize_first_model(1 / 255, metadata)


def sources(tmp_path, model: bytes, ranges: str | None = None):
    path = tmp_path / "m.tflite"
    path.write_bytes(model)
    details = Interpreter(model_path=str(path)).get_input_details()
    return input_sources(details, parse_input_flags(None, None, ranges, None), str(path))


def writer_stats(dtype, mean, std) -> tuple[float, float]:
    """tflite_support's InputImageTensorMd Stats, made one range as the tools do for channels
    (the values every channel takes)."""
    if np.dtype(dtype) == np.uint8:
        return 0.0, 255.0
    lows = [float(0.0 - m) / s for m, s in zip(mean, std)]
    highs = [float(255.0 - m) / s for m, s in zip(mean, std)]
    return max(lows), min(highs)


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "nnhal.cli", *args], capture_output=True, text=True, timeout=240)


def test_builder_writes_a_metadata_entry_tflite_reads():
    from tflite.Model import Model
    meta = model_metadata([{"name": "x", "min": [0.0], "max": [255.0]}])
    data = image_model(metadata=meta)
    m = Model.GetRootAs(data, 0)
    assert m.MetadataLength() == 1 and m.Metadata(0).Name() == b"TFLITE_METADATA"
    assert m.Buffers(m.Metadata(0).Buffer()).DataAsNumpy().tobytes() == meta
    assert metadata_buffer(data) == meta and metadata_buffer(image_model()) is None
    it = Interpreter(model_content=data)  # TFLite loads and runs it as before
    it.allocate_tensors()
    it.set_tensor(it.get_input_details()[0]["index"], np.full((1, 2, 2, 3), -3.0, np.float32))
    it.invoke()
    np.testing.assert_array_equal(it.get_tensor(it.get_output_details()[0]["index"]), 0.0)


def test_stats_give_the_range_inference_diff_draws_and_prints(tmp_path):
    """A float model that expects [0, 255]: uniform [-1, 1] would leave it near zero."""
    model = image_model(metadata=model_metadata([{"name": "x", "content": "image", "min": [0.0], "max": [255.0]}]))
    (src,) = sources(tmp_path, model)
    assert (src.value_range, src.range_source) == ((0.0, 255.0), "metadata Stats")
    v = np.concatenate([src.value(np.random.default_rng(s)).ravel() for s in range(20)])
    assert v.min() >= 0.0 and v.max() <= 255.0 and v.max() > 200.0
    out = tmp_path / "metrics.json"
    r = _cli("inference-diff", f"--model_file={tmp_path / 'm.tflite'}", "--num_runs=1", "--delegate=none",
             f"--output_file_path={out}")
    assert r.returncode == 0, r.stderr
    assert "Input 0 range [0, 255] (from metadata Stats)" in r.stdout.splitlines()
    assert json.loads(out.read_text())["inputs"] == [{"name": "x", "range": [0.0, 255.0], "source": "metadata Stats"}]


@pytest.mark.parametrize("dtype, mean, std", [(np.float32, [127.5], [127.5]),  # MobileNet: [-1, 1]
                                              (np.float32, [0.0], [1.0]),  # normalized in the graph: [0, 255]
                                              (np.float32, [0.0], [255.0]),  # [0, 1]
                                              (np.float32, IMAGENET_MEAN, IMAGENET_STD),
                                              (np.uint8, [127.5], [127.5])])
def test_normalization_options_follow_tflite_supports_writer(tmp_path, dtype, mean, std):
    model = image_model(dtype, model_metadata([{"name": "x", "content": "image", "mean": mean, "std": std}]))
    (src,) = sources(tmp_path, model)
    assert src.range_source == "metadata NormalizationOptions"
    np.testing.assert_allclose(src.value_range, writer_stats(dtype, mean, std), rtol=1e-6)
    # Stats, when the writer also gave them, are the tensor's own range and come first
    model = image_model(dtype, model_metadata([{"name": "x", "content": "image", "mean": mean, "std": std,
                                                "min": [0.0], "max": [1.0]}]))
    assert sources(tmp_path, model)[0].value_range == (0.0, 1.0)


def test_normalization_of_a_feature_input_says_no_range(tmp_path):
    """Only image inputs have a known raw range ([0, 255] pixels); a feature's is not in the metadata."""
    model = image_model(metadata=model_metadata([{"name": "x", "content": "feature", "mean": [5.0], "std": [2.0]}]))
    (src,) = sources(tmp_path, model)
    assert (src.value_range, src.range_source, src.drawn_range()) == (None, "default", (-1.0, 1.0))


def test_precedence_flag_then_metadata_then_quantization_then_default(tmp_path):
    meta = model_metadata([{"name": "x", "min": [-2.0], "max": [2.0]}, {"name": "y"}])
    x, y = sources(tmp_path, _model())
    assert (x.range_source, y.range_source) == ("quantization", "default")
    np.testing.assert_allclose(x.value_range, (0.0, 1.0))
    x, y = sources(tmp_path, _model(meta))
    assert (x.value_range, x.range_source, y.range_source) == ((-2.0, 2.0), "metadata Stats", "default")
    x, y = sources(tmp_path, _model(meta), "x,0,4:y,1,3")
    assert [(s.value_range, s.range_source) for s in (x, y)] == [((0.0, 4.0), "--input_layer_value_range"),
                                                                ((1.0, 3.0), "--input_layer_value_range")]


def _bad(kind: str) -> bytes:
    good = model_metadata([{"name": "x", "min": [-2.0], "max": [2.0]}, {"name": "y"}])
    return {"truncated": good[:len(good) // 2],
            "identifier": model_metadata([{"name": "x", "min": [-2.0], "max": [2.0]}, {"name": "y"}], b"XXXX"),
            "garbage": bytes(range(7, 250, 3)),
            "empty": b"",
            "inputs": model_metadata([{"name": "x", "min": [-2.0], "max": [2.0]}]),
            "std0": model_metadata([{"name": "x", "mean": [0.0], "std": [0.0]}, {"name": "y"}]),
            "nan": model_metadata([{"name": "x", "min": [float("nan")], "max": [2.0]}, {"name": "y"}]),
            "min>max": model_metadata([{"name": "x", "min": [3.0], "max": [2.0]}, {"name": "y"}]),
            "lengths": model_metadata([{"name": "x", "min": [0.0, 1.0, 2.0], "max": [5.0, 6.0]}, {"name": "y"}]),
            }[kind]


@pytest.mark.parametrize("kind", ["truncated", "identifier", "garbage", "empty", "inputs", "std0", "nan", "min>max",
                                  "lengths"])
def test_bad_metadata_is_a_warning_and_the_quantization_range(tmp_path, caplog, kind):
    caplog.set_level(logging.WARNING, logger="nnhal.tools")
    x, y = sources(tmp_path, _model(_bad(kind)))
    assert (x.range_source, y.range_source) == ("quantization", "default")
    np.testing.assert_allclose(x.value_range, (0.0, 1.0))
    (warning,) = [r.getMessage() for r in caplog.records if r.name == "nnhal.tools"]
    assert "metadata ignored" in warning or "TFLITE_METADATA ignored" in warning, warning


def test_bad_metadata_in_the_cli_is_one_warning_line_and_a_run(tmp_path):
    path = tmp_path / "bad.tflite"
    path.write_bytes(_model(_bad("truncated")))
    r = _cli("inference-diff", f"--model_file={path}", "--num_runs=1", "--delegate=none")
    assert r.returncode == 0, r.stderr
    assert "WARNING nnhal.tools" in r.stderr and "TFLITE_METADATA ignored" in r.stderr
    assert "Input 0 range [0, 1] (from quantization)" in r.stdout.splitlines()
    assert "Input 1 range [-1, 1] (from default)" in r.stdout.splitlines()


def _parse_or_metadata_error(data: bytes) -> None:
    try:
        parse_input_metadata(data)
    except MetadataError:
        pass  # anything else (IndexError, struct.error, a hang) fails the test


def test_every_truncation_is_read_or_a_metadata_error():
    data = model_metadata([{"name": "x", "content": "image", "mean": [127.5], "std": [127.5],
                            "min": [-1.0], "max": [1.0]}])
    assert parse_input_metadata(data)[0].mean == (127.5,)
    for cut in range(len(data)):
        _parse_or_metadata_error(data[:cut])


@given(st.data())
def test_corrupted_metadata_is_read_or_a_metadata_error(data):
    good = bytearray(model_metadata([{"name": "x", "content": "image", "mean": [127.5], "std": [127.5],
                                      "min": [-1.0], "max": [1.0]}]))
    for _ in range(data.draw(st.integers(1, 4))):
        good[data.draw(st.integers(0, len(good) - 1))] = data.draw(st.integers(0, 255))
    _parse_or_metadata_error(bytes(good))
