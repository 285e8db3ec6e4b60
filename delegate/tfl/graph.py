"""TFLite graph as plain dataclasses: what the mapping needs, whatever the source.

The reader fills these from a .tflite file; the delegate fills them from the
interpreter's TfLiteContext (ctypes). Mapping code only sees these.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class DimensionMetadata:
    """One level of TFLite's sparse format: DENSE (0) or SPARSE_CSR (1)."""

    format: int
    dense_size: int = 0
    segments: tuple[int, ...] = ()
    indices: tuple[int, ...] = ()


@dataclass(frozen=True)
class Sparsity:
    """TFLite SparsityParameters: the stored values are the non-zeros in this traversal."""

    traversal_order: tuple[int, ...]
    block_map: tuple[int, ...]
    dim_metadata: tuple[DimensionMetadata, ...]


@dataclass
class TfLiteTensor:
    index: int
    name: str
    type: int  # tflite TensorType
    shape: tuple[int, ...]
    shape_signature: tuple[int, ...] | None = None  # -1 = dynamic dimension
    scales: tuple[float, ...] = ()  # empty: not quantized
    zero_points: tuple[int, ...] = ()
    quantized_dimension: int = 0
    data: np.ndarray | None = None  # constant contents (shaped), None for activations
    is_variable: bool = False
    sparsity: Sparsity | None = None  # data then holds only the stored (non-zero) values, 1-D
    #: Live graph only: TFLite allocates it at run time (kTfLiteDynamic), its shape set by its producer
    #: as it runs (data-dependent: WHERE, UNIQUE, a RESHAPE to a computed shape...). ``shape`` is not it.
    runtime_shape: bool = False

    @property
    def sparse(self) -> bool:
        return self.sparsity is not None

    @property
    def is_constant(self) -> bool:
        return self.data is not None

    @property
    def is_quantized(self) -> bool:
        return bool(self.scales)

    @property
    def per_channel(self) -> bool:
        return len(self.scales) > 1

    @property
    def is_dynamic(self) -> bool:
        """A dimension may change (-1 in the signature: resize_tensor_input). ``shape`` is still the
        one TFLite uses until then (the file's, or the interpreter's current dims)."""
        return self.shape_signature is not None and any(d < 0 for d in self.shape_signature)


@dataclass
class TfLiteNode:
    index: int
    builtin_code: int  # tflite BuiltinOperator (CUSTOM = 32)
    inputs: tuple[int, ...]  # -1 = omitted optional input
    outputs: tuple[int, ...]
    options: dict[str, Any] = field(default_factory=dict)  # snake_case schema field names
    custom_code: str | None = None
    custom_options: bytes = b""
    version: int = 1
    #: Tensors a kernel reads only the quantization of (the integer LSTM's internal scales).
    intermediates: tuple[int, ...] = ()


@dataclass
class TfLiteGraph:
    tensors: list[TfLiteTensor]
    nodes: list[TfLiteNode]
    inputs: list[int]
    outputs: list[int]
    #: The model's subgraphs by TFLite subgraph index (IF and WHILE name them; 0 is the primary):
    #: a list from the reader, a loader reading them on first use in a delegate. None: unknown.
    subgraphs: Any = field(default=None, repr=False, compare=False)
    #: (address, read-only bytes) of the memory from the first constant's byte to the last one's end,
    #: where that is one readable range of the model's buffer (a delegate's snapshot): hashed in
    #: one call (delegate.delegation_record.weights_digest). None: not known.
    constant_bytes: Any = field(default=None, repr=False, compare=False)

    def subgraph(self, index: int) -> TfLiteGraph:
        """Subgraph ``index`` of the model (LookupError when there is none)."""
        if self.subgraphs is None:
            raise LookupError("the model's other subgraphs are not available here")
        if not isinstance(index, int) or index < 0:
            raise LookupError(f"no subgraph {index}")
        try:
            return self.subgraphs[index]
        except IndexError:
            raise LookupError(f"the model has no subgraph {index}") from None

    def consumers(self) -> dict[int, list[int]]:
        users: dict[int, list[int]] = {}
        for n in self.nodes:
            for t in n.inputs:
                if t >= 0:
                    users.setdefault(t, []).append(n.index)
        return users
