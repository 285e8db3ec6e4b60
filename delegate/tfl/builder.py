"""Build .tflite flatbuffers without TensorFlow (tests, examples, benchmarks).

Builtin options are given as ``("Conv2DOptions", {"padding": Padding.SAME,
"stride_w": 1, ...})`` with the schema's snake_case field names; they are
written through the `tflite` package's generated builder functions, so any
builtin's options work without per-op code here.

    b = TfLiteModelBuilder()
    x = b.add_input("x", [1, 8, 8, 3], np.int8, scale=0.5, zero_point=-3)
    w = b.add_constant("w", weights, scale=[...], zero_point=[0] * n, quantized_dimension=0)
    y = b.add_tensor("y", [1, 8, 8, 4], np.int8, scale=0.25, zero_point=1)
    b.add_operator("CONV_2D", [x, w, bias], [y], ("Conv2DOptions", {...}))
    b.set_outputs([y]); data = b.build()

Other subgraphs (IF branches, WHILE cond/body) are built the same way: ``body = b.add_subgraph()``
shares the model's buffers and operator codes, and ``body.index`` is what WhileOptions names.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import flatbuffers
import numpy as np

from delegate.tfl import schema
from delegate.tfl.schema import DTYPE_TENSOR, BuiltinOperator, BuiltinOptions, camel, module


@dataclass
class _Tensor:
    name: str
    shape: list[int]
    type: int
    buffer: int
    scale: list[float] | None
    zero_point: list[int] | None
    quantized_dimension: int
    shape_signature: list[int] | None
    sparsity: Any = None  # delegate.tfl.graph.Sparsity
    is_variable: bool = False  # a state tensor (LSTM/RNN states), kept across invocations


@dataclass
class _Operator:
    opcode_index: int
    inputs: list[int]
    outputs: list[int]
    options: tuple[str, dict[str, Any]] | None
    custom_options: bytes | None
    intermediates: list[int] | None = None  # tensors carrying the integer LSTM's internal scales


@dataclass
class TfLiteModelBuilder:
    description: str = "nnhal"
    _tensors: list[_Tensor] = field(default_factory=list)
    _buffers: list[bytes] = field(default_factory=lambda: [b""])  # buffer 0: the empty sentinel
    _opcodes: list[tuple[int, str | None, int]] = field(default_factory=list)
    _operators: list[_Operator] = field(default_factory=list)
    _inputs: list[int] = field(default_factory=list)
    _outputs: list[int] = field(default_factory=list)
    name: str = "main"
    #: Subgraphs 1.. (IF branches, WHILE cond/body): builders sharing this model's buffers and opcodes.
    _subgraphs: list[TfLiteModelBuilder] = field(default_factory=list, repr=False, compare=False)
    _root: TfLiteModelBuilder | None = field(default=None, repr=False, compare=False)
    #: Model.metadata entries: (name, buffer index), e.g. TFLite Support's "TFLITE_METADATA".
    _metadata: list[tuple[str, int]] = field(default_factory=list)

    # ---- subgraphs ----------------------------------------------------------
    def add_subgraph(self, name: str | None = None) -> TfLiteModelBuilder:
        """A new subgraph of this model (IF branches, WHILE cond/body), built like the main one:
        ``.index`` is the subgraph index IfOptions/WhileOptions name."""
        root = self._root or self
        sub = TfLiteModelBuilder(root.description, _buffers=root._buffers, _opcodes=root._opcodes,
                                 name=name or f"subgraph{len(root._subgraphs) + 1}", _root=root)
        root._subgraphs.append(sub)
        return sub

    @property
    def index(self) -> int:
        root = self._root or self
        return next((k + 1 for k, g in enumerate(root._subgraphs) if g is self), 0)

    # ---- tensors ------------------------------------------------------------
    def add_tensor(self, name: str, shape: Sequence[int], dtype: Any = np.float32, *,
                   scale: float | Sequence[float] | None = None,
                   zero_point: int | Sequence[int] | None = None, quantized_dimension: int = 0,
                   data: np.ndarray | bytes | None = None,
                   shape_signature: Sequence[int] | None = None, sparsity: Any = None,
                   is_variable: bool = False) -> int:
        ttype = dtype if isinstance(dtype, int) else DTYPE_TENSOR[np.dtype(dtype)]
        buf = 0
        if data is not None:
            raw = data if isinstance(data, bytes) else np.ascontiguousarray(data).tobytes()
            self._buffers.append(raw)
            buf = len(self._buffers) - 1
        if scale is not None:
            scale = [float(s) for s in np.atleast_1d(scale)]
            zp = [0] * len(scale) if zero_point is None else [int(z) for z in np.atleast_1d(zero_point)]
        else:
            zp = None
        self._tensors.append(_Tensor(name, [int(d) for d in shape], ttype, buf, scale, zp,
                                     quantized_dimension,
                                     None if shape_signature is None else list(shape_signature), sparsity,
                                     is_variable))
        return len(self._tensors) - 1

    def add_input(self, name: str, shape: Sequence[int], dtype: Any = np.float32, **quant) -> int:
        t = self.add_tensor(name, shape, dtype, **quant)
        self._inputs.append(t)
        return t

    def add_constant(self, name: str, array: np.ndarray, dtype: Any = None, **quant) -> int:
        array = np.asarray(array, dtype=dtype)
        return self.add_tensor(name, array.shape, array.dtype, data=array, **quant)

    def set_outputs(self, outputs: Sequence[int]) -> None:
        self._outputs = list(outputs)

    def add_metadata(self, name: str, data: bytes) -> int:
        """A Model.metadata entry ``name`` whose buffer holds ``data`` (returns the buffer index)."""
        root = self._root or self
        root._buffers.append(bytes(data))
        root._metadata.append((name, len(root._buffers) - 1))
        return len(root._buffers) - 1

    # ---- operators ----------------------------------------------------------
    def add_operator(self, op: str | int, inputs: Sequence[int], outputs: Sequence[int],
                     options: tuple[str, dict[str, Any]] | None = None, *, version: int = 1,
                     custom_code: str | None = None, custom_options: bytes | None = None,
                     intermediates: Sequence[int] | None = None) -> int:
        code = schema.builtin_code(op) if isinstance(op, str) else int(op)
        if custom_code is not None:
            code = BuiltinOperator.CUSTOM
        key = (code, custom_code, version)
        if key not in self._opcodes:
            self._opcodes.append(key)
        self._operators.append(_Operator(self._opcodes.index(key), list(inputs), list(outputs),
                                         options, custom_options,
                                         None if intermediates is None else list(intermediates)))
        return len(self._operators) - 1

    # ---- serialisation ------------------------------------------------------
    def build(self) -> bytes:
        if self._root is not None:  # a subgraph builds the whole model
            return self._root.build()
        b = flatbuffers.Builder(1024)
        M, OC, B = (module(n) for n in ("Model", "OperatorCode", "Buffer"))

        def ivec(start, vals, prepend=b.PrependInt32):
            start(b, len(vals))
            for v in reversed(vals):
                prepend(v)
            return b.EndVector()

        def tvec(start, offs):
            start(b, len(offs))
            for o in reversed(offs):
                b.PrependUOffsetTRelative(o)
            return b.EndVector()

        buf_offs = []
        for raw in self._buffers:
            data = None
            if raw:
                b.StartVector(1, len(raw), 16)  # 16-byte alignment for the weights
                b.head = b.head - len(raw)
                b.Bytes[b.head:b.head + len(raw)] = raw
                data = b.EndVector()
            B.BufferStart(b)
            if data is not None:
                B.BufferAddData(b, data)
            buf_offs.append(B.BufferEnd(b))

        oc_offs = []
        for code, custom, version in self._opcodes:
            cc = b.CreateString(custom) if custom is not None else None
            OC.OperatorCodeStart(b)
            OC.OperatorCodeAddDeprecatedBuiltinCode(b, min(code, 127))
            OC.OperatorCodeAddBuiltinCode(b, code)
            OC.OperatorCodeAddVersion(b, version)
            if cc is not None:
                OC.OperatorCodeAddCustomCode(b, cc)
            oc_offs.append(OC.OperatorCodeEnd(b))

        sg_offs = [g._build_subgraph(b, ivec, tvec) for g in (self, *self._subgraphs)]
        sgv = tvec(M.ModelStartSubgraphsVector, sg_offs)
        ocv = tvec(M.ModelStartOperatorCodesVector, oc_offs)
        bv = tvec(M.ModelStartBuffersVector, buf_offs)
        md_offs, MD = [], module("Metadata")
        for name, buf in self._metadata:
            md_name = b.CreateString(name)
            MD.MetadataStart(b)
            MD.MetadataAddName(b, md_name)
            MD.MetadataAddBuffer(b, buf)
            md_offs.append(MD.MetadataEnd(b))
        mdv = tvec(M.ModelStartMetadataVector, md_offs) if md_offs else None
        desc = b.CreateString(self.description)
        M.ModelStart(b)
        M.ModelAddVersion(b, 3)
        M.ModelAddOperatorCodes(b, ocv)
        M.ModelAddSubgraphs(b, sgv)
        M.ModelAddBuffers(b, bv)
        M.ModelAddDescription(b, desc)
        if mdv is not None:
            M.ModelAddMetadata(b, mdv)
        b.Finish(M.ModelEnd(b), file_identifier=b"TFL3")
        return bytes(b.Output())

    def _build_subgraph(self, b: flatbuffers.Builder, ivec, tvec) -> int:
        """This subgraph's tensors and operators (its buffers and opcodes are the model's)."""
        SG, T, O, Q = (module(n) for n in ("SubGraph", "Tensor", "Operator", "QuantizationParameters"))
        t_offs = []
        for t in self._tensors:
            name = b.CreateString(t.name)
            shape = ivec(T.TensorStartShapeVector, t.shape)
            sig = ivec(T.TensorStartShapeSignatureVector, t.shape_signature) \
                if t.shape_signature is not None else None
            q = None
            if t.scale is not None:
                sc = ivec(Q.QuantizationParametersStartScaleVector, t.scale, b.PrependFloat32)
                zp = ivec(Q.QuantizationParametersStartZeroPointVector, t.zero_point, b.PrependInt64)
                Q.QuantizationParametersStart(b)
                Q.QuantizationParametersAddScale(b, sc)
                Q.QuantizationParametersAddZeroPoint(b, zp)
                Q.QuantizationParametersAddQuantizedDimension(b, t.quantized_dimension)
                q = Q.QuantizationParametersEnd(b)
            sp = _build_sparsity(b, t.sparsity) if t.sparsity is not None else None
            T.TensorStart(b)
            T.TensorAddShape(b, shape)
            if sp is not None:
                T.TensorAddSparsity(b, sp)
            if sig is not None:
                T.TensorAddShapeSignature(b, sig)
            T.TensorAddType(b, t.type)
            T.TensorAddBuffer(b, t.buffer)
            T.TensorAddName(b, name)
            if t.is_variable:
                T.TensorAddIsVariable(b, True)
            if q is not None:
                T.TensorAddQuantization(b, q)
            t_offs.append(T.TensorEnd(b))

        op_offs = []
        for op in self._operators:
            ins = ivec(O.OperatorStartInputsVector, op.inputs)
            outs = ivec(O.OperatorStartOutputsVector, op.outputs)
            opt = _build_options(b, op.options) if op.options else None
            custom = None
            if op.custom_options is not None:
                custom = ivec(O.OperatorStartCustomOptionsVector, list(op.custom_options), b.PrependUint8)
            inter = ivec(O.OperatorStartIntermediatesVector, op.intermediates) \
                if op.intermediates is not None else None
            O.OperatorStart(b)
            O.OperatorAddOpcodeIndex(b, op.opcode_index)
            O.OperatorAddInputs(b, ins)
            O.OperatorAddOutputs(b, outs)
            if opt is not None:
                O.OperatorAddBuiltinOptionsType(b, opt[0])
                O.OperatorAddBuiltinOptions(b, opt[1])
            if custom is not None:
                O.OperatorAddCustomOptions(b, custom)
            if inter is not None:
                O.OperatorAddIntermediates(b, inter)
            op_offs.append(O.OperatorEnd(b))

        tv = tvec(SG.SubGraphStartTensorsVector, t_offs)
        opv = tvec(SG.SubGraphStartOperatorsVector, op_offs)
        inv = ivec(SG.SubGraphStartInputsVector, self._inputs)
        outv = ivec(SG.SubGraphStartOutputsVector, self._outputs)
        sgname = b.CreateString(self.name)
        SG.SubGraphStart(b)
        SG.SubGraphAddTensors(b, tv)
        SG.SubGraphAddOperators(b, opv)
        SG.SubGraphAddInputs(b, inv)
        SG.SubGraphAddOutputs(b, outv)
        SG.SubGraphAddName(b, sgname)
        sg = SG.SubGraphEnd(b)
        return sg


def _build_options(b: flatbuffers.Builder, options: tuple[str, dict[str, Any]]) -> tuple[int, int]:
    """Write a builtin options table through the generated ``<Name>Add<Field>`` functions."""
    name, fields = options
    mod = module(name)
    kind = getattr(BuiltinOptions, name)
    vectors = {}
    for key, value in fields.items():  # vectors must be built before the table starts
        if isinstance(value, (list, tuple, np.ndarray)):
            start = getattr(mod, f"{name}Start{camel(key)}Vector")
            start(b, len(value))
            for v in reversed(list(value)):
                b.PrependInt32(int(v))
            vectors[key] = b.EndVector()
    getattr(mod, f"{name}Start")(b)
    for key, value in fields.items():
        add = getattr(mod, f"{name}Add{camel(key)}", None)
        if add is None:
            raise ValueError(f"{name} has no field {key!r}")
        add(b, vectors[key] if key in vectors else value)
    return kind, getattr(mod, f"{name}End")(b)


def _build_sparsity(b: flatbuffers.Builder, sp) -> int:
    """SparsityParameters with Int32Vector segment/index arrays."""
    SP, DM, IV = module("SparsityParameters"), module("DimensionMetadata"), module("Int32Vector")

    def ints(start, vals):
        start(b, len(vals))
        for v in reversed(list(vals)):
            b.PrependInt32(int(v))
        return b.EndVector()

    def int32_vector(vals):
        v = ints(IV.Int32VectorStartValuesVector, vals)
        IV.Int32VectorStart(b)
        IV.Int32VectorAddValues(b, v)
        return IV.Int32VectorEnd(b)

    metas = []
    for d in sp.dim_metadata:
        seg = int32_vector(d.segments) if d.format == 1 else None
        idx = int32_vector(d.indices) if d.format == 1 else None
        DM.DimensionMetadataStart(b)
        DM.DimensionMetadataAddFormat(b, d.format)
        DM.DimensionMetadataAddDenseSize(b, d.dense_size)
        if seg is not None:
            DM.DimensionMetadataAddArraySegmentsType(b, 1)  # SparseIndexVector.Int32Vector
            DM.DimensionMetadataAddArraySegments(b, seg)
            DM.DimensionMetadataAddArrayIndicesType(b, 1)
            DM.DimensionMetadataAddArrayIndices(b, idx)
        metas.append(DM.DimensionMetadataEnd(b))
    order = ints(SP.SparsityParametersStartTraversalOrderVector, sp.traversal_order)
    block = ints(SP.SparsityParametersStartBlockMapVector, sp.block_map) if sp.block_map else None
    SP.SparsityParametersStartDimMetadataVector(b, len(metas))
    for m in reversed(metas):
        b.PrependUOffsetTRelative(m)
    dims = b.EndVector()
    SP.SparsityParametersStart(b)
    SP.SparsityParametersAddTraversalOrder(b, order)
    if block is not None:
        SP.SparsityParametersAddBlockMap(b, block)
    SP.SparsityParametersAddDimMetadata(b, dims)
    return SP.SparsityParametersEnd(b)
