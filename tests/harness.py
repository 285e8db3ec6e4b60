"""One-op model harness: the same .tflite model through TFLite and through hal.

The oracle is TFLite's CPU interpreter with the *reference* kernels
(OpResolverType.BUILTIN_REF): quantized results must be bit-exact against it,
float results within 1e-5 relative, with CTS's 1e-5 absolute floor (see
../shared/notes/tflite-oracle.md).
hal runs the model after our own TFLite->NNAPI translation
(delegate.mapping.convert_partition) and compilation, as the service will.
"""
from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from delegate.mapping import convert_partition
from delegate.runtime import Interpreter, OpResolverType
from delegate.tfl import read_model
from hal.compiler import compile_model
from hal.executor import execute
from hal.serialize import dump_compiled, load_compiled
from tests.backends.differential import check_against_reference

#: Hypothesis profile for op tests: no deadline (TFLite interpreter start-up varies), few examples.
OP_SETTINGS = settings(max_examples=30, deadline=None,
                       suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def per_operation_order() -> list[str]:
    """The backend preference without graph backends: every operation planned and run on its own,
    as a model planned during execution always is (for comparing the two bit for bit)."""
    from hal import backends
    from hal.backends.graph import GraphBackend
    return [n for n in backends.preference() if not isinstance(backends.get(n), GraphBackend)]


def tflite_run(model: bytes, inputs: list[np.ndarray], *, reference: bool = True) -> list[np.ndarray]:
    """Run with TFLite: reference kernels by default, else the builtin optimized kernels."""
    kind = OpResolverType.BUILTIN_REF if reference else OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
    it = Interpreter(model_content=model, experimental_op_resolver_type=kind)
    it.allocate_tensors()
    for d, x in zip(it.get_input_details(), inputs):
        it.set_tensor(d["index"], np.asarray(x, dtype=d["dtype"]).reshape(d["shape"]))
    it.invoke()
    return [it.get_tensor(d["index"]).copy() for d in it.get_output_details()]


def hal_run(model: bytes, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """Translate the whole model to NNAPI, compile and execute it with hal (and, when
    $NNHAL_DIFF_BACKEND names a backend, check that backend against the reference backend on it)."""
    graph = read_model(model)
    part = convert_partition(graph)
    compiled = compile_model(part.model)
    by_tensor = dict(zip(graph.inputs, inputs))
    args = [np.asarray(by_tensor[t]) for t in part.input_tensors]
    outs = execute(compiled, args)
    _check_cached_copy(compiled, args, outs)
    check_against_reference(part.model, args)
    produced = dict(zip(part.output_tensors, outs))
    return [produced[t] for t in graph.outputs]


def _check_cached_copy(compiled, args: list[np.ndarray], outs: list[np.ndarray]) -> None:
    """Every model the op tests run also goes through the compilation cache's serialisation, with
    read-only arrays as the cache maps them, and must give bit-identical outputs."""
    if compiled.static_plan is None:
        return  # planned per input shape (or per execution): never cached
    payload, arrays = dump_compiled(compiled)  # any other SerializationError is a model the cache drops
    arrays = [np.array(a) for a in arrays]  # private copies, read-only like the cache's mapping
    for a in arrays:
        a.setflags(write=False)
    loaded = load_compiled(payload, arrays)
    for i, value in loaded.constants.items():
        assert value.shape == compiled.constants[i].shape and value.dtype == compiled.constants[i].dtype
    for got, want in zip(execute(loaded, args), outs):
        np.testing.assert_array_equal(got, want, err_msg="the cached compilation computes something else")


def assert_float_close(got: np.ndarray, expected: np.ndarray, rtol: float = 1e-5,
                       atol: float | None = None) -> None:
    """Float comparison: 1e-5 relative; for values near 0 an absolute floor of NNAPI CTS's float32
    atol (1e-5), or 1e-6·max|expected| where that is larger. A sum that cancels to near zero keeps
    the rounding of its terms, whatever their order (onnxruntime's and TFLite's differ), so an
    absolute floor below CTS's failed correct results (a CONV_2D output of -0.00703 off by 1.7e-6,
    its terms up to 2 in magnitude)."""
    if atol is None:
        atol = max(1e-5, 1e-6 * (float(np.max(np.abs(expected))) if expected.size else 1.0))
    np.testing.assert_allclose(got, expected, rtol=rtol, atol=atol)


def assert_matches_tflite(model: bytes, inputs: list[np.ndarray], *, rtol: float = 1e-5,
                          atol: float | None = None, reference: bool = True) -> list[np.ndarray]:
    """hal == TFLite: bit-exact for integer outputs, within tolerance for float outputs."""
    expected = tflite_run(model, inputs, reference=reference)
    got = hal_run(model, inputs)
    assert len(got) == len(expected)
    for k, (g, e) in enumerate(zip(got, expected)):
        assert g.shape == e.shape, f"output {k}: shape {g.shape} != TFLite {e.shape}"
        assert g.dtype == e.dtype, f"output {k}: dtype {g.dtype} != TFLite {e.dtype}"
        if np.issubdtype(e.dtype, np.floating):
            assert_float_close(g, e, rtol, atol)
        else:
            np.testing.assert_array_equal(g, e, err_msg=f"output {k} differs from TFLite")
    return got


def random_tensor(rng: np.random.Generator, shape, dtype, low: float = -1.0, high: float = 1.0) -> np.ndarray:
    """Random data: floats uniform in [low, high); integer types over their whole range."""
    dtype = np.dtype(dtype)
    if np.issubdtype(dtype, np.floating):
        return rng.uniform(low, high, size=shape).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, size=shape, endpoint=True).astype(dtype)


QUANT_DTYPES = (np.uint8, np.int8)


def random_quant_params(rng: np.random.Generator, dtype, scale_range=(0.005, 0.5)) -> dict:
    """A plausible (scale, zero_point) for an 8-bit tensor."""
    info = np.iinfo(np.dtype(dtype))
    scale = float(np.float32(np.exp(rng.uniform(np.log(scale_range[0]), np.log(scale_range[1])))))
    zp = int(rng.integers(info.min, info.max, endpoint=True))
    return {"scale": scale, "zero_point": zp}


@st.composite
def broadcast_shapes(draw, max_rank: int = 4):
    """Two shapes that broadcast against each other, either one being the smaller."""
    out = draw(st.lists(st.integers(1, 5), min_size=1, max_size=max_rank))
    small = [1 if draw(st.booleans()) else d for d in out][draw(st.integers(0, len(out) - 1)):]
    return (out, small) if draw(st.booleans()) else (small, out)


def nnapi_one_op(op, in_type, in_shape, scalars, *, out_type=None, out_q=None, in_q=(0.5, 3), out_shape=()):
    """A one-op NNAPI model built directly (no TFLite): input 0, then constant scalars given as
    (OperandType, value) pairs; 8-bit tensors get ``in_q``/``out_q`` (scale, zero point)."""
    from hal.model import ModelBuilder
    from hal.types import OperandType
    b = ModelBuilder()
    quantized = in_type in (OperandType.TENSOR_QUANT8_ASYMM, OperandType.TENSOR_QUANT8_ASYMM_SIGNED)
    x = b.add_operand(in_type, in_shape, *(in_q if quantized else (0.0, 0)))
    ins = [x] + [b.add_constant(t, v) for t, v in scalars]
    oq = out_q if out_q is not None else (in_q if quantized else (0.0, 0))
    y = b.add_operand(out_type if out_type is not None else in_type, out_shape, *oq)
    b.add_operation(op, ins, [y])
    b.identify_inputs_and_outputs([x], [y])
    return b.finish()
