"""IF and WHILE: the reference backend takes them so every operation has a backend, but the
executor runs them (``hal.control_flow``): they need the compiled subgraphs and the execution's
deadline and loop timeout, which no kernel sees."""
from __future__ import annotations

from hal.backends.reference import BACKEND
from hal.errors import HalError
from hal.registry import OperationContext
from hal.types import ErrorStatus, OperationType


def plan(ctx: OperationContext):
    """The operation's params (which subgraphs, how many loop values): what the executor reads,
    and what the compilation cache keeps."""
    return ctx.params


def execute(ctx: OperationContext, inputs: list) -> list:
    raise HalError(ErrorStatus.GENERAL_FAILURE, f"{ctx.name}: control flow runs in the executor, not as a kernel")


BACKEND.register((OperationType.IF, OperationType.WHILE), plan=plan, execute=execute)
