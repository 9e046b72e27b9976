"""resource.k8s.io/v1 objects and what is said about them, in one namespace (`from shared.dra import model as
dra`): the models and their limits (shared.dra.v1), parsing a document into one (shared.dra.parse), the API
server's rules for a claim (shared.dra.claim_rules), Kubernetes' rules for names (shared.dra.names) and how a
document's problems are told (shared.dra.problems). None of those imports this module, so it gathers them
without a circle.
"""

from __future__ import annotations

from shared.dra.claim_rules import claim_problems
from shared.dra.names import DNS_LABEL_RULE, DNS_SUBDOMAIN_RULE, is_dns_label, is_dns_subdomain
from shared.dra.parse import parse_claim, parse_object, share_fields_sets
from shared.dra.problems import DocumentError, joined, shown, text_problem, text_problems
from shared.dra.v1 import (
    API_VERSION,
    MAX_CEL_LENGTH,
    MAX_DEVICES_PER_CLAIM,
    MAX_REQUESTS,
    MAX_SELECTORS,
    MAX_SUBREQUESTS,
    CapacityRequirements,
    CELSelector,
    ClaimMeta,
    CounterSet,
    Device,
    DeviceAttribute,
    DeviceCapacity,
    DeviceClaim,
    DeviceClaimConfiguration,
    DeviceClass,
    DeviceClassConfiguration,
    DeviceClassSpec,
    DeviceConstraint,
    DeviceCounterConsumption,
    DeviceRequest,
    DeviceSelector,
    DeviceSubRequest,
    DeviceTaint,
    ExactDeviceRequest,
    ObjectMeta,
    OpaqueConfig,
    ResourceClaim,
    ResourceClaimSpec,
    ResourcePool,
    ResourceSlice,
    ResourceSliceSpec,
    Toleration,
)

__all__ = [
    "API_VERSION", "DNS_LABEL_RULE", "DNS_SUBDOMAIN_RULE", "MAX_CEL_LENGTH", "MAX_DEVICES_PER_CLAIM", "MAX_REQUESTS",
    "MAX_SELECTORS", "MAX_SUBREQUESTS", "CELSelector", "CapacityRequirements", "ClaimMeta", "CounterSet", "Device",
    "DeviceAttribute", "DeviceCapacity", "DeviceClaim", "DeviceClaimConfiguration", "DeviceClass",
    "DeviceClassConfiguration", "DeviceClassSpec", "DeviceConstraint", "DeviceCounterConsumption", "DeviceRequest",
    "DeviceSelector", "DeviceSubRequest", "DeviceTaint", "DocumentError", "ExactDeviceRequest", "ObjectMeta",
    "OpaqueConfig", "ResourceClaim", "ResourceClaimSpec", "ResourcePool", "ResourceSlice", "ResourceSliceSpec",
    "Toleration", "claim_problems", "is_dns_label", "is_dns_subdomain", "joined", "parse_claim", "parse_object",
    "share_fields_sets", "shown", "text_problem", "text_problems",
]
