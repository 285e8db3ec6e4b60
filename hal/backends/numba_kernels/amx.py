"""Exact 8-bit GEMM sums on AMX-INT8 tiles (``tdpbusd``): int32 sums of u8 × s8 products.

An AMX tile register holds 16 rows of 64 bytes. ``tdpbusd C, A, B`` adds to each int32 of C
(16 × 16) the dot products of A's 16 rows of 64 unsigned bytes with B's 16 columns of 64 signed
ones, where B's row q holds 4 consecutive k of 16 columns: the layout of one of ``GemmPlan``'s
packed panels (16 blocks of 64 bytes, 64 k). ``sums`` computes a block of 32 (or 16) rows × every
column with 2 × 2 C tiles (rows 0-15 / 16-31 × the two panels of a pair), 2 A tiles and 2 B
tiles: the 8 tile registers. It stores the int32 sums to a small buffer in L1; the VNNI tiles'
epilogue (vnni's ``sums_*`` tiles) requantizes them from there, as it does its own registers.
``configure`` and ``release`` bracket a caller's loop of ``sums`` calls on one thread.

Each A row is read 64 bytes at a time from its start: the bytes past a row's K multiply the
zero weights ``pack`` puts past K (every product and sum is an integer, so they add exactly 0);
the caller keeps those reads inside its buffer.

Linux hands a process the AMX tile state only on request (``arch_prctl(ARCH_REQ_XCOMP_PERM,
XFEATURE_XTILEDATA)``): without it the first tile instruction faults. ``AVAILABLE`` holds where
the CPU has AMX-INT8, numba compiles for it and the request succeeded; ``$NNHAL_AMX=0`` turns the
tiles off (the VNNI tiles run every row then). Whether a plan uses them is decided when its
arguments are formed (``GemmPlan.amx_args``), never inside compiled code, so numba's cache
(keyed on the CPU's features) holds one compilation for both.
"""
from __future__ import annotations

import ctypes
import os

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from hal.backends.numba_kernels import vnni
from hal.backends.numba_kernels.simd import counted_loop, cpu_features

#: Bytes of k one tile row covers, and rows per tile.
TILE_K = 64
TILE_ROWS = 16
#: Rows of one ``sums`` block at most (2 A tiles).
BLOCK_ROWS = 32

_ARCH_REQ_XCOMP_PERM = 0x1023
_XFEATURE_XTILEDATA = 18
_SYS_ARCH_PRCTL = 158  # x86-64


def _tile_permission() -> bool:
    """Ask Linux for the AMX tile data state for this process (its threads, later ones too)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.syscall(_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA) == 0
    except (OSError, AttributeError):
        return False


#: Whether the AMX tile instructions are compiled (numba targets a CPU with them).
COMPILED = vnni.AVAILABLE and {"amx-tile", "amx-int8"} <= cpu_features()
#: Whether plans use them: compiled, the OS lets this process use them, not turned off.
AVAILABLE = COMPILED and os.environ.get("NNHAL_AMX", "1") != "0" and _tile_permission()


def aligned_zeros(n: int, dtype=np.uint8) -> np.ndarray:
    """n zeros whose first byte is on a cache line: a tile's rows that start on one load a line
    each (a misaligned operand costs ``sums`` up to twice the time)."""
    raw = np.zeros(n * np.dtype(dtype).itemsize + 64, dtype=np.uint8)
    at = -raw.ctypes.data % 64
    return raw[at:at + n * np.dtype(dtype).itemsize].view(dtype)


@numba.njit(inline="always")
def aligned_empty(n, dtype):
    """``aligned_zeros``' layout, uninitialised, inside compiled code (its scratch buffers)."""
    raw = np.empty(n + 64, dtype=dtype)
    at = (-raw.ctypes.data % 64) // raw.itemsize
    return raw[at:at + n]


def worth_it(k_bytes: int) -> bool:
    """Whether a GEMM with rows of ``k_bytes`` (K rounded to 4) runs faster on the tiles than on
    the VNNI tiles: a tile row is 64 bytes of K, so a short or ragged K multiplies mostly padding
    (measured on 1x1 layers: K = 16, 24 and 32 slower than VNNI, K = 144 faster, 192 level)."""
    return k_bytes >= TILE_K and 10 * k_bytes >= 7 * TILE_K * -(-k_bytes // TILE_K)


def pack(packed: np.ndarray, kq: int, panels: int) -> tuple[np.ndarray, int]:
    """``GemmPlan.packed`` (panel p: ``kq`` blocks of 64 bytes) -> (the same panels, each padded with
    zero blocks to whole tiles of 16 blocks, and an even number of panels (a zero one last if
    needed): the B tiles of ``sums``, on a cache line; the tiles per panel)."""
    chunks = -(-kq // TILE_ROWS)
    out = aligned_zeros((panels + panels % 2) * chunks * TILE_ROWS * TILE_K, np.int8)
    out.reshape(-1, chunks * TILE_ROWS, TILE_K)[:panels, :kq] = packed.reshape(panels, kq, TILE_K)
    return out, chunks


def _config(builder):
    """The tile configuration (palette 1; every tile 16 rows of 64 bytes) in a 64-byte stack slot."""
    i8 = ir.IntType(8)
    cfg_t = ir.ArrayType(i8, 64)
    values = [0] * 64
    values[0] = 1
    for t in range(8):
        values[16 + 2 * t] = TILE_K  # colsb, little-endian uint16
        values[48 + t] = TILE_ROWS
    slot = cgutils.alloca_once(builder, cfg_t)
    slot.align = 64
    builder.store(ir.Constant(cfg_t, values), slot)
    return builder.bitcast(slot, i8.as_pointer())


@intrinsic
def sums(typingctx, a, a_off, lda, runs, run_stride, run_chunks, w, pairs, halves, out, ldo):
    """``out[r · ldo + c] = Σ_k A[r, k] · W[k, c]`` (int32, wrapping) for rows r < 16 · ``halves``
    (1 or 2) and the 32 · ``pairs`` columns of ``pack``'s weights ``w``, ``out`` int32. Row r of A
    is ``runs`` runs of ``64 · run_chunks`` unsigned bytes of ``a``, run j at ``a_off + r · lda +
    j · run_stride``, and W's k follow the runs' bytes (``runs · run_chunks`` tiles per panel): a
    GEMM's rows (one run) or a convolution's filter rows read in place (a run per filter row, the
    output pixels ``lda`` = stride · channels apart). The tiles are to be configured already
    (``configure``, once for a caller's loop of blocks: loading the configuration costs about as
    much as a small block), and released after it (``release``)."""
    sig = types.void(a, a_off, lda, runs, run_stride, run_chunks, w, pairs, halves, out, ldo)

    def codegen(context, builder, signature, args):
        a_arr, a_off_v, lda_v, runs_v, rstride_v, rchunks_v, w_arr, pairs_v, halves_v, out_arr, ldo_v = args
        i8, i64 = ir.IntType(8), ir.IntType(64)
        i8p = i8.as_pointer()

        def data(k, arr):
            return builder.bitcast(context.make_array(signature.args[k])(context, builder, arr).data, i8p)

        def declare(name, *arg_types):
            return cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), list(arg_types)),
                                                  name)
        load, store = declare("llvm.x86.tileloadd64", i8, i8p, i64), declare("llvm.x86.tilestored64", i8, i8p, i64)
        zero, dot = declare("llvm.x86.tilezero", i8), declare("llvm.x86.tdpbusd", i8, i8, i8)

        def tmm(t):
            return ir.Constant(i8, t)

        def c64(v):
            return ir.Constant(i64, v)
        a_ptr, w_ptr, o_ptr = data(0, a_arr), data(6, w_arr), data(9, out_arr)
        both = builder.icmp_signed(">", halves_v, c64(1))
        lower_rows = builder.mul(lda_v, c64(TILE_ROWS))
        o_row = builder.mul(ldo_v, c64(4))  # bytes per output row
        chunks_v = builder.mul(runs_v, rchunks_v)
        panel_bytes = builder.mul(chunks_v, c64(TILE_ROWS * TILE_K))
        pair, _, close_pair = counted_loop(builder, "amx.pair", pairs_v)
        for t in range(4):  # C: rows 0-15 × panels 0, 1; rows 16-31 × panels 0, 1
            builder.call(zero, [tmm(t)])
        w0 = builder.gep(w_ptr, [builder.mul(builder.mul(pair, c64(2)), panel_bytes)])
        w1 = builder.gep(w0, [panel_bytes])
        run, _, close_run = counted_loop(builder, "amx.run", runs_v)
        run_a = builder.add(a_off_v, builder.mul(run, rstride_v))
        run_w = builder.mul(run, rchunks_v)
        q, _, close_k = counted_loop(builder, "amx.k", rchunks_v)
        a0 = builder.gep(a_ptr, [builder.add(run_a, builder.mul(q, c64(TILE_K)))])
        w_at = builder.mul(builder.add(run_w, q), c64(TILE_ROWS * TILE_K))
        builder.call(load, [tmm(4), a0, lda_v])
        builder.call(load, [tmm(6), builder.gep(w0, [w_at]), c64(TILE_K)])
        builder.call(load, [tmm(7), builder.gep(w1, [w_at]), c64(TILE_K)])
        builder.call(dot, [tmm(0), tmm(4), tmm(6)])
        builder.call(dot, [tmm(1), tmm(4), tmm(7)])
        with builder.if_then(both, likely=True):
            builder.call(load, [tmm(5), builder.gep(a0, [lower_rows]), lda_v])
            builder.call(dot, [tmm(2), tmm(5), tmm(6)])
            builder.call(dot, [tmm(3), tmm(5), tmm(7)])
        close_k()
        close_run()
        o0 = builder.gep(o_ptr, [builder.mul(pair, c64(2 * TILE_K))])  # 32 int32 columns per pair
        builder.call(store, [tmm(0), o0, o_row])
        builder.call(store, [tmm(1), builder.gep(o0, [c64(TILE_K)]), o_row])
        with builder.if_then(both, likely=True):
            o1 = builder.gep(o0, [builder.mul(o_row, c64(TILE_ROWS))])
            builder.call(store, [tmm(2), o1, o_row])
            builder.call(store, [tmm(3), builder.gep(o1, [c64(TILE_K)]), o_row])
        close_pair()
        return context.get_dummy_value()
    return sig, codegen


@intrinsic
def configure(typingctx):
    """Load ``sums``' tile configuration (palette 1, every tile 16 rows of 64 bytes) for this thread."""
    def codegen(context, builder, signature, args):
        i8p = ir.IntType(8).as_pointer()
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [i8p]),
                                            "llvm.x86.ldtilecfg")
        builder.call(fn, [_config(builder)])
        return context.get_dummy_value()
    return types.void(), codegen


@intrinsic
def release(typingctx):
    """Return the tiles to their initial state (``tilerelease``): a thread's context switches save
    no tile data after it."""
    def codegen(context, builder, signature, args):
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), []), "llvm.x86.tilerelease")
        builder.call(fn, [])
        return context.get_dummy_value()
    return types.void(), codegen
