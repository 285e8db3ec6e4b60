"""The operations of the blocked-layout pass (blocked.py) that move data rather than compute
element by element: a channel Pad / Concat (whole blocks padded or joined), pooling (onnxruntime's
NCHWc kernels), a Gather of rows or columns and a swap of H and W (a bilinear resize's)."""
from __future__ import annotations

import numpy as np
from onnx import helper, numpy_helper

NCHWC = "com.microsoft.nchwc"
#: Pooling operators onnxruntime has NCHWc kernels for (each channel pooled alone).
_POOLS = frozenset({"MaxPool", "AveragePool", "GlobalMaxPool", "GlobalAveragePool"})


def _attr(node, name, default=None):
    return next((helper.get_attribute_value(a) for a in node.attribute if a.name == name), default)


def _swap(s) -> tuple[int, int, int, int]:
    return (s[0], s[1], s[3], s[2])


class BlockedMoves:
    """Mixed into the pass (``_Rewrite``): each converter takes an NCHW node and ``s``, its output's
    NCHW shape, adds the blocked equivalent and records its output's view; False leaves the node."""

    def _reshaped(self, node, s) -> bool:
        """Pooling, a Gather of rows or columns (constant 1-D indices) and a swap of H and W of a
        viewed value: the same operation on the blocked tensor, as its NCHWc operator or on the 5-D
        view [N, C/B, H, W, B]. A swap moves nothing: its result is the same tensor, marked as
        holding the value with H and W swapped (``swapped``), which Gathers and element-wise
        operations read as such (a bilinear resize gathers columns as rows between two swaps)."""
        src = node.input[0] if node.input else ""
        si = self.viewable(src)
        swap = src in self.swapped
        v = self.swapped[src] if swap else self.source_view(src) if si is not None else None
        if v is None:
            return False
        out = node.output[0]
        if node.op_type in _POOLS and not swap:
            pooled = self.add(node.op_type, [self.four(v, self.four_dims(si))], domain=NCHWC, **{
                a.name: helper.get_attribute_value(a) for a in node.attribute if a.name != "storage_order"})
            self.view[out] = self.add("Reshape", [pooled, self.shape_const(self.view_dims(s))])
            return True
        if node.op_type == "Transpose" and list(_attr(node, "perm", [])) == [0, 1, 3, 2]:
            (self.view if swap else self.swapped)[out] = v
            self.aliased.add(v)
            return True
        if node.op_type != "Gather" or len(node.input) != 2 or node.input[1] not in self.inits:
            return False
        idx = self.constant(node.input[1])
        axis = _attr(node, "axis", 0) % 4
        if idx is None or idx.ndim != 1 or axis not in (2, 3):
            return False
        if swap:  # the stored tensor's axes
            axis, si, s = 5 - axis, _swap(si), _swap(s)
        if axis == 2:
            g = self.add("Gather", [v, node.input[1]], axis=2)
        else:
            five = self.add("Reshape", [v, self.shape_const([si[0], self.blocks(si[1]), si[2], si[3], self.b])])
            g = self.add("Reshape", [self.add("Gather", [five, node.input[1]], axis=3),
                                     self.shape_const(self.view_dims(s))])
        (self.swapped if swap else self.view)[out] = g
        return True

    def _pad(self, node, s) -> bool:
        src = node.input[0]
        pads = self.inits.get(node.input[1]) if len(node.input) > 1 else None
        if pads is None or (len(node.input) > 3 and node.input[3]):
            return False
        p = [int(v) for v in numpy_helper.to_array(pads)]
        if len(p) != 8 or any(p[k] or p[k + 4] for k in (0, 2, 3)) or p[1] % self.b or min(p) < 0:
            return False
        si = self.viewable(src)
        v = self.source_view(src) if si else None
        if v is None:
            return False
        value = node.input[2] if len(node.input) > 2 and node.input[2] else None
        if value is not None and value not in self.inits:
            return False
        if (si[1] % self.b or p[5] % self.b) and not self._zero_fill(value):
            return False  # padding channels become channels (or stay padding): the fill must be their zero
        blocks = [0, p[1] // self.b, 0, 0, 0, self.blocks(si[1] + p[5]) - self.blocks(si[1]), 0, 0]
        self.view[node.output[0]] = self.add("Pad", [v, self.const(np.asarray(blocks, np.int64), "pads"),
                                                     *([value] if value else [])], mode="constant")
        return True

    def _zero_fill(self, value: str | None) -> bool:
        c = None if value is None else self.constant(value)
        return value is None or (c is not None and c.size == 1 and float(c.reshape(())) == 0)

    def _concat(self, node, s) -> bool:
        if self._concat_as_pad(node):
            return True
        ins = []
        for k, i in enumerate(node.input):
            si = self.shapes.get(i)
            if si is None or len(si) != 4 or (si[1] % self.b and k != len(node.input) - 1) \
                    or (si[0], si[2], si[3]) != (s[0], s[2], s[3]):
                return False  # (the last one's padding channels are the result's)
            if i in self.inits:
                c = self.blocked_const(i, si)
            else:
                c = self.source_view(i) if si == self.viewable(i) else None
            if c is None:
                return False
            ins.append(c)
        if not any(i in self.view.values() for i in ins):
            return False
        self.view[node.output[0]] = self.add("Concat", ins, axis=1)
        return True

    def _concat_as_pad(self, node) -> bool:
        """Concat(x, constant of one value) (or the constant first): whole blocks of that value
        padded on, nothing read for them (a shortcut widened with zeros)."""
        if len(node.input) != 2 or sum(i in self.inits for i in node.input) != 1:
            return False
        k = 0 if node.input[1] in self.inits else 1
        x, c = node.input[k], self.constant(node.input[1 - k])
        sx, sc = self.shapes.get(x), self.shapes.get(node.input[1 - k])
        if c is None or c.size == 0 or sx is None or self.viewable(x) != sx or sc is None or len(sc) != 4 \
                or (sc[0], sc[2], sc[3]) != (sx[0], sx[2], sx[3]) or c.dtype != np.float32 \
                or np.any(c != c.flat[0]):
            return False
        if k == 1 and sc[1] % self.b:
            return False  # zeros first: whole blocks only
        if k == 0 and (sx[1] % self.b or sc[1] % self.b) and c.flat[0] != 0:
            return False  # padding channels become channels (or stay padding): zeros only
        v = self.source_view(x)
        if v is None:
            return False
        blocks = [0, 0, 0, 0, 0, 0, 0, 0]
        blocks[1 if k == 1 else 5] = sc[1] // self.b if k == 1 else self.blocks(sx[1] + sc[1]) - self.blocks(sx[1])
        fill = self.const(np.asarray(c.flat[0], np.float32).reshape(()), "fill")
        self.view[node.output[0]] = self.add("Pad", [v, self.const(np.asarray(blocks, np.int64), "pads"), fill],
                                             mode="constant")
        return True
