"""ctypes view of TFLite's C API (tensorflow/lite/core/c/common.h, x86-64/LP64).

Layouts match tflite-runtime 2.14 and ai-edge-litert 2.3 (see
../shared/notes/ctypes-delegate.md); sizes and offsets are asserted at import so
a runtime with another ABI fails loudly instead of corrupting memory.
"""
from __future__ import annotations

import ctypes as C

import numpy as np

kTfLiteOk, kTfLiteError = 0, 1
kTfLiteBuiltinCustom = 32
kTfLiteBuiltinDelegate = 51
kTfLiteDelegateFlagsNone = 0
kTfLiteDelegateFlagsAllowDynamicTensors = 1
kTfLiteDelegateFlagsRequirePropagatedShapes = 2  # TFLite prepares the original nodes first
kTfLiteMmapRo = 1  # allocation type of constant tensors
kTfLiteDynamic = 4  # allocation type of tensors sized at run time (data-dependent shapes)
kTfLiteAffineQuantization = 1

#: TfLiteType (C API) -> numpy dtype. Note: these codes differ from the schema's TensorType.
TFLITE_TYPE_DTYPE = {1: np.float32, 2: np.int32, 3: np.uint8, 4: np.int64, 6: np.bool_, 7: np.int16,
                     9: np.int8, 10: np.float16, 11: np.float64}
#: TfLiteType (C API) -> schema TensorType.
TFLITE_TYPE_TO_SCHEMA = {1: 0, 10: 1, 2: 2, 3: 3, 4: 4, 5: 5, 6: 6, 7: 7, 8: 8, 9: 9, 11: 10}


class TfLiteIntArrayHead(C.Structure):
    _fields_ = [("size", C.c_int)]


class TfLiteQuantizationParams(C.Structure):
    _fields_ = [("scale", C.c_float), ("zero_point", C.c_int32)]


class TfLiteQuantization(C.Structure):
    _fields_ = [("type", C.c_int), ("params", C.c_void_p)]


class TfLiteAffineQuantization(C.Structure):
    _fields_ = [("scale", C.c_void_p), ("zero_point", C.c_void_p), ("quantized_dimension", C.c_int32)]


class TfLiteTensor(C.Structure):
    _fields_ = [
        ("type", C.c_int), ("data", C.c_void_p), ("dims", C.c_void_p),
        ("params", TfLiteQuantizationParams), ("allocation_type", C.c_int), ("bytes", C.c_size_t),
        ("allocation", C.c_void_p), ("name", C.c_char_p), ("delegate", C.c_void_p),
        ("buffer_handle", C.c_int), ("data_is_stale", C.c_bool), ("is_variable", C.c_bool),
        ("quantization", TfLiteQuantization), ("sparsity", C.c_void_p), ("dims_signature", C.c_void_p),
    ]


class TfLiteNode(C.Structure):
    _fields_ = [
        ("inputs", C.c_void_p), ("outputs", C.c_void_p), ("intermediates", C.c_void_p),
        ("temporaries", C.c_void_p), ("user_data", C.c_void_p), ("builtin_data", C.c_void_p),
        ("custom_initial_data", C.c_void_p), ("custom_initial_data_size", C.c_int),
        ("delegate", C.c_void_p), ("might_have_side_effect", C.c_bool),
    ]


InitFn = C.CFUNCTYPE(C.c_void_p, C.c_void_p, C.c_void_p, C.c_size_t)
FreeFn = C.CFUNCTYPE(None, C.c_void_p, C.c_void_p)
NodeFn = C.CFUNCTYPE(C.c_int, C.c_void_p, C.c_void_p)


class TfLiteRegistration(C.Structure):
    _fields_ = [
        ("init", InitFn), ("free", FreeFn), ("prepare", NodeFn), ("invoke", NodeFn),
        ("profiling_string", C.c_void_p), ("builtin_code", C.c_int32), ("custom_name", C.c_char_p),
        ("version", C.c_int), ("registration_external", C.c_void_p), ("async_kernel", C.c_void_p),
        ("inplace_operator", C.c_uint64),
    ]


class TfLiteDelegateParams(C.Structure):
    _fields_ = [("delegate", C.c_void_p), ("nodes_to_replace", C.c_void_p),
                ("input_tensors", C.c_void_p), ("output_tensors", C.c_void_p)]


GetExecutionPlanFn = C.CFUNCTYPE(C.c_int, C.c_void_p, C.POINTER(C.c_void_p))
GetNodeAndRegFn = C.CFUNCTYPE(C.c_int, C.c_void_p, C.c_int, C.POINTER(C.c_void_p), C.POINTER(C.c_void_p))
ReplaceFn = C.CFUNCTYPE(C.c_int, C.c_void_p, TfLiteRegistration, C.c_void_p, C.c_void_p)  # by value
ReportErrorFn = C.c_void_p  # variadic: not callable through ctypes safely; unused


class TfLiteContext(C.Structure):
    _fields_ = [
        ("tensors_size", C.c_size_t), ("GetExecutionPlan", GetExecutionPlanFn), ("tensors", C.c_void_p),
        ("impl_", C.c_void_p), ("ResizeTensor", C.c_void_p), ("ReportError", ReportErrorFn),
        ("AddTensors", C.c_void_p), ("GetNodeAndRegistration", GetNodeAndRegFn),
        ("ReplaceNodeSubsetsWithDelegateKernels", ReplaceFn), ("recommended_num_threads", C.c_int),
        ("GetExternalContext", C.c_void_p), ("SetExternalContext", C.c_void_p),
        ("allow_fp32_relax_to_fp16", C.c_bool), ("profiler", C.c_void_p), ("AllocatePersistentBuffer", C.c_void_p),
        ("AllocateBufferForEval", C.c_void_p), ("RequestScratchBufferInArena", C.c_void_p),
        ("GetScratchBuffer", C.c_void_p), ("ResizeTensorExplicit", C.c_void_p),
        ("PreviewDelegatePartitioning", C.c_void_p), ("GetTensor", C.c_void_p), ("GetEvalTensor", C.c_void_p),
        ("GetModelMetadata", C.c_void_p),
        # TFLite >= 2.13, usable while a delegate prepares (delegate.subgraphs: IF/WHILE subgraphs)
        ("AcquireSubgraphContext", C.c_void_p), ("ReleaseSubgraphContext", C.c_void_p),
    ]


DelegatePrepareFn = C.CFUNCTYPE(C.c_int, C.c_void_p, C.c_void_p)


class TfLiteDelegate(C.Structure):
    _fields_ = [("data_", C.c_void_p), ("Prepare", DelegatePrepareFn), ("CopyFromBufferHandle", C.c_void_p),
                ("CopyToBufferHandle", C.c_void_p), ("FreeBufferHandle", C.c_void_p), ("flags", C.c_int64),
                ("opaque_delegate_builder", C.c_void_p)]


def _check_layout() -> None:
    checks = [
        (C.sizeof(TfLiteTensor), 112), (TfLiteTensor.data.offset, 8), (TfLiteTensor.dims.offset, 16),
        (TfLiteTensor.params.offset, 24), (TfLiteTensor.allocation_type.offset, 32),
        (TfLiteTensor.bytes.offset, 40), (TfLiteTensor.name.offset, 56),
        (TfLiteTensor.quantization.offset, 80), (TfLiteTensor.sparsity.offset, 96),
        (TfLiteTensor.dims_signature.offset, 104),
        (TfLiteNode.user_data.offset, 32), (TfLiteNode.builtin_data.offset, 40),
        (C.sizeof(TfLiteRegistration), 88), (TfLiteRegistration.builtin_code.offset, 40),
        (TfLiteRegistration.custom_name.offset, 48), (C.sizeof(TfLiteDelegate), 56),
        (TfLiteDelegate.flags.offset, 40), (TfLiteContext.GetExecutionPlan.offset, 8),
        (TfLiteContext.tensors.offset, 16), (TfLiteContext.GetNodeAndRegistration.offset, 56),
        (TfLiteContext.ReplaceNodeSubsetsWithDelegateKernels.offset, 64),
        (TfLiteContext.AcquireSubgraphContext.offset, 184), (TfLiteContext.ReleaseSubgraphContext.offset, 192),
        (C.sizeof(TfLiteDelegateParams), 32), (TfLiteAffineQuantization.quantized_dimension.offset, 16),
    ]
    for got, want in checks:
        if got != want:
            raise ImportError(f"TFLite C API layout mismatch ({got} != {want}): unsupported platform/runtime")


_check_layout()


def int_array(addr: int | None) -> list[int]:
    """TfLiteIntArray* -> list (copied: TFLite may reallocate the array later)."""
    if not addr:
        return []
    n = C.c_int.from_address(addr).value
    return list((C.c_int * n).from_address(addr + 4)) if n > 0 else []


def float_array(addr: int | None) -> list[float]:
    if not addr:
        return []
    n = C.c_int.from_address(addr).value
    return list((C.c_float * n).from_address(addr + 4)) if n > 0 else []


def make_int_array(values) -> C.Array:
    values = list(values)
    return (C.c_int * (len(values) + 1))(len(values), *values)


#: TfLiteContext::ResizeTensor(context, tensor, new_size): TFLite takes ownership of new_size.
ResizeTensorFn = C.CFUNCTYPE(C.c_int, C.c_void_p, C.c_void_p, C.c_void_p)
_libc = C.CDLL(None)
_libc.malloc.restype, _libc.malloc.argtypes = C.c_void_p, [C.c_size_t]


def resize_tensor(ctx_p: int, index: int, dims) -> None:
    """Give tensor ``index`` new dims through the context (a kernel's Prepare may resize its
    outputs; TFLite reallocates them). TFLite frees the TfLiteIntArray it is handed (free(), as
    TfLiteIntArrayFree does), so it is malloc'ed here, not owned by Python."""
    dims = [int(d) for d in dims]
    ctx = TfLiteContext.from_address(ctx_p)
    if not ctx.ResizeTensor:
        raise RuntimeError("TfLiteContext.ResizeTensor is not set")
    addr = _libc.malloc(4 * (len(dims) + 1))
    if not addr:
        raise MemoryError("malloc failed for a TfLiteIntArray")
    (C.c_int * (len(dims) + 1)).from_address(addr)[:] = [len(dims), *dims]
    status = ResizeTensorFn(ctx.ResizeTensor)(ctx_p, ctx.tensors + index * C.sizeof(TfLiteTensor), addr)
    if status != kTfLiteOk:
        raise RuntimeError(f"TFLite could not resize tensor {index} to {dims}")


def tensor_at(ctx: TfLiteContext, index: int) -> TfLiteTensor:
    return TfLiteTensor.from_address(ctx.tensors + index * C.sizeof(TfLiteTensor))


def tensor_array(t: TfLiteTensor) -> np.ndarray:
    """Zero-copy numpy view of a tensor's buffer (valid until TFLite reallocates it)."""
    dtype = TFLITE_TYPE_DTYPE[t.type]
    shape = tuple(int_array(t.dims))
    if not t.data or t.bytes == 0:
        return np.empty(shape, dtype)
    buf = (C.c_char * t.bytes).from_address(t.data)
    return np.frombuffer(buf, dtype=dtype).reshape(shape)


class TfLiteDimensionMetadata(C.Structure):
    _fields_ = [("format", C.c_int), ("dense_size", C.c_int), ("array_segments", C.c_void_p),
                ("array_indices", C.c_void_p)]


class TfLiteSparsity(C.Structure):
    _fields_ = [("traversal_order", C.c_void_p), ("block_map", C.c_void_p), ("dim_metadata", C.c_void_p),
                ("dim_metadata_size", C.c_int)]


assert C.sizeof(TfLiteDimensionMetadata) == 24 and TfLiteSparsity.dim_metadata_size.offset == 24


def read_sparsity(addr: int):
    """TfLiteSparsity* -> delegate.tfl.graph.Sparsity (same levels as the flatbuffer's)."""
    from delegate.tfl.graph import DimensionMetadata, Sparsity
    sp = TfLiteSparsity.from_address(addr)
    dims = []
    for i in range(max(sp.dim_metadata_size, 0)):
        d = TfLiteDimensionMetadata.from_address(sp.dim_metadata + i * C.sizeof(TfLiteDimensionMetadata))
        dims.append(DimensionMetadata(d.format, d.dense_size, tuple(int_array(d.array_segments)),
                                      tuple(int_array(d.array_indices))))
    return Sparsity(tuple(int_array(sp.traversal_order)), tuple(int_array(sp.block_map)), tuple(dims))
