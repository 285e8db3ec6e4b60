"""The reference backend: numpy kernels, the living definition of every operation.

Quantized kernels reproduce TFLite's reference kernels bit for bit (int32 accumulators summed
exactly, ``MultiplyByQuantizedMultiplier``, rounding half away from zero, saturating casts); float
kernels meet NNAPI's CTS criteria. Every operation hal specifies has a kernel here, so this backend
is the fallback of every preference order, and the oracle a fast backend is tested against
(tests/backends/). One module per op family, beside its spec in hal/operations/.
"""
from hal.backends import REFERENCE, Backend, register_backend

#: Bump when a kernel's results or plan data change meaning; the identity also hashes the sources.
VERSION = "1"

BACKEND = register_backend(Backend(
    REFERENCE, VERSION, modules=("hal.backends.reference",), priority=0,
    description="numpy; bit-exact with TFLite's reference kernels; the fallback and the oracle"))


def _load_families() -> None:
    """Import every module of this package: each registers its family's kernels (adding an
    operation's kernels is one new module, no list to edit)."""
    import importlib
    import pkgutil
    for m in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        importlib.import_module(f"{__name__}.{m.name}")


_load_families()
