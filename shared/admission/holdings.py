"""What running claims hold and what a waiting claim would need: the facts a preemption search weighs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from shared.admission.model import ClaimKey, Running
from shared.admission.quota_book import QuotaBook
from shared.dra.results import Allocation


class PlanFacts(NamedTuple):
    flavors: frozenset[str]  # of the devices the spec's requests accept
    least: int | None  # fewest flavored devices a placement takes; None: All mode, admin access or unflavored
    unflavored: bool = False  # it may be placed on devices no flavor counts (which need no quota) alone


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


NO_FLAVORS: frozenset[str] = frozenset()  # a tenant with room in every flavor so far (admission_pass)


class OutOfRoom(Exception):
    """In the admission pass: the tenant's quota has room in no flavor with an idle device, and every
    spec it waits with has a fixed size, so none of its groups can be admitted for the rest of the pass."""


class VictimTenants:
    """Each tenant that runs preemptible claims with those claims, weight, share and cohort, and (asked
    only under reclaim and fair share) the flavors it borrows."""

    def __init__(self, book: QuotaBook, victims: Mapping[str, dict[ClaimKey, Victim]]) -> None:
        self.book = book
        self.tenants = [(tenant, claims, book.weight(tenant), book.share(tenant), book.cohort_of(tenant))
                        for tenant, claims in victims.items() if claims]
        self._borrowed: dict[str, frozenset[str | None]] = {}

    def borrowed(self, tenant: str) -> frozenset[str | None]:
        found = self._borrowed.get(tenant)
        if found is None:
            found = self._borrowed[tenant] = self.book.borrowed_flavors(tenant)
        return found
