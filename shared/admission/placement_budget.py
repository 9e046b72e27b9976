"""What deciding claims may cost in one cycle (shared/dra/budget.py), per tenant: an allowance its claims
share, then a small floor pool for claims that need only what is cached. A claim whose last attempt ran out
(its plan is "expensive") draws on the allowance only, so it waits its turn and costs nobody else.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import TracebackType

from shared.admission.model import ClaimKey, Waiting
from shared.dra.allocation import FleetState
from shared.dra.budget import CLAIM_BUDGET, FLOOR_BUDGET, Meter
from shared.dra.matching import SelectorMemo
from shared.dra.results import Decision, State


class PlacementBudget:
    """Each tenant's allowance and floor pool for the cycle, the plans known to be expensive, and the work
    cut short or put off (`deferred`: what goes on in the next cycle)."""

    def __init__(self, placement: FleetState, memo: SelectorMemo, unprepared: Mapping[ClaimKey, Waiting]) -> None:
        self.placement = placement
        self.memo = memo
        self.unprepared = unprepared  # claims whose plan or indexes are not built yet (the queue's)
        self.tenant_budget = 0
        self.allowance: dict[str, int] = {}
        self.floor: dict[str, int] = {}
        self.expensive: set[int] = set()  # plans (by id) whose last attempt ran out of budget
        self.deferred = 0  # attempts cut short or put off in this cycle: work that goes on in the next
        self._paying: tuple[ClaimKey, Meter] | None = None

    def new_cycle(self, tenant_budget: int) -> None:
        """A cycle begins: a debt (indivisible work done past an allowance) is repaid first."""
        self.tenant_budget = tenant_budget
        self.allowance = {t: tenant_budget + left for t, left in self.allowance.items() if left < 0}
        self.floor, self.deferred = {}, 0

    def allowance_left(self, tenant: str) -> int:
        return self.allowance.get(tenant, self.tenant_budget)

    def paying(self, waiting: Waiting) -> _Paying:
        """Charge the placement work done inside for `waiting` to its tenant: a meter of what is left of the
        tenant's allowance for this cycle (at most CLAIM_BUDGET), else of its floor pool when the claim is not
        known to be expensive. Nested calls for the same claim share the outer meter."""
        return _Paying(self, waiting)

    def meter(self) -> Meter | None:
        """The meter of the claim being paid for (`paying`), if any: else a decision gets its own."""
        return self._paying[1] if self._paying is not None else None

    def known_expensive(self, waiting: Waiting) -> bool:
        plan = self.memo.plan_of.get(id(waiting.claim))
        return plan is not None and plan[0] is waiting.claim and id(plan[1]) in self.expensive

    def put_off(self, waiting: Waiting) -> Decision | None:
        """A claim known to be expensive whose tenant has spent its allowance for this cycle is not tried:
        its answer says why, and it goes on in a later cycle."""
        if self.allowance_left(waiting.tenant) > 0 or not self.known_expensive(waiting):
            return None
        self.deferred += 1
        placement = self.placement
        return Decision(State.PENDING, reason=placement.cut_reason(placement.plan(waiting.claim)), cut=True)


class _Paying:
    """PlacementBudget.paying as a plain context manager: it is entered about ten times per claim tried
    (a trial, each flavor, each preemption node), where a generator's context manager cost more than the
    bookkeeping it wraps."""

    __slots__ = ("budget", "waiting", "outer", "meter", "left", "from_floor", "metered")

    def __init__(self, budget: PlacementBudget, waiting: Waiting) -> None:
        self.budget, self.waiting = budget, waiting

    def __enter__(self) -> Meter:
        budget, waiting = self.budget, self.waiting
        outer = self.outer = budget._paying
        if outer is not None and outer[0] == waiting.key:
            self.metered = None  # nested: the outer call charges
            return outer[1]
        tenant = waiting.tenant
        left = self.left = budget.allowance_left(tenant)
        from_floor = self.from_floor = left <= 0
        if from_floor:
            floor = budget.floor.get(tenant, budget.tenant_budget // 4)
            known = waiting.key in budget.unprepared or budget.known_expensive(waiting)
            limit = 0 if known else min(FLOOR_BUDGET, floor)
        else:
            limit = min(CLAIM_BUDGET, left)
        meter = self.meter = Meter(limit)
        budget._paying = (waiting.key, meter)
        metered = self.metered = budget.placement.metered(meter)
        try:
            metered.__enter__()
        except BaseException:
            budget._paying = outer
            raise
        return meter

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
                 ) -> None:
        metered = self.metered
        if metered is None:
            return
        budget = self.budget
        try:
            metered.__exit__(kind, error, trace)
        finally:
            budget._paying = self.outer
            tenant, spent = self.waiting.tenant, self.meter.spent
            if self.from_floor:
                budget.floor[tenant] = budget.floor.get(tenant, budget.tenant_budget // 4) - spent
            else:  # past zero it is a debt (work that could not be split): the next cycles repay it
                budget.allowance[tenant] = self.left - spent
