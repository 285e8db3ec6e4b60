"""validateModel / validateRequest, as NNAPI's runtime and HAL do them.

Structure is checked here (operand types, quantization rules, lifetimes, data
locations, index ranges, execution order, single writer), then every operation
by its spec's ``validate`` (hal/operations), with the declared shapes and no
tensor values, as AOSP's validateOperation does. An operation this driver has
no spec for is not invalid, only unsupported. Every failure is a
HalError(INVALID_ARGUMENT, message naming the culprit).
"""
from __future__ import annotations

import math

from hal import extension_registry
from hal.errors import HalError, check
from hal.model import Model, Operand, Operation, Request, Subgraph
from hal.operands import model_scalar_value, operation_context, validation_infos
from hal.quant import QUANT_RANGE
from hal.types import (
    NUMPY_DTYPE,
    OEM_OPERATION,
    SCALAR_TYPES,
    ErrorStatus,
    OperandLifeTime,
    OperandType,
    OperationType,
    decode_extension_type,
    is_extension_type,
    operation_name,
    type_name,
)

#: Upper bound on one operand's size. Protects the service from "huge dimensions" requests.
MAX_OPERAND_BYTES = 1 << 31
MAX_RANK = 8

_FLOAT_TENSORS = {OperandType.TENSOR_FLOAT32, OperandType.TENSOR_FLOAT16}
_NO_QUANT_TYPES = SCALAR_TYPES | _FLOAT_TENSORS | {OperandType.TENSOR_BOOL8}


def _bad(msg: str) -> HalError:
    return HalError(ErrorStatus.INVALID_ARGUMENT, msg)


def operand_byte_size(operand: Operand, dims=None) -> int | None:
    """Bytes an operand occupies, or None if its shape is not fully known or the type is opaque."""
    dims = operand.dimensions if dims is None else dims
    t = _OPERAND_TYPES.get(operand.type) if isinstance(operand.type, int) else None
    if t is None:
        return None
    if t == OperandType.SUBGRAPH:
        return 0
    if t in SCALAR_TYPES:
        return NUMPY_DTYPE[t].itemsize
    if any(d == 0 for d in dims):
        return None
    return NUMPY_DTYPE[t].itemsize * math.prod(dims)


def _validate_operand(model: Model, sg: Subgraph, i: int, op: Operand, where: str) -> None:
    name = f"{where}operand {i}"
    code = op.type
    if not isinstance(code, int):
        raise _bad(f"{name}: operand type must be an integer, got {code!r}")
    if is_extension_type(code):
        prefix, t = decode_extension_type(code)
        names = {e.prefix: e.name for e in model.extension_name_to_prefix}
        if prefix not in names:
            raise _bad(f"{name}: extension operand type {code} uses prefix {prefix}, which the "
                       f"model's extension_name_to_prefix does not declare")
        ext = extension_registry.extension(names[prefix])
        if ext is not None and t not in ext.operand_types:
            raise _bad(f"{name}: extension {names[prefix]!r} has no operand type {t}")
        dims = op.dimensions
        if any((not isinstance(d, int)) or d < 0 for d in dims) or len(dims) > MAX_RANK:
            raise _bad(f"{name}: dimensions must be at most {MAX_RANK} non-negative integers, got {list(dims)}")
        if ext is not None and not ext.operand_types[t].is_tensor and dims:
            raise _bad(f"{name}: extension {names[prefix]!r} operand type {t} is a scalar, got dimensions {list(dims)}")
        size = None
        if ext is not None and dims and 0 not in dims:
            size = ext.operand_types[t].dtype.itemsize * math.prod(dims)
        _validate_lifetime(model, i, op, None, name, size)
        return  # the extension's operations check values
    t = _OPERAND_TYPES.get(code)
    if t is None:
        raise _bad(f"{name}: unknown operand type {code}")
    dims = op.dimensions
    if any((not isinstance(d, int)) or d < 0 for d in dims):
        raise _bad(f"{name} ({t.name}): dimensions must be non-negative integers, got {list(dims)}")
    if len(dims) > MAX_RANK:
        raise _bad(f"{name} ({t.name}): rank {len(dims)} exceeds the maximum of {MAX_RANK}")
    if t in SCALAR_TYPES and dims:
        raise _bad(f"{name} ({t.name}): a scalar must have no dimensions, got {list(dims)}")
    size = operand_byte_size(op)
    if size is not None and size > MAX_OPERAND_BYTES:
        raise _bad(f"{name} ({t.name}): {list(dims)} needs {size} bytes, over the "
                   f"{MAX_OPERAND_BYTES}-byte limit")
    # Quantization parameters, per type (NNAPI validateOperandType).
    if not math.isfinite(op.scale):
        raise _bad(f"{name} ({t.name}): scale must be finite, got {op.scale}")
    if t in _NO_QUANT_TYPES:
        if op.scale != 0.0 or op.zero_point != 0:
            raise _bad(f"{name} ({t.name}): scale and zero_point must be 0, got "
                       f"scale={op.scale}, zero_point={op.zero_point}")
    elif t == OperandType.TENSOR_INT32:
        if op.scale < 0 or op.zero_point != 0:
            raise _bad(f"{name} (TENSOR_INT32): scale must be >= 0 and zero_point 0, got "
                       f"scale={op.scale}, zero_point={op.zero_point}")
    elif t == OperandType.TENSOR_QUANT8_SYMM_PER_CHANNEL:
        if op.scale != 0.0 or op.zero_point != 0:
            raise _bad(f"{name} ({t.name}): scale and zero_point must be 0 (scales are per channel)")
        cq = op.channel_quant
        if cq is None:
            raise _bad(f"{name} ({t.name}): missing per-channel quantization parameters")
        if not 0 <= cq.channel_dim < len(dims):
            raise _bad(f"{name} ({t.name}): channel_dim {cq.channel_dim} out of range for rank {len(dims)}")
        if dims[cq.channel_dim] and len(cq.scales) != dims[cq.channel_dim]:
            raise _bad(f"{name} ({t.name}): {len(cq.scales)} scales for dimension "
                       f"{cq.channel_dim} of size {dims[cq.channel_dim]}")
        if not all(math.isfinite(s) and s > 0 for s in cq.scales):
            raise _bad(f"{name} ({t.name}): every channel scale must be > 0")
    else:  # asymmetric / symmetric quantized tensors
        if op.scale <= 0:
            raise _bad(f"{name} ({t.name}): scale must be > 0, got {op.scale}")
        lo, hi = QUANT_RANGE[t]
        if t in (OperandType.TENSOR_QUANT8_SYMM, OperandType.TENSOR_QUANT16_SYMM):
            lo = hi = 0
        if not lo <= op.zero_point <= hi:
            raise _bad(f"{name} ({t.name}): zero_point must be in [{lo}, {hi}], got {op.zero_point}")
    if t != OperandType.TENSOR_QUANT8_SYMM_PER_CHANNEL and op.channel_quant is not None:
        raise _bad(f"{name} ({t.name}): per-channel parameters are only valid for "
                   f"TENSOR_QUANT8_SYMM_PER_CHANNEL")
    _validate_lifetime(model, i, op, t, name)


def _validate_lifetime(model: Model, i: int, op: Operand, t: OperandType | None, name: str,
                       extension_size: int | None = None) -> None:
    """Lifetime and location rules; ``t`` is None for an extension type (byte size: extension_size)."""
    lt = op.lifetime
    loc = op.location
    known = _LIFETIMES.get(lt) if isinstance(lt, int) else None
    if known is None:
        raise _bad(f"{name}: unknown lifetime {lt}")
    lt = known
    if loc.offset < 0 or loc.length < 0 or loc.pool_index < 0:
        raise _bad(f"{name}: location has a negative field ({loc})")
    if lt == OperandLifeTime.CONSTANT_COPY:
        if loc.pool_index != 0:
            raise _bad(f"{name}: CONSTANT_COPY location must use pool 0, got {loc.pool_index}")
        if loc.offset + loc.length > len(model.operand_values):
            raise _bad(f"{name}: CONSTANT_COPY data [{loc.offset}, {loc.offset + loc.length}) is "
                       f"outside operand_values of {len(model.operand_values)} bytes")
    elif lt == OperandLifeTime.CONSTANT_POOL:
        if loc.pool_index >= len(model.pools):
            raise _bad(f"{name}: CONSTANT_POOL uses pool {loc.pool_index}, but the model has "
                       f"{len(model.pools)} pools")
        pool_len = memoryview(model.pools[loc.pool_index]).nbytes
        if loc.offset + loc.length > pool_len:
            raise _bad(f"{name}: CONSTANT_POOL data [{loc.offset}, {loc.offset + loc.length}) is "
                       f"outside pool {loc.pool_index} of {pool_len} bytes")
    elif lt == OperandLifeTime.SUBGRAPH:
        if t != OperandType.SUBGRAPH:
            raise _bad(f"{name}: SUBGRAPH lifetime requires type SUBGRAPH, got {type_name(op.type)}")
        if loc.pool_index != 0 or loc.length != 0:
            raise _bad(f"{name}: a SUBGRAPH reference must have pool_index 0 and length 0, got {loc}")
        if loc.offset >= len(model.referenced):
            raise _bad(f"{name}: references subgraph {loc.offset}, but the model has "
                       f"{len(model.referenced)}")
    elif lt == OperandLifeTime.POINTER:
        raise _bad(f"{name}: POINTER lifetime cannot cross a process boundary")
    else:
        if (loc.pool_index, loc.offset, loc.length) != (0, 0, 0):
            raise _bad(f"{name}: {lt.name} operand must have an empty location, got {loc}")
    if t == OperandType.SUBGRAPH and lt != OperandLifeTime.SUBGRAPH:
        raise _bad(f"{name}: type SUBGRAPH requires lifetime SUBGRAPH, got {lt.name}")
    if t is None:  # extension type: the size is the extension's business when it is unknown here
        if lt in (OperandLifeTime.CONSTANT_COPY, OperandLifeTime.CONSTANT_POOL) and extension_size is not None \
                and loc.length != extension_size:
            raise _bad(f"{name}: constant has {loc.length} bytes, {list(op.dimensions)} needs {extension_size}")
        return
    if lt in (OperandLifeTime.CONSTANT_COPY, OperandLifeTime.CONSTANT_POOL):
        expected = operand_byte_size(op)
        if expected is None:
            raise _bad(f"{name} ({t.name}): a constant must have fully specified dimensions, "
                       f"got {list(op.dimensions)}")
        if loc.length != expected:
            raise _bad(f"{name} ({t.name}): constant has {loc.length} bytes, "
                       f"{list(op.dimensions)} needs {expected}")


def _validate_subgraph(model: Model, sg: Subgraph, where: str) -> None:
    n = len(sg.operands)
    for i, op in enumerate(sg.operands):
        _validate_operand(model, sg, i, op, where)

    def check_index(idx: int, what: str) -> None:
        if not isinstance(idx, int) or not 0 <= idx < n:
            raise _bad(f"{where}{what} refers to operand {idx}, but there are {n} operands")

    for k, idx in enumerate(sg.input_indexes):
        check_index(idx, f"model input {k}")
        lt = sg.operands[idx].lifetime
        if lt != OperandLifeTime.SUBGRAPH_INPUT:
            raise _bad(f"{where}model input {k} (operand {idx}) must have lifetime SUBGRAPH_INPUT, "
                       f"got {OperandLifeTime(lt).name}")
    for k, idx in enumerate(sg.output_indexes):
        check_index(idx, f"model output {k}")
        lt = sg.operands[idx].lifetime
        if lt != OperandLifeTime.SUBGRAPH_OUTPUT:
            raise _bad(f"{where}model output {k} (operand {idx}) must have lifetime SUBGRAPH_OUTPUT, "
                       f"got {OperandLifeTime(lt).name}")
    for what, idxs, lt in (("input", sg.input_indexes, OperandLifeTime.SUBGRAPH_INPUT),
                           ("output", sg.output_indexes, OperandLifeTime.SUBGRAPH_OUTPUT)):
        listed = list(idxs)
        if len(set(listed)) != len(listed):
            raise _bad(f"{where}an operand is listed twice among the model {what}s: {listed}")
        for i, op in enumerate(sg.operands):
            if op.lifetime == lt and i not in set(listed):
                raise _bad(f"{where}operand {i} has lifetime {lt.name} but is not a model {what}")

    written_by: dict[int, int] = {}
    for k, operation in enumerate(sg.operations):
        opname = f"{where}operation {k} ({operation_name(operation.type)})"
        if is_extension_type(operation.type):
            prefix, t = decode_extension_type(operation.type)
            names = {e.prefix: e.name for e in model.extension_name_to_prefix}
            if prefix not in names:
                raise _bad(f"{opname}: extension prefix {prefix} is not declared by the model")
            ext = extension_registry.extension(names[prefix])
            if ext is not None and t not in ext.operations:
                raise _bad(f"{opname}: extension {names[prefix]!r} has no operation type {t}")
        elif operation.type not in _KNOWN_OPERATIONS:
            raise _bad(f"{opname}: unknown operation type {operation.type}")
        for role, idxs in (("input", operation.inputs), ("output", operation.outputs)):
            for j, idx in enumerate(idxs):
                check_index(idx, f"{opname}: {role} {j}")
        for j, idx in enumerate(operation.outputs):
            lt = sg.operands[idx].lifetime
            if lt not in (OperandLifeTime.TEMPORARY_VARIABLE, OperandLifeTime.SUBGRAPH_OUTPUT):
                raise _bad(f"{opname}: output {j} (operand {idx}) has lifetime "
                           f"{OperandLifeTime(lt).name}; an operation can only write "
                           f"TEMPORARY_VARIABLE or SUBGRAPH_OUTPUT operands")
            if idx in written_by:
                raise _bad(f"{opname}: output {j} (operand {idx}) is already written by "
                           f"operation {written_by[idx]}")
            written_by[idx] = k
    # Execution order: every input is available before the operation runs (implies acyclic).
    ready = set()
    for k, operation in enumerate(sg.operations):
        for j, idx in enumerate(operation.inputs):
            lt = sg.operands[idx].lifetime
            if lt in (OperandLifeTime.TEMPORARY_VARIABLE, OperandLifeTime.SUBGRAPH_OUTPUT) \
                    and idx not in ready:
                opname = f"{where}operation {k} ({operation_name(operation.type)})"
                if idx in written_by:
                    raise _bad(f"{opname}: input {j} (operand {idx}) is read before operation "
                               f"{written_by[idx]} writes it: operations must be in execution "
                               f"order and the graph acyclic")
                raise _bad(f"{opname}: input {j} (operand {idx}) is never written")
        ready.update(operation.outputs)
    for i, op in enumerate(sg.operands):
        if op.lifetime in (OperandLifeTime.TEMPORARY_VARIABLE, OperandLifeTime.SUBGRAPH_OUTPUT) \
                and i not in written_by:
            if op.lifetime == OperandLifeTime.SUBGRAPH_OUTPUT:
                raise _bad(f"{where}operand {i} is a model output but no operation writes it")
            raise _bad(f"{where}operand {i} is never written (TEMPORARY_VARIABLE without a writer)")


#: Enum lookups by dict (an enum call per operand dominated validation of big models).
_OPERAND_TYPES = {int(t): t for t in OperandType}
_LIFETIMES = {int(t): t for t in OperandLifeTime}
_KNOWN_OPERATIONS = frozenset(int(t) for t in OperationType) | {OEM_OPERATION}


def validate_model(model: Model) -> None:
    """Structural validation of a whole model. Raises HalError(INVALID_ARGUMENT)."""
    check(isinstance(model, Model), f"expected a Model, got {type(model).__name__}")
    if not model.main.operations or not model.main.operands:
        raise _bad("invalid empty model: it needs at least one operand and one operation")
    names, prefixes = set(), set()
    for e in model.extension_name_to_prefix:
        if e.name in names:
            raise _bad(f"extension {e.name!r} is declared twice")
        if e.prefix in prefixes:
            raise _bad(f"extension prefix {e.prefix} is assigned twice")
        if not 0 < e.prefix < (1 << 15):
            raise _bad(f"extension {e.name!r}: prefix {e.prefix} out of range [1, 32767]")
        names.add(e.name)
        prefixes.add(e.prefix)
    for e in model.extension_name_to_prefix:
        if extension_registry.extension(e.name) is None:
            raise _bad(f"unknown extension {e.name!r}: not registered with this driver")
    _validate_subgraph(model, model.main, "")
    for k, sg in enumerate(model.referenced):
        _validate_subgraph(model, sg, f"referenced subgraph {k}: ")
    _check_no_reference_cycles(model)
    prefixes = extension_registry.model_prefixes(model)
    scalars = model_scalar_value(model)
    for n, sg in enumerate([model.main, *model.referenced]):
        infos = validation_infos(sg.operands, prefixes, scalars)
        for k, operation in enumerate(sg.operations):
            try:
                validate_operation(k, operation, sg.operands, infos, prefixes, model)
            except HalError as e:
                if n:
                    raise HalError(e.status, f"referenced subgraph {n - 1}: {e.message}") from None
                raise


def _check_no_reference_cycles(model: Model) -> None:
    """A subgraph may not reach itself through SUBGRAPH operands (AOSP's checkNoReferenceCycles):
    an IF or WHILE would otherwise nest forever."""
    refs = [sorted({op.location.offset for op in sg.operands if op.lifetime == OperandLifeTime.SUBGRAPH})
            for sg in model.referenced]
    state = [0] * len(refs)  # 0 unvisited, 1 on the current path, 2 done
    for start in range(len(refs)):
        stack = [(start, iter(refs[start]))]
        if state[start]:
            continue
        state[start] = 1
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                state[node] = 2
                stack.pop()
            elif state[child] == 1:
                raise _bad(f"referenced subgraph {child} references itself (through subgraphs "
                           f"{' -> '.join(str(n) for n, _ in stack)} -> {child}): control flow cannot nest forever")
            elif state[child] == 0:
                state[child] = 1
                stack.append((child, iter(refs[child])))


def validate_operation(k: int, operation: Operation, operands: list[Operand], infos: list,
                       prefixes: dict[int, str], model: Model | None = None) -> None:
    """Operation k's own rules (its spec's validate). An operation without a spec here is left
    alone: unsupported by this driver is not invalid. ``model``: the whole model, which IF and
    WHILE need (their subgraphs)."""
    spec = extension_registry.lookup_in_model(operation.type, prefixes)
    if spec is None:
        return
    ctx = operation_context(k, operation, operands, infos, validating=True, model=model)
    try:
        spec.run_validate(ctx)
    except HalError:
        raise
    except Exception as e:  # a bug or an input nobody foresaw: still a clean error
        raise HalError(ErrorStatus.INVALID_ARGUMENT, f"{ctx.name}: cannot validate: {e!r}") from e


def _arg_bad(what: str, k: int, idx: int, operand: Operand, msg: str) -> HalError:
    """Error for request argument k; the name is only built when something is wrong (hot path)."""
    return _bad(f"request {what} {k} (operand {idx}, {type_name(operand.type)}): {msg}")


def validate_request(request: Request, model: Model) -> None:
    """validateRequest: argument counts, pool ranges, lengths, dimension overrides."""
    sg = model.main
    for what, args, idxs in (("input", request.inputs, sg.input_indexes),
                             ("output", request.outputs, sg.output_indexes)):
        if len(args) != len(idxs):
            raise _bad(f"request has {len(args)} {what}s, the model has {len(idxs)}")
        for k, (arg, idx) in enumerate(zip(args, idxs)):
            operand = sg.operands[idx]
            if arg.has_no_value:
                if what == "output":
                    raise _arg_bad(what, k, idx, operand, "outputs cannot be omitted")
                continue
            loc = arg.location
            if loc.pool_index < 0 or loc.offset < 0 or loc.length < 0:
                raise _arg_bad(what, k, idx, operand, f"location has a negative field ({loc})")
            if loc.pool_index >= len(request.pools):
                raise _arg_bad(what, k, idx, operand,
                               f"uses pool {loc.pool_index}, the request has {len(request.pools)}")
            pool = memoryview(request.pools[loc.pool_index])
            pool_len = pool.nbytes
            if what == "output" and pool.readonly:
                raise _arg_bad(what, k, idx, operand, f"pool {loc.pool_index} is read-only")
            if loc.offset + loc.length > pool_len:
                raise _arg_bad(what, k, idx, operand, f"[{loc.offset}, {loc.offset + loc.length}) is outside pool "
                           f"{loc.pool_index} of {pool_len} bytes")
            dims = tuple(arg.dimensions)
            if any((not isinstance(d, int)) or d < 0 for d in dims):
                raise _arg_bad(what, k, idx, operand, f"dimensions must be non-negative integers, got {list(dims)}")
            decl = operand.dimensions
            if dims:
                if decl and len(dims) != len(decl):
                    raise _arg_bad(what, k, idx, operand, f"rank {len(dims)} differs from the model's {len(decl)}")
                for a, (d, r) in enumerate(zip(decl, dims)):
                    if d and r != d:
                        raise _arg_bad(what, k, idx, operand, f"dimension {a} is {r}, the model says {d}")
            full = dims or decl
            if what == "input":
                if operand.type not in SCALAR_TYPES and (not full or 0 in full):
                    raise _arg_bad(what, k, idx, operand, f"input dimensions must be fully specified, got {list(full)}")
                size = operand_byte_size(operand, full)
                if size is not None and size > MAX_OPERAND_BYTES:
                    raise _arg_bad(what, k, idx, operand, f"{list(full)} needs {size} bytes, over the limit")
                if size is not None and loc.length != size:
                    raise _arg_bad(what, k, idx, operand, f"{loc.length} bytes given, {list(full)} needs {size}")
