"""The API server's rules for a ResourceClaim (k8s.io/kubernetes pkg/apis/resource/validation,
apimachinery's ObjectMeta validation, the CEL compiler's static checks in shared.dra.cel_static): names,
enums, uniqueness, list sizes and references, each problem reported with its field path."""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from shared.dra.cel_static import static_problems
from shared.dra.names import (
    DNS_LABEL_RULE,
    DNS_SUBDOMAIN_RULE,
    RFC3339_RULE,
    attribute_name_problem,
    driver_name_problem,
    generate_name_problem,
    is_dns_label,
    is_dns_subdomain,
    is_quantity,
    is_rfc3339,
    label_value_problem,
    qualified_name_problem,
)
from shared.dra.problems import shown, validation_problems
from shared.dra.v1 import (
    INT64_MAX,
    MAX_ANNOTATIONS_SIZE,
    MAX_CONFIGS,
    MAX_CONSTRAINTS,
    MAX_DEVICES_PER_CLAIM,
    MAX_OPAQUE_PARAMETERS,
    MAX_REQUESTS,
    MAX_SELECTORS,
    MAX_SUBREQUESTS,
    MAX_TOLERATIONS,
    ClaimMeta,
    ClaimStatus,
    DeviceClaim,
    DeviceRequest,
    DeviceSubRequest,
    ExactDeviceRequest,
    ManagedFieldsEntry,
    OpaqueConfig,
    OwnerReference,
    ResourceClaim,
    Toleration,
)

MAX_STATIC_CEL_BYTES = 64 * 1024  # a claim's selector text checked for compile errors at read time (the broker's)
STANDARD_FINALIZERS = frozenset({"kubernetes", "orphan", "foregroundDeletion"})  # helper.IsStandardFinalizerName
MAX_FIELD_MANAGER = 128  # metav1 validation FieldManagerMaxLength
MAX_SUBRESOURCE = 256  # metav1 validation MaxSubresourceNameLength


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
        bodies: list[tuple[str, ExactDeviceRequest | DeviceSubRequest]] = (
            [(f"{at}.exactly", request.exactly)] if request.exactly
            else [(f"{at}.firstAvailable[{j}]", sub) for j, sub in enumerate(subrequests)])
        for path, body in bodies:
            for k, selector in enumerate(body.selectors[:MAX_SELECTORS]):
                budget -= len(selector.cel.expression)
                if budget < 0:
                    return
                problems += [f"{path}.selectors[{k}].cel.expression: CEL compile error: {problem}"
                             for problem in static_problems(selector.cel.expression)]


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
    if meta.generate_name and (problem := generate_name_problem(meta.generate_name)) is not None:
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
                if attribute is not None and (problem := attribute_name_problem(attribute)) is not None:
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


def _check_body(body: ExactDeviceRequest | DeviceSubRequest, path: str, problems: list[str], *, exact: bool) -> None:
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
        if (problem := attribute_name_problem(key, domain_required=False)) is not None:
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


def _check_opaque(opaque: OpaqueConfig, path: str, problems: list[str]) -> None:
    if (problem := driver_name_problem(opaque.driver)) is not None:
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
