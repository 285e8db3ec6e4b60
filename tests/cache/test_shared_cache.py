"""One cache directory shared by several services (issue 35: replicas on one machine or on a shared
volume): processes writing, loading and evicting the same entries at once. A load either returns
exactly what was stored or is a miss; an entry loaded earlier stays intact while other processes
evict and rewrite it; a load racing another process's eviction is a miss, never a rejection (which
would log a warning and delete the entry that other process may have just rewritten)."""
from __future__ import annotations

import logging
import multiprocessing as mp
import os

import numpy as np

from cache.store import CacheError, CacheStore

TOKENS = [bytes([k]) * 32 for k in range(6)]
ROUNDS = 150


def entry(k: int):
    """What every process stores under TOKENS[k] (services compiling one model write the same bytes)."""
    rng = np.random.default_rng(k)
    return b'{"entry": %d}' % k, [rng.standard_normal((64, 64)).astype(np.float32), np.arange(k + 3, dtype=np.int8)]


def same(got, k: int) -> bool:
    payload, arrays = entry(k)
    return got[0] == payload and len(got[1]) == len(arrays) and all(
        g.dtype == a.dtype and np.array_equal(g, a) for g, a in zip(got[1], arrays))


def _replica(d: str, seed: int, max_bytes: int, results) -> None:
    """One service's use of the shared directory: store, load (keeping some loads), evict."""
    rejections = []
    handler = logging.Handler()
    handler.emit = lambda record: rejections.append(record.getMessage())
    logging.getLogger("nnhal.cache").addHandler(handler)
    s = CacheStore(d, driver_version="nnhal-test+1", capabilities_fingerprint="caps-1", max_bytes=max_bytes)
    rng = np.random.default_rng(seed)
    counts = {"stored": 0, "hits": 0, "misses": 0, "wrong": 0, "errors": 0, "held_broken": 0}
    held = []  # (token index, loaded entry): what a prepared model keeps mapped while others evict
    for _ in range(ROUNDS):
        k = int(rng.integers(len(TOKENS)))
        try:
            if rng.random() < 0.4:
                counts["stored"] += s.put(TOKENS[k], *entry(k))
            else:
                got = s.get(TOKENS[k])
                counts["hits"] += 1
                counts["wrong"] += not same(got, k)
                if len(held) < 8:
                    held.append((k, got))
        except CacheError:
            counts["misses"] += 1
        except Exception as e:  # noqa: BLE001 - counted: the parent asserts there are none
            counts["errors"] += 1
            rejections.append(repr(e))
    counts["held_broken"] = sum(not same(got, k) for k, got in held)
    counts["rejections"] = rejections
    results.put(counts)


def test_replicas_sharing_a_directory_never_break_a_load(tmp_path):
    one_entry = sum(a.nbytes for a in entry(5)[1]) + 4096
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    # Room for about three entries of six: every store evicts in some process.
    procs = [ctx.Process(target=_replica, args=(str(tmp_path), seed, 3 * one_entry, results)) for seed in range(4)]
    for p in procs:
        p.start()
    counts = [results.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    total = {key: sum(c[key] for c in counts) for key in ("stored", "hits", "misses", "wrong", "errors",
                                                             "held_broken")}
    assert total["wrong"] == 0 and total["errors"] == 0 and total["held_broken"] == 0, (total, counts)
    assert [r for c in counts for r in c["rejections"]] == []
    assert total["hits"] > 0 and total["stored"] > 0 and total["misses"] > 0, total  # the race was run
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".tmp-")]
