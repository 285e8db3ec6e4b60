"""getSupportedOperations without the weights: the query carries shapes, types and small constants;
large tensor constants point into a pool of zeros the service makes, and the answer is the full
model's (validation never reads a tensor's value)."""
from __future__ import annotations

import numpy as np
import pytest

import hal
from delegate.mapping import convert_partition
from delegate.mapping.host_runtime import TFLITE_RUNTIME_2_14
from delegate.tfl import read_model
from hal.types import ErrorStatus, OperandLifeTime
from nnhal.examples import mobilenet_like
from service.client import ServiceError
from service.proto import nnhal_pb2 as pb
from service.transfer import SUPPORT_VALUE_BYTES, support_query_proto
from tests.service.models import add_model, unsupported_model


def _models():
    for dtype in (np.float32, np.int8, np.uint8):
        yield convert_partition(read_model(mobilenet_like(dtype, 32, 32)), runtime=TFLITE_RUNTIME_2_14).model
    yield add_model(constant=np.arange(6 * 512, dtype=np.float32).reshape(6, 512)[:2, :3].copy())
    yield unsupported_model()


def test_the_query_sends_no_weight():
    model = next(_models())
    proto = support_query_proto(model)
    weights = sum(op.location.length for op in model.main.operands if op.lifetime == OperandLifeTime.CONSTANT_COPY)
    assert weights > 50_000
    assert len(proto.operand_values) < weights / 10
    assert [p.WhichOneof("kind") for p in proto.pools] == ["zeros"]
    moved = [op for op in proto.main.operands if op.lifetime == OperandLifeTime.CONSTANT_POOL]
    assert moved and all(op.location.length > SUPPORT_VALUE_BYTES for op in moved)


@pytest.mark.parametrize("k", range(5))
def test_the_answer_is_the_full_models(client, k):
    model = list(_models())[k]
    assert client.get_support_reasons(model) == hal.support_reasons(model)


def test_a_zeros_pool_is_refused_outside_a_support_query(client):
    model = next(_models())
    with pytest.raises(ServiceError) as e:
        from service.client import _check, _rpc
        _check(_rpc(client.device.PrepareModel, pb.PrepareModelRequest(model=support_query_proto(model))))
    assert e.value.status == ErrorStatus.INVALID_ARGUMENT and "zeros" in e.value.message
    pm = client.prepare_model(model)  # the service still serves the full model
    assert pm.id
