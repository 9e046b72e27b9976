"""The payloads of the contract's NATS subjects: what tenants, alert subscribers and the services exchange
(docs/contract.md, "NATS subjects"). They are the AsyncAPI document's schemas (`claimbroker asyncapi`), and
tests check that every payload the services build validates against them, so the document cannot drift from
what goes over the bus.

Field names are the wire's (camelCase, as Kubernetes writes them). Models accept fields they do not name
(`extra="allow"`) where the wire may carry more. A submitted claim is the allocator's own `ResourceClaim`
model (shared.dra.model), which it validates in full itself: a malformed one gets a Rejected status with the
reason, not a refusal here.

A claim status is a TypedDict, not a model: the allocator builds one per decision (thousands a second), and
a plain dict is what the outbox stores and orjson writes; readers validate it with `read_status`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal, NotRequired, Required

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    GetJsonSchemaHandler,
    JsonValue,
    RootModel,
    TypeAdapter,
    ValidationError,
    with_config,
)
from typing_extensions import TypedDict  # pydantic reads typing's only from Python 3.12

from shared.dra import model

if TYPE_CHECKING:
    from pydantic.json_schema import JsonSchemaValue
    from pydantic_core import CoreSchema

ClaimState = Literal["Pending", "Allocated", "Rejected", "Preempted", "Released"]
Severity = Literal["critical", "warning", "info"]


class _Wire(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)


class ResourceClaim(model.ResourceClaim):
    """A Kubernetes resource.k8s.io/v1 ResourceClaim, as kubectl would create it: metadata.name is required
    (it is a token of the claim's status subject), metadata.namespace is the tenant or empty. Broker settings
    ride in metadata.annotations: claimbroker.io/priority (an integer), claimbroker.io/preemptible ("false"
    protects a running claim)."""


class Release(_Wire):
    """Give back an allocated claim, or withdraw a waiting one."""

    name: str = Field(description="the claim's name, in the subject's tenant")


@with_config(ConfigDict(extra="allow", strict=True))
class DeviceResult(TypedDict):
    request: Annotated[str, Field(description="the request's name; parent/sub for a firstAvailable subrequest")]
    driver: str
    pool: str
    device: str
    adminAccess: NotRequired[bool]


@with_config(ConfigDict(extra="allow", strict=True))
class AllocatedDevices(TypedDict):
    results: list[DeviceResult]
    config: NotRequired[list[dict[str, Any]]]


@with_config(ConfigDict(extra="allow", strict=True))
class Allocation(TypedDict):
    """Mirrors ResourceClaim.status.allocation, plus nodeName."""

    nodeName: str
    devices: AllocatedDevices
    nodeSelector: NotRequired[dict[str, Any] | None]


@with_config(ConfigDict(extra="allow", strict=True))
class EstimatedStart(TypedDict):
    """When the broker expects to allocate a waiting claim, from its decision core run forward."""

    p50: Annotated[str, Field(description="RFC 3339: as likely before as after")]
    p90: Annotated[str | None, Field(description="RFC 3339: nine times in ten before; null when not found")]
    blockedBy: Annotated[list[str], Field(description="what it waits for: claims whose end frees its devices, "
                                                      "a quota, a gang member missing")]


_PUBLISHED: list[JsonValue] = ["namespace", "name", "state", "allocation", "reason", "observedAt", "sequence"]


@with_config(ConfigDict(extra="allow", strict=True, json_schema_extra={"required": _PUBLISHED}))
class ClaimStatus(TypedDict, total=False):
    """A claim's state after each decision; the last one per claim is its current state. The broker always
    writes the required fields, `by` and `unsatisfiable` only when they apply; a reader needs only
    namespace, name and state (`read_status`)."""

    namespace: Required[Annotated[str, Field(description="the tenant")]]
    name: Required[str]
    state: Required[ClaimState]
    allocation: Allocation | None
    reason: Annotated[str | None, Field(description="why it waits, was rejected or preempted, with the numbers")]
    observedAt: Annotated[str, Field(description="RFC 3339 time of the decision")]
    sequence: Annotated[int, Field(description="per claim, increasing: a consumer keeps the highest it has seen")]
    by: Annotated[str, Field(description="tenant/name of the claim that preempted it (Preempted only)")]
    unsatisfiable: Annotated[bool, Field(description="no device of today's fleet could ever satisfy it (Pending "
                                                     "only)")]
    estimatedStart: Annotated[EstimatedStart | None, Field(
        description="Pending only: when the broker expects to allocate it (null: nothing can be said); published "
                    "again when it moves by more than a tenth of the time still to wait")]
    estimatedStartReason: Annotated[str, Field(
        description="Pending only, with a null estimatedStart: why nothing can be said (a sentence a person can "
                    "act on)")]


_CLAIM_STATUS = TypeAdapter(ClaimStatus)


class ClaimStatusSchema(RootModel[ClaimStatus]):
    """ClaimStatus as FastStream's AsyncAPI generator takes a payload: a pydantic model (given a TypedDict
    that nests others, it names the wrong schema). Its JSON schema is ClaimStatus's own, under that name."""

    @classmethod
    def __get_pydantic_json_schema__(cls, core_schema: CoreSchema, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        return handler.resolve_ref_schema(handler(core_schema))


class UnreadableStatus(ValueError):
    """A message on a status subject that is not a claim status; the message names the first bad field."""


def read_status(data: bytes | str) -> ClaimStatus:
    """A status message's JSON as a `ClaimStatus`, its fields in the order declared, then any it does not
    name (a newer broker's). Strict: a value of another JSON type is refused, not converted (a sequence
    "3" is no sequence). Raises UnreadableStatus."""
    try:
        return _CLAIM_STATUS.validate_json(data)
    except ValidationError as error:
        raise UnreadableStatus(_first_problem(error)) from None


def _first_problem(error: ValidationError) -> str:
    problem = error.errors(include_url=False, include_input=False)[0]
    where = ".".join(str(part) for part in problem["loc"])
    return f"{where}: {problem['msg']}" if where else problem["msg"]


class Alert(_Wire):
    """One alert message: raised (resolved false), folded repeats counted, then resolved."""

    kind: str = Field(description="claim-rejected, claim-pending-too-long, claim-unsatisfiable, "
                                  "quota-near-limit, claim-preempted, node-lost, inventory-stale, "
                                  "device-unhealthy, device-throttled, idle-larger-flavor, gang-incomplete, "
                                  "invalid-message, service-degraded, ...")
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
