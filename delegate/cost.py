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
  rate depends on the node's type (float or 8-bit) and, for elements, on whether it computes,
  and on the runtime the delegate runs in (``CPU_RATES[delegate.runtime.RUNTIME]``): LiteRT's
  8-bit path is about 20x tflite-runtime 2.14's, so the same partition is worth delegating under
  one and not the other.
- ``compute_us``: each node's time on the CPU exec_time is relative to (``ANCHOR``: LiteRT 2.3, 1
  thread, whatever the runtime in use) times the device's ``exec_time`` for the node's operand
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

Constants (this machine: x86_64, 2 cores, Python 3.11). The CPU rates (``CPU_RATES``, one set
per runtime) are fitted on whole models, the ones whose ratios give the service's stated speeds
(hal/performance.py): 1 thread, the runtime's default op resolver, MACs and elements as
``node_work`` counts them, two models solving for two rates. ``make bench`` prints each bench
model's estimate beside each runtime's measured time, so drift shows.

- LiteRT 2.3 (numpy 2.4; XNNPACK runs float and 8-bit), measured 2026-11-27 on a loaded machine
  (load average 1-3): medians of 7 runs, each 7-11 rounds of 3 invokes interleaved with
  tflite-runtime's. float32: MobileNetV2 224 (300.8 M MACs, 0.72 M elements) in 7,921 us and
  EfficientNet-B0 224 (385.8 M MACs, 38.4 M elements) in 13,574 us give 38,300 MACs/us and 11,000
  elements/us: 38,000 and 11,000 (a float32 ADD of two 2^20-element tensors alone: 9,200). int8:
  3,915 and 6,442 us give 77,400 MACs/us and 26,400 elements/us: 77,000 and 26,000 (an int8 ADD
  alone: 20,200); int8 runs twice as fast as float. uint8 (per-tensor) takes 7,212 and 11,428 us,
  1.8x the int8 estimate; the int8 rates are used for both: the service's uint8 exec_time is
  measured against LiteRT's uint8 time, so only the invoke costs weigh more than they should
  (towards the CPU).
- tflite-runtime 2.14 (numpy 1.26; XNNPACK for float only), measured 2026-11-26, medians of 5-7
  invokes. float32: MobileNetV2 224 in 7,208 us and EfficientNet-B0 224 in 14,970 us give 42,400
  MACs/us and 6,550 elements/us: 42,000 and 6,800 (a float32 ADD of two 2^20-element tensors
  alone: 6,800). A single large CONV_2D (3x3, 56x56x64 -> 64) runs at 66,800 MACs/us: whole
  models do not reach one op's best. int8: MobileNetV2 in 62,760 us and EfficientNet-B0 in
  173,004 us give 4,930 MACs/us and 406 elements/us: 4,900 and 400 (an int8 ADD alone: 324
  elements/us; its rescaling runs scalar on x86). The single large int8 CONV_2D runs at 35,200
  MACs/us: tflite-runtime's int8 path on these models (per-channel filters, small channel counts,
  depthwise) is far from it. uint8 MobileNetV2 takes 111,604 us; the int8 rates are used for
  both. Beside LiteRT on 2026-11-27 (loaded, as above): float32 8,441 and 13,388 us, int8 95,192
  and 166,625 us, uint8 109,555 and 230,840 us.
- Data movement (``MOVES``: RESHAPE, CONCATENATION, MAX_POOL_2D, ...) counts its elements at the
  float rate whatever the type: an int8 copy is no slower than a float one (under LiteRT, whose
  8-bit arithmetic outruns its float, this errs high for 8-bit copies).
- ``LOCAL_BURST_INVOKE_US = 26``: through the delegate in LiteRT 2.3, a 1-op ADD model (tests'
  add_runs(1, 1)) costs 27-31 us p50 over TFLite's own 0.5 us with client and service free to run
  on either of 2 loaded cores (2026-11-27; 15-16 us pinned to different cores, 27 us pinned to
  one), less one node's dispatch (3 us, below).
- ``TURN_US = 20``: added to each invoke when the graph has several partition candidates: their
  partitions take turns, and a burst the service did not just serve is blocked, not polling
  (service.local_burst_server._LastServed), so each invoke pays a thread wake-up. Through the
  delegate, 1 to 4 one-run-of-ADDs partitions split by COS (1, 3, 6, 10 ADDs) cost 16-31, 96-108,
  143-170, 183-195 us per invoke (same day, same cores): 55 us for each partition after the
  first, of which 9 us dispatch its 3 more ADDs and 26 us the invoke.
- ``DISPATCH_US_PER_NODE = 0.3``: hal in-process, the bound path the service runs, on chains of
  1, 11 and 41 ADDs of [2, 3] tensors (best of 15 x 200, 2026-11-28): each further operation
  costs 0.25 us in an onnxruntime partition (float32: one session call) and 0.02 us on the numba
  backend (int8 and uint8: its steps run through one native loop, native_chain.py); 1.4 us where
  steps stay Python calls (float32 on numba, the reference backend), whose stated exec_time is
  so high that their dispatch hardly moves a decision. The figure was 3 us before the bound
  path and the native loop.
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

On this machine the service's stated figures (float32 1.19, int8 0.8, uint8 0.4 with the default
backends, relative to LiteRT) make the rule keep float partitions of a partly supported graph on
LiteRT's CPU (the service is slower there, and pays the invoke) and delegate 8-bit ones that are
large enough: an int8 partition once 0.2 C > 26 us (46 when partitions take turns) + 3 us per
node + transfer, its CPU estimate C above about 130 (230) us + 15 us per node; uint8 once 0.6 C
does, C above about 43 (77) us + 5 us per node. Under tflite-runtime 2.14 the same figures
delegate an 8-bit partition far sooner: for convolution work the service's time is 0.8 x C x
4,900 / 77,000 = 0.051 C (uint8: 0.026 C), so C > about 27 (48) us + 3.2 us per node; float
partitions stay on its CPU too.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from delegate.tfl.graph import TfLiteGraph, TfLiteNode, TfLiteTensor
from delegate.tfl.schema import TENSOR_DTYPE, BuiltinOperator, TensorType
from hal.types import OperandType


@dataclass(frozen=True)
class CpuRates:
    """A CPU runtime's speed on whole models with 1 thread (fitted: the module docstring)."""

    float_macs_per_us: float
    quant_macs_per_us: float
    elements_per_us: float
    quant_elements_per_us: float


#: delegate.runtime.RUNTIME -> the rates of its CPU path (its default op resolver, 1 thread).
CPU_RATES = {
    "ai_edge_litert": CpuRates(float_macs_per_us=38_000.0, quant_macs_per_us=77_000.0,
                               elements_per_us=11_000.0, quant_elements_per_us=26_000.0),
    "tflite_runtime": CpuRates(float_macs_per_us=42_000.0, quant_macs_per_us=4_900.0,
                               elements_per_us=6_800.0, quant_elements_per_us=400.0),
}
#: The CPU the service's exec_time is relative to (hal.performance): LiteRT 2.3, 1 thread.
ANCHOR = "ai_edge_litert"


def runtime_rates() -> CpuRates:
    """The rates of the runtime this process runs TFLite in (delegate.runtime), the CPU that a
    partition kept off the service runs on; the anchor's where no runtime can be imported."""
    try:
        from delegate.runtime import RUNTIME
    except ImportError:
        return CPU_RATES[ANCHOR]
    return CPU_RATES.get(RUNTIME, CPU_RATES[ANCHOR])


LOCAL_BURST_INVOKE_US = 26.0
TURN_US = 20.0
DISPATCH_US_PER_NODE = 0.3
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
    #: The CPU a partition kept off the service runs on: the runtime in use's rates.
    cpu: CpuRates = field(default_factory=runtime_rates)
    #: The CPU the service's exec_time is relative to: a node's time on the service is its time
    #: on this CPU times exec_time.
    anchor: CpuRates = CPU_RATES[ANCHOR]
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

    def node_cpu_us(self, graph: TfLiteGraph, node: TfLiteNode, rates: CpuRates | None = None) -> float:
        """The node's time on the CPU whose ``rates`` are given (default: the runtime in use's)."""
        rates = rates or self.cpu
        kind, work = node_work(graph, node)
        ttype = _node_type(graph, node)
        if kind == "elements":
            arithmetic = node.custom_code is not None or node.builtin_code not in MOVES
            quant = arithmetic and ttype in _QUANT8_TYPES
            return work / (rates.quant_elements_per_us if quant else rates.elements_per_us)
        return work / (rates.float_macs_per_us if ttype in _FLOAT_TYPES else rates.quant_macs_per_us)

    def estimate(self, graph: TfLiteGraph, nodes: list[int], taking_turns: bool = False) -> PartitionEstimate:
        """``taking_turns``: other partitions run between two invokes of this one (``turn_us``)."""
        cpu = compute = 0.0
        for k in nodes:
            node = graph.nodes[k]
            cpu += self.node_cpu_us(graph, node)
            anchor_us = self.node_cpu_us(graph, node, self.anchor)
            compute += anchor_us * self.speed(_node_type(graph, node)) + self.dispatch_us
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
