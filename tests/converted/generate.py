"""Regenerate the .tflite models in tests/converted/ with the real TensorFlow Lite converter.

Why: every other delegate test runs models made by the project's own flatbuffer builder, which
writes what we believe the converter writes. These files are what the converter really writes
(op versions, fused activations, QUANTIZE/DEQUANTIZE at the edges, per-channel Dense weights,
MEAN for GlobalAveragePooling, shape_signature -1 for Keras' batch, fused LSTM), so
tests/converted/test_converted.py checks the delegate against them.

This is NOT a test dependency: the tests only read the committed .tflite files. It needs
TensorFlow, which the project's venv does not have (tflite-runtime 2.14 pins numpy < 2). Run it
in a separate venv:

    python3 -m venv /tmp/tf-venv
    /tmp/tf-venv/bin/pip install tensorflow-cpu==2.21.0 tf-keras==2.21.0
    /tmp/tf-venv/bin/python tests/converted/generate.py [--out tests/converted] [names...]

Versions used for the committed files (Python 3.11.7, x86_64): tensorflow-cpu 2.21.0 (tf-keras
pulls the `tensorflow` 2.21.0 wheel in beside it: same version, same module), keras 3.15.1,
tf-keras 2.21.0 (only for the fused LSTM), numpy 2.4.6. tflite-runtime 2.14.0 (requirements.lock)
loads all of them; see the dynamic-range conversion for the one option that needs.

Weights are seeded (numpy default_rng per model, keras.utils.set_random_seed) and so is the
representative dataset of the full-integer models: a rerun with these versions rewrote every file
byte for byte (checked 2026-11-26).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import keras  # noqa: E402
import tensorflow as tf  # noqa: E402
from keras import layers  # noqa: E402

HERE = Path(__file__).resolve().parent
IMAGE = (16, 16, 3)
SEQUENCE = (10, 8)  # time steps, features
MAX_BYTES = 200 * 1024


# ---- weights -------------------------------------------------------------------------------------
def randomize(model: keras.Model, seed: int) -> keras.Model:
    """Keras' initializers leave biases at 0 and BatchNorm at identity: a model that never
    exercises the bias add or the folded BN. Give every variable seeded, well-scaled values."""
    rng = np.random.default_rng(seed)
    for w in model.weights:
        path = getattr(w, "path", None) or w.name.split(":")[0]  # Keras 3 | tf_keras
        name, shape = path.rsplit("/", 1)[-1], tuple(w.shape)
        if name in ("gamma", "moving_variance"):
            v = rng.uniform(0.5, 1.5, shape)
        elif name in ("beta", "moving_mean", "bias"):
            v = rng.normal(0.0, 0.2, shape)
        else:  # kernels: variance ~ 1/fan_in keeps activations O(1) through the layers
            fan_in = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
            if "depthwise" in name:
                fan_in = int(np.prod(shape[:2]))
            v = rng.normal(0.0, 1.0 / np.sqrt(max(fan_in, 1)), shape)
        w.assign(v.astype(np.float32))
    return model


def images(seed: int, n: int, batch: int = 1):
    """Representative dataset: seeded inputs in [-1, 1), the range the tests feed."""
    rng = np.random.default_rng(seed)

    def gen():
        for _ in range(n):
            yield [rng.uniform(-1, 1, (batch, *IMAGE)).astype(np.float32)]
    return gen


# ---- models --------------------------------------------------------------------------------------
def cnn(batch: int | None = 1, seed: int = 1) -> keras.Model:
    """Conv (stride 2) + BatchNorm + ReLU6, depthwise + ReLU, 1x1 conv + residual ADD, max pool,
    3x3 valid conv (1152 weights: above the dynamic-range quantizer's 1024-element threshold),
    flatten, Dense 32 ReLU (2048 weights), Dense 10, softmax."""
    keras.utils.set_random_seed(seed)
    x = keras.Input(IMAGE, batch_size=batch, name="image")
    y = layers.Conv2D(8, 3, strides=2, padding="same", use_bias=False)(x)
    y = layers.BatchNormalization()(y)
    y = layers.ReLU(6.0)(y)
    z = layers.DepthwiseConv2D(3, padding="same", activation="relu")(y)
    z = layers.Conv2D(8, 1)(z)
    y = layers.Add()([y, z])
    y = layers.MaxPooling2D(2)(y)
    y = layers.Conv2D(16, 3, activation="relu")(y)
    y = layers.Flatten()(y)
    y = layers.Dense(32, activation="relu")(y)
    y = layers.Dense(10)(y)
    y = layers.Softmax()(y)
    return randomize(keras.Model(x, y, name="cnn"), seed)


def squeeze_excite(x, channels: int, reduced: int, keepdims: bool = False):
    """GlobalAveragePooling (MEAN) -> Dense -> ReLU -> Dense -> sigmoid -> Multiply.

    keepdims=False pools to [batch, C] and reshapes the gate to [batch, 1, 1, C]: rank-2
    FULLY_CONNECTEDs. keepdims=True feeds the 4-D [batch, 1, 1, C] to Dense, which the converter
    writes as FULLY_CONNECTED with keep_num_dims on a rank-4 input. That form is kept as float32
    only: tflite-runtime 2.14's reference int8 FULLY_CONNECTED (BUILTIN_REF) gives different
    results in different interpreter instances on it (it reads uninitialised memory), so it is no
    oracle there."""
    s = layers.GlobalAveragePooling2D(keepdims=keepdims)(x)
    s = layers.Dense(reduced, activation="relu")(s)
    s = layers.Dense(channels, activation="sigmoid")(s)
    if not keepdims:
        s = layers.Reshape((1, 1, channels))(s)
    return layers.Multiply()([x, s])


def se_net(seed: int = 2, keepdims: bool = False) -> keras.Model:
    """Two squeeze-excite blocks, then GlobalAveragePooling and a Dense head (per-channel int8
    weights once fully quantized) and softmax."""
    keras.utils.set_random_seed(seed)
    x = keras.Input(IMAGE, batch_size=1, name="image")
    y = layers.Conv2D(16, 3, strides=2, padding="same", activation="relu")(x)
    y = squeeze_excite(y, 16, 4, keepdims)
    y = layers.DepthwiseConv2D(3, padding="same", activation="relu")(y)
    y = layers.Conv2D(24, 1, activation="relu")(y)
    y = squeeze_excite(y, 24, 6, keepdims)
    y = layers.GlobalAveragePooling2D()(y)
    y = layers.Dense(10)(y)
    y = layers.Softmax()(y)
    return randomize(keras.Model(x, y, name="se_net"), seed)


def lstm_net(seed: int = 3, fused: bool = True):
    """LSTM(16) over 10 steps of 8 features, last state -> Dense 4.

    fused: built with tf_keras (Keras 2), whose LSTM carries the `api_implements` tag the
    converter fuses into UNIDIRECTIONAL_SEQUENCE_LSTM. Keras 3's LSTM has no such tag: the
    converter emits a WHILE loop over a body subgraph instead (also kept, as lstm_while)."""
    if fused:
        import tf_keras as k
    else:
        k = keras
    k.utils.set_random_seed(seed)
    x = k.Input(SEQUENCE, batch_size=1, name="sequence")
    y = k.layers.LSTM(16)(x)
    y = k.layers.Dense(4)(y)
    return randomize(k.Model(x, y, name="lstm_net"), seed)


# ---- conversions ---------------------------------------------------------------------------------
def convert(model: keras.Model, kind: str, seed: int = 0) -> bytes:
    """kind: float32 | float16 (fp16 weights) | dynamic_range | int8 | uint8 (full integer,
    that I/O type)."""
    c = tf.lite.TFLiteConverter.from_keras_model(model)
    if kind == "float16":
        c.optimizations = [tf.lite.Optimize.DEFAULT]
        c.target_spec.supported_types = [tf.float16]
    elif kind == "dynamic_range":
        c.optimizations = [tf.lite.Optimize.DEFAULT]
        # Per-channel hybrid Dense weights are FULLY_CONNECTED v12, which tflite-runtime 2.14 has
        # no kernel for ("Didn't find op for builtin opcode 'FULLY_CONNECTED' version '12'").
        c._experimental_disable_per_channel_quantization_for_dense_layers = True
    elif kind in ("int8", "uint8"):
        c.optimizations = [tf.lite.Optimize.DEFAULT]
        c.representative_dataset = images(seed, 64)
        c.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        c.inference_input_type = c.inference_output_type = {"int8": tf.int8, "uint8": tf.uint8}[kind]
    elif kind != "float32":
        raise ValueError(kind)
    return c.convert()


#: file stem -> (model factory, conversion). Tests look the stems up in their own table.
MODELS = {
    "cnn_float32": (cnn, "float32"),
    "cnn_float16": (cnn, "float16"),
    "cnn_dynamic_range": (cnn, "dynamic_range"),
    "cnn_int8": (cnn, "int8"),
    "cnn_uint8_io": (cnn, "uint8"),
    "cnn_dynamic_batch_float32": (lambda: cnn(batch=None), "float32"),
    "se_float32": (se_net, "float32"),
    "se_int8": (se_net, "int8"),
    "se_keepdims_float32": (lambda: se_net(keepdims=True), "float32"),
    "lstm_float32": (lstm_net, "float32"),
    "lstm_while_float32": (lambda: lstm_net(fused=False), "float32"),
}


def op_names(data: bytes) -> list[str]:
    from tensorflow.lite.python import schema_py_generated as s
    m = s.ModelT.InitFromObj(s.Model.GetRootAsModel(data, 0))
    names = {v: k for k, v in vars(s.BuiltinOperator).items() if not k.startswith("_")}
    codes = [max(c.builtinCode, c.deprecatedBuiltinCode) for c in m.operatorCodes]
    return [names[codes[op.opcodeIndex]] for op in m.subgraphs[0].operators]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=HERE)
    p.add_argument("names", nargs="*", help="only these models (default: all)")
    args = p.parse_args(argv)
    total = 0
    for i, (name, (factory, kind)) in enumerate(MODELS.items()):
        if args.names and name not in args.names:
            continue
        keras.backend.clear_session()  # layer names (kept in the file) independent of what ran before
        data = convert(factory(), kind, seed=100 + i)
        if len(data) > MAX_BYTES:
            raise SystemExit(f"{name}: {len(data)} bytes > {MAX_BYTES}")
        (args.out / f"{name}.tflite").write_bytes(data)
        total += len(data)
        print(f"{name}.tflite {len(data):>7} bytes  {' '.join(op_names(data))}")
    print(f"total {total} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
