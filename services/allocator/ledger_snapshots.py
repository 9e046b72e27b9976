"""The input of start estimates outside the allocator's process: the Snapshot a decision cycle would build
now, from the ledger (the queue, the quotas, recent preemptions) and the bus (the fleet, followed by a
FleetView). In the allocator's process the estimator runs on its last committed cycle's input; a process
of its own cannot be handed that input (pickling a snapshot of 10,000 waiting claims on 1,000 nodes took
0.4 to 0.8 s of the allocator's loop), so it reads what the cycle read, when the queue has moved.

It offers what the Estimator reads of a DecisionCycle: `committed_snapshot` and `changes` (how many times
the queue or the fleet moved since it started), made current by `refresh()`."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace

from shared.admission.model import Snapshot
from shared.dra import model as dra
from shared.dra.budget import TENANT_BUDGET
from shared.dra.inventory import Fleet
from shared.fleet.freshness import judge
from shared.ledger import queue
from shared.ledger.handles import AsyncSession
from shared.ledger.past_use import past_use_now
from shared.ledger.quota_store import QuotaConfigCache, config_revision
from shared.ledger.unit_of_work import unit_of_work


class LedgerSnapshots:
    def __init__(self, sessions: Callable[[], AsyncSession], fleet: Callable[[], Awaitable[Fleet]],
                 classes: Mapping[str, dra.DeviceClass], *, inventory_ttl: float, min_runtime: float,
                 gang_reserve_after: float, tenant_budget: int = TENANT_BUDGET,
                 clock: Callable[[], float] = time.time) -> None:
        self.sessions, self.fleet, self.classes = sessions, fleet, dict(classes)
        self.inventory_ttl, self.min_runtime, self.gang_reserve_after = inventory_ttl, min_runtime, gang_reserve_after
        self.tenant_budget, self.clock = tenant_budget, clock
        self.cache = queue.QueueCache()  # documents parsed once per claim, as the allocator's cycle keeps them
        self.quotas = QuotaConfigCache()
        self.committed_snapshot: Snapshot | None = None
        self.changes = 0
        self._version: object = None

    async def refresh(self) -> None:
        """Read the queue again when the ledger's claims, its quota configuration or the fleet's nodes moved
        since the last read."""
        fleet = await self.fleet()
        async with unit_of_work(self.sessions) as work:
            version = (await queue.queue_version(work.session), await config_revision(work.session),
                       frozenset((name, node.shape_id) for name, node in fleet.nodes.items()))
            if version == self._version:
                return
            held = await queue.load_queue(work, self.cache)
            config = await self.quotas.load(work.session)
            now = self.clock()
            limited = any(t.max_preemptions_per_minute is not None for t in config.tenants.values())
            recent = await queue.recent_preemptions(work, now - 60.0) if limited else {}
            # the allocator's past use as it last wrote it, brought up to now (its cycles hold it in memory)
            past = await past_use_now(work.session, now, config.half_life) if config.half_life > 0 else {}
        if (config.default_min_runtime, config.default_gang_reserve_after) != (self.min_runtime,
                                                                               self.gang_reserve_after):
            config = replace(config, default_min_runtime=self.min_runtime,
                             default_gang_reserve_after=self.gang_reserve_after)
        unusable = {name: verdict.reason for name, node in fleet.nodes.items()
                    if (verdict := judge(node.observed_at, now, self.inventory_ttl)).stale}
        waiting, _ = held.waiting.snapshot()
        self.committed_snapshot = Snapshot(
            fleet, self.classes, config, tuple(held.running.values()), waiting, unusable, None, now=now,
            recent_preemptions=recent, tenant_budget=self.tenant_budget, past_use=past) if waiting else None
        self._version = version
        self.changes += 1
