"""Inventory from a Kubernetes cluster: `resource.k8s.io/v1` ResourceSlices and core/v1 Nodes.

Why `kubernetes.aio` and not the sync client in a thread: the watcher is an asyncio service, and a
thread blocked in a watch read cannot be cancelled, so Ctrl-C or a pod stop would wait for the next
event or the server's watch timeout. The aio client is cancelled like any other task.

Why our own list/watch loop instead of `Watch.stream`'s reconnects or the bundled SharedInformer: we
need bookmarks, a relist on 410 Gone, capped exponential backoff after errors and a resume from the
last resourceVersion after a dropped connection, and neither gives all of that (the informer has no
backoff and no bookmarks; `stream` retries a 410 once with the same stale version). So each watch is
one connection (`timeout_seconds`), and this module decides what happens when it ends.

Per node: its ResourceSlices (grouped by spec.nodeName) or, on a node without a DRA driver, the devices
the device plugin and GPU feature discovery describe (shared/fleet/device_plugin.py). A node's full inventory
is published when it changes; a node that is deleted or loses its GPUs publishes `removed: true`.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes.aio import client, config, watch
from kubernetes.aio.client.exceptions import ApiException

from services.bus.streams import ensure_streams
from services.runtime.outage import Outage, until_done
from services.watcher.publish import InventoryPublisher, heartbeat_loop
from shared.dra import model as dra
from shared.fleet import device_plugin

log = logging.getLogger("claimbroker.watcher.kube")

NODES = "nodes"
SLICES = "resourceslices"


async def api_client(kubeconfig: Path | None = None) -> client.ApiClient:
    """An explicit kubeconfig wins; otherwise in-cluster (the pod's ServiceAccount), then ~/.kube/config."""
    configuration = client.Configuration()
    if kubeconfig is not None:
        await config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
    else:
        try:
            config.load_incluster_config(client_configuration=configuration)
        except config.ConfigException:
            await config.load_kube_config(client_configuration=configuration)
    return client.ApiClient(configuration)


@dataclass
class NodeInfo:
    labels: dict[str, str]
    capacity: dict[str, str]


@dataclass
class Backoff:
    """Capped exponential backoff with jitter; the first retry after a 410 is immediate (a relist is the
    normal answer to an expired version), repeated failures wait longer, so an API server in trouble is
    not hammered."""

    initial: float = 0.5
    cap: float = 30.0
    failures: int = 0
    rng: random.Random = field(default_factory=random.Random)

    def next_delay(self, *, gone: bool = False) -> float:
        self.failures += 1
        if gone and self.failures == 1:
            return 0.0
        return min(self.cap, self.initial * 2 ** (self.failures - 1)) * self.rng.uniform(0.5, 1.0)

    def reset(self) -> None:
        self.failures = 0


Convert = Callable[[Any], dict[str, Any]]


class KubeWatcher:
    def __init__(self, publisher: InventoryPublisher, api: client.ApiClient, *, backoff_initial: float = 0.5,
                 backoff_cap: float = 30.0, watch_timeout_s: int = 300) -> None:
        self.publisher = publisher
        self.api = api
        self.core = client.CoreV1Api(api)
        self.resource = client.ResourceV1Api(api)
        self.backoff_initial = backoff_initial
        self.backoff_cap = backoff_cap
        self.watch_timeout_s = watch_timeout_s
        self.nodes: dict[str, NodeInfo] = {}
        self.slices: dict[str, dra.ResourceSlice] = {}
        self.by_node: dict[str, dict[str, dra.ResourceSlice]] = {}
        self.synced: set[str] = set()  # kinds listed at least once; nothing is published before both are
        self.lists: Counter[str] = Counter()
        self.watched_from: dict[str, list[str]] = {NODES: [], SLICES: []}
        self._unknown_models: set[str] = set()

    async def run(self) -> None:
        await until_done(lambda: ensure_streams(self.publisher.js), Outage("NATS", log))
        async with asyncio.TaskGroup() as group:
            group.create_task(self._reflect(NODES, self.core.list_node, self._replace_nodes, self._node_event))
            group.create_task(self._reflect(SLICES, self.resource.list_resource_slice, self._replace_slices,
                                            self._slice_event))
            group.create_task(heartbeat_loop(self.publisher))

    async def _reflect(self, kind: str, list_fn: Callable[..., Awaitable[Any]],
                       replace: Callable[[list[dict[str, Any]]], Awaitable[None]],
                       apply: Callable[[str, dict[str, Any]], Awaitable[None]]) -> None:
        """List, then watch from the listed version; on 410 relist; on errors back off and resume."""
        backoff = Backoff(self.backoff_initial, self.backoff_cap)
        version: str | None = None
        while True:
            gone = False
            try:
                if version is None:
                    listing = await list_fn()
                    self.lists[kind] += 1
                    await replace([self._dict(item) for item in listing.items])
                    version = str(listing.metadata.resource_version)  # only once published: else list again
                self.watched_from[kind].append(version)
                async with watch.Watch() as stream:
                    # the client's own timeout outlasts the server's, so a quiet watch ends cleanly, not in error
                    async for event in stream.stream(list_fn, resource_version=version, allow_watch_bookmarks=True,
                                                     timeout_seconds=self.watch_timeout_s,
                                                     _request_timeout=float(self.watch_timeout_s + 30)):
                        if event["type"] != "BOOKMARK":
                            await apply(event["type"], self._dict(event["object"]))
                        version = stream.resource_version or version  # after publishing: a failure replays it
                        backoff.reset()
                continue  # the server ended the watch (its timeout): resume at once from where we are
            except asyncio.CancelledError:
                raise
            except ApiException as error:
                gone = error.status == 410
                if gone:
                    log.info("%s: resource version %s expired (410 Gone); relisting", kind, version)
                    version = None
                else:
                    log.warning("%s: list/watch failed: %s %s", kind, error.status, error.reason)
            except Exception as error:  # the watch loop's guard: dropped connections, timeouts, a server down
                log.warning("%s: watch interrupted (%r); resuming from %s", kind, error, version)
            await asyncio.sleep(backoff.next_delay(gone=gone))

    def _dict(self, obj: Any) -> dict[str, Any]:
        """Client models to the API's camelCase JSON (bookmark objects are dicts already)."""
        return obj if isinstance(obj, dict) else dict(self.api.sanitize_for_serialization(obj))

    # --- state changes; each returns after publishing what changed -------------------------------

    async def _replace_nodes(self, items: list[dict[str, Any]]) -> None:
        before = set(self.nodes)
        self.nodes = {item["metadata"]["name"]: _node_info(item) for item in items}
        await self._listed(NODES, before | set(self.nodes))

    async def _node_event(self, kind: str, item: dict[str, Any]) -> None:
        name = item["metadata"]["name"]
        if kind == "DELETED":
            self.nodes.pop(name, None)
        else:
            self.nodes[name] = _node_info(item)
        await self._sync([name])

    async def _replace_slices(self, items: list[dict[str, Any]]) -> None:
        before = set(self.by_node)
        self.slices, self.by_node = {}, {}
        for item in items:
            parsed = _parse_slice(item)
            if parsed is not None:
                self._put(item["metadata"]["name"], parsed)
        await self._listed(SLICES, before | set(self.by_node))

    async def _slice_event(self, kind: str, item: dict[str, Any]) -> None:
        name = item["metadata"]["name"]
        old = self.slices.pop(name, None)
        affected = set()
        if old is not None:
            affected.add(old.spec.node_name or "")
            self.by_node.get(old.spec.node_name or "", {}).pop(name, None)
        if kind != "DELETED" and (parsed := _parse_slice(item)) is not None:
            self._put(name, parsed)
            affected.add(parsed.spec.node_name or "")
        await self._sync(affected - {""})

    def _put(self, name: str, parsed: dra.ResourceSlice) -> None:
        """Only node-local slices are kept: network-attached ones (allNodes, nodeSelector) have no node."""
        if parsed.spec.node_name:
            self.slices[name] = parsed
            self.by_node.setdefault(parsed.spec.node_name, {})[name] = parsed

    async def _listed(self, kind: str, affected: set[str]) -> None:
        first = kind not in self.synced
        self.synced.add(kind)
        if first and self.synced == {NODES, SLICES}:
            affected = set(self.nodes) | set(self.by_node) | self.publisher.nodes()
        await self._sync(affected)

    async def _sync(self, nodes: Iterable[str]) -> None:
        if self.synced != {NODES, SLICES}:
            return
        for node in sorted(set(nodes)):
            inventory = self._inventory(node)
            if inventory is None:
                await self.publisher.remove(node)
            else:
                slices, labels = inventory
                await self.publisher.publish(node, slices, labels=labels)

    def _inventory(self, node: str) -> tuple[list[dra.ResourceSlice], dict[str, str]] | None:
        """None for a node that is gone or has no GPUs; a Node must exist for its slices to count, so
        slices left behind by a deleted node do not keep it allocatable."""
        info = self.nodes.get(node)
        if info is None:
            return None
        slices = [self.by_node[node][name] for name in sorted(self.by_node.get(node, {}))]
        if not slices:
            try:
                documents = device_plugin.node_slices(node, info.labels, info.capacity)
            except ValueError as error:
                if node not in self._unknown_models:
                    log.warning("node %s: device-plugin GPUs not described: %s", node, error)
                    self._unknown_models.add(node)
                return None
            slices = [s for s in map(_parse_slice, documents) if s is not None]
        return (slices, info.labels) if slices else None


def _node_info(item: dict[str, Any]) -> NodeInfo:
    labels = item.get("metadata", {}).get("labels") or {}
    capacity = (item.get("status") or {}).get("capacity") or {}
    return NodeInfo({str(k): str(v) for k, v in labels.items()}, {str(k): str(v) for k, v in capacity.items()})


def _parse_slice(item: dict[str, Any]) -> dra.ResourceSlice | None:
    """List items carry no apiVersion/kind; a slice we cannot read is logged and left out, not fatal."""
    document = {"apiVersion": dra.API_VERSION, "kind": "ResourceSlice", **item}
    try:
        parsed = dra.parse_object(document)
    except dra.DocumentError as error:
        log.warning("ResourceSlice %s skipped: %s", item.get("metadata", {}).get("name"), error)
        return None
    return parsed if isinstance(parsed, dra.ResourceSlice) else None


async def run_kube(publisher: InventoryPublisher, kubeconfig: Path | None = None) -> None:
    """The service entry point: connect as configured, watch until cancelled, close the connection pool."""
    api = await api_client(kubeconfig)
    try:
        await KubeWatcher(publisher, api).run()
    finally:
        await api.close()
