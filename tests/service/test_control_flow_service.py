"""IF and WHILE through the real service: the proto carries referenced subgraphs, the cache keeps
their plans, and an endless loop ends at the request's loop timeout while the service keeps serving."""
from __future__ import annotations

import numpy as np
import pytest

from hal import compile_model, execute
from hal.types import ErrorStatus
from service.client import ServiceError
from service.token import model_token
from tests.control_flow_models import branches, counter_loop, growing_loop, loop_inputs


def test_a_while_model_runs_on_the_service_as_in_process(client):
    loop = counter_loop(seed=4)
    remote = client.prepare_model(loop.model)
    local = compile_model(loop.model)
    for n in (0, 3):
        for g, w in zip(remote.execute(loop_inputs(n)).outputs, execute(local, loop_inputs(n))):
            np.testing.assert_array_equal(g, w)


def test_an_if_model_and_a_data_dependent_loop_on_the_service(client):
    br = branches()
    a, c = np.full((2, 3), 2, np.float32), np.arange(6, dtype=np.float32).reshape(2, 3)
    remote = client.prepare_model(br.model)
    for flag in (True, False):
        want = execute(compile_model(br.model), [np.array([flag]), a, c])[0]
        np.testing.assert_array_equal(remote.execute([np.array([flag]), a, c]).outputs[0], want)
    model, _, _ = growing_loop()
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    out = client.prepare_model(model).execute([np.array([0], np.int32), x, np.array([2], np.int32)]).outputs[1]
    np.testing.assert_array_equal(out, np.concatenate([x] * 4))


def test_an_endless_loop_ends_at_the_loop_timeout_and_the_service_goes_on(client):
    remote = client.prepare_model(counter_loop().model)
    with pytest.raises(ServiceError) as e:
        remote.execute(loop_inputs(2 ** 31 - 1), loop_timeout_s=0.05)
    assert e.value.status == ErrorStatus.MISSED_DEADLINE_TRANSIENT
    assert "loop timeout" in str(e.value)
    assert remote.execute(loop_inputs(3)).outputs[0].tolist() == [3]
    assert client.get_supported_operations(counter_loop().model) == [True]


def test_the_local_burst_carries_the_loop_timeout(client):
    """The shared-memory burst passes the request's loop timeout too (twice: the second request
    takes the burst's fast path)."""
    remote = client.prepare_model(counter_loop().model)
    try:
        burst = remote.local_burst()
    except ServiceError as e:
        pytest.skip(f"no local burst here: {e}")
    with burst:
        for _ in range(2):
            with pytest.raises(ServiceError) as e:
                burst.execute(loop_inputs(2 ** 31 - 1), loop_timeout_s=0.05)
            assert e.value.status == ErrorStatus.MISSED_DEADLINE_TRANSIENT and "loop timeout" in str(e.value)
            assert burst.execute(loop_inputs(3), loop_timeout_s=5).outputs[0].tolist() == [3]


def test_a_control_flow_model_comes_back_from_the_cache(client):
    loop = counter_loop(seed=9)
    token = model_token(loop.model)
    first = client.prepare_model(loop.model, token=token).execute(loop_inputs(5)).outputs
    cached = client.prepare_model_from_cache(loop.model, token)
    for g, w in zip(cached.execute(loop_inputs(5)).outputs, first):
        np.testing.assert_array_equal(g, w)


def test_the_token_covers_the_subgraphs_weights():
    """Same structure, different body constants: different tokens (the body's weights count)."""
    assert model_token(counter_loop(seed=1).model) != model_token(counter_loop(seed=2).model)
