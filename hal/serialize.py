"""CompiledModel <-> (JSON payload, raw arrays), without pickle.

What prepareModel computed (shapes, repacked weights, multipliers) is written
as a JSON tree plus a list of numpy arrays, so the cache can store the arrays
raw and aligned. Loading builds objects only from an allow-list: dataclasses,
enums and functions defined in hal's core modules (not its backends) or in the
(already imported) modules of a backend the payload uses, numpy arrays and
scalars, slices of ints, and JSON values. Nothing is eval'd or imported on behalf of a payload
outside hal's core; no constructor or ``__setstate__`` of an arbitrary class
ever runs. A payload names the identity (name, version, source digest) of every
backend its steps were planned by, and of every extension its model declares
(an extension's kernels are a backend of their own): a backend that is missing,
changed or not enabled here fails the load, so editing one backend invalidates
only the entries that use it.
"""
from __future__ import annotations

import dataclasses
import enum
import importlib
import json
import sys
import types
from typing import Any

import numpy as np

from hal import backends
from hal.backends import Backend
from hal.backends.graph import GraphBackend
from hal.compiler import CompiledModel, Subgraphs, make_plan, ready
from hal.extension_registry import extension_dtype, extension_name, lookup_in_model, model_prefixes
from hal.fusion import fuse
from hal.model import (
    ExtensionNameAndPrefix,
    Model,
    Operand,
    Operation,
    Subgraph,
    SymmPerChannelQuantParams,
)
from hal.operands import operand_info, operation_context, step_inputs
from hal.plan import PartitionContext, Plan, Step, make_partition, partition_step
from hal.types import OperandLifeTime

#: 2: constants stored per operand, packed-only constants left out; 3: extensions; 4: backends;
#: 5: graph backends' partitions (slices, added later, are refused by older readers: a cache miss);
#: 6: referenced subgraphs' plans (IF, WHILE); 7: a referenced subgraph's partitions may be absent
#: (null: never compiled, its IF or WHILE lowered into a graph; planned again if it ever runs)
FORMAT_VERSION = 7
_CORE_PREFIX = "hal."
_BACKENDS_PREFIX = "hal.backends."


def _in_core(module: str) -> bool:
    """hal's core (specs, types, model, quantization math); backends are admitted per payload."""
    return module.startswith(_CORE_PREFIX) and not module.startswith(_BACKENDS_PREFIX) \
        and module != "hal.backends"


class SerializationError(ValueError):
    """The object cannot be written (a model that simply is not cached), or a payload is invalid."""


# ---- encoding ---------------------------------------------------------------------------------
class _Encoder:
    def __init__(self, used: tuple[Backend, ...] = ()) -> None:
        self.arrays: list[np.ndarray] = []
        self._ids: dict[int, int] = {}
        self.modules = used  # backends whose modules' objects may be referenced

    def array(self, a: np.ndarray) -> dict:
        key = id(a)
        if key not in self._ids:  # shared arrays (e.g. constants used twice) are stored once
            self._ids[key] = len(self.arrays)
            self.arrays.append(np.asarray(a, order="C"))
        return {"t": "array", "i": self._ids[key]}

    def value(self, v: Any) -> Any:
        if v is None or isinstance(v, (bool, str)):
            return v
        if isinstance(v, enum.Enum):
            return {"t": "enum", "ref": _ref(type(v), self.modules), "v": v.value}
        if isinstance(v, (int, float)):
            return v
        if isinstance(v, np.ndarray):
            return self.array(v)
        if isinstance(v, np.generic):
            return {"t": "np", "dtype": v.dtype.str, "v": v.item()}
        if isinstance(v, tuple):
            return {"t": "tuple", "v": [self.value(x) for x in v]}
        if isinstance(v, slice):  # basic indexing kept in a plan: ints or None only
            parts = [v.start, v.stop, v.step]
            if not all(p is None or (isinstance(p, (int, np.integer)) and not isinstance(p, bool)) for p in parts):
                raise SerializationError(f"cannot serialise a slice of non-integers: {v!r}")
            return {"t": "slice", "v": [None if p is None else int(p) for p in parts]}
        if isinstance(v, list):
            return {"t": "list", "v": [self.value(x) for x in v]}
        if isinstance(v, dict):
            return {"t": "dict", "v": [[self.value(k), self.value(x)] for k, x in v.items()]}
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            return {"t": "dc", "ref": _ref(type(v), self.modules),
                    "f": {f.name: self.value(getattr(v, f.name)) for f in dataclasses.fields(v)}}
        if isinstance(v, types.FunctionType):
            return {"t": "fn", "ref": _ref(v, self.modules)}
        raise SerializationError(f"cannot serialise {type(v).__module__}.{type(v).__qualname__}")


def _admitted(module: str, used: tuple[Backend, ...]) -> bool:
    return _in_core(module) or any(b.owns_module(module) for b in used)


def _ref(obj, used: tuple[Backend, ...] = ()) -> str:
    module, qual = obj.__module__, obj.__qualname__
    if not _admitted(module, used) or "<" in qual:
        raise SerializationError(f"{module}.{qual} is not serialisable "
                                 "(only module-level objects of hal's core or of the backends the model uses)")
    return f"{module}:{qual}"


# ---- decoding ---------------------------------------------------------------------------------
def _resolve(ref: str, used: tuple[Backend, ...] = ()):
    module, _, qual = ref.partition(":")
    in_core = _in_core(module)
    if not (in_core or _admitted(module, used)) or not qual or "<" in qual or "__" in qual:
        raise SerializationError(f"refused reference {ref!r}")
    mod = sys.modules.get(module)
    if mod is None and not in_core:  # a backend's modules are imported by the backend, never by a payload
        raise SerializationError(f"backend module {module!r} is not loaded")
    if mod is None:
        if module not in _known_modules():
            raise SerializationError(f"unknown module {module!r}")
        mod = importlib.import_module(module)
    obj = mod
    for part in qual.split("."):
        obj = getattr(obj, part, None)
        # The walk may step into a class (a nested class or a method), never into another module,
        # and what it reaches must be defined where the reference says: `hal.serialize:json.loads`
        # or `hal.serialize:backends.reference.x.Y` would otherwise smuggle in any module a core
        # module imports.
        if obj is None or isinstance(obj, types.ModuleType):
            raise SerializationError(f"unknown reference {ref!r}")
    if getattr(obj, "__module__", None) != module:
        raise SerializationError(f"refused reference {ref!r}: not defined in {module}")
    return obj


def _known_modules() -> set[str]:
    import pkgutil

    import hal
    import hal.operations
    names = {f"hal.{m.name}" for m in pkgutil.iter_modules(hal.__path__)} - {"hal.backends"}
    return names | {f"hal.operations.{m.name}" for m in pkgutil.iter_modules(hal.operations.__path__)}


class _Decoder:
    def __init__(self, arrays: list[np.ndarray], modules: tuple[Backend, ...] = ()):
        self.arrays = arrays
        self.modules = modules
        self._refs: dict[tuple[str, str], Any] = {}  # (kind, ref) -> checked object: resolve once per load

    def _checked(self, kind: str, ref: Any):
        key = (kind, ref)
        hit = self._refs.get(key)
        if hit is not None:
            return hit
        if not isinstance(ref, str):
            raise SerializationError(f"reference {ref!r} is not a string")
        obj = _resolve(ref, self.modules)
        if kind == "enum" and not (isinstance(obj, type) and issubclass(obj, enum.Enum)):
            raise SerializationError(f"{ref} is not an enum")
        if kind == "fn" and not isinstance(obj, types.FunctionType):
            raise SerializationError(f"{ref} is not a function")
        if kind == "dc":
            if not (isinstance(obj, type) and dataclasses.is_dataclass(obj)):
                raise SerializationError(f"{ref} is not a dataclass")
            obj = (obj, frozenset(f.name for f in dataclasses.fields(obj)))
        self._refs[key] = obj
        return obj

    def value(self, v: Any) -> Any:
        if not isinstance(v, dict):
            if isinstance(v, list):
                raise SerializationError("bare list in payload")
            return v
        t = v.get("t")
        if t == "array":
            i = v.get("i")
            if not isinstance(i, int) or not 0 <= i < len(self.arrays):
                raise SerializationError(f"array index {i!r} out of range")
            return self.arrays[i]
        if t == "np":
            return np.dtype(v["dtype"]).type(v["v"])
        if t == "tuple":
            return tuple(self.value(x) for x in v["v"])
        if t == "slice":
            parts = v["v"]
            if not (isinstance(parts, list) and len(parts) == 3
                    and all(p is None or (type(p) is int) for p in parts)):
                raise SerializationError(f"invalid slice {parts!r}")
            return slice(*parts)
        if t == "list":
            return [self.value(x) for x in v["v"]]
        if t == "dict":
            return {self.value(k): self.value(x) for k, x in v["v"]}
        if t == "enum":
            return self._checked("enum", v["ref"])(v["v"])
        if t == "fn":
            return self._checked("fn", v["ref"])
        if t == "dc":
            cls, names = self._checked("dc", v["ref"])
            fields = v["f"]
            if not isinstance(fields, dict) or fields.keys() != names:
                raise SerializationError(f"{v['ref']}: fields {sorted(fields)} != {sorted(names)}")
            obj = cls.__new__(cls)
            for k, x in fields.items():
                object.__setattr__(obj, k, self.value(x))
            return obj
        raise SerializationError(f"unknown payload node {t!r}")


# ---- models ---------------------------------------------------------------------------------------
def _model_tree(m: Model) -> dict:
    """The model's structure. Constant values travel separately (see dump_compiled): the stored
    model has no operand_values and no pools, so a loaded CompiledModel's ``model`` is structure only."""
    def sg(s: Subgraph) -> dict:
        return {"operands": [[int(o.type), list(o.dimensions), o.scale, o.zero_point, int(o.lifetime),
                              None if o.channel_quant is None else
                              [list(o.channel_quant.scales), o.channel_quant.channel_dim],
                              None if o.extension_params is None else o.extension_params.hex()]
                             for o in s.operands],
                "operations": [[int(op.type), list(op.inputs), list(op.outputs)] for op in s.operations],
                "inputs": list(s.input_indexes), "outputs": list(s.output_indexes)}
    return {"main": sg(m.main), "referenced": [sg(s) for s in m.referenced],
            "relax": m.relax_computation_float32_to_float16,
            "extensions": [[e.name, e.prefix] for e in m.extension_name_to_prefix]}


_LIFETIMES = {m.value: m for m in OperandLifeTime}  # a dict lookup: enum calls dominate on big models


def _model_from_tree(t: dict) -> Model:
    def sg(s: dict) -> Subgraph:
        operands = []
        for typ, dims, scale, zp, lt, cq, ext in s["operands"]:
            operands.append(Operand(
                type=typ, dimensions=tuple(dims), scale=scale, zero_point=zp, lifetime=_LIFETIMES[lt],
                channel_quant=None if cq is None else SymmPerChannelQuantParams(tuple(cq[0]), cq[1]),
                extension_params=None if ext is None else bytes.fromhex(ext)))
        return Subgraph(operands=operands,
                        operations=[Operation(type=a, inputs=tuple(b), outputs=tuple(c))
                                    for a, b, c in s["operations"]],
                        input_indexes=list(s["inputs"]), output_indexes=list(s["outputs"]))
    return Model(main=sg(t["main"]), referenced=[sg(s) for s in t["referenced"]],
                 relax_computation_float32_to_float16=bool(t["relax"]),
                 extension_name_to_prefix=[ExtensionNameAndPrefix(n, p) for n, p in t["extensions"]])


def _superseded_constants(plan: Plan, constants: dict[int, np.ndarray]) -> set[int]:
    """Constants every use of which is an input its op packed at prepare time (never read again)."""
    if not plan.built:  # planned again from the constants if it ever runs: keep them all
        return set()
    packed_only = set(constants)
    for step in plan.program:  # a partition step reads no constant: its graph holds them
        prepacked = step.kernel.prepacked_inputs
        for position, operand in enumerate(step.inputs):
            if operand in packed_only and position not in prepacked:
                packed_only.discard(operand)
    return packed_only


def _static_plans(compiled: CompiledModel) -> list[CompiledModel]:
    """The main subgraph's compiled model, then each referenced subgraph's: all must be planned."""
    parts = [compiled] + ([] if compiled.subgraphs is None else compiled.subgraphs.all())
    if any(c.static_plan is None for c in parts):
        raise SerializationError("models with unknown input shapes are planned per execution; not cached")
    return parts


def _backends_used(parts: list[CompiledModel]) -> tuple[Backend, ...]:
    """Backends the steps were planned by, plus the backend of every extension the model declares
    (its operand types' meaning lives there too)."""
    names = {s.backend for c in parts for s in c.static_plan.steps} | \
        {e.name for e in parts[0].model.extension_name_to_prefix}
    used = []
    for name in sorted(names):
        b = backends.get(name) or backends.extension_backend(name)
        if b is None:
            raise SerializationError(f"backend {name!r} is not registered")
        used.append(b)
    return tuple(used)


def _check_backend(name: str, identity: str, order: tuple[str, ...], extensions: set[str]) -> Backend:
    b = backends.extension_backend(name) if name in extensions else backends.get(name)
    if name in extensions:
        if b is None or b.identity() != identity:
            raise SerializationError(f"extension {name!r} is not loaded or changed since compilation")
        return b
    if b is None:
        raise SerializationError(f"backend {name!r} is not registered here")
    if name not in order:
        raise SerializationError(f"backend {name!r} is not enabled here (preference {','.join(order)})")
    if b.identity() != identity:
        raise SerializationError(f"backend {name!r} changed since compilation ({identity} -> {b.identity()})")
    return b


def dump_compiled(compiled: CompiledModel) -> tuple[bytes, list[np.ndarray]]:
    """Serialise a statically planned CompiledModel: (JSON payload, arrays).

    Constants whose ops only use a packed copy (conv filters, FC weights) are left out: the packed
    form in the op data is all execution needs, and the cache stores and verifies each byte once."""
    parts = _static_plans(compiled)
    used = _backends_used(parts)
    enc = _Encoder(used)
    tree = {
        "format": FORMAT_VERSION,
        "backends": {b.name: b.identity() for b in used},
        "order": list(compiled.backend_order),
        "model": _model_tree(compiled.model),
        **_plan_tree(compiled, enc),
        "subgraphs": [_plan_tree(c, enc) for c in parts[1:]],
    }
    return json.dumps(tree, separators=(",", ":")).encode(), enc.arrays


def _plan_tree(compiled: CompiledModel, enc: _Encoder) -> dict:
    """One subgraph's plan: its kept constants, planned shapes, steps' data and partitions."""
    plan = compiled.static_plan
    dropped = _superseded_constants(plan, compiled.constants)
    return {
        "constants": [[i, enc.array(v)] for i, v in sorted(compiled.constants.items()) if i not in dropped],
        "shapes": [list(info.shape) for info in plan.infos],
        "steps": [{"index": s.index, "backend": s.backend, "data": enc.value(s.ctx.data)} for s in plan.steps],
        # each graph backend's partition: [first, last] operation and its compiled artifact
        "partitions": None if not plan.built else [
            [p.ctx.operations[0], p.ctx.operations[-1], enc.value(p.ctx.artifact)]
            for p in plan.program if isinstance(p.ctx, PartitionContext)],
    }


def _program(model: Model, steps: list[Step], infos: list, partitions: list, dec: "_Decoder") -> list[Step]:
    """The plan's program: the steps, with each cached partition's executable loaded from its
    artifact (graph building and optimisation skipped), and the fused steps made again. The
    partitions must be exactly the runs of graph-backend members, as ``hal.compiler._partition``
    makes them."""
    keep = frozenset(model.main.output_indexes)
    runs: list[tuple[int, int]] = []
    k = 0
    while k < len(steps):
        if isinstance(backends.get(steps[k].backend), GraphBackend):
            end = k
            while end < len(steps) and steps[end].backend == steps[k].backend:
                end += 1
            runs.append((k, end))
            k = end
        else:
            k += 1
    if [(first, last + 1) for first, last, _ in partitions] != runs:
        raise SerializationError("payload's partitions do not match its graph-backend operations")
    program: list[Step] = []
    k = 0
    for (start, end), (_, _, artifact) in zip(runs, partitions):
        program.extend(steps[k:start])
        backend = backends.get(steps[start].backend)
        part = make_partition(model, steps, start, end, infos, keep)
        artifact = dec.value(artifact)
        try:
            executable = backend.load(part, artifact)
        except SerializationError:
            raise
        except Exception as e:  # noqa: BLE001 - a bad artifact is a cache miss, never a crash
            raise SerializationError(f"{backend.name} could not load operations {start}-{end - 1}: {e!r}") from e
        program.append(partition_step(backend, part, artifact, executable))
        k = end
    program.extend(steps[k:])
    return fuse(program, keep)  # fused steps are made again from the stored steps (hal.fusion)


def load_compiled(payload: bytes, arrays: list[np.ndarray],
                  backend_order: str | tuple[str, ...] | None = None) -> CompiledModel:
    """Rebuild a CompiledModel without re-running validation or prepare (the payload is trusted
    only after the cache verified its HMAC). Raises SerializationError on any inconsistency,
    among them a backend that changed, is missing or is not enabled by ``backend_order``
    (default: the process's preference)."""
    try:
        tree = json.loads(payload)
        if tree.get("format") != FORMAT_VERSION:
            raise SerializationError(f"payload format {tree.get('format')!r} != {FORMAT_VERSION}")
        model = _model_from_tree(tree["model"])
        declared = {e.name for e in model.extension_name_to_prefix}
        order = backends.parse_preference(backend_order) if backend_order is not None else backends.preference()
        identities = tree["backends"]
        if not isinstance(identities, dict) or not declared <= set(identities):
            raise SerializationError("payload's backend list does not cover its model's extensions")
        used = tuple(_check_backend(name, ident, order, declared) for name, ident in sorted(identities.items()))
        if tuple(tree["order"]) != order:
            # Another preference would have assigned the operations otherwise (a backend installed
            # since, or one no longer preferred): compile again rather than run a stale choice.
            raise SerializationError(f"compiled for backend preference {','.join(tree['order'])}, this service "
                                     f"prefers {','.join(order)}")
        by_name = {b.name: b for b in used}
        dec = _Decoder(arrays, used)
        trees = tree["subgraphs"]
        if not isinstance(trees, list) or len(trees) != len(model.referenced):
            raise SerializationError("payload's subgraph plans do not match the model's referenced subgraphs")
        subgraphs = Subgraphs(model, False, order) if model.referenced else None
        compiled = _load_plan(model, tree, dec, by_name, order, subgraphs)
        for k, sub in enumerate(trees):
            subgraphs.put(k, _load_plan(subgraphs.view(k), sub, dec, by_name, order, subgraphs))
    except SerializationError:
        raise
    except Exception as e:  # malformed JSON / structure: never trust, never crash
        raise SerializationError(f"invalid compiled-model payload: {e!r}") from e
    return compiled


def _load_plan(model: Model, tree: dict, dec: "_Decoder", by_name: dict[str, Backend], order: tuple[str, ...],
               subgraphs: Subgraphs | None) -> CompiledModel:
    """The CompiledModel of ``model``'s main subgraph (a referenced one's view) from its plan tree."""
    prefixes = model_prefixes(model)
    sg = model.main
    constants = {int(i): dec.value(ref) for i, ref in tree["constants"]}
    shapes = tree["shapes"]
    if len(shapes) != len(sg.operands) or not all(0 <= i < len(sg.operands) for i in constants):
        raise SerializationError("payload shapes/constants do not match the model")
    base, infos = [], []
    for i, op in enumerate(sg.operands):
        info = operand_info(i, op, constants.get(i), extension_dtype(op.type, prefixes))
        base.append(info)
        planned = tuple(shapes[i])
        # as compile_model does: the plan shares an operand's info unless inference changed its shape
        infos.append(info if planned == info.shape else dataclasses.replace(info, shape=planned))
    steps = []
    for s in tree["steps"]:
        k = s["index"]
        operation = sg.operations[k]
        spec = lookup_in_model(operation.type, prefixes)
        backend = by_name.get(s["backend"])
        if spec is None or backend is None:
            raise SerializationError(f"operation {k}: type {operation.type} or backend {s['backend']!r} "
                                     f"is not available")
        ext = extension_name(operation.type, prefixes)
        if backend.extension is not None and backend.extension != ext:
            raise SerializationError(f"operation {k}: backend {backend.name!r} cannot run it")
        if isinstance(backend, GraphBackend):  # a partition member: its partition runs it
            kernel = None if ext else backend.member_kernel
        else:  # a builtin backend may run an extension's operation too (Backend.register_extension_kernel)
            kernel = backend.kernel_for(operation.type & 0xFFFF if ext else operation.type, ext)
        if kernel is None:
            raise SerializationError(f"operation {k}: backend {backend.name!r} has no kernel for it")
        ctx = operation_context(k, operation, sg.operands, infos, model=model)
        ctx.output_shapes = [infos[o].shape for o in operation.outputs]
        ctx.backend = backend.name
        ctx.data = dec.value(s["data"])
        kernel = kernel.for_context(ctx)
        steps.append(Step(k, spec, kernel, ctx, step_inputs(operation, sg.operands), tuple(operation.outputs)))
    if len(steps) != len(sg.operations) or [s.index for s in steps] != list(range(len(sg.operations))):
        raise SerializationError("payload does not cover every operation in order")
    keep = frozenset(sg.output_indexes)
    if tree["partitions"] is None:  # a referenced subgraph whose partitions were never compiled
        def program() -> list[Step]:
            return make_plan(model, base, {}, order, subgraphs).program
        plan = Plan(steps, infos, keep=keep, make_program=program)
    else:
        plan = Plan(steps, infos, keep=keep, program=_program(model, steps, infos, tree["partitions"], dec))
    ready(plan)
    return CompiledModel(model=model, constants=constants, input_indexes=list(sg.input_indexes),
                         output_indexes=list(sg.output_indexes), base_infos=base, static_plan=plan,
                         backend_order=order, subgraphs=subgraphs)
