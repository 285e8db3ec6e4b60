"""The tools' model inputs, as benchmark_model's flags give them: ``--input_layer=a,b``,
``--input_layer_shape=1,224,224,3:1,20``, ``--input_layer_value_range=a,0,255:b,-1,1`` and
``--input_layer_value_files=a:/path/a.bin,b:/path/b.bin`` (raw binary, the tensor's exact bytes).

Without a range or a file, an input is drawn from the range the model says it expects, first
found of: its TFLite Support metadata (Stats, else an image input's NormalizationOptions:
delegate.tfl.metadata.input_range); its quantization (a float input the model quantizes first, its
only consumers being QUANTIZE nodes as in the usual float-I/O quantized model, gets the float range
its uint8/int8 covers; one whose tensor records min/max gets those); else integer inputs get their
type's range (what their quantization covers) and other float inputs [-1, 1], as TFLite's
inference_diff. Uniform [-1, 1] would leave half of a model that expects [0, 255] or [0, 1]
saturated at zero. Each InputSource says where its range came from (``range_source``).
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import numpy as np

log = logging.getLogger("nnhal.tools")

#: ``range_source`` of an input the flags give: explicit ranges and files win over the model.
FLAG_RANGE, FLAG_FILE = "--input_layer_value_range", "--input_layer_value_files"


@dataclass
class InputLayer:
    """What the flags say about one input, by name."""

    name: str
    shape: tuple[int, ...] | None = None
    value_range: tuple[float, float] | None = None
    file: str | None = None


def _split_escaped(text: str, sep: str) -> list[str]:
    """Split on ``sep`` except where escaped as ``\\sep`` (names such as "input:0")."""
    parts, cur, i = [], "", 0
    while i < len(text):
        if text[i] == "\\" and text[i + 1:i + 2] == sep:
            cur += sep
            i += 2
            continue
        if text[i] == sep:
            parts.append(cur)
            cur = ""
        else:
            cur += text[i]
        i += 1
    parts.append(cur)
    return parts


def parse_input_flags(names: str | None, shapes: str | None, ranges: str | None,
                      files: str | None) -> dict[str, InputLayer]:
    """The four flags, checked; a bad one is a ValueError in benchmark_model's words."""
    layers: dict[str, InputLayer] = {}
    name_list = [n for n in (names or "").split(",") if n]
    shape_list = [s for s in (shapes or "").split(":") if s]
    if shape_list and len(shape_list) != len(name_list):
        raise ValueError(f"the number of items in --input_layer_shape ({shapes}, with {len(shape_list)} items) must "
                         f"match the number of items in --input_layer ({names or ''}, with {len(name_list)} items); "
                         f"for example --input_layer=input1,input2 --input_layer_shape=1,224,224,4:1,20")
    for k, name in enumerate(name_list):
        layer = layers.setdefault(name, InputLayer(name))
        if shape_list:
            try:
                layer.shape = tuple(int(d) for d in shape_list[k].split(","))
            except ValueError:
                raise ValueError(f"incorrect size string specified: {shape_list[k]}") from None
            if any(d < 0 for d in layer.shape):
                raise ValueError("any unknown sizes in the shapes (-1's) must be replaced with the size you want "
                                 "to benchmark with")

    def layer_named(name: str) -> InputLayer:
        if name_list and name not in layers:
            raise ValueError(f"cannot find the corresponding input_layer name({name}) in --input_layer as {names}")
        return layers.setdefault(name, InputLayer(name))

    for item in (r for r in (ranges or "").split(":") if r):
        parts = item.split(",")
        try:
            low, high = float(parts[1]), float(parts[2])
        except (IndexError, ValueError):
            low = high = None
        if len(parts) != 3 or low is None:
            raise ValueError(f"wrong input value range item specified: {item} (expected NAME,LOW,HIGH)")
        if not low <= high:
            raise ValueError(f"wrong low and high value of the input value range specified: {item}")
        layer_named(parts[0]).value_range = (low, high)
    for item in (f for f in _split_escaped(files or "", ",") if f):
        parts = _split_escaped(item, ":")
        if len(parts) != 2 or not parts[0] or not parts[1]:
            raise ValueError(f"wrong input value file item specified: {item} (expected NAME:PATH)")
        if not os.path.isfile(parts[1]):
            raise ValueError(f"cannot read input value file {parts[1]!r} (for input {parts[0]!r})")
        layer_named(parts[0]).file = parts[1]
    return layers


def expected_ranges(model_path: str) -> dict[int, tuple[tuple[float, float], str]]:
    """Tensor index -> (the range the model expects on that input, what said so), when it says so:
    its metadata, else its quantization."""
    from delegate.tfl.reader import read_model
    from delegate.tfl.schema import TENSOR_DTYPE, builtin_name
    with open(model_path, "rb") as f:
        data = f.read()
    graph = read_model(data)
    users = graph.consumers()
    ranges: dict[int, tuple[tuple[float, float], str]] = {}
    for t in graph.inputs:
        tensor = graph.tensors[t]
        if not np.issubdtype(TENSOR_DTYPE.get(tensor.type, np.int8), np.floating):
            continue
        nodes = [graph.nodes[n] for n in users.get(t, [])]
        outs = [graph.tensors[n.outputs[0]] for n in nodes]
        if nodes and all(builtin_name(n.builtin_code) == "QUANTIZE" and o.scales for n, o in zip(nodes, outs)):
            covered = []
            for o in outs:
                info, scale, zp = np.iinfo(TENSOR_DTYPE[o.type]), o.scales[0], o.zero_points[0]
                covered.append((scale * (info.min - zp), scale * (info.max - zp)))
            ranges[t] = (max(lo for lo, _ in covered), min(hi for _, hi in covered)), "quantization"
            continue
        recorded = _recorded_min_max(data, t)
        if recorded is not None:
            ranges[t] = recorded, "quantization min/max"
    ranges.update(_metadata_ranges(model_path, data, graph))
    return ranges


def _metadata_ranges(model_path: str, data: bytes, graph) -> dict[int, tuple[tuple[float, float], str]]:
    """The inputs' ranges by their TFLITE_METADATA (input_tensor_metadata[k] is SubGraph.inputs[k]).
    Metadata that cannot be read, or an input's values it cannot mean, is a warning: the ranges
    then come from the quantization or the defaults."""
    from delegate.tfl.metadata import MetadataError, input_range, read_input_metadata
    from delegate.tfl.schema import TENSOR_DTYPE
    try:
        metas = read_input_metadata(data)
    except MetadataError as e:
        log.warning("%s: TFLITE_METADATA ignored: %s; input ranges come from the quantization or the defaults",
                    model_path, e)
        return {}
    if metas is None:
        return {}
    if len(metas) != len(graph.inputs):
        log.warning("%s: TFLITE_METADATA ignored: it describes %d inputs, the model has %d", model_path,
                    len(metas), len(graph.inputs))
        return {}
    ranges = {}
    for k, (t, meta) in enumerate(zip(graph.inputs, metas)):
        dtype = TENSOR_DTYPE.get(graph.tensors[t].type)
        if dtype is None:
            continue
        try:
            found = input_range(meta, dtype)
        except MetadataError as e:
            log.warning("%s: input %d (%s): metadata ignored: %s", model_path, k, graph.tensors[t].name, e)
            continue
        if found is not None:
            ranges[t] = found
    return ranges


def _recorded_min_max(data: bytes, t: int) -> tuple[float, float] | None:
    """QuantizationParameters.min/max of a (float) tensor of subgraph 0: the range it was
    calibrated or trained with."""
    from tflite.Model import Model
    q = Model.GetRootAs(data, 0).Subgraphs(0).Tensors(t).Quantization()
    if q is None or q.MinLength() != 1 or q.MaxLength() != 1 or not q.Min(0) < q.Max(0):
        return None
    return float(q.Min(0)), float(q.Max(0))


@dataclass
class InputSource:
    """How one input of the model is filled on every run: its file's bytes, else random values
    in ``value_range`` (None: the type's own default); ``range_source`` says which (FLAG_RANGE,
    FLAG_FILE, "metadata Stats", "metadata NormalizationOptions", "quantization",
    "quantization min/max", "default")."""

    index: int
    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    value_range: tuple[float, float] | None = None
    data: np.ndarray | None = None
    range_source: str = "default"

    def value(self, rng: np.random.Generator) -> np.ndarray:
        if self.data is not None:
            return self.data
        return random_input(rng, self.shape, self.dtype, self.value_range)

    def drawn_range(self) -> tuple[float, float] | None:
        """The range random values are drawn from (the default included); None: a file, booleans."""
        if self.data is not None or self.dtype == np.bool_:
            return None
        return _draw_range(self.dtype, self.value_range)


def input_sources(details: list[dict], layers: dict[str, InputLayer], model_path: str) -> list[InputSource]:
    """One InputSource per input of an interpreter (``get_input_details()``), checked against the
    flags: an unknown name, a shape the model cannot take or a file of the wrong size is a
    ValueError."""
    by_name = {d["name"]: d for d in details}
    for name in layers:
        if name not in by_name:
            raise ValueError(f"the model has no input named {name!r} (its inputs: {', '.join(by_name)})")
    defaults = expected_ranges(model_path)
    sources = []
    for d in details:
        layer = layers.get(d["name"], InputLayer(d["name"]))
        shape = tuple(int(x) for x in d["shape"])
        if layer.shape is not None and layer.shape != shape:
            signature = tuple(int(x) for x in d.get("shape_signature", d["shape"]))
            if len(layer.shape) != len(signature) or any(s not in (-1, w) for s, w in zip(signature, layer.shape)):
                raise ValueError(f"input {d['name']!r} has shape {list(signature)}; --input_layer_shape gives "
                                 f"{list(layer.shape)}")
            shape = layer.shape
        value_range, source = (layer.value_range, FLAG_RANGE) if layer.value_range else \
            defaults.get(d["index"], (None, "default"))
        src = InputSource(d["index"], d["name"], shape, np.dtype(d["dtype"]), value_range, range_source=source)
        if layer.file is not None:
            src.range_source = FLAG_FILE
            size = os.path.getsize(layer.file)
            want = int(np.prod(shape)) * src.dtype.itemsize
            if size != want:
                raise ValueError(f"input value file {layer.file} has {size} bytes; input {d['name']!r} "
                                 f"({list(shape)}, {src.dtype.name}) takes {want}")
            src.data = np.fromfile(layer.file, dtype=src.dtype).reshape(shape)
        sources.append(src)
    return sources


def resize_inputs(it, sources: list[InputSource]) -> None:
    """Give a dynamic input the shape --input_layer_shape asked for (before allocate_tensors)."""
    for s, d in zip(sources, it.get_input_details()):
        if tuple(int(x) for x in d["shape"]) != s.shape:
            it.resize_tensor_input(d["index"], list(s.shape))


def random_input(rng: np.random.Generator, shape, dtype, value_range: tuple[float, float] | None = None) -> np.ndarray:
    """TFLite inference_diff's draw: N(0.5, 1/3) clipped to [0, 1], mapped onto ``value_range``
    (default: [-1, 1] for floats, the type's range for integers; both ends inclusive)."""
    v = np.clip(rng.normal(0.5, 1.0 / 3.0, size=shape), 0.0, 1.0)
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return v > 0.5
    low, high = _draw_range(dtype, value_range)
    if np.issubdtype(dtype, np.floating):
        return (low + (high - low) * v).astype(dtype)
    return np.round(low + (high - low) * v).astype(dtype)


def _draw_range(dtype: np.dtype, value_range: tuple[float, float] | None) -> tuple[float, float]:
    """The ends random_input draws between: ``value_range`` (integers: the whole numbers in it
    the type holds), else [-1, 1] for floats and the type's range for integers."""
    if np.issubdtype(dtype, np.floating):
        low, high = value_range or (-1.0, 1.0)
        return float(low), float(high)
    info = np.iinfo(dtype)
    low, high = value_range or (info.min, info.max)
    return max(float(info.min), float(np.ceil(low))), min(float(info.max), float(np.floor(high)))


def add_input_arguments(p) -> None:
    """benchmark_model's input flags (every tool that runs the model takes them)."""
    p.add_argument("--input_layer", default=None, metavar="NAMES", help="input names, comma-separated")
    p.add_argument("--input_layer_shape", default=None, metavar="SHAPES",
                   help="their shapes, colon-separated, e.g. 1,224,224,3:1,20 (dynamic dimensions only)")
    p.add_argument("--input_layer_value_range", default=None, metavar="RANGES",
                   help="NAME,LOW,HIGH items, colon-separated: random values in [LOW, HIGH] (default: the range "
                        "the model's metadata, else its quantization says, else the type's range / [-1, 1])")
    p.add_argument("--input_layer_value_files", default=None, metavar="FILES",
                   help="NAME:PATH items, comma-separated: the input's raw bytes (escape ':' in a name as '\\:')")


def input_layers(args) -> dict[str, InputLayer]:
    return parse_input_flags(args.input_layer, args.input_layer_shape, args.input_layer_value_range,
                             args.input_layer_value_files)


def check_input_flags(model_file: str, layers: dict[str, InputLayer]) -> list[InputSource]:
    """The input flags against the model's inputs, before any run (a ValueError if they do not fit);
    the inputs they describe (none without flags)."""
    if not layers:
        return []
    from delegate.runtime import Interpreter
    return input_sources(Interpreter(model_path=model_file).get_input_details(), layers, model_file)
