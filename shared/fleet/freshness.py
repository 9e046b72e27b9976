"""A node's freshness: one rule for every reader of the inventory. The allocator places nothing on a stale
node, /v1/nodes (and the page's map, which shows its `stale`) greys it, the notifier raises inventory-stale;
all three call `judge` with the same inputs, so they cannot disagree.

Last heard: the `observedAtUnix` of the node's newest inventory message, a heartbeat included (the watcher
republishes an unchanged node every heartbeat interval for this). It is the same number in every process:
the allocator and the notifier read each message, an API without the allocator reads the stream's last
message per node. A receive time would differ from process to process, and a message replayed at a start
would look new. The age is taken on the reader's clock: watchers' clocks must be within
`inventory_ttl - heartbeat_interval` of it (docs/reliability.md).

A node is stale once the TTL has passed since it was last heard (age >= TTL), lost once its removal was
heard. A node with no time (0 or None: a what-if's proposed node, a test's fleet) is never stale.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum


class Freshness(StrEnum):
    FRESH = "fresh"
    STALE = "stale"
    LOST = "lost"


@dataclass(frozen=True)
class Verdict:
    freshness: Freshness
    last_heard: float | None  # unix seconds; None: no time known
    age: float | None  # seconds since last heard, at the `now` judged; None: no time known
    reason: str  # why it is stale or lost, worded for a person; "" when fresh

    @property
    def stale(self) -> bool:
        return self.freshness is Freshness.STALE


def judge(last_heard: float | None, now: float, ttl: float, *, removed: bool = False) -> Verdict:
    """The node's freshness at `now`. The reason names when the node was last heard, not its age, so it
    reads the same from one call to the next while nothing is heard (the allocator's cycles compare it)."""
    heard = last_heard if last_heard else None
    age = None if heard is None else now - heard
    if removed:
        return Verdict(Freshness.LOST, heard, age, "removed from the fleet by its watcher")
    if heard is None or age is None or age < ttl:
        return Verdict(Freshness.FRESH, heard, age, "")
    return Verdict(Freshness.STALE, heard, age, stale_reason(heard, ttl))


def stale_reason(last_heard: float, ttl: float) -> str:
    return f"stale inventory: last heard {iso(last_heard)}, over the {ttl:g}s TTL"


def iso(unix: float) -> str:
    """A last-heard time as people and the API read it: '2026-12-06T10:00:00Z' (whole seconds)."""
    return datetime.fromtimestamp(unix, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def stale_nodes(last_heard: Mapping[str, float | None], now: float, ttl: float) -> dict[str, str]:
    """The nodes the allocator places nothing on now, each with why (what-if, and any view of the fleet)."""
    out = {}
    for node, heard in last_heard.items():
        verdict = judge(heard, now, ttl)
        if verdict.freshness is Freshness.STALE:
            out[node] = verdict.reason
    return out
