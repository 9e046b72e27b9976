"""The running claims and what they hold: counted in the quota book, their devices taken in the fleet's
state, and found by tenant and flavor where the preemption search looks for victims.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from typing import NamedTuple

from shared.admission.flavors import Flavors
from shared.admission.model import ClaimKey, Running, claim_key
from shared.admission.quota_book import QuotaBook
from shared.dra.allocation import FleetState
from shared.dra.inventory import Fleet, FleetDevice
from shared.dra.results import Allocation


class Victim(NamedTuple):
    """A preemptible running claim as the victim search reads it: what it scans per claim, kept."""

    running: Running
    node: str
    units: float


class Holding(NamedTuple):
    """A running claim's devices as the quota book counts them."""

    allocation: Allocation
    per_flavor: list[tuple[str | None, int, float]]  # flavor, devices, GPU units they weigh
    flavors: frozenset[str | None]
    units: float  # GPU units in all (summed in device order)


NO_VICTIMS: dict[ClaimKey, Victim] = {}  # read only


class VictimTenants:
    """Each tenant that runs preemptible claims with those claims, weight, share and the top cohort of
    its tree (its cohort, when cohorts do not nest), and (asked
    only under reclaim and fair share) the flavors it borrows."""

    def __init__(self, book: QuotaBook, victims: Mapping[str, dict[ClaimKey, Victim]]) -> None:
        self.book = book
        units, weight, tree_of, past = book.units, book.weight, book.top_of, book.past  # share() inlined: per admission
        self.tenants = [(tenant, claims, w, (units[tenant] + past.get(tenant, 0.0) if past else units[tenant]) / w,
                         tree_of(tenant)) for tenant, claims in victims.items() if claims for w in (weight(tenant),)]
        self.borrowed = book.borrowed_flavors  # kept by the book as usage moves


def allocated_devices(fleet: Fleet, allocation: Allocation) -> list[FleetDevice]:
    """The fleet's devices an allocation holds (a device the fleet no longer has is left out)."""
    by_key = fleet.by_key
    return [by_key[k] for k in allocation.keys if k in by_key]


class Holdings:
    """The running claims of one fleet, brought up to date with each snapshot in O(what changed): their
    devices taken in the fleet's state, their usage in the quota book, and the preemptible ones found
    by tenant, and by tenant and flavor held (the preemption search reads only the flavors a claim can use)."""

    def __init__(self, fleet: Fleet, placement: FleetState, book: QuotaBook, flavors: Flavors) -> None:
        self.fleet = fleet
        self.placement = placement
        self.book = book
        self.flavors = flavors
        self.running: dict[ClaimKey, Running] = {}
        self.victims: dict[str, dict[ClaimKey, Victim]] = defaultdict(dict)
        self.by_flavor: dict[str, dict[str | None, dict[ClaimKey, Victim]]] = defaultdict(lambda: defaultdict(dict))
        # priorities of preemptible running claims per tenant: what the preemption prefilter needs, kept
        # instead of scanning every running claim
        self.priorities: dict[str, Counter[int]] = defaultdict(Counter)
        self.last_order = 0  # the most recent allocated_order seen: a cycle's admissions come after it
        self.gangs: dict[tuple[str, str], dict[ClaimKey, Running]] = {}  # running gang members per tenant, gang
        self._held: set[Running] = set()  # every running claim counted here
        self._holdings: dict[ClaimKey, Holding] = {}  # per running claim (dropped with it)

    def sync(self, running: Iterable[Running]) -> None:
        """Bring what is held up to date with what runs now. Claims are compared by identity in bulk (set
        operations run in C, on identity hashes): only the claims that came, went or were rebuilt cost a
        Python step."""
        now_running = set(running)
        came = {r.key: r for r in sorted(now_running - self._held, key=claim_key)}  # a fixed order: ties follow it
        for kept in sorted(self._held - now_running, key=claim_key):
            now = came.get(kept.key)
            if now is not None and now.tenant == kept.tenant and now.allocation == kept.allocation:
                self._relabel(kept, now)  # the same devices: only its priority or order may differ
                del came[kept.key]
            else:
                self.drop(kept)
        for now in came.values():
            self.hold(now)

    def preemptible(self) -> int:
        """How many preemptible claims run."""
        return sum(sum(c.values()) for c in self.priorities.values())

    def hold(self, running: Running) -> None:
        """A claim runs: its devices are taken, its usage counted, and it is found by tenant and flavor."""
        self.placement.take(running.allocation)
        self.count(running, 1)
        self._relabel(None, running)

    def drop(self, running: Running) -> None:
        """A claim no longer runs: its devices are given back and its usage no longer counted."""
        self.placement.give_back(running.allocation)
        self.count(running, -1)
        self._held.discard(running)
        if running.preemptible:
            self.priorities[running.tenant][running.priority] -= 1
            self._unlist(running, self.holding(running))
        del self.running[running.key]
        self._holdings.pop(running.key, None)
        if running.gang is not None:
            mates = self.gangs[(running.tenant, running.gang)]
            mates.pop(running.key, None)
            if not mates:
                del self.gangs[(running.tenant, running.gang)]

    def gang_of(self, running: Running) -> list[Running]:
        """The claim and the other running members of its gang (itself alone when it has none)."""
        if running.gang is None:
            return [running]
        return [running, *(r for k, r in sorted(self.gangs[(running.tenant, running.gang)].items())
                           if k != running.key)]

    def count(self, running: Running, sign: int) -> None:
        """Count the claim's usage in the quota book (`sign` 1), or take it out (-1), and nothing else."""
        add, tenant = self.book.add, running.tenant
        for name, n, units in self.holding(running).per_flavor:
            add(tenant, name, sign * units, sign * n)

    def holding(self, running: Running) -> Holding:
        """A running claim's devices as quotas and preemption weigh them, worked out once while it runs
        (it is counted when it comes and goes, and weighed each time preemption looks at it)."""
        allocation = running.allocation
        kept = self._holdings.get(running.key)
        if kept is not None and kept.allocation is allocation:
            return kept
        per_flavor: dict[str | None, tuple[int, float]] = {}
        total = 0.0
        of = self.flavors.of
        for d in allocated_devices(self.fleet, allocation):
            flavor = of(d)
            name = flavor.name if flavor else None
            value = flavor.value if flavor else 0.0
            n, units = per_flavor.get(name, (0, 0.0))
            per_flavor[name] = (n + 1, units + value)
            total += value
        kept = self._holdings[running.key] = Holding(
            allocation, [(name, n, units) for name, (n, units) in per_flavor.items()], frozenset(per_flavor), total)
        return kept

    def _relabel(self, kept: Running | None, running: Running) -> None:
        holding = self.holding(running)
        if kept is not None:
            self._held.discard(kept)
            if kept.preemptible:
                self.priorities[kept.tenant][kept.priority] -= 1
                if not running.preemptible:
                    self._unlist(kept, holding)
        if running.allocated_order > self.last_order:
            self.last_order = running.allocated_order
        self._held.add(running)
        self.running[running.key] = running
        if kept is not None and kept.gang is not None and kept.gang != running.gang:
            self.gangs[(kept.tenant, kept.gang)].pop(kept.key, None)
        if running.gang is not None:
            self.gangs.setdefault((running.tenant, running.gang), {})[running.key] = running
        if running.preemptible:
            self.priorities[running.tenant][running.priority] += 1
            victim = Victim(running, running.allocation.node, holding.units)
            self.victims[running.tenant][running.key] = victim
            pools = self.by_flavor[running.tenant]
            for flavor in holding.flavors:
                pools[flavor][running.key] = victim

    def _unlist(self, running: Running, holding: Holding) -> None:
        """No longer a victim candidate."""
        del self.victims[running.tenant][running.key]
        pools = self.by_flavor[running.tenant]
        for flavor in holding.flavors:
            del pools[flavor][running.key]
