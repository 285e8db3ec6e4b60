"""Float32 FULLY_CONNECTED for small batches, and chains of them as one step (hal.fusion's
``fc_chain``: a multi-layer perceptron).

With a batch of a few rows a fully connected layer is a matrix-vector product: each weight is
used once per row, so its time is the time to stream the weights through the core. The weights
are packed at plan time into column tiles of ``TILE`` units, each tile's K rows of ``TILE``
floats contiguous, a layer's last tile only ``LANES`` wide when that holds its remaining units
(a 10-unit classifier streams 16 columns, not 32), the bias padded to whole tiles. The packed
weights start on a 64-byte boundary, so each 16-float load reads one cache line, never two.
Every row's ``TILE`` sums stay in vector registers while the tile's K rows stream past: per K
step one load of the weights, shared by the batch's rows, and one fused multiply-add per 16
weights and row; then the activation's clamp and one store per 16 outputs (masked only in a
tile that ends past the layer's last unit: a masked store is microcoded on some x86 cores).
Where the registers hold fewer sums than a tile has (AVX2: 16 registers of 8 lanes, simd's
``ACCUMULATORS``), the tile runs in parts, each its own K loop over a few rows and columns
(``tile_passes``): the same multiply-adds in the same order, so the same bytes. Whole tiles
run four (1-2 rows) or two at a time, a quarter or a half of the layer apart, so the weights come
as that many sequential streams, which the core fetches in parallel (one stream is slower). A
chain runs every layer in one compiled call, its intermediate rows in a scratch buffer.

Sums are float32 in tile order (TFLite's float kernels accumulate in float32 too); the reference
backend sums in float64, so results differ by float32 rounding, far inside NNAPI's float32
tolerance (tests/backends/test_numba_fc_float.py compares, with CTS's criteria).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numba
import numpy as np
from llvmlite import ir
from numba import errors, types
from numba.core import cgutils
from numba.extending import intrinsic

from hal import quant
from hal.backends.numba_kernels.f32_lanes import activate, when
from hal.backends.numba_kernels.f32_simd import store_first
from hal.backends.numba_kernels.fixedpoint import ro, rw
from hal.backends.numba_kernels.lazy import njit
from hal.backends.numba_kernels.simd import ACCUMULATORS, _data, counted_loop, splat
from hal.operations.fully_connected import BIAS, WEIGHTS, FullyConnectedParams
from hal.registry import OperationContext

LANES = 16
#: Output units per tile: two 16-lane vectors of sums (more registers measured no faster: the
#: weights' stream is the bound).
VECTORS = 2
TILE = VECTORS * LANES
#: Rows up to this batch take the matrix-vector form; a larger batch is a GEMM (other backends).
MAX_BATCH = 4


def _vector_ptr(builder, ptr, at, vec):
    return builder.bitcast(builder.gep(ptr, [at]), vec.as_pointer())


def _split(n: int, parts: int) -> list[range]:
    """``range(n)`` cut into ``parts`` consecutive runs whose lengths differ by one at most."""
    cuts = [n * i // parts for i in range(parts + 1)]
    return [range(a, b) for a, b in zip(cuts, cuts[1:])]


def tile_passes(rows: int, columns: int, budget: int = ACCUMULATORS) -> list[tuple[range, range]]:
    """How a tile of ``rows`` × ``columns`` 16-lane vectors of sums is computed: (rows, columns)
    parts, each one K loop keeping its rows × columns sums in registers, at most ``budget`` of
    them (whole columns first: each part's weights are loaded once per K step for all its rows).
    One part where the tile fits (every tile on AVX-512); column parts outside, row parts inside,
    so a column part's weights are still in the cache for its next rows."""
    if rows * columns <= budget:
        return [(range(rows), range(columns))]
    per = max(1, min(columns, budget // rows))
    column_parts = _split(columns, -(-columns // per))
    per_row = max(1, budget // max(len(c) for c in column_parts))
    return [(r, c) for c in column_parts for r in _split(rows, -(-rows // per_row))]


def _tile_codegen(rows: int, vectors: int, streams: int, segmented: bool, fused: bool = False,
                  budget: int = ACCUMULATORS):
    """The code of ``_tile_of``'s intrinsics: a row tile's K loop, clamp and masked stores. With
    ``segmented``, row r's K values are not one run at x_off + r·K: they start at x_off +
    r·x_stride and come in runs of ``seg_len`` floats, each next run ``seg_gap`` floats after
    the last one's end (a convolution's window read in place: one run per filter row). With
    ``fused`` (and ``segmented``), five more arguments: res, alpha, flags, lo2, hi2: before the
    store, each clamped sum adds res at the output's position (flags & 1) and is clamped to
    [lo2, hi2], then PRELU's slope alpha[channel] scales it where it is not >= 0 (flags & 2),
    then the activation flags >> 2 (f32_lanes' ``ACT_*``) is applied: a convolution's residual
    ADD, PRELU and activation applied in registers (f32_conv's ``conv_epilogue``; each part a
    branch the layer's flags take or skip: ``_epilogue_code``). A tile with more sums than the
    registers keep runs as ``tile_passes``' parts, each its own K loop and stores."""
    width = vectors * LANES
    columns = [(s, v) for s in range(streams) for v in range(vectors)]

    def codegen(context, builder, signature, args):
        w_arr, w_off_v, x_arr, x_off_v, k_v, b_arr, b_off_v, lo_v, hi_v, o_arr, o_off_v, o_step, count_v, \
            apart_v = args[1:15]
        f32, i32, i64 = ir.FloatType(), ir.IntType(32), ir.IntType(64)
        vf = ir.VectorType(f32, LANES)
        sa = signature.args[1:]
        wp, xp = _data(context, builder, sa[0], w_arr, f32), _data(context, builder, sa[2], x_arr, f32)
        bp, op = _data(context, builder, sa[5], b_arr, f32), _data(context, builder, sa[9], o_arr, f32)
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vf, [vf, vf, vf]), "llvm.fma.v16f32")

        def load(ptr, at):
            return builder.load(_vector_ptr(builder, ptr, at, vf), align=4)

        def const(n):
            return ir.Constant(i64, n)
        # stream s's tile is ``apart`` tiles after stream 0's: its weights, bias and outputs
        step = builder.mul(apart_v, const(width))
        w_base = [builder.add(w_off_v, builder.mul(const(s), builder.mul(step, k_v))) for s in range(streams)]
        b_base = [builder.add(b_off_v, builder.mul(const(s), step)) for s in range(streams)]
        o_base = [builder.add(o_off_v, builder.mul(const(s), step)) for s in range(streams)]
        x_stride = args[15] if segmented else k_v
        lo_s, hi_s = splat(builder, lo_v, vf), splat(builder, hi_v, vf)
        lanes = ir.Constant(ir.VectorType(i32, LANES), list(range(LANES)))
        for part_rows, part_columns in tile_passes(rows, len(columns), budget):
            cols = [columns[c] for c in part_columns]
            bias = {(s, v): load(bp, builder.add(b_base[s], const(v * LANES))) for s, v in cols}
            if segmented:
                seg_len, seg_gap = args[16:18]
                carried = [x_off_v, const(0)]  # the K step's x offset of row 0, its place in the run
            else:
                carried = []
            k, phis, close = counted_loop(builder, "fc", k_v, carried + [bias[c] for _ in part_rows for c in cols])
            at = phis[0] if segmented else builder.add(x_off_v, k)
            flat = iter(phis[len(carried):])
            sums = {(r, c): next(flat) for r in part_rows for c in cols}
            kw = builder.mul(k, const(width))
            weights = {(s, v): load(wp, builder.add(builder.add(w_base[s], kw), const(v * LANES))) for s, v in cols}
            new = []
            for r in part_rows:  # each weight loaded once, used by every row of the part
                xi = builder.add(at, builder.mul(const(r), x_stride))
                xk = splat(builder, builder.load(builder.gep(xp, [xi])), vf)
                new.extend(builder.call(fma, [xk, weights[c], sums[r, c]]) for c in cols)
            if segmented:  # the next float of the run, or the next run's first
                j = builder.add(phis[1], const(1))
                wrap = builder.icmp_signed("==", j, seg_len)
                skip = builder.select(wrap, builder.add(seg_gap, const(1)), const(1))
                new = [builder.add(phis[0], skip), builder.select(wrap, const(0), j)] + new
            close(new)
            clamped = []  # (value, offset, vector)
            for s, v in sorted(cols, key=lambda c: c[1]):
                for r in part_rows:
                    # NaN stays NaN (both comparisons false), as the reference's clip keeps it
                    y = sums[r, (s, v)]
                    y = builder.select(builder.fcmp_ordered("<", y, lo_s), lo_s, y)
                    y = builder.select(builder.fcmp_ordered(">", y, hi_s), hi_s, y)
                    o = builder.add(o_base[s], builder.add(builder.mul(const(r), o_step), const(v * LANES)))
                    clamped.append((y, o, v))

            def emit(clamped, keeps):
                """The epilogue and the stores, of lanes ``keeps[v]`` (None: every lane, plain
                moves: a masked store is microcoded on some x86 cores)."""
                ys = [y for y, _, _ in clamped]
                if fused:
                    ys = _epilogue_code(context, builder, sa, args, ys,
                                        [(o, keeps and keeps[v], b_base[0], v) for _, o, v in clamped])
                for y, (_, o, v) in zip(ys, clamped):
                    if keeps is None:
                        builder.store(y, _vector_ptr(builder, op, o, vf), align=4)
                    else:
                        store_first(builder, y, builder.gep(op, [o]), builder.sub(count_v, const(v * LANES)))
            with builder.if_else(builder.icmp_signed(">=", count_v, const(width))) as (whole, partial):
                with whole:
                    emit(clamped, None)
                with partial:
                    keeps = {}
                    for v in range(vectors):
                        left = builder.trunc(builder.sub(count_v, const(v * LANES)), i32)
                        keeps[v] = builder.icmp_signed("<", lanes, splat(builder, left, ir.VectorType(i32, LANES)))
                    emit(clamped, keeps)
        return context.get_dummy_value()
    return codegen


def _epilogue_code(context, builder, sa, args, ys: list, where: list) -> list:
    """A fused tile's epilogue on its clamped sums ``ys`` (``where``: each one's output offset,
    lanes (None: all), bias offset and vector): the residual ADD and its clamp (flags & 1), PRELU
    (flags & 2), the activation (flags >> 2), each a branch taken or not for the whole call (the
    flags are the layer's), so that a layer pays only for what it fuses."""
    f32, i32, i64 = ir.FloatType(), ir.IntType(32), ir.IntType(64)
    vf = ir.VectorType(f32, LANES)
    res_arr, alpha_arr, flags_v, lo2_v, hi2_v = args[18:23]
    rp, ap = _data(context, builder, sa[17], res_arr, f32), _data(context, builder, sa[18], alpha_arr, f32)
    mask = ir.VectorType(ir.IntType(1), LANES)
    masked_load = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(vf, [vf.as_pointer(), i32, mask, vf]), "llvm.masked.load.v16f32.p0")
    zero = ir.Constant(vf, [0.0] * LANES)

    def load(ptr, at, keep):
        if keep is None:
            return builder.load(_vector_ptr(builder, ptr, at, vf), align=4)
        return builder.call(masked_load, [_vector_ptr(builder, ptr, at, vf), ir.Constant(i32, 4), keep, zero])

    def flag(bit):
        return builder.icmp_signed("!=", builder.and_(flags_v, ir.Constant(i64, bit)), ir.Constant(i64, 0))

    def residual(values):
        lo2, hi2 = splat(builder, lo2_v, vf), splat(builder, hi2_v, vf)
        out = []
        for y, (o, keep, _, _) in zip(values, where):
            y = builder.fadd(y, load(rp, o, keep))
            y = builder.select(builder.fcmp_ordered("<", y, lo2), lo2, y)
            out.append(builder.select(builder.fcmp_ordered(">", y, hi2), hi2, y))
        return out

    def prelu(values):
        slopes = {}
        out = []
        for y, (_, keep, b_at, v) in zip(values, where):
            if v not in slopes:  # this vector's channels' slopes (bias and alpha are indexed by channel alike)
                slopes[v] = load(ap, builder.add(b_at, ir.Constant(i64, v * LANES)), keep)
            out.append(builder.select(builder.fcmp_ordered(">=", y, zero), y, builder.fmul(y, slopes[v])))
        return out
    ys = when(builder, flag(1), ys, residual)
    ys = when(builder, flag(2), ys, prelu)
    return activate(builder, builder.and_(builder.ashr(flags_v, ir.Constant(i64, 2)), ir.Constant(i64, 3)), ys)


def _rows_of(n_rows) -> int:
    if not isinstance(n_rows, types.IntegerLiteral):
        raise errors.RequireLiteralValue(f"the row count must be a compile-time constant, not {n_rows}")
    return n_rows.literal_value


def _tile_of(vectors: int = VECTORS, streams: int = 1, budget: int = ACCUMULATORS):
    """The intrinsic for tiles of ``vectors`` × 16 units, ``streams`` tiles at once (see
    ``run_chain``); its first argument, the row count, must be a compile-time constant: the code
    is unrolled for it, one specialisation per count. ``budget``: ``tile_passes``' (tests set it)."""

    @intrinsic
    def tile(typingctx, n_rows, w, w_off, x, x_off, k_count, b, b_off, lo, hi, out, o_off, o_stride, count, apart):
        sig = types.void(n_rows, w, w_off, x, x_off, k_count, b, b_off, lo, hi, out, o_off, o_stride, count, apart)
        return sig, _tile_codegen(_rows_of(n_rows), vectors, streams, False, budget=budget)
    return tile


def _window_tile_of(vectors: int = VECTORS):
    """``_tile_of``'s tile (one stream) whose rows read a convolution's windows in place: the
    arguments after ``apart`` are x_stride, seg_len, seg_gap (``_tile_codegen``)."""

    @intrinsic
    def tile(typingctx, n_rows, w, w_off, x, x_off, k_count, b, b_off, lo, hi, out, o_off, o_stride, count, apart,
             x_stride, seg_len, seg_gap):
        sig = types.void(n_rows, w, w_off, x, x_off, k_count, b, b_off, lo, hi, out, o_off, o_stride, count, apart,
                         x_stride, seg_len, seg_gap)
        return sig, _tile_codegen(_rows_of(n_rows), vectors, 1, True)
    return tile


def _fused_tile_of(vectors: int = VECTORS):
    """``_window_tile_of``'s tile with the epilogue's five arguments after seg_gap: res, alpha,
    flags, lo2, hi2 (``_tile_codegen``)."""

    @intrinsic
    def tile(typingctx, n_rows, w, w_off, x, x_off, k_count, b, b_off, lo, hi, out, o_off, o_stride, count, apart,
             x_stride, seg_len, seg_gap, res, alpha, flags, lo2, hi2):
        sig = types.void(n_rows, w, w_off, x, x_off, k_count, b, b_off, lo, hi, out, o_off, o_stride, count, apart,
                         x_stride, seg_len, seg_gap, res, alpha, flags, lo2, hi2)
        return sig, _tile_codegen(_rows_of(n_rows), vectors, 1, True, True)
    return tile


#: ``_tile(rows, w, w_off, x, x_off, K, b, b_off, lo, hi, out, o_off, o_stride, count, apart)``:
#: for rows r < ``rows``, out[o_off + r·o_stride:][:count] = clamp(b[b_off:][:count] + x[x_off +
#: r·K:][:K] @ tile, lo, hi) for the packed tile at w[w_off:] (K rows of TILE floats; count <=
#: TILE). Every row's sums in registers, each weight vector loaded once per K step for all rows.
#: ``_narrow``: the same for a tile of K rows of LANES floats (count <= LANES). ``_pair``: two whole
#: tiles at once, the second ``apart`` tiles after the first (its weights, bias and outputs): two
#: sequential streams of weights, which the core fetches faster than one. ``_quad`` (1-2 rows: their
#: 8 or 16 vectors of sums and 8 of weights fit the 32 vector registers): four whole tiles, each
#: ``apart`` after the one before.
_tile, _narrow, _pair, _quad = _tile_of(), _tile_of(1), _tile_of(streams=2), _tile_of(streams=4)
#: ``_window_tile``, ``_window_narrow``: ``_tile`` and ``_narrow`` reading windows in place
#: (numba_kernels/f32_conv.py's direct convolutions); ``_fused_tile``, ``_fused_narrow``: the
#: same with a residual ADD and PRELU applied before the store (``_tile_codegen``).
_window_tile, _window_narrow = _window_tile_of(), _window_tile_of(1)
_fused_tile, _fused_narrow = _fused_tile_of(), _fused_tile_of(1)

_SIG = [numba.void(ro(np.float32, 1), ro(np.float32, 1), ro(np.float32, 1), ro(np.int64, 2), ro(np.float32, 2),
                   numba.int64, rw(np.float32, 1))]


def _chain_of(rows: int):
    """``run_chain`` compiled for a batch of ``rows``, so that the caller picks the function once
    (``FloatFc.bind``) and no call branches on the batch. ``rows`` is a constant of the compiled
    code (numba types a closure's int as a literal), which the kernels unroll. The closure holds
    that int only: numba's cache keys a closure on its cells' pickle, and a kernel's or a jitted
    function's pickle differs per process, which would recompile at every start."""

    @njit(_SIG, cache=True, nogil=True)
    def run_chain(x, weights, biases, layers, clamps, widest, out):
        """Every layer of a chain on ``rows`` rows: layer l (``layers[l]`` = K, N, its packed
        weights' offset in ``weights``, its padded bias's offset in ``biases``; ``clamps[l]`` = its
        activation's bounds) reads the previous layer's rows (``x`` for the first) and writes
        ``out`` (the last) or one half of a scratch buffer (the others; each half holds rows ×
        ``widest``, the widest layer). The scratch is allocated here, per call: concurrent calls
        never share it, and this allocation measured as cheap as a buffer passed in, where numpy's
        from Python was not."""
        n_layers = layers.shape[0]
        half = rows * widest
        scratch = np.empty(2 * half, np.float32)
        for layer in range(n_layers):
            k_count, n_units, w_at, b_at = layers[layer, 0], layers[layer, 1], layers[layer, 2], layers[layer, 3]
            lo, hi = clamps[layer, 0], clamps[layer, 1]
            src = x if layer == 0 else scratch[((layer - 1) % 2) * half:((layer - 1) % 2 + 1) * half]
            dst = out if layer == n_layers - 1 else scratch[(layer % 2) * half:(layer % 2 + 1) * half]
            whole = n_units // TILE
            quads = 0
            if rows <= 2:  # (a constant: numba drops the branch for 3-4 rows, which have no _quad)
                # whole tiles t, t + quads, t + 2·quads, t + 3·quads together
                quads = whole // 4
                for t in range(quads):
                    _quad(rows, weights, w_at + t * k_count * TILE, src, 0, k_count, biases, b_at + t * TILE, lo,
                          hi, dst, t * TILE, n_units, TILE, quads)
            done = 4 * quads
            pairs = (whole - done) // 2  # then tiles t and t + pairs
            for t in range(done, done + pairs):
                _pair(rows, weights, w_at + t * k_count * TILE, src, 0, k_count, biases, b_at + t * TILE, lo, hi,
                      dst, t * TILE, n_units, TILE, pairs)
            for t in range(done + 2 * pairs, (n_units + TILE - 1) // TILE):
                w, b, o, count = w_at + t * k_count * TILE, b_at + t * TILE, t * TILE, min(TILE, n_units - t * TILE)
                if count <= LANES:  # the layer's last tile, packed LANES wide
                    _narrow(rows, weights, w, src, 0, k_count, biases, b, lo, hi, dst, o, n_units, count, 0)
                else:
                    _tile(rows, weights, w, src, 0, k_count, biases, b, lo, hi, dst, o, n_units, count, 0)
    return run_chain


#: ``CHAINS[batch - 1]``: ``run_chain`` for that batch.
CHAINS = tuple(_chain_of(rows) for rows in range(1, MAX_BATCH + 1))


@dataclass
class FloatFc:
    """FULLY_CONNECTED layers ready to run (one, or a chain): packed weights and padded biases of
    every layer back to back, each layer's (K, N, weight offset, bias offset) and clamp bounds."""

    weights: np.ndarray  # float32, flat
    biases: np.ndarray  # float32, flat
    layers: np.ndarray  # int64 [L, 4]
    clamps: np.ndarray  # float32 [L, 2]
    batch: int
    widest: int  # the largest output width of a layer before the last (0: one layer)

    def run(self, x: np.ndarray, out: np.ndarray) -> np.ndarray:
        CHAINS[self.batch - 1](x.reshape(-1), self.weights, self.biases, self.layers, self.clamps, self.widest,
                               out.reshape(-1))
        return out

    def bind(self, inputs: list[np.ndarray], outputs: list[np.ndarray]):
        """A runner computing from ``inputs[0]``'s current contents into ``outputs[0]`` (fixed
        C-contiguous float32 arrays: a burst's slots), with no per-call work in Python but the call."""
        x, out = inputs[0].reshape(-1), outputs[0].reshape(-1)
        # a partial of the compiled chain: native_chain.py calls it without Python (a WHILE's body)
        return functools.partial(CHAINS[self.batch - 1], x, self.weights, self.biases, self.layers, self.clamps,
                                 self.widest, out)


def _widths(n: int) -> tuple[int, bool]:
    """``pack``'s tiles for n units: how many TILE wide, and whether a last one LANES wide."""
    full, rest = divmod(n, TILE)
    return full + (rest > LANES), 0 < rest <= LANES


def pack(weights: np.ndarray) -> np.ndarray:
    """[N, K] weights as tiles of [K, TILE], the last one [K, LANES] when N mod TILE <= LANES
    (zero columns past N), flat."""
    n, k = weights.shape
    wide, narrow = _widths(n)
    padded = np.zeros((wide * TILE + narrow * LANES, k), np.float32)
    padded[:n] = weights
    tiles = padded[:wide * TILE].reshape(wide, TILE, k).transpose(0, 2, 1)
    return np.concatenate([tiles.reshape(-1), padded[wide * TILE:].T.reshape(-1)])


def _on_a_line(parts: list[np.ndarray]) -> np.ndarray:
    """``parts`` back to back in a new float32 array that starts on a 64-byte boundary."""
    n = sum(p.size for p in parts)
    raw = np.empty(n + LANES, np.float32)
    skip = (-raw.ctypes.data % 64) // 4
    return np.concatenate(parts, out=raw[skip:skip + n])


def layers_of(params: list[FullyConnectedParams], weights: list[np.ndarray], biases: list[np.ndarray]) -> FloatFc:
    """The packed chain of these layers (each [N, K] weights, [N] or empty bias), in order."""
    packed, padded, rows, clamps = [], [], [], []
    w_at = b_at = 0
    for p, w, b in zip(params, weights, biases):
        tiles = -(-p.num_units // TILE)
        packed.append(pack(np.asarray(w, np.float32)))
        bias = np.zeros(tiles * TILE, np.float32)
        if b is not None and b.size:
            bias[:p.num_units] = b
        padded.append(bias)
        rows.append((p.input_size, p.num_units, w_at, b_at))
        clamps.append(quant.activation_range_float(p.act))
        w_at += packed[-1].size
        b_at += bias.size
    widest = max((p.num_units for p in params[:-1]), default=0)
    return FloatFc(_on_a_line(packed), np.concatenate(padded), np.array(rows, np.int64),
                   np.array(clamps, np.float32), params[0].batch, widest)


def supports(ctx: OperationContext) -> str | None:
    p: FullyConnectedParams = ctx.params
    if not (ctx.input(WEIGHTS).is_constant and ctx.input(BIAS).is_constant):
        return "weights or bias is not a constant"
    if not 0 < p.batch <= MAX_BATCH:
        return f"a batch of {p.batch} rows (the float kernel takes 1-{MAX_BATCH})"
    return None


def plan(ctx: OperationContext) -> FloatFc:
    p: FullyConnectedParams = ctx.params
    return layers_of([p], [ctx.input(WEIGHTS).value], [ctx.input(BIAS).value])


def execute(ctx: OperationContext, inputs: list) -> list:
    d: FloatFc = ctx.data
    x = np.ascontiguousarray(inputs[0], np.float32)
    return [d.run(x, np.empty((d.batch, int(d.layers[-1, 1])), np.float32))]


def plan_chain(ctx) -> FloatFc | None:
    """hal.fusion's ``fc_chain`` (a ``FusedContext``): the members' packed layers as one chain.
    Reads the members' plans only (a plan from the compilation cache has no parameters)."""
    datas = [s.ctx.data for s in ctx.members]
    if not all(isinstance(d, FloatFc) and d.layers.shape[0] == 1 for d in datas) \
            or len({d.batch for d in datas}) != 1:
        return None
    widths = [(int(d.layers[0, 0]), int(d.layers[0, 1])) for d in datas]
    if any(n != k for (_, n), (k, _) in zip(widths, widths[1:])):
        return None
    rows, at_w, at_b = [], 0, 0
    for (k, n), d in zip(widths, datas):
        rows.append((k, n, at_w, at_b))
        at_w += d.weights.size
        at_b += d.biases.size
    return FloatFc(_on_a_line([d.weights for d in datas]), np.concatenate([d.biases for d in datas]),
                   np.array(rows, np.int64), np.concatenate([d.clamps for d in datas]), datas[0].batch,
                   max(n for _, n in widths[:-1]))


__all__ = ["CHAINS", "FloatFc", "MAX_BATCH", "TILE", "execute", "layers_of", "pack", "plan", "plan_chain",
           "supports"]
