"""What a cycle reads and answers: the snapshot (fleet, classes, quotas, running and waiting claims), its
claims, and the decisions, preemptions and blocks it gives back.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from shared.admission.quota import QuotaConfig
from shared.dra import model as dra
from shared.dra.budget import TENANT_BUDGET
from shared.dra.inventory import Fleet
from shared.dra.results import Allocation, Decision, DeviceKey, State

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
    allocated_at: float | None = None  # seconds since the epoch; None: long enough ago for any minRuntime
    gang: str | None = None  # its claimbroker.io/gang: preemption takes its tenant's members of it together
    expected_runtime: float | None = None  # seconds, its claimbroker.io/expected-runtime: for start estimates

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
    # When the cycle runs (seconds since the epoch), and each tenant's claims preempted for fair share or
    # reclaim in the minute before: what minRuntime and maxPreemptionsPerMinute are checked against. With
    # no `now` (simulate) every claim has run long enough.
    now: float | None = None
    recent_preemptions: Mapping[str, int] = field(default_factory=dict)
    # What one tenant's claims may spend on placement per cycle, in the units of shared/dra/budget.py.
    tenant_budget: int = TENANT_BUDGET
    # Past use at `now`, per (tenant, flavor) in GPU units (shared/admission/past_use.py): with the quotas'
    # fairSharing.halfLife, a tenant's share is its units in use plus its past use, over its weight. The
    # shell keeps it in the ledger (shared/ledger/past_use.py), brought up to `now` with what was held since
    # (past_use.bring_up_to, CycleResult.units_in_use), and hands it over; ignored when half_life is 0.
    past_use: Mapping[tuple[str, str], float] = field(default_factory=dict)


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
    deferred: int = 0  # claims whose placement work ran out of budget: another cycle goes on with it
    # With fairSharing.halfLife: GPU units each tenant holds per flavor once the cycle's admissions and
    # preemptions are applied, what the shell's next past-use step counts as held (past_use.bring_up_to);
    # {} without a half-life.
    units_in_use: Mapping[tuple[str, str], float] = field(default_factory=dict)


@dataclass(frozen=True)
class Block:
    """One quota that keeps a claim out, with the numbers behind it."""

    flavor: str
    requested: int
    nominal: int
    used: int
    borrowing_limit: int | None
    lendable: int  # what the cohort and the free capacity still lend
    borrowed_by: Mapping[str, int]  # who borrows this flavor in the tenant's cohort (in a tree: nearest first)
    why: str
    # In a tree: the nearest cohort whose borrowingLimit binds, its limit, and the limit that would let it in
    cohort_limit: tuple[str, int, int] | None = None

    def to_json(self) -> dict[str, Any]:
        out = {"flavor": self.flavor, "requested": self.requested, "nominal": self.nominal, "used": self.used,
               "borrowingLimit": self.borrowing_limit, "lendable": self.lendable,
               "borrowedBy": dict(self.borrowed_by), "why": self.why}
        if self.cohort_limit is not None:
            cohort, limit, enough = self.cohort_limit
            out["cohortLimit"] = {"cohort": cohort, "borrowingLimit": limit, "enough": enough}
        return out


# A Pending answer without a reason (its quota or the free devices keep the claim out): the reason is worked
# out against what is free and what quota is left after the cycle, if the answer is given (answer()).
UNANSWERED = Decision(State.PENDING)


def claim_key(claim: Running | Waiting) -> ClaimKey:
    return claim.key


def queue_entry(waiting: Waiting) -> tuple[int, int, str]:
    return (-waiting.priority, waiting.arrival, waiting.name)
