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


# What a claim's or node's name may hold to be carried in a subject: Kubernetes' names (DNS subdomains) and
# the names it refuses for their case or the place of a '-' or '.', which still get a Rejected status there.
# No '_': it stands for '.' in a subject (a Kubernetes name never holds one), so a name holding one would
# share its token with the dotted name.
_CARRIED = re.compile(r"[A-Za-z0-9.-]{1,253}")


def carries(name: object) -> bool:
    """Whether `name` (of a claim or node) has a subject token: `name_token` takes it."""
    return isinstance(name, str) and _CARRIED.fullmatch(name) is not None


def name_token(name: str) -> str:
    """A claim's or node's name as one subject token: Kubernetes allows '.' in these names (`train.v2`,
    `node-1.example.com`), which would split the subject, and never '_', so each '.' is written '_' and the
    token reads back as the name (`name_of`). The payload keeps the name as it is."""
    if not carries(name):
        raise SubjectError(f"{name!r} cannot be carried in a subject (ASCII letters, digits, '-' and '.', "
                           "at most 253 characters)")
    return name.replace(".", "_")


def name_of(carried: str) -> str:
    """The claim's or node's name a subject token stands for (`name_token` backwards)."""
    return carried.replace("_", ".")


def inventory(node: str) -> str:
    """`claimbroker.v1.inventory.<node>`: a dotted node name's dots are written '_'."""
    return f"{PREFIX}.inventory.{name_token(node)}"


def submit(tenant: str) -> str:
    return f"{PREFIX}.claims.submit.{token(tenant)}"


def release(tenant: str) -> str:
    return f"{PREFIX}.claims.release.{token(tenant)}"


def status(tenant: str, claim: str) -> str:
    """`claimbroker.v1.claims.status.<tenant>.<claim>`: a dotted claim name's dots are written '_'."""
    return f"{PREFIX}.claims.status.{token(tenant)}.{name_token(claim)}"


def status_parts(subject: str) -> tuple[str, str]:
    """The tenant token and claim token of a status subject, as they are in it."""
    parts = subject.split(".")
    if len(parts) != 6 or parts[2:4] != ["claims", "status"]:
        raise SubjectError(f"not a status subject: {subject!r}")
    return parts[4], parts[5]


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
