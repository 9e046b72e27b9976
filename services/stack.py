"""Composition root: build and run the four services from settings, in one process or one each."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from services.allocator.service import Allocator
from services.natsio import EmbeddedNats, connect, ensure_streams, wait_closed
from services.notifier.service import Notifier
from services.watcher.files import FileWatcher
from shared.classes import merge_classes
from shared.ledger.engine import create_engine, migrate
from shared.settings import BrokerSettings
from shared.sources import load_inventory

log = logging.getLogger("claimbroker")


@dataclass
class Stack:
    nats_url: str
    db_url: str
    engine: AsyncEngine
    api_url: str | None = None
    allocator: Allocator | None = None
    tasks: dict[str, asyncio.Task[Any]] = field(default_factory=dict)
    embedded: EmbeddedNats | None = None


async def start_service(stack: Stack, name: str, settings: BrokerSettings) -> None:
    """Start one service as a task of this process, on its own NATS connection."""
    nc = await connect(stack.nats_url, name=f"claimbroker-{name}")
    if name == "watcher":  # the source settings name: the cluster, this host's GPUs, else files (or the demo)
        from services.watcher.publish import InventoryPublisher

        if settings.kube:
            from services.watcher.kube import run_kube

            publisher = InventoryPublisher(nc.jetstream(), heartbeat_interval=settings.heartbeat_interval)
            runner: Any = run_kube(publisher, settings.kubeconfig)
        elif settings.nvml:
            import socket

            from services.watcher.nvml import NvmlWatcher

            publisher = InventoryPublisher(nc.jetstream(), heartbeat_interval=settings.heartbeat_interval)
            runner = NvmlWatcher(publisher, settings.node_name or socket.gethostname(),
                                 poll_interval=settings.nvml_poll_interval).run()
        else:
            runner = FileWatcher(nc.jetstream(), settings.inventory, poll_interval=settings.inventory_poll_interval,
                                 heartbeat_interval=settings.heartbeat_interval).run()
    elif name == "allocator":
        classes = merge_classes(load_inventory(settings.inventory).classes)
        stack.allocator = Allocator(nc, stack.engine, classes, batch=settings.allocator_batch,
                                    ack_wait=settings.allocator_ack_wait, max_deliver=settings.max_deliver,
                                    inventory_ttl=settings.inventory_ttl, reason_refresh=settings.reason_refresh)
        runner = stack.allocator.run()
    elif name == "notifier":
        runner = Notifier(nc, stack.engine, settings).run()
    elif name == "admin-api":
        runner = _serve_api(stack, settings)
    else:
        raise ValueError(f"unknown service {name!r}")

    async def guarded() -> None:
        try:
            await runner
        finally:
            await nc.close()

    stack.tasks[name] = asyncio.create_task(guarded(), name=name)


async def _serve_api(stack: Stack, settings: BrokerSettings) -> None:
    import uvicorn

    from services.admin_api.app import create_app

    config = uvicorn.Config(create_app(stack.engine), host=settings.api_host, port=settings.api_port,
                            log_level="warning", lifespan="on")
    server = uvicorn.Server(config)

    async def serve() -> None:
        try:
            await server.serve()
        except SystemExit as stop:  # uvicorn exits the process when it cannot listen: fail this service instead
            raise RuntimeError(f"the admin API cannot listen on {settings.api_host}:{settings.api_port} (is the port "
                               f"in use? uvicorn exited with {stop.code})") from None

    serving = asyncio.create_task(serve())
    try:
        await asyncio.shield(serving)
    except asyncio.CancelledError:
        server.should_exit = True  # a clean uvicorn shutdown instead of a cancelled lifespan
        await serving
        raise


SERVICES = ("watcher", "allocator", "notifier", "admin-api")


@contextlib.asynccontextmanager
async def running_stack(
    settings: BrokerSettings, *, services: tuple[str, ...] = SERVICES
) -> AsyncIterator[Stack]:
    """Embedded NATS and SQLite unless settings name external ones; migrations run first."""
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    embedded = None
    nats_url = settings.nats_url
    if not nats_url:
        embedded = EmbeddedNats(Path(settings.data_dir) / "nats", sync=settings.nats_sync)
        nats_url = await asyncio.to_thread(embedded.start)
    db_url = settings.database_url()
    await migrate(db_url)
    engine = create_engine(db_url)
    stack = Stack(nats_url=nats_url, db_url=db_url, engine=engine, embedded=embedded)
    nc = await connect(nats_url, name="claimbroker-setup")
    await ensure_streams(nc.jetstream())
    await nc.close()
    try:
        for name in services:
            await start_service(stack, name, settings)
        if "admin-api" in services:
            stack.api_url = f"http://{settings.api_host}:{settings.api_port}"
        yield stack
    finally:
        if stack.allocator is not None and "allocator" in stack.tasks:
            stack.allocator.stop()  # let it finish its transaction rather than cut it
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(stack.tasks["allocator"]), 5)
        for task in list(stack.tasks.values())[::-1]:
            await wait_closed(task)
        await engine.dispose()
        if embedded is not None:
            await asyncio.to_thread(embedded.stop)
