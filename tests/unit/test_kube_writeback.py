"""The write-back plan for the cluster's claims: one table of situations (what the cluster holds, what the
ledger decided) and the actions that bring the cluster to the ledger, plus the claim's reading and the
pods' gates."""

from __future__ import annotations

from typing import Any

import pytest

from shared.kube_claims.cluster_claim import (
    BROKER_ANNOTATION,
    FINALIZER,
    GATE,
    REASON_ANNOTATION,
    STATE_ANNOTATION,
    TENANT_ANNOTATION,
    Tenancy,
    gated,
    pod_claim_names,
    read_claim,
    submission,
)
from shared.kube_claims.pods import Ungate, Waits, pod_step, said_on
from shared.kube_claims.writeback import (
    AddFinalizer,
    ClearAllocation,
    Evict,
    LedgerClaim,
    Release,
    RemoveFinalizer,
    Say,
    Submit,
    Wait,
    WriteAllocation,
    plan,
    status_allocation,
)

SPEC = {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}
OPEN = Tenancy({}, [])
LEDGER_ALLOCATION = {"nodeName": "node-03", "devices": {"results": [
    {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-03", "device": "gpu-1"}]}}
WRITTEN = status_allocation(LEDGER_ALLOCATION)
POD = {"resource": "pods", "name": "trainer", "uid": "p-1"}


def cluster_claim(*, namespace: str = "vision", name: str = "training-gpu", uid: str = "u-1",
                  brokered: bool = True, finalizer: bool = True, deleting: bool = False,
                  allocation: dict[str, Any] | None = None, reserved: list[dict[str, str]] | None = None,
                  said: tuple[str, str | None] | None = None, spec: Any = SPEC,
                  api_version: str | None = None) -> dict[str, Any]:
    annotations = {BROKER_ANNOTATION: "true"} if brokered else {}
    if said is not None:
        annotations[STATE_ANNOTATION] = said[0]
        if said[1] is not None:
            annotations[REASON_ANNOTATION] = said[1]
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": uid, "resourceVersion": "7",
                            "annotations": annotations, "finalizers": [FINALIZER] if finalizer else []}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-07T06:00:00Z"
    obj: dict[str, Any] = {"metadata": meta, "status": {"allocation": allocation, "reservedFor": reserved or []}}
    if spec is not None:
        obj["spec"] = spec
    if api_version is not None:
        obj["apiVersion"] = api_version
    return obj


def ledger(state: str, *, uid: str | None = "u-1", allocation: dict[str, Any] | None = None,
           reason: str | None = None, by: str | None = None) -> LedgerClaim:
    return LedgerClaim("vision", state, allocation, reason, uid, by)


def kinds(actions: list[Any]) -> list[str]:
    return [type(a).__name__ for a in actions]


CASES = [
    # (what, cluster claim, ledger claim, actions by kind)
    ("new claim: finalizer, then submitted", cluster_claim(finalizer=False), None, ["AddFinalizer", "Submit"]),
    ("finalizer already there: submitted", cluster_claim(), None, ["Submit"]),
    ("released earlier claim of the name: a new submission", cluster_claim(),
     ledger("Released", uid="old"), ["Submit"]),
    ("pending, said: nothing", cluster_claim(said=("Pending", "no room")), ledger("Pending", reason="no room"), []),
    ("pending with a new reason: said", cluster_claim(said=("Pending", "no room")),
     ledger("Pending", reason="quota"), ["Say"]),
    ("allocated: written, then said", cluster_claim(), ledger("Allocated", allocation=LEDGER_ALLOCATION),
     ["WriteAllocation", "Say"]),
    ("allocated and written: nothing", cluster_claim(allocation=WRITTEN, said=("Allocated", None)),
     ledger("Allocated", allocation=LEDGER_ALLOCATION), []),
    ("preempted, a pod reserves it: evicted first", cluster_claim(allocation=WRITTEN, reserved=[POD],
                                                                   said=("Allocated", None)),
     ledger("Preempted", reason="fair share", by="vision/urgent-1"), ["Evict", "Say"]),
    ("preempted, no pod: allocation cleared", cluster_claim(allocation=WRITTEN, said=("Preempted", "fair share")),
     ledger("Preempted", reason="fair share"), ["ClearAllocation"]),
    ("deleted while a pod reserves it: waits", cluster_claim(deleting=True, allocation=WRITTEN, reserved=[POD]),
     ledger("Allocated", allocation=LEDGER_ALLOCATION), ["Wait"]),
    ("deleted: released", cluster_claim(deleting=True, allocation=WRITTEN),
     ledger("Allocated", allocation=LEDGER_ALLOCATION), ["Release", "Wait"]),
    ("deleted and released: finalizer removed", cluster_claim(deleting=True, allocation=WRITTEN),
     ledger("Released"), ["RemoveFinalizer"]),
    ("deleted, never known: finalizer removed", cluster_claim(deleting=True), None, ["RemoveFinalizer"]),
    ("annotation removed: released, then let go", cluster_claim(brokered=False), ledger("Pending"),
     ["Release", "Wait"]),
    ("annotation removed and released: allocation cleared, finalizer removed",
     cluster_claim(brokered=False, allocation=WRITTEN), ledger("Released"), ["ClearAllocation", "RemoveFinalizer"]),
    ("no spec: said, nothing else", cluster_claim(spec=None, finalizer=False), None, ["Say"]),
    ("wrong apiVersion: said, nothing else", cluster_claim(api_version="resource.k8s.io/v1beta1", finalizer=False),
     None, ["Say"]),
    ("a queue claim holds the name: said", cluster_claim(), ledger("Pending", uid=None), ["Say"]),
    ("an earlier incarnation still active: released first", cluster_claim(), ledger("Pending", uid="old"),
     ["Release", "Wait"]),
    ("drift: an allocation the ledger has never seen: cleared, then submitted",
     cluster_claim(allocation=WRITTEN), None, ["ClearAllocation", "Submit"]),
    ("drift: an unknown allocation a pod uses: its pod evicted first", cluster_claim(allocation=WRITTEN,
                                                                                     reserved=[POD]), None, ["Evict"]),
    ("drift: the cluster holds an allocation the ledger does not", cluster_claim(allocation=WRITTEN,
                                                                                   said=("Pending", None)),
     ledger("Pending"), ["ClearAllocation"]),
    ("drift: another allocation written, no pod: cleared, then rewritten", cluster_claim(allocation=status_allocation(
        {"nodeName": "node-09", "devices": {"results": [
            {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-09", "device": "gpu-0"}]}}),
        said=("Allocated", None)), ledger("Allocated", allocation=LEDGER_ALLOCATION),
     ["ClearAllocation", "WriteAllocation"]),
]


@pytest.mark.parametrize(("what", "obj", "ledger_claim", "expected"), CASES, ids=[c[0] for c in CASES])
def test_the_plan_brings_the_cluster_to_the_ledger(what: str, obj: dict[str, Any], ledger_claim: LedgerClaim | None,
                                                   expected: list[str]) -> None:
    assert kinds(plan(read_claim(obj), ledger_claim, OPEN)) == expected


def test_a_plan_carried_out_asks_for_nothing_more() -> None:
    """Level-triggered: the cluster as the plan leaves it plans nothing (no write repeated on a resync)."""
    allocated = ledger("Allocated", allocation=LEDGER_ALLOCATION)
    done = cluster_claim(allocation=WRITTEN, said=("Allocated", None))
    assert plan(read_claim(done), allocated, OPEN) == []


def test_the_written_allocation_is_the_ledgers_less_node_name() -> None:
    actions = plan(read_claim(cluster_claim()), ledger("Allocated", allocation=LEDGER_ALLOCATION), OPEN)
    write = next(a for a in actions if isinstance(a, WriteAllocation))
    assert write.allocation == {
        "devices": {"results": [{"request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-03", "device": "gpu-1"}],
                    "config": []},
        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": ["node-03"]}]}]}}


def test_a_device_still_held_by_a_preempted_claim_in_the_cluster_is_not_written_twice() -> None:
    actions = plan(read_claim(cluster_claim()), ledger("Allocated", allocation=LEDGER_ALLOCATION), OPEN,
                   held_elsewhere=lambda claim, allocation: "vision/low-1")
    assert actions[0] == Wait("claim vision/low-1 still holds its devices in the cluster")
    assert not any(isinstance(a, WriteAllocation) for a in actions)


def test_eviction_names_the_claim_that_preempted() -> None:
    obj = cluster_claim(allocation=WRITTEN, reserved=[POD])
    evict = plan(read_claim(obj), ledger("Preempted", reason="fair share: ...", by="vision/urgent-1"), OPEN)[0]
    assert isinstance(evict, Evict)
    assert [p.name for p in evict.pods] == ["trainer"]
    assert evict.message == "claim vision/training-gpu was preempted by vision/urgent-1"


def test_a_submission_is_the_claim_with_its_uid_and_the_users_broker_annotations_only() -> None:
    obj = cluster_claim(said=("Pending", "x"))
    obj["metadata"]["annotations"]["claimbroker.io/expected-runtime"] = "2h"
    obj["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"] = "{}"
    submit = plan(read_claim(obj), None, OPEN)[0]
    assert isinstance(submit, Submit)
    assert submit.tenant == "vision"
    assert submit.document["metadata"] == {"name": "training-gpu", "namespace": "vision", "uid": "u-1",
                                           "annotations": {BROKER_ANNOTATION: "true",
                                                           "claimbroker.io/expected-runtime": "2h"}}
    assert submit.document["spec"] == SPEC


@pytest.mark.parametrize(("tenancy", "namespace", "tenant"), [
    (Tenancy({}, []), "anyone", "anyone"),  # the open fleet: every namespace is its own tenant
    (Tenancy({}, ["vision"]), "vision", "vision"),
    (Tenancy({}, ["vision"]), "kube-system", None),
    (Tenancy({"ml-prod": "vision"}, ["vision"]), "ml-prod", "vision"),
])
def test_namespaces_map_to_tenants(tenancy: Tenancy, namespace: str, tenant: str | None) -> None:
    assert tenancy.tenant_of(namespace) == tenant


def test_a_namespace_without_a_tenant_is_told_how_to_get_one() -> None:
    problem = submission(read_claim(cluster_claim(namespace="kube-system")), Tenancy({}, ["vision"]))
    assert problem == ("namespace kube-system maps to no tenant of the broker: add tenant kube-system (claimbroker "
                       "quota import, or the admin API) or map the namespace to a tenant "
                       "(CLAIMBROKER_KUBE_NAMESPACES=kube-system=<tenant>)")
    said = plan(read_claim(cluster_claim(namespace="kube-system", said=("Rejected", problem))), None,
                Tenancy({}, ["vision"]))
    assert said == []  # said once, not again


def test_an_invalid_spec_is_said_with_the_parsers_words() -> None:
    obj = cluster_claim(spec={"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": ""}}]}})
    said = plan(read_claim(obj), None, OPEN)
    assert len(said) == 1 and isinstance(said[0], Say) and said[0].state == "Rejected"
    assert said[0].reason is not None and said[0].reason.startswith("the claim is not valid: ")
    assert said[0].event_type == "Warning"


def test_pods_name_their_claims_directly_or_through_templates() -> None:
    pod = {"spec": {"schedulingGates": [{"name": GATE}], "resourceClaims": [
        {"name": "a", "resourceClaimName": "training-gpu"}, {"name": "b", "resourceClaimTemplateName": "t"}]},
        "status": {"resourceClaimStatuses": [{"name": "b", "resourceClaimName": "trainer-b-x7"}]}}
    assert pod_claim_names(pod) == ["training-gpu", "trainer-b-x7"]
    assert gated(pod)
    pod["status"] = {}
    assert pod_claim_names(pod) is None  # the template's claim is not made yet
    assert not gated({"spec": {"schedulingGates": [{"name": "other"}]}})


def test_actions_compare_by_value() -> None:
    assert Release("vision", "a", "u-1") == Release("vision", "a", "u-1")
    assert AddFinalizer("vision") == AddFinalizer("vision") and RemoveFinalizer() == RemoveFinalizer()
    assert ClearAllocation() == ClearAllocation()


def test_a_gated_pod_waits_with_its_first_unallocated_claims_state_then_is_ungated() -> None:
    pod = {"spec": {"schedulingGates": [{"name": GATE}], "resourceClaims": [
        {"name": "a", "resourceClaimName": "training-gpu"}, {"name": "b", "resourceClaimName": "not-ours"}]}}
    pending = read_claim(cluster_claim(said=("Pending", "Insufficient nvidia.com/gpu: requested 1, free 0")))
    waits = pod_step(pod, {"training-gpu": pending}, {"training-gpu", "not-ours"})
    assert waits == Waits("Pending", "claim training-gpu is Pending: Insufficient nvidia.com/gpu: requested 1, free 0")
    assert not said_on(pod, waits)
    pod["status"] = {"conditions": [waits.condition("2026-12-07T07:00:00Z")]}
    assert said_on(pod, waits)  # written once
    assert pod_step(pod, {"training-gpu": read_claim(cluster_claim())}, {"training-gpu", "not-ours"}) == Waits(
        "Submitted", "claim training-gpu is not decided yet")
    # a claim the cluster has not shown yet may be the broker's: the pod is not let through before it is seen
    assert pod_step(pod, {}, {"not-ours"}) == Waits("ClaimNotSeen", "claim training-gpu is not seen yet")
    allocated = read_claim(cluster_claim(allocation=WRITTEN, said=("Allocated", None)))
    not_ours = read_claim(cluster_claim(name="not-ours", brokered=False, finalizer=False))
    assert pod_step(pod, {"training-gpu": allocated, "not-ours": not_ours}, {"training-gpu", "not-ours"}) == Ungate()


def test_the_finalizer_records_the_tenant_and_a_mapping_changed_later_still_finds_the_ledgers_claim() -> None:
    first = plan(read_claim(cluster_claim(namespace="ml-prod", finalizer=False)), None, Tenancy({"ml-prod": "vision"},
                                                                                                 ["vision"]))
    assert first[0] == AddFinalizer("vision")
    taken = cluster_claim(namespace="ml-prod")
    taken["metadata"]["annotations"][TENANT_ANNOTATION] = "vision"
    claim = read_claim(taken)
    unmapped = Tenancy({}, ["vision"])  # the mapping was removed: ml-prod maps to no tenant now
    assert unmapped.tenant_for(claim) == "vision"
    # deleted: released for the tenant it was taken for, not left Allocated in the ledger
    taken["metadata"]["deletionTimestamp"] = "2026-12-07T07:00:00Z"
    leaving = plan(read_claim(taken), ledger("Allocated", allocation=LEDGER_ALLOCATION), unmapped)
    assert leaving[0] == Release("vision", "training-gpu", "u-1")


def test_two_namespaces_of_one_tenant_do_not_release_each_others_claims() -> None:
    """ml-prod/training-gpu holds the ledger's vision/training-gpu; ml-dev/training-gpu must not release it."""
    tenancy = Tenancy({"ml-prod": "vision", "ml-dev": "vision"}, ["vision"])
    dev = read_claim(cluster_claim(namespace="ml-dev", uid="u-dev"))
    prod_row = ledger("Allocated", uid="u-prod", allocation=LEDGER_ALLOCATION)
    actions = plan(dev, prod_row, tenancy, live_claim=lambda uid: "ml-prod/training-gpu" if uid == "u-prod" else None)
    assert len(actions) == 1 and isinstance(actions[0], Say) and actions[0].state == "Rejected"
    assert actions[0].reason == ("tenant vision already has a claim training-gpu, from ml-prod/training-gpu: a "
                                 "tenant's claim names are one set across its namespaces; rename this claim")
    # once ml-prod's claim is gone from the cluster, the earlier row is released for the new one (its own uid)
    again = plan(dev, prod_row, tenancy, live_claim=lambda uid: None)
    assert Release("vision", "training-gpu", "u-prod") in again
