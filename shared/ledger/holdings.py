"""The devices claims hold (device_allocations, each with its flavor and GPU units), counted as the usage
views need them: per device for the node map, per tenant and flavor for usage and quota alerts, per
claim and flavor for an import's claims over their new quota."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from shared.ledger.schema import Claim, DeviceAllocation

DeviceKey = tuple[str, str, str]  # driver, pool, device


async def device_holders(session: AsyncSession) -> dict[DeviceKey, tuple[str, str]]:
    """Each held device's (tenant, claim name)."""
    return {(driver, pool, device): (tenant, name) for driver, pool, device, tenant, name in await session.execute(
        select(DeviceAllocation.driver, DeviceAllocation.pool, DeviceAllocation.device, Claim.namespace, Claim.name)
        .join(Claim, Claim.id == DeviceAllocation.claim_id))}


async def use_by_tenant_and_flavor(session: AsyncSession) -> dict[tuple[str, str | None], tuple[int, float]]:
    """(devices, GPU units) per tenant and flavor; flavor None: devices no flavor's selector accepts."""
    units = func.coalesce(func.sum(DeviceAllocation.units), 0)
    query = (select(Claim.namespace, DeviceAllocation.flavor, func.count(), units)
             .join(Claim, Claim.id == DeviceAllocation.claim_id)
             .group_by(Claim.namespace, DeviceAllocation.flavor))
    return {(ns, flavor): (int(n), float(units)) for ns, flavor, n, units in await session.execute(query)}


async def devices_by_tenant_and_flavor(session: AsyncSession) -> dict[tuple[str, str], int]:
    """Devices in use per tenant and flavor, those of no flavor left out."""
    rows = await session.execute(
        select(Claim.namespace, DeviceAllocation.flavor, func.count())
        .join(Claim, Claim.id == DeviceAllocation.claim_id)
        .where(DeviceAllocation.flavor.is_not(None))
        .group_by(Claim.namespace, DeviceAllocation.flavor))
    return {(tenant, str(flavor)): int(n) for tenant, flavor, n in rows}


async def devices_by_claim_and_flavor(session: AsyncSession) -> list[tuple[str, str, str, int]]:
    """(tenant, claim name, flavor, devices) of every claim holding devices of a flavor, by tenant, flavor
    and name."""
    query = (select(Claim.namespace, Claim.name, DeviceAllocation.flavor, func.count())
             .join(Claim, Claim.id == DeviceAllocation.claim_id)
             .where(DeviceAllocation.flavor.is_not(None))
             .group_by(Claim.namespace, Claim.name, DeviceAllocation.flavor)
             .order_by(Claim.namespace, DeviceAllocation.flavor, Claim.name))
    out = []
    for ns, name, flavor, n in await session.execute(query):
        assert flavor is not None  # the query's condition
        out.append((ns, name, flavor, int(n)))
    return out
