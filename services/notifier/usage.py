"""The figures behind quota-near-limit and idle-larger-flavor, from the ledger and the inventory.

The ledger says who uses what (device_allocations carries each device's flavor, so usage is one GROUP
BY) and what waits (a Pending claim's `explain.flavors`, written by the allocator). The fleet comes from
inventory messages: a node's devices are parsed only when its slices change (heartbeats repeat them),
and classified into flavors only when they or the flavor list change, so a pass costs a few queries.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shared.admission.flavors import Flavors
from shared.admission.quota import Flavor, QuotaConfig
from shared.alerts.rules import QuotaUsage
from shared.contract import events
from shared.dra.inventory import Fleet, FleetDevice, NodeInventory
from shared.dra.matching import SelectorMemo
from shared.fleet.freshness import Freshness, judge
from shared.ledger.handles import AsyncSession
from shared.ledger.holdings import devices_by_tenant_and_flavor
from shared.ledger.pending import accepted_flavor_counts, any_pending_mentioning
from shared.ledger.quota_store import load_quota_config

log = logging.getLogger("claimbroker.notifier")
MIG_CLASS = "mig.nvidia.com"


@dataclass(frozen=True)
class Figures:
    """One pass's inputs for the two rules, and for the minute's usage sample (used per tenant and flavor,
    the fleet's devices per flavor)."""

    usages: list[QuotaUsage]
    pending: dict[str, int]
    idle: dict[str, int]
    values: dict[str, float]
    used: dict[tuple[str, str], int]
    capacity: dict[str, int]


class FleetFlavors:
    """Devices per node and flavor, kept from inventory messages."""

    def __init__(self, ttl: float = float("inf")) -> None:
        self.ttl = ttl  # a node not heard of for this long counts for nothing (shared/fleet/freshness.py)
        self._heard: dict[str, float] = {}  # node -> its last message's observedAtUnix, heartbeats included
        self._slices: dict[str, Any] = {}  # node -> the raw slices last parsed, to skip unchanged heartbeats
        self._devices: dict[str, tuple[FleetDevice, ...]] = {}
        self._nodes: dict[str, NodeInventory] = {}  # the whole inventory, for the MIG re-layout advice
        self._counts: dict[str, Counter[str]] = {}  # node -> devices per flavor, under self._flavors
        self._flavors: tuple[tuple[Flavor, ...], Flavors] | None = None
        self._memo = SelectorMemo()

    def on_inventory(self, payload: Mapping[str, Any]) -> None:
        node = payload.get("node")
        if not isinstance(node, str) or not node:
            return
        if payload.get("removed"):
            for kept in (self._slices, self._devices, self._counts, self._nodes, self._heard):
                kept.pop(node, None)
            return
        heard = payload.get("observedAtUnix")
        if isinstance(heard, int | float):
            self._heard[node] = float(heard)
        slices = payload.get("slices")
        if node in self._slices and self._slices[node] == slices:
            return
        try:
            inventory = events.read_inventory(payload)
        except (ValueError, TypeError, AttributeError):
            log.warning("inventory of node %s unreadable; keeping its last devices for idle counts", node)
            return
        self._slices[node], self._devices[node], self._nodes[node] = slices, inventory.devices, inventory
        self._counts.pop(node, None)

    def _fresh(self, node: str, now: float) -> bool:
        """Whether the node counts: a stale one takes no claim, so its devices are not idle capacity."""
        return judge(self._heard.get(node), now, self.ttl).freshness is not Freshness.STALE

    def fleet(self, now: float) -> Fleet:
        return Fleet({name: node for name, node in self._nodes.items() if self._fresh(name, now)})

    def counts(self, flavors: tuple[Flavor, ...], now: float) -> Counter[str]:
        """Fleet devices per flavor, on nodes heard of within the TTL; a changed flavor list reclassifies every
        node, once."""
        if self._flavors is None or self._flavors[0] != flavors:
            self._flavors = (flavors, Flavors(flavors, self._memo))
            self._counts.clear()
        classify = self._flavors[1]
        total: Counter[str] = Counter()
        for node, devices in self._devices.items():
            if not self._fresh(node, now):
                continue
            counted = self._counts.get(node)
            if counted is None:
                counted = self._counts[node] = Counter(
                    name for name in map(classify.name_of, devices) if name is not None)
            total.update(counted)
        return total


async def read_figures(session: AsyncSession, fleet: FleetFlavors, now: float) -> Figures:
    config = await load_quota_config(session)
    used = await devices_by_tenant_and_flavor(session)
    waiting = await accepted_flavor_counts(session)
    return figures(config, used, waiting, fleet.counts(config.flavors, now))


def figures(config: QuotaConfig, used: Mapping[tuple[str, str], int],
            waiting: list[tuple[list[Any] | None, int]], fleet: Mapping[str, int]) -> Figures:
    """Pure: every configured tenant/flavor quota with its use; each pending claim counted once, towards
    the cheapest flavor it accepts (what it would most likely get); idle = fleet minus allocated."""
    usages = [QuotaUsage(tenant.name, flavor, used.get((tenant.name, flavor), 0), limit.nominal,
                         limit.borrowing_limit)
              for tenant in config.tenants.values() for flavor, limit in sorted(tenant.quotas.items())]
    values = {f.name: f.value for f in config.flavors}
    pending: Counter[str] = Counter()
    for accepted, count in waiting:  # the flavors each group of waiting claims accepts (from explain)
        known = [name for name in accepted or () if isinstance(name, str) and name in values]
        if known:
            pending[min(known, key=lambda name: (values[name], name))] += count
    allocated: Counter[str] = Counter()
    for (_, flavor), n in used.items():
        allocated[flavor] += n
    idle = {flavor: max(0, n - allocated[flavor]) for flavor, n in fleet.items()}
    return Figures(usages, dict(pending), idle, values, dict(used), dict(fleet))


async def waiting_for_mig(session: AsyncSession) -> bool:
    """Whether a waiting claim names the MIG device class (the re-layout advice is for them)."""
    return await any_pending_mentioning(session, MIG_CLASS)
