"""RANDOM_MULTINOMIAL: reproducible for equal seeds, class frequencies close to softmax(logits)
over many samples, non-finite logits never drawn, NNAPI's rules; and the CTS judge really judging
the distribution of the (CTS-"ignored") output."""
import numpy as np
import pytest

from hal.compiler import compile_model
from hal.errors import HalError
from hal.executor import execute
from hal.model import ModelBuilder
from hal.types import ErrorStatus, OperandType, OperationType
from nnhal.cts.corpus import examples as case_examples
from nnhal.cts.corpus import load_cases
from nnhal.cts.judge import judge

F32 = OperandType.TENSOR_FLOAT32
I32 = OperandType.TENSOR_INT32
MULTINOMIAL = OperationType.RANDOM_MULTINOMIAL


def _sample(logits, count, seeds, seeds_shape=(2,)):
    b = ModelBuilder()
    x = b.add_operand(F32, logits.shape)
    s = b.add_constant(I32, np.asarray(seeds, np.int32), dimensions=seeds_shape)
    y = b.add_operand(I32, (logits.shape[0], count))
    b.add_operation(MULTINOMIAL, [x, b.add_int32(count), s], [y])
    b.identify_inputs_and_outputs([x], [y])
    return execute(compile_model(b.finish()), [logits.astype(np.float32)])[0]


def test_frequencies_follow_softmax_and_seeds_reproduce():
    logits = np.array([[0.0, 1.0, 2.0, -1.0], [3.0, 3.0, 0.5, -np.inf]], np.float32)
    n = 40000
    got = _sample(logits, n, [5, 9])
    assert got.shape == (2, n) and got.dtype == np.int32
    for row, samples in zip(logits, got):
        p = np.exp(row - row.max())
        p /= p.sum()
        freq = np.bincount(samples, minlength=row.size) / n
        np.testing.assert_allclose(freq, p, atol=0.01)
    assert not (got[1] == 3).any()  # probability 0
    np.testing.assert_array_equal(_sample(logits, n, [5, 9]), got)
    assert not np.array_equal(_sample(logits, n, [5, 10]), got)


@pytest.mark.parametrize("count, seeds, seeds_shape, match", [
    (0, [1, 2], (2,), "sample_count"),
    (4, [1, 2, 3], (3,), "seeds"),
])
def test_rejects(count, seeds, seeds_shape, match):
    with pytest.raises(HalError, match=match) as e:
        _sample(np.zeros((1, 3)), count, seeds, seeds_shape)
    assert e.value.status == ErrorStatus.INVALID_ARGUMENT


def test_cts_judge_checks_the_distribution_of_the_ignored_output():
    case = next(c for c in load_cases(operations=["RANDOM_MULTINOMIAL"]) if c.name == "V1_2/random_multinomial")
    ex = next(iter(case_examples(case)))
    logits = next(x for x in ex.inputs if x is not None)
    good = _sample(logits.reshape(1, -1), 128, [37, 42])
    assert judge(case, ex, [good]) is None
    assert "class frequency" in judge(case, ex, [np.zeros((1, 128), np.int32)])  # all class 0
    assert "not in" in judge(case, ex, [np.full((1, 128), 1024, np.int32)])  # no such class
