"""NATS subjects and JetStream streams of the contract (prefix claimbroker.v1)."""

from __future__ import annotations

import re

PREFIX = "claimbroker.v1"
_TOKEN = re.compile(r"^[A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]+)*$")

INVENTORY_STREAM = "CLAIMBROKER_INVENTORY"
CLAIMS_STREAM = "CLAIMBROKER_CLAIMS"
STATUS_STREAM = "CLAIMBROKER_STATUS"
ALERTS_STREAM = "CLAIMBROKER_ALERTS"

INVENTORY_ALL = f"{PREFIX}.inventory.>"
SUBMIT_ALL = f"{PREFIX}.claims.submit.>"
RELEASE_ALL = f"{PREFIX}.claims.release.>"
STATUS_ALL = f"{PREFIX}.claims.status.>"
ALERTS_ALL = f"{PREFIX}.alerts.>"


class SubjectError(ValueError):
    pass


def token(value: str) -> str:
    """A name used as one subject token: no dots, spaces or wildcards."""
    if not value or "." in value or not _TOKEN.match(value):
        raise SubjectError(f"{value!r} is not a valid subject token (letters, digits, '-' and '_' only)")
    return value


def inventory(node: str) -> str:
    return f"{PREFIX}.inventory.{token(node)}"


def submit(tenant: str) -> str:
    return f"{PREFIX}.claims.submit.{token(tenant)}"


def release(tenant: str) -> str:
    return f"{PREFIX}.claims.release.{token(tenant)}"


def status(tenant: str, claim: str) -> str:
    return f"{PREFIX}.claims.status.{token(tenant)}.{token(claim)}"


FLEET = "_fleet"  # the tenant token of an alert about no tenant (nodes, devices, flavors, services)


def alert(severity: str, kind: str, tenant: str | None = None) -> str:
    """`claimbroker.v1.alerts.<severity>.<kind>.<tenant>`: the tenant token lets a credential read one
    tenant's alerts (`alerts_of`); `_fleet` (no DNS label has `_`) for alerts about no tenant, and for a
    tenant name no subject can carry (an invalid message's: its alert must still go out; the payload names it)."""
    readable = tenant is not None and _TOKEN.match(tenant) is not None and "." not in tenant
    return f"{PREFIX}.alerts.{token(severity)}.{token(kind)}.{tenant if readable else FLEET}"


def alerts_of(tenant: str) -> str:
    """Every alert about `tenant`, whatever its severity and kind."""
    return f"{PREFIX}.alerts.*.*.{token(tenant)}"


def tenant_of(subject: str) -> str:
    """The tenant token of a submit or release subject."""
    parts = subject.split(".")
    if len(parts) != 5 or parts[2] != "claims" or parts[3] not in ("submit", "release"):
        raise SubjectError(f"not a claim subject: {subject!r}")
    return parts[4]
