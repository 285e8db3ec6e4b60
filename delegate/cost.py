"""Estimated cost of running a partition on TFLite's CPU or on the nnhal service, in microseconds.

Why: TFLite's NNAPI delegate keeps the largest partitions, and its users report that this can be
slower than no delegation at all (tensorflow issues 66677, 43541, 28283): every partition boundary
costs an invoke round trip plus copying the partition's inputs and outputs. ``partitioning="cost"``
(delegate.partition.choose_partitions) delegates a partition only when this estimate says it
saves time.

The estimate of one partition, every figure in microseconds:

- ``cpu_us``: sum over its nodes of work / rate. Work is multiply-accumulates for CONV_2D,
  DEPTHWISE_CONV_2D, FULLY_CONNECTED, BATCH_MATMUL and TRANSPOSE_CONV (``node_work``: formulas
  from the TFLite tensor shapes), elements touched (inputs + outputs) for every other node; the
  rate depends on the node's type (float or 8-bit) and, for elements, on whether it computes.
- ``compute_us``: each node's CPU figure times the device's ``exec_time`` for the node's operand
  type, as the service's getCapabilities reports it (NNAPI PerformanceInfo: the device's time
  relative to the CPU's for the same work; lower is faster; nnhal's service states what its
  backends measured, hal.performance), plus ``DISPATCH_US_PER_NODE`` per node: exec_time comes
  from large models, where the service's per-operation dispatch is lost in the arithmetic; on a
  small partition it is most of the time. float32 with ``allow_fp16`` uses
  ``relaxed_float32_to_float16_performance_tensor``.
- ``overhead_us``: one invoke of the partition (request, doorbell, reply; more when partitions
  take turns), and ``transfer_us``:
  the bytes of its non-constant input and output tensors times a per-byte cost.
- ``nnhal_us = compute_us + overhead_us + transfer_us``; ``saving_us = cpu_us - nnhal_us``.

Constants (this machine: x86_64, 2 cores, Python 3.11, tflite_runtime 2.14; measured 2026-11-26).
The CPU rates are fitted on whole models, the ones whose ratios give the service's stated speeds
(hal/performance.py): TFLite 1 thread, the default op resolver (XNNPACK for float), medians of
5-7 invokes; MACs and elements as ``node_work`` counts them. ``make bench`` prints each bench
model's estimate beside its measured time, so drift shows.

- float32: MobileNetV2 224 (300.8 M MACs, 0.72 M elements) in 7,208 us and EfficientNet-B0 224
  (385.8 M MACs, 38.4 M elements) in 14,970 us give 42,400 MACs/us and 6,550 elements/us:
  ``FLOAT_MACS_PER_US = 42_000``, ``ELEMENTS_PER_US = 6_800`` (a float32 ADD of two 2^20-element
  tensors alone: 6,800). mobilenet_like 64x64: estimated 227 us, measured 165 us. A single large
  CONV_2D (3x3, 56x56x64 -> 64) runs at 66,800 MACs/us: whole models do not reach one op's best.
- int8: MobileNetV2 in 62,760 us and EfficientNet-B0 in 173,004 us give 4,930 MACs/us and 406
  elements/us: ``QUANT_MACS_PER_US = 4_900``, ``QUANT_ELEMENTS_PER_US = 400`` (an int8 ADD alone:
  324 elements/us; its rescaling runs scalar on x86). mobilenet_like 64x64: estimated 2,075 us,
  measured 2,935 us. The single large int8 CONV_2D runs at 35,200 MACs/us: TFLite 2.14's int8
  path on these models (per-channel filters, small channel counts, depthwise) is far from it.
  uint8 MobileNetV2 takes 111,604 us; the int8 rates are used for both (uint8 errs towards CPU).
- Data movement (``MOVES``: RESHAPE, CONCATENATION, MAX_POOL_2D, ...) counts its elements at the
  float rate whatever the type: an int8 copy is no slower than a float one.
- ``LOCAL_BURST_INVOKE_US = 49``: bench/results.md, shared-memory burst on a 1-op [2,3] model,
  median overhead over hal in-process 48.6 us (24-37 us in later runs; through the delegate,
  a 1-op ADD model costs TFLite + nnhal 45.4 us vs TFLite's 0.7 us, one node's dispatch included).
- ``TURN_US = 30``: added to each invoke when the graph has several partition candidates: their
  partitions take turns, and a burst the service did not just serve is blocked, not polling
  (service.local_burst._LastServed), so each invoke pays a thread wake-up. Through the delegate,
  1 to 4 one-run-of-ADDs partitions split by COS cost 56-60, 134-140, 206-216, 228-322 us per
  invoke: 75-80 us for each partition after the first, 49 + 30 rounded.
- ``DISPATCH_US_PER_NODE = 3``: hal in-process on chains of 1, 11 and 41 tiny operations
  ([2,3] tensors; best of 15 x 200): each operation costs 2.96-3.23 us on the numba and
  reference backends (4.7 us for int8 on reference); onnxruntime runs a chain of float32
  operations in one session call at 0.43 us each, so 3 us errs towards the CPU for float.
- ``LOCAL_BURST_US_PER_BYTE = 4.7e-5``: bench/results.md, the same burst on a 224x224x3 float32
  ADD-of-a-constant (602,112 bytes in, 602,112 out): overhead 105.0 us, 56.4 us above the 1-op
  figure, over 1,204,224 bytes. A numpy copy of 1 MiB here: 41-55 us, 3.9e-5..5.3e-5 us/byte.
- ``GRPC_INVOKE_US = 1284`` and ``GRPC_US_PER_BYTE = 9.1e-4``: bench/results.md, gRPC unary
  Execute (a TCP service, or ``local_burst=False``): 1284.1 us overhead on the 1-op model, 2375.5
  on the 224x224x3 one (1091 us more for 1,204,224 bytes).

How the delegate uses it (delegate.partition, ``partitioning``): by default ("cost") a graph the
service supports whole runs on it whole, since that is what loading the delegate asks for and
there is no partition boundary to pay for; when only part of a graph is supported, a partition
is delegated only if its estimate saves time, largest saving first (TFLite's largest-first rule
is what issues 66677, 43541 and 28283 report as slower than no delegation). "cost_strict" applies
the rule to a whole graph too; "largest" is TFLite's rule. ``nnhal report`` prints every
candidate's estimate and the decision in every mode.

On this machine the service's stated figures (float32 1.06, int8 0.50, uint8 0.36 with the default
backends) make the rule keep a float partition on the CPU (no faster, and it pays the invoke)
and delegate an int8 one once its CPU estimate C outweighs the invoke and dispatch: 0.5 C >
49 (79 when partitions take turns) + 3 us per node + transfer, i.e. C > about 100 (160) us +
6 us per node.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from delegate.tfl.graph import TfLiteGraph, TfLiteNode, TfLiteTensor
from delegate.tfl.schema import TENSOR_DTYPE, BuiltinOperator, TensorType
from hal.types import OperandType

FLOAT_MACS_PER_US = 42_000.0
QUANT_MACS_PER_US = 4_900.0
ELEMENTS_PER_US = 6_800.0
QUANT_ELEMENTS_PER_US = 400.0
LOCAL_BURST_INVOKE_US = 49.0
TURN_US = 30.0
DISPATCH_US_PER_NODE = 3.0
LOCAL_BURST_US_PER_BYTE = 4.7e-5
GRPC_INVOKE_US = 1284.0
GRPC_US_PER_BYTE = 9.1e-4

#: TFLite tensor type -> the NNAPI operand type whose PerformanceInfo applies (quantized 8-bit
#: tensors are QUANT8_ASYMM(_SIGNED); an unquantized INT8 maps nowhere and gets exec_time 1.0).
_OPERAND_TYPE = {
    TensorType.FLOAT32: OperandType.TENSOR_FLOAT32,
    TensorType.FLOAT16: OperandType.TENSOR_FLOAT16,
    TensorType.INT32: OperandType.TENSOR_INT32,
    TensorType.BOOL: OperandType.TENSOR_BOOL8,
    TensorType.UINT8: OperandType.TENSOR_QUANT8_ASYMM,
    TensorType.INT8: OperandType.TENSOR_QUANT8_ASYMM_SIGNED,
    TensorType.INT16: OperandType.TENSOR_QUANT16_SYMM,
}
_FLOAT_TYPES = (TensorType.FLOAT32, TensorType.FLOAT16)
_QUANT8_TYPES = (TensorType.INT8, TensorType.UINT8)

#: Operations that move or select data without arithmetic on it: elements at the float rate.
MOVES = frozenset(getattr(BuiltinOperator, name) for name in (
    "RESHAPE", "SQUEEZE", "EXPAND_DIMS", "CONCATENATION", "PACK", "UNPACK", "SPLIT", "SPLIT_V", "SLICE",
    "STRIDED_SLICE", "GATHER", "GATHER_ND", "TRANSPOSE", "PAD", "PADV2", "MIRROR_PAD", "SPACE_TO_DEPTH",
    "DEPTH_TO_SPACE", "SPACE_TO_BATCH_ND", "BATCH_TO_SPACE_ND", "MAX_POOL_2D", "TILE", "BROADCAST_TO",
    "REVERSE_V2", "SHAPE"))


def _elements(t: TfLiteTensor) -> int:
    return math.prod(max(d, 1) for d in t.shape)


def _nbytes(t: TfLiteTensor) -> int:
    dtype = TENSOR_DTYPE.get(t.type)
    return _elements(t) * (dtype.itemsize if dtype is not None else 4)


def _tensor(graph: TfLiteGraph, k: int) -> TfLiteTensor | None:
    return graph.tensors[k] if 0 <= k < len(graph.tensors) else None


def node_work(graph: TfLiteGraph, node: TfLiteNode) -> tuple[str, int]:
    """("macs", n) for the matrix-multiply family, else ("elements", n).

    - CONV_2D: filter [OC, KH, KW, IC/groups]: MACs = output elements x KH x KW x (IC/groups).
    - DEPTHWISE_CONV_2D: filter [1, KH, KW, OC]: MACs = output elements x KH x KW.
    - FULLY_CONNECTED: weights [units, K]: MACs = output elements x K.
    - BATCH_MATMUL: MACs = output elements x K, K the lhs's last dimension (second last with adj_x).
    - TRANSPOSE_CONV: inputs (output_shape, filter [OC, KH, KW, IC], input): every input element is
      scattered into KH x KW x OC outputs: MACs = input elements x KH x KW x OC.
    - Anything else: elements of its outputs and inputs; a constant input counts at most as many
      elements as the outputs (a GATHER's table is not read whole). A shape this cannot read (a
      missing tensor) counts as elements.
    """
    code = node.builtin_code if node.custom_code is None else None
    ins = [_tensor(graph, k) if k >= 0 else None for k in node.inputs]
    outs = [t for t in (_tensor(graph, k) for k in node.outputs) if t is not None]
    out_elements = sum(_elements(t) for t in outs)

    def shape(k: int) -> tuple[int, ...]:
        t = ins[k] if k < len(ins) else None
        return tuple(t.shape) if t is not None else ()

    if code == BuiltinOperator.CONV_2D and len(shape(1)) == 4:
        _, kh, kw, ic = shape(1)
        return "macs", out_elements * kh * kw * ic
    if code == BuiltinOperator.DEPTHWISE_CONV_2D and len(shape(1)) == 4:
        _, kh, kw, _ = shape(1)
        return "macs", out_elements * kh * kw
    if code == BuiltinOperator.FULLY_CONNECTED and len(shape(1)) == 2:
        return "macs", out_elements * shape(1)[1]
    if code == BuiltinOperator.BATCH_MATMUL and len(shape(0)) >= 2:
        lhs = shape(0)
        return "macs", out_elements * (lhs[-2] if node.options.get("adj_x") else lhs[-1])
    if code == BuiltinOperator.TRANSPOSE_CONV and len(shape(1)) == 4 and len(ins) > 2 and ins[2] is not None:
        oc, kh, kw, _ = shape(1)
        return "macs", _elements(ins[2]) * kh * kw * oc
    touched = out_elements
    for t in ins:
        if t is not None:
            touched += min(_elements(t), max(out_elements, 1)) if t.is_constant else _elements(t)
    return "elements", touched


def _node_type(graph: TfLiteGraph, node: TfLiteNode) -> int | None:
    """The TFLite type that decides a node's speed: its first non-constant input's, else its
    first output's."""
    for k in (*node.inputs, *node.outputs):
        t = _tensor(graph, k) if k >= 0 else None
        if t is not None and not t.is_constant:
            return t.type
    return None


@dataclass
class PartitionEstimate:
    """One partition candidate: what it would cost on each side, and what was decided."""

    nodes: list[int]
    cpu_us: float
    compute_us: float       # its nodes on the service: relative speeds applied, plus dispatch
    overhead_us: float      # one invoke (and a wake-up when partitions take turns)
    transfer_bytes: int     # non-constant inputs + outputs of the partition
    transfer_us: float
    nnhal_us: float         # compute + overhead + transfer
    saving_us: float        # cpu_us - nnhal_us (negative: slower on nnhal)
    delegated: bool = False
    partition: int | None = None  # index in the plan's partitions when delegated
    reason: str = ""


@dataclass(frozen=True)
class CostModel:
    """The device's relative speeds and the per-invoke constants (see the module docstring)."""

    #: NNAPI operand type -> exec_time (the device's time / the CPU's); missing types: 1.0.
    exec_time: tuple[tuple[int, float], ...] = ()
    relaxed_exec_time: float = 1.0
    allow_fp16: bool = False
    invoke_us: float = LOCAL_BURST_INVOKE_US
    turn_us: float = TURN_US
    us_per_byte: float = LOCAL_BURST_US_PER_BYTE
    dispatch_us: float = DISPATCH_US_PER_NODE
    float_macs_per_us: float = FLOAT_MACS_PER_US
    quant_macs_per_us: float = QUANT_MACS_PER_US
    elements_per_us: float = ELEMENTS_PER_US
    quant_elements_per_us: float = QUANT_ELEMENTS_PER_US
    _speeds: dict = field(default=None, init=False, repr=False, compare=False, hash=False)

    def __post_init__(self):
        object.__setattr__(self, "_speeds", dict(self.exec_time))

    @classmethod
    def uniform(cls, relative_speed: float, **kw) -> "CostModel":
        """Every operand type (and relaxed float) at ``relative_speed``."""
        return cls(tuple((int(t), relative_speed) for t in OperandType if t != OperandType.SUBGRAPH),
                   relaxed_exec_time=relative_speed, **kw)

    @classmethod
    def from_capabilities(cls, caps, *, local_burst: bool = True, allow_fp16: bool = False) -> "CostModel":
        """From the service's getCapabilities answer (service.proto Capabilities). ``local_burst``:
        invokes go through the shared-memory burst (a unix-socket service), else gRPC's costs."""
        speeds = tuple((int(p.type), float(p.info.exec_time)) for p in caps.operand_performance
                       if p.info.exec_time > 0)
        relaxed = caps.relaxed_float32_to_float16_performance_tensor.exec_time
        return cls(speeds, relaxed_exec_time=float(relaxed) if relaxed > 0 else 1.0, allow_fp16=allow_fp16,
                   invoke_us=LOCAL_BURST_INVOKE_US if local_burst else GRPC_INVOKE_US,
                   us_per_byte=LOCAL_BURST_US_PER_BYTE if local_burst else GRPC_US_PER_BYTE)

    def speed(self, tflite_type: int | None) -> float:
        """exec_time for a node whose data is of ``tflite_type``."""
        if tflite_type == TensorType.FLOAT32 and self.allow_fp16:
            return self.relaxed_exec_time
        otype = _OPERAND_TYPE.get(tflite_type)
        return self._speeds.get(int(otype), 1.0) if otype is not None else 1.0

    def node_cpu_us(self, graph: TfLiteGraph, node: TfLiteNode) -> float:
        kind, work = node_work(graph, node)
        ttype = _node_type(graph, node)
        if kind == "elements":
            arithmetic = node.custom_code is not None or node.builtin_code not in MOVES
            quant = arithmetic and ttype in _QUANT8_TYPES
            return work / (self.quant_elements_per_us if quant else self.elements_per_us)
        return work / (self.float_macs_per_us if ttype in _FLOAT_TYPES else self.quant_macs_per_us)

    def estimate(self, graph: TfLiteGraph, nodes: list[int], taking_turns: bool = False) -> PartitionEstimate:
        """``taking_turns``: other partitions run between two invokes of this one (``turn_us``)."""
        cpu = compute = 0.0
        for k in nodes:
            node = graph.nodes[k]
            us = self.node_cpu_us(graph, node)
            cpu += us
            compute += us * self.speed(_node_type(graph, node)) + self.dispatch_us
        nbytes = sum(_nbytes(graph.tensors[t]) for t in boundary_tensors(graph, nodes))
        transfer = nbytes * self.us_per_byte
        invoke = self.invoke_us + (self.turn_us if taking_turns else 0.0)
        nnhal = compute + invoke + transfer
        return PartitionEstimate(list(nodes), cpu, compute, invoke, nbytes, transfer, nnhal, cpu - nnhal)


def boundary_tensors(graph: TfLiteGraph, nodes: list[int]) -> list[int]:
    """The tensors crossing the partition's boundary on every invoke: non-constant tensors its
    nodes read that no node of it writes, and tensors it writes that a node outside it reads or
    that are outputs of the graph."""
    inside = set(nodes)
    written = {t for k in nodes for t in graph.nodes[k].outputs if t >= 0}
    read_outside = {t for n in graph.nodes if n.index not in inside for t in n.inputs if t >= 0}
    ins = {t for k in nodes for t in graph.nodes[k].inputs
           if t >= 0 and t not in written and not graph.tensors[t].is_constant}
    outs = {t for t in written if t in read_outside or t in graph.outputs}
    return sorted(ins | outs)
