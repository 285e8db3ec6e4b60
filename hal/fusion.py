"""Operation patterns a backend runs as one step: the program's fused steps.

After the compiler has planned every operation on its backend (and graph backends have compiled
their partitions), ``fuse`` looks for patterns whose operations one backend planned and that
backend registered a fused kernel for (``Backend.register_fusion``). A pattern's intermediate
tensors must have no other reader and not be a model output: the fused step computes exactly
what the pattern's last operation wrote, and nothing else ever saw the rest. ``Plan.steps`` keep
one step per operation (what the compilation cache stores); ``Plan.program`` runs the fused step
instead of its members, so a cache load fuses again from the stored steps. A backend without the
kernel (the reference backend, the oracle) runs the operations one by one.

Patterns:

* ``swish``: LOGISTIC(x) -> y, then MUL(x, y) or MUL(y, x) as the next operation (EfficientNet's
  activation). On 8-bit tensors the pair is a function of x's 256 values: a backend can tabulate
  it from its two member plans (the numba backend: lut.py).
* ``table_after``: an operation whose one output only feeds the next step, an element-wise unary
  operation (LOGISTIC, TANH, HARD_SWISH, RELU, RELU1, RELU6) or a fused ``swish``: on 8-bit
  tensors a 256-entry table the producer can apply to its output while it is still in cache (the
  numba backend: convolutions, conv.py). Found after ``swish``, so a convolution's swish is one step.
  Inputs the producer's kernel packed at plan time (filters, biases) are not read again: the
  fused step lists them as omitted.

* ``conv_epilogue``: a CONV_2D or DEPTHWISE_CONV_2D, then an ADD of its output and another
  tensor (a residual block's shortcut), then a PRELU of that sum, then an activation (HARD_SWISH,
  or a fused ``swish``), as consecutive operations (any of the three may be missing; nothing
  follows the activation): the convolution applies them to its sums in registers before storing
  them (the numba backend's float convolutions: numba_kernels/f32_conv.py, f32_depthwise.py).
  A PAD (or PAD_V2) whose output only the convolution reads may come first: a zero pad of the
  image's rows and columns is more of the convolution's own padding (Keras' ZeroPadding2D
  before a stride-2 layer). Its inputs are the convolution's (with a PAD: the PAD's input
  first, in place of the padded tensor), then the ADD's other operand and its activation, then
  the PRELU's alpha, then the swish's MUL's activation. Found after ``table_after``: where a
  backend tabulates a convolution's activation (8-bit), that is its step.

* ``expand_depthwise``: a CONV_2D (or its ``conv_epilogue``), then a DEPTHWISE_CONV_2D (or its
  ``conv_epilogue``) reading its output, which nothing else reads (an inverted residual block's
  expansion, its activation and the depthwise layer): the expansion's output is computed a few
  rows at a time, as the depthwise layer reaches them, so that it never leaves the cache (the
  numba backend's float kernels: numba_kernels/f32_expand.py). Its inputs are the first step's
  (packed ones omitted), then the second's but its first. Its members are those two steps.

* ``fc_chain``: consecutive FULLY_CONNECTED operations, each reading the one before as its input
  (a multi-layer perceptron): one step runs every layer (the numba backend's float layers of a
  small batch: numba_kernels/fc_float.py). Its inputs are the first layer's input only (the
  backend packed every weight and bias at plan time).

A fused step's timing record covers its member operations (``OperationTiming.count``), which are
consecutive, as a graph backend's partition's are; its type is its first member's (the service
names it so, "CONV_2D (+1 fused)": a graph backend's partition has none, type -1).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from hal import backends
from hal.plan import Step
from hal.types import OperationType

_log = logging.getLogger(__name__)

SWISH = "swish"
TABLE_AFTER = "table_after"
FC_CHAIN = "fc_chain"
CONV_EPILOGUE = "conv_epilogue"
EXPAND_DEPTHWISE = "expand_depthwise"
PATTERNS = (SWISH, TABLE_AFTER, CONV_EPILOGUE, EXPAND_DEPTHWISE, FC_CHAIN)
#: Element-wise operations of one input that a ``table_after`` step may apply.
UNARY = frozenset(int(t) for t in (OperationType.LOGISTIC, OperationType.TANH, OperationType.HARD_SWISH,
                                    OperationType.RELU, OperationType.RELU1, OperationType.RELU6))
#: The convolutions a ``conv_epilogue`` applies its members to, and the pads it may start with.
CONVOLUTIONS = frozenset(int(t) for t in (OperationType.CONV_2D, OperationType.DEPTHWISE_CONV_2D))
PADS = frozenset(int(t) for t in (OperationType.PAD, OperationType.PAD_V2))


@dataclass
class FusedContext:
    """A fused step's context: the pattern, the member steps as their backend planned them, and the
    fused kernel's plan (``data``)."""

    pattern: str
    backend: str
    members: tuple[Step, ...]
    data: Any = None
    op_type: int = -1  # the first member's (set by _fused): timings name the step by it and the count

    @property
    def operations(self) -> tuple[int, ...]:
        return tuple(i for s in self.members for i in s.operations)

    @property
    def name(self) -> str:
        return f"operations {self.operations[0]}-{self.operations[-1]} ({self.pattern}, {self.backend})"


def fuse(program: list[Step], keep: frozenset[int]) -> list[Step]:
    """``program`` with each pattern some backend fuses replaced by its fused step. ``keep``: the
    model's outputs (never an internal tensor of a fused step)."""
    for pattern in (_swish, _table_after):
        readers = _readers(program)  # of this pass's program (a fused swish reads its x once)
        fused: list[Step] = []
        k = 0
        while k < len(program):
            step = pattern(program[k], program[k + 1], readers, keep) if k + 1 < len(program) else None
            if step is not None:
                fused.append(step)
                k += 2
            else:
                fused.append(program[k])
                k += 1
        program = fused
    return _fc_chains(_expansions(_epilogues(program, keep), keep), keep)


def _epilogues(program: list[Step], keep: frozenset[int]) -> list[Step]:
    """``program`` with each convolution, ADD, PRELU, activation run (``conv_epilogue``) its
    backend fuses as one step: a fused step is offered the next operation again, so a block's
    three become one."""
    readers = _readers(program)
    out: list[Step] = []
    for step in program:
        fused = _epilogue(out[-1], step, readers, keep) if out else None
        if fused is not None:
            out[-1] = fused
        else:
            out.append(step)
    return out


def _epilogue(a: Step, b: Step, readers: dict[int, int], keep: frozenset[int]) -> Step | None:
    if a.backend != b.backend or len(a.outputs) != 1 or b.operations[0] != a.operations[-1] + 1:
        return None
    y = a.outputs[0]
    if y in keep or readers.get(y) != 1:
        return None
    if a.spec is not None and a.ctx.op_type in PADS:
        if b.spec is None or b.ctx.op_type not in CONVOLUTIONS or not b.inputs or b.inputs[0] != y:
            return None
        packed = b.kernel.prepacked_inputs
        conv_inputs = tuple(-1 if k in packed else i for k, i in enumerate(b.inputs))
        return _fused(CONV_EPILOGUE, (a, b), (a.inputs[0], *conv_inputs[1:]), b.outputs)
    if a.spec is not None:
        if a.ctx.op_type not in CONVOLUTIONS:
            return None
        members, done = (a,), ()
        packed = a.kernel.prepacked_inputs
        inputs = tuple(-1 if k in packed else i for k, i in enumerate(a.inputs))
    elif isinstance(a.ctx, FusedContext) and a.ctx.pattern == CONV_EPILOGUE:
        members, inputs = a.ctx.members, a.inputs
        first = 2 if members[0].ctx.op_type in PADS else 1  # the members after the convolution
        done = tuple(m.ctx.op_type for m in members[first:])
        if any(_is_activation(m) for m in members[first:]):
            return None
    else:
        return None
    if _is_activation(b) and b.inputs and b.inputs[0] == y:
        return _fused(CONV_EPILOGUE, (*members, b), (*inputs, *b.inputs[1:]), b.outputs)
    if b.spec is None:
        return None
    if b.ctx.op_type == OperationType.ADD and not done and len(b.inputs) >= 2 and y in b.inputs[:2] \
            and b.inputs[0] != b.inputs[1]:
        other = b.inputs[1] if b.inputs[0] == y else b.inputs[0]
        return _fused(CONV_EPILOGUE, (*members, b), (*inputs, other, *b.inputs[2:]), b.outputs)
    if b.ctx.op_type == OperationType.PRELU and OperationType.PRELU not in done and b.inputs[0] == y \
            and len(b.inputs) >= 2:
        return _fused(CONV_EPILOGUE, (*members, b), (*inputs, b.inputs[1]), b.outputs)
    return None


def _is_activation(s: Step) -> bool:
    """A ``conv_epilogue``'s last member: a HARD_SWISH, or a fused ``swish``."""
    if s.spec is not None:
        return s.ctx.op_type == OperationType.HARD_SWISH and len(s.outputs) == 1
    return isinstance(s.ctx, FusedContext) and s.ctx.pattern == SWISH


def _expansions(program: list[Step], keep: frozenset[int]) -> list[Step]:
    """``program`` with each CONV_2D step (or its ``conv_epilogue``) whose one output only the next
    step, a DEPTHWISE_CONV_2D (or its ``conv_epilogue``), reads as its input replaced by the
    ``expand_depthwise`` step its backend fuses them into."""
    readers = _readers(program)
    out: list[Step] = []
    for step in program:
        a = out[-1] if out else None
        fused = None
        if a is not None and _first_type(a) == OperationType.CONV_2D and _first_type(step, True) == \
                OperationType.DEPTHWISE_CONV_2D and a.backend == step.backend and len(a.outputs) == 1 \
                and step.operations[0] == a.operations[-1] + 1 and step.inputs and step.inputs[0] == a.outputs[0] \
                and a.outputs[0] not in keep and readers.get(a.outputs[0]) == 1:
            first = a.inputs if a.spec is None else \
                tuple(-1 if k in a.kernel.prepacked_inputs else i for k, i in enumerate(a.inputs))
            fused = _fused(EXPAND_DEPTHWISE, (a, step), (*first, *step.inputs[1:]), step.outputs)
        if fused is not None:
            out[-1] = fused
        else:
            out.append(step)
    return out


def _first_type(s: Step, after_pad: bool = False) -> int | None:
    """The operation type of a plain step, or of a ``conv_epilogue``'s convolution (``after_pad``:
    the convolution may follow a PAD, else it must come first)."""
    if s.spec is not None:
        return s.ctx.op_type
    if not (isinstance(s.ctx, FusedContext) and s.ctx.pattern == CONV_EPILOGUE):
        return None
    first = s.ctx.members[0].ctx.op_type
    if first in PADS:
        return s.ctx.members[1].ctx.op_type if after_pad else None
    return first


def _fc_chains(program: list[Step], keep: frozenset[int]) -> list[Step]:
    """``program`` with each maximal run of chained FULLY_CONNECTED steps of one backend that
    fuses ``fc_chain`` replaced by the fused step (a run it declines stays as it was)."""
    readers = _readers(program)
    out: list[Step] = []
    k = 0
    while k < len(program):
        end = k + 1
        if is_fc(program[k]):
            while end < len(program) and _chained(program[end - 1], program[end], readers, keep):
                end += 1
        step = chain(program[k:end]) if end - k > 1 else None
        out.extend([step] if step is not None else program[k:end])
        k = end
    return out


def _readers(program: list[Step]) -> dict[int, int]:
    """How many times the steps of ``program`` read each operand."""
    readers: dict[int, int] = {}
    for s in program:
        for i in s.inputs:
            readers[i] = readers.get(i, 0) + 1
    return readers


def is_fc(s: Step) -> bool:
    """A FULLY_CONNECTED step (not a fused one)."""
    return s.spec is not None and s.ctx.op_type == OperationType.FULLY_CONNECTED and len(s.outputs) == 1


def _chained(a: Step, b: Step, readers: dict[int, int], keep: frozenset[int]) -> bool:
    y = a.outputs[0]
    return is_fc(b) and a.backend == b.backend and b.index == a.index + 1 and b.inputs[0] == y \
        and y not in keep and readers.get(y) == 1


def chain(steps: list[Step]) -> Step | None:
    """The ``fc_chain`` step running ``steps`` (FULLY_CONNECTED steps of one backend, each reading
    the one before, whose intermediate outputs nothing else reads), or None when their backend
    does not fuse them."""
    return _fused(FC_CHAIN, tuple(steps), (steps[0].inputs[0],), steps[-1].outputs)


def _swish(a: Step, b: Step, readers: dict[int, int], keep: frozenset[int]) -> Step | None:
    if a.spec is None or b.spec is None or a.ctx.op_type != OperationType.LOGISTIC \
            or b.ctx.op_type != OperationType.MUL or a.backend != b.backend or b.index != a.index + 1:
        return None
    x, y = a.inputs[0], a.outputs[0]
    if x < 0 or x == y or y in keep or readers.get(y) != 1 or sorted(b.inputs[:2]) != sorted((x, y)):
        return None
    return _fused(SWISH, (a, b), (x, *b.inputs[2:]), b.outputs)


def _table_after(a: Step, b: Step, readers: dict[int, int], keep: frozenset[int]) -> Step | None:
    if a.spec is None or len(a.outputs) != 1 or a.backend != b.backend or b.operations[0] != a.index + 1:
        return None
    if b.spec is not None:
        if b.ctx.op_type not in UNARY:
            return None
    elif not (isinstance(b.ctx, FusedContext) and b.ctx.pattern == SWISH):
        return None
    y = a.outputs[0]
    if y in keep or readers.get(y) != 1 or not b.inputs or b.inputs[0] != y:
        return None
    packed = a.kernel.prepacked_inputs
    inputs = tuple(-1 if k in packed else i for k, i in enumerate(a.inputs)) + tuple(b.inputs[1:])
    return _fused(TABLE_AFTER, (a, b), inputs, b.outputs)


def _fused(pattern: str, members: tuple[Step, ...], inputs: tuple[int, ...], outputs: tuple[int, ...]) -> Step | None:
    backend = backends.get(members[0].backend)
    for kernel in () if backend is None else backend.fusions.get(pattern, ()):
        ctx = FusedContext(pattern, backend.name, members, op_type=members[0].ctx.op_type)
        try:
            ctx.data = kernel.plan(ctx)
        except Exception as e:  # noqa: BLE001 - a fusion's bug costs speed, never the model
            _log.warning("%s: backend %s could not fuse it (%r); the operations run one by one", ctx.name,
                         backend.name, e)
            return None
        if ctx.data is not None:
            return Step(members[0].index, None, kernel, ctx, inputs, outputs)  # type: ignore[arg-type]
    return None
