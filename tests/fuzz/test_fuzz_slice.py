"""The short, deterministic slice of `make fuzz` (tests/fuzz): a fixed seed, a few hundred cases
of each part against real `nnhal serve` processes. Fails on any service death or hang, wrong
result, crash or hang attributable to nnhal, or a service that no longer answers at the end or
whose memory exploded. `make fuzz` runs the same code with >= 10,000 cases."""
from __future__ import annotations

import numpy as np

from tests.fuzz.__main__ import details, run
from tests.fuzz.core import FAILING, service_problems
from tests.fuzz.tflite_bytes import attribute, mutate

SLICE = {"a": 400, "b": 250, "c": 20}


def test_fuzz_slice():
    tallies, services = run(SLICE, seconds=600, seed=18, full_seeds=False, log=lambda *a, **k: None)
    try:
        pids = {name: s.pid for name, s in services}
        problems = service_problems(services)
        failures = [f for t in tallies for f in t.failures()]
        assert not failures and not problems, "\n".join(problems + failures) + details(tallies, services)
        assert {name: s.server.proc.pid for name, s in services} == pids  # the same processes throughout
        counts = {t.part[0]: t.cases for t in tallies}
        assert counts == SLICE, counts  # no part cut short by the time bound
        assert all(t.counts["ok"] for t in tallies), "every part ran some cases to a checked result"
        assert sum(t.counts[o] for t in tallies for o in FAILING) == 0
    finally:
        for _, s in services:
            s.stop()
            s.cleanup()


def test_crash_attribution_reads_the_innermost_python_frame():
    """faulthandler's dump: nnhal's frame wins over a library frame inside it; TFLite's wrapper is TFLite's."""
    ours = ('Fatal Python error: Segmentation fault\n\nCurrent thread 0x00007f (most recent call first):\n'
            '  File "/x/site-packages/numpy/ctypeslib.py", line 521 in as_array\n'
            '  File "/work/main/delegate/simple.py", line 183 in read_graph\n'
            '  File "/x/site-packages/tflite_runtime/interpreter.py", line 513 in __init__\n')
    theirs = ('Fatal Python error: Segmentation fault\n\nThread 0x1 (most recent call first):\n'
              '  File "/work/main/delegate/simple.py", line 1 in elsewhere\n\n'
              'Current thread 0x00007f (most recent call first):\n'
              '  File "/x/site-packages/tflite_runtime/interpreter.py", line 485 in __init__\n'
              '  File "/work/main/tests/fuzz/tflite_bytes.py", line 100 in _child\n')
    from tests.fuzz import tflite_bytes
    root = str(tflite_bytes.ROOT)
    assert attribute(ours.replace("/work/main", root))[0] == "nnhal"
    assert attribute(theirs.replace("/work/main", root)) == ("tflite", "tflite_runtime/interpreter.py:485 in __init__")


def test_byte_mutations_are_deterministic():
    data = bytes(range(256)) * 4
    a = [mutate(data, np.random.default_rng([18, k])) for k in range(50)]
    b = [mutate(data, np.random.default_rng([18, k])) for k in range(50)]
    assert a == b and all(m != data for m, _ in a[:10] if "copied" not in _)
