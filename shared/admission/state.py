"""The admission state of one fleet, kept across cycles and brought up to date with each snapshot: trial
admission and answers (the preemption search over it is shared/admission/preemption.py).
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from shared.admission.claim_guard import per_claim
from shared.admission.explain import cut_explanation, explain_pending
from shared.admission.flavors import flavor_deltas, flavors_and_capacity
from shared.admission.groups import Group
from shared.admission.holdings import Holding, PlanFacts, Victim, VictimTenants
from shared.admission.kept import KeptState
from shared.admission.model import (
    ADMIN_ACCESS_REFUSED,
    UNANSWERED,
    Block,
    ClaimKey,
    Preemption,
    QueueChanges,
    Running,
    Snapshot,
    Waiting,
    claim_key,
    queue_entry,
)
from shared.admission.quota_book import QuotaBook
from shared.dra.allocation import FleetState
from shared.dra.budget import CLAIM_BUDGET, CUT_PATIENCE, FLOOR_BUDGET, BudgetExceeded, Meter
from shared.dra.inventory import FleetDevice
from shared.dra.plan import Plan
from shared.dra.results import Allocation, Decision, DeviceFilter, DeviceKey, Rejected, State


class AdmissionState:
    """The admission state of one fleet, classes and quotas, kept across cycles and brought up to date
    with each snapshot in O(what changed): usage per tenant and flavor, what runs on each node, the
    waiting claims in groups, and the answers cached per fleet and quota version."""

    def __init__(self, snapshot: Snapshot, kept: KeptState) -> None:
        memo = kept.memo
        self.snapshot = snapshot
        self.fleet = snapshot.fleet
        self.flavors, capacity = flavors_and_capacity(snapshot, kept)
        self.book = QuotaBook(snapshot.quotas, capacity)
        self.running: dict[ClaimKey, Running] = {}
        # preemptible running claims per tenant, and per tenant and flavor held: where preemption looks
        # for victims (per flavor: only those of flavors the claim can use)
        self.victims: dict[str, dict[ClaimKey, Victim]] = defaultdict(dict)
        self.by_flavor: dict[str, dict[str | None, dict[ClaimKey, Victim]]] = defaultdict(lambda: defaultdict(dict))
        # priorities of preemptible running claims per tenant: what prefilter() needs, kept instead of
        # scanning every running claim
        self._priorities: dict[str, Counter[int]] = defaultdict(Counter)
        self._last_order = 0  # the most recent allocated_order seen: this cycle's admissions come after it
        self._holdings: dict[ClaimKey, Holding] = {}  # per running claim (dropped with it)
        # per tenant: its room per flavor, kept while its cohort's usage and the free capacity other
        # cohorts spilled into stay the same (all a tenant's room depends on)
        self._rooms: dict[str, tuple[int, int, dict[str, int]]] = {}
        self.waiting: dict[ClaimKey, Waiting] = {}
        self._held: set[Running] = set()  # every running claim counted here
        self._queued: set[Waiting] = set()  # every waiting claim in the groups
        self._queue_version: int | None = None  # of the snapshot `_queued` is (QueueChanges), if it had one
        self.groups: dict[tuple[str, int], Group] = {}
        self.specs: Counter[int] = Counter()  # groups per plan id: a pass that has closed every spec stops
        self.unsized: Counter[str] = Counter()  # per tenant: groups of specs with no fixed size (need a trial)
        # per tenant, each group's head entry with the group, sorted: the pass reads it in order (Heads)
        self.tenant_heads: dict[str, list[tuple[tuple[int, int, str], tuple[str, int]]]] = defaultdict(list)
        self.group_of: dict[ClaimKey, tuple[str, int] | None] = {}  # None: the claim is Rejected as written
        self.fresh_groups: set[tuple[str, int]] = set()  # groups that may hold claims with no answer yet
        self.invalid: set[ClaimKey] = set()  # claims Rejected as written
        self._plan_facts: dict[int, PlanFacts] = {}
        # explain: what an index holds, and a spec's capacity per request, kept per fleet version
        self.spec_capacity: dict[int, tuple[Plan, int, list[dict[str, Any]]]] = {}
        self.state = fleet_state(snapshot, kept, ())  # begin() takes what runs
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
        self._victim_view: VictimTenants | None = None  # dropped whenever a claim is admitted
        self.preemptions: list[Preemption] = []
        self.preempted: set[ClaimKey] = set()
        # per waiting claim: when the first claim it could preempt leaves its minRuntime (time, tenant, rule)
        self.preemptible_from: dict[ClaimKey, tuple[float, str, str]] = {}
        self.order = itertools.count(1)
        self.plans_cleared = memo.plans_cleared
        self.memo = memo
        # What deciding claims may cost (shared/dra/budget.py): per tenant and cycle, an allowance its claims
        # share, then a small floor pool for claims that need only what is cached; claims whose last attempt
        # ran out (by plan id) draw on the allowance only, so they wait their turn and cost nobody else.
        self.allowance: dict[str, int] = {}
        self.floor: dict[str, int] = {}
        self.expensive: set[int] = set()
        self.unprepared: dict[ClaimKey, Waiting] = {}  # claims whose plan or indexes are not built yet
        self.cut_answered: set[ClaimKey] = set()  # claims whose answer says their search was cut short
        self.cut_streak: dict[ClaimKey, int] = {}  # per claim: cycles in a row its work was cut short
        self.deferred = 0  # attempts cut short or put off in this cycle: work that goes on in the next
        self._paying: tuple[ClaimKey, Meter] | None = None

    def fits(self, snapshot: Snapshot, kept: KeptState) -> bool:
        """Whether this state may be brought up to date for `snapshot` (else a new one is built)."""
        return (kept.fleet is self.state and kept.memo.plans_cleared == self.plans_cleared
                and snapshot.fleet is self.fleet and snapshot.classes is self.snapshot.classes
                and (snapshot.quotas is self.snapshot.quotas or snapshot.quotas == self.snapshot.quotas)
                and dict(snapshot.unusable_nodes) == dict(self.snapshot.unusable_nodes))

    def begin(self, snapshot: Snapshot) -> None:
        """Bring usage, placement state and the queue up to date with the snapshot."""
        self.snapshot = snapshot
        budget = snapshot.tenant_budget  # a debt (indivisible work done past the allowance) is repaid first
        self.allowance = {t: budget + left for t, left in self.allowance.items() if left < 0}
        self.floor, self.deferred = {}, 0
        # Claims are compared by identity in bulk (set operations run in C, on identity hashes): only the
        # claims that came, went or were rebuilt cost a Python step.
        running = set(snapshot.running)
        came = {r.key: r for r in sorted(running - self._held, key=claim_key)}  # a fixed order: ties follow it
        for kept in sorted(self._held - running, key=claim_key):
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
        for came_back in sorted(new, key=claim_key):
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
        # oldest first, each going on where it stopped and keeping its place until it is done: what one has
        # compiled stays cached while it finishes, where taking turns would let them evict each other's work
        for unprepared in list(self.unprepared.values()):
            if self.allowance_left(unprepared.tenant) > 0:
                self._enqueue(unprepared)
            else:
                self.deferred += 1
        if self.memo.plans_cleared != self.plans_cleared:  # ids of dropped plans may come back
            self.plans_cleared = self.memo.plans_cleared
            for cache in (self.failed_at, self.blocked_at, self._plan_facts):
                cache.clear()
        self.admitted_now = set()
        self.placed_after = {}
        self._victim_view = None
        self.preemptions, self.preempted = [], set()
        self.preemptible_from = {}
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

    def allowance_left(self, tenant: str) -> int:
        return self.allowance.get(tenant, self.snapshot.tenant_budget)

    @contextlib.contextmanager
    def paying(self, waiting: Waiting) -> Iterator[Meter]:
        """Charge the placement work done inside for `waiting` to its tenant: a meter of what is left of the
        tenant's allowance for this cycle (at most CLAIM_BUDGET), else of its floor pool when the claim is not
        known to be expensive. Nested calls for the same claim share the outer meter."""
        if self._paying is not None and self._paying[0] == waiting.key:
            yield self._paying[1]
            return
        tenant = waiting.tenant
        left = self.allowance_left(tenant)
        from_floor = left <= 0
        if from_floor:
            floor = self.floor.get(tenant, self.snapshot.tenant_budget // 4)
            known = waiting.key in self.unprepared or self._known_expensive(waiting)
            limit = 0 if known else min(FLOOR_BUDGET, floor)
        else:
            limit = min(CLAIM_BUDGET, left)
        meter, outer = Meter(limit), self._paying
        self._paying = (waiting.key, meter)
        try:
            with self.state.metered(meter):
                yield meter
        finally:
            self._paying = outer
            if from_floor:
                self.floor[tenant] = self.floor.get(tenant, self.snapshot.tenant_budget // 4) - meter.spent
            else:  # past zero it is a debt (work that could not be split): the next cycles repay it
                self.allowance[tenant] = left - meter.spent

    def _known_expensive(self, waiting: Waiting) -> bool:
        plan = self.memo.plan_of.get(id(waiting.claim))
        return plan is not None and plan[0] is waiting.claim and id(plan[1]) in self.expensive

    def put_off(self, waiting: Waiting) -> Decision | None:
        """A claim known to be expensive whose tenant has spent its allowance for this cycle is not tried:
        its answer says why, and it goes on in a later cycle."""
        if self.allowance_left(waiting.tenant) > 0 or not self._known_expensive(waiting):
            return None
        self.deferred += 1
        return Decision(State.PENDING, reason=self.state.cut_reason(self.state.plan(waiting.claim)), cut=True)

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
            with self.paying(waiting):
                plan = self.state.plan(waiting.claim)
                self.state.capacity_version(plan)  # its selectors on every device now: a runtime error rejects it
                self.plan_facts(plan)
        except Rejected:
            self.group_of[waiting.key] = None
            self.invalid.add(waiting.key)
            return
        except BudgetExceeded:  # its selectors cost more than its tenant has left: it goes on in the next cycle
            self.unprepared.setdefault(waiting.key, waiting)
            self.deferred += 1
            return
        self.unprepared.pop(waiting.key, None)
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
            group = self.groups[gid] = Group(waiting.tenant, plan, self.plan_facts(plan))
            self.unsized[waiting.tenant] += group.facts.least is None
        head = group.entries[0] if group.entries else None
        bisect.insort(group.entries, queue_entry(waiting))
        self._move_head(gid, head, group.entries[0])
        if waiting.key in self.cut_answered:
            group.cut.add(waiting.name)
        if not waiting.answered:
            group.fresh.add(waiting.name)
            self.fresh_groups.add(gid)
        self.group_of[waiting.key] = gid

    def _answered(self, now: Waiting) -> None:
        """A waiting claim rebuilt with the same spec, priority and arrival (it was answered, or what
        displaced it changed): its group and place stay; only whether it awaits an answer may change."""
        self.waiting[now.key] = now
        if now.key in self.unprepared:
            self.unprepared[now.key] = now
        gid = self.group_of.get(now.key)
        group = self.groups.get(gid) if gid is not None else None
        if group is not None:
            if now.answered:
                group.fresh.discard(now.name)
            else:
                group.fresh.add(now.name)
                self.fresh_groups.add(gid)  # type: ignore[arg-type]

    def _unqueue(self, waiting: Waiting) -> None:
        for kept in (self.memo.plan_of, self.memo.key_of):  # its document goes with it
            if (found := kept.get(id(waiting.claim))) is not None and found[0] is waiting.claim:
                del kept[id(waiting.claim)]
        if self.waiting.get(waiting.key) is waiting:
            del self.waiting[waiting.key]
        self.invalid.discard(waiting.key)
        self.unprepared.pop(waiting.key, None)
        self.cut_answered.discard(waiting.key)
        self.cut_streak.pop(waiting.key, None)
        gid = self.group_of.pop(waiting.key, None)
        group = self.groups.get(gid) if gid is not None else None
        if gid is None or group is None:
            return
        entries = group.entries
        head = entries[0]
        at = bisect.bisect_left(entries, queue_entry(waiting))
        if at < len(entries) and entries[at] == queue_entry(waiting):
            del entries[at]
        group.fresh.discard(waiting.name)
        group.cut.discard(waiting.name)
        self._move_head(gid, head, entries[0] if entries else None)
        if not entries:
            del self.groups[gid]
            self.unsized[gid[0]] -= group.facts.least is None
            self.specs[gid[1]] -= 1
            if not self.specs[gid[1]]:
                del self.specs[gid[1]]
                self._forget(group.plan)

    def _forget(self, plan: Plan) -> None:
        """No waiting claim has this spec any more: what was kept for it goes (its memory with it)."""
        self.state.forget(plan)
        self.expensive.discard(id(plan))
        self._plan_facts.pop(id(plan), None)
        self.spec_capacity.pop(id(plan), None)
        self.placed_after.pop(id(plan), None)
        for failed in [k for k in self.failed_at if k[0] == id(plan)]:
            del self.failed_at[failed]
        for blocked in [k for k in self.blocked_at if k[1] == id(plan)]:
            del self.blocked_at[blocked]

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

    def _holding(self, running: Running) -> Holding:
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
        kept = self._holdings[running.key] = Holding(
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
            return UNANSWERED, []  # no placement needed
        put_off = self.put_off(waiting)
        if put_off is not None:
            return put_off, []
        with self.paying(waiting):
            try:
                return self._admit(waiting, enforced)
            except BudgetExceeded:
                self.deferred += 1
                return Decision(State.PENDING, reason=self.state.cut_reason(None), cut=True), []

    def _admit(self, waiting: Waiting, enforced: bool) -> tuple[Decision, list[Block]]:
        first = self._decide(waiting, None, explain=False)
        if not enforced or first.allocation is None:
            return first, []  # an open fleet, capacity (not quota) keeps it out, or its budget ran out
        tenant = waiting.tenant
        plan = self.state.plan(waiting.claim)
        key = (tenant, id(plan))
        stamp = (self.book.cohort_version(tenant), self.book.free_version, self.state.capacity_version(plan))
        cached = self.blocked_at.get(key)
        if cached is not None and cached[0] == stamp:
            return cached[1]  # the same tenant asked for the same and nothing it depends on changed
        result = self._admit_within_quota(waiting, first)
        if result[0].allocation is None and not result[0].cut:
            self.blocked_at[key] = (stamp, result)
        return result

    def _admit_within_quota(self, waiting: Waiting, first: Decision) -> tuple[Decision, list[Block]]:
        assert first.allocation is not None
        tenant = waiting.tenant
        deltas = flavor_deltas(self._devices(first.allocation), self.flavors)
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
            if decision.allocation is not None or decision.cut:
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
            if decision.cut:
                return decision  # its budget ran out: the search goes on in the next cycle
            if decision.allocation is None:
                continue
            if not self.book.check(waiting.tenant, flavor_deltas(self._devices(decision.allocation), self.flavors)):
                return decision
        return None

    @staticmethod
    def _blocked(blocks: list[Block]) -> tuple[Decision, list[Block]]:
        reason = "; ".join(b.why for b in blocks)
        return Decision(State.PENDING, reason=f"Quota: {reason}"), blocks

    def quota_short(self, tenant: str, facts: PlanFacts, *, idle: bool = False) -> int | None:
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
        plan: Plan | None = None
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
        except BudgetExceeded:  # building the indexes of a filter it has not been placed under yet
            self.deferred += 1
            if plan is not None:
                self.expensive.add(id(plan))
            return Decision(State.PENDING, reason=self.state.cut_reason(plan), cut=True)
        failed = self.failed_at.get(plan_key)
        if failed is not None and failed[0] == version:
            if shrinking is not None:
                self._failed_in_pass(plan_key, failed[1])
            return failed[1]
        decision = self.state.decide(waiting.claim, only, explain=explain, meter=self._meter())
        if decision.cut:  # not a verdict: nothing is cached, the search goes on at the next attempt
            self.expensive.add(id(plan))
            self.deferred += 1
            return decision
        self.expensive.discard(id(plan))
        if decision.state is State.PENDING:
            self.failed_at[plan_key] = (version, decision)
            if shrinking is not None:
                self._failed_in_pass(plan_key, decision)
        return decision

    def _meter(self) -> Meter | None:
        """The meter of the claim being paid for (`paying`), if any: else a decision gets its own."""
        return self._paying[1] if self._paying is not None else None

    def _failed_in_pass(self, plan_key: tuple[int, Any, bool], decision: Decision) -> None:
        assert self.shrinking is not None
        self.shrinking[plan_key] = decision
        if plan_key[1] is None and not plan_key[2]:
            self.no_room.add(plan_key[0])

    def answer(self, waiting: Waiting, decision: Decision, blocks: list[Block]) -> tuple[Decision, list[Block]]:
        """The answer to give: a Pending answer from the pass carries no reason (a trial's, or
        `UNANSWERED`), so it is worked out now, against what is free and what quota is left after the cycle."""
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
            blocks = self.book.check(waiting.tenant, flavor_deltas(self._devices(explained.allocation), self.flavors))
            if blocks:
                return self._blocked(blocks)
        # devices freed by this cycle's preemptions, or quota returned by them
        return Decision(State.PENDING, reason="devices or quota were freed in this cycle; it is tried again in the "
                                              "next"), []

    @per_claim
    def settle(self, waiting: Waiting, decision: Decision, blocks: list[Block], alike: Any
               ) -> tuple[Decision, Mapping[str, Any] | None]:
        """The answer a decided claim is given and, when it waits, why (`shared.admission.explain`); the
        work of explaining is its tenant's too, and a claim cut short by its budget is not explained further."""
        if decision.cut:
            return decision, cut_explanation(waiting, decision)
        with self.paying(waiting):
            try:
                return self._settle(waiting, decision, blocks, alike)
            except BudgetExceeded:
                self.deferred += 1
                cut = Decision(State.PENDING, reason=self.state.cut_reason(self._plan_or_none(waiting)), cut=True)
                return cut, cut_explanation(waiting, cut)

    def _plan_or_none(self, waiting: Waiting) -> Plan | None:
        try:
            return self.state.plan(waiting.claim)
        except (Rejected, BudgetExceeded):
            return None

    def _settle(self, waiting: Waiting, decision: Decision, blocks: list[Block], alike: Any
                ) -> tuple[Decision, Mapping[str, Any] | None]:
        decision, blocks = self.answer(waiting, decision, blocks)
        if decision.cut:
            return decision, cut_explanation(waiting, decision)
        if decision.state is State.PENDING:
            if (free := self.preemptible_from.get(waiting.key)) is not None:
                at, tenant, rule = free
                when = datetime.fromtimestamp(at, UTC).strftime("%H:%M:%S")
                decision = replace(decision, reason=f"{decision.reason}; {rule} preemption of {tenant}'s claims "
                                                    f"possible from {when} UTC, when their minRuntime ends")
            return decision, explain_pending(self, waiting, decision, blocks, alike)
        return decision, None

    def answer_due(self, waiting: Waiting, decision: Decision) -> bool:
        """Whether to give this answer now. A decision its budget cut short is given only once the claim's
        work has been cut short CUT_PATIENCE cycles in a row: an ordinary claim whose selectors are new is
        done within a few cycles and never says its search exceeded a budget; an expensive one says so soon.
        Any other answer is due at once."""
        if not decision.cut:
            self.cut_streak.pop(waiting.key, None)
            return True
        streak = self.cut_streak[waiting.key] = self.cut_streak.get(waiting.key, 0) + 1
        return streak >= CUT_PATIENCE

    def answered_with(self, waiting: Waiting, decision: Decision) -> None:
        """Note whether the answer given says the claim's search was cut short (a verdict replaces it)."""
        gid = self.group_of.get(waiting.key)
        group = self.groups.get(gid) if gid is not None else None
        if decision.cut:
            self.cut_answered.add(waiting.key)
            if group is not None:
                group.cut.add(waiting.name)
        elif waiting.key in self.cut_answered:
            self.cut_answered.discard(waiting.key)
            if group is not None:
                group.cut.discard(waiting.name)

    def admit(self, waiting: Waiting, allocation: Allocation) -> None:
        self._hold(Running(waiting.tenant, waiting.name, allocation, waiting.priority, waiting.preemptible,
                           waiting.arrival, next(self.order)))
        self.admitted_now.add(waiting.key)
        self._victim_view = None  # shares moved

    # -- preemption ---------------------------------------------------------------------------------

    def claim_flavors(self, waiting: Waiting) -> frozenset[str]:
        """Flavors of the devices the claim's requests accept at all: the only ones worth trying."""
        return self._facts(waiting).flavors

    def _facts(self, waiting: Waiting) -> PlanFacts:
        try:
            plan = self.state.plan(waiting.claim)
        except Rejected:
            return PlanFacts(frozenset(), None)
        return self.plan_facts(plan)

    def plan_facts(self, plan: Plan) -> PlanFacts:
        """What quota arithmetic needs of a claim's spec, worked out once per plan."""
        found = self._plan_facts.get(id(plan))
        if found is None:  # a step per variant and alternative: a claim may have 256 variants of 32 requests
            self.state.meter.spend(len(plan.variants) + sum(len(alts) for _, alts in plan.requests))
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
            found = self._plan_facts[id(plan)] = PlanFacts(frozenset(names), least, unflavored and counted)
        return found


def fleet_state(snapshot: Snapshot, kept: KeptState, in_use: Sequence[DeviceKey]) -> FleetState:
    """The last cycle's state when the fleet, classes and unusable nodes are the same objects and values
    (brought up to date by what is in use now); otherwise a new one. Derived data only: placements by
    the same rules as a new state's, without rebuilding every index each cycle (where two nodes score
    the same, which one comes first may differ: it follows the order they last changed in)."""
    last = kept.fleet
    if (last is not None and last.fleet is snapshot.fleet and last.classes is snapshot.classes
            and last.unusable_nodes == dict(snapshot.unusable_nodes)):
        last.sync(in_use)
        return last
    kept.fleet = FleetState(snapshot.fleet, snapshot.classes, in_use, memo=kept.memo,
                            unusable_nodes=snapshot.unusable_nodes)
    return kept.fleet


def state_for(snapshot: Snapshot, kept: KeptState) -> AdmissionState:
    """The kept admission state brought up to date for `snapshot`, or a new one."""
    if kept.admission is None or not kept.admission.fits(snapshot, kept):
        kept.admission = AdmissionState(snapshot, kept)
    kept.admission.begin(snapshot)
    return kept.admission
