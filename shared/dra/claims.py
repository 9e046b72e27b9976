"""Reading a tenant's claim: namespace as tenant, broker annotations, and what makes one invalid.

Everything that reaches the ledger is checked here or in shared.dra.model first: names fit their columns,
the priority fits the 32-bit column, and no string holds what PostgreSQL refuses. One bad value in a batch
would otherwise make the database refuse the whole batch.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shared.dra import model as dra

PRIORITY_ANNOTATION = "claimbroker.io/priority"
PREEMPTIBLE_ANNOTATION = "claimbroker.io/preemptible"
GANG_ANNOTATION = "claimbroker.io/gang"
GANG_SIZE_ANNOTATION = "claimbroker.io/gang-size"
GANG_TOPOLOGY_ANNOTATION = "claimbroker.io/gang-topology"
GANG_TOPOLOGY_MODE_ANNOTATION = "claimbroker.io/gang-topology-mode"
GANG_TOPOLOGY_WAIT_ANNOTATION = "claimbroker.io/gang-topology-wait"
EXPECTED_RUNTIME_ANNOTATION = "claimbroker.io/expected-runtime"
MAX_EXPECTED_RUNTIME = 365 * 86400.0  # a year: start estimates look no further
GANG_ONLY_ANNOTATIONS = (GANG_SIZE_ANNOTATION, GANG_TOPOLOGY_ANNOTATION, GANG_TOPOLOGY_MODE_ANNOTATION,
                         GANG_TOPOLOGY_WAIT_ANNOTATION)
MAX_GANG_SIZE = 256
TOPOLOGY_MODES = ("required", "preferred")
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1  # the ledger's priority column is a 32-bit INTEGER
_PRIORITY = re.compile(r"-?[0-9]+")  # ASCII only: int() would also take "٣", "1_000" and " 1 "
_GANG_SIZE = re.compile(r"[0-9]{1,3}")
# a Kubernetes label key: an optional DNS subdomain prefix and '/', then a name of 63 characters at most
_LABEL_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
# a Go duration as Kubernetes writes one: numbers with units, "90m", "1h30m", "0s"
_DURATION = re.compile(r"(?:[0-9]+(?:\.[0-9]+)?(?:ms|s|m|h))+|0")
_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h)")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


class InvalidClaim(ValueError):
    """The submission is not a claim the broker can take; `name` is set when one could be read."""

    def __init__(self, message: str, *, name: str | None = None, namespace: str | None = None) -> None:
        super().__init__(message)
        self.name = name
        self.namespace = namespace


@dataclass(frozen=True)
class GangSettings:
    """A claim's gang as its annotations state it: the members of one gang of a tenant are admitted all or
    nothing, on nodes that share one value of the `topology` node label when one is given."""

    name: str
    size: int
    topology: str | None = None
    mode: str = "required"  # "required": never split across label values; "preferred": as few as may be
    wait: float = 0.0  # seconds, with "preferred": how long to wait for room in one value before splitting


@dataclass(frozen=True)
class ClaimSettings:
    priority: int
    preemptible: bool
    gang: GangSettings | None = None
    expected_runtime: float | None = None  # seconds, from claimbroker.io/expected-runtime: for start estimates


def label_key_problem(key: str) -> str | None:
    """Why `key` cannot be a Kubernetes label key (an optional DNS subdomain prefix and '/', then a name)."""
    prefix, _, name = key.rpartition("/")
    if "/" in key and not (prefix and len(prefix) <= 253 and dra.is_dns_subdomain(prefix)):
        return "its prefix must be a DNS subdomain"
    if not _LABEL_NAME.fullmatch(name):
        return ("its name must be 1 to 63 characters of letters, digits, '-', '_' and '.', beginning and ending "
                "with a letter or digit")
    return None


def duration_seconds(text: str) -> float | None:
    """A Go duration ("90m", "1h30m", "0s") in seconds; None when it is not one."""
    if not text.isascii() or len(text) > 64 or not _DURATION.fullmatch(text):
        return None
    return sum(float(n) * _DURATION_UNITS[unit] for n, unit in _DURATION_PART.findall(text))


def _annotation_problem(name: str, value: str, rule: str) -> InvalidClaim:
    return InvalidClaim(f"metadata.annotations[{name}]: {dra.shown(value)} {rule}")


def gang_name(claim: dra.ResourceClaim) -> str | None:
    """The gang a claim belongs to, by its annotation as written (a claim that was accepted has read it
    strictly already): what running and waiting claims are grouped by."""
    return claim.metadata.annotations.get(GANG_ANNOTATION)


def gang_of(annotations: Mapping[str, str]) -> GangSettings | None:
    """The claim's gang from its annotations, strictly: a gang-size that does not read would otherwise split
    a job into gangs that never complete. None for a claim without the gang annotation (a dict lookup)."""
    name = annotations.get(GANG_ANNOTATION)
    if name is None:
        for stray in GANG_ONLY_ANNOTATIONS:
            if stray in annotations:
                raise _annotation_problem(stray, annotations[stray], f"is read only with {GANG_ANNOTATION}")
        return None
    if not dra.is_dns_label(name):
        raise _annotation_problem(GANG_ANNOTATION, name, dra.DNS_LABEL_RULE)
    raw_size = annotations.get(GANG_SIZE_ANNOTATION)
    if raw_size is None:
        raise InvalidClaim(f"metadata.annotations[{GANG_SIZE_ANNOTATION}]: is required with {GANG_ANNOTATION} "
                           f"(how many members gang {name} has, 1 to {MAX_GANG_SIZE})")
    if not _GANG_SIZE.fullmatch(raw_size) or not 1 <= int(raw_size) <= MAX_GANG_SIZE:
        raise _annotation_problem(GANG_SIZE_ANNOTATION, raw_size,
                                  f"must be an integer from 1 to {MAX_GANG_SIZE} (ASCII digits)")
    topology = annotations.get(GANG_TOPOLOGY_ANNOTATION)
    if topology is not None and (problem := label_key_problem(topology)) is not None:
        raise _annotation_problem(GANG_TOPOLOGY_ANNOTATION, topology, f"is not a node label key: {problem}")
    mode = annotations.get(GANG_TOPOLOGY_MODE_ANNOTATION)
    raw_wait = annotations.get(GANG_TOPOLOGY_WAIT_ANNOTATION)
    if topology is None:
        for stray in (GANG_TOPOLOGY_MODE_ANNOTATION, GANG_TOPOLOGY_WAIT_ANNOTATION):
            if stray in annotations:
                raise _annotation_problem(stray, annotations[stray], f"is read only with {GANG_TOPOLOGY_ANNOTATION}")
    if mode is not None and mode not in TOPOLOGY_MODES:
        raise _annotation_problem(GANG_TOPOLOGY_MODE_ANNOTATION, mode, 'must be "required" or "preferred"')
    wait = 0.0
    if raw_wait is not None:
        seconds = duration_seconds(raw_wait)
        if seconds is None:
            raise _annotation_problem(GANG_TOPOLOGY_WAIT_ANNOTATION, raw_wait,
                                      'must be a duration such as "0s", "90s", "10m" or "1h30m"')
        wait = seconds
    return GangSettings(name, int(raw_size), topology, mode or "required", wait)


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
    return ClaimSettings(priority=priority, preemptible=raw_preemptible.lower() == "true",
                         gang=gang_of(annotations), expected_runtime=expected_runtime_of(annotations))


def expected_runtime(claim: dra.ResourceClaim) -> float | None:
    """The claim's expected runtime in seconds, leniently: None where the annotation is absent or does not read
    (a claim accepted before the annotation was checked); what running and waiting claims are estimated by."""
    try:
        return expected_runtime_of(claim.metadata.annotations)
    except InvalidClaim:
        return None


def expected_runtime_of(annotations: Mapping[str, str]) -> float | None:
    """How long the claim says it will run once Allocated (claimbroker.io/expected-runtime), in seconds: more
    than 0 and at most 365 days; None without the annotation. Used for start estimates, never enforced."""
    raw = annotations.get(EXPECTED_RUNTIME_ANNOTATION)
    if raw is None:
        return None
    seconds = duration_seconds(raw)
    if seconds is None or not 0 < seconds <= MAX_EXPECTED_RUNTIME:
        raise _annotation_problem(EXPECTED_RUNTIME_ANNOTATION, raw,
                                  'must be a duration such as "45s", "90m" or "2h30m", more than 0s and at most '
                                  '8760h (365 days)')
    return seconds


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
