"""Reading a tenant's claim: namespace as tenant, broker annotations, and what makes one invalid.

Everything that reaches the ledger is checked here or in shared.dra.model first: names fit their columns,
the priority fits the 32-bit column, and no string holds what PostgreSQL refuses. One bad value in a batch
would otherwise make the database refuse the whole batch.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from shared.dra import model as dra

PRIORITY_ANNOTATION = "claimbroker.io/priority"
PREEMPTIBLE_ANNOTATION = "claimbroker.io/preemptible"
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1  # the ledger's priority column is a 32-bit INTEGER
_PRIORITY = re.compile(r"-?[0-9]+")  # ASCII only: int() would also take "٣", "1_000" and " 1 "


class InvalidClaim(ValueError):
    """The submission is not a claim the broker can take; `name` is set when one could be read."""

    def __init__(self, message: str, *, name: str | None = None, namespace: str | None = None) -> None:
        super().__init__(message)
        self.name = name
        self.namespace = namespace


@dataclass(frozen=True)
class ClaimSettings:
    priority: int
    preemptible: bool


def settings_of(claim: dra.ResourceClaim) -> ClaimSettings:
    """The broker's annotations, strictly: a typo must not silently become priority 0 or preemptible."""
    annotations = claim.metadata.annotations
    priority = 0
    raw_priority = annotations.get(PRIORITY_ANNOTATION)
    if raw_priority is not None:
        digits = raw_priority.lstrip("-").lstrip("0")
        if (not _PRIORITY.fullmatch(raw_priority) or len(digits) > 10  # int() of a huge string is slow
                or not INT32_MIN <= int(raw_priority) <= INT32_MAX):
            raise InvalidClaim(
                f"metadata.annotations[{PRIORITY_ANNOTATION}]: {dra.shown(raw_priority)} must be an integer from "
                f"{INT32_MIN} to {INT32_MAX} (an optional '-' and ASCII digits)"
            )
        priority = int(raw_priority)
    raw_preemptible = annotations.get(PREEMPTIBLE_ANNOTATION, "true")
    if not raw_preemptible.isascii() or raw_preemptible.lower() not in ("true", "false"):
        raise InvalidClaim(
            f"metadata.annotations[{PREEMPTIBLE_ANNOTATION}]: {dra.shown(raw_preemptible)} must be \"true\" or "
            "\"false\""
        )
    return ClaimSettings(priority=priority, preemptible=raw_preemptible.lower() == "true")


def claim_name_problem(name: object, path: str = "metadata.name") -> str | None:
    """Why `name` cannot name a claim: Kubernetes wants an object's name to be a DNS subdomain (a '.' is
    fine: its subject writes it '_', shared.contract.subjects.name_token)."""
    if not isinstance(name, str) or not name:
        return f"{path}: is required"
    if not dra.is_dns_subdomain(name):
        return f"{path}: {dra.shown(name)} {dra.DNS_SUBDOMAIN_RULE}, as Kubernetes requires of an object's name"
    return None


def namespace_problem(namespace: object, path: str = "metadata.namespace") -> str | None:
    """Why `namespace` cannot be a claim's namespace (its tenant): Kubernetes wants a DNS label."""
    if not dra.is_dns_label(namespace):
        return f"{path}: {dra.shown(namespace)} {dra.DNS_LABEL_RULE}, as Kubernetes requires of a namespace"
    return None


def tenant_problem(tenant: object) -> str | None:
    """Why `tenant` cannot be a tenant: it is the claims' namespace, a DNS label in Kubernetes."""
    if not dra.is_dns_label(tenant):
        return f"tenant {dra.shown(tenant)} {dra.DNS_LABEL_RULE}"
    return None


def with_namespace(document: Any, tenant: str) -> Any:
    """A claim without a namespace belongs to the given tenant, as kubectl -n would do. Anything that
    is not a claim-shaped mapping is left for the parser to refuse by name."""
    if not isinstance(document, dict):
        return document
    metadata = document.get("metadata")
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict):
        return document
    if not metadata.get("namespace"):
        metadata = {**metadata, "namespace": tenant}
    return {**document, "metadata": metadata}


class _Repeated(dict[str, Any]):
    """A JSON object that named a field more than once (json.loads keeps the last value)."""

    repeated: list[str]


def _repeated(document: dict[str, Any], pairs: list[tuple[str, Any]]) -> _Repeated:
    """The object as a _Repeated that remembers the keys its JSON gave twice."""
    repeated = _Repeated(document)
    seen: set[str] = set()
    repeated.repeated = [k for k, _ in pairs if k in seen or seen.add(k)]  # type: ignore[func-returns-value]
    return repeated


def _opaque_parameters(path: str) -> bool:
    """An opaque config's parameters are a RawExtension: the API server keeps their bytes and decodes them
    leniently, so a field given twice there is no error."""
    return re.fullmatch(r"spec\.devices\.config\[[0-9]+\]\.opaque\.parameters.*", path) is not None


def repeated_field_problems(document: Any) -> list[str]:
    """Each field a JSON document gives twice, by path: the API server's strict decoding (kubectl's default,
    --validate=strict) refuses it as "duplicate field", where json.loads would silently keep the last."""
    problems = []
    stack: list[tuple[str, Any]] = [("", document)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, dict):
            if isinstance(item, _Repeated) and not _opaque_parameters(path):
                problems += [f"{path or '<document>'}: duplicate field {dra.shown(k)}" for k in item.repeated]
            stack.extend((f"{path}.{k}" if path else k, v) for k, v in item.items())
        elif isinstance(item, list):
            stack.extend((f"{path}[{i}]", v) for i, v in enumerate(item))
    return sorted(problems)


class _NotANumber(ValueError):
    """A number json.loads takes and the API server's decoder refuses."""


def _not_json(name: str) -> Any:
    """json.loads takes NaN and Infinity, which are not JSON."""
    raise _NotANumber(f"{name} is not a JSON value")


def _finite(text: str) -> float:
    """A number a float64 cannot hold (1e999) fails Go's decoder; json.loads would make it infinity."""
    value = float(text)
    if not math.isfinite(value):
        raise _NotANumber(f"{text[:40]} is out of range for a 64-bit float")
    return value


def read_submission(payload: bytes, tenant: str) -> dra.ResourceClaim:
    """Parse a submit message for `tenant`; raises InvalidClaim naming the field. Its `name` is the claim's
    name as written, whenever it is a string, valid or not: the caller decides whether a subject can carry a
    Rejected status under it (shared.contract.subjects.carries)."""
    repeated = False

    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        """json.loads' object_pairs_hook, one call per object (a read costs a microsecond per object here)."""
        nonlocal repeated
        document = dict(pairs)
        if len(document) == len(pairs):
            return document
        repeated = True
        return _repeated(document, pairs)

    number_problem: str | None = None
    try:
        document = json.loads(payload, object_pairs_hook=hook, parse_constant=_not_json, parse_float=_finite)
    except _NotANumber as error:
        number_problem = f"payload: {error} (the API server's decoder refuses it)"
        try:  # read again, leniently, only for the claim's name
            document = json.loads(payload)
        except (ValueError, RecursionError):
            raise InvalidClaim(number_problem) from None
    except (ValueError, UnicodeDecodeError, RecursionError) as error:
        raise InvalidClaim(f"payload is not JSON: {error}") from None
    if (problem := tenant_problem(tenant)) is not None:
        raise InvalidClaim(f"subject: {problem}")
    raw_name: object = None
    raw_namespace: object = None
    if isinstance(document, dict) and isinstance(document.get("metadata"), dict):
        raw_name = document["metadata"].get("name")
        raw_namespace = document["metadata"].get("namespace")
    name_problem = claim_name_problem(raw_name)
    name = raw_name if isinstance(raw_name, str) and raw_name else None
    if isinstance(raw_namespace, str) and raw_namespace and raw_namespace != tenant:
        raise InvalidClaim(
            f"metadata.namespace: {dra.shown(raw_namespace)} does not match the subject's tenant {tenant!r}",
            name=name, namespace=tenant,
        )
    if name_problem is not None and isinstance(raw_name, str):
        raise InvalidClaim(name_problem, name=name, namespace=tenant)
    if number_problem is not None:
        raise InvalidClaim(number_problem, name=name, namespace=tenant)
    if repeated and (problems := repeated_field_problems(document)):
        raise InvalidClaim(dra.joined(problems), name=name, namespace=tenant)
    try:
        claim = dra.parse_claim(with_namespace(document, tenant))
        settings_of(claim)
    except (dra.DocumentError, InvalidClaim) as error:
        raise InvalidClaim(str(error), name=name, namespace=tenant) from None
    return claim
