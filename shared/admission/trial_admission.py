"""Trial admission: where a waiting claim would be placed and whether its tenant's quota lets it in, within
nominal first, then borrowing, with the placements that failed kept per plan and fleet version.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from shared.admission.claim_guard import per_claim
from shared.admission.flavors import Flavors, flavor_deltas
from shared.admission.holdings import allocated_devices
from shared.admission.model import ADMIN_ACCESS_REFUSED, UNANSWERED, Block, Waiting
from shared.admission.placement_budget import PlacementBudget
from shared.admission.quota_book import QuotaBook
from shared.admission.quota_room import QuotaRoom
from shared.dra.allocation import FleetState
from shared.dra.budget import BudgetExceeded
from shared.dra.inventory import Fleet
from shared.dra.plan import Plan
from shared.dra.results import Allocation, Decision, DeviceFilter, Rejected, State

PlanKey = tuple[int, Any, bool]  # a plan's id, the key of the filter it was placed under, whether explained


def quota_blocked(blocks: list[Block]) -> tuple[Decision, list[Block]]:
    """The Pending answer of a claim its quota keeps out, with the quotas that do."""
    reason = "; ".join(b.why for b in blocks)
    return Decision(State.PENDING, reason=f"Quota: {reason}"), blocks


class TrialAdmission:
    """Places waiting claims under their tenants' quotas, for the admission pass, the preemption search
    and the answers. Pending answers are kept per plan, filter and fleet version (a deep queue of claims
    alike costs one placement attempt per fleet change, not one per claim), and quota refusals per tenant
    and plan while nothing they depend on changes."""

    def __init__(self, fleet: Fleet, placement: FleetState, book: QuotaBook, flavors: Flavors, room: QuotaRoom,
                 budget: PlacementBudget) -> None:
        self.fleet = fleet
        self.placement = placement
        self.book = book
        self.quotas = book.config
        self.flavors = flavors
        self.room = room
        self.budget = budget
        self._flavor_filters: dict[str | None, DeviceFilter] = {}
        # plan key -> the fleet version a Pending answer was given at, and that answer
        self.failed_at: dict[PlanKey, tuple[Any, Decision]] = {}
        # While the admission pass runs, devices are only taken: a placement that failed stays failed
        # for the rest of the pass, whatever the fleet version (None outside the pass).
        self.shrinking: dict[PlanKey, Decision] | None = None
        self.no_room: set[int] = set()  # in the pass: plans (by id) no node has room for
        self.blocked_at: dict[tuple[str, int], tuple[Any, tuple[Decision, list[Block]]]] = {}

    def start_pass(self) -> set[int]:
        """The admission pass begins: from now on failed placements stay failed. The plans (by id) the pass
        finds no node has room for are gathered in the set returned."""
        self.shrinking, self.no_room = {}, set()
        return self.no_room

    def end_pass(self) -> None:
        self.shrinking, self.no_room = None, set()

    def forget(self, plan: Plan) -> None:
        """No waiting claim has this spec any more: the answers kept for it go."""
        for failed in [k for k in self.failed_at if k[0] == id(plan)]:
            del self.failed_at[failed]
        for blocked in [k for k in self.blocked_at if k[1] == id(plan)]:
            del self.blocked_at[blocked]

    def clear(self) -> None:
        """The plans were dropped from the memo: their ids may come back for other plans."""
        self.failed_at.clear()
        self.blocked_at.clear()

    def deltas(self, allocation: Allocation) -> dict[str, int]:
        """The devices per flavor an allocation takes."""
        return flavor_deltas(allocated_devices(self.fleet, allocation), self.flavors)

    @per_claim
    def try_admit(self, waiting: Waiting, *, room_known: bool = False) -> tuple[Decision, list[Block]]:
        """Placement within nominal first, then borrowing; the quota check is on the devices chosen.

        The unrestricted best fit comes first; when it would borrow, the claim is placed on each flavor
        it has nominal quota of, one flavor at a time, then on devices no flavor counts (they take no
        quota), and takes the best fit if none passes; when the best fit is blocked, then also on each
        flavor it may still borrow. When the tenant's quota leaves
        too few devices for any placement, no placement is tried (`room_known`: the caller found it has
        enough just now)."""
        enforced = self.quotas.enforced
        room = self.room
        if enforced and not room_known and room.quota_short(waiting.tenant, room.claim_facts(waiting)) is not None:
            return UNANSWERED, []  # no placement needed
        budget = self.budget
        put_off = budget.put_off(waiting)
        if put_off is not None:
            return put_off, []
        with budget.paying(waiting):
            try:
                return self._admit(waiting, enforced)
            except BudgetExceeded:
                budget.deferred += 1
                return Decision(State.PENDING, reason=self.placement.cut_reason(None), cut=True), []

    def _admit(self, waiting: Waiting, enforced: bool) -> tuple[Decision, list[Block]]:
        first = self.decide(waiting, None, explain=False)
        if not enforced or first.allocation is None:
            return first, []  # an open fleet, capacity (not quota) keeps it out, or its budget ran out
        tenant = waiting.tenant
        plan = self.placement.plan(waiting.claim)
        key = (tenant, id(plan))
        stamp = (self.book.cohort_version(tenant), self.book.free_version, self.placement.capacity_version(plan))
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
        deltas = self.deltas(first.allocation)
        book = self.book
        blocks = book.check(tenant, deltas)
        if not blocks and self.room.within_nominal(tenant, deltas):
            return first, []
        tried = set(deltas) if len(deltas) == 1 else set()
        relevant, least, unflavored = self.room.claim_facts(waiting)
        nominal = sorted(book.headroom_flavors(tenant) & relevant)
        found = self._first_passing(waiting, nominal, tried, least)
        if found is not None:
            return found, []
        if unflavored:  # devices no flavor counts take no quota: before any borrowing
            decision = self.decide(waiting, self._only(None), explain=False)
            if decision.allocation is not None or decision.cut:
                return decision, []
        if not blocks:
            return first, []  # it borrows, within every limit, and nothing within nominal fits: best fit
        borrowable = [f for f in sorted(relevant) if f not in nominal
                      and book.borrowable(tenant, f) > 0
                      and book.borrowing(tenant, f) < book.borrow_cap(tenant, f)]
        found = self._first_passing(waiting, borrowable, tried, least)
        return (found, []) if found is not None else quota_blocked(blocks)

    def _first_passing(self, waiting: Waiting, flavors: Iterable[str], tried: set[str], least: int | None
                       ) -> Decision | None:
        """The first placement on one of `flavors` alone that the tenant's quota lets in."""
        for flavor in flavors:
            if flavor in tried or (least is not None and self.book.room(waiting.tenant, flavor) < least):
                continue  # tried, or its quota cannot hold a placement of the claim
            tried.add(flavor)
            decision = self.decide(waiting, self._only(flavor), explain=False)
            if decision.cut:
                return decision  # its budget ran out: the search goes on in the next cycle
            if decision.allocation is None:
                continue
            if not self.book.check(waiting.tenant, self.deltas(decision.allocation)):
                return decision
        return None

    def _only(self, flavor: str | None) -> DeviceFilter:
        """Placement restricted to one flavor (None: to devices no flavor counts); one filter object per
        flavor, shared by every tenant, so the indexes behind it are built once."""
        found = self._flavor_filters.get(flavor)
        if found is None:
            names = self.flavors.name_of
            selector = next((f.selector for f in self.quotas.flavors if f.name == flavor), "")
            found = self._flavor_filters[flavor] = DeviceFilter(("flavor", flavor, selector),
                                                                lambda d: names(d) == flavor)
        return found

    def decide(self, waiting: Waiting, only: DeviceFilter | None, explain: bool) -> Decision:
        """A placement, or a Pending answer cached per plan, filter and fleet version (with its reason
        when `explain`: reasons are worked out only for the answers that are given)."""
        placement, budget = self.placement, self.budget
        plan: Plan | None = None
        try:
            plan = placement.plan(waiting.claim)
            if plan.admin_access and not self.quotas.tenant(waiting.tenant).admin_access:
                # before the answers kept per plan: a plan is shared by every tenant that sends its spec
                return Decision(State.REJECTED, reason=ADMIN_ACCESS_REFUSED.format(tenant=waiting.tenant))
            plan_key = (id(plan), only.key if only else None, explain)
            shrinking = self.shrinking
            if shrinking is not None and (known := shrinking.get(plan_key)) is not None:
                return known
            version = placement.capacity_version(plan, only)  # a selector failing on a new device rejects it
        except Rejected as rejected:
            return Decision(State.REJECTED, reason=str(rejected))
        except BudgetExceeded:  # building the indexes of a filter it has not been placed under yet
            budget.deferred += 1
            if plan is not None:
                budget.expensive.add(id(plan))
            return Decision(State.PENDING, reason=placement.cut_reason(plan), cut=True)
        failed = self.failed_at.get(plan_key)
        if failed is not None and failed[0] == version:
            if shrinking is not None:
                self._failed_in_pass(plan_key, failed[1])
            return failed[1]
        decision = placement.decide(waiting.claim, only, explain=explain, meter=budget.meter())
        if decision.cut:  # not a verdict: nothing is cached, the search goes on at the next attempt
            budget.expensive.add(id(plan))
            budget.deferred += 1
            return decision
        budget.expensive.discard(id(plan))
        if decision.state is State.PENDING:
            self.failed_at[plan_key] = (version, decision)
            if shrinking is not None:
                self._failed_in_pass(plan_key, decision)
        return decision

    def _failed_in_pass(self, plan_key: PlanKey, decision: Decision) -> None:
        assert self.shrinking is not None
        self.shrinking[plan_key] = decision
        if plan_key[1] is None and not plan_key[2]:
            self.no_room.add(plan_key[0])
