"""A Ctrl-C while the client creates or removes a shared-memory segment (service.transfer.ctrl_c_held):
the KeyboardInterrupt comes once the segment is recorded (or forgotten), so no /dev/shm file leaks."""
from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from service import transfer
from service.transfer import ScratchPool


def _sigint_after(make):
    def made(*args):
        value = make(*args)
        os.kill(os.getpid(), signal.SIGINT)  # Python's handler runs at the next bytecode: here
        return value
    return made


def test_ctrl_c_while_a_segment_is_created(monkeypatch):
    pool = ScratchPool()
    monkeypatch.setattr(transfer, "_new_segment", _sigint_after(transfer._new_segment))
    with pytest.raises(KeyboardInterrupt):
        pool.ensure(1000)
    assert pool.shm is not None  # recorded before the interrupt was raised
    path = Path("/dev/shm") / pool.shm.name
    assert path.exists()
    pool.close()
    assert not path.exists()


def test_ctrl_c_while_a_segment_is_removed(monkeypatch):
    pool = ScratchPool()
    pool.ensure(1000)
    path = Path("/dev/shm") / pool.shm.name
    monkeypatch.setattr(transfer, "_remove", _sigint_after(transfer._remove))
    with pytest.raises(KeyboardInterrupt):
        pool.close()
    assert pool.shm is None and not path.exists()


def test_the_handler_is_the_default_again():
    with transfer.ctrl_c_held():
        assert signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
