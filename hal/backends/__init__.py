"""Compute backends: who runs an operation, kept apart from what the operation is.

An operation's spec (``hal/operations/``) says what NNAPI requires and what shape comes out; a
backend says how to compute it. A backend has a name, a version and kernels keyed by operation
code. A :class:`Kernel` has

* ``plan(ctx) -> data``: precomputed at prepareModel (packed weights, multipliers, gather
  indices), stored as ``ctx.data`` and in the compilation cache;
* ``execute(ctx, inputs) -> outputs``: the arithmetic, reading ``ctx.data`` only;
* what it runs: the input-0 ``types`` (None: every type the spec defines) and an optional
  ``supports(ctx) -> reason | None`` for parameters it cannot take;
* ``prepacked_inputs``: positions whose constant value plan packed, so the cache stores only the
  packed form.

The compiler gives each operation to the first backend in the preference order whose kernel
takes it. ``reference`` (numpy, the living definition of every operation, bit-exact with TFLite's
reference kernels) is always last: the fallback, and the oracle fast backends are tested against
(ARM NN's CpuRef, tinygrad's Python backend). The order comes from ``set_preference`` (``nnhal
serve --backend``), else ``$NNHAL_BACKENDS`` (comma-separated names), else every available
backend by priority. A vendor extension's kernels form one more backend, named after the
extension, which alone runs that extension's operations.

A backend's identity (name, version, digest of its modules' files) goes into every cache entry
that uses it: editing one backend invalidates only the entries compiled with it.

Modules: ``kernel`` (Kernel, the float16 adapter), ``backend`` (Backend and its identity),
``registry`` (which backends exist and what they take), ``policy`` (the preference order and
the threads kernels may use), ``graph`` (backends that compile runs of operations),
``host_memory`` (shared host memory a device backend copies in place). This package re-exports
the public names of the first five.
"""
from hal.backends.backend import Backend, ExtensionBackend  # noqa: F401
from hal.backends.kernel import (  # noqa: F401
    FLOAT16_TO_FLOAT32,
    Execute,
    Kernel,
    Plan,
    Supports,
    float32_view,
    has_float16,
    via_float32,
)
from hal.backends.policy import (  # noqa: F401
    ENV_VAR,
    candidates,
    compute_threads,
    parse_preference,
    preference,
    set_compute_threads,
    set_preference,
    thread_limit,
)
from hal.backends.registry import (  # noqa: F401
    REFERENCE,
    available,
    ensure_loaded,
    extension_backend,
    get,
    register_backend,
    runs,
    support_matrix,
    unregister_backend,
)

__all__ = ["Backend", "ExtensionBackend", "Kernel", "REFERENCE", "available", "candidates", "compute_threads",
           "ensure_loaded", "extension_backend", "get", "has_float16", "parse_preference", "preference",
           "register_backend", "runs", "set_compute_threads", "set_preference", "support_matrix", "thread_limit",
           "unregister_backend", "via_float32"]
