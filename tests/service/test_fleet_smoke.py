"""`make fleet` in miniature: the fleet machinery (bench.fleet) for 20 s, 3 real `nnhal serve` replicas
sharing one cache, 4 client processes running TFLite with the nnhal delegate on the replicas' list,
one replica killed (and restarted) and another stopped (and resumed). Counts are judged; no
latency is (timings on a shared machine are the bench's to report, not a test's to assert)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_fleet_loses_no_invoke_through_a_kill_and_a_stop(tmp_path):
    cmd = [sys.executable, "-m", "bench.fleet", "--transports", "unix", "--seconds", "20", "--throughput-seconds", "0",
           "--faults", "2", "--stop-seconds", "3", "--down-seconds", "2", "--recreate-every", "100",
           "--fresh-token-every", "3", "--results", str(tmp_path / "results.md"), "--json"]
    # Bounds the test, not the fleet's speed: a hung client is killed after bench.fleet's own limit.
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=600)
    assert r.returncode in (0, 1), r.stderr[-3000:]  # 1: a criterion failed, judged below
    [report] = json.loads(r.stdout.strip().splitlines()[-1])["runs"]
    failed = {name: measured for name, measured, ok in report["criteria"] if not ok}
    assert not failed, (failed, r.stderr[-3000:])
    counts = report["faults"]["counts"]
    assert counts["failed"] == 0 and counts["wrong"] == 0 and counts["on_service"] > 0, counts
    assert [action for _, action, _ in report["faults"]["events"]] == ["kill", "stop"], report["faults"]["events"]
    assert "## Fleet" in (tmp_path / "results.md").read_text()
