"""Inventory from a Kubernetes cluster: `resource.k8s.io/v1` ResourceSlices and core/v1 Nodes, each kind
followed by a list/watch loop (services/kube/reflector.py: bookmarks, 410 relists, backoff, resumes).

Per node: its ResourceSlices (grouped by spec.nodeName) or, on a node without a DRA driver, the devices
the device plugin and GPU feature discovery describe (shared/fleet/device_plugin.py). A node's full inventory
is published when it changes; a node that is deleted or loses its GPUs publishes `removed: true`.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes.aio import client

from services.bus.streams import ensure_streams
from services.kube.reflector import Backoff as Backoff  # re-exported: its tests import it from here
from services.kube.reflector import Reflector, api_client
from services.runtime.outage import Outage, until_done
from services.watcher.publish import InventoryPublisher, heartbeat_loop
from shared.dra import model as dra
from shared.fleet import device_plugin

log = logging.getLogger("claimbroker.watcher.kube")

NODES = "nodes"
SLICES = "resourceslices"


@dataclass
class NodeInfo:
    labels: dict[str, str]
    capacity: dict[str, str]


class KubeWatcher:
    def __init__(self, publisher: InventoryPublisher, api: client.ApiClient, *, backoff_initial: float = 0.5,
                 backoff_cap: float = 30.0, watch_timeout_s: int = 300) -> None:
        self.publisher = publisher
        self.api = api
        self.core = client.CoreV1Api(api)
        self.resource = client.ResourceV1Api(api)
        self.reflector = Reflector(api, backoff_initial, backoff_cap, watch_timeout_s)
        self.nodes: dict[str, NodeInfo] = {}
        self.slices: dict[str, dra.ResourceSlice] = {}
        self.by_node: dict[str, dict[str, dra.ResourceSlice]] = {}
        self.synced: set[str] = set()  # kinds listed at least once; nothing is published before both are
        self.lists: Counter[str] = self.reflector.lists
        self.watched_from: dict[str, list[str]] = self.reflector.watched_from
        self.watched_from.update({NODES: [], SLICES: []})
        self._unknown_models: set[str] = set()

    async def run(self) -> None:
        await until_done(lambda: ensure_streams(self.publisher.js), Outage("NATS", log))
        async with asyncio.TaskGroup() as group:
            group.create_task(self.reflector.reflect(NODES, self.core.list_node, self._replace_nodes,
                                                     self._node_event))
            group.create_task(self.reflector.reflect(SLICES, self.resource.list_resource_slice,
                                                     self._replace_slices, self._slice_event))
            group.create_task(heartbeat_loop(self.publisher))

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
