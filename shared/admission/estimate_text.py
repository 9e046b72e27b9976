"""How start estimates read (issue 39): instants as RFC 3339, rounded up to the second (a start is never shown
early), and waits as a person reads them ('45m', '3h20m', '2d4h'), alike in statuses, reasons and the CLI."""

from __future__ import annotations

import math

from shared.contract.events import now_iso


def rfc3339(unix: float) -> str:
    """'2026-01-01T00:20:00Z' (whole seconds, rounded up: a start is never shown early)."""
    return now_iso(float(math.ceil(unix)))


def rough_duration(seconds: float) -> str:
    """45m, 3h20m, 2d4h: two units at most, in whole minutes (1m at least), a person's reading of a wait."""
    minutes = int(seconds // 60)
    days, hours, minutes = minutes // 1440, minutes // 60 % 24, minutes % 60
    parts = [f"{n}{u}" for n, u in ((days, "d"), (hours, "h"), (minutes, "m")) if n]
    return "".join(parts[:2]) or "1m"


def first_clause(text: str) -> str:
    """Up to the first comma, semicolon, colon or parenthesis: a reason's gist for a table's cell ('it does
    not start within 7d of the claims running now' of the horizon's reason)."""
    cut = min((i for i in (text.find(mark) for mark in (",", ";", ":", " (")) if i > 0), default=len(text))
    return text[:cut]
