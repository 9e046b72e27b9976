"""A batch of claim messages applied to the ledger inside the decision transaction, in three steps each
visited once: the ledger's rows of the claims the batch names are read (shared.ledger.intake.read), the
messages are applied to them in memory here (`ClaimBatch`), in order, each seeing what the earlier ones did (a claim
submitted, released and submitted again in one batch), and what that wrote is written
(shared.ledger.intake.write). Statuses, answers and alerts go to the unit of work's writes.

A release of a name the ledger has no row of leaves no claim row: it is remembered for the inbox's
retention (at most `early_releases_per_tenant` per tenant, the oldest forgotten first), so that its
submission, published before it and delivered after it, still ends Released; and it is answered at once
with a Released status of sequence 0 that JetStream keeps RELEASE_ANSWER_TTL_S (a name never submitted
leaves no status subject behind for good)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from services.allocator.messages import ClaimMessage, carried, printable
from shared.admission.quota import QuotaConfig, pending_limit_problem
from shared.contract import events, subjects
from shared.dra import model as dra
from shared.dra.claims import InvalidClaim, settings_of
from shared.dra.results import State
from shared.ledger import intake
from shared.ledger.intake import Deleted, Inserted, IntakeView, IntakeWrites
from shared.ledger.queue import QUEUED
from shared.ledger.schema import Claim
from shared.ledger.unit_of_work import UnitOfWork, Writes

RELEASE_ANSWER_TTL_S = 60.0  # how long JetStream keeps the answer to a release of an unknown claim
DEFAULT_EARLY_RELEASES_PER_TENANT = 1000


def claim_values(claim: dra.ResourceClaim, sequence: int = 0) -> dict[str, Any]:
    """A new claim row's columns. `sequence`: where the claim's status sequence carries on (a claim
    submitted again under the name of one that ended continues its statuses, so they stay in order for
    whoever follows the claim)."""
    settings = settings_of(claim)
    return {"namespace": claim.metadata.namespace or "default", "name": claim.metadata.name,
            "state": State.PENDING.value, "spec": claim.model_dump(mode="json", by_alias=True, exclude_none=True),
            "priority": settings.priority, "preemptible": settings.preemptible, "sequence": sequence}


@dataclass
class ClaimBatch:
    """The messages of a batch applied in memory to the rows it names (`view`), in order: the statuses,
    answers and alerts they cause go to `writes`, the rows to insert and delete to `written`. No I/O."""

    view: IntakeView
    writes: Writes
    config: QuotaConfig = field(default_factory=QuotaConfig)
    answer_ttl: float = RELEASE_ANSWER_TTL_S
    written: IntakeWrites = field(default_factory=IntakeWrites)
    new: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)  # claims queued, not yet written
    # submissions of claims that wait or run already: compared with the stored document after the batch
    again: list[tuple[ClaimMessage, dra.ResourceClaim, Claim]] = field(default_factory=list)
    parsed: dict[tuple[str, str], dra.ResourceClaim] = field(default_factory=dict)  # the claims queued, parsed

    def apply(self, messages: list[ClaimMessage]) -> bool:
        """Apply the messages in order; whether any claim was queued or released (a cycle has work)."""
        changed = False
        for message in messages:
            if message.invalid is not None:
                self.refuse(message, message.invalid)
            elif message.claim is not None:
                changed = self.submit(message, message.claim) or changed
            elif message.name is not None:
                changed = self.release(message, message.name) or changed
        self.written.queued = list(self.new.values())
        self.new = {}
        return changed

    def row(self, key: tuple[str, str]) -> Claim | None:
        """The claim's row; when the claim was queued earlier in the batch, the claims queued so far are
        written first, in the order they were queued (rarely: a batch that queues claims and then releases
        one, or sends an unreadable copy)."""
        if key in self.new:
            rows = tuple(Claim(**values) for values in self.new.values())
            self.new = {}
            self.written.steps.append(Inserted(rows))
            self.view.rows.update({(row.namespace, row.name): row for row in rows})
        return self.view.rows.get(key)

    def submit(self, message: ClaimMessage, claim: dra.ResourceClaim) -> bool:
        """Queue the claim, unless it is queued already (claims are immutable: the first one stands; a
        release published before this submission then concerns an earlier one) or was released after this
        submission was published."""
        key, sequence = (message.tenant, claim.metadata.name), message.sequence
        if key in self.new:
            self.new[key]["submitted_seq"] = max(self.new[key]["submitted_seq"] or 0, sequence) or None
            return False
        row = self.view.rows.get(key)
        if row is not None and row.state in QUEUED:
            row.submitted_seq = max(row.submitted_seq or 0, sequence) or None
            self.again.append((message, claim, row))  # the same document, or another spec: `compare_again`
            return False
        if row is not None and 0 < sequence < (row.released_seq or 0):
            return False  # released already: a copy of the claim its release ended (or a redelivery of it)
        released_early = self.view.early.get(key) if row is None else None
        if released_early is not None and 0 < sequence < released_early:
            self._forget_release(key)
            self._released_before(message, claim, released_early)
            return False
        waiting = self.view.waiting
        if message.tenant in waiting:
            problem = pending_limit_problem(self.config.tenant(message.tenant), waiting[message.tenant])
            if problem is not None:
                self.refuse(message, InvalidClaim(problem, name=claim.metadata.name))
                return False
            waiting[message.tenant] += 1
        status_sequence, row_released = 0, released_early
        if row is not None:  # it ended: the new claim takes its name, and carries on its status sequence
            status_sequence = row.sequence  # (SQLite may give the new row the old id: status ids stay unique)
            row_released = row.released_seq
            self.written.steps.append(Deleted(row))  # its history goes with it; its statuses are still sent
            del self.view.rows[key]
        if released_early is not None:
            self._forget_release(key)  # the new row carries it (a refusal above: the Rejected row does)
        self.new[key] = {**claim_values(claim, status_sequence), "submitted_seq": sequence or None,
                         "released_seq": row_released}
        self.parsed[key] = claim
        return True

    def _released_before(self, message: ClaimMessage, claim: dra.ResourceClaim, released: int) -> None:
        """A submission published before a release that reached us first (the submission came again after a
        crash): the claim is written Released, and its Released status sent once."""
        row = self.view.rows[(message.tenant, claim.metadata.name)] = Claim(**{
            **claim_values(claim), "state": State.RELEASED.value, "submitted_seq": message.sequence,
            "released_seq": released, "reason": "released by the tenant before the broker read its submission"})
        self.written.steps.append(Inserted((row,)))
        self.writes.status(row)

    def _remember_release(self, key: tuple[str, str], sequence: int) -> None:
        early = self.view.early
        early[key] = self.written.early[key] = max(early.get(key, 0), sequence)

    def _forget_release(self, key: tuple[str, str]) -> int | None:
        """The stream sequence of the remembered release of this claim, which a row now carries instead."""
        released = self.view.early.pop(key, None)
        if released is not None:
            self.written.early[key] = None
        return released

    def release(self, message: ClaimMessage, name: str) -> bool:
        key = (message.tenant, name)
        row = self.row(key)
        if row is None:  # its submission may still come (redelivered after a crash): remembered for a while
            if message.sequence:
                self._remember_release(key, message.sequence)
            self.writes.answer(message.tenant, name, self.answer_ttl, (
                f"tenant {message.tenant} has no claim {name} waiting or allocated: nothing to release (a "
                f"submission of it published before this release ends Released)"))
            return False
        if message.sequence:
            row.released_seq = max(row.released_seq or 0, message.sequence)
        if row.state not in QUEUED:
            return False
        if 0 < message.sequence < (row.submitted_seq or 0):
            return False  # published before the claim's last submission: it concerned an earlier claim
        self.written.released.append(row)
        if row.state == State.PENDING.value and message.tenant in self.view.waiting:
            self.view.waiting[message.tenant] -= 1
        row.state, row.reason, row.allocation, row.node = State.RELEASED.value, "released by the tenant", None, None
        row.explain = None
        self.writes.status(row)
        return True

    def refuse(self, message: ClaimMessage, invalid: InvalidClaim) -> None:
        """A Rejected status on the claim's subject when the message names a claim a subject can carry,
        else an alert: a refusal is always answered."""
        name = carried(invalid.name) if message.tenant else None
        if name is not None:
            key = (message.tenant, name)
            row = self.row(key)
            if row is not None and row.state in QUEUED:  # never let a bad resubmission touch a good claim
                self.alert(message, f"claim {name} is {row.state} and stays so; this copy of it is refused: "
                                    f"{invalid}")
                return
            if row is None:
                row = self.view.rows[key] = Claim(namespace=message.tenant, name=name, state=State.REJECTED.value,
                                                  spec={}, sequence=0, priority=0, preemptible=True,
                                                  released_seq=self._forget_release(key))
                self.written.steps.append(Inserted((row,)))
            row.state, row.reason, row.allocation, row.node = State.REJECTED.value, printable(str(invalid)), None, None
            self.writes.status(row)
            return
        self.alert(message, str(invalid))

    def compare_again(self, stored: dict[int, Any]) -> None:
        """Claims are immutable: a submission of a waiting or allocated claim changes nothing. The same
        document again is a re-send, quiet; another spec under its name is said, never silently dropped."""
        for message, claim, row in self.again:
            if row.id in stored and stored[row.id] != claim_values(claim)["spec"]:
                self.alert(message, f"claim {claim.metadata.name} is {row.state} with another spec and stays so; "
                                    f"this copy is not applied: release it and submit again to change it",
                           summary=f"a submission of claim {message.tenant}/{claim.metadata.name} was not applied")

    def alert(self, message: ClaimMessage, why: str, summary: str | None = None) -> None:
        """An invalid-message alert about the message, on its tenant's alert subject (`_fleet` when the
        subject names no tenant)."""
        now = datetime.now(UTC).timestamp()
        error, tenant = printable(why), message.tenant or "(unknown)"
        summary = f"{summary or f'a message for tenant {tenant} could not be read as a claim'}: {error}"
        self.writes.event(
            subjects.alert("warning", "invalid-message", message.tenant),
            f"alert:invalid:{message.message_id}",
            events.alert(
                kind="invalid-message", severity="warning", key=f"invalid-message:{tenant}",
                summary=summary,
                details={"tenant": tenant, "error": error, "messageId": message.message_id},
                labels={"tenant": tenant}, first_seen=now, last_seen=now,
            ),
        )


async def apply_messages(work: UnitOfWork, messages: list[ClaimMessage], config: QuotaConfig | None = None,
                         *, now: datetime | None = None,
                         early_releases_per_tenant: int = DEFAULT_EARLY_RELEASES_PER_TENANT,
                         answer_ttl: float = RELEASE_ANSWER_TTL_S) -> bool:
    """Apply the messages in order; whether any claim was queued or released (a cycle has work). With the
    quota `config`, a tenant's submission past its maxPending is Rejected with the number. Releases of
    unknown claims are remembered as of `now`, at most `early_releases_per_tenant` per tenant."""
    config = config or QuotaConfig()
    named = {(m.tenant, m.name) for m in messages if m.name is not None}
    limited = {m.tenant for m in messages if m.claim is not None and config.tenant(m.tenant).max_pending is not None}
    batch = ClaimBatch(await intake.read(work, named, limited), work.writes, config, answer_ttl)
    changed = batch.apply(messages)
    if batch.again:
        batch.compare_again(await intake.specs_of(work, (row.id for _, _, row in batch.again)))
    await intake.write(work, batch.written, now or datetime.now(UTC), early_releases_per_tenant)
    work.queued_documents.update(batch.parsed)  # the queue read takes them as they are
    return changed
