"""What the cluster should be told about one of its claims, given what the ledger decided: the broker's
write-back as a pure plan, level-triggered (the same plan comes out however often it is asked, so a restart,
a relist or a missed event is mended by asking again).

The rules (docs/contract.md, "Claims from a Kubernetes cluster"):
- a brokered claim gets the finalizer before it is submitted, so its deletion is always seen;
- an Allocated claim's `status.allocation` is written as the ledger has it, but only once no other claim of
  the cluster still holds one of its devices there (a preempted claim keeps its allocation until its pods
  are gone, and the device must not be prepared twice);
- a claim the ledger does not (or no longer) allocate loses its allocation in the cluster only after no pod
  reserves it: its pods are evicted first;
- a deleted claim (or one whose annotation was removed) is released once no pod reserves it, and its
  finalizer goes once the ledger knows;
- the state and reason are written on the claim (annotations: ResourceClaimStatus has no conditions) and
  as an Event, once per change.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from shared.kube_claims.cluster_claim import FINALIZER, ClusterClaim, Consumer, Tenancy, submission

ACTIVE = frozenset({"Pending", "Allocated", "Preempted"})  # states in which the ledger may hold or give devices
WARNING_STATES = frozenset({"Rejected", "Preempted"})


@dataclass(frozen=True)
class LedgerClaim:
    """The ledger's claim of the same namespace and name. `uid`: the cluster uid its document carries (None
    for a claim that came through the queue); `by`: the claim that preempted it, if preemption ended its
    last allocation."""

    tenant: str
    state: str
    allocation: Mapping[str, Any] | None
    reason: str | None
    uid: str | None
    by: str | None = None


@dataclass(frozen=True)
class AddFinalizer:
    """The finalizer, and the tenant the claim is taken for (an annotation)."""

    tenant: str


@dataclass(frozen=True)
class RemoveFinalizer:
    pass


@dataclass(frozen=True)
class Submit:
    tenant: str
    document: Mapping[str, Any]


@dataclass(frozen=True)
class Release:
    """Release the ledger's claim `name` of `tenant`, the one whose document carries `uid` (the message id is
    per uid: an earlier claim's release and this one's are different messages)."""

    tenant: str
    name: str
    uid: str


@dataclass(frozen=True)
class WriteAllocation:
    allocation: Mapping[str, Any]


@dataclass(frozen=True)
class ClearAllocation:
    pass


@dataclass(frozen=True)
class Evict:
    pods: tuple[Consumer, ...]
    message: str


@dataclass(frozen=True)
class Say:
    """Write `state` and `reason` on the claim and as an Event."""

    state: str
    reason: str | None

    @property
    def event_type(self) -> str:
        return "Warning" if self.state in WARNING_STATES else "Normal"


@dataclass(frozen=True)
class Wait:
    """Nothing to do until something else changes; `why` is for the log."""

    why: str


Action = AddFinalizer | RemoveFinalizer | Submit | Release | WriteAllocation | ClearAllocation | Evict | Say | Wait
HeldElsewhere = Callable[[ClusterClaim, Mapping[str, Any]], str | None]
LiveClaim = Callable[[str], str | None]  # the cluster claim (namespace/name) that carries this uid, if one lives


def status_allocation(allocation: Mapping[str, Any]) -> dict[str, Any]:
    """ResourceClaim.status.allocation from the ledger's allocation (the same shape, less the convenience
    `nodeName`)."""
    devices = allocation.get("devices") or {}
    node = allocation.get("nodeName")
    selector = allocation.get("nodeSelector") or {
        "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}
    return {"devices": {"results": [dict(r) for r in devices.get("results") or []],
                        "config": [dict(c) for c in devices.get("config") or []]},
            "nodeSelector": selector}


def allocated_devices(allocation: Mapping[str, Any] | None) -> set[tuple[str, str, str]]:
    if not allocation:
        return set()
    return {(str(r.get("driver")), str(r.get("pool")), str(r.get("device")))
            for r in (allocation.get("devices") or {}).get("results") or []}


def same_allocation(written: Mapping[str, Any] | None, wanted: Mapping[str, Any]) -> bool:
    """Whether the cluster's allocation is the wanted one (devices and node; what the API server adds, such as
    an allocationTimestamp, does not count)."""
    if written is None:
        return False
    return (allocated_devices(written) == allocated_devices(wanted)
            and written.get("nodeSelector") == wanted.get("nodeSelector"))


def plan(claim: ClusterClaim, ledger: LedgerClaim | None, tenancy: Tenancy,
         held_elsewhere: HeldElsewhere = lambda claim, allocation: None,
         live_claim: LiveClaim = lambda uid: None) -> list[Action]:
    """The actions, in order, that bring the cluster's claim to what the ledger says. `ledger`: the ledger's
    claim of the claim's tenant (`Tenancy.tenant_for`) and name."""
    own = ledger if ledger is not None and ledger.uid == claim.uid else None
    if claim.deleting or not claim.brokered:
        return _leaving(claim, ledger, own)
    taken = submission(claim, tenancy)
    if isinstance(taken, str):
        return [] if claim.said == ("Rejected", taken) else [Say("Rejected", taken)]
    tenant, document = taken
    if own is None and ledger is not None and ledger.state in ACTIVE and ledger.uid is not None:
        holder = live_claim(ledger.uid)
        if holder is not None and holder != f"{claim.namespace}/{claim.name}":  # two namespaces, one tenant
            reason = (f"tenant {tenant} already has a claim {claim.name}, from {holder}: a tenant's claim names are "
                      f"one set across its namespaces; rename this claim")
            return [] if claim.said == ("Rejected", reason) else [Say("Rejected", reason)]
    actions: list[Action] = []
    if FINALIZER not in claim.finalizers:
        actions.append(AddFinalizer(tenant))
    if own is None:
        if claim.allocation is not None:  # an allocation the ledger does not know: removed (after its pods)
            if claim.reserved_for:
                return [*actions, Evict(claim.reserved_for, f"claim {claim.namespace}/{claim.name} holds an "
                                                             "allocation the broker's ledger does not know")]
            actions.append(ClearAllocation())
        if ledger is None or ledger.state not in ACTIVE:
            return [*actions, Submit(tenant, document)]
        if ledger.uid is None:
            reason = (f"a claim {ledger.tenant}/{claim.name} submitted through the queue holds this name "
                      f"({ledger.state}); release it or rename this claim")
            return [*actions, *([] if claim.said == ("Rejected", reason) else [Say("Rejected", reason)])]
        return [*actions, Release(ledger.tenant, claim.name, ledger.uid),
                Wait(f"an earlier claim of this name (uid {ledger.uid}) is released first")]
    actions.extend(_allocation(claim, own, held_elsewhere))
    if claim.said != (own.state, own.reason):
        actions.append(Say(own.state, own.reason))
    return actions


def _allocation(claim: ClusterClaim, own: LedgerClaim, held_elsewhere: HeldElsewhere) -> list[Action]:
    wanted = status_allocation(own.allocation) if own.state == "Allocated" and own.allocation else None
    if wanted is not None and same_allocation(claim.allocation, wanted):
        return []
    actions: list[Action] = []
    if claim.allocation is not None:
        if claim.reserved_for:
            return [Evict(claim.reserved_for, _eviction_message(claim, own))]
        actions.append(ClearAllocation())  # the API server refuses to change a set allocation: clear, then set
    if wanted is None:
        return actions
    holder = held_elsewhere(claim, wanted)
    if holder is not None:
        return [*actions, Wait(f"claim {holder} still holds its devices in the cluster")]
    return [*actions, WriteAllocation(wanted)]


def _leaving(claim: ClusterClaim, ledger: LedgerClaim | None, own: LedgerClaim | None) -> list[Action]:
    """Deleted, or no longer the broker's: released once no pod reserves it, finalizer removed once the
    ledger has let it go."""
    if claim.reserved_for:
        return [Wait(f"{len(claim.reserved_for)} pod(s) still reserve the claim")]
    if own is not None and own.state in ACTIVE:
        return [Release(own.tenant, claim.name, claim.uid), Wait("the ledger releases it")]
    actions: list[Action] = []
    if claim.allocation is not None and not claim.deleting:
        actions.append(ClearAllocation())
    if FINALIZER in claim.finalizers:
        actions.append(RemoveFinalizer())
    return actions


def _eviction_message(claim: ClusterClaim, own: LedgerClaim) -> str:
    """`own.by`: the claim that preempted it, when preemption took its allocation (it may wait as Pending
    again by now)."""
    if own.by:
        return f"claim {claim.namespace}/{claim.name} was preempted by {own.by}"
    why = f": {own.reason}" if own.reason else ""
    if own.state == "Preempted":
        return f"claim {claim.namespace}/{claim.name} was preempted{why}"
    return f"claim {claim.namespace}/{claim.name} is {own.state} in the broker's ledger{why}"
