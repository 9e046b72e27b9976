"""resource.k8s.io/v1 objects as users and drivers write them: ResourceClaim, ResourceSlice, DeviceClass.

Documents load verbatim from Kubernetes YAML/JSON (camelCase). A claim is strict everywhere, as the
API server decodes it for `kubectl --validate=strict`: unknown fields, fields by their Go names and
values of the wrong type are refused, in metadata and status too; a claim copied from a live cluster still
loads, less the resourceVersion the server refuses on create. Slices and classes keep tolerant metadata
(drivers and clusters write them). A ResourceClaim is then checked as the API server's validation checks
it (k8s.io/kubernetes pkg/apis/resource/validation, apimachinery's ObjectMeta validation, the CEL
compiler's static checks in shared.dra.cel_static): names, enums, uniqueness, list sizes and references,
each problem reported with its field path.
"""

from __future__ import annotations

import datetime
import json
import re
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from shared.dra.cel_static import static_problems

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
MAX_STATIC_CEL_BYTES = 64 * 1024  # a claim's selector text checked for compile errors at read time (the broker's)
MAX_OPAQUE_PARAMETERS = 10 * 1024  # OpaqueParametersMaxLength, in bytes of JSON
MAX_ANNOTATIONS_SIZE = 256 * 1024  # TotalAnnotationSizeLimitB: keys and values, in bytes
MAX_DRIVER_NAME = 63
MAX_ATTRIBUTE_ID = 32  # DeviceMaxIDLength
INT64_MAX = 2**63 - 1
MAX_DEPTH = 240  # nesting of a whole claim: deeper, it could not be written back out as JSON (pydantic: ~250)
DNS_LABEL_RULE = "must be a DNS label (lowercase letters, digits and '-', at most 63 characters)"
DNS_SUBDOMAIN_RULE = ("must be a DNS subdomain (lowercase letters, digits, '-' and '.', starting and ending with a "
                      "letter or digit, at most 253 characters)")

# fullmatch only: `$` would also accept a trailing newline.
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_QUALIFIED_PART = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
# A C identifier, plus '-': the contract allows the lab's gpu.nvidia.com/numa-node, which Kubernetes refuses.
_ATTRIBUTE_ID = re.compile(r"[A-Za-z_][-A-Za-z0-9_]*")
_QUANTITY = re.compile(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+|[KMGTPE]i|[numkMGTPE])?")
_SURROGATE = re.compile("[\ud800-\udfff]")
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")  # what text_problem refuses, in one search
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1  # JSON allows any integer; Kubernetes' fields stop at int64


def is_quantity(text: str) -> bool:
    """What resource.ParseQuantity takes (a capacity request decodes through it): a number, then a suffix,
    where a decimal exponent (1e3) must fit an int64."""
    match = _QUANTITY.fullmatch(text)
    if match is None:
        return False
    suffix = match[3] or ""
    if len(suffix) < 2 or suffix[0] not in "eE":
        return True  # no exponent: 1E is one exa
    sign, digits = ("-" if suffix[1] == "-" else ""), suffix[1:].lstrip("+-").lstrip("0")
    return len(digits) <= 19 and -(2**63) <= int(sign + (digits or "0")) < 2**63


def is_dns_label(value: object) -> bool:
    """RFC 1123 label, as Kubernetes checks namespaces, request names and (here) tenants and cohorts."""
    return isinstance(value, str) and _DNS_LABEL.fullmatch(value) is not None


def is_dns_subdomain(value: object) -> bool:
    """RFC 1123 subdomain of at most 253 characters, as Kubernetes checks object names."""
    return isinstance(value, str) and len(value) <= 253 and _DNS_SUBDOMAIN.fullmatch(value) is not None


def shown(value: object, limit: int = 64) -> str:
    """A user's value quoted for a message: control characters and lone surrogates escaped (the message
    lands in the ledger, where PostgreSQL refuses NUL), long values cut short."""
    try:
        text = value if isinstance(value, str) else json.dumps(value) if isinstance(value, int) else repr(value)
    except ValueError:  # an integer of more than 4,300 digits
        text = "<a number too long to show>"
    cut = text if len(text) <= limit else text[:limit] + "..."
    escaped = "".join(c if c.isprintable() and c not in '"\\' else json.dumps(c)[1:-1] for c in cut)
    return f'"{escaped}"'


def text_problem(value: str) -> str | None:
    """Why a string cannot be stored: PostgreSQL refuses NUL in text, and a lone surrogate has no UTF-8."""
    if "\x00" in value:
        return "must not contain NUL characters"
    if _SURROGATE.search(value):
        return "must not contain unpaired surrogates (not valid Unicode)"
    return None


def _clean(document: Any) -> bool:
    """Whether a document has no string `text_problem` refuses and nothing nested deeper than MAX_DEPTH:
    the common case, checked without building a field path per node (that took a tenth of a burst)."""
    stack: list[tuple[Any, int]] = [(document, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            if _UNSTORABLE.search(item):
                return False
        elif isinstance(item, int) and not _INT64_MIN <= item <= _INT64_MAX:
            return False
        elif isinstance(item, dict | list | tuple):
            if depth >= MAX_DEPTH:
                return False
            if isinstance(item, dict):
                for key, value in item.items():
                    if isinstance(key, str) and _UNSTORABLE.search(key):
                        return False
                    stack.append((value, depth + 1))
            else:
                stack.extend((value, depth + 1) for value in item)
    return True


def text_problems(document: Any, path: str = "") -> list[str]:
    """Every string (key or value) of a parsed document that `text_problem` refuses, and any part nested
    deeper than MAX_DEPTH, by field path. Iterative, so a deeply nested document cannot exhaust the stack."""
    if _clean(document):
        return []
    problems = []
    stack: list[tuple[str, Any, int]] = [(path, document, 0)]
    while stack:
        where, item, depth = stack.pop()
        if isinstance(item, str):
            if (problem := text_problem(item)) is not None:
                problems.append(f"{where or '<document>'}: {problem}")
        elif isinstance(item, int) and not _INT64_MIN <= item <= _INT64_MAX:
            problems.append(f"{where or '<document>'}: {shown(str(item))} is outside the 64-bit integer range "
                            "(Kubernetes' int64)")
        elif isinstance(item, dict | list | tuple) and depth >= MAX_DEPTH:
            cut = re.sub(r"(\[[0-9]+\])+$", "", where)  # name the field, not a chain of [0][0]...
            cut = cut if len(cut) <= 120 else cut[:120] + "..."
            problems.append(f"{cut}: nested more than {MAX_DEPTH} levels deep")
        elif isinstance(item, dict):
            for key, value in reversed(item.items()):
                if isinstance(key, str) and (problem := text_problem(key)) is not None:
                    problems.append(f"{where or '<document>'}: key {shown(key)} {problem}")
                    continue
                stack.append((_child(where, key), value, depth + 1))
        elif isinstance(item, list | tuple):
            stack.extend((f"{where}[{i}]", value, depth + 1) for i, value in reversed(list(enumerate(item))))
    return problems


def _child(where: str, key: object) -> str:
    """`a.b` for a field name, `a[key]` for a map key that is not a plain name (annotation keys)."""
    text = key if isinstance(key, str) else str(key)
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", text) and not where.endswith((".annotations", ".labels")):
        return f"{where}.{text}" if where else text
    return f"{where}[{shown(text)[1:-1]}]"


def qualified_name_problem(key: str) -> str | None:
    """Why `key` is not a label or annotation key (`[prefix/]name`, apimachinery IsQualifiedName)."""
    prefix, slash, name = key.rpartition("/")
    if key.count("/") > 1:
        return "must be a name with an optional DNS subdomain prefix and '/'"
    if slash and not prefix:
        return "prefix part must not be empty"
    if slash and not is_dns_subdomain(prefix):
        return f"prefix part {DNS_SUBDOMAIN_RULE}"
    if not name:
        return "name part must not be empty"
    if len(name) > 63:
        return "name part must be at most 63 characters"
    if not _QUALIFIED_PART.fullmatch(name):
        return "name part must be letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
    return None


def label_value_problem(value: str) -> str | None:
    if len(value) > 63:
        return "must be at most 63 characters"
    if not _LABEL_VALUE.fullmatch(value):
        return "must be empty or letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
    return None


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
    status: Any = None  # checked by claim_problems: rows stored before issue 35 may hold any JSON here


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


# --- the API server's rules for a ResourceClaim ------------------------------------------------------


def claim_problems(claim: ResourceClaim, *, on_create: bool = True) -> list[str]:
    """Every rule of ValidateResourceClaim that a parsed claim can break, as `path: problem` lines.
    `on_create`: the claim is being submitted, as `kubectl create` would create it, so what the API server
    refuses only on create (a resourceVersion) is refused too; a claim read back from a cluster has one."""
    problems: list[str] = []
    _check_metadata(claim.metadata, problems, on_create=on_create)
    _check_devices(claim.spec.devices, "spec.devices", problems)
    _check_selectors_statically(claim.spec.devices, problems)
    if claim.status is not None:
        try:
            ClaimStatus.model_validate(claim.status, by_alias=True, by_name=False)
        except ValidationError as error:
            problems += validation_problems(error, ("status",))
    return problems


def _check_selectors_statically(devices: DeviceClaim, problems: list[str]) -> None:
    """What Kubernetes' CEL compiler refuses before evaluating (shared.dra.cel_static), in the claim's first
    MAX_STATIC_CEL_BYTES of selector text: the check costs about 0.2 us a byte, and a claim holding more is
    still compiled and evaluated, with its limits, by the decision core."""
    budget = MAX_STATIC_CEL_BYTES
    for i, request in enumerate(devices.requests[:MAX_REQUESTS]):
        at = f"spec.devices.requests[{i}]"
        subrequests = (request.first_available or ())[:MAX_SUBREQUESTS]
        bodies: list[tuple[str, _RequestBody]] = [(f"{at}.exactly", request.exactly)] if request.exactly else [
            (f"{at}.firstAvailable[{j}]", sub) for j, sub in enumerate(subrequests)]
        for path, body in bodies:
            for k, selector in enumerate(body.selectors[:MAX_SELECTORS]):
                budget -= len(selector.cel.expression)
                if budget < 0:
                    return
                problems += [f"{path}.selectors[{k}].cel.expression: CEL compile error: {problem}"
                             for problem in static_problems(selector.cel.expression)]


STANDARD_FINALIZERS = frozenset({"kubernetes", "orphan", "foregroundDeletion"})  # helper.IsStandardFinalizerName
MAX_FIELD_MANAGER = 128  # metav1 validation FieldManagerMaxLength
MAX_SUBRESOURCE = 256  # metav1 validation MaxSubresourceNameLength
_RFC3339 = re.compile(r"(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(\.\d+)?(Z|[+-](\d{2}):(\d{2}))")
RFC3339_RULE = "must be an RFC 3339 time such as 2026-01-02T15:04:05Z"


def is_rfc3339(text: str) -> bool:
    """What Go's time.Parse(time.RFC3339, ...) takes (metav1.Time's JSON form): anything else fails to decode."""
    match = _RFC3339.fullmatch(text)
    if match is None:
        return False
    year, month, day, hour, minute, second = (int(g) for g in match.groups()[:6])
    try:
        datetime.date(year, month, day)
    except ValueError:
        return False
    zone_ok = match[8] == "Z" or (int(match[9]) < 24 and int(match[10]) < 60)
    return hour < 24 and minute < 60 and second < 60 and zone_ok


def _generate_name_problem(prefix: str) -> str | None:
    """NameIsDNSSubdomain(prefix, true): a trailing '-' is masked (apimachinery's maskTrailingDash, which
    drops the last two characters and appends 'a'), the rest must make a DNS subdomain."""
    masked = prefix[:-2] + "a" if len(prefix) > 1 and prefix.endswith("-") else prefix
    return None if is_dns_subdomain(masked) else f"{DNS_SUBDOMAIN_RULE}; a trailing '-' is allowed"


def _owner_reference_problems(references: tuple[OwnerReference, ...], problems: list[str]) -> None:
    """apimachinery's ValidateOwnerReferences."""
    controllers: list[str] = []
    for i, ref in enumerate(references):
        at = f"metadata.ownerReferences[{i}]"
        api_version = ref.api_version or ""
        group, slash, version = api_version.rpartition("/") if api_version.count("/") <= 1 else ("", "", "")
        if not version:
            problems.append(f"{at}.apiVersion: {shown(api_version)} must name a version (e.g. v1 or apps/v1)")
        if not ref.kind:
            problems.append(f"{at}.kind: must not be empty")
        if not ref.name:
            problems.append(f"{at}.name: must not be empty")
        if not ref.uid:
            problems.append(f"{at}.uid: must not be empty")
        if (group, version, ref.kind) == ("", "v1", "Event"):
            problems.append(f"{at}: /v1, Kind=Event is disallowed from being an owner")
        if ref.controller:
            controllers.append(f"{ref.kind}/{ref.name}")
    if len(controllers) > 1:
        problems.append(f"metadata.ownerReferences: only one reference can have controller set to true; found "
                        f"{shown(controllers[0])} and {shown(controllers[1])}")


def _finalizer_problems(finalizers: tuple[str, ...], problems: list[str]) -> None:
    """ValidateFinalizers, and core validation's rule that a name without a domain is a standard one."""
    for i, finalizer in enumerate(finalizers):
        at = f"metadata.finalizers[{i}]"
        if (problem := qualified_name_problem(finalizer)) is not None:
            problems.append(f"{at}: {shown(finalizer)} {problem}")
        elif "/" not in finalizer and finalizer not in STANDARD_FINALIZERS:
            problems.append(f"{at}: {shown(finalizer)} is neither a standard finalizer name "
                            f"({', '.join(sorted(STANDARD_FINALIZERS))}) nor fully qualified (example.com/name)")
    if "orphan" in finalizers and "foregroundDeletion" in finalizers:
        problems.append("metadata.finalizers: orphan and foregroundDeletion cannot both be set")


def _is_field_set(value: Any) -> bool:
    """Whether managedFields' fieldsV1 decodes as a field set (structured-merge-diff's FromJSON): objects
    whose keys are "." or start with f:, k:, v: or i:. The API server keeps entries that decode."""
    stack = [value]
    while stack:
        item = stack.pop()
        if not isinstance(item, dict):
            return False
        for key, child in item.items():
            if key != "." and key[:2] not in ("f:", "k:", "v:", "i:"):
                return False
            stack.append(child)
    return True


def _managed_fields_problems(entries: tuple[ManagedFieldsEntry, ...], problems: list[str]) -> None:
    """metav1 ValidateManagedFields, on the entries the API server keeps: on create its field manager keeps
    the list it was sent when every entry's fieldsV1 decodes (and `[{}]` asks it to reset the list)."""
    if not entries or entries == _RESET_MANAGED_FIELDS:
        return
    if not all(e.fields_v1 is None or _is_field_set(e.fields_v1) for e in entries):
        return  # the field manager replaces what it cannot decode
    for i, entry in enumerate(entries):
        at = f"metadata.managedFields[{i}]"
        if entry.operation not in ("Apply", "Update"):
            problems.append(f"{at}.operation: {shown(entry.operation or '')} must be Apply or Update")
        if entry.fields_type and entry.fields_type != "FieldsV1":
            problems.append(f"{at}.fieldsType: {shown(entry.fields_type)} must be FieldsV1")
        manager = entry.manager or ""
        if len(manager) > MAX_FIELD_MANAGER:
            problems.append(f"{at}.manager: must be at most {MAX_FIELD_MANAGER} characters")
        elif not all(c.isprintable() for c in manager):
            problems.append(f"{at}.manager: {shown(manager)} must hold printable characters only")
        if len(entry.subresource or "") > MAX_SUBRESOURCE:
            problems.append(f"{at}.subresource: must be at most {MAX_SUBRESOURCE} characters")
        if entry.time is not None and not is_rfc3339(entry.time):
            problems.append(f"{at}.time: {shown(entry.time)} {RFC3339_RULE}")


_RESET_MANAGED_FIELDS = (ManagedFieldsEntry(),)


def _set_resource_version(version: str | None) -> bool:
    """Whether storage sees a resourceVersion on the object (etcd3 store.Create parses it as an unsigned
    integer and refuses any but 0; one it cannot parse is cleared instead)."""
    return version is not None and version.isascii() and version.isdigit() and 0 < int(version) < 2**64


def _check_metadata(meta: ClaimMeta, problems: list[str], *, on_create: bool) -> None:
    if not meta.name:
        problems.append("metadata.name: is required" + (
            " (the broker does not generate names: give one instead of generateName)" if meta.generate_name else ""))
    elif not is_dns_subdomain(meta.name):
        problems.append(f"metadata.name: {shown(meta.name)} {DNS_SUBDOMAIN_RULE}")
    if meta.generate_name and (problem := _generate_name_problem(meta.generate_name)) is not None:
        problems.append(f"metadata.generateName: {shown(meta.generate_name)} {problem}")
    if meta.namespace and not is_dns_label(meta.namespace):
        problems.append(f"metadata.namespace: {shown(meta.namespace)} {DNS_LABEL_RULE}")
    if meta.generation is not None and meta.generation < 0:
        problems.append(f"metadata.generation: {meta.generation} must be greater than or equal to 0")
    for field_name, value in (("creationTimestamp", meta.creation_timestamp),
                              ("deletionTimestamp", meta.deletion_timestamp)):
        if value is not None and not is_rfc3339(value):
            problems.append(f"metadata.{field_name}: {shown(value)} {RFC3339_RULE}")
    if on_create and _set_resource_version(meta.resource_version):
        problems.append(f"metadata.resourceVersion: {shown(meta.resource_version)} must not be set on a claim being "
                        "created (the API server refuses it: \"resourceVersion should not be set on objects to be "
                        "created\"); remove it from a claim copied from a cluster")
    for key, value in meta.labels.items():
        if (problem := qualified_name_problem(key)) is not None:
            problems.append(f"metadata.labels: key {shown(key)} {problem}")
        elif (problem := label_value_problem(value)) is not None:
            problems.append(f"metadata.labels[{shown(key)[1:-1]}]: {shown(value)} {problem}")
    size = 0
    for key, value in meta.annotations.items():
        if (problem := qualified_name_problem(key.lower())) is not None:
            problems.append(f"metadata.annotations: key {shown(key)} {problem}")
        size += len(key.encode("utf-8", "surrogatepass")) + len(value.encode("utf-8", "surrogatepass"))
    if size > MAX_ANNOTATIONS_SIZE:
        problems.append(f"metadata.annotations: {size} bytes in all, over the limit of {MAX_ANNOTATIONS_SIZE}")
    _owner_reference_problems(meta.owner_references, problems)
    _finalizer_problems(meta.finalizers, problems)
    _managed_fields_problems(meta.managed_fields, problems)


def _too_many(items: tuple[Any, ...], limit: int, path: str, problems: list[str]) -> bool:
    """The API server reports an over-long list once and does not look inside it (DoS protection)."""
    if len(items) > limit:
        problems.append(f"{path}: {len(items)} items, over the limit of {limit}")
        return True
    return False


def _check_devices(devices: DeviceClaim, path: str, problems: list[str]) -> None:
    names: dict[str, set[str] | None] = {}
    for request in devices.requests:
        names.setdefault(request.name, {s.name for s in request.first_available or ()} or None)
    if not _too_many(devices.requests, MAX_REQUESTS, f"{path}.requests", problems):
        seen: set[str] = set()
        for i, request in enumerate(devices.requests):
            at = f"{path}.requests[{i}]"
            _check_request(request, at, problems)
            if request.name in seen:
                problems.append(f"{at}.name: duplicate request name {shown(request.name)}")
            seen.add(request.name)
    if not _too_many(devices.constraints, MAX_CONSTRAINTS, f"{path}.constraints", problems):
        for i, constraint in enumerate(devices.constraints):
            at = f"{path}.constraints[{i}]"
            _check_references(constraint.requests, names, f"{at}.requests", problems)
            if (constraint.match_attribute is None) == (constraint.distinct_attribute is None):
                problems.append(f"{at}: exactly one of matchAttribute or distinctAttribute is required")
            for field_name, attribute in (("matchAttribute", constraint.match_attribute),
                                          ("distinctAttribute", constraint.distinct_attribute)):
                if attribute is not None and (problem := _attribute_name_problem(attribute)) is not None:
                    problems.append(f"{at}.{field_name}: {shown(attribute)} {problem}")
    if not _too_many(devices.config, MAX_CONFIGS, f"{path}.config", problems):
        for i, config in enumerate(devices.config):
            at = f"{path}.config[{i}]"
            _check_references(config.requests, names, f"{at}.requests", problems)
            _check_opaque(config.opaque, f"{at}.opaque", problems)


def _check_request(request: DeviceRequest, path: str, problems: list[str]) -> None:
    if not is_dns_label(request.name):
        problems.append(f"{path}.name: {shown(request.name)} {DNS_LABEL_RULE}")
    subrequests = request.first_available or ()  # an empty list is as good as unset
    if request.exactly is None and not subrequests:
        problems.append(f"{path}: exactly one of exactly or firstAvailable is required")
    elif request.exactly is not None and subrequests:
        problems.append(f"{path}: exactly one of exactly or firstAvailable is required, but both are set")
    elif request.exactly is not None:
        _check_body(request.exactly, f"{path}.exactly", problems, exact=True)
    elif not _too_many(subrequests, MAX_SUBREQUESTS, f"{path}.firstAvailable", problems):
        seen: set[str] = set()
        for j, sub in enumerate(subrequests):
            at = f"{path}.firstAvailable[{j}]"
            if not is_dns_label(sub.name):
                problems.append(f"{at}.name: {shown(sub.name)} {DNS_LABEL_RULE}")
            elif sub.name in seen:
                problems.append(f"{at}.name: duplicate subrequest name {shown(sub.name)}")
            seen.add(sub.name)
            _check_body(sub, at, problems, exact=False)
        if all(s.allocation_mode == "ExactCount" and s.wanted > MAX_DEVICES_PER_CLAIM for s in subrequests):
            problems.append(f"{path}.firstAvailable: every entry asks for more than {MAX_DEVICES_PER_CLAIM} "
                            "devices, the most one claim may hold")


def _check_body(body: _RequestBody, path: str, problems: list[str], *, exact: bool) -> None:
    if not body.device_class_name:
        problems.append(f"{path}.deviceClassName: is required")
    elif not is_dns_subdomain(body.device_class_name):
        problems.append(f"{path}.deviceClassName: {shown(body.device_class_name)} {DNS_SUBDOMAIN_RULE}")
    _too_many(body.selectors, MAX_SELECTORS, f"{path}.selectors", problems)
    count = body.count
    if body.allocation_mode == "All":
        if count is not None:
            problems.append(f"{path}.count: must not be set when allocationMode is All")
    elif count is not None and count < 0:
        problems.append(f"{path}.count: must be greater than zero")
    elif count is not None and count > INT64_MAX:
        problems.append(f"{path}.count: does not fit a 64-bit integer")
    elif exact and count is not None and count > MAX_DEVICES_PER_CLAIM:
        problems.append(f"{path}.count: {count} is over the claim limit of {MAX_DEVICES_PER_CLAIM} devices")
    if not _too_many(body.tolerations, MAX_TOLERATIONS, f"{path}.tolerations", problems):
        for k, toleration in enumerate(body.tolerations):
            _check_toleration(toleration, f"{path}.tolerations[{k}]", problems)
    for key, quantity in (body.capacity.requests if body.capacity else {}).items():
        at = f"{path}.capacity.requests"
        if (problem := _attribute_name_problem(key, domain_required=False)) is not None:
            problems.append(f"{at}: key {shown(key)} {problem}")
        elif not is_quantity(quantity):
            problems.append(f"{at}[{shown(key)[1:-1]}]: {shown(quantity)} is not a quantity (e.g. 40Gi, 500m, 2)")


def _check_toleration(toleration: Toleration, path: str, problems: list[str]) -> None:
    if toleration.key and (problem := qualified_name_problem(toleration.key)) is not None:
        problems.append(f"{path}.key: {shown(toleration.key)} {problem}")
    value = toleration.value or ""
    if toleration.operator == "Exists" and value:
        problems.append(f"{path}.value: must be empty for operator Exists")
    elif toleration.operator == "Equal" and (problem := label_value_problem(value)) is not None:
        problems.append(f"{path}.value: {shown(value)} {problem}")


def _check_references(references: tuple[str, ...], names: dict[str, set[str] | None], path: str,
                      problems: list[str]) -> None:
    """`request` or `request/subrequest`, naming one of the claim's requests, each at most once."""
    if _too_many(references, MAX_REQUESTS, path, problems):
        return
    seen: set[str] = set()
    for i, reference in enumerate(references):
        parent, slash, sub = reference.partition("/")
        known = parent in names and (not slash or sub in (names[parent] or ()))  # "gpu/" names no subrequest
        if "/" in sub or not known:
            problems.append(f"{path}[{i}]: {shown(reference)} names no request of this claim (use a request's "
                            "name, or <request>/<subrequest> for a firstAvailable entry)")
        elif reference in seen:
            problems.append(f"{path}[{i}]: duplicate {shown(reference)}")
        seen.add(reference)


def _driver_name_problem(driver: str) -> str | None:
    """A driver name as Kubernetes checks it (ValidateCSIDriverName: a DNS subdomain, case-insensitive)."""
    if not driver:
        return "is required"
    if len(driver) > MAX_DRIVER_NAME:
        return f"must be at most {MAX_DRIVER_NAME} characters"
    if not is_dns_subdomain(driver.lower()):
        return DNS_SUBDOMAIN_RULE
    return None


def _attribute_name_problem(name: str, *, domain_required: bool = True) -> str | None:
    """`<domain>/<identifier>` (a FullyQualifiedName), or a bare identifier where the domain may be left out
    (a QualifiedName); the identifier may hold '-' (the contract's one departure from Kubernetes)."""
    domain, slash, identifier = name.rpartition("/")
    if (domain_required and not slash) or "/" in domain:
        return "must be a domain and a name separated by one '/', e.g. gpu.nvidia.com/numa-node"
    if slash and (problem := _driver_name_problem(domain)) is not None:
        return f"domain {problem}"
    if len(identifier) > MAX_ATTRIBUTE_ID or not _ATTRIBUTE_ID.fullmatch(identifier):
        return (f"name must be at most {MAX_ATTRIBUTE_ID} letters, digits, '_' or '-', starting with a letter "
                "or '_'")
    return None


def _check_opaque(opaque: OpaqueConfig, path: str, problems: list[str]) -> None:
    if (problem := _driver_name_problem(opaque.driver)) is not None:
        problems.append(f"{path}.driver: {problem if not opaque.driver else shown(opaque.driver) + ' ' + problem}")
    if opaque.parameters is None:
        problems.append(f"{path}.parameters: is required")
    elif not isinstance(opaque.parameters, dict):
        problems.append(f"{path}.parameters: must be a JSON object")
    else:
        try:
            size = len(json.dumps(opaque.parameters, separators=(",", ":"), ensure_ascii=False, default=str)
                       .encode("utf-8", "surrogatepass"))
        except (RecursionError, ValueError):
            size = MAX_OPAQUE_PARAMETERS + 1  # nested too deeply to write back out: far over any sane size
        if size > MAX_OPAQUE_PARAMETERS:
            problems.append(f"{path}.parameters: {size} bytes, over the limit of {MAX_OPAQUE_PARAMETERS}")


class DocumentError(ValueError):
    """A document that is not a valid object; the message names the field."""


MAX_PROBLEMS_SHOWN = 10  # a reason is read by a person; the first ten problems say enough


def _location(loc: tuple[int | str, ...]) -> str:
    """pydantic's loc as a Kubernetes field path: `spec.devices.requests[1].name`, map keys in brackets
    (`metadata.annotations[claimbroker.io/priority]`)."""
    out = ""
    previous: list[int | str] = []
    for part in loc:
        if part == "function-after":
            continue
        in_map = bool(previous) and (
            previous[-1] in ("labels", "annotations", "attributes", "counters")
            or (previous[-1] == "capacity" and part != "requests")
            or previous[-2:] == ["capacity", "requests"])
        if isinstance(part, int):
            out += f"[{part}]"
        elif in_map or part.startswith("["):
            out += f"[{shown(part)[1:-1]}]" if not part.startswith("[") else part
        else:
            out += f".{shown(part)[1:-1]}" if out else shown(part)[1:-1]
        previous.append(part)
    return out


def describe_validation_error(error: ValidationError) -> str:
    """One problem per clause, each naming the camelCase field path, as kubectl does."""
    return joined(validation_problems(error))


def validation_problems(error: ValidationError, within: tuple[str, ...] = ()) -> list[str]:
    """pydantic's errors as `path: problem` lines; `within` is the path of what was validated."""
    parts = []
    for item in error.errors():
        path = _location((*within, *item["loc"]))
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "missing":
            message = "is required"
        elif item["type"] == "extra_forbidden":
            message = "unknown field (the API server's strict field validation, kubectl's default, refuses it)"
        parts.append(f"{path}: {message}" if path else message)
    return parts


def joined(problems: list[str]) -> str:
    """At most MAX_PROBLEMS_SHOWN problems of at most 1,000 characters each: the reason is stored and
    published (a NATS message is at most 1 MiB), and a long path deep in a document says no more."""
    more = len(problems) - MAX_PROBLEMS_SHOWN
    shown_problems = [p if len(p) <= 1000 else p[:1000] + "..." for p in problems[:MAX_PROBLEMS_SHOWN]]
    return "; ".join(shown_problems) + (f"; and {more} more" if more > 0 else "")


def _brief(value: object) -> str:
    """repr() for a message, bounded: a kind or apiVersion may be anything a tenant sent."""
    try:
        text = repr(value)
    except (ValueError, RecursionError):  # a huge integer, a deeply nested list
        return f"<a {type(value).__name__}>"
    return text if len(text) <= 80 else text[:80] + "..."


_KINDS: dict[str, type[BaseModel]] = {
    "ResourceClaim": ResourceClaim,
    "ResourceSlice": ResourceSlice,
    "DeviceClass": DeviceClass,
}


def parse_object(document: Any, *, on_create: bool = True) -> ResourceClaim | ResourceSlice | DeviceClass:
    """Parse one resource.k8s.io/v1 document, refusing unknown kinds and API versions by name. A claim
    must also pass `claim_problems` (`on_create`: as a claim being created), and hold no string the ledger
    cannot store."""
    if not isinstance(document, dict):
        raise DocumentError(f"expected a mapping with apiVersion and kind, got {type(document).__name__}")
    kind = document.get("kind")
    if not isinstance(kind, str) or kind not in _KINDS:  # a list or mapping is unhashable
        raise DocumentError(f"kind: unknown kind {_brief(kind)}; expected one of {', '.join(sorted(_KINDS))}")
    if document.get("apiVersion") != API_VERSION:
        raise DocumentError(f"apiVersion: {_brief(document.get('apiVersion'))} is not {API_VERSION!r}")
    if kind == "ResourceClaim" and (problems := text_problems(document)):
        raise DocumentError(joined(problems))
    try:
        # A claim's fields by their JSON names only: populate_by_name would also take `device_class_name`,
        # an unknown field to the API server.
        by_name = kind != "ResourceClaim"
        parsed = _KINDS[kind].model_validate(document, by_alias=True, by_name=by_name)
    except ValidationError as error:
        raise DocumentError(describe_validation_error(error)) from None
    if isinstance(parsed, ResourceClaim):
        if problems := claim_problems(parsed, on_create=on_create):
            raise DocumentError(joined(problems))
        share_fields_sets(parsed)
    return parsed  # type: ignore[return-value]


_FIELDS_SETS: dict[frozenset[str], frozenset[str]] = {}


def share_fields_sets(model: BaseModel) -> None:
    """A waiting claim stays in memory, and pydantic gives each of its objects a set of the fields it was
    given (200 bytes each: 40% of a claim of 256 subrequests). The models are frozen and nothing here asks
    which fields were set, so objects with the same fields share one frozen set."""
    stack: list[Any] = [model]
    while stack:
        item = stack.pop()
        if isinstance(item, BaseModel):
            fields = frozenset(item.__pydantic_fields_set__)
            shared = _FIELDS_SETS.setdefault(fields, fields) if len(_FIELDS_SETS) < 4096 else fields
            object.__setattr__(item, "__pydantic_fields_set__", shared)
            stack.extend(item.__dict__.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)


def parse_claim(document: Any, *, on_create: bool = True) -> ResourceClaim:
    """A claim being submitted (`on_create`), or one read back from a cluster (it has a resourceVersion)."""
    obj = parse_object(document, on_create=on_create)
    if not isinstance(obj, ResourceClaim):
        raise DocumentError(f"kind: expected ResourceClaim, got {_brief(document.get('kind'))}")
    return obj
