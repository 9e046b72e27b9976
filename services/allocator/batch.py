"""A batch of claim messages applied to the ledger inside the decision transaction.

Every message is parsed first; the claim rows the batch names are read in one query; then the messages
are applied in order, each seeing what the earlier ones did through the rows in hand (a claim submitted,
released and submitted again in one batch), without a query or a flush per message. The new claims are
inserted in one statement and the released claims' devices freed in another. A query and a flush per
message cost most of a batch, nearly all of it the flush of each insert.

A release of a name the ledger has no row of leaves no claim row: it is remembered in early_releases for
the inbox's retention (at most `early_releases_per_tenant` per tenant, the oldest forgotten first), so that
its submission, published before it and delivered after it, still ends Released; and it is answered at
once with a Released status of sequence 0 that JetStream keeps RELEASE_ANSWER_TTL_S (a name never
submitted leaves no status subject behind for good)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from services.allocator import ledger_ops as ops
from shared.admission.quota import QuotaConfig, pending_limit_problem
from shared.contract import events, subjects
from shared.dra import model as dra
from shared.dra.claims import InvalidClaim, claim_name_problem, read_submission, tenant_problem
from shared.dra.results import State
from shared.ledger import inbox
from shared.ledger.schema import Claim

MAX_MESSAGE_ID = 255  # the inbox's column
MAX_TENANT = 253  # the inbox's tenant column, as every tenant column
KINDS = ("submit", "release")  # a claim subject's kinds; any other subject's messages count as "other"
RELEASE_ANSWER_TTL_S = 60.0  # how long JetStream keeps the answer to a release of an unknown claim
DEFAULT_EARLY_RELEASES_PER_TENANT = 1000


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
    except Exception as error:  # noqa: BLE001 - whatever it was, the message is invalid, not the service
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
            return ClaimMessage(message_id, tenant, name=_carried(invalid.name), invalid=invalid, sequence=sequence)
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


def _carried(name: str | None) -> str | None:
    """The claim name a Rejected status can be written under: one a subject carries (a name Kubernetes
    refuses for its case, or for where a '-' or '.' is, still is). Any other is answered by an alert."""
    return name if subjects.carries(name) else None


@dataclass
class _Applied:
    session: AsyncSession
    rows: dict[tuple[str, str], Claim]  # the current row of each claim the batch names that has one
    new: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)  # claims queued, not yet written
    released: list[int] = field(default_factory=list)  # rows whose devices go back
    config: QuotaConfig = field(default_factory=QuotaConfig)
    waiting: dict[str, int] = field(default_factory=dict)  # Pending claims of the tenants with a maxPending
    early: dict[tuple[str, str], int] = field(default_factory=dict)  # remembered releases of unknown claims
    early_changed: set[tuple[str, str]] = field(default_factory=set)  # remembered or forgotten in this batch
    answer_ttl: float = RELEASE_ANSWER_TTL_S

    async def row(self, key: tuple[str, str]) -> Claim | None:
        """The claim's row; the claims queued earlier in the batch are written first, and all of them read
        back (rarely: a batch that queues claims and then releases one, or sends an unreadable copy)."""
        if key in self.new:
            written = list(self.new)
            await self.write_new()
            self.rows.update(await ops.claims_named(self.session, written))
        return self.rows.get(key)

    async def write_new(self) -> None:
        new, self.new = list(self.new.values()), {}
        await ops.insert_claims(self.session, new)

    async def submit(self, message: ClaimMessage, claim: dra.ResourceClaim) -> bool:
        """Queue the claim, unless it is queued already (claims are immutable: the first one stands; a
        release published before this submission then concerns an earlier one) or was released after this
        submission was published."""
        key, sequence = (message.tenant, claim.metadata.name), message.sequence
        if key in self.new:
            self.new[key]["submitted_seq"] = max(self.new[key]["submitted_seq"] or 0, sequence) or None
            return False
        row = self.rows.get(key)
        if row is not None and row.state in ops.QUEUED:
            row.submitted_seq = max(row.submitted_seq or 0, sequence) or None
            return False
        if row is not None and 0 < sequence < (row.released_seq or 0):
            return False  # released already: a copy of the claim its release ended (or a redelivery of it)
        released_early = self.early.get(key) if row is None else None
        if released_early is not None and 0 < sequence < released_early:
            self._forget_release(key)
            await self._released_before(message, claim, released_early)
            return False
        if message.tenant in self.waiting:
            problem = pending_limit_problem(self.config.tenant(message.tenant), self.waiting[message.tenant])
            if problem is not None:
                await self.refuse(message, InvalidClaim(problem, name=claim.metadata.name))
                return False
            self.waiting[message.tenant] += 1
        status_sequence, row_released = 0, released_early
        if row is not None:  # it ended: the new claim takes its name, and carries on its status sequence
            status_sequence = row.sequence  # (SQLite may give the new row the old id: status ids stay unique)
            row_released = row.released_seq
            await ops.write_buffered(self.session)  # its history goes with it; its statuses are still sent
            await self.session.delete(row)
            await self.session.flush()  # before the insert that takes its name
            del self.rows[key]
        if released_early is not None:
            self._forget_release(key)  # the new row carries it (a refusal above: the Rejected row does)
        self.new[key] = {**ops.claim_values(claim, status_sequence), "submitted_seq": sequence or None,
                         "released_seq": row_released}
        return True

    async def _released_before(self, message: ClaimMessage, claim: dra.ResourceClaim, released: int) -> None:
        """A submission published before a release that reached us first (the submission came again after a
        crash): the claim is written Released, and its Released status sent once."""
        row = self.rows[(message.tenant, claim.metadata.name)] = Claim(**{
            **ops.claim_values(claim), "state": State.RELEASED.value, "submitted_seq": message.sequence,
            "released_seq": released, "reason": "released by the tenant before the broker read its submission"})
        self.session.add(row)
        await self.session.flush()  # a row with an id, as every row in hand has
        ops.emit_status(self.session, row)

    def _remember_release(self, key: tuple[str, str], sequence: int) -> None:
        self.early[key] = max(self.early.get(key, 0), sequence)
        self.early_changed.add(key)

    def _forget_release(self, key: tuple[str, str]) -> int | None:
        """The stream sequence of the remembered release of this claim, which a row now carries instead."""
        released = self.early.pop(key, None)
        if released is not None:
            self.early_changed.add(key)
        return released

    async def release(self, message: ClaimMessage, name: str) -> bool:
        key = (message.tenant, name)
        row = await self.row(key)
        if row is None:  # its submission may still come (redelivered after a crash): remembered for a while
            if message.sequence:
                self._remember_release(key, message.sequence)
            ops.emit_answer(self.session, message.tenant, name, self.answer_ttl, (
                f"tenant {message.tenant} has no claim {name} waiting or allocated: nothing to release (a "
                f"submission of it published before this release ends Released)"))
            return False
        if message.sequence:
            row.released_seq = max(row.released_seq or 0, message.sequence)
        if row.state not in ops.QUEUED:
            return False
        if 0 < message.sequence < (row.submitted_seq or 0):
            return False  # published before the claim's last submission: it concerned an earlier claim
        self.released.append(row.id)
        if row.state == State.PENDING.value and message.tenant in self.waiting:
            self.waiting[message.tenant] -= 1
        row.state, row.reason, row.allocation, row.node = State.RELEASED.value, "released by the tenant", None, None
        row.explain = None
        ops.emit_status(self.session, row)
        return True

    async def refuse(self, message: ClaimMessage, invalid: InvalidClaim) -> None:
        """A Rejected status on the claim's subject when the message names a claim a subject can carry,
        else an alert: a refusal is always answered."""
        name = _carried(invalid.name) if message.tenant else None
        if name is not None:
            key = (message.tenant, name)
            row = await self.row(key)
            if row is not None and row.state in ops.QUEUED:  # never let a bad resubmission touch a good claim
                self.alert(message, f"claim {name} is {row.state} and stays so; this copy of it is refused: "
                                    f"{invalid}")
                return
            if row is None:
                row = self.rows[key] = Claim(namespace=message.tenant, name=name, state=State.REJECTED.value,
                                             spec={}, sequence=0, priority=0, preemptible=True,
                                             released_seq=self._forget_release(key))
                self.session.add(row)
            if row.id is None:
                await self.session.flush()
            row.state, row.reason, row.allocation, row.node = State.REJECTED.value, printable(str(invalid)), None, None
            ops.emit_status(self.session, row)
            return
        self.alert(message, str(invalid))

    def alert(self, message: ClaimMessage, why: str) -> None:
        """An invalid-message alert about the message, on its tenant's alert subject (`_fleet` when the
        subject names no tenant)."""
        now = datetime.now(UTC).timestamp()
        error, tenant = printable(why), message.tenant or "(unknown)"
        ops.emit_event(
            self.session, subjects.alert("warning", "invalid-message", message.tenant),
            f"alert:invalid:{message.message_id}",
            events.alert(
                kind="invalid-message", severity="warning", key=f"invalid-message:{tenant}",
                summary=f"a message for tenant {tenant} could not be read as a claim: {error}",
                details={"tenant": tenant, "error": error, "messageId": message.message_id},
                labels={"tenant": tenant}, first_seen=now, last_seen=now,
            ),
        )


async def apply_messages(session: AsyncSession, messages: list[ClaimMessage], config: QuotaConfig | None = None,
                         *, now: datetime | None = None,
                         early_releases_per_tenant: int = DEFAULT_EARLY_RELEASES_PER_TENANT,
                         answer_ttl: float = RELEASE_ANSWER_TTL_S) -> bool:
    """Apply the messages in order; whether any claim was queued or released (a cycle has work). With the
    quota `config`, a tenant's submission past its maxPending is Rejected with the number. Releases of
    unknown claims are remembered as of `now`, at most `early_releases_per_tenant` per tenant."""
    named = {(m.tenant, m.name) for m in messages if m.name is not None}
    rows = await ops.claims_named(session, named)
    applied = _Applied(session, rows, config=config or QuotaConfig(), answer_ttl=answer_ttl,
                       early=await ops.early_releases_named(session, named - rows.keys()))
    limited = {m.tenant for m in messages if m.claim is not None and applied.config.tenant(m.tenant).max_pending
               is not None}
    if limited:  # one count per batch, only when a submitting tenant has a limit
        applied.waiting = await ops.pending_counts(session, limited)
    changed = False
    # Queries do not flush what earlier messages wrote: it is in the rows in hand.
    with session.no_autoflush:
        for message in messages:
            if message.invalid is not None:
                await applied.refuse(message, message.invalid)
            elif message.claim is not None:
                changed = await applied.submit(message, message.claim) or changed
            elif message.name is not None:
                changed = await applied.release(message, message.name) or changed
    await applied.write_new()
    await ops.release_devices(session, applied.released)
    if applied.early_changed:
        await ops.write_early_releases(session, {key: applied.early.get(key) for key in applied.early_changed},
                                       now or datetime.now(UTC), early_releases_per_tenant)
    return changed


__all__ = ["ClaimMessage", "apply_messages", "read_message"]
