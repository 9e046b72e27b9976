"""The payloads of the contract's NATS subjects as pydantic models: what tenants, alert subscribers and the
services exchange (docs/contract.md, "NATS subjects"). They are the AsyncAPI document's schemas
(`claimbroker asyncapi`), and tests check that every payload the services build validates against them,
so the document cannot drift from what goes over the bus.

Field names are the wire's (camelCase, as Kubernetes writes them). Models accept fields they do not name
(`extra="allow"`) where the wire may carry more: a ResourceClaim is Kubernetes' own object, which the
allocator validates in full itself (a malformed one gets a Rejected status with the reason, not a refusal
here)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

ClaimState = Literal["Pending", "Allocated", "Rejected", "Preempted", "Released"]
Severity = Literal["critical", "warning", "info"]


class _Wire(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)


class ObjectMeta(_Wire):
    name: str = Field(description="the claim's name: a DNS subdomain, also a token of the status subject")
    namespace: str | None = Field(None, description="the tenant; empty means the subject's tenant")
    annotations: dict[str, str] = Field(default_factory=dict, description=(
        "broker settings: claimbroker.io/priority (integer), claimbroker.io/preemptible (\"false\" protects "
        "a running claim)"))


class ResourceClaim(_Wire):
    """A Kubernetes resource.k8s.io/v1 ResourceClaim, accepted verbatim (spec.devices: requests with
    exactly or firstAvailable, constraints, config)."""

    apiVersion: Literal["resource.k8s.io/v1"] = "resource.k8s.io/v1"
    kind: Literal["ResourceClaim"] = "ResourceClaim"
    metadata: ObjectMeta
    spec: dict[str, Any] = Field(description="ResourceClaimSpec: devices.requests, devices.constraints, "
                                             "devices.config, as Kubernetes defines them")


class Release(_Wire):
    """Give back an allocated claim, or withdraw a waiting one."""

    name: str = Field(description="the claim's name, in the subject's tenant")


class DeviceResult(_Wire):
    request: str = Field(description="the request's name; parent/sub for a firstAvailable subrequest")
    driver: str
    pool: str
    device: str
    adminAccess: bool | None = None


class AllocatedDevices(_Wire):
    results: list[DeviceResult]
    config: list[dict[str, Any]] = Field(default_factory=list)


class Allocation(_Wire):
    """Mirrors ResourceClaim.status.allocation, plus nodeName."""

    nodeName: str
    devices: AllocatedDevices
    nodeSelector: dict[str, Any] | None = None


class ClaimStatus(_Wire):
    """A claim's state after each decision; the last one per claim is its current state."""

    namespace: str = Field(description="the tenant")
    name: str
    state: ClaimState
    allocation: Allocation | None = None
    reason: str | None = Field(None, description="why it waits, was rejected or preempted, with the numbers")
    observedAt: str = Field(description="RFC 3339 time of the decision")
    sequence: int = Field(description="per claim, increasing: a consumer keeps the highest it has seen")
    by: str | None = Field(None, description="tenant/name of the claim that preempted it (Preempted only)")
    unsatisfiable: bool | None = Field(None, description="no device of today's fleet could ever satisfy it")


class Alert(_Wire):
    """One alert message: raised (resolved false), folded repeats counted, then resolved."""

    kind: str = Field(description="claim-rejected, claim-pending-too-long, claim-unsatisfiable, "
                                  "quota-near-limit, claim-preempted, node-lost, inventory-stale, "
                                  "device-unhealthy, device-throttled, idle-larger-flavor, invalid-message, "
                                  "service-degraded, ...")
    severity: Severity
    key: str = Field(description="the condition: kind plus tenant/claim/node")
    tenant: str | None = Field(default=None, description="the tenant it is about (the subject's last token), "
                                                         "null for the fleet's (_fleet there)")
    summary: str
    details: dict[str, Any]
    labels: dict[str, str]
    firstSeen: str
    lastSeen: str
    count: int
    resolved: bool


class NodeInventory(_Wire):
    """A node's full inventory; the stream keeps the last one per node."""

    node: str
    sequence: int = Field(description="increasing per node: an older message arriving late is ignored")
    observedAt: str
    observedAtUnix: float
    removed: bool = Field(description="the node is gone (then slices is empty)")
    labels: dict[str, str]
    telemetry: dict[str, Any] = Field(description="per device: temperature, throttle reasons, ECC errors")
    slices: list[dict[str, Any]] = Field(description="resource.k8s.io/v1 ResourceSlices of the node")
