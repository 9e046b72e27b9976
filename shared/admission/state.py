"""The admission state of one fleet, kept across cycles and brought up to date with each snapshot: trial
admission and answers (the preemption search over it is shared/admission/preemption.py).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from shared.admission.claim_guard import per_claim
from shared.admission.explain import cut_explanation, explain_pending
from shared.admission.flavors import flavor_deltas, flavors_and_capacity
from shared.admission.groups import WaitingGroups
from shared.admission.holdings import Holdings, VictimTenants, allocated_devices
from shared.admission.kept import KeptState
from shared.admission.model import (
    ADMIN_ACCESS_REFUSED,
    UNANSWERED,
    Block,
    ClaimKey,
    Preemption,
    Running,
    Snapshot,
    Waiting,
)
from shared.admission.placement_budget import PlacementBudget
from shared.admission.quota_book import QuotaBook
from shared.admission.quota_room import QuotaRoom
from shared.dra.allocation import FleetState
from shared.dra.budget import CUT_PATIENCE, BudgetExceeded
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
        self.queue = WaitingGroups()
        # explain: what an index holds, and a spec's capacity per request, kept per fleet version
        self.spec_capacity: dict[int, tuple[Plan, int, list[dict[str, Any]]]] = {}
        self.state = fleet_state(snapshot, kept, ())  # begin() takes what runs
        self.holdings = Holdings(self.fleet, self.state, self.book, self.flavors)
        self.room = QuotaRoom(self.state, self.book, self.flavors)
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
        self.cut_streak: dict[ClaimKey, int] = {}  # per claim: cycles in a row its work was cut short
        self.budget = PlacementBudget(self.state, memo, self.queue.unprepared)

    def fits(self, snapshot: Snapshot, kept: KeptState) -> bool:
        """Whether this state may be brought up to date for `snapshot` (else a new one is built)."""
        return (kept.fleet is self.state and kept.memo.plans_cleared == self.plans_cleared
                and snapshot.fleet is self.fleet and snapshot.classes is self.snapshot.classes
                and (snapshot.quotas is self.snapshot.quotas or snapshot.quotas == self.snapshot.quotas)
                and dict(snapshot.unusable_nodes) == dict(self.snapshot.unusable_nodes))

    def begin(self, snapshot: Snapshot) -> None:
        """Bring usage, placement state and the queue up to date with the snapshot."""
        self.snapshot = snapshot
        budget = self.budget
        budget.new_cycle(snapshot.tenant_budget)
        self.holdings.sync(snapshot.running)
        queue = self.queue
        new, left = queue.changes(snapshot)
        for came_back in new:
            before = left.pop(came_back.key, None)
            if (before is not None and before.claim is came_back.claim and before.priority == came_back.priority
                    and before.arrival == came_back.arrival):
                queue.update(came_back)  # the same claim in the same place: only its answer changed
                continue
            if before is not None:
                self._unqueue(before)
            self._enqueue(came_back)
        for gone in left.values():
            self._unqueue(gone)
        # oldest first, each going on where it stopped and keeping its place until it is done: what one has
        # compiled stays cached while it finishes, where taking turns would let them evict each other's work
        for unprepared in list(queue.unprepared.values()):
            if budget.allowance_left(unprepared.tenant) > 0:
                self._enqueue(unprepared)
            else:
                budget.deferred += 1
        if self.memo.plans_cleared != self.plans_cleared:  # ids of dropped plans may come back
            self.plans_cleared = self.memo.plans_cleared
            for cache in (self.failed_at, self.blocked_at):
                cache.clear()
            self.room.clear()
        self.admitted_now = set()
        self.placed_after = {}
        self._victim_view = None
        self.preemptions, self.preempted = [], set()
        self.preemptible_from = {}
        self.order = itertools.count(self.holdings.last_order + 1)

    @per_claim
    def _enqueue(self, waiting: Waiting) -> None:
        queue = self.queue
        queue.waiting[waiting.key] = waiting
        try:
            with self.budget.paying(waiting):
                plan = self.state.plan(waiting.claim)
                self.state.capacity_version(plan)  # its selectors on every device now: a runtime error rejects it
                facts = self.room.plan_facts(plan)
        except Rejected:
            queue.refuse(waiting)
            return
        except BudgetExceeded:  # its selectors cost more than its tenant has left: it goes on in the next cycle
            queue.unprepared.setdefault(waiting.key, waiting)
            self.budget.deferred += 1
            return
        queue.unprepared.pop(waiting.key, None)
        if plan.admin_access and not self.book.config.tenant(waiting.tenant).admin_access:
            queue.refuse(waiting)  # Rejected as its tenant may not send it (see _decide)
            return
        queue.add(waiting, plan, facts)

    def _unqueue(self, waiting: Waiting) -> None:
        for kept in (self.memo.plan_of, self.memo.key_of):  # its document goes with it
            if (found := kept.get(id(waiting.claim))) is not None and found[0] is waiting.claim:
                del kept[id(waiting.claim)]
        self.cut_streak.pop(waiting.key, None)
        plan = self.queue.remove(waiting)
        if plan is not None:
            self._forget(plan)

    def _forget(self, plan: Plan) -> None:
        """No waiting claim has this spec any more: what was kept for it goes (its memory with it)."""
        self.state.forget(plan)
        self.budget.expensive.discard(id(plan))
        self.room.forget(plan)
        self.spec_capacity.pop(id(plan), None)
        self.placed_after.pop(id(plan), None)
        for failed in [k for k in self.failed_at if k[0] == id(plan)]:
            del self.failed_at[failed]
        for blocked in [k for k in self.blocked_at if k[1] == id(plan)]:
            del self.blocked_at[blocked]

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
        room = self.room
        if enforced and not room_known and room.quota_short(waiting.tenant, room.claim_facts(waiting)) is not None:
            return UNANSWERED, []  # no placement needed
        put_off = self.budget.put_off(waiting)
        if put_off is not None:
            return put_off, []
        with self.budget.paying(waiting):
            try:
                return self._admit(waiting, enforced)
            except BudgetExceeded:
                self.budget.deferred += 1
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
        deltas = flavor_deltas(allocated_devices(self.fleet, first.allocation), self.flavors)
        blocks = self.book.check(tenant, deltas)
        if not blocks and self.room.within_nominal(tenant, deltas):
            return first, []
        tried = set(deltas) if len(deltas) == 1 else set()
        relevant, least, unflavored = self.room.claim_facts(waiting)
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
            deltas = flavor_deltas(allocated_devices(self.fleet, decision.allocation), self.flavors)
            if not self.book.check(waiting.tenant, deltas):
                return decision
        return None

    @staticmethod
    def _blocked(blocks: list[Block]) -> tuple[Decision, list[Block]]:
        reason = "; ".join(b.why for b in blocks)
        return Decision(State.PENDING, reason=f"Quota: {reason}"), blocks

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
            self.budget.deferred += 1
            if plan is not None:
                self.budget.expensive.add(id(plan))
            return Decision(State.PENDING, reason=self.state.cut_reason(plan), cut=True)
        failed = self.failed_at.get(plan_key)
        if failed is not None and failed[0] == version:
            if shrinking is not None:
                self._failed_in_pass(plan_key, failed[1])
            return failed[1]
        decision = self.state.decide(waiting.claim, only, explain=explain, meter=self.budget.meter())
        if decision.cut:  # not a verdict: nothing is cached, the search goes on at the next attempt
            self.budget.expensive.add(id(plan))
            self.budget.deferred += 1
            return decision
        self.budget.expensive.discard(id(plan))
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
        `UNANSWERED`), so it is worked out now, against what is free and what quota is left after the cycle."""
        if decision.state is not State.PENDING or decision.reason is not None:
            return decision, blocks
        gid = self.queue.group_of.get(waiting.key)  # its group is of its tenant and plan
        plan_id = gid[1] if gid is not None else None
        explained = self.placed_after.get(plan_id) if plan_id is not None else None
        if explained is None:  # nothing moves once the cycle has decided: one placement per spec
            explained = self._decide(waiting, None, explain=True)
            if plan_id is not None:
                self.placed_after[plan_id] = explained
        if explained.allocation is None:
            return explained, []  # capacity keeps it out
        if self.snapshot.quotas.enforced:  # whichever way the pass found it out, its quota may keep it out now
            deltas = flavor_deltas(allocated_devices(self.fleet, explained.allocation), self.flavors)
            blocks = self.book.check(waiting.tenant, deltas)
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
        with self.budget.paying(waiting):
            try:
                return self._settle(waiting, decision, blocks, alike)
            except BudgetExceeded:
                self.budget.deferred += 1
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
        self.queue.answered_cut(waiting, decision.cut)

    def admit(self, waiting: Waiting, allocation: Allocation) -> None:
        self.holdings.hold(Running(waiting.tenant, waiting.name, allocation, waiting.priority, waiting.preemptible,
                           waiting.arrival, next(self.order)))
        self.admitted_now.add(waiting.key)
        self._victim_view = None  # shares moved

    # -- preemption ---------------------------------------------------------------------------------

    def victim_tenants(self) -> VictimTenants:
        """The tenants that run preemptible claims as preemption sees them: the same for every attempt
        until one succeeds (a failed search restores what it tried), so worked out once per admission."""
        if self._victim_view is None:
            self._victim_view = VictimTenants(self.book, self.holdings.victims)
        return self._victim_view


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
