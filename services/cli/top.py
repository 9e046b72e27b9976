"""`claimbroker top`: a live terminal view of the fleet per flavor (GPU generation, MIG profile) and tenant.

Gathering and drawing are apart: `Gatherer` reads the admin API (usage with the whole Pending queue's
demand per tenant and flavor, and the queue's head with the flavors each of its claims would take) and the
NATS inventory stream (devices per flavor) into a `Snapshot`; `render` is a pure function of that snapshot,
so a frame can be tested without a stack.
`run` redraws when a status or inventory message arrives (at most `MAX_REDRAWS_PER_SECOND`) and at least
every `interval` seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import Counter
from collections.abc import Callable, Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
from nats.js.api import DeliverPolicy
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from services.bus.connection import BUS_ERRORS, connect
from shared.admission.flavors import Flavors
from shared.admission.quota import Flavor, QuotaConfig
from shared.contract import subjects
from shared.contract.events import read_inventory
from shared.dra.inventory import NodeInventory
from shared.dra.matching import SelectorMemo
from shared.fleet.freshness import stale_nodes

MAX_REDRAWS_PER_SECOND = 4
QUEUE_HEAD = 10  # pending claims listed with their reasons and flavors (one explain call each, cached)
NO_FLAVOR = "-"  # devices no flavor accepts, or pending claims whose flavors are not known yet


@dataclass(frozen=True)
class FlavorLine:
    name: str
    total: int  # devices the inventory publishes of this flavor
    used: int  # allocated devices of this flavor, all tenants
    pending: int  # devices Pending claims ask for, each claim at the cheapest flavor it accepts

    @property
    def free(self) -> int:
        return max(0, self.total - self.used)


@dataclass(frozen=True)
class TenantLine:
    tenant: str
    flavor: str
    used: int
    nominal: int
    borrowed: int
    pending: int


@dataclass(frozen=True)
class Waiting:
    tenant: str
    name: str
    reason: str
    flavors: tuple[str, ...] = ()


@dataclass(frozen=True)
class Snapshot:
    """One frame's numbers; everything `render` shows."""

    flavors: Sequence[FlavorLine]
    tenants: Sequence[TenantLine]
    queue: Sequence[Waiting]  # the head of the Pending queue, oldest first
    pending_claims: int = 0  # all Pending claims (the queue may show only its head)
    pending_devices: int = 0
    enforced: bool = False
    at: float = 0.0
    problems: Sequence[str] = field(default_factory=tuple)  # what could not be read this time
    stale: Sequence[str] = field(default_factory=tuple)  # nodes not heard of within the TTL: not counted


def render(snapshot: Snapshot) -> RenderableType:
    """The frame: fleet per flavor, tenants per flavor, the head of the Pending queue."""
    fleet = Table(title="fleet by flavor", title_justify="left")
    for column in ("FLAVOR", "TOTAL", "USED", "FREE", "PENDING"):
        fleet.add_column(column, justify="left" if column == "FLAVOR" else "right")
    for f in snapshot.flavors:
        fleet.add_row(f.name, str(f.total), str(f.used), Text(str(f.free), style="green" if f.free else "red"),
                      str(f.pending))
    tenants = Table(title="tenants", title_justify="left")
    for column in ("TENANT", "FLAVOR", "USED/NOMINAL", "BORROWED", "PENDING"):
        tenants.add_column(column, justify="left" if column in ("TENANT", "FLAVOR") else "right")
    for t in snapshot.tenants:
        tenants.add_row(t.tenant, t.flavor, f"{t.used}/{t.nominal}" if snapshot.enforced else str(t.used),
                        Text(str(t.borrowed), style="yellow" if t.borrowed else ""), str(t.pending))
    summary = Text(f"pending queue: {snapshot.pending_claims} claim(s), {snapshot.pending_devices} device(s)"
                   + (f", the first {len(snapshot.queue)}:" if snapshot.queue else ""), style="italic")
    queue = Table()
    for column in ("TENANT", "CLAIM", "FLAVORS", "REASON"):
        queue.add_column(column, overflow="fold")
    for w in snapshot.queue:
        queue.add_row(w.tenant, w.name, ", ".join(w.flavors) or NO_FLAVOR, w.reason)
    stamp = time.strftime("%H:%M:%S", time.localtime(snapshot.at)) if snapshot.at else ""
    header = Text(f"claimbroker top  {stamp}" + ("" if snapshot.enforced else "  (no quota set: the fleet is open)"),
                  style="bold")
    parts: list[RenderableType] = [header, fleet, tenants, summary, queue]
    if snapshot.stale:
        more = len(snapshot.stale) - 8
        shown = ", ".join(snapshot.stale[:8]) + (f" and {more} more" if more > 0 else "")
        parts.append(Text(f"not counted: {len(snapshot.stale)} node(s) with stale inventory, where nothing is "
                          f"placed ({shown})", style="yellow"))
    parts += [Text(problem, style="red") for problem in snapshot.problems]
    return Group(*parts)


def count_devices(inventories: Iterable[NodeInventory], flavors: Flavors, skip: Container[str] = ()
                  ) -> Counter[str]:
    """Devices per flavor name (NO_FLAVOR for those no flavor accepts), but for the nodes in `skip`. A driver
    that publishes a GPU and its MIG partitions both (with shared counters) has both counted, each under its
    own flavor."""
    counts: Counter[str] = Counter()
    for inventory in inventories:
        if inventory.removed or inventory.node in skip:
            continue
        for device in inventory.devices:
            counts[flavors.name_of(device) or NO_FLAVOR] += 1
    return counts


def snapshot_of(usage: Mapping[str, Any], head: Sequence[Mapping[str, Any]],
                claim_flavors: Mapping[tuple[str, str], Sequence[str]], devices: Mapping[str, int],
                order: Sequence[str] = (), at: float = 0.0, problems: Sequence[str] = ()) -> Snapshot:
    """Combine the API's answers: `usage` is GET /v1/usage (its rows count the devices the whole Pending
    queue asks for, each claim at the cheapest flavor its requests accept), `head` the oldest Pending
    claims, `claim_flavors` what each of those accepts, `devices` the inventory's count per flavor; flavors
    are listed in `order` (the flavors' effective order), others after, by name. Devices of claims the
    allocator has not explained yet, or that no flavor accepts, count under NO_FLAVOR."""
    used: Counter[str] = Counter()
    flavor_pending: Counter[str] = Counter()
    tenant_pending: Counter[tuple[str, str]] = Counter()
    placed: Counter[str] = Counter()  # a tenant's pending devices that have a flavor
    for row in usage.get("items", []):
        flavor = row["flavor"] or NO_FLAVOR
        used[flavor] += int(row["used"])
        wanted = int(row.get("pending") or 0)
        flavor_pending[flavor] += wanted
        tenant_pending[(row["tenant"], flavor)] += wanted
        placed[row["tenant"]] += wanted
    for demand in usage.get("pending", []):
        unplaced = int(demand["devices"]) - placed[demand["tenant"]]
        if unplaced > 0:
            flavor_pending[NO_FLAVOR] += unplaced
            tenant_pending[(demand["tenant"], NO_FLAVOR)] += unplaced
    queue = [Waiting(c["namespace"], c["name"], c.get("reason") or "",
                     tuple(claim_flavors.get((c["namespace"], c["name"]), ()))) for c in head[:QUEUE_HEAD]]
    names = set(devices) | set(used) | {n for n, count in flavor_pending.items() if count}
    rank = {name: i for i, name in enumerate(order)}
    ordered = sorted(names, key=lambda n: (n == NO_FLAVOR, rank.get(n, len(rank)), n))
    flavors = [FlavorLine(n, int(devices.get(n, 0)), used[n], flavor_pending[n]) for n in ordered]
    tenants: dict[tuple[str, str], TenantLine] = {}
    for row in usage.get("items", []):
        key = (row["tenant"], row["flavor"] or NO_FLAVOR)
        tenants[key] = TenantLine(key[0], key[1], int(row["used"]), int(row["nominal"]), int(row["borrowed"]),
                                  tenant_pending[key])
    for key, count in tenant_pending.items():
        if key not in tenants and count:
            tenants[key] = TenantLine(key[0], key[1], 0, 0, 0, count)
    return Snapshot(
        flavors=flavors,
        tenants=sorted(tenants.values(), key=lambda t: (t.tenant, t.flavor == NO_FLAVOR, rank.get(t.flavor, 0),
                                                        t.flavor)),
        queue=queue,
        pending_claims=sum(int(p["claims"]) for p in usage.get("pending", [])),
        pending_devices=sum(int(p["devices"]) for p in usage.get("pending", [])),
        enforced=bool(usage.get("enforced")),
        at=at,
        problems=tuple(problems),
    )


class Gatherer:
    """Reads the admin API and keeps the newest inventory of every node from the inventory stream; `changed`
    is set whenever a status or inventory message arrives."""

    def __init__(self, api: str, headers: Mapping[str, str], nats_url: str | None,
                 tls_ca: Path | None = None, ttl: float = float("inf")) -> None:
        self.ttl = ttl  # the inventory TTL: nodes not heard of for longer are not counted
        self.client = httpx.AsyncClient(base_url=api.rstrip("/"), headers=dict(headers), timeout=10,
                                        verify=str(tls_ca) if tls_ca is not None else True)
        self.nats_url, self.tls_ca = nats_url, tls_ca
        self.inventories: dict[str, NodeInventory] = {}
        self.changed = asyncio.Event()
        self._loaded = asyncio.Event()
        self._nc: Any = None
        self._explained: dict[tuple[str, str, str], tuple[str, ...]] = {}  # (ns, name, updatedAt) -> flavors
        self._problems: list[str] = []

    async def start(self, load_timeout: float = 10.0) -> None:
        """Subscribe to inventory (last message per node, then every update) and statuses; wait until the
        stored inventory is read, so the first frame counts the whole fleet."""
        if not self.nats_url:
            self._loaded.set()
            return
        try:
            self._nc = await asyncio.wait_for(connect(self.nats_url, name="claimbroker-top", tls_ca=self.tls_ca),
                                              load_timeout)
            js = self._nc.jetstream()
            info = await js.stream_info(subjects.INVENTORY_STREAM)
            if not info.state.messages:
                self._loaded.set()
            await js.subscribe(subjects.INVENTORY_ALL, ordered_consumer=True,
                               deliver_policy=DeliverPolicy.LAST_PER_SUBJECT, cb=self._on_inventory)
            await self._nc.subscribe(subjects.STATUS_ALL, cb=self._on_status)
            await asyncio.wait_for(self._loaded.wait(), load_timeout)
        except BUS_ERRORS as error:  # the API's numbers are still worth showing
            from shared.contract.bus_auth import redact

            why = f"no answer within {load_timeout:g}s" if isinstance(error, TimeoutError) else repr(error)
            self._problems.append(f"cannot read the inventory from NATS at {redact(self.nats_url)}: {why}")

    async def _on_inventory(self, message: Any) -> None:
        try:
            inventory = read_inventory(json.loads(message.data))
            self.inventories[inventory.node] = inventory
        except (ValueError, TypeError, AttributeError) as error:  # not JSON, or no inventory (a field wrong)
            self._problems.append(f"{message.subject}: {error}")
        if message.metadata.num_pending == 0:
            self._loaded.set()
        self.changed.set()

    async def _on_status(self, message: Any) -> None:
        self.changed.set()

    async def close(self) -> None:
        await self.client.aclose()
        if self._nc is not None:
            with contextlib.suppress(*BUS_ERRORS):
                await self._nc.close()

    async def _get(self, path: str, **params: Any) -> Any:
        response = await self.client.get(path, params=params)
        response.raise_for_status()
        return response.json()

    async def _flavors_of(self, claim: Mapping[str, Any]) -> tuple[str, ...]:
        key = (claim["namespace"], claim["name"], str(claim.get("updatedAt")))
        if key not in self._explained:
            try:
                found = await self._get(f"/v1/claims/{key[0]}/{key[1]}/explain")
                self._explained[key] = tuple((found.get("explain") or {}).get("flavors") or ())
            except httpx.HTTPError:
                return ()
        return self._explained[key]

    async def snapshot(self) -> Snapshot:
        problems, self._problems = self._problems, []
        try:
            usage = await self._get("/v1/usage")
            pending = (await self._get("/v1/claims", state="Pending", limit=QUEUE_HEAD))["items"]
        except (httpx.HTTPError, ValueError) as error:
            detail = (f"{error.response.status_code} {error.response.text}" if isinstance(error, httpx.HTTPStatusError)
                      else f"cannot reach the admin API at {self.client.base_url}: {error or type(error).__name__}")
            return Snapshot((), (), (), at=time.time(), problems=(*problems, f"admin API: {detail}"))
        try:
            config = [Flavor(f["name"], f["selector"], f["value"]) for f in await self._get("/v1/flavors")]
        except (httpx.HTTPError, ValueError):
            config = list(QuotaConfig().flavors)
        found = await asyncio.gather(*(self._flavors_of(c) for c in pending))
        claim_flavors = {(c["namespace"], c["name"]): f for c, f in zip(pending, found, strict=False)}
        live = {k: v for k, v in self._explained.items() if (k[0], k[1]) in claim_flavors}
        self._explained = live  # forget claims that left the queue
        now = time.time()  # a node's last message on the bus is its last heartbeat: stale ones take nothing
        stale = stale_nodes({n: i.observed_at for n, i in self.inventories.items() if not i.removed}, now, self.ttl)
        devices = count_devices(list(self.inventories.values()), Flavors(config, SelectorMemo()), stale)
        frame = snapshot_of(usage, pending, claim_flavors, devices, [f.name for f in config], now, problems)
        return replace(frame, stale=tuple(sorted(stale)))


class Unavailable(Exception):
    """`top --once` could not read what a frame shows (the admin API, or the inventory from NATS)."""


async def run(api: str, headers: Mapping[str, str], nats_url: str | None, *, console: Console,
              once: bool = False, interval: float = 5.0, tls_ca: Path | None = None,
              emit: Callable[[Snapshot], None] | None = None, ttl: float = float("inf")) -> None:
    """One frame with `once` (given to `emit` when set: `-o json`), else a live view until cancelled
    (Ctrl-C). `tls_ca`: the CA to trust for the admin API and NATS."""
    from rich.live import Live

    gatherer = Gatherer(api, headers, nats_url, tls_ca, ttl)
    try:
        await gatherer.start(load_timeout=5.0)
        if once:
            frame = await gatherer.snapshot()
            if frame.problems:  # a frame without the fleet or the API's numbers would read as an empty fleet
                raise Unavailable("; ".join(frame.problems))
            if emit is not None:
                emit(frame)
            else:
                console.print(render(frame))
            return
        with Live(render(await gatherer.snapshot()), console=console, auto_refresh=False, screen=False) as live:
            while True:
                drawn = time.monotonic()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(gatherer.changed.wait(), interval)
                # debounce: a burst of events gives one redraw, at most MAX_REDRAWS_PER_SECOND
                await asyncio.sleep(max(0.0, drawn + 1 / MAX_REDRAWS_PER_SECOND - time.monotonic()))
                gatherer.changed.clear()
                live.update(render(await gatherer.snapshot()), refresh=True)
    finally:
        await gatherer.close()
