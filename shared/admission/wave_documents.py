"""What a `simulate --claims` wave file holds: ResourceClaims, and the documents that script time,
`{kind: Advance, duration: 2h}` (time passes before the wave's claims arrive) and
`{kind: Release, namespace: T, name: N}` (that claim is released in the wave).

An invalid claim only makes that claim Rejected, as a submission would be; an invalid Advance or Release
is the file's author's mistake and stops the run with the file, the document and the field named.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from shared.dra import model as dra
from shared.dra.claims import InvalidClaim, settings_of, with_namespace

# One wave's time passing: a year, so that a simulated clock stays a date a person can read (and that
# datetime can print) over any number of waves a person writes.
MAX_ADVANCE = 365 * 86400.0


class WaveFileError(ValueError):
    """A wave file's Advance or Release document is invalid: names the file, the document and the field."""


@dataclass(frozen=True)
class Advance:
    seconds: float


@dataclass(frozen=True)
class Release:
    namespace: str
    name: str

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)


WaveItem = dra.ResourceClaim | InvalidClaim | Advance | Release
TIME_KINDS = ("Advance", "Release")


def read_claim_document(document: Any, default_tenant: str) -> dra.ResourceClaim | InvalidClaim:
    """A claim, or the reason it is not one (an invalid claim is Rejected, it does not stop the run)."""
    name = None
    if isinstance(document, dict) and isinstance(document.get("metadata"), dict):
        name = document["metadata"].get("name")
        namespace = document["metadata"].get("namespace") or default_tenant
    else:
        namespace = default_tenant
    try:
        claim = dra.parse_claim(with_namespace(document, default_tenant) if isinstance(document, dict) else document)
        settings_of(claim)
        return claim
    except (dra.DocumentError, InvalidClaim) as error:
        return InvalidClaim(str(error), name=name if isinstance(name, str) else None, namespace=namespace)


def read_wave(documents: Sequence[Any], default_tenant: str, origin: str) -> list[WaveItem]:
    """One wave file's documents (`origin` names the file in errors); empty documents are skipped.
    Raises WaveFileError for an invalid Advance or Release, or a wave whose Advances pass more than a year."""
    items: list[WaveItem] = []
    advanced = 0.0
    for index, document in enumerate(documents):
        if document is None:
            continue
        kind = document.get("kind") if isinstance(document, dict) else None
        if kind not in TIME_KINDS:
            items.append(read_claim_document(document, default_tenant))
            continue
        where = f"{origin}: document {index + 1} ({kind})"
        item = _read_advance(document, where) if kind == "Advance" else _read_release(document, default_tenant, where)
        if isinstance(item, Advance):
            advanced += item.seconds
            if advanced > MAX_ADVANCE:
                raise WaveFileError(f"{where}: duration: the wave's Advance documents pass more than 365d together")
        items.append(item)
    return items


def _fields(document: dict[Any, Any], allowed: tuple[str, ...], where: str) -> None:
    unknown = sorted(str(k) for k in document if k not in allowed)
    if unknown:
        raise WaveFileError(f"{where}: {dra.shown(unknown[0])}: unknown field (it takes {', '.join(allowed[1:])})")


def _read_advance(document: dict[Any, Any], where: str) -> Advance:
    from shared.settings import parse_duration

    _fields(document, ("kind", "duration"), where)
    raw = document.get("duration")
    if raw is None:
        raise WaveFileError(f"{where}: duration: required (how long passes before the wave's claims arrive, "
                            "e.g. 90s, 10m, 2h)")
    if isinstance(raw, bool) or not isinstance(raw, str | int | float):
        raise WaveFileError(f"{where}: duration: {dra.shown(raw)} is not a duration: use e.g. 90s, 10m, 2h")
    try:
        seconds = parse_duration(raw)
    except OverflowError:  # an integer too large for a float
        raise WaveFileError(f"{where}: duration: {dra.shown(raw)} must be from 0s to 365d") from None
    except ValueError as error:
        raise WaveFileError(f"{where}: duration: {error}") from None
    if not math.isfinite(seconds) or not 0 <= seconds <= MAX_ADVANCE:
        raise WaveFileError(f"{where}: duration: {dra.shown(raw)} must be from 0s to 365d")
    return Advance(seconds)


def _read_release(document: dict[Any, Any], default_tenant: str, where: str) -> Release:
    _fields(document, ("kind", "namespace", "name"), where)
    name = document.get("name")
    if name is None:
        raise WaveFileError(f"{where}: name: required (the claim to release)")
    if not dra.is_dns_subdomain(name):
        raise WaveFileError(f"{where}: name: {dra.shown(name)} {dra.DNS_SUBDOMAIN_RULE}, as a claim's name")
    namespace = document.get("namespace")
    if namespace is None:
        namespace = default_tenant  # as a claim without a namespace belongs to --tenant
    elif not dra.is_dns_label(namespace):
        raise WaveFileError(f"{where}: namespace: {dra.shown(namespace)} {dra.DNS_LABEL_RULE}, as a tenant's name")
    return Release(namespace, name)
