"""The TFLite Python runtime nnhal's tools and tests build Interpreters with.

LiteRT (``ai_edge_litert``, what `pip install` gives TFLite users today) first, else tflite-runtime
2.14 (numpy < 2, `make setup-tflite-runtime`); ``$NNHAL_TFLITE_RUNTIME`` (``ai_edge_litert`` or
``tflite_runtime``) names one where both are installed. Both have the same Python API. The
delegate itself works inside whichever Interpreter a user passes it to: the C structures it reads
have one layout in both (delegate/capi.py).
"""
from __future__ import annotations

import os

#: The runtimes nnhal knows, in the order it looks for them.
RUNTIMES = ("ai_edge_litert", "tflite_runtime")


def _choose() -> str:
    wanted = os.environ.get("NNHAL_TFLITE_RUNTIME", "").strip()
    if wanted and wanted not in RUNTIMES:
        raise ImportError(f"NNHAL_TFLITE_RUNTIME={wanted!r}: expected one of {', '.join(RUNTIMES)}")
    for name in (wanted,) if wanted else RUNTIMES:
        try:
            __import__(f"{name}.interpreter")
            return name
        except (ImportError, AttributeError):  # absent, or built for another numpy
            continue
    raise ImportError("no TFLite runtime: pip install ai-edge-litert (LiteRT, the default), or "
                      "tflite-runtime==2.14.0 with numpy<2" + (f" (NNHAL_TFLITE_RUNTIME={wanted})" if wanted else ""))


RUNTIME = _choose()
if RUNTIME == "ai_edge_litert":
    from ai_edge_litert.interpreter import Interpreter, OpResolverType  # noqa: F401
else:
    from tflite_runtime.interpreter import Interpreter, OpResolverType  # noqa: F401


def label() -> str:
    """"LiteRT 2.3.0" or "tflite-runtime 2.14.0": how benchmarks and reports name the runtime."""
    pkg = __import__(RUNTIME)
    return f"{'LiteRT' if RUNTIME == 'ai_edge_litert' else 'tflite-runtime'} {getattr(pkg, '__version__', '?')}"
