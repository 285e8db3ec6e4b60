"""The numba backend: quantized (uint8 / int8) operations compiled to native code, bit-exact with
the reference backend (and so with TFLite's reference kernels).

How it stays exact and fast:
- CONV_2D / GROUPED_CONV_2D / FULLY_CONNECTED where the CPU has AVX-512 VNNI (vnni.py, gemm.py):
  weights packed at plan time for ``vpdpbusd`` (u8 × s8 → int32, every sum exact and wrapping as
  TFLite's int32 accumulator), zero points and the uint8/int8 shifts folded into a per-column bias
  (and a per-row term for weight zero points), MR × 16·NR tiles in registers, TFLite's
  requantization (SaturatingRoundingDoublingHighMul, rounding shift, zero point, clamp) fused into
  each tile's epilogue on 16 lanes (a four-panel tile narrows a row's 64 columns with saturating
  packs, one 64-byte store). A 1×1 stride-1 layer reads its NHWC input in place; a single-group
  layer whose input channels are a multiple of 4 reads its taps in place through a plan-time
  indirection table (zero-point bytes for padding); others gather their rows in bytes. Without
  VNNI: float32 BLAS sgemm (exact for 8-bit products in K chunks below 2^24), then one fused
  requantization pass (requant_rows.py: 16 lanes at a time where every shift is a right shift).
- int8 BATCH_MATMUL (batch_matmul.py): each batch slice one GEMM on the same tiles, the right-hand
  side packed at plan time where it is constant (else at each execution), both zero points folded.
- DEPTHWISE_CONV_2D (depthwise.py): 16 channels × a run of output pixels per call, out-of-image
  taps reading the zero point (folded into the bias), so the interior needs no bounds checks. With
  VNNI (dw_vnni.py) each input column's filter rows become one ``vpdpbusd`` operand, built once and
  shared by the pixels whose windows hold it; else taps unrolled in vector registers (int16 tap
  pairs and ``vpdpwssd``).
- ADD, SUB, MUL: computed 16 lanes at a time as TFLite computes them, admitted per operation only
  after matching the reference on all 65,536 input pairs; unary 8-bit operations (LOGISTIC, TANH,
  HARD_SWISH, RELU*, DEQUANTIZE) and any binary one that is not admitted: a table of the reference
  kernel's result for every possible input, then one lookup pass (64 bytes per step with VBMI).
The vector kernels are LLVM IR written out as numba intrinsics (simd.py, vnni.py): numba's own
loops do not vectorise over a few dozen channels, nor find ``vpdpbusd``.
- Float UNIDIRECTIONAL_SEQUENCE_LSTM / BIDIRECTIONAL_SEQUENCE_LSTM (lstm.py): each cell's whole
  sequence in one compiled loop (the reference cell's float64 arithmetic, within CTS's float
  tolerance of it), instead of numpy calls per gate and time step.
- Float FULLY_CONNECTED of a batch of 1-4 rows (fc_float.py): weights packed in column tiles,
  every row's sums in registers; chained layers (a perceptron) as one step (hal.fusion's
  ``fc_chain``), which the compiler also takes from a graph backend's run of only such layers.
- Float32 CNNs (f32_conv.py, f32_depthwise.py, f32_expand.py, f32_elementwise.py, f32_layout.py,
  f32_softmax.py, f32_activations.py, f32_lanes.py, f32_reduce_resize.py):
  CONV_2D on the same tiles (1x1 layers read their NHWC input in place; a zero PAD before it, a
  residual ADD, a PRELU and a hard-swish or swish after it applied in its epilogue, hal.fusion's
  ``conv_epilogue``), DEPTHWISE_CONV_2D in 16-channel vector IR (a PAD and an activation fused
  alike; an expansion that would outgrow L2 computed as it reaches it, ``expand_depthwise``),
  ADD, MUL, PRELU, NHWC MAX_POOL_2D, AVERAGE_POOL_2D, PAD / PAD_V2, CONCATENATION, RESHAPE, STRIDED_SLICE (on
  f32_simd.py's 16-lane float IR), SOFTMAX, LOGISTIC (a vectorised float32 exp, within a few ULP
  of the reference's), HARD_SWISH, MEAN (float64 sums, as numpy's
  mean) and NHWC RESIZE_BILINEAR (the reference's plan of indexes and weights), one pass each with
  the reference's arithmetic (sums in float32 but MEAN's). They run float operations when an
  order puts numba before onnxruntime, and at one compute thread the compiler also hands
  onnxruntime's float32 runs they cover wholly to them (hal.compiler's ``_whole_run_instead``),
  chained natively, but for runs with a LOGISTIC (``leaves_runs_with``);
  $NNHAL_NUMBA_FLOAT_RUNS=0 keeps every run on onnxruntime (see ``FLOAT_RUNS_VARIABLE``).
- WHILE loops (counters.py: int32 ADD, SUB, MUL, the comparisons, CAST to its own type; float32
  TANH in f32_activations.py): a loop whose condition and body subgraphs these kernels plan
  wholly is taken from onnxruntime's run like the float runs above, and its bound trips are one
  native call (native_chain.py's ``loop``, hal.bound_loop), the clock read before each trip.
Operations or forms it does not take (other float operations, NCHW, non-constant filters, ...) fall back to the
next backend of the preference order, ultimately the reference backend.

Kernels are compiled for their exact signatures the first time this package is imported on a
machine (``make setup``'s warm-up, else a service's start), never during an execution, and cached
on disk by numba in a per-user directory ($NNHAL_NUMBA_CACHE_DIR, else $XDG_CACHE_HOME/nnhal/numba
or ~/.cache/nnhal/numba), one subdirectory per (installation path, sources, numba, Python) so that
two environments (LiteRT's numpy 2 and tflite-runtime's numpy 1) never overwrite each other's
kernels, and a second installation is filled by its own first start. Once that
directory is filled, a process loads each kernel from it when the kernel is first used (lazy.py):
a process pays for the kernels its models run, not for all of them. A kernel whose cache files
cannot be read is compiled again, by one process at a time (lazy.py's ``LOCK``). A compilation says
so on stderr: it takes tens of seconds, once per machine, installation and environment.
"""
from __future__ import annotations

import contextlib
import os
import pathlib
import sys

import numba  # ImportError: the backend is unavailable, hal.backends says so


def cache_dir() -> pathlib.Path:
    explicit = os.environ.get("NNHAL_NUMBA_CACHE_DIR")
    if explicit:
        return pathlib.Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "nnhal" / "numba"


def _sources_digest(package: pathlib.Path | None = None) -> str:
    """Digest of this package's place and sources, numba's version and Python's. numba keys a cached
    kernel on its own file only, not on the helpers inlined into it (fixedpoint.py): a directory per
    source digest makes any edit recompile everything, and leaves nothing stale behind to load.
    numba files a kernel under its source file's directory path too, so a second installation (a
    checkout elsewhere, a wheel) of the same sources has none of the first one's kernels: its own
    directory, filled by its own first start (FILLED_MARKER) rather than compiled piecemeal by
    whichever processes first run each kernel. numba drops a cache index written by another numba
    version, so environments with different numbas sharing one directory would recompile at every
    start."""
    import hashlib
    package = (package or pathlib.Path(__file__).parent).resolve()
    h = hashlib.sha256(f"numba {numba.__version__} python {sys.version_info[:2]} at {package}".encode())
    for p in sorted(package.glob("*.py")):
        h.update(p.name.encode() + b"\0" + p.read_bytes())
    return h.hexdigest()[:16]


def _prepare_cache(keep_days: float = 14.0) -> pathlib.Path:
    """This source digest's numba cache directory (touched on use). Directories of other digests
    unused for ``keep_days`` are removed: another installed nnhal version may still use a recent
    one, and deleting it would make the two recompile at every start."""
    import shutil
    import time
    root = cache_dir()
    mine = root / _sources_digest()
    try:
        mine.mkdir(parents=True, exist_ok=True)
        os.utime(mine)
        for d in root.iterdir():
            if d != mine and d.is_dir() and time.time() - d.stat().st_mtime > keep_days * 86400:
                shutil.rmtree(d, ignore_errors=True)
    except OSError:
        pass  # unwritable: numba then compiles without caching
    return mine


CACHE = _prepare_cache()
os.environ["NUMBA_CACHE_DIR"] = str(CACHE)
numba.config.CACHE_DIR = str(CACHE)  # numba is imported: its config reads the variable no more

from hal.backends import Backend, register_backend  # noqa: E402
from hal.backends.numba_kernels import amx as _amx  # noqa: E402 - CPU features and the OS's AMX grant
from hal.backends.numba_kernels import lazy as _lazy  # noqa: E402
from hal.backends.numba_kernels import vnni as _vnni  # noqa: E402 - CPU features only, compiles nothing
from hal.types import OperandType, OperationType  # noqa: E402

#: Bump when a kernel's results or plan data change meaning; the identity also hashes the sources.
#: Plans packed for VNNI only run where it exists: the CPU's kind is part of the version, so a
#: compilation cache entry never moves between the two kinds of machine. Plans for the AMX tiles
#: (amx_conv's) fall back to the VNNI tiles where AMX is off; "-amx" keeps a machine with it from
#: loading entries planned without it (which would run on the VNNI tiles only).
VERSION = ("2-vnni-amx" if _amx.AVAILABLE else "2-vnni") if _vnni.AVAILABLE else "2"

#: The reference backend is part of what this one is: its table-driven kernels are tabulated by
#: the reference kernels (lut.py), so an edit there changes this backend's identity too.
BACKEND = Backend("numba", VERSION, modules=("hal.backends.numba_kernels", "hal.backends.reference"), priority=10,
                  description=f"numba {numba.__version__}: quantized kernels (AVX-512 VNNI and AMX-INT8 tiles "
                              "where the CPU has them), bit-exact with reference; float32 CNN kernels, "
                              "small-batch FULLY_CONNECTED and sequence LSTMs")
#: onnxruntime's float32 runs that the float kernels cover wholly are theirs (hal.compiler's
#: ``_whole_run_instead``, at one compute thread) unless this is set to 0. Measured in process
#: against onnxruntime's run (1 thread, same process; with windows read in place and the
#: epilogue in registers), they run an iris-style PReLU network 0.72 -> 0.58 ms (LiteRT 0.62),
#: face-style 1.04 -> 0.90 (1.05), BlazeFace-style 1.01 -> 0.92 (1.38), a pose-style
#: encoder-decoder 2.36 -> 2.03 (2.57), and MobileNetV2 level (5.62 -> 5.59; 5.47). Runs of int32
#: operations too (counters.py's): a WHILE loop's condition and body subgraphs, which then run as
#: one native loop (native_chain.py's ``loop``) instead of onnxruntime's Loop node.
FLOAT_RUNS_VARIABLE = "NNHAL_NUMBA_FLOAT_RUNS"
if os.environ.get(FLOAT_RUNS_VARIABLE, "1") != "0":
    BACKEND.takes_runs = {"onnxruntime": frozenset({OperandType.TENSOR_FLOAT32, OperandType.TENSOR_INT32})}
#: A run with a LOGISTIC (EfficientNet's swish and squeeze-excite gates) stays onnxruntime's: these
#: kernels apply a swish in their convolutions' epilogues too, but their float32 sigmoid costs more
#: than onnxruntime's (EfficientNet-B0 in process: 10.9 ms on onnxruntime, 11.2 on these kernels).
#: A HARD_SWISH is theirs (MobileNetV3-small 1.54 -> 1.49 ms).
BACKEND.leaves_runs_with = frozenset({OperationType.LOGISTIC})


#: Written into the cache directory once one process has imported every kernel module into it.
FILLED_MARKER = "filled"
_lazy.LOCK.path = CACHE / ".lock"


@contextlib.contextmanager
def _filling():
    """Held while a process imports the kernel modules into a cache directory not yet filled: the
    directory's exclusive lock (lazy.py's ``LOCK``: numba's cache is not safe for processes filling
    it at once), and, once every module is imported, the FILLED_MARKER. Yields whether the lock is
    held: not where the directory is filled already (loads then take the shared lock, kernel by
    kernel), nor where it cannot be locked."""
    if (CACHE / FILLED_MARKER).exists():
        yield False
        return
    with _lazy.LOCK.hold(exclusive=True) as held:
        yield held
        try:
            (CACHE / FILLED_MARKER).touch()
        except OSError:
            pass


#: $NNHAL_NUMBA_EAGER=1: every kernel is loaded when the package is imported, not when a plan first
#: runs it: for a service whose first prepares should load nothing, or whose memory is measured from
#: its start (tests.fuzz's RSS bound).
EAGER_VARIABLE = "NNHAL_NUMBA_EAGER"


def _load() -> None:
    """Import every kernel module, the first time into this cache directory under ``_filling`` and
    compiling every kernel as it is declared; into a filled directory, each kernel is loaded from
    it when first used (lazy.py). A cache file that cannot be read costs its kernel a compilation,
    never the backend (lazy.py too)."""
    import importlib
    import pkgutil
    import time
    names = [f"{__name__}.{m.name}" for m in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name)]
    with _filling():
        _lazy.EAGER = not (CACHE / FILLED_MARKER).exists() or os.environ.get(EAGER_VARIABLE) == "1"
        compiling = not any(CACHE.rglob("*.nbi"))
        if compiling:  # a first start on this machine: tens of seconds in which nothing else is said
            print(f"nnhal: compiling the numba kernels once for this machine and environment (into {CACHE})...",
                  file=sys.stderr, flush=True)
        t0 = time.monotonic()
        for name in names:
            importlib.import_module(name)
        if compiling:
            print(f"nnhal: numba kernels compiled in {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)


_load()
from hal.backends.numba_kernels.native_chain import chain as _chain  # noqa: E402 - loaded by _load
from hal.backends.numba_kernels.native_chain import loop as _loop  # noqa: E402

BACKEND.chain, BACKEND.loop, BACKEND.ready = _chain, _loop, _lazy.ready
register_backend(BACKEND)
