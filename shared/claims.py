"""Reading a tenant's claim: namespace as tenant, broker annotations, and what makes one invalid."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from shared import dra, subjects

PRIORITY_ANNOTATION = "claimbroker.io/priority"
PREEMPTIBLE_ANNOTATION = "claimbroker.io/preemptible"


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
    annotations = claim.metadata.annotations
    raw_priority = annotations.get(PRIORITY_ANNOTATION, "0")
    try:
        priority = int(raw_priority)
    except ValueError:
        raise InvalidClaim(
            f"metadata.annotations.{PRIORITY_ANNOTATION}: {raw_priority!r} is not an integer"
        ) from None
    preemptible = annotations.get(PREEMPTIBLE_ANNOTATION, "true").strip().lower() != "false"
    return ClaimSettings(priority=priority, preemptible=preemptible)


def with_namespace(document: dict[str, Any], tenant: str) -> dict[str, Any]:
    """A claim without a namespace belongs to the given tenant, as kubectl -n would do."""
    metadata = dict(document.get("metadata") or {})
    if not metadata.get("namespace"):
        metadata["namespace"] = tenant
    return {**document, "metadata": metadata}


def read_submission(payload: bytes, tenant: str) -> dra.ResourceClaim:
    """Parse a submit message for `tenant`; raises InvalidClaim naming the field."""
    try:
        document = json.loads(payload)
    except (ValueError, UnicodeDecodeError) as error:
        raise InvalidClaim(f"payload is not JSON: {error}") from None
    name = None
    namespace = None
    if isinstance(document, dict) and isinstance(document.get("metadata"), dict):
        raw_name = document["metadata"].get("name")
        name = raw_name if isinstance(raw_name, str) and raw_name else None
        raw_ns = document["metadata"].get("namespace")
        namespace = raw_ns if isinstance(raw_ns, str) and raw_ns else None
    if namespace is not None and namespace != tenant:
        raise InvalidClaim(
            f"metadata.namespace {namespace!r} does not match the subject's tenant {tenant!r}",
            name=name, namespace=namespace,
        )
    if name is not None:
        try:
            subjects.token(name)
        except subjects.SubjectError as error:
            raise InvalidClaim(f"metadata.name: {error}", name=None, namespace=tenant) from None
    try:
        claim = dra.parse_claim(with_namespace(document, tenant))
        settings_of(claim)
    except (dra.DocumentError, InvalidClaim) as error:
        raise InvalidClaim(str(error), name=name, namespace=tenant) from None
    return claim
