"""The admission state of one fleet, kept across cycles and brought up to date with each snapshot, and
what one cycle did to it. Its parts, one concern each: what runs (holdings), what waits (groups), the quota
room (quota_room), the placement budget (placement_budget), trial admission (trial_admission) and the
answers (answers, explain). The admission pass (passes), the preemption search (preemption) and the cycle
(cycle) work through them.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping

from shared.admission.answers import Answers
from shared.admission.claim_guard import per_claim
from shared.admission.explain import Explainer
from shared.admission.flavors import Flavors
from shared.admission.gang_explain import gang_section
from shared.admission.gangs import WaitingGangs
from shared.admission.groups import WaitingGroups
from shared.admission.holdings import Holdings, VictimTenants
from shared.admission.model import (
    ClaimKey,
    Preemption,
    Running,
    Snapshot,
    Waiting,
)
from shared.admission.past_use import entry_penalty, per_tenant
from shared.admission.placement_budget import PlacementBudget
from shared.admission.quota_book import QuotaBook
from shared.admission.quota_room import QuotaRoom
from shared.admission.trial_admission import TrialAdmission
from shared.dra.allocation import FleetState
from shared.dra.budget import BudgetExceeded
from shared.dra.claims import InvalidClaim, gang_name, gang_of
from shared.dra.matching import SelectorMemo
from shared.dra.plan import Plan
from shared.dra.results import Allocation, Rejected


class AdmissionState:
    """The admission state of one fleet, classes and quotas, kept across cycles and brought up to date
    with each snapshot in O(what changed) (`begin`): usage per tenant and flavor, what runs on each node,
    the waiting claims in groups, and the answers cached per fleet and quota version; and what the cycle
    admitted and preempted so far."""

    def __init__(self, snapshot: Snapshot, memo: SelectorMemo, flavors: Flavors, capacity: Mapping[str, int],
                 placement: FleetState) -> None:
        self.snapshot = snapshot
        self.fleet = snapshot.fleet
        self.flavors = flavors
        self.memo = memo
        self.plans_cleared = memo.plans_cleared
        self.placement = placement  # the fleet's devices in use and its indexes: begin() takes what runs
        self.book = QuotaBook(snapshot.quotas, capacity)
        self.holdings = Holdings(self.fleet, placement, self.book, flavors)
        self.queue = WaitingGroups()
        self.gangs = WaitingGangs()  # gang members wait here, outside the groups
        self.room = QuotaRoom(placement, self.book, flavors)
        self.budget = PlacementBudget(placement, memo, self.queue.unprepared)
        self.trials = TrialAdmission(self.fleet, placement, self.book, flavors, self.room, self.budget)
        self.explainer = Explainer(placement, self.book, self.room, self.queue.group_of,
                                   lambda waiting: gang_section(self.gangs, self.placement, self.fleet, waiting))
        self.answers = Answers(placement, self.book, self.queue, self.trials, self.budget, self.explainer)
        # this cycle's
        self.admitted_now: set[ClaimKey] = set()  # admitted in this cycle: never preempted in it
        self.preemptions: list[Preemption] = []
        self.preempted: set[ClaimKey] = set()
        self.order = itertools.count(1)  # allocated_order of this cycle's admissions
        self._victim_view: VictimTenants | None = None  # dropped whenever a claim is admitted
        self.evicted: dict[ClaimKey, Running] = {}  # this cycle's preempted claims as they ran (an undo restores them)
        self.half_life = snapshot.quotas.half_life
        self._past_from: object = None  # the snapshot's past use the book holds, without this cycle's penalties
        self._take_past(snapshot)

    def fits(self, snapshot: Snapshot, placement: FleetState | None) -> bool:
        """Whether this state may be brought up to date for `snapshot` and the kept fleet state `placement`
        (else a new one is built)."""
        return (placement is self.placement and self.memo.plans_cleared == self.plans_cleared
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
                if self.gangs.members:
                    self.gangs.update(came_back)
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
            self.trials.clear()
            self.room.clear()
        self._take_past(snapshot)
        self.admitted_now = set()
        self.gangs.refused_now = []
        self.answers.new_cycle()
        self._victim_view = None
        self.evicted = {}
        self.preemptions, self.preempted = [], set()
        self.order = itertools.count(self.holdings.last_order + 1)

    def _take_past(self, snapshot: Snapshot) -> None:
        """The book's past use per tenant from the snapshot's (fairSharing.halfLife; none without it),
        taken again when it changed or this state's last cycle added entry penalties to it."""
        if self.half_life <= 0 or snapshot.past_use is self._past_from:
            return
        self.book.past = per_tenant(snapshot.past_use)
        self._past_from = snapshot.past_use

    @per_claim
    def _enqueue(self, waiting: Waiting) -> None:
        queue = self.queue
        queue.waiting[waiting.key] = waiting
        try:
            with self.budget.paying(waiting):
                plan = self.placement.plan(waiting.claim)
                self.placement.capacity_version(plan)  # its selectors on every device now: a runtime error rejects it
                facts = self.room.plan_facts(plan)
        except Rejected:
            queue.refuse(waiting)
            if (lost := gang_name(waiting.claim)) is not None:
                self.gangs.lose(waiting, lost)  # its gang's members name it
            return
        except BudgetExceeded:  # its selectors cost more than its tenant has left: it goes on in the next cycle
            queue.unprepared.setdefault(waiting.key, waiting)
            self.budget.deferred += 1
            return
        queue.unprepared.pop(waiting.key, None)
        if plan.admin_access and not self.book.config.tenant(waiting.tenant).admin_access:
            queue.refuse(waiting)  # Rejected as its tenant may not send it (see TrialAdmission.decide)
            return
        try:
            gang = gang_of(waiting.claim.metadata.annotations)
        except InvalidClaim as invalid:
            self.gangs.invalid[waiting.key] = str(invalid)
            queue.refuse(waiting)
            return
        if gang is not None:  # decided with its gang, as one unit (shared.admission.gang_pass)
            self.gangs.add(waiting, gang)
            return
        queue.add(waiting, plan, facts)

    def _unqueue(self, waiting: Waiting) -> None:
        for kept in (self.memo.plan_of, self.memo.key_of):  # its document goes with it
            if (found := kept.get(id(waiting.claim))) is not None and found[0] is waiting.claim:
                del kept[id(waiting.claim)]
        self.answers.left(waiting)
        if self.gangs.members or self.gangs.invalid:
            self.gangs.remove(waiting)
        plan = self.queue.remove(waiting)
        if plan is not None:
            self._forget(plan)

    def _forget(self, plan: Plan) -> None:
        """No waiting claim has this spec any more: what was kept for it goes (its memory with it)."""
        self.placement.forget(plan)
        self.budget.expensive.discard(id(plan))
        self.room.forget(plan)
        self.explainer.forget(plan)
        self.answers.forget(plan)
        self.trials.forget(plan)

    def admit(self, waiting: Waiting, allocation: Allocation) -> None:
        """The claim runs from now on, in this cycle's order."""
        gangs = self.gangs.members
        gang = gangs[waiting.key][1] if gangs and waiting.key in gangs else None
        self.holdings.hold(Running(waiting.tenant, waiting.name, allocation, waiting.priority, waiting.preemptible,
                           waiting.arrival, next(self.order), gang=gang))
        self.admitted_now.add(waiting.key)
        self._victim_view = None  # shares moved
        if self.half_life > 0:
            self._penalise(waiting, 1)

    def withdraw(self, waiting: Waiting) -> None:
        """A claim admitted in this cycle runs no more: its gang could not be admitted whole."""
        if self.half_life > 0:
            self._penalise(waiting, -1)
        self.holdings.drop(self.holdings.running[waiting.key])
        self.admitted_now.discard(waiting.key)
        self._victim_view = None

    def _penalise(self, waiting: Waiting, sign: int) -> None:
        """The entry penalty (shared/admission/past_use.py): an admission adds its expected past use at once."""
        units = self.holdings.holding(self.holdings.running[waiting.key]).units
        past = self.book.past
        past[waiting.tenant] = past.get(waiting.tenant, 0.0) + sign * entry_penalty(units, self.half_life)
        self._past_from = None  # the next cycle takes its snapshot's past use afresh

    def victim_tenants(self) -> VictimTenants:
        """The tenants that run preemptible claims as preemption sees them: the same for every attempt
        until one succeeds (a failed search restores what it tried), so worked out once per admission."""
        if self._victim_view is None:
            self._victim_view = VictimTenants(self.book, self.holdings.victims)
        return self._victim_view

