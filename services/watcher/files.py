"""Inventory from files: topology documents and ResourceSlices, republished when a file changes."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from nats.js import JetStreamContext

from services.natsio import ensure_streams, publish_json
from shared import dra, events, subjects
from shared.sources import InventoryDocuments, InventoryFileError, load_inventory

log = logging.getLogger("claimbroker.watcher")


def node_payloads(documents: InventoryDocuments, sequence: int, observed_at: float) -> dict[str, dict[str, Any]]:
    """One full inventory per node; the message id is a digest of the content, so a republish of the
    same fleet is a duplicate JetStream drops."""
    by_node: dict[str, list[dra.ResourceSlice]] = {}
    for s in documents.slices:
        if s.spec.node_name:
            by_node.setdefault(s.spec.node_name, []).append(s)
    return {
        node: events.inventory_payload(
            node, slices, labels=documents.labels.get(node, {}), sequence=sequence, observed_at=observed_at
        )
        for node, slices in sorted(by_node.items())
    }


class FileWatcher:
    def __init__(self, js: JetStreamContext, paths: Sequence[Path], *, poll_interval: float = 2.0) -> None:
        self.js = js
        self.paths = list(paths)
        self.poll_interval = poll_interval
        self.published: dict[str, str] = {}
        self._stamps: tuple[tuple[str, float], ...] = ()

    def _stamp(self) -> tuple[tuple[str, float], ...]:
        return tuple((str(p), p.stat().st_mtime if p.exists() else -1.0) for p in self.paths)

    async def publish_once(self) -> int:
        """Publish every node whose content changed and a removal for every node that went away."""
        documents = load_inventory(self.paths)
        now = time.time()
        sequence = time.time_ns()
        payloads = node_payloads(documents, sequence, now)
        published = 0
        for node, payload in payloads.items():
            digest = events.content_id(payload, "sequence", "observedAt", "observedAtUnix")
            if self.published.get(node) == digest:
                continue
            await publish_json(self.js, subjects.inventory(node), payload, msg_id=f"inventory:{node}:{digest}")
            self.published[node] = digest
            published += 1
        for node in sorted(set(self.published) - set(payloads)):
            removal = events.inventory_payload(node, [], labels={}, sequence=sequence, observed_at=now, removed=True)
            await publish_json(self.js, subjects.inventory(node), removal,
                               msg_id=f"inventory:{node}:removed:{sequence}")
            del self.published[node]
            published += 1
        return published

    async def run(self) -> None:
        await ensure_streams(self.js)
        self._stamps = self._stamp()
        await self.publish_once()
        log.info("watcher published %d node(s)", len(self.published))
        while True:
            await asyncio.sleep(self.poll_interval)
            stamps = self._stamp()
            if stamps == self._stamps:
                continue
            self._stamps = stamps
            try:
                count = await self.publish_once()
                log.info("inventory changed: republished %d node(s)", count)
            except InventoryFileError as error:
                log.error("inventory file invalid, keeping the last good fleet: %s", error)
