"""Read a .tflite flatbuffer into a TfLiteGraph (subgraph 0; the others in its ``subgraphs``)."""
from __future__ import annotations

import inspect
import os

import numpy as np

from delegate.tfl import schema
from delegate.tfl.graph import DimensionMetadata, Sparsity, TfLiteGraph, TfLiteNode, TfLiteTensor
from delegate.tfl.schema import TENSOR_DTYPE, module, snake
from delegate.tfl.verify import ModelFormatError, check_dataflow, verify_model

__all__ = ["ModelFormatError", "read_model", "verify_model_file"]


def read_model(data: bytes) -> TfLiteGraph:
    """Subgraph 0 of a verified model (``verify_model`` first: the flatbuffers accessors do not
    check bounds); every subgraph, 0 included, is in its ``subgraphs`` by index."""
    verify_model(data)
    try:
        model = module("Model").Model.GetRootAs(data, 0)
        graph = _read(model)
        for g in graph.subgraphs:
            _check_indexes(g)
        return graph
    except ModelFormatError:
        raise
    except Exception as e:  # truncated / corrupted flatbuffers raise anything
        raise ModelFormatError(f"malformed TFLite model: {e!r}") from e


def _read(model) -> TfLiteGraph:
    if model.SubgraphsLength() < 1:
        raise ModelFormatError("model has no subgraph")
    codes = []
    for i in range(model.OperatorCodesLength()):
        oc = model.OperatorCodes(i)
        code = max(oc.BuiltinCode(), oc.DeprecatedBuiltinCode())
        cc = oc.CustomCode()
        codes.append((code, cc.decode() if cc else None, oc.Version()))
    graphs = [_read_subgraph(model, model.Subgraphs(k), codes) for k in range(model.SubgraphsLength())]
    for g in graphs:
        g.subgraphs = graphs
    return graphs[0]


def _read_subgraph(model, sg, codes) -> TfLiteGraph:
    tensors = []
    for i in range(sg.TensorsLength()):
        t = sg.Tensors(i)
        shape = tuple(int(d) for d in t.ShapeAsNumpy()) if t.ShapeLength() else ()
        sig = tuple(int(d) for d in t.ShapeSignatureAsNumpy()) if t.ShapeSignatureLength() else None
        scales: tuple[float, ...] = ()
        zps: tuple[int, ...] = ()
        qdim = 0
        q = t.Quantization()
        if q is not None and q.ScaleLength():
            scales = tuple(float(s) for s in q.ScaleAsNumpy())
            zps = tuple(int(z) for z in q.ZeroPointAsNumpy()) if q.ZeroPointLength() else (0,) * len(scales)
            qdim = q.QuantizedDimension()
        data = None
        sparsity = _sparsity(t.Sparsity())
        buf_index = t.Buffer()
        if 0 < buf_index < model.BuffersLength():
            buf = model.Buffers(buf_index)
            if buf.DataLength() and not t.IsVariable():  # TFLite refuses variables with data
                dtype = TENSOR_DTYPE.get(t.Type())
                raw = buf.DataAsNumpy().tobytes()
                if dtype is not None:
                    data = np.frombuffer(raw, dtype=dtype)
                    if sparsity is None:
                        data = data.reshape(shape)
        name = t.Name().decode() if t.Name() else f"t{i}"
        tensors.append(TfLiteTensor(index=i, name=name, type=t.Type(), shape=shape, shape_signature=sig,
                                    scales=scales, zero_points=zps, quantized_dimension=qdim,
                                    data=data, is_variable=bool(t.IsVariable()), sparsity=sparsity))
    nodes = []
    for i in range(sg.OperatorsLength()):
        op = sg.Operators(i)
        code, custom, version = codes[op.OpcodeIndex()]
        custom_opts = op.CustomOptionsAsNumpy().tobytes() if op.CustomOptionsLength() else b""
        nodes.append(TfLiteNode(index=i, builtin_code=code,
                                inputs=tuple(int(x) for x in op.InputsAsNumpy()) if op.InputsLength() else (),
                                outputs=tuple(int(x) for x in op.OutputsAsNumpy()) if op.OutputsLength() else (),
                                options=_options(op), custom_code=custom,
                                custom_options=custom_opts, version=version,
                                intermediates=tuple(int(x) for x in op.IntermediatesAsNumpy())
                                if op.IntermediatesLength() else ()))
    return TfLiteGraph(tensors=tensors, nodes=nodes,
                       inputs=[int(x) for x in sg.InputsAsNumpy()] if sg.InputsLength() else [],
                       outputs=[int(x) for x in sg.OutputsAsNumpy()] if sg.OutputsLength() else [])


def _index_vector(kind: int, table) -> tuple[int, ...]:
    """A SparseIndexVector union (Int32Vector / Uint16Vector / Uint8Vector) as ints."""
    name = {1: "Int32Vector", 2: "Uint16Vector", 3: "Uint8Vector"}.get(kind)
    if name is None or table is None:
        return ()
    vec = getattr(module(name), name)()
    vec.Init(table.Bytes, table.Pos)
    return tuple(int(v) for v in vec.ValuesAsNumpy()) if vec.ValuesLength() else ()


def _sparsity(sp) -> Sparsity | None:
    if sp is None:
        return None
    dims = []
    for i in range(sp.DimMetadataLength()):
        d = sp.DimMetadata(i)
        dims.append(DimensionMetadata(d.Format(), d.DenseSize(),
                                      _index_vector(d.ArraySegmentsType(), d.ArraySegments()),
                                      _index_vector(d.ArrayIndicesType(), d.ArrayIndices())))
    order = tuple(int(v) for v in sp.TraversalOrderAsNumpy()) if sp.TraversalOrderLength() else ()
    block = tuple(int(v) for v in sp.BlockMapAsNumpy()) if sp.BlockMapLength() else ()
    return Sparsity(order, block, tuple(dims))


_SKIP = ("Init", "GetRootAs")


def _options(op) -> dict:
    """Builtin options table -> {snake_case_field: value}, by reflection on the generated class."""
    name = schema.options_name(op.BuiltinOptionsType())
    table = op.BuiltinOptions()
    if not name or name == "NONE" or table is None:
        return {}
    cls = getattr(module(name), name)
    obj = cls()
    obj.Init(table.Bytes, table.Pos)
    out = {}
    methods = {m for m in dir(cls) if m[:1].isupper() and not m.startswith(_SKIP)}
    for m in methods:
        if m.endswith(("AsNumpy", "Length", "IsNone")):
            continue
        fn = getattr(obj, m)
        params = inspect.signature(fn).parameters
        if params:  # vector accessor taking an index
            if f"{m}AsNumpy" in methods:
                arr = getattr(obj, f"{m}AsNumpy")()
                out[snake(m)] = [] if isinstance(arr, int) else [int(x) for x in arr]
            continue
        out[snake(m)] = fn()
    return out


def _check_indexes(g: TfLiteGraph) -> None:
    """Every tensor index the graph uses must exist (-1 marks an omitted optional input)."""
    n = len(g.tensors)
    for what, idxs in (("subgraph input", g.inputs), ("subgraph output", g.outputs)):
        for t in idxs:
            if not 0 <= t < n:
                raise ModelFormatError(f"{what} refers to tensor {t}, the subgraph has {n}")
    for node in g.nodes:
        for t in node.inputs:
            if not -1 <= t < n:
                raise ModelFormatError(f"node {node.index}: input tensor {t} out of range [0, {n})")
        for t in node.outputs:
            if not 0 <= t < n:
                raise ModelFormatError(f"node {node.index}: output tensor {t} out of range [0, {n})")


def verify_model_file(path: str | os.PathLike) -> bytes:
    """The bytes of the .tflite file at ``path``, verified (structure, every index nnhal's reader
    checks, then the dataflow of every subgraph); ModelFormatError with one line if it is not a
    model TFLite can safely load."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ModelFormatError(f"cannot read model file: {e.strerror or e}") from None
    for k, graph in enumerate(read_model(data).subgraphs):  # read_model verifies first
        try:
            check_dataflow(graph)
        except ModelFormatError as e:
            raise ModelFormatError(f"{e} (subgraph {k})" if k else str(e)) from None
    return data
