"""A ResourceClaim as the cluster holds it, read for the broker: whether it is the broker's to decide, the
tenant its namespace maps to, what is wrong with it, and the claim document the broker's queue takes.

Plain dicts in the API's JSON (camelCase), as the watch delivers them; no Kubernetes client here.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from shared.dra import model as dra

BROKER_ANNOTATION = "claimbroker.io/broker"  # "true": the broker decides this claim
FINALIZER = "claimbroker.io/allocation"  # held while the broker may hold devices for the claim
GATE = "claimbroker.io/allocation"  # a pod's scheduling gate, removed once its broker claims are Allocated
STATE_ANNOTATION = "claimbroker.io/state"  # what the broker last said of the claim ...
REASON_ANNOTATION = "claimbroker.io/reason"  # ... and why: ResourceClaimStatus has no conditions field
# the tenant the claim was submitted for, written with the finalizer: the ledger's claim is found by it even
# when the namespace's mapping changes later (else the ledger would hold its devices for a claim it cannot find)
TENANT_ANNOTATION = "claimbroker.io/tenant"
WRITTEN_ANNOTATIONS = frozenset({STATE_ANNOTATION, REASON_ANNOTATION, TENANT_ANNOTATION})
API_VERSION = dra.API_VERSION


@dataclass(frozen=True)
class Consumer:
    """One entry of status.reservedFor (a pod, as kube-scheduler writes it)."""

    resource: str
    name: str
    uid: str


@dataclass(frozen=True)
class ClusterClaim:
    namespace: str
    name: str
    uid: str
    resource_version: str
    annotations: Mapping[str, str]
    finalizers: tuple[str, ...]
    deleting: bool
    allocation: Mapping[str, Any] | None  # status.allocation as written in the cluster
    reserved_for: tuple[Consumer, ...]
    document: Mapping[str, Any] = field(repr=False, compare=False)

    @property
    def key(self) -> tuple[str, str]:
        return self.namespace, self.name

    @property
    def brokered(self) -> bool:
        return self.annotations.get(BROKER_ANNOTATION) == "true"

    @property
    def recorded_tenant(self) -> str | None:
        """The tenant the broker took the claim for, once it holds its finalizer."""
        return self.annotations.get(TENANT_ANNOTATION) if FINALIZER in self.finalizers else None

    @property
    def said(self) -> tuple[str | None, str | None]:
        """The state and reason the broker last wrote on the claim."""
        return self.annotations.get(STATE_ANNOTATION), self.annotations.get(REASON_ANNOTATION)


def read_claim(obj: Mapping[str, Any]) -> ClusterClaim:
    """The fields the broker acts on; a claim with a broken shape still reads (its problems come from
    `submission`), so the broker can say what is wrong on it."""
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    reserved = tuple(Consumer(str(r.get("resource", "")), str(r.get("name", "")), str(r.get("uid", "")))
                     for r in (status.get("reservedFor") or []) if isinstance(r, Mapping))
    allocation = status.get("allocation")
    return ClusterClaim(
        namespace=str(meta.get("namespace") or ""), name=str(meta.get("name") or ""), uid=str(meta.get("uid") or ""),
        resource_version=str(meta.get("resourceVersion") or ""),
        annotations={str(k): str(v) for k, v in (meta.get("annotations") or {}).items()},
        finalizers=tuple(str(f) for f in (meta.get("finalizers") or [])),
        deleting=meta.get("deletionTimestamp") is not None,
        allocation=allocation if isinstance(allocation, Mapping) else None,
        reserved_for=reserved, document=obj)


@dataclass(frozen=True)
class Tenancy:
    """Which tenant a namespace's claims belong to: an explicit mapping first, then a namespace named as a
    tenant of the ledger; with no tenant in the ledger at all (the open fleet) every namespace is its own.
    A claim already taken keeps the tenant it was taken for (`ClusterClaim.recorded_tenant`)."""

    mapping: Mapping[str, str]
    tenants: Collection[str]

    def tenant_of(self, namespace: str) -> str | None:
        if namespace in self.mapping:
            return self.mapping[namespace]
        if not self.tenants or namespace in self.tenants:
            return namespace
        return None

    def tenant_for(self, claim: ClusterClaim) -> str | None:
        return claim.recorded_tenant or self.tenant_of(claim.namespace)

    def namespaces_of(self, tenant: str) -> list[str]:
        mapped = [ns for ns, t in self.mapping.items() if t == tenant]
        return mapped if mapped else ([tenant] if tenant not in self.mapping else [])


def submission(claim: ClusterClaim, tenancy: Tenancy) -> tuple[str, dict[str, Any]] | str:
    """(tenant, the claim document for the queue), or why the claim cannot be taken, as a sentence.

    The document carries the cluster's uid (so the broker tells this claim from an earlier one of the same
    name) and the `claimbroker.io/` annotations the user wrote (gang, expected runtime), never the ones the
    broker writes back."""
    obj = claim.document
    api_version = obj.get("apiVersion", API_VERSION)  # list items carry none; watch events do
    if api_version != API_VERSION:
        return f"apiVersion {api_version!r} is not {API_VERSION!r}: the broker reads {API_VERSION} ResourceClaims only"
    spec = obj.get("spec")
    if not isinstance(spec, Mapping) or not spec:
        return "the claim has no spec: nothing to allocate (spec.devices.requests lists what it needs)"
    tenant = claim.recorded_tenant or tenancy.tenant_of(claim.namespace)
    if tenant is None:
        return (f"namespace {claim.namespace} maps to no tenant of the broker: add tenant {claim.namespace} "
                f"(claimbroker quota import, or the admin API) or map the namespace to a tenant "
                f"(CLAIMBROKER_KUBE_NAMESPACES={claim.namespace}=<tenant>)")
    annotations = {k: v for k, v in claim.annotations.items()
                   if k.startswith("claimbroker.io/") and k not in WRITTEN_ANNOTATIONS}
    meta: dict[str, Any] = {"name": claim.name, "namespace": tenant, "uid": claim.uid, "annotations": annotations}
    labels = (obj.get("metadata") or {}).get("labels")
    if labels:
        meta["labels"] = dict(labels)
    document = {"apiVersion": API_VERSION, "kind": "ResourceClaim", "metadata": meta, "spec": dict(spec)}
    try:
        dra.parse_claim(document)
    except dra.DocumentError as error:
        return f"the claim is not valid: {error}"
    return tenant, document


def pod_claim_names(pod: Mapping[str, Any]) -> list[str] | None:
    """The ResourceClaims a pod uses, by name (claims made from a template are named in the pod's status once
    the control plane made them); None while a template's claim is not made yet."""
    spec = pod.get("spec") or {}
    made = {s.get("name"): s.get("resourceClaimName")
            for s in ((pod.get("status") or {}).get("resourceClaimStatuses") or []) if isinstance(s, Mapping)}
    names = []
    for ref in spec.get("resourceClaims") or []:
        if not isinstance(ref, Mapping):
            continue
        name = ref.get("resourceClaimName") or made.get(ref.get("name"))
        if not name:
            return None
        names.append(str(name))
    return names


def gated(pod: Mapping[str, Any]) -> bool:
    return any(isinstance(g, Mapping) and g.get("name") == GATE for g in (pod.get("spec") or {}).get("schedulingGates")
               or [])
