"""Fleet over time: one usage sample a minute (devices in use per tenant and flavor, the fleet's devices
per flavor), written by the notifier's usage pass and read back averaged into buckets for the usage page.

Samples, not the claim history: a released claim keeps no devices in the ledger, and a sample is what
the quota decisions saw (used against nominal) at that minute. A minute's rows are written once (a
second notifier finds them, or loses the primary-key race, and writes nothing); rows older than
RETENTION_S are deleted as new ones come in.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from sqlalchemy import case, delete, func, insert, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from shared.ledger.schema import UsageSample

SAMPLE_EVERY_S = 60
RETENTION_S = 8 * 24 * 3600  # the page's longest window is a week
FLEET = ""  # the tenant of a flavor's fleet row
# Window name -> (its length, the bucket a point averages): 60, 96 and 168 points.
WINDOWS: dict[str, tuple[int, int]] = {"hour": (3600, 60), "day": (86400, 900), "week": (7 * 86400, 3600)}


async def record(session: AsyncSession, now: float, used: Mapping[tuple[str, str], int],
                 nominal: Mapping[tuple[str, str], int], capacity: Mapping[str, int]) -> bool:
    """This minute's sample, unless it is already there; prunes what is past retention. Returns whether
    it wrote. Every (tenant, flavor) with a quota or a device in use gets a row, so a point averages the
    same rows throughout."""
    at = int(now) // SAMPLE_EVERY_S * SAMPLE_EVERY_S
    if await session.scalar(select(UsageSample.at).where(UsageSample.at == at).limit(1)) is not None:
        return False
    rows = [{"at": at, "tenant": tenant, "flavor": flavor, "used": used.get((tenant, flavor), 0),
             "nominal": nominal.get((tenant, flavor), 0), "capacity": 0}
            for tenant, flavor in sorted(set(used) | set(nominal))]
    rows += [{"at": at, "tenant": FLEET, "flavor": flavor, "used": 0, "nominal": 0, "capacity": n}
             for flavor, n in sorted(capacity.items())]
    await session.execute(delete(UsageSample).where(UsageSample.at < at - RETENTION_S))
    if not rows:
        return False
    try:
        async with session.begin_nested():
            await session.execute(insert(UsageSample), rows)
    except IntegrityError:  # another notifier wrote this minute first
        return False
    return True


@dataclass(frozen=True)
class Point:
    """Averages over a bucket's samples; None where the bucket has none (the notifier did not run)."""

    at: int
    used: float | None
    borrowed: float | None
    idle: float | None
    nominal: float | None = None  # on a tenant's series


@dataclass(frozen=True)
class Series:
    flavor: str
    points: list[Point]


async def read(session: AsyncSession, window: str, now: float, tenant: str | None = None) -> list[Series]:
    """Per flavor, one point per bucket of the window: the fleet's used (within nominal), borrowed and idle
    devices, or with `tenant`, that tenant's used within nominal, borrowed, and its nominal."""
    length, bucket = WINDOWS[window]
    end = int(now) // bucket * bucket + bucket
    start = end - length
    slot = (UsageSample.at // bucket).label("slot")
    within = case((UsageSample.used < UsageSample.nominal, UsageSample.used), else_=UsageSample.nominal)
    over = case((UsageSample.used > UsageSample.nominal, UsageSample.used - UsageSample.nominal), else_=0)
    tenants = UsageSample.tenant != FLEET if tenant is None else UsageSample.tenant == tenant
    sums = (select(slot, UsageSample.flavor, func.sum(case((tenants, within), else_=0)),
                   func.sum(case((tenants, over), else_=0)), func.sum(case((tenants, UsageSample.used), else_=0)),
                   func.sum(case((UsageSample.tenant == FLEET, UsageSample.capacity), else_=0)),
                   func.sum(case((tenants, UsageSample.nominal), else_=0)), func.count(func.distinct(UsageSample.at)),
                   func.sum(case((tenants, 1), else_=0)))
            .where(UsageSample.at >= start, UsageSample.at < end)
            .group_by(slot, UsageSample.flavor))
    found: dict[str, dict[int, Point]] = {}
    mine: set[str] = set()  # flavors with the tenant's (or any tenant's) rows in the window
    for index, flavor, w, b, u, c, n, samples, rows in await session.execute(sums):
        if not samples:
            continue
        if rows:
            mine.add(flavor)
        at = int(index) * bucket
        idle = max(0.0, (float(c) - float(u)) / samples) if tenant is None else None
        found.setdefault(flavor, {})[at] = Point(at, float(w) / samples, float(b) / samples, idle,
                                                 float(n) / samples if tenant is not None else None)
    if tenant is not None:  # a tenant's flavors are those it has rows for, not every flavor of the fleet
        found = {flavor: points for flavor, points in found.items() if flavor in mine}
    return [Series(flavor, [points.get(at) or Point(at, None, None, None) for at in range(start, end, bucket)])
            for flavor, points in sorted(found.items())]

