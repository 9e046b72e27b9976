"""What to do with a pod that carries the broker's scheduling gate: remove the gate once every broker claim it
uses is Allocated in the cluster; until then, say on the pod why it waits (a pod condition, which
`kubectl describe pod` shows beside the scheduler's SchedulingGated)."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from shared.kube_claims.cluster_claim import ClusterClaim, pod_claim_names

CONDITION = "claimbroker.io/ClaimsAllocated"


@dataclass(frozen=True)
class Ungate:
    pass


@dataclass(frozen=True)
class Waits:
    """The pod's condition, to be written where it differs: status False, reason the claim's state."""

    reason: str
    message: str

    def condition(self, now: str) -> dict[str, Any]:
        return {"type": CONDITION, "status": "False", "reason": self.reason, "message": self.message[:32768],
                "lastTransitionTime": now}


def pod_step(pod: Mapping[str, Any], claims: Mapping[str, ClusterClaim], seen: Collection[str]) -> Ungate | Waits:
    """`claims`: the pod's namespace's claims the broker follows, by name; `seen`: the names of all claims of
    that namespace the cluster has shown (a claim not seen yet may be the broker's: its watch event can come
    after the pod's, and a pod let through before would have kube-scheduler allocate it)."""
    names = pod_claim_names(pod)
    if names is None:
        return Waits("ClaimNotMade", "a claim of the pod's ResourceClaimTemplate is not made yet")
    for name in names:
        if name not in seen:
            return Waits("ClaimNotSeen", f"claim {name} is not seen yet")
        claim = claims.get(name)
        if claim is None or not claim.brokered or claim.allocation is not None:
            continue  # not the broker's (kube-scheduler allocates it), or allocated
        state, reason = claim.said
        if state is None:
            return Waits("Submitted", f"claim {name} is not decided yet")
        return Waits(state, f"claim {name} is {state}" + (f": {reason}" if reason else ""))
    return Ungate()


def said_on(pod: Mapping[str, Any], waits: Waits) -> bool:
    """Whether the pod already carries this condition (so it is not written again)."""
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if isinstance(condition, Mapping) and condition.get("type") == CONDITION:
            return (condition.get("status"), condition.get("reason"), condition.get("message")) == (
                "False", waits.reason, waits.message[:32768])
    return False
