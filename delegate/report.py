"""`nnhal report`: which node of a .tflite model runs where, and why not on nnhal."""
from __future__ import annotations

import dataclasses
import json
import math
import resource

from delegate.delegation_report import DelegationReport
from delegate.nnhal_delegate import load_delegate


def delegation_report(model_path: str, service_address: str | None = None, **options) -> DelegationReport:
    """Load the model in TFLite with the nnhal delegate and return what the delegate decided.

    A model TFLite cannot load raises ValueError in one line: for CUSTOM ops nobody claimed, what
    would run each (custom_op_hints); for tensors that cannot be allocated, which (allocation_error)."""
    from delegate.runtime import Interpreter
    d = load_delegate(service_address, **options)
    try:
        it = Interpreter(model_path=model_path, experimental_delegates=[d])
        it.allocate_tensors()
    except MemoryError as e:  # tflite_runtime: std::bad_alloc
        raise ValueError(allocation_error(model_path, e)) from None
    except (RuntimeError, ValueError) as e:
        text = " ".join(str(e).split())
        if not text:  # LiteRT fails an allocation without a message
            raise ValueError(allocation_error(model_path, e)) from None
        hint = custom_op_hints(model_path)
        raise ValueError(text + (f"; {hint}" if hint else "")) from None
    d.impl.fetch_backends()
    return d.report


def custom_op_hints(model_path: str) -> str:
    """What runs each CUSTOM op of the model: an installed extension, through the nnhal delegate;
    else the pip command of the extension nnhal knows provides it; else nothing."""
    from delegate.mapping.core import custom_provider
    from delegate.tfl import read_model
    from extensions import ensure_plugins_loaded
    from extensions.registry import installable_for
    ensure_plugins_loaded()
    try:
        with open(model_path, "rb") as f:
            graph = read_model(f.read())
    except (OSError, ValueError):
        return ""
    hints = []
    for code in sorted({n.custom_code for g in graph.subgraphs for n in g.nodes if n.custom_code}):
        found = custom_provider(type("N", (), {"custom_code": code})())
        known = installable_for(code)
        if found is not None:
            hints.append(f"custom op {code!r} is provided by extension {found[0].name} (installed): TFLite has no "
                         f"kernel for it, the nnhal delegate runs it on an nnhal service")
        elif known is not None:
            hints.append(f"custom op {code!r} is provided by extension {known.extension}, not installed: "
                         f"{known.pip_command()}")
        else:
            hints.append(f"custom op {code!r}: no installed nnhal extension implements it")
    return "; ".join(hints)


def allocation_error(model_path: str, error: BaseException) -> str:
    """One line for a failed allocation: a MemoryError (TFLite's std::bad_alloc, numpy's "Unable to
    allocate"), or a TFLite error without a message (how LiteRT fails one): the largest tensor and
    the memory there is."""
    biggest = max(tensor_sizes(model_path), default=None, key=lambda t: t[0])
    if isinstance(error, MemoryError):
        text = " ".join(str(error).split())
        cause = "cannot allocate" + (f" ({text})" if text and text != "std::bad_alloc" else "")
        needs = f"{biggest[1]} needs {human_bytes(biggest[0])}: " if biggest else ""
        return f"{needs}{cause}; {_memory_text()}"
    largest = f"; the largest tensor, {biggest[1]}, needs {human_bytes(biggest[0])}" if biggest else ""
    return f"TFLite failed without a message, as it does when it cannot allocate{largest}; {_memory_text()}"


def memory_error(model_path: str, shapes: dict[int, tuple[int, ...]] | None = None) -> str | None:
    """Why the model cannot run on this machine before trying, or None: a tensor larger than all its
    memory (RAM and swap). Allocating it would fail (TFLite, numpy) or be killed by the OOM killer."""
    limit = machine_memory()
    if limit is None:
        return None
    too_big = [t for t in tensor_sizes(model_path, shapes) if t[0] > limit]
    if not too_big:
        return None
    size, what = max(too_big, key=lambda t: t[0])
    return f"{what} needs {human_bytes(size)}: cannot allocate; {_memory_text()}"


def tensor_sizes(model_path: str, shapes: dict[int, tuple[int, ...]] | None = None) -> list[tuple[int, str]]:
    """(bytes, "tensor 3 ('name', [1, 8] float32)") of every tensor of every subgraph whose type has a
    fixed size; ``shapes``: subgraph 0's tensors as resized (--input_layer_shape), by index."""
    from delegate.tfl import read_model
    from delegate.tfl.schema import TENSOR_DTYPE
    try:
        with open(model_path, "rb") as f:
            graph = read_model(f.read())
    except (OSError, ValueError):
        return []
    sizes = []
    for k, g in enumerate(graph.subgraphs):
        for t in g.tensors:
            dtype = TENSOR_DTYPE.get(t.type)
            if dtype is None:  # strings, int4, resources: not sized by their shape
                continue
            shape = (shapes or {}).get(t.index, t.shape) if k == 0 else t.shape
            where = f"subgraph {k} tensor {t.index}" if k else f"tensor {t.index}"
            sizes.append((math.prod(shape) * dtype.itemsize, f"{where} ({t.name!r}, {list(shape)} {dtype.name})"))
    return sizes


def machine_memory() -> int | None:
    """Bytes of RAM plus swap (/proc/meminfo), None where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            info = {k: v for k, _, v in (line.partition(":") for line in f)}
        return sum(int(info[k].split()[0]) * 1024 for k in ("MemTotal", "SwapTotal"))
    except (OSError, KeyError, ValueError, IndexError):
        return None


def _memory_text() -> str:
    """The machine's memory, and this process's address-space limit where one is set (ulimit -v)."""
    total = machine_memory()
    text = "this machine's memory is unknown" if total is None else \
        f"this machine has {human_bytes(total)} of memory (RAM and swap)"
    limit, _ = resource.getrlimit(resource.RLIMIT_AS)
    return text if limit == resource.RLIM_INFINITY else f"{text}; this process may use {human_bytes(limit)} (ulimit -v)"


def human_bytes(n: int) -> str:
    """960000000000 -> "894 GiB" (three significant digits)."""
    value = float(n)
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "ZiB", "YiB"):
        if value < 1024 or unit == "YiB":
            break
        value /= 1024
    return f"{n} bytes" if unit == "bytes" else f"{value:.3g} {unit}"


def format_report(r: DelegationReport) -> str:
    lines = [f"{'node':>5}  {'op':<24} {'placement':<9} {'partition':>9}  {'backend':<10}  reason"]
    for n in r.nodes:
        part = "" if n.partition is None else str(n.partition)
        lines.append(f"{n.index:>5}  {n.op:<24} {n.placement:<9} {part:>9}  {n.backend or '':<10}  {n.reason or ''}")
    lines.append(f"{r.delegated}/{len(r.nodes)} nodes delegated in {len(r.partitions)} partition(s)"
                 + (f" to {r.service}" if r.service else "") + (f"; {r.error}" if r.error else ""))
    lines += format_candidates(r.candidates)
    for k, sub in sorted(r.subgraphs.items()):  # IF / WHILE subgraphs TFLite runs itself
        lines.append(f"subgraph {k}: {sub.delegated}/{len(sub.nodes)} nodes delegated in {len(sub.partitions)} "
                     f"partition(s)" + "".join(f"; node {n.index} {n.op}: {n.reason}" for n in sub.nodes
                                               if n.placement != "nnhal"))
    return "\n".join(lines)


def report_json(r: DelegationReport) -> str:
    d = dataclasses.asdict(r)
    d["delegated"] = r.delegated
    return json.dumps(d, indent=1)


def _ranges(nodes: list[int]) -> str:
    """[0, 1, 2, 5] -> "0-2,5"."""
    out: list[str] = []
    for n in sorted(nodes):
        if out and n == int(out[-1].split("-")[-1]) + 1:
            out[-1] = f"{out[-1].split('-')[0]}-{n}"
        else:
            out.append(str(n))
    return ",".join(out)


def format_candidates(candidates) -> list[str]:
    """One line per partition candidate: its estimate (delegate.cost) and the decision."""
    if not candidates:
        return []
    lines = ["partition candidates (estimated us: CPU | nnhal = compute and per-node dispatch + invoke + transfer):"]
    for e in candidates:
        lines.append(f"  nodes {_ranges(e.nodes)} ({len(e.nodes)}): CPU {e.cpu_us:.1f} | nnhal {e.nnhal_us:.1f} = "
                     f"{e.compute_us:.1f} + {e.overhead_us:.1f} + {e.transfer_us:.1f} ({e.transfer_bytes} bytes)"
                     f" -> {e.reason}")
    return lines
