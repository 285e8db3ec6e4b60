"""ROI_ALIGN and ROI_POOLING on numpy, per region, in NHWC (NCHW maps are transposed in and out).

Coordinates are computed in float32 in NNAPI's CPU order of operations, so bin edges and sample
points land where AOSP's do. Quantized ROI_ALIGN is integer arithmetic as AOSP's: each bilinear
weight quantized to 1/255 steps, int32 sums over the bin's samples, one requantization by
MultiplyByQuantizedMultiplier (scale_in / 255 / scale_out / samples). ROI_POOLING takes maxima of
the stored values (input and output share one quantization).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hal.backends.reference import BACKEND
from hal.operations.roi import ROI_ALIGN, ROI_POOLING, ROI_SCALE, RoiParams
from hal.quant import multiply_by_quantized_multiplier, quantize_multiplier, round_half_away
from hal.registry import OperationContext

F = np.float32
W_SCALE = F(1) / F(255)  # quantized interpolation weights: steps of 1/255
MAX_ROW_SAMPLES = 1 << 24  # ROI_ALIGN's working set per output row (sampling points x channels)


@dataclass
class RoiData:
    p: RoiParams
    quantized: bool
    in_scale: float
    in_zero_point: int
    out_scale: float
    out_zero_point: int
    roi_scale: float


def plan(ctx: OperationContext) -> RoiData:
    x, r, o = ctx.inputs[0], ctx.inputs[1], ctx.outputs[0]
    return RoiData(ctx.params, x.dtype.kind in "iu", x.scale, x.zero_point, o.scale, o.zero_point, r.scale)


def _regions(ctx: OperationContext, rois: np.ndarray, batches: np.ndarray, n: int, h: int, w: int) -> None:
    """AOSP's malformed-data checks on the regions in feature-map units: batch index in range,
    region inside the map, x1 <= x2 and y1 <= y2."""
    bad = (batches < 0) | (batches >= n)
    if bad.any():
        k = int(np.argmax(bad))
        raise ctx.fail(f"region {k}: batch index {int(batches[k])} is not in [0, {n})")
    x1, y1, x2, y2 = rois.T
    ok = (rois >= 0).all(axis=1) & (x1 <= w) & (x2 <= w) & (y1 <= h) & (y2 <= h) & (x1 <= x2) & (y1 <= y2)
    if not ok.all():
        k = int(np.argmin(ok))
        raise ctx.fail(f"region {k} ({rois[k].tolist()} in feature-map units) is malformed or outside the "
                       f"{h}x{w} feature map")


def _scaled(d: RoiData, rois_in: np.ndarray, align: bool) -> np.ndarray:
    """The regions in feature-map units, float32, in AOSP's order of operations (quantized
    ROI_ALIGN scales the stored value first, then by 0.125; the others dequantize first)."""
    p = d.p
    scale = np.array([F(1) / F(p.width_stride), F(1) / F(p.height_stride)] * 2, dtype=F)
    rois = rois_in.astype(F).reshape(-1, 4)
    if d.quantized and align:
        return rois * scale * F(ROI_SCALE)
    if d.quantized:
        rois = rois * F(d.roi_scale)
    return rois * scale


def _nhwc(x: np.ndarray, nchw: bool) -> np.ndarray:
    return x.transpose(0, 2, 3, 1) if nchw else x


def _axis_samples(ctx: OperationContext, start: np.float32, end: np.float32, bins: int, ratio: int, size: int):
    """Sample points of one axis: (low index, high index, fraction) per (bin, sample), the number of
    samples per bin. ``start``/``end`` are the region's edges in feature-map units (float32)."""
    extent = np.maximum(end - start, F(1))
    step = extent / F(bins)
    if ratio <= 0:
        ratio = int(np.ceil(step))
    ctx.check(bins * ratio <= MAX_ROW_SAMPLES, f"{bins} bins x {ratio} samples on one axis: too many for this driver")
    bin_size = step / F(ratio)
    j = np.arange(bins, dtype=F)[:, None]
    k = np.arange(ratio, dtype=F)[None, :]
    coord = (step * j + start) + bin_size / F(2) + bin_size * k  # AOSP: wStart + bin/2 + bin*xInd
    coord = coord.reshape(-1)
    low = np.floor(coord).astype(np.int64)
    frac = (coord - low.astype(F)).astype(F)
    edge = low >= size - 1
    low = np.where(edge, size - 1, low)
    high = np.where(edge, size - 1, low + 1)
    frac = np.where(edge, F(0), frac)
    return low, high, frac, ratio


def execute_align(ctx: OperationContext, inputs: list) -> list:
    d: RoiData = ctx.data
    p = d.p
    x = _nhwc(inputs[0], p.nchw)
    rois_in, batches = inputs[1], inputs[2]
    n, h, w, c = x.shape
    rois = _scaled(d, rois_in, align=True)
    _regions(ctx, rois, batches, n, h, w)
    out = np.empty((rois.shape[0], p.out_h, p.out_w, c), dtype=np.float32 if not d.quantized else x.dtype)
    lo, hi = (np.iinfo(x.dtype).min, np.iinfo(x.dtype).max) if d.quantized else (0, 0)
    for r in range(rois.shape[0]):
        x1, y1, x2, y2 = rois[r]
        ylo, yhi, dy1, sh = _axis_samples(ctx, y1, y2, p.out_h, p.sampling_h, h)
        xlo, xhi, dx1, sw = _axis_samples(ctx, x1, x2, p.out_w, p.sampling_w, w)
        dy2, dx2 = F(1) - dy1, F(1) - dx1
        img = x[int(batches[r])]
        samples = sh * sw
        ctx.check(sh * len(xlo) * c <= MAX_ROW_SAMPLES, f"region {r}: {sh} x {len(xlo)} sampling points per "
                                                          f"output row over {c} channels: too many for this driver")
        sums = np.empty((p.out_h, p.out_w, c), dtype=np.int64 if d.quantized else F)
        for i in range(p.out_h):  # one output row at a time: memory bounded by its samples
            rows = slice(i * sh, (i + 1) * sh)
            ya, yb, fy1, fy2 = ylo[rows], yhi[rows], dy1[rows], dy2[rows]
            acc = np.zeros((sh, len(xlo), c), dtype=np.int64 if d.quantized else F)
            for ys, xs, wgt in ((ya, xlo, dx2[None, :] * fy2[:, None]), (ya, xhi, dx1[None, :] * fy2[:, None]),
                                (yb, xlo, dx2[None, :] * fy1[:, None]), (yb, xhi, dx1[None, :] * fy1[:, None])):
                v = img[ys[:, None], xs[None, :]]
                if d.quantized:
                    wq = round_half_away(wgt / W_SCALE).astype(np.int64)
                    acc += wq[:, :, None] * (v.astype(np.int64) - d.in_zero_point)
                else:
                    acc += wgt[:, :, None] * v.astype(F)
            sums[i] = acc.reshape(sh, p.out_w, sw, c).sum(axis=(0, 2))
        if d.quantized:
            real = F(d.in_scale) * W_SCALE / F(d.out_scale) / F(samples)
            ctx.check(0 <= real < 1, f"requantization multiplier {real} must be in [0, 1)")
            m, shift = quantize_multiplier(float(real))
            out[r] = np.clip(multiply_by_quantized_multiplier(sums, m, shift) + d.out_zero_point, lo, hi)
        else:
            out[r] = sums / F(samples)
    out = out.astype(inputs[0].dtype)
    return [out.transpose(0, 3, 1, 2).copy() if p.nchw else out]


def _bin_edges(step: np.float32, start: int, bins: int, size: int) -> tuple[list[int], list[int]]:
    """ROI_POOLING's bins on one axis: [floor(step * i + start), ceil(step * (i + 1) + start)),
    in float32, clamped to the map."""
    i = np.arange(bins + 1, dtype=F)
    edges = step * i + F(start)
    lo = np.minimum(np.floor(edges[:-1]), size).astype(np.int64)
    hi = np.minimum(np.ceil(edges[1:]), size).astype(np.int64)
    return lo.tolist(), hi.tolist()


def execute_pooling(ctx: OperationContext, inputs: list) -> list:
    d: RoiData = ctx.data
    p = d.p
    x = _nhwc(inputs[0], p.nchw)
    rois_in, batches = inputs[1], inputs[2]
    n, h, w, c = x.shape
    rois = _scaled(d, rois_in, align=False)
    _regions(ctx, rois, batches, n, h, w)
    empty = x.dtype.type(d.in_zero_point if d.quantized else 0)
    out = np.empty((rois.shape[0], p.out_h, p.out_w, c), dtype=x.dtype)
    for r in range(rois.shape[0]):
        x1, y1, x2, y2 = (int(v) for v in round_half_away(rois[r]))
        rh, rw = F(max(y2 - y1 + 1, 1)), F(max(x2 - x1 + 1, 1))
        hstep, wstep = rh / F(p.out_h), rw / F(p.out_w)
        img = x[int(batches[r])]
        hs, he = _bin_edges(hstep, y1, p.out_h, h)
        ws, we = _bin_edges(wstep, x1, p.out_w, w)
        rows = np.full((p.out_h, w, c), empty, dtype=x.dtype)  # each bin row's maximum per column
        for i in range(p.out_h):
            if he[i] > hs[i]:
                rows[i] = img[hs[i]:he[i]].max(axis=0)
        for j in range(p.out_w):
            out[r, :, j] = rows[:, ws[j]:we[j]].max(axis=1) if we[j] > ws[j] else empty
    return [out.transpose(0, 3, 1, 2).copy() if p.nchw else out]


BACKEND.register(ROI_ALIGN, plan=plan, execute=execute_align)
BACKEND.register(ROI_POOLING, plan=plan, execute=execute_pooling)
