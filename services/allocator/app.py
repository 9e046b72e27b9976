"""The allocator's app: its FastStream broker with the allocator's router (the inventory it reads, the
statuses it sends), and the allocator's batch loop on the broker's connection."""

from __future__ import annotations

from pathlib import Path

from services.allocator.service import Allocator
from services.bus import channels
from services.runtime.service_app import ServiceApp
from shared.dra.classes import merge_classes
from shared.fleet.sources import load_inventory
from shared.ledger.handles import AsyncEngine
from shared.settings import AllocatorSettings


def allocator_app(nats_url: str, allocator: Allocator, tls_ca: Path | None = None) -> ServiceApp:
    return ServiceApp("allocator", nats_url, allocator.run, channels.allocator_router(allocator.on_inventory),
                      service=allocator, not_ready=allocator.not_ready, tls_ca=tls_ca)


def create_app(settings: AllocatorSettings, engine: AsyncEngine, nats_url: str) -> ServiceApp:
    classes = merge_classes(load_inventory(settings.inventory).classes)
    return allocator_app(nats_url, Allocator(
        engine, classes, batch=settings.allocator_batch, ack_wait=settings.allocator_ack_wait,
        max_deliver=settings.max_deliver, inventory_ttl=settings.inventory_ttl,
        reason_refresh=settings.reason_refresh, min_runtime=settings.min_runtime,
        gang_reserve_after=settings.gang_reserve_after,
        tenant_budget=settings.tenant_placement_budget, continue_after=settings.placement_continue_after,
        inbox_retention=settings.inbox_retention, early_releases_per_tenant=settings.early_releases_per_tenant,
        estimate_interval=settings.estimate_interval),
        settings.tls_ca)
