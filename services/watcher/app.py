"""The watcher's app: its FastStream broker with the watcher's router (the inventory it sends), and the
inventory source the settings name: the Kubernetes cluster, this host's GPUs through NVML, else files."""

from __future__ import annotations

import socket
from collections.abc import Awaitable, Callable
from typing import Any

from nats.aio.client import Client

from services.bus import channels
from services.runtime.service_app import ServiceApp
from services.watcher.publish import InventoryPublisher
from shared.settings import WatcherSettings


def create_app(settings: WatcherSettings, nats_url: str) -> ServiceApp:
    async def main(nc: Client, subscribe: Callable[[], Awaitable[object]]) -> None:
        await subscribe()  # no subscribers: it starts the app's publishers
        js = nc.jetstream()
        runner: Any
        if settings.kube:
            from services.watcher.kube import run_kube

            runner = run_kube(InventoryPublisher(js, heartbeat_interval=settings.heartbeat_interval),
                              settings.kubeconfig)
        elif settings.nvml:
            from services.watcher.nvml import NvmlWatcher

            runner = NvmlWatcher(InventoryPublisher(js, heartbeat_interval=settings.heartbeat_interval),
                                 settings.node_name or socket.gethostname().lower(),  # as the kubelet names it
                                 poll_interval=settings.nvml_poll_interval).run()
        else:
            from services.watcher.files import FileWatcher

            runner = FileWatcher(js, settings.inventory, poll_interval=settings.inventory_poll_interval,
                                 heartbeat_interval=settings.heartbeat_interval).run()
        await runner

    return ServiceApp("watcher", nats_url, main, channels.watcher_router(), tls_ca=settings.tls_ca)
