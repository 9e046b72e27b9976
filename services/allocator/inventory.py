"""The fleet as the allocator knows it from the inventory stream: each node's last inventory, which nodes
were lost (removed while they held claims), which are stale (not heard within the inventory TTL: no new
allocation goes there), and whether the fleet changed since the last cycle."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass

import orjson

from shared.contract import events
from shared.contract.messages import NodeInventory
from shared.dra import model as dra
from shared.dra.inventory import Fleet
from shared.fleet.freshness import judge

log = logging.getLogger("claimbroker.allocator")


@dataclass(frozen=True)
class Heard:
    """A node's last inventory: its sequence, when it was observed (0 once removed), and a digest of its
    content (slices, labels, telemetry), which tells a heartbeat from a change without parsing it."""

    sequence: int
    at: float
    content: bytes


class Inventory:
    """The fleet the cycles decide on. `changed` is set when a cycle is due for it (a node changed, came
    back, or was lost); `lost_nodes` are the removed nodes whose claims a cycle has yet to send back."""

    def __init__(self, ttl: float, clock: Callable[[], float]) -> None:
        self.ttl = ttl
        self.clock = clock
        self.fleet = Fleet()
        self.lost_nodes: set[str] = set()
        self.heard: dict[str, Heard] = {}  # per node: its last inventory
        self.changed = asyncio.Event()
        self.seen = asyncio.Event()  # an inventory was read: the allocator can decide

    async def on_inventory(self, inventory: NodeInventory) -> None:
        """One node's inventory, from the app's typed subscriber (an ordered consumer: no acks)."""
        heard = self.heard.get(inventory.node)
        if heard is not None and inventory.sequence and heard.sequence > inventory.sequence:
            return  # an older snapshot arriving late
        content = fingerprint(inventory)
        if heard is not None and heard.content == content and not inventory.removed:
            # A heartbeat: the node is alive and unchanged. It is not parsed again, and the fleet stays the
            # same object, so the cycle's indexes stay valid (500 nodes' heartbeats at once stalled cycles);
            # when it was last heard lives here, beside the fleet (a fleet node's observed_at is when its
            # content was last read, not when the node was last heard).
            self.heard[inventory.node] = Heard(inventory.sequence, inventory.observedAtUnix, content)
            if judge(heard.at, self.clock(), self.ttl).stale:
                self.changed.set()  # it was stale: waiting claims may go there again
            return
        try:
            node = events.read_inventory(inventory.model_dump())
        except (ValueError, dra.DocumentError) as error:
            log.warning("ignoring invalid inventory of node %s: %s", inventory.node, error)
            return
        self.heard[node.node] = Heard(node.sequence, 0.0 if node.removed else node.observed_at, content)
        self.seen.set()
        if node.removed and node.node in self.fleet.nodes:
            self.lost_nodes.add(node.node)
        elif not node.removed:
            self.lost_nodes.discard(node.node)
        self.fleet = self.fleet.with_node(node)
        self.changed.set()

    def unusable_nodes(self) -> dict[str, str]:
        """Stale nodes (shared/fleet/freshness.py) get no new allocation. The reason names when the node was
        last heard, not its age: it stays the same from cycle to cycle, so the decision core keeps its
        state instead of rebuilding it for a new text."""
        now, heard, ttl = self.clock(), self.heard, self.ttl
        # judged only where it may be stale (heard, and at least `ttl` ago): the others are fresh, as judge
        # says of a node never heard or heard within the TTL (500 judgements each cycle cost 1.5 % under churn)
        return {name: verdict.reason for name in self.fleet.nodes
                if (h := heard.get(name)) is not None and h.at and now - h.at >= ttl
                and (verdict := judge(h.at, now, ttl)).stale}

    def last_heard(self) -> dict[str, float]:
        """When each node of the fleet was last heard (any inventory message, heartbeats included): what
        /v1/nodes judges freshness by when the API runs in this process (shared/fleet/freshness.py)."""
        return {name: heard.at for name, heard in self.heard.items() if name in self.fleet.nodes}

    async def wait_for_inventory(self, timeout: float) -> bool:
        try:
            await asyncio.wait_for(self.seen.wait(), timeout)
        except TimeoutError:
            return False
        return True


def fingerprint(inventory: NodeInventory) -> bytes:
    parts = [inventory.removed, inventory.slices, inventory.labels, inventory.telemetry]
    try:
        content = orjson.dumps(parts, option=orjson.OPT_SORT_KEYS)
    except (orjson.JSONEncodeError, TypeError):  # an integer beyond 64 bits
        content = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.blake2b(content, digest_size=16).digest()
