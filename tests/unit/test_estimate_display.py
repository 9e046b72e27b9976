"""The CLI shows a waiting claim's estimated start: `status`'s ETA column (the p50; '-' for a Pending claim
without one, nothing for the others) and `explain`'s line, from the API's estimatedStart."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
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
    never = {"namespace": "vision", "name": "b300", "state": "Pending", "reason": "no device could",
             "estimatedStart": None, "estimatedStartReason": "no device of today's fleet could ever satisfy it"}
    assert [eta(r) for r in [*rows, never]] == ["2026-12-01T12:20:00Z", "-", "-", "",
                                                 "none: no device of today's fleet could ever satisfy it"]
    now = datetime(2026, 12, 1, 9, 5, tzinfo=UTC)
    assert eta(rows[0], now) == "2026-12-01T12:20:00Z (in 3h15m)"
    assert eta(rows[0], now - timedelta(days=2, hours=1)) == "2026-12-01T12:20:00Z (in 2d4h)"
    assert eta(rows[0], datetime(2026, 12, 1, 12, 19, 30, tzinfo=UTC)) == "2026-12-01T12:20:00Z (now)"
    horizon = {**never, "estimatedStartReason": "it does not start within 7d of the claims running now, as far as "
               "their runtimes are known (a claim without claimbroker.io/expected-runtime ...)"}
    assert eta(horizon, whole=False) == "none: it does not start within 7d of the claims running now"  # a cell
    assert eta(horizon).endswith("expected-runtime ...)")  # whole, as -o json readers and explain get it
    console = Console(width=200, record=True)
    console.print(status_table(rows))
    text = console.export_text()
    assert "ETA" in text.splitlines()[1] and "2026-12-01T12:20:00Z" in text
    console = Console(width=200, record=True)
    console.print(status_table(rows[1:]))  # no estimate among them (estimates off): no ETA column
    assert "ETA" not in console.export_text()
    console = Console(width=200, record=True)
    console.print(status_table([*rows[1:], never, horizon]))  # a null estimate with its reason shows the column
    text = console.export_text()
    assert "ETA" in text and "none: no device of today's fleet" in text
    assert "within 7d of the claims running now " in text and "as far as" not in text  # its first clause


def test_explain_estimated_start_line() -> None:
    result = {"namespace": "vision", "name": "waits", "state": "Pending", "reason": "no room",
              "explain": {"state": "Pending"}, "estimatedStart": ESTIMATE}
    assert "estimated start: 2026-12-01T12:20:00Z (p90 2026-12-01T12:40:00Z), waiting for vision/train" in (
        explanation_lines(result))
    assert not any(line.startswith("estimated start") for line in explanation_lines({**result, "estimatedStart": None}))


def test_explain_says_why_a_null_estimate_is_null() -> None:
    why = "no device of today's fleet could ever satisfy it as written"
    result = {"namespace": "vision", "name": "never", "state": "Pending", "reason": "no room",
              "explain": {"state": "Pending"}, "estimatedStart": None, "estimatedStartReason": why}
    assert f"estimated start: none: {why}" in explanation_lines(result)
    assert explanation_lines({**result, "explain": None})[-2:] == [
        f"estimated start: none: {why}", "no structured explanation recorded"], "said without an explanation too"
    assert not any(line.startswith("estimated start") for line in explanation_lines(
        {**result, "estimatedStartReason": None})), "none published: nothing said"


def test_estimates_table_and_gauges() -> None:
    from prometheus_client import REGISTRY

    from services.allocator.estimator import export_errors
    from services.cli.admin import estimate_rows
    from shared.ledger.estimates import EstimateError

    result = {"window": 86400, "groups": [
        {"tenant": "a", "flavor": "h100", "claims": 2, "firstP50": 5400.0, "firstP90": None, "lastP50": 90.0,
         "lastP90": 30.0}],
        "overall": {"tenant": None, "flavor": None, "claims": 2, "firstP50": 5400.0, "firstP90": None,
                    "lastP50": 90.0, "lastP90": 30.0}}
    assert estimate_rows(result) == [["a", "h100", 2, "1.5h", "-", "1.5m", "30s"],
                                     ["*", "*", 2, "1.5h", "-", "1.5m", "30s"]]
    assert estimate_rows({"window": 1, "groups": [], "overall": None}) == []
    export_errors([EstimateError("a", "h100", 120.0, -60.0), EstimateError("a", None, None, 30.0)])
    value = REGISTRY.get_sample_value
    assert value("claimbroker_estimate_error_seconds", {"estimate": "last", "quantile": "0.5"}) == 30.0
    assert value("claimbroker_estimate_error_seconds", {"estimate": "first", "quantile": "0.9"}) == 120.0
