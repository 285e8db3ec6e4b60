"""TFLite builtin -> NNAPI operation translation: context, registry, partition conversion.

A mapper is one function per TFLite builtin family, registered with ``@mapper``
together with the reader of its TFLite options (``options=``: the C struct TFLite
hands a delegate as builtin_data). It reads the node (tensors, options) and emits
NNAPI operands and operations through a MappingContext; it raises
MappingError(reason) for TFLite variants NNAPI cannot express (a different
semantics, a missing type). NNAPI's own rules are not repeated here: every
emitted operation goes through hal's validate (the operation's spec, no kernels),
and a refusal carries hal's message (InvalidNnapiOperation).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from delegate.mapping import scalars
from delegate.mapping.host_runtime import Runtime, host_runtime
from delegate.mapping.options import OptionsReader
from delegate.tfl.graph import TfLiteGraph, TfLiteNode, TfLiteTensor
from delegate.tfl.schema import ActivationFunctionType, Padding, TensorType, builtin_name
from hal.errors import HalError
from hal.extension_registry import model_prefixes
from hal.model import ExtensionNameAndPrefix, Model, ModelBuilder, SymmPerChannelQuantParams
from hal.operands import constant_from_bytes, validation_info
from hal.types import (
    FusedActivationFunc,
    OperandType,
    OperationType,
    PaddingScheme,
    encode_extension_type,
    operation_name,
)
from hal.validation import validate_operation


class MappingError(Exception):
    """This node (variant) has no NNAPI equivalent here; the message says why."""


class InvalidNnapiOperation(MappingError):
    """The NNAPI operation a node maps to breaks NNAPI's rules: hal's validate said why."""


Mapper = Callable[["MappingContext", TfLiteNode], None]


@dataclass(frozen=True)
class MapperEntry:
    map: Mapper
    options: OptionsReader  # builtin_data -> options dict (delegate.mapping.options)


_MAPPERS: dict[int, MapperEntry] = {}


def mapper(*builtin_codes: int, options: OptionsReader | dict[int, OptionsReader]):
    """Register a mapper for one or more TFLite BuiltinOperator codes, with the reader of their
    builtin_data (one for all, or one per code; a mapper never runs on options nobody read)."""
    def deco(fn: Mapper) -> Mapper:
        for c in builtin_codes:
            if c in _MAPPERS:
                raise RuntimeError(f"mapper for {builtin_name(c)} registered twice")
            _MAPPERS[c] = MapperEntry(fn, options[c] if isinstance(options, dict) else options)
        return fn
    return deco


def _entry(builtin_code: int) -> MapperEntry | None:
    # Complete: importing this module imports its package first, which registers every family.
    return _MAPPERS.get(builtin_code)


def lookup_mapper(builtin_code: int) -> Mapper | None:
    e = _entry(builtin_code)
    return None if e is None else e.map


def options_reader(builtin_code: int) -> OptionsReader | None:
    e = _entry(builtin_code)
    return None if e is None else e.options


def mapped_builtins() -> dict[int, MapperEntry]:
    _entry(-1)
    return dict(_MAPPERS)


#: CUSTOM ops TFLite itself implements (custom_code -> mapper); an installed extension claiming
#: the same code takes precedence.
_CUSTOM_MAPPERS: dict[str, Mapper] = {}


def custom_mapper(*custom_codes: str):
    """Register a mapper for CUSTOM nodes with one of these custom_codes (options: node.custom_options)."""
    def deco(fn: Mapper) -> Mapper:
        for c in custom_codes:
            if c in _CUSTOM_MAPPERS:
                raise RuntimeError(f"mapper for CUSTOM ({c}) registered twice")
            _CUSTOM_MAPPERS[c] = fn
        return fn
    return deco


def lookup_custom_mapper(custom_code: str | None) -> Mapper | None:
    _entry(-1)
    return _CUSTOM_MAPPERS.get(custom_code) if custom_code else None


_FUSED = {
    ActivationFunctionType.NONE: FusedActivationFunc.NONE,
    ActivationFunctionType.RELU: FusedActivationFunc.RELU,
    ActivationFunctionType.RELU_N1_TO_1: FusedActivationFunc.RELU1,
    ActivationFunctionType.RELU6: FusedActivationFunc.RELU6,
}
_PADDING = {Padding.SAME: PaddingScheme.SAME, Padding.VALID: PaddingScheme.VALID}


class MappingContext:
    """Builds one NNAPI Model from TFLite nodes; TFLite tensors become operands on first use."""

    def __init__(self, graph: TfLiteGraph, validate: bool = True, runtime: Runtime | None = None):
        self.graph = graph
        #: The TFLite runtime, (package, version), whose reference kernels the NNAPI model must
        #: equal where runtimes differ (delegate.mapping.host_runtime); default: the host's.
        self.runtime = runtime if runtime is not None else host_runtime()
        self.builder = ModelBuilder()
        self.operand_of: dict[int, int] = {}  # tflite tensor index -> NNAPI operand index
        self.node: TfLiteNode | None = None
        #: Run hal's validate on every emitted operation (off only where the same nodes were
        #: validated moments ago, e.g. a delegate kernel building the partition its support query
        #: already checked).
        self.validate = validate
        self._infos: dict[int, object] = {}  # operand index -> its validation info (operands never change)
        #: TFLite variable tensor -> the NNAPI operand holding its new value (see state_output).
        self.state_writes: dict[int, int] = {}
        #: A rank-0 activation becomes an NNAPI [1] tensor (else: refused): set while a mapper listed in
        #: delegate.mapping.scalars runs, and by control flow for a subgraph's inputs.
        self.scalar_as_one = False
        #: Rank-0 tensors whose [1] operand the caller set up for any producer (a WHILE cond's bool).
        self.preset_scalars: set[int] = set()

    def checkpoint(self) -> tuple:
        return self.builder.mark(), len(self.operand_of), len(self.state_writes)

    def rollback(self, checkpoint: tuple) -> None:
        """Undo a node whose mapping failed half way: its operands, operations and constants."""
        mark, n_tensors, n_states = checkpoint
        self.builder.rewind(mark)
        for t in list(self.operand_of)[n_tensors:]:  # dicts keep insertion order
            del self.operand_of[t]
        for t in list(self.state_writes)[n_states:]:
            del self.state_writes[t]
        for i in [i for i in self._infos if i >= mark[0]]:
            del self._infos[i]

    # ---- tensors ------------------------------------------------------------
    def tensor_info(self, t: int) -> TfLiteTensor:
        if not 0 <= t < len(self.graph.tensors):
            raise MappingError(f"tensor index {t} out of range")
        return self.graph.tensors[t]

    def input_tensor(self, k: int) -> TfLiteTensor:
        node = self.node
        if k >= len(node.inputs) or node.inputs[k] < 0:
            raise MappingError(f"input {k} is missing")
        return self.tensor_info(node.inputs[k])

    def output_tensor(self, k: int) -> TfLiteTensor:
        if k >= len(self.node.outputs):
            raise MappingError(f"output {k} is missing")
        return self.tensor_info(self.node.outputs[k])

    def operand_type(self, t: TfLiteTensor, *, per_channel_ok: bool = False) -> OperandType:
        """NNAPI operand type of a TFLite tensor (MappingError when there is none)."""
        if t.type == TensorType.FLOAT32:
            return OperandType.TENSOR_FLOAT32
        if t.type == TensorType.FLOAT16:
            return OperandType.TENSOR_FLOAT16
        if t.type == TensorType.INT32:
            return OperandType.TENSOR_INT32
        if t.type == TensorType.BOOL:
            return OperandType.TENSOR_BOOL8
        if t.type in (TensorType.UINT8, TensorType.INT8):
            if not t.is_quantized:
                raise MappingError(f"tensor {t.name!r}: 8-bit tensor without quantization")
            if t.per_channel:
                if not per_channel_ok:
                    raise MappingError(f"tensor {t.name!r}: per-channel quantization not "
                                       f"supported in this position")
                if t.type != TensorType.INT8 or any(z != 0 for z in t.zero_points):
                    raise MappingError(f"tensor {t.name!r}: per-channel tensors must be int8 "
                                       f"with zero points 0")
                return OperandType.TENSOR_QUANT8_SYMM_PER_CHANNEL
            return (OperandType.TENSOR_QUANT8_ASYMM if t.type == TensorType.UINT8
                    else OperandType.TENSOR_QUANT8_ASYMM_SIGNED)
        raise MappingError(f"tensor {t.name!r}: TFLite type {t.type} has no NNAPI equivalent here")

    def tensor(self, t: int, *, per_channel_ok: bool = False, scale: float | None = None,
               type: OperandType | None = None) -> int:
        """NNAPI operand for TFLite tensor ``t`` (created once; constants carry their data).

        ``scale`` overrides the operand scale (NNAPI's bias scale rules); ``type``
        overrides the inferred operand type.
        """
        if t in self.operand_of:
            return self.operand_of[t]
        info = self.tensor_info(t)
        why = unresolved_shape(info)
        if why:
            raise MappingError(f"tensor {info.name!r} {why}")
        if info.sparse:
            raise MappingError(f"tensor {info.name!r} is sparse")
        shape = info.shape
        if not shape and not info.is_constant and (type is None or not type >> 16):
            # NNAPI reads a tensor without dimensions as one of unknown rank (its execution would
            # then need the shape); only constants may be rank 0. Extension types decide for themselves.
            if not self.scalar_as_one:
                raise MappingError(scalars.not_listed(self.node, info))
            shape = (1,)  # the same computation for this node's mapper: delegate.mapping.scalars
        otype = type if type is not None else self.operand_type(info, per_channel_ok=per_channel_ok)
        cq = None
        q_scale, q_zp = 0.0, 0
        if otype == OperandType.TENSOR_QUANT8_SYMM_PER_CHANNEL:
            cq = SymmPerChannelQuantParams(tuple(info.scales), info.quantized_dimension)
        elif otype in (OperandType.TENSOR_QUANT8_ASYMM, OperandType.TENSOR_QUANT8_ASYMM_SIGNED,
                       OperandType.TENSOR_QUANT16_SYMM):
            q_scale, q_zp = info.scales[0], info.zero_points[0]
        elif otype == OperandType.TENSOR_INT32 and info.is_quantized and not info.per_channel:
            q_scale = info.scales[0]
        if scale is not None:
            q_scale = scale
        if info.is_constant:
            idx = self.builder.add_constant(otype, info.data, dimensions=info.shape, scale=q_scale,
                                            zero_point=q_zp, channel_quant=cq)
        else:
            idx = self.builder.add_operand(otype, shape, q_scale, q_zp, cq)
        self.operand_of[t] = idx
        return idx

    def new_temporary(self, like: int, shape=None) -> int:
        """A fresh NNAPI-only operand shaped/quantized like operand ``like``."""
        src = self.builder.operands[like]
        return self.builder.add_operand(src.type, src.dimensions if shape is None else shape,
                                        src.scale, src.zero_point, src.channel_quant)

    def state_output(self, t: int) -> int:
        """A new NNAPI operand for the value a stateful node (LSTM, RNN, SVDF) writes into its TFLite
        variable tensor ``t``. NNAPI has no variable operands: the state is a model input
        (``tensor(t)``) and its new value an extra model output that the delegate kernel copies
        back into ``t`` after each run, so TFLite keeps owning the state (reset_all_variables works)."""
        info = self.tensor_info(t)
        if not info.is_variable:
            raise MappingError(f"state tensor {info.name!r} is not a variable tensor")
        if t in self.state_writes:
            raise MappingError(f"variable tensor {info.name!r} is written by two nodes")
        readers = [n.index for n in self.graph.nodes if t in n.inputs]
        if readers != [self.node.index]:
            raise MappingError(f"variable tensor {info.name!r} is read by nodes {readers}, not only by the "
                               f"node that updates it")
        operand = self.new_temporary(self.tensor(t))
        self.state_writes[t] = operand
        return operand

    # ---- scalars and options ------------------------------------------------
    def int32(self, v: int) -> int:
        return self.builder.add_int32(int(v))

    def float32(self, v: float) -> int:
        return self.builder.add_float32(float(v))

    def bool(self, v: bool) -> int:
        return self.builder.add_bool(bool(v))

    def constant(self, type: OperandType, array, **kw) -> int:
        return self.builder.add_constant(type, np.asarray(array), **kw)

    def option(self, name: str, default=None):
        return self.node.options.get(name, default)

    def fused_activation(self, name: str = "fused_activation_function") -> int:
        act = self.option(name, ActivationFunctionType.NONE)
        if act not in _FUSED:
            raise MappingError(f"fused activation {act} has no NNAPI equivalent")
        return self.int32(_FUSED[act])

    def padding(self, name: str = "padding") -> int:
        p = self.option(name, Padding.SAME)
        if p not in _PADDING:
            raise MappingError(f"padding {p} has no NNAPI equivalent")
        return self.int32(_PADDING[p])

    def operation(self, op: OperationType | int, inputs, outputs) -> int:
        return self.builder.add_operation(op, inputs, outputs)

    def validate_since(self, first: int) -> None:
        """hal's validate (NNAPI's rules, no kernels) on every operation emitted from ``first`` on."""
        b = self.builder
        operations = b.model.main.operations
        prefixes = model_prefixes(b.model)

        def scalar(i, operand, dtype=None):
            raw = b.small_value(i)
            return None if raw is None else constant_from_bytes(raw, operand, copy=False, dtype=dtype)  # immutable

        infos = self._infos
        for k in range(first, len(operations)):
            operation = operations[k]
            for i in (*operation.inputs, *operation.outputs):
                if i not in infos:
                    infos[i] = validation_info(i, b.operands[i], prefixes, scalar)
            try:
                validate_operation(k, operation, b.operands, infos, prefixes, b.model)  # IF/WHILE: its subgraphs
            except HalError as e:
                detail = getattr(e, "detail", None) or e.message
                raise InvalidNnapiOperation(f"NNAPI {operation_name(operation.type)} rejects it: {detail}") from None

    def extension_code(self, extension: str, type_within: int) -> int:
        """``(prefix << 16) | type`` for this model, assigning the extension a prefix on first use."""
        prefixes = self.builder.model.extension_name_to_prefix
        prefix = next((e.prefix for e in prefixes if e.name == extension), None)
        if prefix is None:
            prefix = len(prefixes) + 1
            prefixes.append(ExtensionNameAndPrefix(extension, prefix))
        return encode_extension_type(prefix, type_within)


@dataclass
class ConvertedPartition:
    model: Model
    input_tensors: list[int]  # TFLite tensor indexes, in NNAPI model input order
    output_tensors: list[int]
    #: Partition outputs that folding made constant: the kernel writes them as they are.
    constant_outputs: dict[int, np.ndarray] = field(default_factory=dict)
    #: TFLite node index -> range [first, last) of the NNAPI operations it became.
    node_operations: dict[int, tuple[int, int]] = field(default_factory=dict)
    #: Variable tensors (LSTM/RNN state) the partition updates: their new values are the NNAPI
    #: model's outputs after those of output_tensors, in this order, and are copied back into them.
    state_tensors: list[int] = field(default_factory=list)
    #: TFLite tensor index -> the NNAPI operand standing for it (inputs, outputs and inside).
    tensor_operands: dict[int, int] = field(default_factory=dict)


def partition_io(graph: TfLiteGraph, node_indexes: list[int]) -> tuple[list[int], list[int]]:
    """Inputs (non-constant tensors read but not produced) and outputs (produced and needed outside)."""
    inside = set(node_indexes)
    produced: set[int] = set()
    inputs: list[int] = []
    for n in node_indexes:
        node = graph.nodes[n]
        for t in node.inputs:
            if t >= 0 and t not in produced and t not in inputs and not graph.tensors[t].is_constant:
                inputs.append(t)
        produced.update(node.outputs)
    outside_uses = {t for n in graph.nodes if n.index not in inside for t in n.inputs}
    outputs = [t for n in node_indexes for t in graph.nodes[n].outputs
               if t in outside_uses or t in graph.outputs]
    order = {t: k for k, t in enumerate(graph.inputs)}
    inputs.sort(key=lambda t: order.get(t, len(order)))
    oorder = {t: k for k, t in enumerate(graph.outputs)}
    outputs.sort(key=lambda t: oorder.get(t, len(oorder)))
    return inputs, outputs


def unresolved_shape(info: TfLiteTensor) -> str | None:
    """Why the NNAPI model cannot be built for this tensor's shape, or None.

    A -1 in the signature (a dynamic batch: the converter's default for Keras models) is no reason:
    ``shape`` is the one TFLite resolved, the live interpreter's current dims (or, read from a file,
    the stored shape TFLite starts from), and a resize makes the delegate convert again (TFLite
    re-delegates, or NnhalKernel.prepare re-converts). Refused: a shape TFLite knows only once the
    producer ran (kTfLiteDynamic), and a dimension still unknown (negative, or 0 where the signature
    has -1: NNAPI reads 0 as "unknown")."""
    if info.runtime_shape:
        return "has a data-dependent (dynamic) shape: TFLite sizes it only when its producer runs"
    sig = info.shape_signature
    if any(d < 0 for d in info.shape) or (sig is not None and len(sig) == len(info.shape)
                                          and any(d == 0 and s < 0 for d, s in zip(info.shape, sig))):
        return f"has an unresolved dynamic shape {list(info.shape)} (signature {list(sig or ())})"
    return None


def map_node(ctx: MappingContext, node: TfLiteNode) -> None:
    ctx.node = node
    if node.outputs and all(0 <= t < len(ctx.graph.tensors) and ctx.graph.tensors[t].is_constant
                            for t in node.outputs):
        return  # folded at delegation time (see delegate.mapping.folding): nothing to compute
    fn = lookup_custom_mapper(node.custom_code) if node.custom_code is not None else None
    if node.custom_code is not None and (fn is None or custom_provider(node) is not None):
        _map_custom(ctx, node)
        return
    fn = fn or lookup_mapper(node.builtin_code)
    if fn is None:
        raise MappingError(f"no NNAPI mapping for {builtin_name(node.builtin_code)}")
    if not node.outputs:
        raise MappingError(f"{builtin_name(node.builtin_code)} node has no outputs")
    for k, t in enumerate(node.outputs):
        why = unresolved_shape(ctx.tensor_info(t)) if t >= 0 else None  # -1: unused (WHILE)
        if why:
            raise MappingError(f"output {k} (tensor {ctx.tensor_info(t).name!r}) {why}")
    scalar_refusal = scalars.scalar_refusal(node, ctx.tensor_info)  # rank-0 activations: as [1] or not
    listed = scalars.is_listed(node)
    if scalar_refusal and listed:
        raise MappingError(scalar_refusal)
    first = len(ctx.builder.model.main.operations)
    ctx.scalar_as_one = listed
    try:
        fn(ctx, node)
    except (IndexError, KeyError, TypeError) as e:  # a malformed node must not crash the caller
        raise MappingError(f"malformed {builtin_name(node.builtin_code)} node: {e!r}") from None
    finally:
        ctx.scalar_as_one = False
    if scalar_refusal and _reads_scalar_as_one(ctx, node):
        raise MappingError(scalar_refusal)  # an unlisted mapper given a [1] operand another node made
    if ctx.validate:
        ctx.validate_since(first)


def _reads_scalar_as_one(ctx: MappingContext, node: TfLiteNode) -> bool:
    """Whether one of the node's rank-0 activations is an NNAPI [1] tensor (delegate.mapping.scalars)."""
    ops = ctx.builder.operands
    return any(t.index in ctx.operand_of and t.index not in ctx.preset_scalars
               and tuple(ops[ctx.operand_of[t.index]].dimensions) == scalars.ONE
               for t in scalars.scalar_tensors(node, ctx.tensor_info))


def custom_provider(node: TfLiteNode):
    """(Extension, ExtensionOperation) implementing a CUSTOM node's custom_code, or None."""
    from extensions.registry import by_custom_code
    return by_custom_code(node.custom_code)


def _map_custom(ctx: MappingContext, node: TfLiteNode) -> None:
    found = custom_provider(node)
    if found is None:
        raise MappingError(f"no NNAPI mapping for CUSTOM ({node.custom_code}): no registered extension "
                           f"implements it")
    ext, op = found
    if op.map_tflite is None:
        raise MappingError(f"extension {ext.name} implements {node.custom_code} but gives no TFLite mapping")
    first = len(ctx.builder.model.main.operations)
    try:
        op.map_tflite(ctx, node, ctx.extension_code(ext.name, op.type))
        if ctx.validate:
            ctx.validate_since(first)
    except MappingError:
        raise
    except Exception as e:  # noqa: BLE001 - a vendor mapper's bug or bad options: the node stays with TFLite
        raise MappingError(f"CUSTOM ({node.custom_code}) via extension {ext.name}: {e}") from None


def convert_partition(graph: TfLiteGraph, node_indexes: list[int] | None = None,
                      inputs: list[int] | None = None, outputs: list[int] | None = None, *,
                      validate: bool = True, runtime: Runtime | None = None) -> ConvertedPartition:
    """Translate the given nodes (default: all) into one NNAPI Model.

    ``inputs``/``outputs`` (tensor indexes) override the computed boundary, e.g. with the
    one TFLite hands a delegate kernel; constant and internally produced inputs are dropped.
    ``validate=False`` skips hal's validate of the emitted operations: only for nodes that just
    passed it (the service validates the model again anyway).
    (A partition converted again after a resize, where TFLite left some dims stale, goes through
    delegate.mapping.shape_inference.convert_with_inferred_shapes instead.)
    ``runtime``: the TFLite runtime whose reference kernels the model must equal (default: the
    one the delegate runs in, delegate.mapping.host_runtime); tests of hal's kernels name
    host_runtime.TFLITE_RUNTIME_2_14 to get NNAPI's own operations whatever the host."""
    if node_indexes is None:
        node_indexes = list(range(len(graph.nodes)))
    ctx = MappingContext(graph, validate, runtime)
    computed_in, computed_out = partition_io(graph, node_indexes)
    if inputs is None:
        inputs = computed_in
    else:
        produced = {t for n in node_indexes for t in graph.nodes[n].outputs}
        inputs = [t for t in inputs if t not in produced and not ctx.tensor_info(t).is_constant]
    outputs = computed_out if outputs is None else list(outputs)
    constant_outputs = {t: ctx.tensor_info(t).data for t in outputs if ctx.tensor_info(t).is_constant}
    outputs = [t for t in outputs if t not in constant_outputs]
    spans = {}
    for n in node_indexes:
        first = len(ctx.builder.model.main.operations)
        map_node(ctx, graph.nodes[n])
        spans[n] = (first, len(ctx.builder.model.main.operations))
    # Inputs become operands when a mapper first reads them (as in the support query), so the type a
    # mapper gives one (the integer LSTM's int16 cell state: TENSOR_QUANT16_SYMM) is the input's.
    in_ops = [ctx.tensor(t) for t in inputs]
    out_ops = [ctx.operand_of[t] for t in outputs]
    states = list(ctx.state_writes)
    ctx.builder.identify_inputs_and_outputs(in_ops, out_ops + [ctx.state_writes[t] for t in states])
    return ConvertedPartition(ctx.builder.finish(), inputs, outputs, constant_outputs, spans, states,
                              dict(ctx.operand_of))
