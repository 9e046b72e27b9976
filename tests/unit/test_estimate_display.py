"""The CLI shows a waiting claim's estimated start: `status`'s ETA column (the p50; '-' for a Pending claim
without one, nothing for the others) and `explain`'s line, from the API's estimatedStart."""

from __future__ import annotations

from typing import Any

from rich.console import Console

from services.cli.admin import explanation_lines
from services.cli.bus import eta, status_table

ESTIMATE = {"p50": "2026-12-01T12:20:00Z", "p90": "2026-12-01T12:40:00Z", "blockedBy": ["vision/train"]}


def test_status_eta_column() -> None:
    rows: list[dict[str, Any]] = [
        {"namespace": "vision", "name": "waits", "state": "Pending", "reason": "no room", "estimatedStart": ESTIMATE},
        {"namespace": "vision", "name": "plain", "state": "Pending", "reason": "no room"},
        {"namespace": "vision", "name": "null", "state": "Pending", "reason": "never", "estimatedStart": None},
        {"namespace": "vision", "name": "runs", "state": "Allocated", "allocation": None, "reason": None},
    ]
    assert [eta(r) for r in rows] == ["2026-12-01T12:20:00Z", "-", "-", ""]
    console = Console(width=200, record=True)
    console.print(status_table(rows))
    text = console.export_text()
    assert "ETA" in text.splitlines()[1] and "2026-12-01T12:20:00Z" in text


def test_explain_estimated_start_line() -> None:
    result = {"namespace": "vision", "name": "waits", "state": "Pending", "reason": "no room",
              "explain": {"state": "Pending"}, "estimatedStart": ESTIMATE}
    assert "estimated start: 2026-12-01T12:20:00Z (p90 2026-12-01T12:40:00Z), waiting for vision/train" in (
        explanation_lines(result))
    assert not any(line.startswith("estimated start") for line in explanation_lines({**result, "estimatedStart": None}))
