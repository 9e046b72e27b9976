"""resource.k8s.io/v1 objects as users and drivers write them: ResourceClaim, ResourceSlice, DeviceClass,
and the limits of resource/v1/types.go.

Documents load verbatim from Kubernetes YAML/JSON (camelCase). A claim is strict everywhere, as the
API server decodes it for `kubectl --validate=strict`: unknown fields, fields by their Go names and
values of the wrong type are refused, in metadata and status too. Slices and classes keep tolerant metadata
(drivers and clusters write them). The models hold shapes and types only: the API server's rules for a
claim are in shared.dra.claim_rules.
"""

from __future__ import annotations

import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

API_VERSION = "resource.k8s.io/v1"
# Limits of resource/v1/types.go and apimachinery's ObjectMeta validation.
MAX_REQUESTS = 32  # DeviceRequestsMaxSize
MAX_DEVICES_PER_CLAIM = 32  # AllocationResultsMaxSize
MAX_SUBREQUESTS = 8  # FirstAvailableDeviceRequestMaxSize
MAX_CONSTRAINTS = 32  # DeviceConstraintsMaxSize
MAX_CONFIGS = 32  # DeviceConfigMaxSize
MAX_SELECTORS = 32  # DeviceSelectorsMaxSize
MAX_TOLERATIONS = 16  # DeviceTolerationsMaxLength
MAX_CEL_LENGTH = 10 * 1024  # CELSelectorExpressionMaxLength, in bytes
MAX_OPAQUE_PARAMETERS = 10 * 1024  # OpaqueParametersMaxLength, in bytes of JSON
MAX_ANNOTATIONS_SIZE = 256 * 1024  # TotalAnnotationSizeLimitB: keys and values, in bytes
INT64_MAX = 2**63 - 1


class _Spec(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)


class ObjectMeta(BaseModel):
    """The metadata of a ResourceSlice or DeviceClass: tolerant, they come from the cluster or a driver."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore", frozen=True)
    name: str = ""
    namespace: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    generate_name: str | None = None


def _null_is_empty(value: Any) -> Any:
    """Go's decoder leaves a field it reads as JSON null at its zero value: an empty list or map."""
    return () if value is None else value


def _null_values_are_empty(value: Any) -> Any:
    """A null value in a map[string]string decodes to "" in Go."""
    if isinstance(value, dict):
        return {k: "" if v is None else v for k, v in value.items()}
    return {} if value is None else value


_StringMap = Annotated[dict[str, str], BeforeValidator(_null_values_are_empty)]


def _time_text(value: Any) -> Any:
    """A YAML loader reads an unquoted timestamp as a datetime; kubectl passes its text on."""
    if isinstance(value, datetime.datetime) and value.tzinfo is datetime.UTC:
        return value.isoformat().replace("+00:00", "Z")
    return value.isoformat() if isinstance(value, datetime.date) else value


_Time = Annotated[str | None, BeforeValidator(_time_text)]


class OwnerReference(_Spec):
    api_version: str | None = None
    kind: str | None = None
    name: str | None = None
    uid: str | None = None
    controller: bool | None = Field(default=None, strict=True)
    block_owner_deletion: bool | None = Field(default=None, strict=True)


class ManagedFieldsEntry(_Spec):
    manager: str | None = None
    operation: str | None = None
    api_version: str | None = None
    time: _Time = None
    fields_type: str | None = None
    fields_v1: Any = None
    subresource: str | None = None


class ClaimMeta(_Spec):
    """A claim's metadata: every ObjectMeta field with its type, unknown fields refused (as kubectl's
    --validate=strict does for the whole object). `claim_problems` holds ObjectMeta's rules."""

    name: Annotated[str, BeforeValidator(lambda v: "" if v is None else v)] = ""
    generate_name: str | None = None
    namespace: str | None = None
    self_link: str | None = None
    uid: str | None = None
    resource_version: str | None = None
    generation: int | None = Field(default=None, strict=True)
    creation_timestamp: _Time = None
    deletion_timestamp: _Time = None
    deletion_grace_period_seconds: int | None = Field(default=None, strict=True)
    labels: _StringMap = Field(default_factory=dict)
    annotations: _StringMap = Field(default_factory=dict)
    owner_references: Annotated[tuple[OwnerReference, ...], BeforeValidator(_null_is_empty)] = ()
    finalizers: Annotated[tuple[str, ...], BeforeValidator(_null_is_empty)] = ()
    managed_fields: Annotated[tuple[ManagedFieldsEntry, ...], BeforeValidator(_null_is_empty)] = ()


class CELSelector(_Spec):
    expression: str

    @field_validator("expression")
    @classmethod
    def _not_too_long(cls, value: str) -> str:
        size = len(value.encode("utf-8", "surrogatepass"))
        if size > MAX_CEL_LENGTH:
            raise ValueError(f"CEL expression is {size} bytes, over the limit of {MAX_CEL_LENGTH}")
        return value


class DeviceSelector(_Spec):
    cel: CELSelector


class OpaqueConfig(_Spec):
    driver: str
    parameters: Any = None


class DeviceClassConfiguration(_Spec):
    opaque: OpaqueConfig


class DeviceClassSpec(_Spec):
    selectors: tuple[DeviceSelector, ...] = ()
    config: tuple[DeviceClassConfiguration, ...] = ()
    extended_resource_name: str | None = None


class DeviceClass(_Spec):
    api_version: Literal["resource.k8s.io/v1"]
    kind: Literal["DeviceClass"]
    metadata: ObjectMeta
    spec: DeviceClassSpec = DeviceClassSpec()


class Toleration(_Spec):
    key: str | None = None
    operator: Literal["Exists", "Equal"] = "Equal"
    value: str | None = None
    effect: Literal["NoSchedule", "NoExecute", "None", ""] | None = None
    toleration_seconds: int | None = Field(default=None, strict=True)

    @field_validator("operator", mode="before")
    @classmethod
    def _default_operator(cls, value: Any) -> Any:
        """The API server defaults an empty operator to Equal."""
        return "Equal" if value is None or value == "" else value


class CapacityRequirements(_Spec):
    requests: dict[str, str] = Field(default_factory=dict)


class _RequestBody(_Spec):
    device_class_name: str
    selectors: tuple[DeviceSelector, ...] = ()
    allocation_mode: Literal["ExactCount", "All"] = "ExactCount"
    # Strict: a JSON string or bool is not a count, as Go's decoder refuses them.
    count: int | None = Field(default=None, strict=True)
    tolerations: tuple[Toleration, ...] = ()
    capacity: CapacityRequirements | None = None

    @field_validator("allocation_mode", mode="before")
    @classmethod
    def _default_mode(cls, value: Any) -> Any:
        """v1 defaults an empty allocationMode to ExactCount (SetDefaults_ExactDeviceRequest)."""
        return "ExactCount" if value is None or value == "" else value

    @field_validator("count", mode="before")
    @classmethod
    def _zero_is_unset(cls, value: Any) -> Any:
        """v1's count is a plain int64: 0 and null both mean unset (1 for ExactCount), as the API
        server's decoder and defaulting make them."""
        return None if type(value) is int and value == 0 else value

    @property
    def wanted(self) -> int:
        return self.count if self.count is not None else 1


class ExactDeviceRequest(_RequestBody):
    admin_access: bool | None = Field(default=None, strict=True)


class DeviceSubRequest(_RequestBody):
    name: str


class DeviceRequest(_Spec):
    name: str
    exactly: ExactDeviceRequest | None = None
    first_available: tuple[DeviceSubRequest, ...] | None = None


class DeviceConstraint(_Spec):
    requests: tuple[str, ...] = ()
    match_attribute: str | None = None
    distinct_attribute: str | None = None


class DeviceClaimConfiguration(_Spec):
    requests: tuple[str, ...] = ()
    opaque: OpaqueConfig


class DeviceClaim(_Spec):
    requests: tuple[DeviceRequest, ...] = ()
    constraints: tuple[DeviceConstraint, ...] = ()
    config: tuple[DeviceClaimConfiguration, ...] = ()


class ClaimStatus(_Spec):
    """What a claim copied from a cluster carries; the API server drops it on create, so only its shape
    matters (a string or an unknown field there fails to decode)."""

    allocation: dict[str, Any] | None = None
    reserved_for: tuple[dict[str, Any], ...] | None = None
    devices: tuple[dict[str, Any], ...] | None = None


class ResourceClaimSpec(_Spec):
    devices: DeviceClaim = DeviceClaim()


class ResourceClaim(BaseModel):
    """Shape and types only; `claim_problems` holds the API server's rules, so that re-reading a stored
    claim (the allocator does, per process) does not pay for them again."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)
    api_version: Literal["resource.k8s.io/v1"]
    kind: Literal["ResourceClaim"]
    metadata: ClaimMeta
    spec: ResourceClaimSpec
    status: Any = None  # shape checked by claim_problems: a claim read back from the ledger loads as stored


class DeviceAttribute(_Spec):
    int_: int | None = Field(default=None, alias="int")
    bool_: bool | None = Field(default=None, alias="bool")
    string: str | None = None
    version: str | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> DeviceAttribute:
        if sum(v is not None for v in (self.int_, self.bool_, self.string, self.version)) != 1:
            raise ValueError("an attribute must set exactly one of int, bool, string or version")
        return self

    @property
    def value(self) -> int | bool | str:
        for v in (self.int_, self.bool_, self.string, self.version):
            if v is not None:
                return v
        raise AssertionError("validated above")


class DeviceCapacity(_Spec):
    value: str
    request_policy: Any = None


class DeviceCounterConsumption(_Spec):
    counter_set: str
    counters: dict[str, DeviceCapacity]


class DeviceTaint(_Spec):
    key: str
    value: str | None = None
    effect: str
    time_added: str | None = None


class Device(_Spec):
    name: str
    attributes: dict[str, DeviceAttribute] = Field(default_factory=dict)
    capacity: dict[str, DeviceCapacity] = Field(default_factory=dict)
    consumes_counters: tuple[DeviceCounterConsumption, ...] = ()
    taints: tuple[DeviceTaint, ...] = ()
    node_name: str | None = None
    node_selector: Any = None
    all_nodes: bool | None = None
    binds_to_node: bool | None = None
    binding_conditions: tuple[str, ...] = ()
    binding_failure_conditions: tuple[str, ...] = ()
    allow_multiple_allocations: bool | None = None


class CounterSet(_Spec):
    name: str
    counters: dict[str, DeviceCapacity]


class ResourcePool(_Spec):
    name: str
    generation: int
    resource_slice_count: int


class ResourceSliceSpec(_Spec):
    driver: str
    pool: ResourcePool
    node_name: str | None = None
    node_selector: Any = None
    all_nodes: bool | None = None
    per_device_node_selection: bool | None = None
    devices: tuple[Device, ...] = ()
    shared_counters: tuple[CounterSet, ...] = ()


class ResourceSlice(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)
    api_version: Literal["resource.k8s.io/v1"]
    kind: Literal["ResourceSlice"]
    metadata: ObjectMeta = ObjectMeta()
    spec: ResourceSliceSpec
