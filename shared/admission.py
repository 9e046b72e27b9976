"""One admission cycle: quotas per flavor, fair-share order, preemption that cannot loop, explanations.

A pure function over an immutable snapshot (the fleet, the quotas, what runs, what waits); the
allocator service and `claimbroker simulate --quotas` run the same code.

- Flavors: every device counts against the first flavor whose selector accepts it (shared/quota.py).
- Quotas (Kueue's arithmetic, flat cohorts): a tenant may use its nominal quota of a flavor; beyond it
  it borrows what its cohort lends (each member lends its unused nominal up to its lendingLimit) and
  the flavor's free capacity (devices no tenant's nominal covers), within its borrowingLimit. With no
  quota anywhere the fleet is open.
- Order: tenants by share (GPU units in use over weight, lowest first), then priority, then arrival.
  Every waiting claim is tried once per cycle, so a deep queue never stalls admission; a claim whose
  kind already failed at this fleet version fails again at once.
- Placement within nominal first: devices of flavors where the tenant has nominal headroom, then
  flavors it may borrow.
- Preemption, only of preemptible claims, by three rules: (a) priority within a tenant, (b) reclaim: a
  tenant that stays within its nominal takes back devices another tenant of its cohort borrows, (c)
  fair share: a tenant preempts a borrowing tenant only while its share afterwards stays at or below
  the victim's share afterwards. (b) and (c) only take from borrowers and (c) compares shares after
  the move; and a claim never preempts one that preempted it (`displaced_by`), so no pair of claims
  is preempted back and forth, whatever else changes between cycles. Claims admitted in a cycle are
  not preempted in the same cycle. The victim set is the
  smallest that lets the claim in: fewest GPU units, then lowest priority, then most recently
  allocated, and no victim the claim does not need.
"""

from __future__ import annotations

import heapq
import itertools
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from shared import dra
from shared.allocation import Allocation, Decision, DeviceFilter, DeviceKey, FleetState, Rejected, State
from shared.cel import CompiledSelector, SelectorError, compile_selector
from shared.inventory import Fleet, FleetDevice
from shared.matching import SelectorMemo
from shared.quota import Flavor, QuotaConfig

ClaimKey = tuple[str, str]  # tenant, name
MAX_PREEMPTION_NODES = 8  # nodes tried per preempting claim, most promising first
MAX_PREEMPTION_ATTEMPTS = 8  # waiting claims that search for victims per cycle, in fair-share order


@dataclass(frozen=True)
class Running:
    tenant: str
    name: str
    allocation: Allocation
    priority: int = 0
    preemptible: bool = True
    arrival: int = 0
    allocated_order: int = 0  # larger: allocated more recently

    @property
    def key(self) -> ClaimKey:
        return (self.tenant, self.name)


@dataclass(frozen=True)
class Waiting:
    tenant: str
    name: str
    claim: dra.ResourceClaim
    priority: int = 0
    preemptible: bool = True
    arrival: int = 0
    answered: bool = False  # it has a Pending answer already: a full fleet need not decide it again
    displaced_by: frozenset[ClaimKey] = frozenset()  # claims that preempted it: it never takes them back

    @property
    def key(self) -> ClaimKey:
        return (self.tenant, self.name)


@dataclass(frozen=True)
class Snapshot:
    fleet: Fleet
    classes: Mapping[str, dra.DeviceClass]
    quotas: QuotaConfig
    running: tuple[Running, ...] = ()
    waiting: tuple[Waiting, ...] = ()
    unusable_nodes: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Preemption:
    victim: ClaimKey
    by: ClaimKey
    rule: str  # "priority" | "reclaim" | "fair-share"
    reason: str


@dataclass(frozen=True)
class ClaimDecision:
    tenant: str
    name: str
    decision: Decision
    explain: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class CycleResult:
    decisions: tuple[ClaimDecision, ...]  # one per waiting claim, in the order they were decided
    preemptions: tuple[Preemption, ...]
    flavors: Mapping[DeviceKey, tuple[str | None, float]]  # devices allocated in this cycle: flavor and units


class Flavors:
    """Which flavor a device counts against, memoised per kind of device (the selectors are CEL)."""

    def __init__(self, flavors: Sequence[Flavor], memo: SelectorMemo) -> None:
        self.memo = memo
        self.compiled: list[tuple[Flavor, CompiledSelector]] = []
        for flavor in flavors:
            try:
                self.compiled.append((flavor, compile_selector(flavor.selector)))
            except SelectorError:
                continue  # the admin API refuses such flavors; an old one never matches
        self._by_profile: dict[int, Flavor | None] = {}

    def of(self, device: FleetDevice) -> Flavor | None:
        found = self._by_profile.get(device.profile_id, False)
        if found is False:
            found = None
            for flavor, selector in self.compiled:
                try:
                    if self.memo.matches(selector, device):
                        found = flavor
                        break
                except SelectorError:
                    continue
            self._by_profile[device.profile_id] = found
        return found  # type: ignore[return-value]

    def name_of(self, device: FleetDevice) -> str | None:
        flavor = self.of(device)
        return flavor.name if flavor else None

    def units_of(self, device: FleetDevice) -> float:
        flavor = self.of(device)
        return flavor.value if flavor else 0.0


@dataclass(frozen=True)
class Block:
    """One quota that keeps a claim out, with the numbers behind it."""

    flavor: str
    requested: int
    nominal: int
    used: int
    borrowing_limit: int | None
    lendable: int  # what the cohort and the free capacity still lend
    borrowed_by: Mapping[str, int]  # who borrows this flavor in the tenant's cohort
    why: str

    def to_json(self) -> dict[str, Any]:
        return {"flavor": self.flavor, "requested": self.requested, "nominal": self.nominal, "used": self.used,
                "borrowingLimit": self.borrowing_limit, "lendable": self.lendable,
                "borrowedBy": dict(self.borrowed_by), "why": self.why}


class QuotaBook:
    """Usage per tenant and flavor against the quotas, kept up to date incrementally as the cycle admits
    and preempts, so asking what a cohort still lends costs O(1)."""

    def __init__(self, config: QuotaConfig, capacity: Mapping[str, int]) -> None:
        self.config = config
        self.capacity = capacity  # devices per flavor in the fleet
        self.used: dict[tuple[str, str], int] = defaultdict(int)
        self.units: dict[str, float] = defaultdict(float)
        self.members: dict[str, list[str]] = defaultdict(list)
        self.keep: dict[tuple[str, str], int] = {}  # nominal a tenant never lends
        self.lends: dict[tuple[str, str], int] = defaultdict(int)  # per cohort and flavor
        self.spill: dict[tuple[str, str], int] = defaultdict(int)  # members' use beyond what they keep
        self.over: dict[str, int] = defaultdict(int)  # cohorts' spill beyond what they lend: free capacity used
        self.covered: dict[str, int] = defaultdict(int)  # nominal quota per flavor over all tenants
        self.version = 0  # bumped on every change of usage: answers cached per version stay true
        self.cohort_versions: dict[str, int] = defaultdict(int)  # per cohort: its members' usage changed
        self.free_version = 0  # the free capacity some cohort spilled into changed
        for tenant in config.tenants.values():
            cohort = self.cohort_of(tenant.name)
            self.members[cohort].append(tenant.name)
            for flavor, limit in tenant.quotas.items():
                lent = min(limit.lending_limit, limit.nominal) if limit.lending_limit is not None else limit.nominal
                self.keep[(tenant.name, flavor)] = limit.nominal - lent
                self.lends[(cohort, flavor)] += lent
                self.covered[flavor] += limit.nominal

    def cohort_of(self, tenant: str) -> str:
        return self.config.tenant(tenant).cohort or f"tenant:{tenant}"

    def nominal(self, tenant: str, flavor: str) -> int:
        limit = self.config.tenant(tenant).limit(flavor)
        return limit.nominal if limit else 0

    def share(self, tenant: str) -> float:
        return self.units[tenant] / self.config.tenant(tenant).weight

    def cohort_version(self, tenant: str) -> int:
        return self.cohort_versions[self.cohort_of(tenant)]

    def add(self, tenant: str, flavor: str | None, units: float, sign: int = 1) -> None:
        self.version += 1
        self.units[tenant] += sign * units
        if flavor is None:
            return
        self.cohort_versions[self.cohort_of(tenant)] += 1
        key = (tenant, flavor)
        keep = self.keep.get(key, 0)
        before = max(0, self.used[key] - keep)
        self.used[key] += sign
        after = max(0, self.used[key] - keep)
        if before != after:
            cohort = (self.cohort_of(tenant), flavor)
            lends = self.lends[cohort]
            over_before = max(0, self.spill[cohort] - lends)
            self.spill[cohort] += after - before
            over_change = max(0, self.spill[cohort] - lends) - over_before
            if over_change:
                self.over[flavor] += over_change
                self.free_version += 1

    def borrowing(self, tenant: str, flavor: str) -> int:
        return max(0, self.used[(tenant, flavor)] - self.nominal(tenant, flavor))

    def free_capacity(self, flavor: str) -> int:
        """Devices of the flavor no tenant's nominal quota covers: anyone may borrow them."""
        return max(0, self.capacity.get(flavor, 0) - self.covered[flavor])

    def lendable(self, tenant: str, flavor: str) -> int:
        """How much more of the flavor the tenant's cohort and the free capacity could still lend it:
        what its cohort lends and nobody uses, plus the free capacity no cohort has spilled into."""
        cohort = (self.cohort_of(tenant), flavor)
        return (max(0, self.lends[cohort] - self.spill[cohort])
                + max(0, self.free_capacity(flavor) - self.over[flavor]))

    def check(self, tenant: str, deltas: Mapping[str, int]) -> list[Block]:
        """Blocking quotas if the tenant took `deltas` more devices per flavor; [] when it may."""
        if not self.config.enforced:
            return []
        blocks = []
        for flavor, delta in sorted(deltas.items()):
            if delta <= 0:
                continue
            used = self.used[(tenant, flavor)]
            limit = self.config.tenant(tenant).limit(flavor)
            nominal = limit.nominal if limit else 0
            if used + delta <= nominal:
                continue
            borrow = used + delta - nominal
            cohort = self.cohort_of(tenant)
            borrowed_by = {m: b for m in self.members[cohort] if m != tenant and (b := self.borrowing(m, flavor))}
            room = self.lendable(tenant, flavor)
            already = self.borrowing(tenant, flavor)
            if limit and limit.borrowing_limit is not None and borrow > limit.borrowing_limit:
                why = (f"{tenant} would borrow {borrow} {flavor} beyond its nominal {nominal}, over its "
                       f"borrowingLimit of {limit.borrowing_limit}")
            elif borrow - already > room:
                why = (f"{tenant} needs to borrow {borrow - already} more {flavor} (nominal {nominal}, in use "
                       f"{used}), but its cohort and the free capacity lend only {room} more")
            else:
                continue
            blocks.append(Block(flavor, delta, nominal, used, limit.borrowing_limit if limit else None, room,
                                borrowed_by, why))
        return blocks

    def headroom_flavors(self, tenant: str) -> frozenset[str]:
        """Flavors where the tenant still has nominal quota."""
        limits = self.config.tenant(tenant).quotas
        return frozenset(f for f, limit in limits.items() if self.used[(tenant, f)] < limit.nominal)


def _deltas(devices: Iterable[FleetDevice], flavors: Flavors) -> dict[str, int]:
    out: dict[str, int] = defaultdict(int)
    for d in devices:
        name = flavors.name_of(d)
        if name is not None:
            out[name] += 1
    return dict(out)


class _Cycle:
    def __init__(self, snapshot: Snapshot, memo: SelectorMemo) -> None:
        self.snapshot = snapshot
        self.fleet = snapshot.fleet
        self.flavors, capacity = _flavors_and_capacity(snapshot, memo)
        self.book = QuotaBook(snapshot.quotas, capacity)
        self.running: dict[ClaimKey, Running] = {r.key: r for r in snapshot.running}
        self.started = frozenset(self.running)
        self.on_node: dict[str, dict[ClaimKey, Running]] = defaultdict(dict)
        for r in snapshot.running:
            self.on_node[r.allocation.node][r.key] = r
        self._running_flavors: dict[ClaimKey, frozenset[str | None]] = {}
        self._plan_flavors: dict[int, frozenset[str]] = {}
        in_use = [k for r in snapshot.running for k in r.allocation.keys]
        self.state = _fleet_state(snapshot, memo, in_use)
        for r in snapshot.running:
            self._count(r.tenant, r.allocation, 1)
        self.order = itertools.count(max((r.allocated_order for r in snapshot.running), default=0) + 1)
        self.preemptions: list[Preemption] = []
        self._flavor_filters: dict[str, DeviceFilter] = {}
        self.preempted: set[ClaimKey] = set()
        # (plan, filter) -> the fleet version a Pending answer was given at, and that answer: a deep queue
        # of claims alike costs one placement attempt per fleet change, not one per claim.
        self.failed_at: dict[tuple[int, Any], tuple[Any, Decision]] = {}
        self.blocked_at: dict[tuple[str, int], tuple[Any, tuple[Decision, list[Block]]]] = {}

    def _devices(self, allocation: Allocation) -> list[FleetDevice]:
        by_key = self.fleet.by_key
        return [by_key[k] for k in allocation.keys if k in by_key]

    def _count(self, tenant: str, allocation: Allocation, sign: int) -> None:
        for d in self._devices(allocation):
            self.book.add(tenant, self.flavors.name_of(d), self.flavors.units_of(d), sign)

    def _only(self, flavor: str) -> DeviceFilter:
        """Placement restricted to one flavor; one filter object per flavor, shared by every tenant, so
        the indexes behind it are built once."""
        found = self._flavor_filters.get(flavor)
        if found is None:
            names = self.flavors.name_of
            selector = next((f.selector for f in self.snapshot.quotas.flavors if f.name == flavor), "")
            found = self._flavor_filters[flavor] = DeviceFilter(("flavor", flavor, selector),
                                                                lambda d: names(d) == flavor)
        return found

    def _borrow_cap(self, tenant: str, flavor: str) -> int:
        limit = self.snapshot.quotas.tenant(tenant).limit(flavor)
        return limit.borrowing_limit if limit and limit.borrowing_limit is not None else 1 << 30

    def _within_nominal(self, tenant: str, deltas: Mapping[str, int]) -> bool:
        return all(self.book.used[(tenant, f)] + n <= self.book.nominal(tenant, f) for f, n in deltas.items())

    def try_admit(self, waiting: Waiting) -> tuple[Decision, list[Block]]:
        """Placement within nominal first, then borrowing; the quota check is on the devices chosen.

        The unrestricted best fit comes first; when it would borrow or is blocked, the claim is placed
        on each flavor it has nominal quota of, then on each it may borrow, one flavor at a time."""
        first = self._decide(waiting, None)
        if not self.snapshot.quotas.enforced or first.allocation is None:
            return first, []  # an open fleet, or capacity (not quota) is what keeps it out
        tenant = waiting.tenant
        plan = self.state.plan(waiting.claim)
        key = (tenant, id(plan))
        stamp = (self.book.cohort_version(tenant), self.book.free_version, self.state.capacity_version(plan))
        cached = self.blocked_at.get(key)
        if cached is not None and cached[0] == stamp:
            return cached[1]  # the same tenant asked for the same and nothing it depends on changed
        result = self._admit_within_quota(waiting, first)
        if result[0].allocation is None:
            self.blocked_at[key] = (stamp, result)
        return result

    def _admit_within_quota(self, waiting: Waiting, first: Decision) -> tuple[Decision, list[Block]]:
        assert first.allocation is not None
        tenant = waiting.tenant
        deltas = _deltas(self._devices(first.allocation), self.flavors)
        blocks = self.book.check(tenant, deltas)
        if not blocks and self._within_nominal(tenant, deltas):
            return first, []
        tried = set(deltas) if len(deltas) == 1 else set()
        relevant = self.claim_flavors(waiting)
        nominal = sorted(self.book.headroom_flavors(tenant) & relevant)
        borrowable = [f for f in sorted(relevant) if f not in nominal
                      and self.book.lendable(tenant, f) > 0
                      and self.book.borrowing(tenant, f) < self._borrow_cap(tenant, f)]
        for flavor in (*nominal, *borrowable):
            if flavor in tried:
                continue
            tried.add(flavor)
            decision = self._decide(waiting, self._only(flavor), explain=False)
            if decision.allocation is None:
                continue
            if not self.book.check(tenant, _deltas(self._devices(decision.allocation), self.flavors)):
                return decision, []
        if not blocks:
            return first, []  # it borrows, within every limit, and nothing within nominal fits
        reason = "; ".join(b.why for b in blocks)
        return Decision(State.PENDING, reason=f"Quota: {reason}"), blocks

    def _decide(self, waiting: Waiting, only: DeviceFilter | None, explain: bool = True) -> Decision:
        try:
            plan_key: tuple[int, Any] | None = (id(self.state.plan(waiting.claim)), only.key if only else None)
        except Rejected:
            plan_key = None
        version = None
        if plan_key is not None:
            version = self.state.capacity_version(self.state.plan(waiting.claim), only)
            failed = self.failed_at.get(plan_key)
            if failed is not None and failed[0] == version:
                return failed[1]
        decision = self.state.decide(waiting.claim, only, explain=explain)
        if plan_key is not None and decision.state is State.PENDING:
            self.failed_at[plan_key] = (version, decision)
        return decision

    def admit(self, waiting: Waiting, allocation: Allocation) -> None:
        self.state.take(allocation)
        self._count(waiting.tenant, allocation, 1)
        running = Running(waiting.tenant, waiting.name, allocation, waiting.priority, waiting.preemptible,
                          waiting.arrival, next(self.order))
        self.running[waiting.key] = running
        self.on_node[allocation.node][waiting.key] = running

    # -- preemption ---------------------------------------------------------------------------------

    def _rule(self, preemptor: Waiting, victim: Running) -> str | None:
        """The rule that lets `preemptor` consider `victim`, before checking the outcome."""
        if not victim.preemptible or victim.key in self.preempted or victim.key not in self.started:
            return None  # claims admitted in this very cycle are not taken back in it
        if victim.key in preemptor.displaced_by:
            return None  # no back and forth: a claim never preempts the claim that preempted it
        if victim.tenant == preemptor.tenant:
            return "priority" if victim.priority < preemptor.priority else None
        if self.snapshot.quotas.enforced and not self._borrows(victim):
            return None  # only borrowed devices are taken back or shared out
        same_cohort = (self.snapshot.quotas.tenant(victim.tenant).cohort is not None and
                       self.snapshot.quotas.tenant(victim.tenant).cohort ==
                       self.snapshot.quotas.tenant(preemptor.tenant).cohort)
        return "reclaim" if same_cohort and self.snapshot.quotas.enforced else "fair-share"

    def prefilter(self) -> Callable[[Waiting], bool]:
        """A cheap test, built once per pass, of whether a waiting claim has any victim candidate: a
        lower-priority preemptible claim of its own tenant, or a preemptible claim of another tenant
        that borrows (any other tenant in an open fleet) with a larger share than its own."""
        lowest: dict[str, int] = {}
        shares: dict[str, float] = {}
        enforced = self.snapshot.quotas.enforced
        borrowing = {t for (t, f), n in self.book.used.items() if n > self.book.nominal(t, f)}
        for r in self.running.values():
            if not r.preemptible or r.key not in self.started:
                continue
            lowest[r.tenant] = min(lowest.get(r.tenant, r.priority), r.priority)
            if not enforced or r.tenant in borrowing:
                shares[r.tenant] = self.book.share(r.tenant)
        top = max(shares.values(), default=None)

        def test(waiting: Waiting) -> bool:
            if lowest.get(waiting.tenant, waiting.priority) < waiting.priority:
                return True
            mine = self.book.share(waiting.tenant)
            if top is None or top < mine:
                return False
            return any(t != waiting.tenant and s >= mine for t, s in shares.items())

        return test

    def _borrows(self, victim: Running) -> bool:
        """Whether the victim's tenant borrows any flavor the victim holds."""
        return any(f is not None and self.book.borrowing(victim.tenant, f) > 0 for f in self._flavors_of(victim))

    def _flavors_of(self, running: Running) -> frozenset[str | None]:
        found = self._running_flavors.get(running.key)
        if found is None:
            found = self._running_flavors[running.key] = frozenset(
                self.flavors.name_of(d) for d in self._devices(running.allocation))
        return found

    def claim_flavors(self, waiting: Waiting) -> frozenset[str]:
        """Flavors of the devices the claim's requests accept at all: the only ones worth trying."""
        try:
            plan = self.state.plan(waiting.claim)
        except Rejected:
            return frozenset()
        found = self._plan_flavors.get(id(plan))
        if found is None:
            names: set[str] = set()
            for _, alternatives in plan.requests:
                for alternative in alternatives:
                    try:
                        index = self.state.index(alternative)
                    except Rejected:
                        continue  # a subrequest whose selector fails here contributes no flavor
                    for device in index.kinds():
                        if (name := self.flavors.name_of(device)) is not None:
                            names.add(name)
            found = self._plan_flavors[id(plan)] = frozenset(names)
        return found

    def try_preempt(self, waiting: Waiting) -> Decision | None:
        try:  # victims only on nodes with devices the claim's first request accepts
            lead = self.state.plan(waiting.claim).variants[0][0]
            index = self.state.index(lead)
        except (Rejected, IndexError):
            return None
        hosts = index.nodes
        by_node: dict[str, list[tuple[Running, str]]] = defaultdict(list)
        for node in sorted(hosts & self.on_node.keys()):
            candidates = [(r, rule) for r in self.on_node[node].values()
                          if (rule := self._rule(waiting, r)) is not None]
            if not candidates:
                continue
            accepted = {d.key for d in index.devices_on(node)}
            could_free = sum(1 for r, _ in candidates for k in r.allocation.keys if k in accepted)
            if len(index.free_on(node)) + could_free >= lead.wanted:  # else evicting them cannot make room
                by_node[node] = candidates
        if not by_node:
            return None
        best: tuple[tuple[float, int, int], list[tuple[Running, str]], Allocation] | None = None
        nodes = sorted(by_node, key=lambda n: (sum(self._units(r) for r, _ in by_node[n]), n))
        for node in nodes[:MAX_PREEMPTION_NODES]:
            found = self._victims_on(waiting, sorted(by_node[node], key=lambda c: self._victim_order(c[0])))
            if found is None:
                continue
            victims, allocation = found
            score = (sum(self._units(r) for r, _ in victims), max(r.priority for r, _ in victims),
                     -min(r.allocated_order for r, _ in victims))
            if best is None or score < best[0]:
                best = (score, victims, allocation)
        if best is None:
            return None
        _, victims, allocation = best
        for victim, _ in victims:
            self._evict(victim)
        self.admit(waiting, allocation)
        for victim, rule in victims:  # reasons state the shares after the move
            self.preemptions.append(Preemption(victim.key, waiting.key, rule,
                                               self._preempt_reason(waiting, victim, rule)))
        return Decision(State.ALLOCATED, allocation)

    def _units(self, r: Running) -> float:
        return sum(self.flavors.units_of(d) for d in self._devices(r.allocation))

    def _victim_order(self, r: Running) -> tuple[float, int, int]:
        return (self._units(r), r.priority, -r.allocated_order)

    def _evict(self, victim: Running) -> None:
        self.state.give_back(victim.allocation)
        self._count(victim.tenant, victim.allocation, -1)
        del self.running[victim.key]
        del self.on_node[victim.allocation.node][victim.key]
        self.preempted.add(victim.key)

    def _restore(self, victim: Running) -> None:
        self.state.take(victim.allocation)
        self._count(victim.tenant, victim.allocation, 1)
        self.running[victim.key] = victim
        self.on_node[victim.allocation.node][victim.key] = victim
        self.preempted.discard(victim.key)

    def _fits_with(self, waiting: Waiting, victims: Sequence[tuple[Running, str]]) -> Allocation | None:
        """With the victims gone, the claim is placed and every victim's rule holds for the outcome."""
        decision, blocks = self.try_admit(waiting)
        if decision.allocation is None or blocks:
            return None
        devices = self._devices(decision.allocation)
        deltas = _deltas(devices, self.flavors)
        units = sum(self.flavors.units_of(d) for d in devices)
        weight = self.snapshot.quotas.tenant(waiting.tenant).weight
        for victim, rule in victims:
            if rule == "reclaim":
                if any(self.book.used[(waiting.tenant, f)] + n > self.book.nominal(waiting.tenant, f)
                       for f, n in deltas.items()):
                    return None  # reclaim is for a tenant that stays within its nominal quota
            elif rule == "fair-share":
                mine = (self.book.units[waiting.tenant] + units) / weight
                if mine > self.book.share(victim.tenant):
                    return None
        return decision.allocation

    def _victims_on(self, waiting: Waiting, candidates: list[tuple[Running, str]]
                    ) -> tuple[list[tuple[Running, str]], Allocation] | None:
        """Greedy on one node until the claim fits, then drop every victim it does not need."""
        taken: list[tuple[Running, str]] = []
        allocation = None
        try:
            for candidate in candidates:
                self._evict(candidate[0])
                taken.append(candidate)
                allocation = self._fits_with(waiting, taken)
                if allocation is not None:
                    break
            if allocation is None:
                return None
            for candidate in list(reversed(taken))[1:]:  # the last one was needed, by construction
                self._restore(candidate[0])
                rest = [c for c in taken if c is not candidate]
                again = self._fits_with(waiting, rest)
                if again is not None:
                    taken, allocation = rest, again
                else:
                    self._evict(candidate[0])
            return list(taken), allocation
        finally:
            for victim, _ in taken:
                self._restore(victim)

    def _preempt_reason(self, waiting: Waiting, victim: Running, rule: str) -> str:
        by = f"{waiting.tenant}/{waiting.name}"
        if rule == "priority":
            return f"preempted by {by}, priority {waiting.priority} over {victim.priority} in tenant {victim.tenant}"
        if rule == "reclaim":
            return (f"preempted by {by}: tenant {waiting.tenant} reclaims its nominal quota that {victim.tenant} "
                    "borrowed")
        return (f"preempted by {by} for fair share: afterwards {waiting.tenant}'s share "
                f"{self.book.share(waiting.tenant):.2f} is at or below {victim.tenant}'s "
                f"{self.book.share(victim.tenant):.2f} (GPU units in use per unit of weight)")


def _flavors_and_capacity(snapshot: Snapshot, memo: SelectorMemo) -> tuple[Flavors, dict[str, int]]:
    """Each device's flavor and the devices per flavor, kept while the fleet and the flavors stay the same."""
    kept = memo.states.get("flavors")
    if kept is not None and kept[0] is snapshot.fleet and kept[1] == snapshot.quotas.flavors:
        return kept[2], kept[3]
    flavors = Flavors(snapshot.quotas.flavors, memo)
    capacity: dict[str, int] = defaultdict(int)
    for device in snapshot.fleet.devices:
        name = flavors.name_of(device)
        if name is not None:
            capacity[name] += 1
    memo.states["flavors"] = (snapshot.fleet, snapshot.quotas.flavors, flavors, dict(capacity))
    return flavors, dict(capacity)


def _fleet_state(snapshot: Snapshot, memo: SelectorMemo, in_use: Sequence[DeviceKey]) -> FleetState:
    """The last cycle's state when the fleet, classes and unusable nodes are the same objects and values
    (brought up to date by what is in use now); otherwise a new one. Derived data only: the same
    answers as a new state, without rebuilding every index each cycle."""
    kept = memo.states.get("cycle")
    if (isinstance(kept, FleetState) and kept.fleet is snapshot.fleet and kept.classes is snapshot.classes
            and kept.unusable_nodes == dict(snapshot.unusable_nodes)):
        kept.sync(in_use)
        return kept
    state = FleetState(snapshot.fleet, snapshot.classes, in_use, memo=memo, unusable_nodes=snapshot.unusable_nodes)
    memo.states["cycle"] = state
    return state


def _fair_order(cycle: _Cycle, waiting: Sequence[Waiting]) -> Iterable[Waiting]:
    """Lowest share first, re-ranked after every admission; within a tenant priority, then arrival."""
    queues: dict[str, list[tuple[int, int, int, Waiting]]] = defaultdict(list)
    for i, w in enumerate(waiting):
        queues[w.tenant].append((-w.priority, w.arrival, i, w))
    for queue in queues.values():
        queue.sort(key=lambda item: item[:3])
        queue.reverse()  # pop() from the end gives the head
    heap = [(cycle.book.share(t), q[-1][0], q[-1][1], t) for t, q in queues.items()]
    heapq.heapify(heap)
    while heap:
        _, _, _, tenant = heapq.heappop(heap)
        queue = queues[tenant]
        yield queue.pop()[3]
        if queue:
            heapq.heappush(heap, (cycle.book.share(tenant), queue[-1][0], queue[-1][1], tenant))


def _admin(waiting: Waiting) -> bool:
    return any(r.exactly is not None and r.exactly.admin_access for r in waiting.claim.spec.devices.requests)


def run_cycle(snapshot: Snapshot, memo: SelectorMemo | None = None) -> CycleResult:
    """Admit what fits in fair-share order, then preempt where a rule allows, and explain the rest."""
    cycle = _Cycle(snapshot, memo or SelectorMemo())
    decided: dict[ClaimKey, tuple[Decision, list[Block]]] = {}
    order: list[Waiting] = []  # the claims decided this cycle, in fair-share order
    sequence: list[Waiting] = []  # every waiting claim in fair-share order, decided or not
    for waiting in _fair_order(cycle, snapshot.waiting):
        sequence.append(waiting)
        if waiting.answered and cycle.state.free_devices <= 0 and not _admin(waiting):
            continue  # nothing is free: it keeps its place and its last answer; only preemption can help
        decision, blocks = cycle.try_admit(waiting)
        if decision.allocation is not None:
            cycle.admit(waiting, decision.allocation)
        decided[waiting.key] = (decision, blocks)
        order.append(waiting)
    attempts = 0
    may_preempt = cycle.prefilter()
    for waiting in sequence:  # preemption, in the same fair-share order
        found = decided.get(waiting.key)
        if found is not None and found[0].state is not State.PENDING:
            continue
        if waiting.key in cycle.preempted or not may_preempt(waiting):
            continue
        attempts += 1
        preempted = cycle.try_preempt(waiting)
        if preempted is not None:
            if found is None:
                order.append(waiting)
            decided[waiting.key] = (preempted, [])
            may_preempt = cycle.prefilter()
        if attempts >= MAX_PREEMPTION_ATTEMPTS:
            break
    from shared.explain import explain_pending

    results = []
    candidates = sum(1 for r in cycle.running.values() if r.preemptible)
    flavors: dict[DeviceKey, tuple[str | None, float]] = {}
    explained: dict[tuple[Any, ...], Mapping[str, Any]] = {}  # claims alike in one tenant read alike
    for waiting in order:
        decision, blocks = decided[waiting.key]
        detail = None
        if decision.state is State.PENDING:
            key = (waiting.tenant, waiting.priority, id(cycle.state.plan(waiting.claim)), decision.reason)
            detail = explained.get(key)
            if detail is None:
                detail = explained[key] = explain_pending(cycle, waiting, decision, blocks, candidates)
        elif decision.allocation is not None:
            for d in cycle._devices(decision.allocation):
                flavors[d.key] = (cycle.flavors.name_of(d), cycle.flavors.units_of(d))
        results.append(ClaimDecision(waiting.tenant, waiting.name, decision, detail))
    return CycleResult(tuple(results), tuple(cycle.preemptions), flavors)
