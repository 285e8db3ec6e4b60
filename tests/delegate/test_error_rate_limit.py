"""What the delegate says on stderr when the service is gone (issue 33, item 5): an error that
repeats on every invoke once, then as a count, never a line per invoke; the unreachable-service
message as one line, with no line of nnhal's source."""
from __future__ import annotations

import logging
import math
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from service.logconfig import RepeatedMessages
from tests.delegate.models import head_model
from tests.service.conftest import HANG_LIMIT_S

#: The delegate's messages about its service: the same under either TFLite runtime.
pytestmark = pytest.mark.any_runtime

INVOKES = 200

NO_FALLBACK_SCRIPT = """
import faulthandler, signal, sys
faulthandler.register(signal.SIGUSR1, all_threads=True)  # the test's dump of a hang, exit included
from delegate import load_delegate
from delegate.runtime import Interpreter
d = load_delegate(sys.argv[2], allow_in_process_fallback=False)
it = Interpreter(model_path=sys.argv[1], experimental_delegates=[d])
it.allocate_tensors()
it.invoke()
print("delegated", len(d.impl.kernels), flush=True)
sys.stdin.readline()  # the service is killed meanwhile
failed = 0
for _ in range(int(sys.argv[3])):
    try:
        it.invoke()
    except RuntimeError:
        failed += 1
print("failed", failed, flush=True)
"""


def _env() -> dict:
    """Logging as an application that configured none gets it."""
    return {k: v for k, v in os.environ.items() if k != "NNHAL_LOG"}


def _not_tflites(stderr: str) -> list[str]:
    return [x for x in stderr.splitlines() if not x.startswith("INFO: ")]  # TFLite's own lines


def test_invokes_failing_without_a_service_are_counted_not_repeated(server, tmp_path):
    path = tmp_path / "model.tflite"
    path.write_bytes(head_model(np.float32))
    p = subprocess.Popen([sys.executable, "-c", NO_FALLBACK_SCRIPT, str(path), server.address, str(INVOKES)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=_env())
    try:
        assert p.stdout.readline() == "delegated 1\n", p.communicate(timeout=HANG_LIMIT_S)
        server.proc.kill()
        server.proc.wait()
        out, err = p.communicate("go\n", timeout=HANG_LIMIT_S)
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGUSR1)  # every thread's stack on stderr, even during the exit
        time.sleep(2)
        p.kill()
        out, err = p.communicate()
        raise AssertionError(f"the client hung after printing {out!r}; its threads:\n{err[-8000:]}") from None
    finally:
        p.kill()
    assert p.returncode == 0 and out.splitlines() == [f"failed {INVOKES}"], (out, err)
    lines = _not_tflites(err)
    assert all("in-process fallback is off" in x for x in lines), err
    # Each distinct error once, then its repeats as one count (more only if the loop outlasted the
    # interval): every failed invoke accounted for.
    counts = [re.search(r"\(repeated (\d+) more times?\)$", x) for x in lines]
    assert 2 <= len(lines) <= 4 and any(counts), err
    assert sum(int(m.group(1)) if m else 1 for m in counts) == INVOKES, err


UNREACHABLE_SCRIPT = """
import sys
from delegate import load_delegate
from delegate.runtime import Interpreter
it = Interpreter(model_path=sys.argv[1], experimental_delegates=[load_delegate(sys.argv[2])])
it.allocate_tensors()
it.invoke()
print("ran")
"""


def test_unreachable_service_is_one_line_without_source(tmp_path):
    """Logged (the "nnhal.delegate" logger), not warnings.warn: a warning shows the line of source
    it points at, here a line of nnhal's."""
    path = tmp_path / "model.tflite"
    path.write_bytes(head_model(np.float32))
    r = subprocess.run([sys.executable, "-W", "always", "-c", UNREACHABLE_SCRIPT, str(path),
                        f"unix:{tmp_path}/nobody.sock"], capture_output=True, text=True, timeout=HANG_LIMIT_S,
                       env=_env())
    assert r.returncode == 0 and r.stdout == "ran\n", (r.stdout, r.stderr)
    lines = _not_tflites(r.stderr)
    assert len(lines) == 1 and lines[0].startswith("nnhal delegate: DEVICE_UNAVAILABLE: no nnhal service answers"), \
        r.stderr
    assert lines[0].endswith("the model runs on TFLite's CPU kernels"), lines
    assert "warnings.warn" not in r.stderr and ".py" not in r.stderr, r.stderr


# ---- RepeatedMessages itself ---------------------------------------------------------------------

class Records(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def _logger() -> tuple[logging.Logger, Records]:
    log = logging.getLogger("tests.repeated_messages")
    log.propagate, log.handlers = False, []
    records = Records()
    log.addHandler(records)
    return log, records


def test_repeats_are_counted_until_another_message_or_flush():
    log, records = _logger()
    said = RepeatedMessages(log, interval_s=math.inf)
    for message in ("A", "A", "A", "B", "A"):
        said.log(message)
    said.flush()
    said.flush()
    assert records.messages == ["A", "A (repeated 2 more times)", "B", "A"]
    said.log("A")
    said.log("A")
    said.flush()
    assert records.messages[4:] == ["A (repeated 2 more times)"]


def test_a_repeated_traceback_is_counted_in_one_line():
    log, records = _logger()
    said = RepeatedMessages(log, interval_s=math.inf)
    tb = "NnhalDelegate kernel eval: Traceback (most recent call last):\n  File ...\nZeroDivisionError: x"
    for _ in range(3):
        said.log(tb)
    said.flush()
    assert records.messages == [tb, "NnhalDelegate kernel eval: Traceback (most recent call last): ... "
                                    "ZeroDivisionError: x (repeated 2 more times)"]


def test_with_no_interval_every_repeat_is_said():
    log, records = _logger()
    said = RepeatedMessages(log, interval_s=0)
    for _ in range(3):
        said.log("A")
    assert records.messages == ["A", "A (repeated 1 more time)", "A (repeated 1 more time)"]
