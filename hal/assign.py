"""Which backend runs an operation: the first of the preference order whose kernel takes it.

A backend that declines (its kernel's ``unsupported`` or its plan refuses) hands the operation to
the next one of the order and the log says why; a backend's bug (its checks or plan raised) costs
speed, never the operation. Graph backends claim operations as members of the partition their run
becomes (hal.compiler plans those runs)."""
from __future__ import annotations

import logging
from typing import Iterable

from hal import backends
from hal.backends import Backend, Kernel
from hal.backends.graph import GraphBackend
from hal.errors import HalError
from hal.extension_registry import extension_name
from hal.registry import OperationContext, OperationSpec

_log = logging.getLogger("hal.compiler")


def assign_backend(ctx: OperationContext, spec: OperationSpec, model_prefix_map: dict[int, str],
                   order: Iterable[Backend] | None = None) -> tuple[Kernel, object]:
    """The first backend whose kernel takes this operation, and its plan (``ctx.data``).

    A preferred backend that declines (or whose plan refuses) hands over to the next; the
    reference backend's refusal is final and its message is the operation's."""
    ext = extension_name(ctx.op_type, model_prefix_map)
    if ext is not None:  # backends of the order with a kernel for it, then the extension's own
        b = backends.extension_backend(ext)
        key = ctx.op_type & 0xFFFF
        chain = [c for c in (order if order is not None else backends.candidates())
                 if not isinstance(c, GraphBackend) and c.kernel_for(key, ext) is not None]
        chain += [] if b is None else [b]
    else:
        chain = list(order) if order is not None else backends.candidates()
        key = ctx.op_type
    declined: list[str] = []
    for n, backend in enumerate(chain):
        last = n == len(chain) - 1
        if isinstance(backend, GraphBackend):
            try:
                why = backend.claim(ctx)
            except Exception as e:  # noqa: BLE001 - a lowering's broken supports() declines
                why = _failed(ctx, backend, "supports", e)
            else:
                if why is not None and backend.takes(ctx.op_type, _input_type(ctx)):
                    _declined(ctx, backend, why)
            if why is None:  # a member of the partition its run becomes (planned by _partition)
                ctx.backend = backend.name
                return backend.member_kernel, None
            declined.append(f"{backend.name}: {why}")
            continue
        kernel = backend.kernel_for(key, ext)
        if kernel is None:
            declined.append(f"{backend.name}: no kernel")
            continue
        try:
            why = kernel.unsupported(ctx)
        except Exception as e:  # noqa: BLE001 - a backend's broken supports() declines; it cannot fail the op
            if last:
                raise
            why = _failed(ctx, backend, "supports", e)
        else:
            if why is not None and not last and kernel.runs_type(_input_type(ctx)):
                _declined(ctx, backend, why)
        if why is not None:
            if last and not declined:
                raise ctx.fail(why)
            declined.append(f"{backend.name}: {why}")
            continue
        ctx.backend = backend.name
        kernel = kernel.for_context(ctx)
        try:
            return kernel, kernel.plan(ctx)
        except HalError as e:
            if last:
                raise
            why = getattr(e, "detail", e.message)
            _declined(ctx, backend, why)
            declined.append(f"{backend.name}: {why}")
        except Exception as e:  # noqa: BLE001 - a fast backend's bug must not cost the operation its fallback
            if last:
                raise
            declined.append(f"{backend.name}: {_failed(ctx, backend, 'plan', e)}")
        ctx.backend = ""
    raise ctx.fail("no backend runs it" + (f" ({'; '.join(declined)})" if declined else ""))


def _input_type(ctx: OperationContext) -> int:
    return ctx.inputs[0].type if ctx.inputs and ctx.inputs[0] is not None else -1


def _declined(ctx: OperationContext, backend: Backend, why: str) -> None:
    """A backend with a kernel for this operation and type declined its parameters: the operation
    runs on a later backend of the order (slower), and the log says why (when compiling: a support
    query, ``ctx.packing`` False, is not the model being prepared)."""
    if ctx.packing:
        _log.info("%s: backend %s declined it (%s); the next backend of the order takes it", ctx.name, backend.name,
                  why)


def _failed(ctx: OperationContext, backend: Backend, what: str, e: Exception) -> str:
    """A backend's bug (its supports or plan raised): logged, and the operation goes to the next backend."""
    _log.warning("%s: backend %s: %s failed (%r); the next backend of the order takes it", ctx.name, backend.name,
                 what, e)
    return f"{what} failed: {e!r}"
