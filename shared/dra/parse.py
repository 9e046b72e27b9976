"""Parsing a resource.k8s.io/v1 document into its model: the kind and API version named, a claim checked by
the API server's rules, every problem a DocumentError that names its field."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError

from shared.dra.claim_rules import claim_problems
from shared.dra.problems import DocumentError, describe_validation_error, joined, text_problems
from shared.dra.v1 import API_VERSION, DeviceClass, ResourceClaim, ResourceSlice


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
