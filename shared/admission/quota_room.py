"""A tenant's room under its quota, per flavor, and what quota arithmetic needs of a claim's spec: enough
to tell, before any placement, that a claim cannot be let in (the arithmetic costs less than a placement).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from shared.admission.flavors import Flavors
from shared.admission.model import Waiting
from shared.admission.quota_book import QuotaBook
from shared.dra.allocation import FleetState
from shared.dra.plan import Plan
from shared.dra.results import Rejected


class PlanFacts(NamedTuple):
    flavors: frozenset[str]  # of the devices the spec's requests accept
    least: int | None  # fewest flavored devices a placement takes; None: All mode, admin access or unflavored
    unflavored: bool = False  # it may be placed on devices no flavor counts (which need no quota) alone


NO_FACTS = PlanFacts(frozenset(), None)  # of a claim whose spec is Rejected


class QuotaRoom:
    """The facts of each spec, worked out once per plan, and each tenant's room per flavor, kept while its
    cohort's usage and the free capacity other cohorts spilled into stay the same (all it depends on)."""

    def __init__(self, placement: FleetState, book: QuotaBook, flavors: Flavors) -> None:
        self.placement = placement
        self.book = book
        self.flavors = flavors
        self._rooms: dict[str, tuple[int, int, dict[str, int]]] = {}  # per tenant: versions, room per flavor
        self._plan_facts: dict[int, PlanFacts] = {}

    def forget(self, plan: Plan) -> None:
        self._plan_facts.pop(id(plan), None)

    def clear(self) -> None:
        """The plans were dropped from the memo: their ids may come back for other plans."""
        self._plan_facts.clear()

    def claim_facts(self, waiting: Waiting) -> PlanFacts:
        """The facts of the claim's spec (none for a claim Rejected as written)."""
        try:
            plan = self.placement.plan(waiting.claim)
        except Rejected:
            return NO_FACTS
        return self.plan_facts(plan)

    def plan_facts(self, plan: Plan) -> PlanFacts:
        """What quota arithmetic needs of a claim's spec, worked out once per plan."""
        found = self._plan_facts.get(id(plan))
        if found is None:  # a step per variant and alternative: a claim may have 256 variants of 32 requests
            placement = self.placement
            placement.meter.spend(len(plan.variants) + sum(len(alts) for _, alts in plan.requests))
            names: set[str] = set()
            unflavored = False  # some accepted device counts against no flavor: it needs no quota
            for _, alternatives in plan.requests:
                for alternative in alternatives:
                    try:
                        index = placement.index(alternative)
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

    def within_nominal(self, tenant: str, deltas: Mapping[str, int]) -> bool:
        """Whether taking `deltas` (devices per flavor) keeps the tenant within its nominal quota."""
        book = self.book
        return all(book.used[(tenant, f)] + n <= book.nominal(tenant, f) for f, n in deltas.items())

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
