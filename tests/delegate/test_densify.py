"""Sparse-weight models: DENSIFY of a constant folds into a dense constant, so they delegate whole."""
from __future__ import annotations

import numpy as np
import pytest

from delegate import load_delegate
from delegate.mapping.folding import densify
from delegate.tfl import TfLiteModelBuilder, read_model
from delegate.tfl.graph import DimensionMetadata, Sparsity
from delegate.tfl.schema import ActivationFunctionType as Act
from tests.delegate.helpers import (
    assert_delegation_refused,
    assert_outputs_equal,
    interpreter,
    random_inputs,
    run,
)


def csr(dense: np.ndarray) -> tuple[np.ndarray, Sparsity]:
    """2-D CSR: dim 0 dense, dim 1 sparse."""
    rows, cols = dense.shape
    segments, indices, values = [0], [], []
    for r in range(rows):
        nz = np.nonzero(dense[r])[0]
        indices += nz.tolist()
        values += dense[r, nz].tolist()
        segments.append(len(indices))
    sp = Sparsity((0, 1), (), (DimensionMetadata(0, rows), DimensionMetadata(1, cols, tuple(segments), tuple(indices))))
    return np.array(values, dense.dtype), sp


def block_sparse(dense: np.ndarray, block: int) -> tuple[np.ndarray, Sparsity]:
    """Rows dense, column-blocks of `block` sparse (blocks of zeros skipped), as TFLite's converter emits."""
    rows, cols = dense.shape
    nb = cols // block
    segments, indices, values = [0], [], []
    for r in range(rows):
        for bj in range(nb):
            chunk = dense[r, bj * block:(bj + 1) * block]
            if np.any(chunk):
                indices.append(bj)
                values += chunk.tolist()
        segments.append(len(indices))
    sp = Sparsity((0, 1, 2), (1,), (DimensionMetadata(0, rows), DimensionMetadata(1, nb, tuple(segments),
                                                                                   tuple(indices)),
                                    DimensionMetadata(0, block)))
    return np.array(values, dense.dtype), sp


def sparse_weights(rng, shape, density=0.3) -> np.ndarray:
    w = rng.standard_normal(shape).astype(np.float32)
    w[rng.random(shape) > density] = 0
    return w


def test_densify_csr_and_blocks():
    rng = np.random.default_rng(0)
    w = sparse_weights(rng, (7, 12))
    values, sp = csr(w)
    np.testing.assert_array_equal(densify(values, w.shape, sp), w)
    wb = np.repeat(sparse_weights(rng, (7, 3)), 4, axis=1)
    values, sp = block_sparse(wb, 4)
    np.testing.assert_array_equal(densify(values, wb.shape, sp), wb)
    with pytest.raises(ValueError):
        densify(values[:-1], wb.shape, sp)


def sparse_fc_model(rng, blocked: bool) -> bytes:
    w = np.repeat(sparse_weights(rng, (6, 4)), 4, axis=1) if blocked else sparse_weights(rng, (6, 16))
    values, sp = block_sparse(w, 4) if blocked else csr(w)
    b = TfLiteModelBuilder()
    x = b.add_input("x", [2, 16])
    ws = b.add_tensor("w_sparse", [6, 16], np.float32, data=values, sparsity=sp)
    wd = b.add_tensor("w", [6, 16])
    b.add_operator("DENSIFY", [ws], [wd])
    bias = b.add_constant("bias", rng.standard_normal(6).astype(np.float32))
    y = b.add_tensor("y", [2, 6])
    b.add_operator("FULLY_CONNECTED", [x, wd, bias], [y], ("FullyConnectedOptions", {
        "fused_activation_function": Act.NONE}))
    b.set_outputs([y])
    return b.build()


@pytest.mark.parametrize("blocked", [False, True])
def test_sparse_model_delegates_whole(server, blocked):
    rng = np.random.default_rng(3)
    model = sparse_fc_model(rng, blocked)
    assert read_model(model).tensors[1].sparse
    d = load_delegate(server.address)
    it, ref = interpreter(model, d), interpreter(model)
    for _ in range(3):
        xs = random_inputs(ref, rng)
        assert_outputs_equal(run(it, xs), run(ref, xs))
    assert d.report.delegated == 2 and d.report.partitions == [[0, 1]]



def test_a_sparse_buffer_past_the_file_fails_delegation(server, tmp_path):
    """TFLite does not check a sparse constant's size against anything: a corrupted vector length
    hands the delegate a range past the model's mapping. The delegation fails with one line instead
    of reading it (which killed the process with SIGBUS)."""
    model = bytearray(sparse_fc_model(np.random.default_rng(3), False))
    values = read_model(bytes(model)).tensors[1].data.tobytes()
    at = bytes(model).index(values) - 4  # the stored values' vector length
    assert int.from_bytes(model[at:at + 4], "little") == len(values)
    model[at:at + 4] = (2_000_000_000).to_bytes(4, "little")
    path = tmp_path / "bad_sparse.tflite"
    path.write_bytes(bytes(model))
    assert_delegation_refused(path, server.address, "NnhalDelegate: corrupted model: tensor 1 (w_sparse): its "
                                                    "2000000000-byte buffer lies outside")
