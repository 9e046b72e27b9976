"""Start estimates as a service beside the allocator (issue 39): `up` runs it in a process of its own, at a
lower CPU priority, so that running the decision core forward never slows a decision (in the allocator's
process its thread took the GIL from the decisions: a calm tenant's first status went from 23 ms to 0.8 s
beside claims that exhaust the placement search). It reads what a cycle reads (the ledger's queue and
quotas, the bus's fleet: ledger_snapshots.py), runs the Estimator on it, writes the estimates that are due
under the shard's turn (no decision races them) and publishes them through an outbox relay of its own."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from nats.aio.client import Client

from services.allocator.estimator import Estimator
from services.allocator.ledger_snapshots import LedgerSnapshots
from services.allocator.outbox_relay import OutboxRelay
from services.bus.cancel import wait_closed
from services.bus.fleet_view import FleetView
from services.runtime.service_app import ServiceApp
from shared.dra.classes import merge_classes
from shared.fleet.sources import load_inventory
from shared.ledger.engine import sessions
from shared.ledger.handles import AsyncEngine
from shared.settings import AllocatorSettings

SHARD = "default"  # the allocator's shard: its turn is taken to write an estimate


class EstimatesService:
    def __init__(self, settings: AllocatorSettings, engine: AsyncEngine) -> None:
        self.settings = settings
        self.sessions = sessions(engine)
        self.relay = OutboxRelay(self.sessions)
        self.estimator: Estimator | None = None

    def not_ready(self) -> str | None:
        return self.estimator.outage.why() if self.estimator is not None else "not started yet"

    async def run(self, nc: Client, subscribe: Callable[[], Awaitable[object]]) -> None:
        settings = self.settings
        self.relay.js = nc.jetstream()

        async def connection() -> Client:
            return nc

        view = FleetView(connection, owns_connection=False)
        classes = merge_classes(load_inventory(settings.inventory).classes)
        snapshots = LedgerSnapshots(self.sessions, view.current, classes,
                                    inventory_ttl=settings.inventory_ttl, min_runtime=settings.min_runtime,
                                    gang_reserve_after=settings.gang_reserve_after,
                                    tenant_budget=settings.tenant_placement_budget)
        self.estimator = Estimator(self.sessions, snapshots, self.relay, shard=SHARD,
                                   interval=settings.estimate_interval, read_again=snapshots.refresh)
        relaying = asyncio.create_task(self.relay.run(), name="estimates-outbox")
        try:
            await self.estimator.run()
        finally:
            await wait_closed(relaying)
            await view.close()


def create_app(settings: AllocatorSettings, engine: AsyncEngine, nats_url: str) -> ServiceApp:
    service = EstimatesService(settings, engine)
    return ServiceApp("estimator", nats_url, service.run, service=service, not_ready=service.not_ready,
                      tls_ca=settings.tls_ca)
