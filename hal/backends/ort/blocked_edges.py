"""The edges of the blocked layout: an NHWC value entering it or leaving it in one copy.

The lowering brings an NHWC value into NCHW with a Transpose and onnxruntime's NCHWc transformer
blocks that with a ReorderInput; a value leaving is reordered to NCHW and transposed back to NHWC
for its reader (a partition output, a RESHAPE). onnxruntime's reorders read and write NHWC
themselves (``channels_last``): one copy instead of two, each way. Measured here (a reorder in
and out around nothing): 32x32x64 47.9 -> 19.3 us, 96x96x16 107.6 -> 48.8 us, 112x112x32
612.6 -> 255.4 us. A partition that starts or ends inside a network pays this at its edges.
"""
from __future__ import annotations

import onnx
from onnx import helper

from hal.backends.ort.blocked_moves import NCHWC, _attr

_TO_NCHW = [0, 3, 1, 2]
_TO_NHWC = [0, 2, 3, 1]


def fuse_edge_transposes(graph) -> int:
    """Rewrite ``graph`` (onnxruntime's optimised one, NCHWc nodes in it) in place: a ReorderInput
    of Transpose(x, NHWC -> NCHW) reads x with ``channels_last``, and a Transpose(NCHW -> NHWC) of
    a ReorderOutput becomes that ReorderOutput with ``channels_last``. The nodes that nothing
    reads any more are dropped. Returns how many reorders were rewritten."""
    producer = {o: n for n in graph.node for o in n.output}
    fused = 0
    for node in graph.node:
        src = producer.get(node.input[0]) if node.input else None
        if src is None or node.domain not in (NCHWC, "", "ai.onnx"):
            continue
        if node.op_type == "ReorderInput" and node.domain == NCHWC and not _attr(node, "channels_last", 0) \
                and _is_transpose(src, _TO_NCHW):
            node.input[0] = src.input[0]
            _set(node, "channels_last", 1)
            fused += 1
        elif node.op_type == "Transpose" and node.domain in ("", "ai.onnx") and _is_transpose(node, _TO_NHWC) \
                and src.op_type == "ReorderOutput" and src.domain == NCHWC and not _attr(src, "channels_last", 0):
            node.op_type, node.domain = "ReorderOutput", NCHWC  # the Transpose, rewritten in place
            node.input[0] = src.input[0]
            del node.attribute[:]
            node.attribute.extend(a for a in src.attribute if a.name != "channels_last")
            _set(node, "channels_last", 1)
            fused += 1
    if fused:
        _drop_unread(graph)
    return fused


def _is_transpose(node, perm: list[int]) -> bool:
    return node.op_type == "Transpose" and node.domain in ("", "ai.onnx") and list(_attr(node, "perm", [])) == perm


def _set(node, name: str, value: int) -> None:
    for a in node.attribute:
        if a.name == name:
            a.i = value
            return
    node.attribute.append(helper.make_attribute(name, value))


def _drop_unread(graph) -> None:
    """Remove the nodes that nothing reads, directly or through others, and that are no graph output."""
    kept = live_nodes(list(graph.node), {o.name for o in graph.output})
    if len(kept) != len(graph.node):
        del graph.node[:]
        graph.node.extend(kept)


def live_nodes(nodes: list, needed: set[str]) -> list:
    """Copies of the nodes of ``nodes`` (each after its inputs' producers) whose outputs a name of
    ``needed`` or a kept node reads, in their order; ``needed`` gains every name they read."""
    kept = []
    for n in reversed(nodes):
        if any(o in needed for o in n.output):
            copy = onnx.NodeProto()
            copy.CopyFrom(n)
            kept.append(copy)
            needed.update(i for i in n.input if i)
    kept.reverse()
    return kept
