"""Element-wise operations between NCHWc convolutions kept in the blocked layout: a pass over the
graph onnxruntime optimised.

onnxruntime's NCHWc transformer keeps Conv, pooling, Add (fused into a convolution as its Sum),
Concat and Relu/Sigmoid/Tanh in the blocked layout ([N, C/B, H, W, B], B the CPU's block size) and
reorders to NCHW around everything else: a PReLU residual block (Conv -> Add shortcut -> Max(x,
x * alpha) -> Conv) became ReorderOutput, Add, Mul, Max, ReorderInput, three of those five passes
only moving data (40% of a face-landmark-style network's non-convolution time). An element-wise
operation is layout-free as long as its constants are laid out as its inputs are, so here such
operations run on a view of the blocked tensor itself ([N, C/B, H, W * B], a Reshape: no copy)
with their constants permuted to match, once: the values computed are the same, element for
element, as in NCHW. Per-channel constants become [1, C/B, 1, W * B] rows (onnxruntime's
broadcast runs a whole row at a time; a [.., B] innermost span would be one call per B elements).
A channel Pad / Concat (a widened shortcut) pads or joins whole blocks. An Add of a convolution's
single-use output and another blocked value is then that convolution's Sum, as the transformer
fuses it when both sides were convolutions, and a Relu / Clip after it the convolution's
activation (applied after the Sum; a RELU6 ADD of a pose-style network). Pooling, and a bilinear
resize's row and column Gathers and H/W swaps, run on the blocked tensor too (blocked_moves.py). A
value something else reads (a graph output, a Reshape) is reordered to NCHW where it is read.

A value whose channels are not whole blocks (24 of a pose-style stem, BlazeFace's 28, 42, 88)
holds zeros in its padding channels: onnxruntime pads filters and biases with zeros, and its
convolutions read those channels times zero filters. Such a value is viewed only where they are
known to be zero (a ReorderInput; a convolution, pool or Sum of such values; an activation that
keeps zero), through operations that keep them zero (zero-keeping element-wise operators, whose
constants, scalars included, get zeros there), and a channel Pad or Concat fills after it only
with zeros: the padding channels become channels there.
"""
from __future__ import annotations

import functools
import heapq
import os
import tempfile
from collections import defaultdict

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

from hal.backends.ort.blocked_edges import fuse_edge_transposes, live_nodes
from hal.backends.ort.blocked_moves import _POOLS, NCHWC, BlockedMoves, _attr, _swap

#: Element-wise operators computed on the blocked view: every input is a value of the output's
#: shape or a constant that broadcasts to it.
ELEMENTWISE = frozenset({"Add", "Sub", "Mul", "Div", "Max", "Min", "Where", "Greater", "Less", "GreaterOrEqual",
                         "LessOrEqual", "Equal", "Relu", "Clip", "Sigmoid", "Tanh", "Neg", "Abs", "Identity"})

#: Activations of onnxruntime's NCHWc Conv that map zero to zero (Clip: when its bounds hold zero).
_ZERO_ACTIVATIONS = frozenset({"Relu", "HardSwish", "LeakyRelu", "Tanh"})
#: Element-wise operators that compute zero where every input is zero (finite constants): on a
#: value whose channels are not whole blocks they keep the padding channels zero (Clip: when its
#: bounds hold zero).
_ZERO_KEEPING = frozenset({"Add", "Sub", "Mul", "Max", "Min", "Relu", "Tanh", "Neg", "Abs", "Identity"})
def _zero_in(bounds) -> bool:
    """Whether Clip bounds ``bounds`` ([min, max], either may be missing) keep zero as it is."""
    lo, hi = (list(bounds) + [None, None])[:2]
    return (lo is None or lo <= 0) and (hi is None or hi >= 0)


@functools.cache
def block_size() -> int | None:
    """The NCHWc block size onnxruntime uses on this CPU (the padded output channels of a
    one-channel convolution), None when it does not reorder to NCHWc."""
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 3, 4, 4])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 1, 4, 4])
    w = numpy_helper.from_array(np.ones((1, 3, 1, 1), np.float32), "w")
    b = numpy_helper.from_array(np.zeros(1, np.float32), "b")
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w", "b"], ["y"])], "probe", [x], [y], [w, b])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.log_severity_level = 3
    with tempfile.TemporaryDirectory(prefix="nnhal-ort-probe-") as folder:
        so.optimized_model_filepath = os.path.join(folder, "probe.onnx")
        ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        optimised = onnx.load(so.optimized_model_filepath)
    conv = [n for n in optimised.graph.node if n.op_type == "Conv" and n.domain == NCHWC]
    if not conv:
        return None
    inits = {t.name: t for t in optimised.graph.initializer}
    bias = inits.get(conv[0].input[2]) if len(conv[0].input) > 2 else None
    return int(bias.dims[0]) if bias is not None and bias.dims[0] > 1 else None


class _Rewrite(BlockedMoves):
    def __init__(self, model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]], block: int, value):
        self.graph = model.graph
        self.value = value
        self.shapes = shapes
        self.b = block
        self.inits = {t.name: t for t in self.graph.initializer}
        #: the graph's nodes (one Python object each for the whole pass: compared by identity)
        self.nodes = list(self.graph.node)
        self.producer = {o: n for n in self.nodes for o in n.output}
        self.readers: dict[str, list] = defaultdict(list)
        for n in self.nodes:
            for i in n.input:
                self.readers[i].append(n)
        self.outputs = {o.name for o in self.graph.output}
        #: NCHW value name -> its blocked view's name ([N, C/B, H, W*B])
        self.view: dict[str, str] = {}
        #: NCHW value name -> the blocked view of that value with H and W swapped ([N, C/B, W, H*B])
        self.swapped: dict[str, str] = {}
        #: views that hold a value and its swap (of H and W) both
        self.aliased: set[str] = set()
        self.added: list = []
        self.dropped: set[int] = set()
        self._count = 0
        self._const_cache: dict[tuple, str] = {}
        self._four: dict[str, str] = {}
        #: NCHW values viewed through the ReorderInput that reads them (``twin_view``)
        self.twins: set[str] = set()

    def fresh(self, hint: str) -> str:
        self._count += 1
        return f"blocked_{hint}_{self._count}"

    def const(self, value: np.ndarray, hint: str) -> str:
        name = self.fresh(hint)
        t = numpy_helper.from_array(np.ascontiguousarray(value), name)
        self.graph.initializer.append(t)
        self.inits[name] = t
        return name

    def shape_const(self, dims) -> str:
        key = ("shape", tuple(dims))
        if key not in self._const_cache:
            self._const_cache[key] = self.const(np.asarray(dims, np.int64), "shape")
        return self._const_cache[key]

    def add(self, op: str, inputs, outputs=None, domain: str = "", **attrs) -> str:
        outputs = outputs or [self.fresh(op.lower())]
        self.added.append(helper.make_node(op, list(inputs), outputs, domain=domain or None, **attrs))
        return outputs[0]

    def viewable(self, name: str) -> tuple[int, int, int, int] | None:
        s = self.shapes.get(name)
        if s is None or len(s) != 4 or any(not isinstance(d, int) or d <= 0 for d in s):
            return None
        return s

    def blocks(self, c: int) -> int:
        return -(-c // self.b)

    def view_dims(self, s) -> list[int]:
        n, c, h, w = s
        return [n, self.blocks(c), h, w * self.b]

    def four_dims(self, s) -> list[int]:
        """NCHW shape ``s`` as the 4-D NCHWc tensor onnxruntime's operators read (channels padded)."""
        n, c, h, w = s
        return [n, self.blocks(c) * self.b, h, w]

    # ---- constants -------------------------------------------------------------------------
    def constant(self, name: str) -> np.ndarray | None:
        t = self.inits.get(name)
        if t is None:
            return None
        return self.value(t) if t.data_location == onnx.TensorProto.EXTERNAL else numpy_helper.to_array(t)

    def blocked_const(self, name: str, s, swap: bool = False) -> str | None:
        """Constant ``name`` (broadcasting to NCHW shape ``s``) laid out as the view of ``s``
        (``swap``: of ``s`` with H and W swapped)."""
        v = self.constant(name)
        if v is None:
            return None
        if v.size == 1 and s[1] % self.b == 0:
            return name  # a scalar broadcasts the same in any layout (with no padding channels to keep at zero)
        if v.ndim > 4:
            return None
        v = v.reshape((1,) * (4 - v.ndim) + v.shape)
        if swap:
            v, s = v.swapaxes(2, 3), _swap(s)
        try:
            np.broadcast_shapes(v.shape, s)
        except ValueError:
            return None
        n, c, h, w = s
        rows = h if v.shape[2] != 1 else 1
        cb = self.blocks(c)
        full = np.zeros((v.shape[0], cb * self.b, rows, w), v.dtype)  # padding channels: zeros
        full[:, :c] = np.broadcast_to(v, (v.shape[0], c, rows, w))
        blocked = full.reshape(v.shape[0], cb, self.b, rows, w).transpose(0, 1, 3, 4, 2)
        key = (name, blocked.shape, swap)
        if key not in self._const_cache:
            self._const_cache[key] = self.const(blocked.reshape(v.shape[0], cb, rows, w * self.b), "const")
        return self._const_cache[key]

    # ---- the pass --------------------------------------------------------------------------
    def source_view(self, name: str) -> str | None:
        """The view of ``name`` when it is a ReorderOutput's NCHW output (made on first use)."""
        if name in self.view:
            return self.view[name]
        node = self.producer.get(name)
        if node is None or node.op_type != "ReorderOutput" or node.domain != NCHWC or _attr(node, "channels_last", 0):
            return self.twin_view(name)
        s = self.viewable(name)
        if s is None or _attr(node, "channels") != s[1] or (s[1] % self.b and not self.zero_lanes(node.input[0])):
            return None
        self.view[name] = self.add("Reshape", [node.input[0], self.shape_const(self.view_dims(s))])
        return self.view[name]

    def twin_view(self, name: str) -> str | None:
        """The view of NCHW value ``name`` that no NCHWc operator made (a partition input, the
        shortcut of the residual block it starts) read from the ReorderInput that blocks it for a
        convolution: the same values, padding channels zero (made on first use). The value and
        that ReorderInput stay as they are (``twins``)."""
        s = self.viewable(name)
        twin = next((r for r in self.readers.get(name, []) if r.op_type == "ReorderInput" and r.domain == NCHWC
                     and not _attr(r, "channels_last", 0)), None)
        if s is None or twin is None:
            return None
        self.view[name] = self.add("Reshape", [twin.output[0], self.shape_const(self.view_dims(s))])
        self.twins.add(name)
        return self.view[name]

    def zero_lanes(self, name: str) -> bool:
        """Whether NCHWc value ``name`` holds zeros in its padding channels: a ReorderInput pads
        with zeros, a convolution computes zero there (zero filters and bias, padded by
        onnxruntime) unless its activation or Sum makes them something else, pooling keeps them."""
        node = self.producer.get(name)
        if node is None or node.domain != NCHWC:
            return False
        if node.op_type == "ReorderInput":
            return True
        if node.op_type in _POOLS:
            return self.zero_lanes(node.input[0])
        if node.op_type != "Conv":
            return False
        act = _attr(node, "activation")
        if isinstance(act, bytes):
            act = act.decode()
        if act is not None and act not in _ZERO_ACTIVATIONS and not (act == "Clip" and _zero_in(
                _attr(node, "activation_params", []))):
            return False
        return len(node.input) < 4 or not node.input[3] or self.zero_lanes(node.input[3])

    def convert(self, node) -> bool:
        out = node.output[0]
        s = self.viewable(out)
        if s is None or len(node.output) != 1:
            return False
        if node.domain not in ("", "ai.onnx"):
            return False
        if node.op_type in ELEMENTWISE:
            if s[1] % self.b and not self._keeps_zero_lanes(node):
                return False
            swapped = {i in self.swapped for i in node.input if i and i not in self.inits}
            if len(swapped) != 1:
                return False  # no value read, or values stored with H and W swapped and not
            swap = swapped.pop()
            ins = []
            for k, i in enumerate(node.input):
                if not i or (node.op_type == "Clip" and k):
                    ins.append(i)  # Clip's bounds: scalars
                elif i in self.inits:
                    c = self.blocked_const(i, s, swap)
                    if c is None:
                        return False
                    ins.append(c)
                elif self.shapes.get(i) == s and (v := self.swapped.get(i) if swap else self.source_view(i)):
                    ins.append(v)
                else:
                    return False
            (self.swapped if swap else self.view)[out] = self.add(
                node.op_type, ins, **{a.name: helper.get_attribute_value(a) for a in node.attribute})
            return True
        if node.op_type == "Pad" and _attr(node, "mode", b"constant") in (b"constant", "constant"):
            return self._pad(node, s)
        if node.op_type == "Concat" and _attr(node, "axis") in (1, -3):
            return self._concat(node, s)
        return self._reshaped(node, s)

    def _keeps_zero_lanes(self, node) -> bool:
        """Whether ``node`` computes zero from zero padding channels (its constants padded with
        zeros): a value with channels that are not whole blocks keeps them zero."""
        if node.op_type == "Clip":
            bounds = [self.constant(i) if i else np.zeros(1) for i in (list(node.input[1:]) + ["", ""])[:2]]
            return all(b is not None and b.size == 1 for b in bounds) \
                and _zero_in([float(b.reshape(())) for b in bounds])
        return node.op_type in _ZERO_KEEPING

    def run(self) -> int:
        converted = []
        for k, node in enumerate(self.nodes):
            if self.convert(node):
                self.dropped.add(k)
                converted.append(node)
        if not converted:
            return 0
        self._fuse_sums(converted)
        self._fuse_activations(converted)
        self._reconnect(converted)
        self._sort()
        return len(converted)

    def _fuse_sums(self, converted) -> None:
        """Add(view of a single-use NCHWc Conv's output, other view) -> the Conv's Sum input. The
        conv's NCHW value must have no reader but the converted operations (it will hold the sum)."""
        made = {n.output[0]: n for n in self.added}
        nchw_of = {v: k for k, v in self.view.items()}
        converted = {id(n) for n in converted}
        for add in [n for n in self.added if n.op_type == "Add"]:
            for a, b in ((0, 1), (1, 0)):
                reshape = made.get(add.input[a])
                conv = reshape is not None and reshape.op_type == "Reshape" and self.producer.get(reshape.input[0])
                if not conv or conv.op_type != "Conv" or conv.domain != NCHWC or len(conv.input) > 3 \
                        or _attr(conv, "activation") is not None or add.input[b] in self.inits \
                        or add.input[b] == add.input[a] or len(self.readers[conv.output[0]]) != 1 \
                        or self._readers_of(reshape.output[0]) != 1:
                    continue
                nchw = nchw_of.get(reshape.output[0])
                if nchw is None or not self._one_value(reshape.output[0]) or nchw in self.outputs \
                        or any(id(r) not in converted for r in self.readers[nchw]):
                    continue
                # the ReorderOutput the conv fed is left unread (the reshape took its place)
                n, cb, h, wb = (int(d) for d in numpy_helper.to_array(self.inits[reshape.input[1]]))
                four = self.four(add.input[b], (n, cb * self.b, h, wb // self.b))
                while len(conv.input) < 3:
                    conv.input.append("")
                conv.input.append(four)
                self._rename(add.output[0], reshape.output[0])
                self.added.remove(add)
                break

    def _conv_of(self, view: str, converted: set[int]):
        """The NCHWc Conv whose output ``view`` is, when nothing but ``view``'s one reader reads that
        output in any form (it may be changed), and the Conv has no activation yet."""
        reshape = next((n for n in self.added if n.output[0] == view), None)
        conv = reshape is not None and reshape.op_type == "Reshape" and self.producer.get(reshape.input[0])
        if not conv or conv.op_type != "Conv" or conv.domain != NCHWC or _attr(conv, "activation") is not None \
                or len(self.readers[conv.output[0]]) != 1 or self._readers_of(view) != 1:
            return None
        nchw = next((k for k, v in self.view.items() if v == view), None)
        if nchw is None or not self._one_value(view) or nchw in self.outputs \
                or any(id(r) not in converted for r in self.readers[nchw]):
            return None
        return conv

    def _fuse_activations(self, converted) -> None:
        """Relu / Clip (constant bounds) of a Conv's output -> the Conv's activation, applied after
        its Sum as onnxruntime's own fusion does (a RELU6 after a residual ADD)."""
        converted = {id(n) for n in converted}
        for act in [n for n in self.added if n.op_type in ("Relu", "Clip")]:
            conv = self._conv_of(act.input[0], converted)
            if conv is None:
                continue
            if act.op_type == "Clip":
                bounds = [self.constant(i) if i else None for i in (list(act.input[1:]) + ["", ""])[:2]]
                if any(b is None or b.size != 1 for b in bounds):
                    continue
                conv.attribute.extend([helper.make_attribute("activation", "Clip"), helper.make_attribute(
                    "activation_params", [float(b.reshape(())) for b in bounds])])
            else:
                conv.attribute.append(helper.make_attribute("activation", "Relu"))
            self._rename(act.output[0], act.input[0])
            self.added.remove(act)

    def four(self, view: str, s) -> str:
        """``view`` as the 4-D NCHWc tensor ``s`` (what NCHWc operators read): one Reshape per view."""
        if view not in self._four:
            self._four[view] = self.add("Reshape", [view, self.shape_const(list(s))])
        return self._four[view]

    def _rename(self, old: str, new: str) -> None:
        """Every added node and view that named value ``old`` names ``new`` (the Add a Sum replaced)."""
        for n in self.added:
            for k, i in enumerate(n.input):
                if i == old:
                    n.input[k] = new
        for views in (self.view, self.swapped):
            for k, v in views.items():
                if v == old:
                    views[k] = new
        if old in self.aliased:
            self.aliased.add(new)

    def _one_value(self, view: str) -> bool:
        """Whether ``view`` holds one NCHW value only (a swap of H and W names two: ``aliased``)."""
        return view not in self.aliased

    def _readers_of(self, name: str) -> int:
        return sum(name in n.input for n in self.added)

    def _reconnect(self, converted) -> None:
        """Readers of a converted value that are not converted: a ReorderInput reads the view
        reshaped back (no copy); anything else (and a graph output) the value reordered to NCHW."""
        dropped_outputs = {n.output[0] for n in converted}
        converted = {id(n) for n in converted}
        for name, view in list(self.view.items()):
            if name in self.twins:
                continue  # the value and its ReorderInput are kept: the view reads that
            s = self.shapes[name]
            readers = [r for r in self.readers.get(name, []) if id(r) not in converted]
            for r in readers:
                if r.op_type == "ReorderInput" and r.domain == NCHWC and not _attr(r, "channels_last", 0):
                    self.dropped.add(next(j for j, n in enumerate(self.nodes) if n is r))
                    if r.output[0] in self.outputs:
                        self.add("Reshape", [view, self.shape_const(self.four_dims(s))], outputs=[r.output[0]])
                        continue
                    four = self.four(view, self.four_dims(s))
                    for reader in self.readers[r.output[0]]:
                        for k, i in enumerate(reader.input):
                            if i == r.output[0]:
                                reader.input[k] = four
            others = [r for r in readers if not (r.op_type == "ReorderInput" and r.domain == NCHWC
                                                 and not _attr(r, "channels_last", 0))]
            if name in dropped_outputs and (others or name in self.outputs):
                blocked = self.add("Reshape", [view, self.shape_const(self.four_dims(s))])
                self.add("ReorderOutput", [blocked], outputs=[name], domain=NCHWC, channels=s[1])
        for name, view in self.swapped.items():
            s = self.shapes[name]
            if name in self.outputs or any(id(r) not in converted for r in self.readers.get(name, [])):
                n, c, h, w = s  # stored as [n, C/B, w, h, B]
                five = self.add("Reshape", [view, self.shape_const([n, self.blocks(c), w, h, self.b])])
                back = self.add("Transpose", [five], perm=[0, 1, 3, 2, 4])
                blocked = self.add("Reshape", [back, self.shape_const(self.four_dims(s))])
                self.add("ReorderOutput", [blocked], outputs=[name], domain=NCHWC, channels=c)

    def _sort(self) -> None:
        """The kept nodes and the added ones in an order every node's inputs precede it; nodes
        nothing reads any more (a ReorderOutput replaced by a view) dropped."""
        nodes = [n for k, n in enumerate(self.nodes) if k not in self.dropped] + self.added
        needed = {o.name for o in self.graph.output}
        live = live_nodes(_topological(nodes), needed)
        keep = []
        for t in self.graph.initializer:
            if t.name in needed:
                copy = onnx.TensorProto()
                copy.CopyFrom(t)
                keep.append(copy)
        del self.graph.node[:]
        self.graph.node.extend(live)
        del self.graph.initializer[:]
        self.graph.initializer.extend(keep)


def _topological(nodes: list) -> list:
    """``nodes`` ordered so that each follows the producers of its inputs, otherwise in the order
    given (Kahn's algorithm, the earliest ready node first)."""
    producer = {o: k for k, n in enumerate(nodes) for o in n.output}
    waits = [0] * len(nodes)
    readers: dict[int, list[int]] = defaultdict(list)
    for k, n in enumerate(nodes):
        for p in {producer[i] for i in n.input if i in producer}:
            waits[k] += 1
            readers[p].append(k)
    ready = [k for k, w in enumerate(waits) if w == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        k = heapq.heappop(ready)
        order.append(nodes[k])
        for r in readers[k]:
            waits[r] -= 1
            if waits[r] == 0:
                heapq.heappush(ready, r)
    if len(order) != len(nodes):
        raise ValueError("blocked layout pass: the rewritten graph has a cycle")
    return order


def keep_blocked(model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]], value) -> int:
    """Rewrite ``model`` (the optimised graph, NCHWc nodes in it) in place, its NHWC edges too
    (blocked_edges.py); ``shapes``: the NCHW shapes of the lowered graph's values by name;
    ``value(initializer)``: the value of one stored outside the model. Returns the operations
    moved to the blocked layout."""
    block = block_size()
    if block is None or block < 2:
        return 0
    if any(a.HasField("g") or len(a.graphs) for n in model.graph.node for a in n.attribute):
        return 0  # a Loop / If body reads outer values by name: not rewritten under it
    moved = _Rewrite(model, shapes, block, value).run()
    fuse_edge_transposes(model.graph)
    return moved


def value_shapes(model: onnx.ModelProto) -> dict[str, tuple[int, ...]]:
    """The static shapes of the lowered (standard ONNX) graph's values, by name. (Inferred on a
    copy whose initializers are inputs: the weights are not copied; constant shapes, pads and axes
    are small and kept, shape inference reads them.)"""
    g = model.graph
    small = [t for t in g.initializer if np.prod(t.dims, dtype=np.int64) <= 64]
    large = [helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
             for t in g.initializer if np.prod(t.dims, dtype=np.int64) > 64]
    bare = helper.make_model(helper.make_graph(g.node, g.name, [*g.input, *large], g.output, small),
                             opset_imports=model.opset_import)
    bare.ir_version = model.ir_version
    inferred = onnx.shape_inference.infer_shapes(bare)
    shapes = {}
    for vi in (*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output):
        t = vi.type.tensor_type
        if t.HasField("shape") and all(d.HasField("dim_value") for d in t.shape.dim):
            shapes[vi.name] = tuple(d.dim_value for d in t.shape.dim)
    for t in model.graph.initializer:
        shapes[t.name] = tuple(t.dims)
    return shapes
