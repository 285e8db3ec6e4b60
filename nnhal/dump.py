"""--dump-dir: every delegated NNAPI operation's output next to TFLite CPU's value of the same tensor,
so a mismatch can be traced to the first operation that diverges (as Hexagon NN's and MACE's
per-layer dumps allow).

For one set of inputs: a delegated interpreter and the TFLite CPU reference (nnhal.reference: with
the custom ops TFLite has no kernel for on nnhal's reference backend), both keeping every tensor
(experimental_preserve_all_tensors); each delegated partition's NNAPI model then runs in
process on hal, operation by operation, from the inputs TFLite gave that partition. Written:
``p{P}_op{K}_out{J}.npy`` (hal), ``ref_t{T}.npy`` (TFLite CPU's tensor T) and ``index.json``.
An operation is paired with a TFLite tensor when it is the last NNAPI operation a TFLite node
became (its outputs are the node's); the others (helpers a mapping added) have no reference.
"""
from __future__ import annotations

import json
import os

import numpy as np

from nnhal.reference import reference_interpreter


def _max_abs_diff(a: np.ndarray, ref: np.ndarray) -> float | None:
    if a.size != ref.size:
        return None
    if a.size == 0:
        return 0.0
    return float(np.max(np.abs(a.reshape(-1).astype(np.float64) - ref.reshape(-1).astype(np.float64))))


def _per_operation(model):
    """The model compiled so that each step is one operation: a graph backend that runs several
    operations as one (onnxruntime) is left out. Returns it and the backends left out."""
    import hal
    from hal import backends
    compiled = hal.compile_model(model)
    plan = None if compiled.runtime_values else compiled.static_plan
    fused = sorted({s.kernel.backend for s in plan.program if len(s.operations) > 1}) if plan else []
    if fused:
        compiled = hal.compile_model(model, backend_order=[b for b in backends.preference() if b not in fused])
    return compiled, fused


def _run_operations(model, inputs: list[np.ndarray]) -> tuple[dict[int, np.ndarray], list, list[str]]:
    """Every operand's value after an in-process hal run (none released), the steps run, and the
    graph backends left out to get there."""
    from hal.compiler import RuntimeValueNeeded
    from hal.control_flow import loop_timeout_ns
    from hal.executor import _Run, _run_step, _zero_sized_output
    compiled, fused = _per_operation(model)
    run = _Run(compiled, None, None, loop_timeout_ns(None))  # untimed, no deadline, NNAPI's loop timeout
    arrays = [np.asarray(a) for a in inputs]
    values: dict[int, np.ndarray] = dict(compiled.constants)
    values.update(zip(compiled.input_indexes, arrays))
    steps = []
    try:
        if compiled.runtime_values:
            raise RuntimeValueNeeded
        plan = compiled.plan_for(tuple(a.shape for a in arrays))
        infos = list(plan.infos)
        for step in plan.program:
            _run_step(step, values, infos, run)
            steps.append(step)
    except RuntimeValueNeeded:  # planned operation by operation from the values, as hal.execute does
        import dataclasses
        infos = list(compiled.base_infos)
        for idx, a in zip(compiled.input_indexes, arrays):
            infos[idx] = dataclasses.replace(infos[idx], shape=tuple(a.shape))
        for k in range(len(model.main.operations)):
            step = compiled.runtime_step(k, infos, values)
            if _zero_sized_output(step, infos):
                values.update((o, np.zeros(infos[o].shape, infos[o].dtype)) for o in step.outputs)
            else:
                _run_step(step, values, infos, run)
            steps.append(step)
    return values, steps, fused


def _interpreter(model_file: str, sources, delegates=None, reference_kernels: bool = False):
    """Keeping every tensor; the reference without XNNPACK, whose partitions would hide theirs.
    LiteRT, keeping every tensor, hands a delegate's partition over one node (one kernel) at a
    time, so the dump then lists one partition per delegated node; tflite-runtime 2.14 does not."""
    from delegate.runtime import Interpreter, OpResolverType
    from nnhal.tool_inputs import resize_inputs
    kind = OpResolverType.BUILTIN_REF if reference_kernels else OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
    it = Interpreter(model_path=model_file, num_threads=1, experimental_delegates=delegates,
                     experimental_preserve_all_tensors=True, experimental_op_resolver_type=kind)
    if sources:
        resize_inputs(it, sources)
    it.allocate_tensors()
    return it


def _invoke(it, inputs) -> None:
    for d, x in zip(it.get_input_details(), inputs):
        it.set_tensor(d["index"], x)
    it.invoke()


def dump_operations(dump_dir: str, model_file: str, inputs: list[np.ndarray], sources,
                    service_address: str | None = None, options: dict | None = None,
                    reference_kernels: bool = False) -> dict:
    """Write the dump for these inputs; returns the index (also index.json)."""
    from delegate import load_delegate
    from hal.types import operation_name
    os.makedirs(dump_dir, exist_ok=True)
    d = load_delegate(service_address, **(options or {}))
    test = _interpreter(model_file, sources, [d], reference_kernels)
    reference = reference_interpreter(model_file, lambda oracle: _interpreter(model_file, sources, oracle,
                                                                              reference_kernels))
    ref = reference.interpreter
    _invoke(test, inputs)
    _invoke(ref, inputs)
    names = {int(t["index"]): t["name"] for t in ref.get_tensor_details()}
    node_outputs = {int(op["index"]): (op["op_name"], [int(t) for t in op["outputs"]]) for op in ref._get_ops_details()}
    references: dict[int, str] = {}
    overwritten = _overwritten(ref, node_outputs)
    hidden = reference.hidden_tensors()  # inside a partition of the reference's oracle: TFLite has no value

    def reference_value(t: int) -> tuple[np.ndarray | None, str | None]:
        if t in overwritten or t in hidden:
            return None, None
        try:
            value = ref.get_tensor(t)
        except ValueError:  # a tensor TFLite does not expose (no data)
            return None, None
        if t not in references:
            references[t] = f"ref_t{t}.npy"
            np.save(os.path.join(dump_dir, references[t]), value)
        return value, references[t]

    index: dict = {"model": os.path.abspath(model_file), "partitions": [], "operations": []}
    for p, kernel in enumerate(d.impl.kernels):
        part = kernel.part
        part_inputs = [test.get_tensor(t) for t in part.input_tensors]
        try:
            values, steps, left_out = _run_operations(part.model, part_inputs)
        except Exception as e:  # noqa: BLE001 - said in the index; the other partitions are still dumped
            index["partitions"].append({"partition": p, "error": " ".join(str(e).split()) or type(e).__name__})
            continue
        last_of = {span[1] - 1: n for n, span in part.node_operations.items() if span[1] > span[0]}
        index["partitions"].append({"partition": p, "input_tensors": part.input_tensors,
                                    "output_tensors": part.output_tensors, "operations": len(steps),
                                    "backends_left_out": left_out,
                                    "nodes": sorted(part.node_operations)})
        for step in steps:
            k = step.index
            node = last_of.get(k) if len(step.operations) == 1 else None
            tfl_outputs = node_outputs.get(node, (None, []))[1] if node is not None else []
            row = {"partition": p, "operation": k, "type": operation_name(step.ctx.op_type),
                   "backend": step.kernel.backend, "fused_operations": list(step.operations)
                   if len(step.operations) > 1 else None,
                   "tflite_node": node, "tflite_op": node_outputs.get(node, (None,))[0], "outputs": []}
            for j, o in enumerate(step.outputs):
                name = f"p{p}_op{k}_out{j}.npy"
                np.save(os.path.join(dump_dir, name), values[o])
                out = {"operand": o, "file": name, "tflite_tensor": None, "reference_file": None,
                       "max_abs_diff": None}
                if j < len(tfl_outputs) and len(tfl_outputs) == len(step.outputs):
                    t = tfl_outputs[j]
                    value, file = reference_value(t)
                    out.update(tflite_tensor=t, tflite_name=names.get(t), reference_file=file,
                               reference_overwritten=t in overwritten,
                               max_abs_diff=None if value is None else _max_abs_diff(values[o], value))
                row["outputs"].append(out)
            index["operations"].append(row)
    diffs = [(row, out) for row in index["operations"] for out in row["outputs"] if out["max_abs_diff"]]
    index["first_difference"] = _where(diffs[0]) if diffs else None
    index["largest_difference"] = _where(max(diffs, key=lambda ro: ro[1]["max_abs_diff"])) if diffs else None
    with open(os.path.join(dump_dir, "index.json"), "w") as f:
        json.dump(index, f, indent=1)
    return index


def _overwritten(it, node_outputs: dict[int, tuple[str, list[int]]]) -> set[int]:
    """Tensors whose buffer a later node reused (TFLite runs some ops in place, e.g. ADD, even with
    experimental_preserve_all_tensors): their value after the run is not theirs."""
    def address(t: int) -> int | None:
        try:
            view = it.tensor(t)()
        except ValueError:
            return None
        return view.ctypes.data if view.size else None
    seen: dict[int, int] = {}  # buffer address -> the tensor last written there
    lost = set()
    for n in sorted(node_outputs):
        for t in node_outputs[n][1]:
            a = address(t)
            if a is None:
                continue
            if a in seen and seen[a] != t:
                lost.add(seen[a])
            seen[a] = t
    return lost


def _where(row_out: tuple[dict, dict]) -> dict:
    row, out = row_out
    return {"partition": row["partition"], "operation": row["operation"], "type": row["type"],
            "file": out["file"], "reference_file": out["reference_file"], "max_abs_diff": out["max_abs_diff"]}
