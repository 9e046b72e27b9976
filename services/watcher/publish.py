"""Publishing node inventories: content dedupe, heartbeats and removals, shared by every source.

Why heartbeats: the allocator refuses new allocations on a node whose last inventory is older than a
TTL (a silent watcher must not keep a dead node allocatable), so each node is republished at least every
`heartbeat_interval` even when nothing changed.

Message ids: `inventory:<node>:<content digest>:<time bucket>` with buckets `heartbeat_interval` long.
A republish of the same content in the same bucket (a watcher restart, a retried publish) is a JetStream
duplicate; a heartbeat is at least one interval after the last publish, so always in a new bucket and
never dropped. Content that flips back (A, B, A) inside one bucket gets a unique suffix, because dropping
the second A would leave B as the node's last message. A message JetStream answers as a duplicate (a
watcher restarted inside the bucket its predecessor published in, a retried publish) leaves the earlier one
as the node's last, and every reader judges the node's freshness by that one (shared/fleet/freshness.py):
with the same content, the next heartbeat is due an interval after the earlier one's time, not after now
(else the stream's last word could grow two intervals old); with other content (it flipped before the
restart), the message goes again under an id of its own.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nats.js import JetStreamContext

from services.bus.connection import BUS_ERRORS
from services.bus.publish import publish_json
from services.bus.streams import DUPLICATE_WINDOW_S
from services.runtime import metrics
from services.runtime.outage import Outage
from shared.contract import events, subjects
from shared.dra import model as dra

log = logging.getLogger("claimbroker.watcher")

VOLATILE = ("sequence", "observedAt", "observedAtUnix")


@dataclass
class _Published:
    digest: str
    at: float
    payload: dict[str, Any]


class InventoryPublisher:
    def __init__(self, js: JetStreamContext, *, heartbeat_interval: float = 30.0,
                 clock: Callable[[], float] = time.time) -> None:
        if heartbeat_interval <= 0:
            raise ValueError("heartbeat_interval must be positive")
        self.js = js
        self.heartbeat_interval = heartbeat_interval
        self.clock = clock
        self.state: dict[str, _Published] = {}
        self._ids: dict[str, dict[str, float]] = {}  # per node: message ids used inside the duplicate window
        self._last_sequence = 0
        self._refused: set[str] = set()  # node names Kubernetes would refuse, said once each
        self._lock = asyncio.Lock()  # sources publish from several tasks; one node's messages stay ordered

    def nodes(self) -> set[str]:
        return set(self.state)

    def _sequence(self, now: float) -> int:
        """Nanosecond wall time, but strictly increasing even if the clock steps back."""
        self._last_sequence = max(int(now * 1e9), self._last_sequence + 1)
        return self._last_sequence

    async def publish(self, node: str, slices: Sequence[dra.ResourceSlice], *, labels: Mapping[str, str],
                      telemetry: Mapping[str, Any] | None = None) -> bool:
        """Publish the node's full inventory unless the same content went out less than an interval ago. A
        node name Kubernetes would refuse is not published: said once, as an error (a dotted one is fine:
        its subject writes the '.' as '_')."""
        if not dra.is_dns_subdomain(node):
            if node not in self._refused:
                self._refused.add(node)
                log.error("node %s: the name %s, as Kubernetes requires of a node's name: its inventory is not "
                          "published", dra.shown(node), dra.DNS_SUBDOMAIN_RULE)
            return False
        async with self._lock:
            now = self.clock()
            payload = events.inventory_payload(node, slices, labels=labels, telemetry=telemetry,
                                               sequence=self._sequence(now), observed_at=now)
            digest = events.content_id(payload, *VOLATILE)
            last = self.state.get(node)
            if last is not None and last.digest == digest and now - last.at < self.heartbeat_interval:
                return False
            await self._send(node, payload, digest, now)
            return True

    async def heartbeat(self) -> int:
        """Republish, with fresh sequence and time, every node whose last message is an interval old."""
        async with self._lock:
            now = self.clock()
            count = 0
            for node, last in sorted(self.state.items()):
                if now - last.at < self.heartbeat_interval:
                    continue
                payload = {**last.payload, "sequence": self._sequence(now), "observedAt": events.now_iso(now),
                           "observedAtUnix": now}
                await self._send(node, payload, last.digest, now)
                count += 1
            return count

    async def remove(self, node: str) -> bool:
        """`removed: true` for a node that was published and is gone; nothing for one never published."""
        async with self._lock:
            if node not in self.state:
                return False
            now = self.clock()
            sequence = self._sequence(now)
            removal = events.inventory_payload(node, [], labels={}, sequence=sequence, observed_at=now, removed=True)
            await publish_json(self.js, subjects.inventory(node), removal,
                               msg_id=f"inventory:{node}:removed:{sequence}")
            del self.state[node]
            return True

    def due_in(self) -> float:
        """Seconds until the next node needs a heartbeat (the interval when nothing is published)."""
        now = self.clock()
        waits = [last.at + self.heartbeat_interval - now for last in self.state.values()]
        return max(0.0, min(waits, default=self.heartbeat_interval))

    async def _send(self, node: str, payload: dict[str, Any], digest: str, now: float) -> None:
        ids = {i: t for i, t in self._ids.get(node, {}).items() if now - t < DUPLICATE_WINDOW_S}
        msg_id = f"inventory:{node}:{digest}:{int(now // self.heartbeat_interval)}"
        if msg_id in ids:  # content flipped back inside one bucket, or the node came back after a removal
            msg_id = f"{msg_id}:{payload['sequence']}"
        ack = await publish_json(self.js, subjects.inventory(node), payload, msg_id=msg_id)
        ids[msg_id] = now
        heard_at = now
        if getattr(ack, "duplicate", False):
            kept = await self._kept(node)
            if kept is not None and events.content_id(kept, *VOLATILE) == digest:
                stored = kept.get("observedAtUnix")
                heard_at = min(now, float(stored)) if isinstance(stored, int | float) else now
            else:
                msg_id = f"{msg_id}:{payload['sequence']}"
                await publish_json(self.js, subjects.inventory(node), payload, msg_id=msg_id)
                ids[msg_id] = now
        metrics.INVENTORY_PUBLISHED.inc()
        self._ids[node] = ids
        self.state[node] = _Published(digest, heard_at, payload)

    async def _kept(self, node: str) -> dict[str, Any] | None:
        """The node's last message on the stream (None when it cannot be read: then ours goes again)."""
        try:
            message = await self.js.get_last_msg(subjects.INVENTORY_STREAM, subjects.inventory(node))
            kept = json.loads(message.data or b"{}")
        except (*BUS_ERRORS, ValueError) as error:  # none kept, NATS away, not JSON: publishing again is safe
            log.debug("last inventory of %s not read (%s); publishing it again", node, type(error).__name__)
            return None
        return kept if isinstance(kept, dict) else None


async def heartbeat_loop(publisher: InventoryPublisher, *, floor: float = 0.05) -> None:
    """For sources that publish on events (Kubernetes, NVML polls): keep every node fresh in between; while
    NATS is away, try again with backoff."""
    nats = Outage("NATS", log)
    while True:
        await asyncio.sleep(nats.wait if nats.since is not None else max(floor, publisher.due_in()))
        try:
            await publisher.heartbeat()
        except Exception as error:  # the heartbeat loop's guard: NATS restarting or gone, it beats on
            await nats.failed(error)
        else:
            nats.ok()
