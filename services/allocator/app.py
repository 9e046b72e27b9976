"""The allocator's app: its FastStream broker with the allocator's router (the inventory it reads, the
statuses it sends), and the allocator's batch loop on the broker's connection; with `kube`, beside it the
cluster's ResourceClaims (cluster_claims.py) on the same connection."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path

from nats.aio.client import Client

from services.allocator.cluster_claims import ClusterClaims
from services.allocator.service import Allocator
from services.bus import channels
from services.kube.reflector import api_client
from services.runtime.service_app import Main, ServiceApp
from shared.dra.classes import merge_classes
from shared.fleet.sources import load_inventory
from shared.ledger.handles import AsyncEngine
from shared.settings import AllocatorSettings


def allocator_app(nats_url: str, allocator: Allocator, tls_ca: Path | None = None, main: Main | None = None
                  ) -> ServiceApp:
    return ServiceApp("allocator", nats_url, main or allocator.run, channels.allocator_router(allocator.on_inventory),
                      service=allocator, not_ready=allocator.not_ready, tls_ca=tls_ca)


def with_cluster_claims(allocator: Allocator, settings: AllocatorSettings, engine: AsyncEngine) -> Main:
    """The allocator's loop and the cluster's claims beside it; the cluster's stop when the allocator's does."""
    async def main(nc: Client, subscribe: Callable[[], Awaitable[None]]) -> None:
        api = await api_client(settings.kubeconfig)
        cluster = ClusterClaims(api, engine, nc, holder=f"{socket.gethostname()}:{id(allocator):x}",
                                namespaces=settings.kube_namespaces)
        following = asyncio.create_task(cluster.run(), name="allocator-cluster-claims")
        try:
            await allocator.run(nc, subscribe)
        finally:
            following.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await following
            await cluster.release_lease()
            await api.close()
    return main


def create_app(settings: AllocatorSettings, engine: AsyncEngine, nats_url: str) -> ServiceApp:
    classes = merge_classes(load_inventory(settings.inventory).classes)
    allocator = Allocator(
        engine, classes, batch=settings.allocator_batch, ack_wait=settings.allocator_ack_wait,
        max_deliver=settings.max_deliver, inventory_ttl=settings.inventory_ttl,
        reason_refresh=settings.reason_refresh, min_runtime=settings.min_runtime,
        gang_reserve_after=settings.gang_reserve_after,
        tenant_budget=settings.tenant_placement_budget, continue_after=settings.placement_continue_after,
        inbox_retention=settings.inbox_retention, early_releases_per_tenant=settings.early_releases_per_tenant,
        estimate_interval=settings.estimate_interval)
    main = with_cluster_claims(allocator, settings, engine) if settings.kube else None
    return allocator_app(nats_url, allocator, settings.tls_ca, main)
