"""Float32 MAX_POOL_2D and AVERAGE_POOL_2D (NHWC), PAD / PAD_V2, CONCATENATION and RESHAPE: one
native pass each, for the float CNNs (MediaPipe-style landmark nets, BlazeFace, MobileNetV2) that
run wholly on this backend, their bound steps called natively one after the other
(native_chain.py), so that each call is cheap.

numba's own loops vectorise a long contiguous loop, but not one over a few dozen channels (LLVM
leaves all of it to the scalar remainder of a 32-float loop), nor a running maximum held in
memory: the channel loops are LLVM vector IR (f32_simd.py), 16 float lanes, a row's last vector
masked, so that any channel count takes whole vectors and nothing outside a row is touched.

* Pools: a run of output pixels whose windows lie wholly in the image (an output row's interior)
  is one call; 16, 32 or 64 channels at a time stay in registers over the window's taps, the
  first tap loaded and the others combined in the reference's (filter_y, filter_x) order. Edge
  windows are clamped to the image: only in-image cells count (NNAPI's, TFLite's and the
  reference's rule). AVERAGE: float32 sums in that order divided by the window's cell count (the
  reference's arithmetic); MAX: ``vmaxps`` and a mask of the NaNs met, so that a NaN propagates
  as numpy's maximum propagates it. Then the fused activation's clamp, which keeps NaN.
* PAD / PAD_V2: the dimensions after the innermost padded one merged into it (a spatial pad of
  NHWC moves whole W·C rows), then each output row one masked move: fill, the input's row, fill.
* CONCATENATION: each input's rows moved into the output's rows, one call per input.
* RESHAPE: a copy (a bound program makes it a view of its input unless its output is a model's).
* STRIDED_SLICE: the spec's resolved axes as the input offset of each output row (the innermost
  axis's run, planned once), then one strided copy per row: a sequence model's last time step
  (a KWS LSTM's [1, 49, 32] -> [1, 32]) is one row.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numba
import numpy as np

from hal import quant
from hal.backends.numba_kernels import BACKEND
from hal.backends.numba_kernels.f32_simd import avg_windows, max_windows, move_rows, scaled_windows
from hal.backends.numba_kernels.fixedpoint import ro, rw
from hal.backends.numba_kernels.gemm import in_order
from hal.backends.numba_kernels.lazy import njit
from hal.operations.concatenation import axis_input
from hal.operations.pooling import AVG, MAX, PoolParams
from hal.operations.strided_slice import StridedSliceParams
from hal.registry import OperationContext
from hal.types import OperandType, OperationType

F32_TYPES = (OperandType.TENSOR_FLOAT32,)


@numba.njit(inline="always")
def _windows(avg, x, first, rows, row_step, cols, c, step, npix, lo, hi, out, o):
    """``npix`` windows of ``rows`` × ``cols`` cells (see ``f32_simd._window_run``; none is empty:
    the spec admits no window wholly in the padding). An average over a power of two cells
    multiplies by its reciprocal: the same quotient, without a division's latency."""
    cells = rows * cols
    if avg and (cells & (cells - 1)) == 0:
        scaled_windows(x, first, rows, row_step, cols, c, step, npix, np.float32(1.0 / cells), lo, hi, out, o)
    elif avg:
        avg_windows(x, first, rows, row_step, cols, c, step, npix, np.float32(cells), lo, hi, out, o)
    else:
        max_windows(x, first, rows, row_step, cols, c, step, npix, lo, lo, hi, out, o)


I64 = numba.int64
_POOL_SIG = numba.void(numba.boolean, ro(np.float32, 1), *[I64] * 12, numba.float32, numba.float32,
                       rw(np.float32, 1))


@njit(_POOL_SIG, cache=True, nogil=True)
def _pool(avg, x, n_b, h, w, c, fh, fw, sh, sw, top, left, out_h, out_w, lo, hi, out):
    """Flat NHWC ``x`` [n_b, h, w, c] pooled into flat ``out`` [n_b, out_h, out_w, c]: per output
    row, the edge pixels one by one (windows clamped), the interior ones as one run."""
    a = min((left + sw - 1) // sw, out_w)  # interior: the window's columns all in the image
    b = max(min((w - fw + left) // sw + 1, out_w), a) if w - fw + left >= 0 else a
    for n in range(n_b):
        for oy in range(out_h):
            y0 = oy * sh - top
            y1 = min(y0 + fh, h)
            y0 = max(y0, 0)
            rows = y1 - y0
            o = (n * out_h + oy) * out_w * c
            row = (n * h + y0) * w * c
            ox = 0
            while ox < out_w:
                if ox == a and b > a:
                    first, cols, step, npix = row + (ox * sw - left) * c, fw, sw * c, b - a
                else:
                    x0 = ox * sw - left
                    x1 = min(x0 + fw, w)
                    x0 = max(x0, 0)
                    first, cols, step, npix = row + x0 * c, x1 - x0, 0, 1
                _windows(avg, x, first, rows, w * c, cols, c, step, npix, lo, hi, out, o + ox * c)
                ox += npix


@dataclass
class F32Pool:
    avg: bool
    args: tuple  # _pool's integer arguments after x: n_b, h, w, c, fh, fw, sh, sw, top, left, out_h, out_w
    lo: float
    hi: float


def supports_pool(ctx: OperationContext) -> str | None:
    if ctx.params.nchw:
        return "NCHW layout (the reference backend transposes around its kernel)"
    return None


def plan_pool(ctx: OperationContext) -> F32Pool:
    p: PoolParams = ctx.params
    n_b, h, w, c = ctx.input(0).shape
    lo, hi = quant.activation_range_float(p.act)
    return F32Pool(p.kind == AVG, (n_b, h, w, c, p.rows.filter, p.cols.filter, p.rows.stride, p.cols.stride,
                                   p.rows.pad_head, p.cols.pad_head, p.rows.out, p.cols.out), lo, hi)


def _pool_call(d: F32Pool, x: np.ndarray, out: np.ndarray):
    return functools.partial(_pool, d.avg, x.reshape(-1), *d.args, np.float32(d.lo), np.float32(d.hi),
                             out.reshape(-1))


def execute_pool(ctx: OperationContext, inputs: list) -> list:
    d: F32Pool = ctx.data
    n_b, _, _, c = d.args[:4]
    out = np.empty((n_b, d.args[10], d.args[11], c), np.float32)
    if out.size:
        _pool_call(d, np.ascontiguousarray(inputs[0]), out)()
    return [out]


def bind_pool(ctx: OperationContext, inputs: list, outputs: list):
    """``execute`` of the fixed contiguous input into the fixed ``outputs[0]``: a zero-argument runner."""
    x = inputs[0]
    if x is None or not x.flags.c_contiguous or x.size == 0:
        return None
    return _pool_call(ctx.data, x, outputs[0])


# ---- PAD / PAD_V2 -------------------------------------------------------------------------------

@njit(numba.void(ro(np.float32, 1), ro(np.int64, 1), ro(np.int64, 2), numba.float32, rw(np.float32, 1)),
            cache=True, nogil=True)
def _pad4(x, shape, window, value, out):
    """Flat ``out`` (``shape``, rank 4) = ``value`` with flat ``x`` in ``window`` ([4, 2]: start,
    stop per dimension): per (n, y), the fills before and after the input's rows and the rows
    themselves (their head fill, the row and its tail fill) as a few ``_move_rows`` calls."""
    h_i, x0, x1 = window[1, 1] - window[1, 0], window[2, 0], window[2, 1]
    c0, c_o = window[3, 0], shape[3]
    w_i, c_i, w_c = x1 - x0, window[3, 1] - c0, shape[2] * c_o
    for n in range(shape[0]):
        in_n = window[0, 0] <= n < window[0, 1]
        for y in range(shape[1]):
            o = (n * shape[1] + y) * w_c
            if not (in_n and window[1, 0] <= y < window[1, 1]):
                move_rows(out, o, 0, x, 0, 0, 0, w_c, value, 1)
                continue
            src = ((n - window[0, 0]) * h_i + y - window[1, 0]) * w_i * c_i
            if x0:
                move_rows(out, o, 0, x, 0, 0, 0, x0 * c_o, value, 1)
            if c0:
                move_rows(out, o + x0 * c_o, c_o, x, 0, 0, 0, c0, value, w_i)
            move_rows(out, o + x0 * c_o + c0, c_o, x, src, c_i, c_i, c_o - c0, value, w_i)
            if x1 < shape[2]:
                move_rows(out, o + x1 * c_o, 0, x, 0, 0, 0, w_c - x1 * c_o, value, 1)


@dataclass
class F32Pad:
    out_shape: tuple[int, ...]
    shape4: np.ndarray  # int64 [4]: the output shape, merged and [1, ...]-extended to rank 4
    window: np.ndarray  # int64 [4, 2]: (start, stop) of the input in it, per dimension
    value: float
    paddings: tuple[tuple[int, int], ...] = ()  # (before, after) per dimension, as the operation gives them

    def image_border(self) -> tuple[int, int] | None:
        """(top, left) where this is a zero pad of a rank-4 tensor's rows and columns only (an
        NHWC image's border, which a convolution after it can take as its own padding), else None."""
        p = self.paddings
        if len(p) != 4 or p[0] != (0, 0) or p[3] != (0, 0) or self.value != 0 or np.signbit(self.value):
            return None
        return p[1][0], p[2][0]


#: The operations planned here as ``F32Pad``.
PADS = (OperationType.PAD, OperationType.PAD_V2)


def image_of(pad) -> tuple[int, int, int, int] | None:
    """For a PAD step this backend planned as a zero border of an NHWC image (``image_border``): its
    input's height and width and the border's top and left, what a convolution reading its output
    takes as its own image and more padding; else None."""
    border = pad.ctx.data.image_border() if isinstance(pad.ctx.data, F32Pad) else None
    if border is None:
        return None
    _, h, w, _ = pad.ctx.inputs[0].shape
    return int(h), int(w), *border


def merged(shape, paddings) -> tuple[list[int], list[tuple[int, int]]]:
    """(input shape, paddings) with each dimension that is not padded merged into the one before
    it (its rows are whole rows of that one): at most as many dimensions, the last one padded or
    the only one."""
    dims, pads = [int(shape[0])], [tuple(int(p) for p in paddings[0])]
    for d, (before, after) in zip(shape[1:], paddings[1:]):
        if before == after == 0:
            dims[-1] *= int(d)
            pads[-1] = (pads[-1][0] * int(d), pads[-1][1] * int(d))
        else:
            dims.append(int(d))
            pads.append((int(before), int(after)))
    return dims, pads


def supports_pad(ctx: OperationContext) -> str | None:
    if not 1 <= len(ctx.input(0).shape) <= 4:
        return "rank outside 1..4"
    return None


def plan_pad(ctx: OperationContext) -> F32Pad:
    p = ctx.params
    dims, pads = merged(ctx.input(0).shape, p.paddings)
    lead = 4 - len(dims)
    shape4 = [1] * lead + [b + d + a for d, (b, a) in zip(dims, pads)]
    window = [(0, 1)] * lead + [(b, b + d) for d, (b, _) in zip(dims, pads)]
    return F32Pad(tuple(p.out_shape), np.array(shape4, np.int64), np.array(window, np.int64), float(p.value),
                  tuple((int(b), int(a)) for b, a in p.paddings))


def execute_pad(ctx: OperationContext, inputs: list) -> list:
    d: F32Pad = ctx.data
    out = np.empty(d.out_shape, np.float32)
    if out.size:
        _pad4(np.ascontiguousarray(inputs[0]).reshape(-1), d.shape4, d.window, np.float32(d.value), out.reshape(-1))
    return [out]


def bind_pad(ctx: OperationContext, inputs: list, outputs: list):
    d: F32Pad = ctx.data
    x = inputs[0]
    if x is None or not x.flags.c_contiguous or outputs[0].size == 0:
        return None
    return functools.partial(_pad4, x.reshape(-1), d.shape4, d.window, np.float32(d.value), outputs[0].reshape(-1))


# ---- CONCATENATION, RESHAPE ---------------------------------------------------------------------

@njit(numba.void(ro(np.float32, 1), I64, I64, I64, rw(np.float32, 1)), cache=True, nogil=True)
def _place(x, width, offset, total, out):
    """Rows of ``width`` floats of flat ``x`` into the rows of ``total`` of flat ``out``, from column
    ``offset``."""
    move_rows(out, offset, total, x, 0, width, width, width, np.float32(0), x.shape[0] // width)


@njit(numba.void(ro(np.float32, 1), rw(np.float32, 1)), cache=True, nogil=True)
def _copy(x, out):
    move_rows(out, 0, 0, x, 0, 0, x.shape[0], x.shape[0], np.float32(0), 1)


def _concat_calls(axis: int, xs: list, out: np.ndarray) -> list:
    total = int(np.prod(out.shape[axis:], dtype=np.int64))
    calls, offset = [], 0
    for x in xs:
        width = int(np.prod(x.shape[axis:], dtype=np.int64))
        if width:
            calls.append(functools.partial(_place, x.reshape(-1), width, offset, total, out.reshape(-1)))
            offset += width
    return calls


def plan_concat(ctx: OperationContext) -> int:
    return int(ctx.params.axis)


def execute_concat(ctx: OperationContext, inputs: list) -> list:
    xs = inputs[:axis_input(ctx)]
    out = np.empty(ctx.output_shapes[0], np.float32)
    if out.size:
        for call in _concat_calls(ctx.data, [np.ascontiguousarray(x) for x in xs], out):
            call()
    return [out]


def bind_concat(ctx: OperationContext, inputs: list, outputs: list):
    """One call per input (an ``InOrder``: each a native call of a chain)."""
    xs = inputs[:axis_input(ctx)]
    if outputs[0].size == 0 or any(x is None or not x.flags.c_contiguous for x in xs):
        return None
    return in_order(*_concat_calls(ctx.data, xs, outputs[0]))


def plan_reshape(ctx: OperationContext) -> tuple[int, ...]:
    return tuple(ctx.params.shape)


def execute_reshape(ctx: OperationContext, inputs: list) -> list:
    out = np.empty(ctx.data, np.float32)
    if out.size:
        _copy(np.ascontiguousarray(inputs[0]).reshape(-1), out.reshape(-1))
    return [out]


def bind_reshape(ctx: OperationContext, inputs: list, outputs: list):
    x = inputs[0]
    if x is None or not x.flags.c_contiguous or x.size == 0:
        return None
    return functools.partial(_copy, x.reshape(-1), outputs[0].reshape(-1))


#: A slice of more output rows than this stays on the next backend (its offsets are planned).
MAX_SLICE_ROWS = 1 << 20


@njit(numba.void(ro(np.float32, 1), ro(np.int64, 1), I64, I64, rw(np.float32, 1)), cache=True, nogil=True)
def _slice_rows(x, starts, count, stride, out):
    """Output row r: ``count`` elements of x from ``starts[r]`` every ``stride``."""
    for r in range(starts.shape[0]):
        at, o = starts[r], r * count
        for j in range(count):
            out[o + j] = x[at + j * stride]


@dataclass
class F32Slice:
    starts: np.ndarray  # int64: each output row's first input offset
    count: int  # the innermost axis's elements per row
    stride: int
    out_shape: tuple[int, ...]


def supports_slice(ctx: OperationContext) -> str | None:
    p: StridedSliceParams = ctx.params
    if p.invalid:
        return "values NNAPI's shrink-axis rule forbids (refused where they run)"
    if int(np.prod([a.count for a in p.axes[:-1]])) > MAX_SLICE_ROWS:
        return f"more than {MAX_SLICE_ROWS} output rows"
    return None


def plan_slice(ctx: OperationContext) -> F32Slice:
    p: StridedSliceParams = ctx.params
    shape = ctx.input(0).shape
    steps = np.cumprod((1, *shape[:0:-1]))[::-1]  # each axis's element stride in C order
    starts = np.zeros(1, np.int64)
    for axis, a in enumerate(p.axes[:-1]):
        starts = (starts[:, None] + (a.start + np.arange(a.count) * a.stride) * int(steps[axis])).reshape(-1)
    last = p.axes[-1]
    return F32Slice(starts + last.start, int(last.count), int(last.stride), tuple(p.out_shape))


def execute_slice(ctx: OperationContext, inputs: list) -> list:
    d: F32Slice = ctx.data
    out = np.empty(d.out_shape, np.float32)
    if out.size:
        _slice_rows(np.ascontiguousarray(inputs[0], np.float32).reshape(-1), d.starts, d.count, d.stride,
                    out.reshape(-1))
    return [out]


def bind_slice(ctx: OperationContext, inputs: list, outputs: list):
    d: F32Slice = ctx.data
    x, out = inputs[0], outputs[0]
    if x is None or not x.flags.c_contiguous or out.size == 0:
        return None
    return functools.partial(_slice_rows, x.reshape(-1), d.starts, d.count, d.stride, out.reshape(-1))


BACKEND.register([AVG, MAX], plan=plan_pool, execute=execute_pool, types=F32_TYPES, supports=supports_pool,
                 bind=bind_pool)
BACKEND.register(PADS, plan=plan_pad, execute=execute_pad, types=F32_TYPES,
                 supports=supports_pad, bind=bind_pad)
BACKEND.register(OperationType.CONCATENATION, plan=plan_concat, execute=execute_concat, types=F32_TYPES,
                 bind=bind_concat)
BACKEND.register(OperationType.RESHAPE, plan=plan_reshape, execute=execute_reshape, types=F32_TYPES,
                 bind=bind_reshape)
BACKEND.register(OperationType.STRIDED_SLICE, plan=plan_slice, execute=execute_slice, types=F32_TYPES,
                 supports=supports_slice, bind=bind_slice)
