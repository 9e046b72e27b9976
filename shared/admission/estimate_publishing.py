"""Start estimates in service (issue 39): the runtimes they run claims for, out of the runtimes the ledger
observed, and which estimates are published. Pure: the allocator's estimator (services/allocator/estimator.py)
reads the ledger and writes the statuses.

Published (the contract's "a changed estimate is published again when it moves by more than a tenth"): a
claim's estimate when it first waits with one, and again when its p50 moves by more than a tenth of the time
it still had to wait by the estimate last published (and by at least MIN_MOVE seconds: an estimate already
due moves by seconds at each run), or when it can no longer be said (null, with its reason: at first or after a
time). At most `limit` per run, the biggest moves first (first estimates before any move): the rest wait for the
next run."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from shared.admission.estimates import Estimate
from shared.admission.model import ClaimKey
from shared.admission.runtimes import Quantiles, Runtimes

MIN_SAMPLES = 3  # runs of a (tenant, flavor), tenant or the fleet before their quantiles are taken
MOVE_FRACTION = 0.1
MIN_MOVE = 1.0  # seconds


def quantile(values: list[float], q: float) -> float:
    """The nearest-rank quantile of sorted `values` (non-empty): the smallest value at least a fraction q of
    them are no larger than."""
    return values[max(0, math.ceil(q * len(values)) - 1)]


def quantiles(values: Iterable[float]) -> Quantiles:
    ordered = sorted(values)
    return Quantiles(quantile(ordered, 0.5), quantile(ordered, 0.9))


def runtimes_from(samples: Iterable[tuple[str, str | None, float]], min_samples: int = MIN_SAMPLES) -> Runtimes:
    """Runtimes out of observed runs (tenant, flavor or None, seconds): p50 and p90 per (tenant, flavor) and per
    tenant, and the fleet's as the default, each where at least `min_samples` runs were seen."""
    by_flavor: dict[tuple[str, str], list[float]] = {}
    by_tenant: dict[str, list[float]] = {}
    every: list[float] = []
    for tenant, flavor, seconds in samples:
        if seconds < 0:
            continue
        if flavor is not None:
            by_flavor.setdefault((tenant, flavor), []).append(seconds)
        by_tenant.setdefault(tenant, []).append(seconds)
        every.append(seconds)
    return Runtimes({k: quantiles(v) for k, v in by_flavor.items() if len(v) >= min_samples},
                    {k: quantiles(v) for k, v in by_tenant.items() if len(v) >= min_samples},
                    quantiles(every) if len(every) >= min_samples else None)


@dataclass(frozen=True)
class Due:
    """An estimate to publish, and how far it moved from the last one published (inf: the first, or one that
    can no longer be said)."""

    key: ClaimKey
    estimate: Estimate
    move: float


REASON_MOVE = 1.0  # a null estimate whose reason changed: due, after the first ones and the big moves


def move(published: bool, before: float | None, new: float | None, now: float, *,
         reason_changed: bool = False) -> float | None:
    """How far an estimate moved from the one last published (inf: the first, a null included, one said again
    after a null, or a null after a value; REASON_MOVE: a null after a null that said another reason; else its
    move over the time that one still had to wait), or None when it is not due. `published`: one was (`before`
    its p50, None for a null)."""
    if not published:
        return math.inf
    if before is None:
        return math.inf if new is not None else REASON_MOVE if reason_changed else None
    if new is None:
        return math.inf
    moved = abs(new - before)
    if moved > max(MOVE_FRACTION * max(before - now, 0.0), MIN_MOVE):
        return moved / max(before - now, MIN_MOVE)
    return None


def due(estimates: Mapping[ClaimKey, Estimate], published: Mapping[ClaimKey, float | None], now: float,
        limit: int, reasons: Mapping[ClaimKey, str] | None = None) -> list[Due]:
    """The estimates to publish now, at most `limit`, the biggest moves first. `published`: per claim, the p50
    last published for it (None: a null estimate was); a claim not in it has had none. `reasons`: the reasons
    of the null ones published, where known (a null whose reason changed is published again)."""
    found: list[Due] = []
    reasons = reasons or {}
    for key, estimate in estimates.items():
        changed = estimate.p50 is None and key in reasons and (estimate.reason or "") != reasons[key]
        moved = move(key in published, published.get(key), estimate.p50, now, reason_changed=changed)
        if moved is not None:
            found.append(Due(key, estimate, moved))
    found.sort(key=lambda d: (-d.move, d.estimate.p50 if d.estimate.p50 is not None else math.inf, d.key))
    return found[:limit]


@dataclass(frozen=True)
class ErrorSummary:
    """How far off the estimates were, for a tenant and flavor (None: all of them): over `claims` allocated
    with an estimate published, the median and p90 of |actual start - p50|, in seconds, of the first estimate
    published for each (`first_*`; None where none was recorded) and of the last one (`last_*`)."""

    tenant: str | None
    flavor: str | None
    claims: int
    first_p50: float | None
    first_p90: float | None
    last_p50: float
    last_p90: float


def _summary(tenant: str | None, flavor: str | None, rows: list[tuple[float | None, float]]) -> ErrorSummary:
    first = sorted(abs(f) for f, _ in rows if f is not None)
    last = sorted(abs(x) for _, x in rows)
    return ErrorSummary(tenant, flavor, len(rows), quantile(first, 0.5) if first else None,
                        quantile(first, 0.9) if first else None, quantile(last, 0.5), quantile(last, 0.9))


def error_summary(errors: Iterable[tuple[str, str | None, float | None, float]]
                  ) -> tuple[ErrorSummary | None, list[ErrorSummary]]:
    """Out of (tenant, flavor, first error, last error) per claim allocated (seconds, signed): the summary of
    all of them (None: none), and one per tenant and flavor, in that order."""
    groups: dict[tuple[str, str | None], list[tuple[float | None, float]]] = {}
    every: list[tuple[float | None, float]] = []
    for tenant, flavor, first, last in errors:
        groups.setdefault((tenant, flavor), []).append((first, last))
        every.append((first, last))
    return (_summary(None, None, every) if every else None,
            [_summary(t, f, rows) for (t, f), rows in sorted(groups.items(), key=lambda g: (g[0][0], g[0][1] or ""))])
