"""Where a float model's time goes, in LiteRT and in nnhal, operator by operator
(``python -m bench.op_compare "MobileNetV3-small"``: a float benchmark model by the start of its
label; not part of ``make bench``).

LiteRT has no per-operator profiler in its Python package, so each operator of the model is cut
out as a one-operator model (its constant inputs copied, its other inputs made inputs) and timed
hot on LiteRT's default path (XNNPACK), 1 thread. nnhal's side: each bound step of the model
(``hal.executor.bind`` on the backends ``make bench`` serves, 1 compute thread) run alone, hot,
through the backend's own chaining (no Python between its kernels). Both are isolated, warm-cache
times: their sums leave out what a whole run adds (weights streamed from the last-level cache,
activations passed between layers), which the "whole" lines show. nnhal's steps may fuse several
operators (``conv_epilogue``: a convolution and the ADD, PRELU or activation after it): the rows
are matched by output shape, not one to one.
"""
from __future__ import annotations

import collections
import sys
import time
from dataclasses import dataclass

import numpy as np

from bench.float_models import MODELS, _feed
from delegate.mapping import convert_partition
from delegate.runtime import Interpreter
from delegate.tfl import TfLiteModelBuilder, read_model
from delegate.tfl.schema import TENSOR_DTYPE, builtin_name, module, options_name
from hal import backends
from hal.backends.registry import get as backend_named
from hal.compiler import compile_model
from hal.executor import bind
from hal.types import OperationType

ORDER = ["onnxruntime", "numba", "reference"]


@dataclass
class OpTime:
    """One operator's (LiteRT) or bound step's (nnhal) hot time."""

    kind: str
    output_shape: tuple[int, ...]
    us: float


def best_us(run, reps: int = 20, repeats: int = 5) -> float:
    """The fastest of ``repeats`` means over ``reps`` calls, after a few untimed ones."""
    for _ in range(3):
        run()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(reps):
            run()
        best = min(best, (time.perf_counter() - t) / reps)
    return best * 1e6


def one_operator_models(data: bytes) -> list[tuple[str, tuple[int, ...], bytes]]:
    """(kind, output shape, model) per operator of subgraph 0: the operator alone, its constant
    inputs copied, its other inputs the model's inputs, its outputs the model's outputs."""
    graph = read_model(data)
    subgraph = module("Model").Model.GetRootAs(data, 0).Subgraphs(0)
    out = []
    for node in graph.nodes:
        b = TfLiteModelBuilder(description="one operator")
        ids = {}
        for i in (i for i in node.inputs if i >= 0):
            t = graph.tensors[i]
            ids[i] = b.add_constant(t.name, t.data) if t.data is not None else \
                b.add_input(t.name, list(t.shape), TENSOR_DTYPE[t.type])
        for o in node.outputs:
            t = graph.tensors[o]
            ids[o] = b.add_tensor(t.name, list(t.shape), TENSOR_DTYPE[t.type])
        name = options_name(subgraph.Operators(node.index).BuiltinOptionsType())
        options = (name, dict(node.options)) if name and name != "NONE" else None
        b.add_operator(node.builtin_code, [ids.get(i, -1) for i in node.inputs], [ids[o] for o in node.outputs],
                       options, version=node.version)
        b.set_outputs([ids[o] for o in node.outputs])
        out.append((builtin_name(node.builtin_code), tuple(graph.tensors[node.outputs[0]].shape), b.build()))
    return out


def litert_times(data: bytes, rng: np.random.Generator) -> list[OpTime]:
    """Each operator's time as a one-operator model in LiteRT (1 thread), inputs uniform in [-1, 1]."""
    times = []
    for kind, shape, model in one_operator_models(data):
        it = Interpreter(model_content=model, num_threads=1)
        it.allocate_tensors()
        for d in it.get_input_details():
            it.set_tensor(d["index"], rng.uniform(-1, 1, d["shape"]).astype(d["dtype"]))
        times.append(OpTime(kind, shape, best_us(it.invoke)))
    return times


def nnhal_times(data: bytes, inputs: list[np.ndarray]) -> tuple[list[OpTime], float]:
    """Each bound step's time run alone (chained by its backend where it chains), and the whole
    bound program's."""
    compiled = compile_model(convert_partition(read_model(data)).model, backend_order=ORDER)
    plan = compiled.static_plan
    outs = [np.empty(plan.infos[i].shape, plan.infos[i].dtype) for i in compiled.output_indexes]
    runner = bind(compiled, inputs, outs)
    if runner is None:
        raise SystemExit("the model does not bind (not a static plan)")
    program = getattr(runner, "program", runner)
    whole = best_us(lambda: runner(None, None, None))
    times = []
    for call, step in zip(program.calls, program.steps):
        if program.is_view(call):
            continue
        backend = backend_named(step.kernel.backend)
        chained = backend.chain([call]) if backend is not None and backend.chain is not None else [call]
        kind = getattr(step.ctx, "pattern", None) or OperationType(step.ctx.op_type).name
        members = getattr(step.ctx, "members", None)
        if members:
            kind += "(" + "+".join(OperationType(m.ctx.op_type).name for m in members) + ")"
        times.append(OpTime(kind, tuple(plan.infos[step.outputs[0]].shape), best_us(chained[0])))
    return times, whole


def litert_whole_us(data: bytes, inputs: list[np.ndarray]) -> float:
    it = Interpreter(model_content=data, num_threads=1)
    it.allocate_tensors()
    for d, x in zip(it.get_input_details(), inputs):
        it.set_tensor(d["index"], x)
    return best_us(it.invoke)


def report(label: str, lite: list[OpTime], lite_whole: float, ours: list[OpTime], ours_whole: float,
           top: int = 25) -> str:
    lines = [f"{label}: LiteRT whole {lite_whole:.1f} us, its operators alone {sum(t.us for t in lite):.1f} us; "
             f"nnhal whole {ours_whole:.1f} us, its steps alone {sum(t.us for t in ours):.1f} us"]
    for name, times in (("LiteRT", lite), ("nnhal", ours)):
        by_kind: dict[str, float] = collections.defaultdict(float)
        for t in times:
            by_kind[t.kind] += t.us
        total = sum(by_kind.values()) or 1.0
        lines.append(f"{name} by kind:")
        lines += [f"  {k:60s} {v:8.1f} us {100 * v / total:5.1f}%" for k, v in sorted(by_kind.items(),
                                                                                      key=lambda kv: -kv[1])]
    by_shape: dict[tuple, list[list[float]]] = collections.defaultdict(lambda: [[], []])
    for side, times in enumerate((lite, ours)):
        for t in times:
            by_shape[t.output_shape][side].append(t.us)
    lines.append(f"by output shape (the {top} largest differences; LiteRT's operators of that output shape "
                 "against nnhal's steps of it):")
    rows = sorted(by_shape.items(), key=lambda kv: -abs(sum(kv[1][1]) - sum(kv[1][0])))[:top]
    lines += [f"  {str(shape):22s} LiteRT {sum(a):8.1f} us ({len(a)})  nnhal {sum(b):8.1f} us ({len(b)})  "
              f"{sum(b) - sum(a):+8.1f}" for shape, (a, b) in rows]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m bench.op_compare LABEL_START  (one of: "
              + ", ".join(label for label, _, _ in MODELS) + ")")
        return 2
    chosen = [(label, build, spec) for label, build, spec in MODELS if label.lower().startswith(argv[0].lower())]
    if not chosen:
        print(f"no float benchmark model's label starts with {argv[0]!r}")
        return 2
    backends.ensure_loaded()
    backends.set_compute_threads(1)
    label, build, spec = chosen[0]
    data = build()
    rng = np.random.default_rng(0)
    inputs = _feed(spec, rng)
    ours, ours_whole = nnhal_times(data, inputs)
    print(report(label, litert_times(data, rng), litert_whole_us(data, inputs), ours, ours_whole))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
