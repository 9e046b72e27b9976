"""Inventory from files: topology documents and ResourceSlices, republished when a file changes and
at least every heartbeat interval (see publish.py for why)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import watchfiles
from nats.js import JetStreamContext

from services.bus.streams import ensure_streams
from services.runtime.outage import Outage, until_done
from services.watcher.publish import InventoryPublisher
from shared.contract import events
from shared.dra import model as dra
from shared.fleet.sources import InventoryDocuments, InventoryFileError, load_inventory

log = logging.getLogger("claimbroker.watcher")


def slices_by_node(documents: InventoryDocuments) -> dict[str, list[dra.ResourceSlice]]:
    """Node-local slices grouped per node; nodes without GPUs have none and publish nothing."""
    by_node: dict[str, list[dra.ResourceSlice]] = {}
    for s in documents.slices:
        if s.spec.node_name:
            by_node.setdefault(s.spec.node_name, []).append(s)
    return dict(sorted(by_node.items()))


def node_payloads(documents: InventoryDocuments, sequence: int, observed_at: float) -> dict[str, dict[str, Any]]:
    """One full inventory per node, as the watcher would publish it (for callers that want the payloads)."""
    return {
        node: events.inventory_payload(
            node, slices, labels=documents.labels.get(node, {}), sequence=sequence, observed_at=observed_at
        )
        for node, slices in slices_by_node(documents).items()
    }


class FileWatcher:
    def __init__(self, js: JetStreamContext, paths: Sequence[Path], *, poll_interval: float = 2.0,
                 heartbeat_interval: float = 30.0, clock: Callable[[], float] = time.time) -> None:
        self.js = js
        self.paths = list(paths)
        self.poll_interval = poll_interval
        self.publisher = InventoryPublisher(js, heartbeat_interval=heartbeat_interval, clock=clock)
        self._stamps: tuple[tuple[str, float], ...] = ()

    @property
    def published(self) -> set[str]:
        return self.publisher.nodes()

    def _stamp(self) -> tuple[tuple[str, float], ...]:
        return tuple((str(p), p.stat().st_mtime if p.exists() else -1.0) for p in self.paths)

    async def publish_once(self) -> int:
        """Publish every node whose content changed or whose heartbeat is due, and a removal for every
        node that went away; an unchanged node inside the interval is skipped."""
        documents = load_inventory(self.paths)
        by_node = slices_by_node(documents)
        published = 0
        for node, slices in by_node.items():
            published += await self.publisher.publish(node, slices, labels=documents.labels.get(node, {}))
        for node in sorted(self.publisher.nodes() - set(by_node)):
            published += await self.publisher.remove(node)
        return published

    async def run(self) -> None:
        """Publish the files' fleet, then republish on each change and keep every node fresh. An invalid
        file at start stops the watcher (there is no good fleet to keep); NATS away only pauses it.

        Changes come as file system events (watchfiles: inotify, so an edit is published within a fraction
        of a second, not at the next poll) on the files' folders (editors and Kubernetes' ConfigMap mounts
        replace a file rather than write it); at least every poll interval it wakes anyway, for heartbeats."""
        nats = Outage("NATS", log)
        await until_done(lambda: ensure_streams(self.js), nats)
        self._stamps = self._stamp()
        await until_done(self.publish_once, nats, fatal=(InventoryFileError,))
        log.info("watcher published %d node(s)", len(self.published))
        folders = sorted({p.resolve().parent for p in self.paths} | {p.absolute().parent for p in self.paths})
        # Only the files wake it (and the `..data` link Kubernetes' ConfigMap mounts swap): their folder may
        # also hold files that change all the time, such as the log `up ... 2> up.log` writes.
        watched = {str(p.resolve()) for p in self.paths} | {str(p.absolute()) for p in self.paths}
        changes = watchfiles.awatch(*folders, debounce=50, rust_timeout=int(self.poll_interval * 1000),
                                    yield_on_timeout=True, recursive=False, ignore_permission_denied=True,
                                    watch_filter=lambda _change, path: path in watched or "/.." in path)
        woken = asyncio.ensure_future(anext(changes))
        await asyncio.sleep(0)  # the generator's first step sets the watch up; from here no edit is missed
        try:
            while True:
                await self._pass(nats)  # the first catches what changed before the watch was set up
                await woken
                woken = asyncio.ensure_future(anext(changes))
                if nats.since is not None:
                    await asyncio.sleep(nats.wait)
        finally:  # the watch stops within its step (50 ms) of the cancel
            woken.cancel()
            with contextlib.suppress(BaseException):
                await woken
            await changes.aclose()

    async def _pass(self, nats: Outage) -> None:
        try:
            await self._publish_changes()
        except Exception as error:  # the watch loop's guard: NATS restarting or gone, the next pass tries again
            await nats.failed(error)
        else:
            nats.ok()

    async def _publish_changes(self) -> None:
        stamps = self._stamp()
        if stamps == self._stamps:
            await self.publisher.heartbeat()
            return
        try:
            count = await self.publish_once()
            log.info("inventory changed: republished %d node(s)", count)
        except InventoryFileError as error:
            log.error("inventory file invalid, keeping the last good fleet: %s", error)
            await self.publisher.heartbeat()  # the last good fleet is still the truth; keep it fresh
        self._stamps = stamps  # only once published: a pass that failed on NATS publishes the change again
