"""Hypothesis profiles: random exploration on developer machines, a fixed sequence in CI.

CI must be reproducible (a new random failure there would block a submission for a bug no
one can replay); developers' runs keep exploring, and failures they find are replayed from
.hypothesis/ and fixed with a regression example.
"""
import logging
import os

import pytest
from hypothesis import settings

settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("dev", print_blob=True)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


@pytest.fixture
def server(tmp_path):
    """A real `nnhal serve` process on a temporary unix socket (tests.service.conftest.ServerProcess)."""
    from tests.service.conftest import ServerProcess
    s = ServerProcess(tmp_path)
    yield s
    s.stop()


class _PartitionFailures(logging.Handler):
    """Records the compiler's "a graph backend could not compile a partition" warnings."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


_partition_failures = _PartitionFailures()
logging.getLogger("hal.compiler").addHandler(_partition_failures)


@pytest.fixture(autouse=True)
def no_silent_partition_fallback(request):
    """A graph backend's lowering that fails makes its partition run operation by operation, and a
    backend whose supports or plan raises hands its operation to the next backend: the model still
    works, so only this check notices. Tests provoking it on purpose are marked
    ``partition_fallback`` or ``backend_failure``."""
    _partition_failures.messages.clear()
    yield
    if request.node.get_closest_marker("partition_fallback") is None \
            and request.node.get_closest_marker("backend_failure") is None:
        assert not _partition_failures.messages, "partition fell back: " + "; ".join(_partition_failures.messages)


def pytest_configure(config):
    config.addinivalue_line("markers", "partition_fallback: the test makes a graph backend's compilation fail")
    config.addinivalue_line("markers", "backend_failure: the test makes a backend's supports or plan raise")
