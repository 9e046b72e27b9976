"""A claim message as the allocator reads it: its id in the inbox (counted within its kind and tenant),
and what it holds (a submission, a release, or why it cannot be read). Whatever a message holds, reading
it never raises: a tenant's message must not stop the allocator."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from nats.aio.msg import Msg

from shared.contract import subjects
from shared.dra import model as dra
from shared.dra.claims import InvalidClaim, claim_name_problem, read_submission, tenant_problem
from shared.ledger import inbox

CONSUMER = "allocator"  # its durable consumer of the claims stream, and its name in the inbox
MAX_MESSAGE_ID = 255  # the inbox's column
MAX_TENANT = 253  # the inbox's tenant column, as every tenant column
KINDS = ("submit", "release")  # a claim subject's kinds; any other subject's messages count as "other"


def inbox_id(message_id: str, limit: int = MAX_MESSAGE_ID) -> str:
    """The id the inbox keeps: the message's own when it fits the column, else a digest of it (a release of
    a 253-character name builds a longer one), so a long id is still deduplicated, never refused."""
    if len(message_id) <= limit and message_id.isprintable():
        return message_id
    return "sha256:" + hashlib.sha256(message_id.encode("utf-8", "surrogatepass")).hexdigest()


def inbox_key(subject: str, message_id: str | None, stream_sequence: int) -> inbox.Key:
    """What the message's id counts within: its kind and its tenant, both from its subject (whatever it
    holds: an unreadable subject still has a key), and its `Nats-Msg-Id` (else its stream sequence). One
    tenant's id never hides another's, nor a release a submission of the same id."""
    parts = subject.split(".")
    kind = parts[3] if len(parts) > 3 and parts[3] in KINDS else "other"
    tenant = parts[4] if len(parts) > 4 else ""
    return inbox.Key(kind, inbox_id(tenant, MAX_TENANT), inbox_id(message_id or f"seq:{stream_sequence}"))


def message_key(message: Msg) -> inbox.Key:
    """The message's id in the inbox: its Nats-Msg-Id (else its stream sequence), within its kind and tenant."""
    return inbox_key(message.subject, (message.headers or {}).get("Nats-Msg-Id"), message.metadata.sequence.stream)


def printable(text: str, limit: int = 2000) -> str:
    """Text from a tenant's message made safe for any column and payload: no NUL (PostgreSQL refuses it),
    no lone surrogate (no UTF-8 encodes it), no control character, bounded."""
    cut = text[:limit]
    safe = "".join(c if c.isprintable() else f"\\u{ord(c):04x}" for c in cut)
    return safe if len(text) <= limit else safe + "..."


@dataclass(frozen=True)
class ClaimMessage:
    """One submit or release message as read: its claim (a submission), the name it releases, or why it
    cannot be read."""

    message_id: str
    tenant: str
    claim: dra.ResourceClaim | None = None
    name: str | None = None  # the claim it names, when one can be read from it
    invalid: InvalidClaim | None = None
    sequence: int = 0  # the claims stream's sequence (0: unknown): a submission older than a release is released


def read_message(subject: str, data: bytes, message_id: str, sequence: int = 0) -> ClaimMessage:
    """The one guarded place per message: whatever it holds, the result says what it is or why it cannot
    be read, and nothing raises (a tenant's message must not stop the allocator)."""
    parts = subject.split(".")
    tenant = parts[4] if len(parts) > 4 else ""
    try:
        return _read(subject, data, message_id, sequence)
    except Exception as error:  # the one guard per message: whatever it was, the message is invalid, not the service
        problem = InvalidClaim(f"message could not be read: {type(error).__name__}: {error}")
        return ClaimMessage(message_id, "" if tenant_problem(tenant) else tenant, invalid=problem, sequence=sequence)


def _read(subject: str, data: bytes, message_id: str, sequence: int) -> ClaimMessage:
    try:
        tenant = subjects.tenant_of(subject)
    except subjects.SubjectError:
        return ClaimMessage(message_id, "", invalid=InvalidClaim(
            f"subject {printable(subject, 300)!r} is not a claim subject: claims go to "
            f"{subjects.PREFIX}.claims.submit.<tenant> and releases to {subjects.PREFIX}.claims.release.<tenant>"),
            sequence=sequence)
    if (problem := tenant_problem(tenant)) is not None:
        return ClaimMessage(message_id, "", invalid=InvalidClaim(f"subject: {problem}"), sequence=sequence)
    if subject.startswith(subjects.PREFIX + ".claims.submit."):
        try:
            claim = read_submission(data, tenant)
        except InvalidClaim as invalid:
            return ClaimMessage(message_id, tenant, name=carried(invalid.name), invalid=invalid, sequence=sequence)
        return ClaimMessage(message_id, tenant, claim=claim, name=claim.metadata.name, sequence=sequence)
    try:
        name = json.loads(data)["name"]
        if not isinstance(name, str):
            raise TypeError
    except (ValueError, KeyError, TypeError, RecursionError):
        return ClaimMessage(message_id, tenant, invalid=InvalidClaim('release payload must be {"name": ...}'),
                            sequence=sequence)
    if (problem := claim_name_problem(name, "name")) is not None:
        return ClaimMessage(message_id, tenant, invalid=InvalidClaim(f"release: {problem}"), sequence=sequence)
    return ClaimMessage(message_id, tenant, name=name, sequence=sequence)


def carried(name: str | None) -> str | None:
    """The claim name a Rejected status can be written under: one a subject carries (a name Kubernetes
    refuses for its case, or for where a '-' or '.' is, still is). Any other is answered by an alert."""
    return name if subjects.carries(name) else None
