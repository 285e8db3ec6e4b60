"""Transitional: old-style (validate, prepare, execute) registrations, as spec + reference kernel."""
from __future__ import annotations

from hal import registry


def register(op_types, *, validate, prepare, execute, supported_types, prepacked_inputs=()):
    import hal.backends.reference as ref

    def _validate(ctx):
        if not ctx.validating:
            validate(ctx)

    registry.register(op_types, validate=_validate, prepare=prepare, input_types=supported_types, optional_inputs=None,
                      num_outputs=None)
    ref.BACKEND.register(op_types, plan=lambda ctx: ctx.params, execute=execute,
                         prepacked_inputs=prepacked_inputs)
