"""The TFLite runtime the delegate runs in, where its reference kernels' arithmetic depends on it.

nnhal's quantized results equal the reference kernels (BUILTIN_REF) of the runtime hosting the
delegate, and one of those changed between releases. Measured by running the same random models in
tflite-runtime 2.14 and LiteRT 2.3 (tests/delegate/test_fully_connected_runtimes.py keeps the check):

- FULLY_CONNECTED on uint8/int8 (per-tensor and per-channel weights): LiteRT >= 1.3 requantizes its
  int32 accumulators in double (extensions/litert_compat.py); tflite-runtime and
  earlier LiteRT releases in NNAPI's fixed point (QuantizeMultiplier, then two roundings).
- CONV_2D, DEPTHWISE_CONV_2D, MEAN, SOFTMAX, LOGISTIC, ADD, MUL and BATCH_MATMUL give the same
  values in both (their optimized kernels differ, which BUILTIN_REF does not use).

The runtime is delegate.runtime's choice (LiteRT first; $NNHAL_TFLITE_RUNTIME where both are
installed), the one nnhal's tools and tests build Interpreters with. Without any TFLite runtime
(converting a model for another process), the mapping keeps NNAPI's own operations.
"""
from __future__ import annotations

import functools
import re

#: (package, version) of a TFLite runtime: ("ai_edge_litert", (2, 3, 0)).
Runtime = tuple[str, tuple[int, ...]]

#: A runtime whose reference kernels requantize in NNAPI's fixed point everywhere.
TFLITE_RUNTIME_2_14: Runtime = ("tflite_runtime", (2, 14, 0))

#: The first LiteRT release whose reference FULLY_CONNECTED requantizes in double (LiteRT commit
#: 921360770, April 2025; tag v1.3.0 is the first to contain it).
LITERT_DOUBLE_REQUANT_FULLY_CONNECTED = (1, 3)


def parse_version(text: str) -> tuple[int, ...]:
    """"2.3.0" -> (2, 3, 0); a suffix after the numbers ("1.3.0rc1", "2.4.0.dev20250101") is ignored."""
    m = re.match(r"\d+(?:\.\d+)*", text.strip())
    return tuple(int(p) for p in m.group(0).split(".")) if m else ()


@functools.cache
def host_runtime() -> Runtime | None:
    """(package, version) of delegate.runtime's TFLite runtime, or None where none is installed."""
    try:
        # On first use, not at import: delegate.runtime loads the runtime's Interpreter module, which
        # `import delegate.mapping` does not need.
        from delegate import runtime
    except ImportError:
        return None
    package = __import__(runtime.RUNTIME)
    return runtime.RUNTIME, parse_version(getattr(package, "__version__", ""))


def requantizes_fully_connected_in_double(runtime: Runtime | None) -> bool:
    """Whether ``runtime``'s reference FULLY_CONNECTED requantizes 8-bit outputs in double (None:
    no TFLite runtime, NNAPI's arithmetic)."""
    if runtime is None:
        return False
    package, version = runtime
    return package == "ai_edge_litert" and version >= LITERT_DOUBLE_REQUANT_FULLY_CONNECTED
