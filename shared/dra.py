"""resource.k8s.io/v1 objects as users and drivers write them: ResourceClaim, ResourceSlice, DeviceClass.

Documents load verbatim from Kubernetes YAML/JSON (camelCase). Spec fields are strict (unknown
fields are refused, as `kubectl --validate=strict` would), metadata and status are tolerant so that
objects copied from a live cluster still load. Validation errors name the field path.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.alias_generators import to_camel

API_VERSION = "resource.k8s.io/v1"
MAX_REQUESTS = 32
MAX_DEVICES_PER_CLAIM = 32
MAX_SUBREQUESTS = 8
MAX_CEL_LENGTH = 10 * 1024
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


class _Spec(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)


class ObjectMeta(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore", frozen=True)
    name: str = ""
    namespace: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    generate_name: str | None = None


class CELSelector(_Spec):
    expression: str

    @field_validator("expression")
    @classmethod
    def _not_too_long(cls, value: str) -> str:
        if len(value) > MAX_CEL_LENGTH:
            raise ValueError(f"CEL expression is {len(value)} characters, over the limit of {MAX_CEL_LENGTH}")
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
    effect: Literal["NoSchedule", "NoExecute", ""] | None = None
    toleration_seconds: int | None = None


class CapacityRequirements(_Spec):
    requests: dict[str, str] = Field(default_factory=dict)


class _RequestBody(_Spec):
    device_class_name: str
    selectors: tuple[DeviceSelector, ...] = ()
    allocation_mode: Literal["ExactCount", "All"] = "ExactCount"
    count: int | None = None
    tolerations: tuple[Toleration, ...] = ()
    capacity: CapacityRequirements | None = None

    @field_validator("device_class_name")
    @classmethod
    def _class_named(cls, value: str) -> str:
        if not value:
            raise ValueError("missing device class name")
        return value

    @model_validator(mode="after")
    def _count_fits_mode(self) -> _RequestBody:
        if self.allocation_mode == "ExactCount" and self.count is not None and self.count <= 0:
            raise ValueError(f"count must be greater than zero, got {self.count}")
        if self.allocation_mode == "All" and self.count is not None:
            raise ValueError("count must not be set when allocationMode is All")
        return self

    @property
    def wanted(self) -> int:
        return self.count if self.count is not None else 1


class ExactDeviceRequest(_RequestBody):
    admin_access: bool | None = None


class DeviceSubRequest(_RequestBody):
    name: str


class DeviceRequest(_Spec):
    name: str
    exactly: ExactDeviceRequest | None = None
    first_available: tuple[DeviceSubRequest, ...] | None = None

    @field_validator("name")
    @classmethod
    def _dns_label(cls, value: str) -> str:
        if not _DNS_LABEL.match(value):
            raise ValueError(f"request name {value!r} must be a DNS label")
        return value

    @model_validator(mode="after")
    def _exactly_one(self) -> DeviceRequest:
        if (self.exactly is None) == (self.first_available is None):
            raise ValueError(f"request {self.name!r} must set exactly one of exactly or firstAvailable")
        if self.first_available is not None and not 1 <= len(self.first_available) <= MAX_SUBREQUESTS:
            raise ValueError(
                f"request {self.name!r} has {len(self.first_available)} firstAvailable entries; 1 to "
                f"{MAX_SUBREQUESTS} are allowed"
            )
        return self


class DeviceConstraint(_Spec):
    requests: tuple[str, ...] = ()
    match_attribute: str | None = None
    distinct_attribute: str | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> DeviceConstraint:
        if (self.match_attribute is None) == (self.distinct_attribute is None):
            raise ValueError("a constraint must set exactly one of matchAttribute or distinctAttribute")
        return self


class DeviceClaimConfiguration(_Spec):
    requests: tuple[str, ...] = ()
    opaque: OpaqueConfig


class DeviceClaim(_Spec):
    requests: tuple[DeviceRequest, ...] = ()
    constraints: tuple[DeviceConstraint, ...] = ()
    config: tuple[DeviceClaimConfiguration, ...] = ()


class ResourceClaimSpec(_Spec):
    devices: DeviceClaim = DeviceClaim()


class ResourceClaim(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)
    api_version: Literal["resource.k8s.io/v1"]
    kind: Literal["ResourceClaim"]
    metadata: ObjectMeta
    spec: ResourceClaimSpec
    status: Any = None

    @field_validator("metadata")
    @classmethod
    def _named(cls, meta: ObjectMeta) -> ObjectMeta:
        if not meta.name:
            raise ValueError("metadata.name is required")
        return meta


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


class DocumentError(ValueError):
    """A document that is not a valid object; the message names the field."""


def describe_validation_error(error: ValidationError) -> str:
    """One line per problem, each naming the camelCase field path, as kubectl does."""
    parts = []
    for item in error.errors():
        path = ".".join(str(p) for p in item["loc"] if p not in ("function-after",))
        message = item["msg"].removeprefix("Value error, ")
        parts.append(f"{path}: {message}" if path else message)
    return "; ".join(parts)


_KINDS: dict[str, type[BaseModel]] = {
    "ResourceClaim": ResourceClaim,
    "ResourceSlice": ResourceSlice,
    "DeviceClass": DeviceClass,
}


def parse_object(document: Any) -> ResourceClaim | ResourceSlice | DeviceClass:
    """Parse one resource.k8s.io/v1 document, refusing unknown kinds and API versions by name."""
    if not isinstance(document, dict):
        raise DocumentError(f"expected a mapping with apiVersion and kind, got {type(document).__name__}")
    kind = document.get("kind")
    if kind not in _KINDS:
        raise DocumentError(f"kind: unknown kind {kind!r}; expected one of {', '.join(sorted(_KINDS))}")
    if document.get("apiVersion") != API_VERSION:
        raise DocumentError(f"apiVersion: {document.get('apiVersion')!r} is not {API_VERSION!r}")
    try:
        return _KINDS[kind].model_validate(document)  # type: ignore[return-value]
    except ValidationError as error:
        raise DocumentError(describe_validation_error(error)) from None


def parse_claim(document: Any) -> ResourceClaim:
    obj = parse_object(document)
    if not isinstance(obj, ResourceClaim):
        raise DocumentError(f"kind: expected ResourceClaim, got {document.get('kind')!r}")
    return obj
