"""`make bench-e2e` in its quick mode on SQLite: `claimbroker up` as a subprocess, the echo baseline, a
burst, churn, and the echo service at the churn's rate. Only the shape of its JSON lines and that every
claim got a status are checked, never a speed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
KEYS = {"db", "phase", "claims", "claims_per_s", "echo_per_s", "ratio", "p50_ms", "p99_ms", "without_status"}


def test_the_quick_benchmark_prints_a_line_per_phase_and_every_claim_gets_a_status() -> None:
    run = subprocess.run([sys.executable, str(ROOT / "bench" / "e2e.py"), "--quick", "--db", "sqlite"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    lines = [json.loads(text) for text in run.stdout.splitlines() if text.strip()]
    parts = [line for line in lines if line["phase"] == "churn-parts"]
    lines = [line for line in lines if line["phase"] != "churn-parts"]
    # where the allocator's time went during the churn, from its JSON log: every part of a transaction
    assert len(parts) == 1 and parts[0]["transactions"] > 0 and parts[0]["messages"] >= 100, parts
    assert {"turn", "inbox", "parse", "intake", "queue", "flush", "commit"} <= set(parts[0]["per_message_ms"]), parts
    # the relay publishes from memory (read and mark only where it read the outbox back)
    assert parts[0]["outbox_batches"] > 0 and "publish" in parts[0]["outbox_per_event_ms"]
    assert set(parts[0]["outbox_per_event_ms"]) <= {"read", "publish", "mark"}
    assert [(line["db"], line["phase"]) for line in lines] == [
        ("sqlite", "echo"), ("sqlite", "burst"), ("sqlite", "churn"), ("sqlite", "echo-churn")], run.stdout
    echo = lines[0]["claims_per_s"]
    for line in lines:
        assert set(line) == KEYS, line
        assert line["without_status"] == 0, (line, run.stderr[-3000:])
        for key in ("claims_per_s", "echo_per_s", "ratio", "p50_ms", "p99_ms"):
            assert isinstance(line[key], int | float) and line[key] > 0, line
        assert line["echo_per_s"] == echo, line
        assert line["p50_ms"] <= line["p99_ms"], line
    # --quick: 300 claims, churn 50/s for 2 s (a release and a claim a tick: the echo carries 200)
    assert [line["claims"] for line in lines] == [300, 300, 100, 200], lines
    assert lines[0]["ratio"] == 1.0
