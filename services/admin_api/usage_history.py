"""GET /v1/usage/history: the fleet over time for the usage page, from the notifier's usage samples
(shared/ledger/usage_history.py): per flavor, used within nominal, borrowed and idle devices over the last
hour, day or week, or one tenant's. A tenant-scoped viewer gets only its own tenant's series."""

from __future__ import annotations

import time
from typing import Literal

from fastapi import APIRouter
from pydantic import Field

from services.admin_api.access import Caller, Session, visible
from services.admin_api.fields import Model
from services.admin_api.problems import PROBLEMS
from shared.ledger import usage_history
from shared.ledger.quota_store import load_quota_config

router = APIRouter(responses=PROBLEMS)


class HistoryPoint(Model):
    at: int = Field(description="the bucket's start, unix seconds")
    used: float | None = Field(description="devices in use within nominal quota, averaged over the bucket; "
                                           "null where no sample was taken")
    borrowed: float | None = Field(description="devices in use beyond nominal quota")
    idle: float | None = Field(description="the flavor's devices in the fleet that nobody uses (fleet series)")
    nominal: float | None = Field(description="the tenant's nominal quota (tenant series)")


class FlavorHistory(Model):
    flavor: str
    units_per_device: float | None = Field(description="the flavor's GPU units per device (its value), to read "
                                                       "the devices as GPU units; null for a flavor no longer set")
    points: list[HistoryPoint]


class UsageHistory(Model):
    window: str
    bucket_seconds: int
    tenant: str | None = Field(description="whose series these are; null: the whole fleet's")
    flavors: list[FlavorHistory]


@router.get("/v1/usage/history", response_model=UsageHistory, tags=["quotas"])
async def usage_history_of(s: Session, token: Caller, window: Literal["hour", "day", "week"] = "hour",
                           tenant: str | None = None) -> UsageHistory:
    """Devices per flavor over time, a point per minute (hour), 15 minutes (day) or hour (week). Samples are
    written by the notifier once a minute; a gap (null) is time it did not run."""
    if token.tenant is not None:
        if tenant is not None:
            visible(token, tenant)
        tenant = token.tenant
    series = await usage_history.read(s, window, time.time(), tenant)
    values = {flavor.name: flavor.value for flavor in (await load_quota_config(s)).flavors}
    return UsageHistory(window=window, bucket_seconds=usage_history.WINDOWS[window][1], tenant=tenant,
                        flavors=[FlavorHistory(flavor=f.flavor, units_per_device=values.get(f.flavor), points=[
                            HistoryPoint(at=p.at, used=p.used, borrowed=p.borrowed, idle=p.idle, nominal=p.nominal)
                            for p in f.points]) for f in series])
