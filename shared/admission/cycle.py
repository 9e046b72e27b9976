"""One admission cycle: quotas per flavor, fair-share order, preemption that cannot loop, explanations.

A pure function over an immutable snapshot (the fleet, the quotas, what runs, what waits); the
allocator service and `claimbroker simulate --quotas` run the same code.

- Flavors: every device counts against the first flavor whose selector accepts it (shared/admission/quota.py).
- Quotas (Kueue's arithmetic, flat cohorts): a tenant may use its nominal quota of a flavor, less what
  cohort-mates borrow of what it lends (it takes that back by reclaim, not by being admitted beside
  them: the cohort would then hold more than its members' nominal); beyond it it borrows what its cohort
  lends (each member lends its unused nominal up to its lendingLimit) and the flavor's free capacity
  (devices no tenant's nominal covers), within its borrowingLimit. With no quota anywhere the fleet is
  open. `shared.admission.invariant` checks what users rely on.
- Order: tenants by share (GPU units in use over weight, lowest first), then priority, then arrival.
  Claims of one tenant and spec form a group tried from its head (see `_admission_pass`), so a deep
  queue never stalls admission and costs a cycle O(groups + admissions), not O(claims).
- Placement within nominal first: devices of flavors where the tenant has nominal headroom, then the
  best fit it may borrow (or, when the best fit is blocked, another flavor it may borrow).
- Preemption, only of preemptible claims, by three rules: (a) priority within a tenant, (b) reclaim: a
  tenant that stays within its nominal takes back devices another tenant of its cohort borrows, (c)
  fair share: a tenant preempts a borrowing tenant only while its share afterwards stays at or below
  the victim's share afterwards. (b) and (c) only take from borrowers and (c) compares shares after
  the move; and a claim never preempts one that preempted it (`displaced_by`), so no pair of claims
  is preempted back and forth, whatever else changes between cycles. Claims admitted in a cycle are
  not preempted in the same cycle. A claim its quota keeps out whatever other tenants' claims are
  evicted preempts only within its tenant. The victim set is the smallest that lets the claim in:
  fewest GPU units, then lowest priority, then most recently allocated, and no victim the claim does
  not need.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections import Counter, defaultdict
from collections.abc import Callable, Collection, Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, NamedTuple, cast

from shared.admission.claim_guard import MAX_FAULTS_PER_CYCLE, ClaimFault, fault_decision, per_claim
from shared.admission.explain import explain_pending
from shared.admission.quota import Flavor, QuotaConfig
from shared.dra import model as dra
from shared.dra.allocation import Allocation, Decision, DeviceFilter, DeviceKey, FleetState, Plan, Rejected, State
from shared.dra.cel import CompiledSelector, SelectorError, compile_selector
from shared.dra.inventory import Fleet, FleetDevice
from shared.dra.matching import SelectorMemo

ClaimKey = tuple[str, str]  # tenant, name
MAX_PREEMPTION_NODES = 8  # nodes tried per preempting claim, most promising first
MAX_PREEMPTION_ATTEMPTS = 8  # waiting claims that search for victims per cycle, in fair-share order
ADMIN_ACCESS_REFUSED = ("adminAccess requests are allowed only for tenants marked adminAccess: true in the Quotas "
                        "file or the admin API (as Kubernetes allows them only in namespaces labelled "
                        "resource.kubernetes.io/admin-access); tenant {tenant} is not")


@dataclass(frozen=True, eq=False)  # compared and hashed by identity: a cycle diffs snapshots by object
class Running:
    tenant: str
    name: str
    allocation: Allocation
    priority: int = 0
    preemptible: bool = True
    arrival: int = 0
    allocated_order: int = 0  # larger: allocated more recently

    @cached_property
    def key(self) -> ClaimKey:  # built once: a deep queue's claims are looked up by key every cycle
        return (self.tenant, self.name)


@dataclass(frozen=True, eq=False)  # compared and hashed by identity: a cycle diffs snapshots by object
class Waiting:
    tenant: str
    name: str
    claim: dra.ResourceClaim
    priority: int = 0
    preemptible: bool = True
    arrival: int = 0
    answered: bool = False  # it has a Pending answer already: a full fleet need not decide it again
    displaced_by: frozenset[ClaimKey] = frozenset()  # claims that preempted it: it never takes them back

    @cached_property
    def key(self) -> ClaimKey:  # built once: a deep queue's claims are looked up by key every cycle
        return (self.tenant, self.name)


@dataclass(frozen=True)
class QueueChanges:
    """What came into and went out of the waiting queue between two snapshots of it, as the shell that
    keeps the queue recorded it (`shared.admission.waiting_queue.WaitingQueue`). Versions are unique per process."""

    since: int  # the version of the snapshot these changes follow (0: none)
    version: int  # this snapshot's
    came: tuple[Waiting, ...] = ()
    went: tuple[Waiting, ...] = ()


@dataclass(frozen=True)
class Snapshot:
    fleet: Fleet
    classes: Mapping[str, dra.DeviceClass]
    quotas: QuotaConfig
    running: tuple[Running, ...] = ()
    waiting: tuple[Waiting, ...] = ()
    unusable_nodes: Mapping[str, str] = field(default_factory=dict)
    # Optional: how `waiting` differs from the snapshot of version `changes.since`. A cycle kept from
    # that snapshot then reads only the changes instead of comparing every waiting claim (a deep queue
    # costs O(changes)); otherwise, or when they do not add up, the queues are compared in full.
    changes: QueueChanges | None = None


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
    internal_error: str | None = None  # deciding it failed through a fault of ours: alert on it


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
    and preempts, so asking what a cohort still lends costs O(1).

    The arithmetic that runs on every admission and quota check writes `max(0, x)` as `x if x > 0 else
    0`: CPython 3.11's max() parses keyword arguments and builds an iterator on each call, about fifteen
    times the cost of the comparison, and this runs tens of thousands of times a cycle."""

    def __init__(self, config: QuotaConfig, capacity: Mapping[str, int]) -> None:
        self.config = config
        self.capacity = capacity  # devices per flavor in the fleet
        self.used: dict[tuple[str, str], int] = defaultdict(int)
        self.flavors_used: dict[str, set[str]] = defaultdict(set)  # every flavor a tenant ever used here
        self.units: dict[str, float] = defaultdict(float)
        self.members: dict[str, list[str]] = defaultdict(list)
        self.keep: dict[tuple[str, str], int] = {}  # nominal a tenant never lends
        self.lends: dict[tuple[str, str], int] = defaultdict(int)  # per cohort and flavor
        self.spill: dict[tuple[str, str], int] = defaultdict(int)  # members' use beyond what they keep
        self.over: dict[str, int] = defaultdict(int)  # cohorts' spill beyond what they lend: free capacity used
        self.covered: dict[str, int] = defaultdict(int)  # nominal quota per flavor over all tenants
        self.unused: dict[str, int] = dict(capacity)  # devices per flavor no tenant uses (idle() reads it)
        self.borrowed_count: dict[str, int] = defaultdict(int)  # flavors a tenant uses beyond its nominal
        self.cohort_versions: dict[str, int] = defaultdict(int)  # per cohort: its members' usage changed
        self.free_version = 0  # the free capacity some cohort spilled into changed
        self._fixed: dict[tuple[str, str], tuple[int, int, tuple[str, str], int, int]] = {}  # per quotas
        self._nominals: dict[tuple[str, str], int] = {}
        self._cohorts: dict[str, str] = {}  # the quotas are fixed for a book's life: looked up once
        self._weights: dict[str, float] = {}
        for tenant in config.tenants.values():
            cohort = self.cohort_of(tenant.name)
            self.members[cohort].append(tenant.name)
            for flavor, limit in tenant.quotas.items():
                lent = min(limit.lending_limit, limit.nominal) if limit.lending_limit is not None else limit.nominal
                self.keep[(tenant.name, flavor)] = limit.nominal - lent
                self.lends[(cohort, flavor)] += lent
                self.covered[flavor] += limit.nominal

    def cohort_of(self, tenant: str) -> str:
        found = self._cohorts.get(tenant)
        if found is None:
            found = self._cohorts[tenant] = self.config.tenant(tenant).cohort or f"tenant:{tenant}"
        return found

    def weight(self, tenant: str) -> float:
        found = self._weights.get(tenant)
        if found is None:
            found = self._weights[tenant] = self.config.tenant(tenant).weight
        return found

    def nominal(self, tenant: str, flavor: str) -> int:
        found = self._nominals.get((tenant, flavor))
        if found is None:
            limit = self.config.tenant(tenant).limit(flavor)
            found = self._nominals[(tenant, flavor)] = limit.nominal if limit else 0
        return found

    def share(self, tenant: str) -> float:
        return self.units[tenant] / self.weight(tenant)

    def cohort_version(self, tenant: str) -> int:
        return self.cohort_versions[self.cohort_of(tenant)]

    def add(self, tenant: str, flavor: str | None, units: float, count: int = 1) -> None:
        """The tenant takes `count` more devices of the flavor (fewer, when negative), weighing `units`."""
        self.units[tenant] += units
        if flavor is None:
            return
        self.cohort_versions[self.cohort_of(tenant)] += 1
        key = (tenant, flavor)
        self.flavors_used[tenant].add(flavor)
        self.unused[flavor] = self.unused.get(flavor, 0) - count
        keep = self.keep.get(key, 0)
        used = self.used[key]
        now = self.used[key] = used + count
        before = used - keep if used > keep else 0
        after = now - keep if now > keep else 0
        nominal = self.nominal(tenant, flavor)
        if (used > nominal) != (now > nominal):
            self.borrowed_count[tenant] += 1 if count > 0 else -1
        if before != after:
            cohort = (self.cohort_of(tenant), flavor)
            lends, spill = self.lends[cohort], self.spill[cohort]
            over_before = spill - lends if spill > lends else 0
            spill = self.spill[cohort] = spill + after - before
            over_change = (spill - lends if spill > lends else 0) - over_before
            if over_change:
                self.over[flavor] += over_change
                self.free_version += 1

    def borrowing(self, tenant: str, flavor: str) -> int:
        beyond = self.used[(tenant, flavor)] - self.nominal(tenant, flavor)
        return beyond if beyond > 0 else 0

    def borrow_cap(self, tenant: str, flavor: str) -> int:
        """The tenant's borrowingLimit for the flavor (none: unbounded)."""
        limit = self.config.tenant(tenant).limit(flavor)
        return limit.borrowing_limit if limit and limit.borrowing_limit is not None else 1 << 30

    def room(self, tenant: str, flavor: str, *, lent_only: bool = True) -> int:
        """Devices of the flavor the tenant may still take: check()'s arithmetic solved for the most that
        passes, what is available to it (`_available`) within its nominal headroom plus its borrowingLimit
        (with `lent_only=False`, as if its cohort and the free capacity lent without end)."""
        fixed = self._fixed.get((tenant, flavor)) or self._fixed_of(tenant, flavor)
        nominal, cap = fixed[0], fixed[1]
        used = self.used[(tenant, flavor)]
        headroom = nominal - used if nominal > used else 0
        cap_left = cap - (used - nominal if used > nominal else 0)
        most = headroom + cap_left if cap_left > 0 else headroom
        if not lent_only:
            return most
        available = self._available(fixed, flavor, used)
        return available if available < most else most

    def _fixed_of(self, tenant: str, flavor: str) -> tuple[int, int, tuple[str, str], int, int]:
        """What the quotas fix for a tenant and flavor: nominal, borrowing cap, cohort key, the flavor's
        free capacity and the part of its nominal the tenant keeps (never lends); looked up once."""
        fixed = self._fixed.get((tenant, flavor))
        if fixed is None:
            fixed = self._fixed[(tenant, flavor)] = (
                self.nominal(tenant, flavor), self.borrow_cap(tenant, flavor), (self.cohort_of(tenant), flavor),
                self.free_capacity(flavor), self.keep.get((tenant, flavor), 0))
        return fixed

    def borrowed_flavors(self, tenant: str) -> frozenset[str | None]:
        """Flavors the tenant uses beyond its nominal quota."""
        return frozenset(f for f in self.flavors_used.get(tenant, ()) if self.borrowing(tenant, f) > 0)

    def idle(self, flavor: str) -> int:
        """Devices of the flavor nobody uses (an upper bound where some are on unusable nodes)."""
        idle = self.unused.get(flavor, 0)
        return idle if idle > 0 else 0

    def free_capacity(self, flavor: str) -> int:
        """Devices of the flavor no tenant's nominal quota covers: anyone may borrow them."""
        return max(0, self.capacity.get(flavor, 0) - self.covered[flavor])

    def borrowable(self, tenant: str, flavor: str) -> int:
        """How many more devices of the flavor the tenant could take beyond its nominal quota: what is
        available to it (`_available`) less its nominal headroom. The cohort's pool holds the tenant's own
        lent, unused quota, which its headroom already counts: it is taken out, so a tenant never borrows
        its own quota (nor, through it, past another's lendingLimit)."""
        fixed = self._fixed_of(tenant, flavor)
        used = self.used[(tenant, flavor)]
        nominal = fixed[0]
        left = self._available(fixed, flavor, used) - (nominal - used if nominal > used else 0)
        return left if left > 0 else 0

    def _available(self, fixed: tuple[int, int, tuple[str, str], int, int], flavor: str, used: int) -> int:
        """Devices of the flavor the tenant may take now, its borrowingLimit aside (Kueue's `available`):
        the part of its nominal it keeps (never lends) and does not use, what its cohort lends that nobody
        uses, and the free capacity no cohort has spilled into.

        Its nominal headroom is not all of it: what it lends sits in the cohort's pool, and while
        cohort-mates borrow it, it is theirs. The tenant takes it back by reclaim (preemption of the
        borrowers), never by being admitted beside them: then its cohort would hold more than its
        members' nominal quota, on devices of the free capacity or of another cohort's idle quota."""
        _, _, cohort, free, keep = fixed
        lent, spare = self.lends[cohort] - self.spill[cohort], free - self.over[flavor]
        return (lent if lent > 0 else 0) + (spare if spare > 0 else 0) + (keep - used if keep > used else 0)

    def check(self, tenant: str, deltas: Mapping[str, int]) -> list[Block]:
        """Blocking quotas if the tenant took `deltas` more devices per flavor; [] when it may."""
        if not self.config.enforced:
            return []
        blocks = []
        for flavor, delta in sorted(deltas.items()):
            if delta <= 0:
                continue
            used = self.used[(tenant, flavor)]
            fixed = self._fixed_of(tenant, flavor)
            nominal, cap = fixed[0], fixed[1]
            borrow = used + delta - nominal
            if borrow > cap:
                why = (f"{tenant} would borrow {borrow} {flavor} beyond its nominal {nominal}, over its "
                       f"borrowingLimit of {cap}")
            else:
                # within its nominal quota too: what it lends may be borrowed (see _available)
                available = self._available(fixed, flavor, used)
                if delta <= available:
                    continue
                headroom = nominal - used if nominal > used else 0
                lent_out = headroom - available if headroom > available else 0
                if borrow <= 0:
                    why = (f"{tenant} is within its nominal {nominal} {flavor} (in use {used}), but its cohort "
                           f"borrows {lent_out} of the quota it lends: only {available} more are free to it "
                           f"until they are given back")
                else:
                    why = (f"{tenant} needs to borrow {borrow - max(0, used - nominal)} more {flavor} (nominal "
                           f"{nominal}, in use {used}), but its cohort and the free capacity lend only "
                           f"{available - headroom if available > headroom else 0} more"
                           + (f", and its cohort borrows {lent_out} of the quota it lends" if lent_out else ""))
            room = self.borrowable(tenant, flavor)
            limit = self.config.tenant(tenant).limit(flavor)
            borrowed_by = {m: b for m in self.members[self.cohort_of(tenant)]
                           if m != tenant and (b := self.borrowing(m, flavor))}
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


class _PlanFacts(NamedTuple):
    flavors: frozenset[str]  # of the devices the spec's requests accept
    least: int | None  # fewest flavored devices a placement takes; None: All mode, admin access or unflavored
    unflavored: bool = False  # it may be placed on devices no flavor counts (which need no quota) alone


class _Victim(NamedTuple):
    """A preemptible running claim as the victim search reads it: what it scans per claim, kept."""

    running: Running
    node: str
    units: float


class _Holding(NamedTuple):
    """A running claim's devices as the quota book counts them."""

    allocation: Allocation
    per_flavor: list[tuple[str | None, int, float]]  # flavor, devices, GPU units they weigh
    flavors: frozenset[str | None]
    units: float  # GPU units in all (summed in device order)


# A Pending answer without a reason (its quota or the free devices keep the claim out): the reason is worked
# out against what is free and what quota is left after the cycle, if the answer is given (answer()).
_UNANSWERED = Decision(State.PENDING)
_NO_VICTIMS: dict[ClaimKey, _Victim] = {}  # read only
_NO_FLAVORS: frozenset[str] = frozenset()  # a tenant with room in every flavor so far (_admission_pass)


class _OutOfRoom(Exception):
    """In the admission pass: the tenant's quota has room in no flavor with an idle device, and every
    spec it waits with has a fixed size, so none of its groups can be admitted for the rest of the pass."""


class _Group:
    """The waiting claims of one tenant with one claim spec (one plan), in the tenant's order: priority,
    then arrival. Claims alike get the same answer, so a cycle tries a group's claims from the head and
    stops at the first that does not fit: what stays free and what quota is left only shrink while a
    cycle admits, so the rest would not fit either."""

    __slots__ = ("tenant", "plan", "facts", "entries", "fresh")

    def __init__(self, tenant: str, plan: Plan, facts: _PlanFacts) -> None:
        self.tenant = tenant
        self.plan = plan
        self.facts = facts  # what quota arithmetic needs of the spec
        self.entries: list[tuple[int, int, str]] = []  # (-priority, arrival, name), sorted
        self.fresh: set[str] = set()  # names with no answer yet: they get the group's answer this cycle


class _VictimTenants:
    """Each tenant that runs preemptible claims with those claims, weight, share and cohort, and (asked
    only under reclaim and fair share) the flavors it borrows."""

    def __init__(self, book: QuotaBook, victims: Mapping[str, dict[ClaimKey, _Victim]]) -> None:
        self.book = book
        self.tenants = [(tenant, claims, book.weight(tenant), book.share(tenant), book.cohort_of(tenant))
                        for tenant, claims in victims.items() if claims]
        self._borrowed: dict[str, frozenset[str | None]] = {}

    def borrowed(self, tenant: str) -> frozenset[str | None]:
        found = self._borrowed.get(tenant)
        if found is None:
            found = self._borrowed[tenant] = self.book.borrowed_flavors(tenant)
        return found


def _key(claim: Running | Waiting) -> ClaimKey:
    return claim.key


def _entry(waiting: Waiting) -> tuple[int, int, str]:
    return (-waiting.priority, waiting.arrival, waiting.name)


class AdmissionState:
    """The admission state of one fleet, classes and quotas, kept across cycles and brought up to date
    with each snapshot in O(what changed): usage per tenant and flavor, what runs on each node, the
    waiting claims in groups, and the answers cached per fleet and quota version."""

    def __init__(self, snapshot: Snapshot, memo: SelectorMemo) -> None:
        self.snapshot = snapshot
        self.fleet = snapshot.fleet
        self.flavors, capacity = _flavors_and_capacity(snapshot, memo)
        self.book = QuotaBook(snapshot.quotas, capacity)
        self.running: dict[ClaimKey, Running] = {}
        # preemptible running claims per tenant, and per tenant and flavor held: where preemption looks
        # for victims (per flavor: only those of flavors the claim can use)
        self.victims: dict[str, dict[ClaimKey, _Victim]] = defaultdict(dict)
        self.by_flavor: dict[str, dict[str | None, dict[ClaimKey, _Victim]]] = defaultdict(lambda: defaultdict(dict))
        # priorities of preemptible running claims per tenant: what prefilter() needs, kept instead of
        # scanning every running claim
        self._priorities: dict[str, Counter[int]] = defaultdict(Counter)
        self._last_order = 0  # the most recent allocated_order seen: this cycle's admissions come after it
        self._holdings: dict[ClaimKey, _Holding] = {}  # per running claim (dropped with it)
        self._accepted: dict[tuple[int, str], tuple[Any, frozenset[DeviceKey]]] = {}
        # per tenant: its room per flavor, kept while its cohort's usage and the free capacity other
        # cohorts spilled into stay the same (all a tenant's room depends on)
        self._rooms: dict[str, tuple[int, int, dict[str, int]]] = {}
        self.waiting: dict[ClaimKey, Waiting] = {}
        self._held: set[Running] = set()  # every running claim counted here
        self._queued: set[Waiting] = set()  # every waiting claim in the groups
        self._queue_version: int | None = None  # of the snapshot `_queued` is (QueueChanges), if it had one
        self.groups: dict[tuple[str, int], _Group] = {}
        self.specs: Counter[int] = Counter()  # groups per plan id: a pass that has closed every spec stops
        self.unsized: Counter[str] = Counter()  # per tenant: groups of specs with no fixed size (need a trial)
        # per tenant, each group's head entry with the group, sorted: the pass reads it in order (_Heads)
        self.tenant_heads: dict[str, list[tuple[tuple[int, int, str], tuple[str, int]]]] = defaultdict(list)
        self.group_of: dict[ClaimKey, tuple[str, int] | None] = {}  # None: the claim is Rejected as written
        self.fresh_groups: set[tuple[str, int]] = set()  # groups that may hold claims with no answer yet
        self.invalid: set[ClaimKey] = set()  # claims Rejected as written
        self._plan_facts: dict[int, _PlanFacts] = {}
        # explain: what an index holds, and a spec's capacity per request, kept per fleet version
        self.index_figures: dict[int, tuple[Any, int, dict[str, Any]]] = {}
        self.spec_capacity: dict[int, tuple[Plan, int, list[dict[str, Any]]]] = {}
        self.state = _fleet_state(snapshot, memo, ())  # begin() takes what runs
        self._flavor_filters: dict[str | None, DeviceFilter] = {}
        # (plan, filter) -> the fleet version a Pending answer was given at, and that answer: a deep queue
        # of claims alike costs one placement attempt per fleet change, not one per claim.
        self.failed_at: dict[tuple[int, Any, bool], tuple[Any, Decision]] = {}
        # While the admission pass runs, devices are only taken: a placement that failed stays failed
        # for the rest of the pass, whatever the fleet version (None outside the pass).
        self.shrinking: dict[tuple[int, Any, bool], Decision] | None = None
        self.no_room: set[int] = set()  # in the pass: plans (by id) no node has room for
        self.blocked_at: dict[tuple[str, int], tuple[Any, tuple[Decision, list[Block]]]] = {}
        self.admitted_now: set[ClaimKey] = set()  # admitted in this cycle: never preempted in it
        self.placed_after: dict[int, Decision] = {}  # per plan: its placement once the cycle decided (answer())
        self._victim_view: _VictimTenants | None = None  # dropped whenever a claim is admitted
        self.preemptions: list[Preemption] = []
        self.preempted: set[ClaimKey] = set()
        self.order = itertools.count(1)
        self.plans_cleared = memo.plans_cleared
        self.memo = memo

    def fits(self, snapshot: Snapshot, memo: SelectorMemo) -> bool:
        """Whether this state may be brought up to date for `snapshot` (else a new one is built)."""
        kept = memo.states.get("cycle")
        return (kept is self.state and memo.plans_cleared == self.plans_cleared
                and snapshot.fleet is self.fleet and snapshot.classes is self.snapshot.classes
                and (snapshot.quotas is self.snapshot.quotas or snapshot.quotas == self.snapshot.quotas)
                and dict(snapshot.unusable_nodes) == dict(self.snapshot.unusable_nodes))

    def begin(self, snapshot: Snapshot) -> None:
        """Bring usage, placement state and the queue up to date with the snapshot."""
        self.snapshot = snapshot
        # Claims are compared by identity in bulk (set operations run in C, on identity hashes): only the
        # claims that came, went or were rebuilt cost a Python step.
        running = set(snapshot.running)
        came = {r.key: r for r in sorted(running - self._held, key=_key)}  # a fixed order: ties follow it
        for kept in sorted(self._held - running, key=_key):
            now = came.get(kept.key)
            if now is not None and now.tenant == kept.tenant and now.allocation == kept.allocation:
                self._relabel(kept, now)  # the same devices: only its priority or order may differ
                del came[kept.key]
            else:
                self._drop(kept)
        for now in came.values():
            self._hold(now)
        changes = snapshot.changes
        if changes is not None and changes.since == self._queue_version and (
                moved := self._moved(changes, len(snapshot.waiting))) is not None:
            new, went = moved
            left = {w.key: w for w in went}
            self._queued -= went
            self._queued |= new
        else:
            waiting = set(snapshot.waiting)
            left = {w.key: w for w in self._queued - waiting}
            new = waiting - self._queued
            self._queued = waiting
        self._queue_version = changes.version if changes is not None else None
        for came_back in sorted(new, key=_key):
            before = left.pop(came_back.key, None)
            if (before is not None and before.claim is came_back.claim and before.priority == came_back.priority
                    and before.arrival == came_back.arrival):
                self._answered(came_back)  # the same claim in the same place: only its answer changed
                continue
            if before is not None:
                self._unqueue(before)
            self._enqueue(came_back)
        for gone in left.values():
            self._unqueue(gone)
        if self.memo.plans_cleared != self.plans_cleared:  # ids of dropped plans may come back
            self.plans_cleared = self.memo.plans_cleared
            for cache in (self.failed_at, self.blocked_at, self._plan_facts):
                cache.clear()
        self.admitted_now = set()
        self.placed_after = {}
        self._victim_view = None
        self.preemptions, self.preempted = [], set()
        self.order = itertools.count(self._last_order + 1)

    def _moved(self, changes: QueueChanges, depth: int) -> tuple[set[Waiting], set[Waiting]] | None:
        """The claims that came and went, if they follow on from the queue as this state holds it and add
        up to `depth` claims (else None: the shell's record and this state disagree, so the queues are
        compared in full)."""
        came, went = set(changes.came), set(changes.went)
        queued = self._queued
        if (len(came) == len(changes.came) and len(went) == len(changes.went) and went <= queued
                and queued.isdisjoint(came) and len(queued) - len(went) + len(came) == depth):
            return came, went
        return None

    def _hold(self, running: Running) -> None:
        """A claim runs: its devices are taken, its usage counted, and it is found by node and tenant."""
        self.state.take(running.allocation)
        self._count(running, 1)
        self._relabel(None, running)

    def _relabel(self, kept: Running | None, running: Running) -> None:
        holding = self._holding(running)
        if kept is not None:
            self._held.discard(kept)
            if kept.preemptible:
                self._priorities[kept.tenant][kept.priority] -= 1
                if not running.preemptible:
                    self._unlist(kept, holding)
        self._last_order = max(self._last_order, running.allocated_order)
        self._held.add(running)
        self.running[running.key] = running
        if running.preemptible:
            self._priorities[running.tenant][running.priority] += 1
            victim = _Victim(running, running.allocation.node, holding.units)
            self.victims[running.tenant][running.key] = victim
            pools = self.by_flavor[running.tenant]
            for flavor in holding.flavors:
                pools[flavor][running.key] = victim

    def _unlist(self, running: Running, holding: _Holding) -> None:
        """No longer a victim candidate."""
        del self.victims[running.tenant][running.key]
        pools = self.by_flavor[running.tenant]
        for flavor in holding.flavors:
            del pools[flavor][running.key]

    def _drop(self, running: Running) -> None:
        self.state.give_back(running.allocation)
        self._count(running, -1)
        self._held.discard(running)
        if running.preemptible:
            self._priorities[running.tenant][running.priority] -= 1
            self._unlist(running, self._holding(running))
        del self.running[running.key]
        self._holdings.pop(running.key, None)

    @per_claim
    def _enqueue(self, waiting: Waiting) -> None:
        self.waiting[waiting.key] = waiting
        try:
            plan = self.state.plan(waiting.claim)
            self.state.capacity_version(plan)  # its selectors on every device now: a runtime error rejects it
        except Rejected:
            self.group_of[waiting.key] = None
            self.invalid.add(waiting.key)
            return
        if plan.admin_access and not self.book.config.tenant(waiting.tenant).admin_access:
            self.group_of[waiting.key] = None  # Rejected as its tenant may not send it (see _decide)
            self.invalid.add(waiting.key)
            return
        gid = (waiting.tenant, id(plan))
        group = self.groups.get(gid)
        if group is None or group.plan is not plan:
            if group is not None:  # the id of a plan dropped from the memo came back: a new group
                self._move_head(gid, group.entries[0] if group.entries else None, None)
                self.unsized[waiting.tenant] -= group.facts.least is None
            else:
                self.specs[gid[1]] += 1
            group = self.groups[gid] = _Group(waiting.tenant, plan, self.plan_facts(plan))
            self.unsized[waiting.tenant] += group.facts.least is None
        head = group.entries[0] if group.entries else None
        bisect.insort(group.entries, _entry(waiting))
        self._move_head(gid, head, group.entries[0])
        if not waiting.answered:
            group.fresh.add(waiting.name)
            self.fresh_groups.add(gid)
        self.group_of[waiting.key] = gid

    def _answered(self, now: Waiting) -> None:
        """A waiting claim rebuilt with the same spec, priority and arrival (it was answered, or what
        displaced it changed): its group and place stay; only whether it awaits an answer may change."""
        self.waiting[now.key] = now
        gid = self.group_of.get(now.key)
        group = self.groups.get(gid) if gid is not None else None
        if group is not None:
            if now.answered:
                group.fresh.discard(now.name)
            else:
                group.fresh.add(now.name)
                self.fresh_groups.add(gid)  # type: ignore[arg-type]

    def _unqueue(self, waiting: Waiting) -> None:
        if self.waiting.get(waiting.key) is waiting:
            del self.waiting[waiting.key]
        self.invalid.discard(waiting.key)
        gid = self.group_of.pop(waiting.key, None)
        group = self.groups.get(gid) if gid is not None else None
        if gid is None or group is None:
            return
        entries = group.entries
        head = entries[0]
        at = bisect.bisect_left(entries, _entry(waiting))
        if at < len(entries) and entries[at] == _entry(waiting):
            del entries[at]
        group.fresh.discard(waiting.name)
        self._move_head(gid, head, entries[0] if entries else None)
        if not entries:
            del self.groups[gid]
            self.unsized[gid[0]] -= group.facts.least is None
            self.specs[gid[1]] -= 1
            if not self.specs[gid[1]]:
                del self.specs[gid[1]]

    def _move_head(self, gid: tuple[str, int], old: tuple[int, int, str] | None,
                   new: tuple[int, int, str] | None) -> None:
        if old == new:
            return
        heads = self.tenant_heads[gid[0]]
        if old is not None:
            del heads[bisect.bisect_left(heads, (old, gid))]
        if new is not None:
            bisect.insort(heads, (new, gid))

    def _devices(self, allocation: Allocation) -> list[FleetDevice]:
        by_key = self.fleet.by_key
        return [by_key[k] for k in allocation.keys if k in by_key]

    def _count(self, running: Running, sign: int) -> None:
        for name, n, units in self._holding(running).per_flavor:
            self.book.add(running.tenant, name, sign * units, sign * n)

    def _holding(self, running: Running) -> _Holding:
        """A running claim's devices as quotas and preemption weigh them, worked out once while it runs
        (it is counted when it comes and goes, and weighed each time preemption looks at it)."""
        allocation = running.allocation
        kept = self._holdings.get(running.key)
        if kept is not None and kept.allocation is allocation:
            return kept
        per_flavor: dict[str | None, tuple[int, float]] = {}
        total = 0.0
        of = self.flavors.of
        for d in self._devices(allocation):
            flavor = of(d)
            name = flavor.name if flavor else None
            value = flavor.value if flavor else 0.0
            n, units = per_flavor.get(name, (0, 0.0))
            per_flavor[name] = (n + 1, units + value)
            total += value
        kept = self._holdings[running.key] = _Holding(
            allocation, [(name, n, units) for name, (n, units) in per_flavor.items()], frozenset(per_flavor), total)
        return kept

    def _only(self, flavor: str | None) -> DeviceFilter:
        """Placement restricted to one flavor (None: to devices no flavor counts); one filter object per
        flavor, shared by every tenant, so the indexes behind it are built once."""
        found = self._flavor_filters.get(flavor)
        if found is None:
            names = self.flavors.name_of
            selector = next((f.selector for f in self.snapshot.quotas.flavors if f.name == flavor), "")
            found = self._flavor_filters[flavor] = DeviceFilter(("flavor", flavor, selector),
                                                                lambda d: names(d) == flavor)
        return found

    def _within_nominal(self, tenant: str, deltas: Mapping[str, int]) -> bool:
        return all(self.book.used[(tenant, f)] + n <= self.book.nominal(tenant, f) for f, n in deltas.items())

    @per_claim
    def try_admit(self, waiting: Waiting, *, room_known: bool = False) -> tuple[Decision, list[Block]]:
        """Placement within nominal first, then borrowing; the quota check is on the devices chosen.

        The unrestricted best fit comes first; when it would borrow, the claim is placed on each flavor
        it has nominal quota of, one flavor at a time, then on devices no flavor counts (they take no
        quota), and takes the best fit if none passes; when the best fit is blocked, then also on each
        flavor it may still borrow. When the tenant's quota leaves
        too few devices for any placement, no placement is tried (`room_known`: the caller found it has
        enough just now)."""
        enforced = self.snapshot.quotas.enforced
        if enforced and not room_known and self.quota_short(waiting.tenant, self._facts(waiting)) is not None:
            return _UNANSWERED, []  # no placement needed
        first = self._decide(waiting, None, explain=False)
        if not enforced or first.allocation is None:
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
        relevant, least, unflavored = self._facts(waiting)
        nominal = sorted(self.book.headroom_flavors(tenant) & relevant)
        found = self._first_passing(waiting, nominal, tried, least)
        if found is not None:
            return found, []
        if unflavored:  # devices no flavor counts take no quota: before any borrowing
            decision = self._decide(waiting, self._only(None), explain=False)
            if decision.allocation is not None:
                return decision, []
        if not blocks:
            return first, []  # it borrows, within every limit, and nothing within nominal fits: best fit
        borrowable = [f for f in sorted(relevant) if f not in nominal
                      and self.book.borrowable(tenant, f) > 0
                      and self.book.borrowing(tenant, f) < self.book.borrow_cap(tenant, f)]
        found = self._first_passing(waiting, borrowable, tried, least)
        return (found, []) if found is not None else self._blocked(blocks)

    def _first_passing(self, waiting: Waiting, flavors: Iterable[str], tried: set[str], least: int | None
                       ) -> Decision | None:
        """The first placement on one of `flavors` alone that the tenant's quota lets in."""
        for flavor in flavors:
            if flavor in tried or (least is not None and self.book.room(waiting.tenant, flavor) < least):
                continue  # tried, or its quota cannot hold a placement of the claim
            tried.add(flavor)
            decision = self._decide(waiting, self._only(flavor), explain=False)
            if decision.allocation is None:
                continue
            if not self.book.check(waiting.tenant, _deltas(self._devices(decision.allocation), self.flavors)):
                return decision
        return None

    @staticmethod
    def _blocked(blocks: list[Block]) -> tuple[Decision, list[Block]]:
        reason = "; ".join(b.why for b in blocks)
        return Decision(State.PENDING, reason=f"Quota: {reason}"), blocks

    def quota_short(self, tenant: str, facts: _PlanFacts, *, idle: bool = False) -> int | None:
        """The devices the tenant's quota leaves over every flavor the claim could use when that is fewer
        than any placement of it takes (no flavor-by-flavor placement can pass then); None when it is
        enough, or the claim has no fixed least size (All mode, admin access) or may use devices no
        flavor counts. With `idle`, of each flavor only as many as are idle count too: a placement takes
        no more of a flavor than the tenant's room and the idle devices, so room in a flavor nobody has
        idle and idle devices of a flavor it has no room in do not add up to one.

        Asked before any placement: the arithmetic (on rooms kept per tenant and flavor) costs less than
        a placement, which a claim kept out would waste."""
        flavors, need = facts.flavors, facts.least
        if need is None:
            return None
        book = self.book
        rooms, room_of, unused = self._tenant_rooms(tenant), book.room, book.unused
        total = 0
        for flavor in flavors:
            if idle:
                free = unused.get(flavor, 0)
                if free <= 0:
                    continue  # none idle: no room counts, whatever the quota (so it is not worked out)
            room = rooms.get(flavor)
            if room is None:
                room = rooms[flavor] = room_of(tenant, flavor)
            if idle and free < room:
                room = free
            total += room
            if total >= need:
                return None
        return total

    def _tenant_rooms(self, tenant: str) -> dict[str, int]:
        """The tenant's room per flavor worked out so far, kept while its cohort's usage and the free
        capacity other cohorts spilled into stay the same."""
        book = self.book
        cohort_version, free_version = book.cohort_version(tenant), book.free_version
        kept = self._rooms.get(tenant)
        if kept is None or kept[0] != cohort_version or kept[1] != free_version:
            kept = self._rooms[tenant] = (cohort_version, free_version, {})
        return kept[2]

    def _decide(self, waiting: Waiting, only: DeviceFilter | None, explain: bool) -> Decision:
        """A placement, or a Pending answer cached per plan, filter and fleet version (with its reason
        when `explain`: reasons are worked out only for the answers that are given)."""
        try:
            plan = self.state.plan(waiting.claim)
            if plan.admin_access and not self.book.config.tenant(waiting.tenant).admin_access:
                # before the answers kept per plan: a plan is shared by every tenant that sends its spec
                return Decision(State.REJECTED, reason=ADMIN_ACCESS_REFUSED.format(tenant=waiting.tenant))
            plan_key = (id(plan), only.key if only else None, explain)
            shrinking = self.shrinking
            if shrinking is not None and (known := shrinking.get(plan_key)) is not None:
                return known
            version = self.state.capacity_version(plan, only)  # a selector failing on a new device rejects it
        except Rejected as rejected:
            return Decision(State.REJECTED, reason=str(rejected))
        failed = self.failed_at.get(plan_key)
        if failed is not None and failed[0] == version:
            if shrinking is not None:
                self._failed_in_pass(plan_key, failed[1])
            return failed[1]
        decision = self.state.decide(waiting.claim, only, explain=explain)
        if decision.state is State.PENDING:
            self.failed_at[plan_key] = (version, decision)
            if shrinking is not None:
                self._failed_in_pass(plan_key, decision)
        return decision

    def _failed_in_pass(self, plan_key: tuple[int, Any, bool], decision: Decision) -> None:
        assert self.shrinking is not None
        self.shrinking[plan_key] = decision
        if plan_key[1] is None and not plan_key[2]:
            self.no_room.add(plan_key[0])

    def answer(self, waiting: Waiting, decision: Decision, blocks: list[Block]) -> tuple[Decision, list[Block]]:
        """The answer to give: a Pending answer from the pass carries no reason (a trial's, or
        `_UNANSWERED`), so it is worked out now, against what is free and what quota is left after the cycle."""
        if decision.state is not State.PENDING or decision.reason is not None:
            return decision, blocks
        gid = self.group_of.get(waiting.key)  # its group is of its tenant and plan
        plan_id = gid[1] if gid is not None else None
        explained = self.placed_after.get(plan_id) if plan_id is not None else None
        if explained is None:  # nothing moves once the cycle has decided: one placement per spec
            explained = self._decide(waiting, None, explain=True)
            if plan_id is not None:
                self.placed_after[plan_id] = explained
        if explained.allocation is None:
            return explained, []  # capacity keeps it out
        if self.snapshot.quotas.enforced:  # whichever way the pass found it out, its quota may keep it out now
            blocks = self.book.check(waiting.tenant, _deltas(self._devices(explained.allocation), self.flavors))
            if blocks:
                return self._blocked(blocks)
        # devices freed by this cycle's preemptions, or quota returned by them
        return Decision(State.PENDING, reason="devices or quota were freed in this cycle; it is tried again in the "
                                              "next"), []

    @per_claim
    def settle(self, waiting: Waiting, decision: Decision, blocks: list[Block], alike: Any
               ) -> tuple[Decision, Mapping[str, Any] | None]:
        """The answer a decided claim is given and, when it waits, why (`shared.admission.explain`)."""
        decision, blocks = self.answer(waiting, decision, blocks)
        if decision.state is State.PENDING:
            return decision, explain_pending(self, waiting, decision, blocks, alike)
        return decision, None

    def admit(self, waiting: Waiting, allocation: Allocation) -> None:
        self._hold(Running(waiting.tenant, waiting.name, allocation, waiting.priority, waiting.preemptible,
                           waiting.arrival, next(self.order)))
        self.admitted_now.add(waiting.key)
        self._victim_view = None  # shares moved

    # -- preemption ---------------------------------------------------------------------------------

    def _candidates(self, preemptor: Waiting, hosts: Collection[str]
                    ) -> tuple[dict[str, list[tuple[Running, str]]], dict[str, float]]:
        """Running claims `preemptor` may consider, with the rule that lets it, before checking the
        outcome, per node, and the GPU units they hold on each node (what orders the nodes). Only
        preemptible claims on `hosts` that ran before this cycle, never one that displaced the preemptor
        (no back and forth); in its own tenant those of lower priority ("priority"); in other tenants
        only claims holding a flavor their tenant borrows (any claim in an open fleet): "reclaim" within
        the cohort, for a preemptor with nominal headroom, else "fair-share", from tenants whose share is
        at least the preemptor's (the victim's share after the move must stay at or above)."""
        book, quotas = self.book, self.snapshot.quotas
        enforced = quotas.enforced
        flavors, sized = self._facts(preemptor)[:2]
        least = sized or 0
        values = [f.value for f in quotas.flavors if f.name in flavors]
        # the preemptor's share after the move is at least this; a victim tenant's must stay at or above it
        mine = book.share(preemptor.tenant) + least * min(values, default=0.0) / book.weight(preemptor.tenant)
        cohort = book.cohort_of(preemptor.tenant)
        headroom: bool | None = None
        own_only = self._stuck_on_quota(preemptor)  # a claim its quota keeps out preempts within its tenant
        view = self._victim_tenants()
        on_hosts: dict[str, list[tuple[Running, str]]] = {}
        units_on: dict[str, float] = defaultdict(float)
        # preempted or admitted in this cycle, or displaced the preemptor once (no back and forth)
        spared = self.preempted | self.admitted_now | preemptor.displaced_by
        own = preemptor.tenant
        for tenant, claims, weight, share, tenant_cohort in view.tenants:
            borrowed: frozenset[str | None] | None = None
            if tenant == own:
                rule = "priority"
            elif own_only:
                continue
            elif enforced and tenant_cohort == cohort:
                if headroom is None:  # reclaim keeps the preemptor within its nominal quota
                    room = sum(max(0, book.nominal(preemptor.tenant, f) - book.used[(preemptor.tenant, f)])
                               for f in flavors)
                    headroom = not flavors or room >= max(1, least)
                if not headroom:
                    continue
                rule = "reclaim"
            elif share >= mine:
                rule = "fair-share"
            else:
                continue
            if rule != "priority" and enforced:
                borrowed = view.borrowed(tenant)
                if not borrowed:
                    continue
            # Only claims holding a flavor the preemptor can use could free what it needs (devices or
            # quota), and under reclaim and fair share only one their tenant borrows: those alone are read.
            if sized is None:
                wanted: Collection[str | None] | None = None if borrowed is None else borrowed
            else:
                wanted = flavors if borrowed is None else borrowed & flavors
            if wanted is None:
                pool = claims
            elif len(wanted) == 1:
                pool = self.by_flavor[tenant].get(next(iter(wanted)), _NO_VICTIMS)
            else:  # the tenant's claims per flavor, merged in flavor order (a claim of two flavors once)
                pools = self.by_flavor[tenant]
                pool = {}
                for flavor in sorted(wanted, key=str):
                    if found_pool := pools.get(flavor):
                        pool.update(found_pool)
            for key, (victim, node, units) in pool.items():
                if key in spared or node not in hosts:
                    continue
                if rule == "priority" and victim.priority >= preemptor.priority:
                    continue
                if rule == "fair-share" and share - units / weight < mine:
                    continue
                found = on_hosts.get(node)
                if found is None:
                    on_hosts[node] = [(victim, rule)]
                else:
                    found.append((victim, rule))
                units_on[node] += units
        return on_hosts, units_on

    def _victim_tenants(self) -> _VictimTenants:
        """The tenants that run claims as preemption sees them: the same for every attempt until one
        succeeds (a failed search restores what it tried), so worked out once per success."""
        if self._victim_view is None:
            self._victim_view = _VictimTenants(self.book, self.victims)
        return self._victim_view

    def _stuck_on_quota(self, waiting: Waiting) -> bool:
        """Its quota keeps the claim out whatever other tenants' claims are evicted: only its own tenant's
        claims could give quota back. Either its borrowingLimits stop it, or what it may take now is too
        little and no eviction elsewhere returns any: no cohort member borrows a flavor it could use and
        no cohort has spilled into the free capacity of those flavors."""
        book, tenant = self.book, waiting.tenant
        if not self.snapshot.quotas.enforced:
            return False
        facts = self._facts(waiting)
        flavors, least = facts[0], facts[1] or 0
        if not flavors or least <= 0:
            return False
        if sum(book.room(tenant, f, lent_only=False) for f in flavors) < least:
            return True  # its borrowingLimits stop it, whatever is lent
        if self.quota_short(tenant, facts) is None or any(book.over[f] > 0 for f in flavors):
            return False
        members = book.members[book.cohort_of(tenant)]
        return not any(m != tenant and book.borrowing(m, f) > 0 for m in members for f in flavors)

    def prefilter(self) -> tuple[Callable[[Waiting], bool], Callable[[str], bool], Mapping[str, int]]:
        """A cheap test, built once per pass, of whether a waiting claim has any victim candidate: a
        lower-priority preemptible claim of its own tenant, or a preemptible claim of another tenant
        that borrows (any other tenant in an open fleet) with a larger share than its own, or, whatever
        the shares, of a cohort-mate that borrows while the claim's tenant has nominal headroom (reclaim).
        Also its two halves: whether a tenant could preempt another tenant's claims (by share or
        reclaim), and each tenant's lowest preemptible priority."""
        lowest: dict[str, int] = {}
        shares: dict[str, float] = {}
        enforced = self.snapshot.quotas.enforced
        fresh: dict[str, Counter[int]] = defaultdict(Counter)  # admitted in this cycle: not candidates
        for key in self.admitted_now:
            if (admitted := self.running[key]).preemptible:
                fresh[admitted.tenant][admitted.priority] += 1
        for tenant, counts in self._priorities.items():  # preemptible claims that ran before this cycle
            live = [p for p, n in counts.items() if n - fresh[tenant][p] > 0]
            if not live:
                continue
            lowest[tenant] = min(live)
            if not enforced or self.book.borrowed_count[tenant] > 0:
                shares[tenant] = self.book.share(tenant)
        top = max(shares.values(), default=None)

        # per cohort, its members that borrow and run preemptible claims: reclaim takes from them whatever
        # the shares (a tenant within its nominal quota gets back what it lent; see QuotaBook._available)
        borrowers: dict[str, set[str]] = defaultdict(set)
        if enforced:
            for tenant in lowest:
                if self.book.borrowed_count[tenant] > 0:
                    borrowers[self.book.cohort_of(tenant)].add(tenant)

        def by_reclaim(tenant: str, flavors: frozenset[str] | None = None) -> bool:
            """A cohort-mate borrows and the tenant has nominal headroom (in one of `flavors`)."""
            mates = borrowers.get(self.book.cohort_of(tenant)) if borrowers else None
            if not mates or (len(mates) == 1 and tenant in mates):
                return False
            headroom = self.book.headroom_flavors(tenant)
            return bool(headroom if flavors is None else headroom & flavors)

        def by_fair_share(tenant: str) -> bool:
            mine = self.book.share(tenant)
            if top is None or top < mine:
                return False
            return any(t != tenant and s >= mine for t, s in shares.items())

        def by_share(tenant: str) -> bool:
            """It could preempt another tenant's claims: by fair share or by reclaim."""
            return by_fair_share(tenant) or by_reclaim(tenant)

        stuck: dict[Any, bool] = {}  # per group: its tenant's quota and its spec decide it alike

        def test(waiting: Waiting) -> bool:
            """A claim its quota keeps out may only preempt lower-priority claims of its own tenant."""
            if lowest.get(waiting.tenant, waiting.priority) < waiting.priority:
                return True
            if not (by_fair_share(waiting.tenant) or by_reclaim(waiting.tenant, self._facts(waiting).flavors)):
                return False
            gid = self.group_of.get(waiting.key)
            found = stuck.get(gid)
            if found is None:
                found = stuck[gid] = self._stuck_on_quota(waiting)
            return not found

        return test, by_share, lowest

    def claim_flavors(self, waiting: Waiting) -> frozenset[str]:
        """Flavors of the devices the claim's requests accept at all: the only ones worth trying."""
        return self._facts(waiting).flavors

    def _facts(self, waiting: Waiting) -> _PlanFacts:
        try:
            plan = self.state.plan(waiting.claim)
        except Rejected:
            return _PlanFacts(frozenset(), None)
        return self.plan_facts(plan)

    def plan_facts(self, plan: Plan) -> _PlanFacts:
        """What quota arithmetic needs of a claim's spec, worked out once per plan."""
        found = self._plan_facts.get(id(plan))
        if found is None:
            names: set[str] = set()
            unflavored = False  # some accepted device counts against no flavor: it needs no quota
            for _, alternatives in plan.requests:
                for alternative in alternatives:
                    try:
                        index = self.state.index(alternative)
                    except Rejected:
                        continue  # a subrequest whose selector fails here contributes no flavor
                    for device in index.kinds():
                        if (name := self.flavors.name_of(device)) is not None:
                            names.add(name)
                        else:
                            unflavored = True
            counted = not any(a.all_mode or a.admin_access for v in plan.variants for a in v)
            least = (min((sum(a.wanted for a in v) for v in plan.variants), default=None)
                     if counted and not unflavored else None)
            found = self._plan_facts[id(plan)] = _PlanFacts(frozenset(names), least, unflavored and counted)
        return found

    @per_claim
    def try_preempt(self, waiting: Waiting) -> Decision | None:
        try:  # victims only on nodes with devices the claim's first request accepts
            lead = self.state.plan(waiting.claim).variants[0][0]
            index = self.state.index(lead)
        except (Rejected, IndexError):
            return None
        hosts = index.nodes
        on_hosts, units_on = self._candidates(waiting, hosts)
        best: tuple[tuple[float, int, int], list[tuple[Running, str]], Allocation] | None = None
        tried = 0  # nodes where evicting the candidates could make room, fewest candidate units first
        for _, node in sorted(zip(units_on.values(), units_on, strict=True)):  # fewest units, then name
            if tried == MAX_PREEMPTION_NODES:
                break
            candidates = on_hosts[node]
            accepted = self._accepted_on(index, node)
            if len(accepted) < lead.wanted:
                continue
            could_free = sum(1 for r, _ in candidates for k in r.allocation.keys if k in accepted)
            if len(index.free_on(node)) + could_free < lead.wanted:
                continue  # evicting them cannot make room
            tried += 1
            found = self._victims_on(waiting, sorted(candidates, key=lambda c: self._victim_order(c[0])))
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

    def _accepted_on(self, index: Any, node: str) -> frozenset[DeviceKey]:
        """The keys of the node's devices an index accepts: fixed for the fleet, so kept."""
        key = (id(index), node)
        found = self._accepted.get(key)
        if found is None or found[0] is not index:
            found = self._accepted[key] = (index, frozenset(d.key for d in index.devices_on(node)))
        return found[1]

    def _units(self, r: Running) -> float:
        return self._holding(r).units

    def _victim_order(self, r: Running) -> tuple[float, int, int]:
        return (self._units(r), r.priority, -r.allocated_order)

    def _evict(self, victim: Running) -> None:
        self._drop(victim)
        self.preempted.add(victim.key)

    def _restore(self, victim: Running) -> None:
        self._hold(victim)
        self.preempted.discard(victim.key)

    def _fits_with(self, waiting: Waiting, victims: Sequence[tuple[Running, str]]) -> Allocation | None:
        """With the victims gone, the claim is placed and every victim's rule holds for the outcome."""
        decision, blocks = self.try_admit(waiting)
        if decision.allocation is None or blocks:
            return None
        devices = self._devices(decision.allocation)
        deltas = _deltas(devices, self.flavors)
        units = sum(self.flavors.units_of(d) for d in devices)
        weight = self.book.weight(waiting.tenant)
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
        """Greedy on one node until the claim fits, then drop every victim it does not need.

        A victim is first taken out of the quota book only: while the claim's quota, or the idle devices
        of the flavors it has room in, still keep it out (`quota_short`), no placement can pass, so the
        fleet is not touched (the outcome is the same, for less)."""
        taken: list[tuple[Running, str]] = []
        in_book_only: list[Running] = []
        allocation = None
        facts = self._facts(waiting)
        try:
            for candidate in candidates:
                self._count(candidate[0], -1)
                in_book_only.append(candidate[0])
                taken.append(candidate)
                if self.quota_short(waiting.tenant, facts, idle=True) is not None:
                    continue
                for victim in in_book_only:
                    self._count(victim, 1)
                    self._evict(victim)
                in_book_only.clear()
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
                if victim in in_book_only:
                    self._count(victim, 1)
                else:
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
    (brought up to date by what is in use now); otherwise a new one. Derived data only: placements by
    the same rules as a new state's, without rebuilding every index each cycle (where two nodes score
    the same, which one comes first may differ: it follows the order they last changed in)."""
    kept = memo.states.get("cycle")
    if (isinstance(kept, FleetState) and kept.fleet is snapshot.fleet and kept.classes is snapshot.classes
            and kept.unusable_nodes == dict(snapshot.unusable_nodes)):
        kept.sync(in_use)
        return kept
    state = FleetState(snapshot.fleet, snapshot.classes, in_use, memo=memo, unusable_nodes=snapshot.unusable_nodes)
    memo.states["cycle"] = state
    return state


def _cycle_for(snapshot: Snapshot, memo: SelectorMemo) -> AdmissionState:
    kept = memo.states.get("admission")
    if not (isinstance(kept, AdmissionState) and kept.fits(snapshot, memo)):
        kept = memo.states["admission"] = AdmissionState(snapshot, memo)
    kept.begin(snapshot)
    return kept


_Head = tuple[tuple[int, int, str], tuple[str, int]]  # a group's head entry, and the group


class _Heads:
    """A tenant's group heads during a pass, least first: the heads it started with, read in their
    sorted order (not copied: the kept groups do not change in a pass), merged with a heap of the heads
    that follow admitted ones. A head dropped without a trial (`skip`) costs an iterator step, not a heap
    operation."""

    __slots__ = ("sorted", "at", "pushed")

    def __init__(self, heads: list[_Head]) -> None:
        self.sorted = heads
        self.at = 0
        self.pushed: list[_Head] = []

    def first(self) -> _Head | None:
        if self.at < len(self.sorted):
            head = self.sorted[self.at]
            if not self.pushed or head < self.pushed[0]:
                return head
        return self.pushed[0] if self.pushed else None

    def pop(self) -> _Head:
        head = self.first()
        assert head is not None
        if self.at < len(self.sorted) and head is self.sorted[self.at]:
            self.at += 1
        else:
            heapq.heappop(self.pushed)
        return head

    def push(self, head: _Head) -> None:
        heapq.heappush(self.pushed, head)

    def skip(self, closed: Container[int], dead: Container[tuple[str, int]],
             quota_full: Callable[[tuple[str, int]], bool] | None) -> bool:
        """Drops from the front the heads of specs no node has room for (`closed`, by plan id) and of
        groups whose tenant's quota is too small for them (`dead`, or found so by `quota_full`): both
        stay refused for the rest of the pass. Whether any head was dropped. A dropped head costs a set
        lookup, not a trial or an answer (the pass answers such groups at its end)."""
        ordered, at, pushed = self.sorted, self.at, self.pushed
        start, popped = at, False
        while True:
            bound = pushed[0] if pushed else _LAST
            for head in itertools.islice(ordered, at, None):  # the sorted heads before the least pushed
                if bound < head:
                    break
                gid = head[1]
                if not (gid[1] in closed or gid in dead or (quota_full is not None and quota_full(gid))):
                    self.at = at
                    return popped or at != start
                at += 1
            if not pushed:
                break
            gid = pushed[0][1]  # the least head now
            if not (gid[1] in closed or gid in dead or (quota_full is not None and quota_full(gid))):
                break
            heapq.heappop(pushed)
            popped = True
        self.at = at
        return popped or at != start


_LAST = cast(_Head, ((float("inf"),),))  # compares greater than every head


def _admission_pass(cycle: AdmissionState) -> tuple[list[tuple[Waiting, Decision, list[Block]]], dict[str, int]]:
    """Lowest share first, re-ranked after every admission; within a tenant priority, then arrival.

    Only group heads are tried: a head that fits is admitted and the next claim of its group becomes the
    head; a head that does not fit answers for its whole group. Free devices and quota only shrink while
    the pass admits, so a spec no node has room for is refused for every tenant for the rest of the pass
    (found by a trial, or by counting: fewer devices it accepts are idle than it takes), and so is a group
    whose tenant's quota has too little room for its spec among the idle devices (arithmetic on rooms
    kept per tenant and flavor and idle devices per flavor, cheaper than a trial that would place the
    claim on devices its quota refuses): such heads are dropped without a trial and without
    re-ranking the tenant, and the claims of their groups that have no answer yet are answered at the
    end. Once a tenant is found to have room in no flavor with an idle device, the rest of its heads are
    not looked at (`_OutOfRoom`: in a deep queue a tenant at its quota waits in many groups). Once no
    spec is open the pass stops, and the tenants left only come in order. So a cycle costs
    O(admitted + trials) plus at most a set lookup per group, whatever the depth of the queue. Returns
    what was decided and the order tenants came in (the claims admitted are `cycle.admitted_now`)."""
    heads = {t: _Heads(q) for t, q in cycle.tenant_heads.items() if q}
    position: dict[tuple[str, int], int] = {}  # per group: claims admitted from it so far
    book = cycle.book
    tenants = [(book.share(t), q[0][0][0], q[0][0][1], t) for t, q in cycle.tenant_heads.items() if q]
    heapq.heapify(tenants)
    decided: list[tuple[Waiting, Decision, list[Block]]] = []
    first_seen: dict[str, int] = {}
    admitted = cycle.admitted_now  # so far in this cycle (the kept groups change only in begin())
    no_room = cycle.no_room = set()
    groups = cycle.groups
    quota_dead: set[tuple[str, int]] = set()  # groups their tenant's quota keeps out for the rest of the pass
    # per tenant and flavors a spec accepts: one more than the devices its quota and the idle devices were
    # found to leave over them; as both only shrink in a pass, any spec of as many devices or more over
    # those flavors is kept out too, without the arithmetic
    too_many: dict[tuple[str, frozenset[str]], int] = {}
    # per tenant, the flavors it was found to have no room in (its quota or no idle device): a spec over
    # only those is kept out too, whatever it takes
    no_room_in: dict[str, frozenset[str]] = {}
    quota_full: Callable[[tuple[str, int]], bool] | None = None
    if cycle.snapshot.quotas.enforced:
        quota_short, idle_of = cycle.quota_short, cycle.book.idle
        unused, unsized = book.unused, cycle.unsized

        def quota_full(gid: tuple[str, int]) -> bool:
            facts = groups[gid].facts
            need = facts.least
            if need is None:
                return False
            tenant, flavors = gid[0], facts.flavors
            key = (tenant, flavors)
            bound = too_many.get(key)
            if bound is None or need < bound:
                if flavors <= no_room_in.get(tenant, _NO_FLAVORS):
                    short = 0  # what quota_short would find, for less
                else:
                    found = quota_short(tenant, facts, idle=True)
                    if found is None:
                        return False
                    short = found
                if sum(idle_of(f) for f in flavors) < need:  # no node has room for the spec
                    no_room.add(gid[1])
                    open_specs.discard(gid[1])
                    return True
                too_many[key] = short + 1  # below `bound`: short < need
                if short == 0:
                    out = no_room_in[tenant] = no_room_in.get(tenant, _NO_FLAVORS) | flavors
                    if not unsized[tenant] and all(n <= 0 or f in out for f, n in unused.items()):
                        raise _OutOfRoom  # no flavor with an idle device has room for it: no group fits
            quota_dead.add(gid)
            return True

    tried: set[tuple[str, int]] = set()  # groups a trial answered

    def refuse(tenant: str, gid: tuple[str, int], head: Waiting, decision: Decision, blocks: list[Block]) -> None:
        """The group's answer, for the claims behind the head that have none yet (or all, if Rejected)."""
        group = groups[gid]
        if not head.answered or decision.state is not State.PENDING:
            decided.append((head, decision, blocks))  # an answered claim still Pending keeps its answer
        if decision.state is State.REJECTED:
            rest = group.entries[position.get(gid, 0) + 1:]
        elif group.fresh:
            rest = sorted(_entry(cycle.waiting[(tenant, n)]) for n in group.fresh
                          if n != head.name and (tenant, n) not in admitted)
        else:
            return
        decided.extend((cycle.waiting[(tenant, e[2])], decision, blocks) for e in rest)

    open_specs = set(cycle.specs)  # plan ids of the specs some node may still have room for
    cycle.shrinking = {}  # failed placements (see AdmissionState.shrinking)
    try:
        while tenants:
            if not open_specs:  # no node has room for any spec: every head left would be dropped
                for *_, tenant in sorted(tenants):
                    first_seen.setdefault(tenant, len(first_seen))
                break
            _, _, _, tenant = heapq.heappop(tenants)
            first_seen.setdefault(tenant, len(first_seen))
            queue = heads[tenant]
            try:
                if not queue.skip(no_room, quota_dead, quota_full):  # a head that may fit: tried
                    entry, gid = queue.pop()
                    waiting = cycle.waiting[(tenant, entry[2])]
                    decision, blocks = cycle.try_admit(waiting, room_known=True)
                    if decision.allocation is not None:
                        decided.append((waiting, decision, blocks))
                        cycle.admit(waiting, decision.allocation)
                        at = position[gid] = position.get(gid, 0) + 1
                        if at < len(entries := groups[gid].entries):
                            queue.push((entries[at], gid))
                    else:
                        refuse(tenant, gid, waiting, decision, blocks)
                        tried.add(gid)
                        if gid[1] in no_room:  # the trial found no node with room for the spec
                            open_specs.discard(gid[1])
                        queue.skip(no_room, quota_dead, quota_full)  # dropped without re-ranking the tenant
            except _OutOfRoom:
                continue  # its quota has room for none of its groups: it is not ranked again
            if (top := queue.first()) is not None:
                heapq.heappush(tenants, (book.share(tenant), top[0][0], top[0][1], tenant))
        for tenant, head, gid in _dropped_unanswered(cycle, position, tried):  # quota, a closed spec or out of room
            refuse(tenant, gid, cycle.waiting[(tenant, head[2])], _UNANSWERED, [])
    finally:
        cycle.shrinking, cycle.no_room = None, set()
    return decided, first_seen


def _dropped_unanswered(cycle: AdmissionState, position: Mapping[tuple[str, int], int],
                        tried: Collection[tuple[str, int]]) -> list[tuple[str, tuple[int, int, str], tuple[str, int]]]:
    """The groups the pass dropped without a trial that hold claims with no answer yet, with their heads,
    in tenant order, then head order (the rest of the dropped groups keep their answers)."""
    pending = []
    for gid in list(cycle.fresh_groups):
        group = cycle.groups.get(gid)
        if group is None or not group.fresh:
            cycle.fresh_groups.discard(gid)
        elif gid not in tried and (at := position.get(gid, 0)) < len(group.entries):
            pending.append((gid[0], group.entries[at], gid))
    return sorted(pending)


def _preemptors(cycle: AdmissionState, order: Mapping[str, int]) -> Iterable[Waiting]:
    """Pending claims that have a victim candidate, in fair-share order: tenants in the order the
    admission pass took them, each tenant's claims by priority, then arrival. Per tenant the walk stops
    at the first claim that can preempt nothing, when no claim after it could either."""
    may_preempt, by_share, lowest = cycle.prefilter()
    queued = [t for t, heads in cycle.tenant_heads.items() if heads]
    for tenant in sorted(queued, key=lambda t: (order.get(t, len(order)), t)):
        entries = heapq.merge(*(cycle.groups[gid].entries for _, gid in cycle.tenant_heads[tenant]))
        for entry in entries:
            waiting = cycle.waiting[(tenant, entry[2])]
            if waiting.key in cycle.admitted_now:
                continue
            if may_preempt(waiting):
                done = len(cycle.preemptions)
                yield waiting
                if len(cycle.preemptions) != done:  # shares and candidates moved
                    may_preempt, by_share, lowest = cycle.prefilter()
            elif not by_share(tenant) and -entry[0] <= lowest.get(tenant, -entry[0]):
                break  # the rest have no higher priority, and only priority could let them preempt


def run_cycle(snapshot: Snapshot, memo: SelectorMemo | None = None) -> CycleResult:
    """Admit what fits in fair-share order, then preempt where a rule allows, and explain the rest.

    Decisions cover every claim admitted, Rejected or tried, and every claim without an answer yet;
    a claim that keeps waiting behind a head of its kind keeps its last answer.

    The one guarded place per claim: when deciding a claim fails (`shared.admission.claim_guard`), that claim gets
    its fault's decision and the cycle is decided again without it, on state built anew (what was kept
    may be half updated), so no claim can stop the others."""
    memo = memo or SelectorMemo()
    faulty: dict[ClaimKey, ClaimDecision] = {}
    current = snapshot
    while True:
        try:
            result = _decide_cycle(current, memo)
        except ClaimFault as fault:
            if fault.key in faulty or len(faulty) >= MAX_FAULTS_PER_CYCLE:
                raise  # not one claim's fault: the shell reports the cycle's failure
            decision, internal = fault_decision(fault)
            faulty[fault.key] = ClaimDecision(fault.key[0], fault.key[1], decision, internal_error=internal)
            for kept in ("admission", "cycle"):
                memo.states.pop(kept, None)
            current = replace(snapshot, waiting=tuple(w for w in snapshot.waiting if w.key not in faulty),
                              changes=None)
            continue
        if faulty:
            result = replace(result, decisions=result.decisions + tuple(faulty.values()))
        return result


def _decide_cycle(snapshot: Snapshot, memo: SelectorMemo) -> CycleResult:
    cycle = _cycle_for(snapshot, memo)
    decided, order = _admission_pass(cycle)
    for key in sorted(cycle.invalid):  # claims Rejected as written, or that their tenant may not send
        waiting = cycle.waiting[key]
        decided.append((waiting, cycle._decide(waiting, None, explain=False), []))
    for waiting in itertools.islice(_preemptors(cycle, order), MAX_PREEMPTION_ATTEMPTS):
        preempted = cycle.try_preempt(waiting)
        if preempted is not None:
            decided.append((waiting, preempted, []))
    from shared.admission.explain import Alike

    final = {w.key: (w, d, b) for w, d, b in decided}  # a claim admitted by preemption: its last answer
    results = []
    alike = Alike(sum(sum(c.values()) for c in cycle._priorities.values()))  # preemptible claims running
    flavors: dict[DeviceKey, tuple[str | None, float]] = {}
    for waiting, decision, blocks in final.values():
        decision, detail = cycle.settle(waiting, decision, blocks, alike)
        if decision.allocation is not None:
            for d in cycle._devices(decision.allocation):
                flavors[d.key] = (cycle.flavors.name_of(d), cycle.flavors.units_of(d))
        results.append(ClaimDecision(waiting.tenant, waiting.name, decision, detail))
    return CycleResult(tuple(results), tuple(cycle.preemptions), flavors)
