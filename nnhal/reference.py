"""The tools' reference: TFLite's kernels, and nnhal's reference backend for the CUSTOM ops TFLite
has no kernel for.

inference_diff (and its --dump-dir) compares the delegate with a reference. TFLite's kernels are
that reference wherever TFLite has one: every builtin op, and the custom ops its resolver registers
(LiteRT's Convolution2DTransposeBias, TFLite_Detection_PostProcess). A CUSTOM op that only an
nnhal extension implements (MediaPipe's Landmarks2TransformMatrix, ...) has no TFLite kernel, so
for those nodes, and only those, the reference interpreter takes an nnhal delegate restricted to
them (``partitions``) whose service is a private ``nnhal serve --backend reference --no-cache``
(delegate.embedded.reference_address): hal's reference executor, the oracle the fast backends are
tested against, running the extension's kernel, which defines the op (the extension's own tests
check it against independent references). The service under test is not part of the reference:
not its backends, its compilation cache or its transport; and the reference never falls back to
running in-process with this process's backends.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from delegate import load_delegate
from delegate.embedded import reference_address
from delegate.tfl import read_model
from extensions.plugins import ensure_plugins_loaded
from extensions.registry import by_custom_code


def custom_codes(model_file: str, graph=None) -> set[str]:
    """Every custom code of the model's CUSTOM nodes (all subgraphs); ``graph``: the file, read."""
    if graph is None:
        graph = _read(model_file)
    return {n.custom_code for g in graph.subgraphs for n in g.nodes if n.custom_code}


def _read(model_file: str):
    with open(model_file, "rb") as f:
        return read_model(f.read())


def unresolved_custom_op(error: BaseException | str, codes: set[str]) -> str | None:
    """The code among ``codes`` that TFLite's error says it has no kernel for ("Encountered
    unresolved custom op: X."), or None for any other error."""
    text = " ".join(str(error).split())
    named = [c for c in codes if f"unresolved custom op: {c}." in text or text.endswith(f"unresolved custom op: {c}")]
    return max(named, key=len, default=None)  # a code that is a prefix of another (a.b vs a.b.c): the longer


@dataclass
class Reference:
    """The reference interpreter, and the oracle delegate running the custom ops TFLite could not."""

    interpreter: object
    oracle: object | None = None  # delegate.simple.PythonDelegate
    oracle_codes: list[str] = field(default_factory=list)

    @property
    def oracle_nodes(self) -> list[int]:
        return sorted(n for p in self.oracle.report.partitions for n in p) if self.oracle else []

    def hidden_tensors(self) -> set[int]:
        """Tensors written inside an oracle partition that are not its outputs: TFLite never holds
        their values, so they have none to compare with."""
        if self.oracle is None:
            return set()
        kernels = [k for k in self.oracle.impl.kernels if not k.freed]
        written = {t for k in kernels for n in k.params.nodes for t in k.graph.nodes[n].outputs}
        return written - {t for k in kernels for t in k.params.outputs}


def reference_interpreter(model_file: str, build: Callable[[list | None], object]) -> Reference:
    """``build(delegates)``: the caller's allocated interpreter (its resolver, threads, shapes),
    first with TFLite alone. Each custom op TFLite then reports unresolved that an installed
    extension implements goes to the oracle, and the interpreter is built again, until it loads.
    A custom op no extension implements, or one the oracle did not take, is the error it was."""
    ensure_plugins_loaded()
    graph = _read(model_file)
    codes = custom_codes(model_file, graph)
    chosen: list[str] = []
    oracle = None
    while True:
        try:
            return Reference(build([oracle] if oracle is not None else None), oracle, list(chosen))
        except (RuntimeError, ValueError) as e:
            code = unresolved_custom_op(e, codes)
            if code is None or by_custom_code(code) is None:
                raise
            if code in chosen:
                raise ValueError(f"{' '.join(str(e).split())}; the reference cannot run it either: "
                                 f"{_not_taken(oracle, graph, code)}") from None
            chosen.append(code)
            nodes = [n.index for n in graph.nodes if n.custom_code in chosen]
            if not nodes:
                raise ValueError(f"{' '.join(str(e).split())}; the reference cannot run it either: custom op "
                                 f"{code!r} is only in a subgraph other than the first, where the reference "
                                 f"delegates nothing") from None
            # Only these nodes (partitions); every one of them (largest, unlimited); a failure is an
            # error, never a run on this process's backends.
            oracle = load_delegate(reference_address(), partitions=",".join(map(str, nodes)),
                                   partitioning="largest", max_delegated_partitions=0, min_nodes_per_partition=1,
                                   allow_in_process_fallback=False)


def _not_taken(oracle, graph, code: str) -> str:
    """Why the oracle left the nodes with custom code ``code`` to TFLite."""
    reasons = [f"node {n.index}: {n.reason}" for n in oracle.report.nodes
               if n.placement != "nnhal" and n.index < len(graph.nodes) and graph.nodes[n.index].custom_code == code]
    return "; ".join(reasons) or (f"nnhal's reference service did not run custom op {code!r} (the reference "
                                  f"delegates only in the first subgraph)")
