"""Backends made for testing the backend machinery itself (never registered outside tests).

* ``twin``: the reference backend's own kernels under another name: the differential harness
  must find it equal, and the compiler must give it the operations it prefers it for.
* mutants: the reference kernels of ADD with a defect a fast backend could have (one quantization
  step off on a few elements, a float error just outside CTS's tolerance, or one just inside):
  the harness must catch the first two and accept the third.
"""
from __future__ import annotations

import numpy as np

from hal import backends
from hal.backends import Backend
from hal.types import OperationType


def _reference() -> Backend:
    ref = backends.get(backends.REFERENCE)
    assert ref is not None
    return ref


def twin(name: str = "twin", ops: list[int] | None = None) -> Backend:
    """The reference kernels of ``ops`` (default: all) under ``name``; its code is the reference
    backend's, so its identity covers those modules too."""
    ref = _reference()
    b = Backend(name, "1", modules=(__name__, "hal.backends.reference"), priority=5, description="test twin")
    for op, k in ref.kernels.items():
        if ops is None or op in ops:
            b.register(op, plan=k.plan, execute=k.execute, types=k.types, supports=k.supports,
                       prepacked_inputs=k.prepacked_inputs)
    return b


def _mutant(name: str, damage) -> Backend:
    ref = _reference()
    add = ref.kernel(OperationType.ADD)

    def execute(ctx, inputs):
        return [damage(out) for out in add.execute(ctx, inputs)]

    b = Backend(name, "1", modules=(__name__, "hal.backends.reference"), description="test mutant")
    b.register(OperationType.ADD, plan=add.plan, execute=execute)
    return b


def one_step_off(name: str = "mutant_step") -> Backend:
    """Quantized outputs one step off on every 7th element (floats untouched)."""
    def damage(out):
        if np.issubdtype(out.dtype, np.floating):
            return out
        out = out.copy()
        flat = out.reshape(-1)
        info = np.iinfo(out.dtype)
        sel = flat[::7]
        flat[::7] = np.where(sel < info.max, sel + 1, sel - 1).astype(out.dtype)
        return out
    return _mutant(name, damage)


def float_error(name: str, relative: float) -> Backend:
    """Float outputs off by ``relative`` (plus 2e-5 absolute when relative >= 1e-4, i.e. outside
    CTS's 1e-5 floor; quantized outputs untouched)."""
    def damage(out):
        if not np.issubdtype(out.dtype, np.floating):
            return out
        extra = 2e-5 if relative >= 1e-4 else 0.0
        return (out.astype(np.float64) * (1 + relative) + extra).astype(out.dtype)
    return _mutant(name, damage)
