"""Concurrent clients and shutdown under load, against a real server process."""
from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
import time

import numpy as np

import hal
from service.client import Client, ServiceError, ServiceUnavailableError
from tests.service.conftest import ServerProcess
from tests.service.models import add_chain

CLIENTS = 4
EXECUTIONS = 200


def _client_worker(address: str, k: int) -> tuple[int, int]:
    """One client process: its own model; every output checked against hal in-process."""
    shape = (4 + k, 3 + 2 * k)
    model = add_chain(k + 1, shape)
    local = hal.compile_model(model)
    rng = np.random.default_rng(k)
    ok = 0
    with Client.connect(address) as client:
        pm = client.prepare_model(model)
        for _ in range(EXECUTIONS):
            x = rng.standard_normal(shape).astype(np.float32)
            got = pm.execute([x]).outputs[0]
            ok += bool(np.array_equal(got, hal.execute(local, [x])[0]))
        pm.release()
    return k, ok


def test_four_concurrent_clients(tmp_path):
    server = ServerProcess(tmp_path)
    try:
        with mp.get_context("spawn").Pool(CLIENTS) as pool:
            results = pool.starmap(_client_worker, [(server.address, k) for k in range(CLIENTS)])
    finally:
        server.stop()
    assert sorted(results) == [(k, EXECUTIONS) for k in range(CLIENTS)]


def test_sigterm_during_load_finishes_in_flight_work(tmp_path):
    server = ServerProcess(tmp_path)
    model = add_chain(40, (64, 64))
    local = hal.compile_model(model)
    done = []
    errors = []
    started = threading.Event()

    def load(seed):
        rng = np.random.default_rng(seed)
        try:
            with Client.connect(server.address) as client:
                pm = client.prepare_model(model)
                while True:
                    x = rng.standard_normal((64, 64)).astype(np.float32)
                    try:
                        out = pm.execute([x]).outputs[0]
                    except ServiceUnavailableError:
                        return  # the server has gone: expected after shutdown
                    done.append(np.array_equal(out, hal.execute(local, [x])[0]))
                    started.set()
        except ServiceUnavailableError:
            return
        except ServiceError as e:  # an NNAPI error status is not an acceptable shutdown outcome
            errors.append(e)

    threads = [threading.Thread(target=load, args=(s,)) for s in range(3)]
    for t in threads:
        t.start()
    assert started.wait(60)
    os.kill(server.proc.pid, signal.SIGTERM)
    rc = server.stop()
    for t in threads:
        t.join(60)
    assert rc == 0, f"exit code {rc}: {server.output()}"
    assert not errors
    assert done and all(done)
    assert not os.path.exists(server.socket)


def test_a_flood_of_sigterms_stops_the_service_cleanly(tmp_path):
    """Signals that arrive while the service handles one (a supervisor's SIGTERM plus an impatient
    user's, or the test above's two) must not deadlock it: a handler that took a lock could
    interrupt its own thread holding that lock. Flooded until it exits, the service exits 0."""
    server = ServerProcess(tmp_path)
    sent = 0
    deadline = time.monotonic() + 60
    while server.proc.poll() is None and time.monotonic() < deadline:
        try:
            os.kill(server.proc.pid, signal.SIGTERM)
            sent += 1
        except ProcessLookupError:
            break
    rc = server.stop()
    assert rc == 0, f"exit code {rc} after {sent} SIGTERMs: {server.output()}"
    assert not os.path.exists(server.socket)
