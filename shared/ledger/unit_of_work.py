"""A transaction of the allocator as one unit of work: its session (for the ledger's repositories), the
allocator revision it writes, and `Writes`, what it decided and emitted so far: a value the handler fills
and the unit writes when it commits (`unit_of_work`), so nothing decided can be left unwritten.

What a decision transaction writes many of (decided claim rows, their devices, history and outbox rows)
goes in as one statement per table: as ORM objects they were a statement per row (the ORM reads each new id
back, and on SQLite it cannot do that for many rows at once), most of a decision transaction's statements.
"""

from __future__ import annotations

import collections
import hashlib
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol, TypeVar, cast

from sqlalchemy import ARRAY, ColumnElement, Table, any_, bindparam, func, insert, update
from sqlalchemy.ext.asyncio import AsyncSession

from shared.contract import events, subjects
from shared.dra.results import Decision, DeviceKey, State
from shared.ledger.schema import OUTSIDE, REVISION, AllocatorLease, Claim, ClaimEvent, DeviceAllocation, OutboxEvent

_CLAIMS, _DEVICES, _HISTORY, _OUTBOX = (
    cast(Table, model.__table__) for model in (Claim, DeviceAllocation, ClaimEvent, OutboxEvent))
_MESSAGE_ID = 255  # the outbox's column
IDS_PER_QUERY = 500  # under every database's limit on bound parameters
_T = TypeVar("_T")


def in_chunks(ids: Sequence[_T]) -> Iterable[Sequence[_T]]:
    """`ids` in pieces of IDS_PER_QUERY, one statement each."""
    return (ids[i:i + IDS_PER_QUERY] for i in range(0, len(ids), IDS_PER_QUERY))


def one_of(session: AsyncSession, column: Any, values: Sequence[Any]) -> ColumnElement[bool]:
    """`column IN (values)`; on PostgreSQL `column = ANY(:values)`, one array parameter whatever the length:
    SQLAlchemy expands an IN list value by value at every execution, and each length is a statement text
    of its own for asyncpg to prepare (a decision transaction asks several such lists, issue 42)."""
    if session.get_bind().dialect.name == "postgresql":
        return cast(ColumnElement[bool], column == any_(bindparam(None, list(values), type_=ARRAY(column.type))))
    return cast(ColumnElement[bool], column.in_(values))


class StatusRow(Protocol):
    """A claim row a status is written for: a `ClaimRow`, or a `Claim` the transaction reads or inserts
    (whose id exists once it is inserted, before the unit writes)."""

    id: int
    namespace: str
    name: str
    state: str
    reason: str | None
    allocation: dict[str, Any] | None
    node: str | None
    sequence: int
    updated_at: datetime


@dataclass(eq=False)
class ClaimRow:
    """A claim row as a decision cycle writes it: its plain columns, read in bulk
    (shared/ledger/decisions.claim_rows), changed in place and written back with the unit, one statement
    for the transaction's rows. Through the ORM's unit of work, the decided claims and their devices cost
    a fifth of a decision transaction. `explain` is not read: what a decision writes replaces it (None
    unless set)."""

    id: int
    namespace: str
    name: str
    state: str
    reason: str | None
    allocation: dict[str, Any] | None
    node: str | None
    sequence: int
    updated_at: datetime
    allocated_at: datetime | None
    explain: dict[str, Any] | None = None
    flavor: str | None = None  # not read either: set with an allocation, else cleared
    # the start estimate last published while it waited, which its Pending statuses carry; cleared when it is
    # allocated (its estimate_p50 columns stay: the estimates' error)
    estimated_start: dict[str, Any] | None = None
    # why that estimate is null (its estimatedStartReason), carried and cleared with it
    estimate_reason: str | None = None


@dataclass(eq=False)
class _Status:
    """A status recorded for a row: its history row and its outbox event, whose ids are the row's, read
    when the unit writes them (a row the transaction inserts has its id only then)."""

    row: StatusRow
    sequence: int
    history: dict[str, Any]
    outbox: dict[str, Any]


@dataclass
class Writes:
    """What a unit of work will write, in the order it was recorded: decided claim rows (each once, as last
    changed), their devices, statuses (history and outbox), and other events."""

    claims: dict[int, ClaimRow] = field(default_factory=dict)
    devices: list[dict[str, Any]] = field(default_factory=list)
    outbox: list[_Status | dict[str, Any]] = field(default_factory=list)  # statuses and other events, in order
    states: collections.Counter[str] = field(default_factory=collections.Counter)  # of the statuses (metrics)

    def status(self, row: StatusRow, *, by: str | None = None, unsatisfiable: bool = False) -> None:
        """The claim's next status: its sequence bumped, a history row and a status event."""
        row.sequence = (row.sequence or 0) + 1
        row.updated_at = datetime.now(UTC)
        payload = events.claim_status(
            namespace=row.namespace, name=row.name, state=row.state, allocation=row.allocation,
            reason=row.reason, sequence=row.sequence, by=by, unsatisfiable=unsatisfiable,
        )
        if row.state == State.PENDING.value:  # the start estimate last published: a value, or a null and why
            if (estimate := getattr(row, "estimated_start", None)) is not None:
                payload["estimatedStart"] = estimate
            elif why := getattr(row, "estimate_reason", None):
                payload["estimatedStart"] = None
                payload["estimatedStartReason"] = why
        if isinstance(row, ClaimRow):
            self.claims[row.id] = row
        self.states[row.state] += 1
        self.outbox.append(_Status(row, row.sequence, {
            "sequence": row.sequence, "state": row.state, "reason": row.reason, "node": row.node, "by": by}, {
            "subject": subjects.status(row.namespace, row.name), "payload": payload, "ttl_s": None}))

    def answer(self, namespace: str, name: str, ttl: float, reason: str) -> None:
        """A Released status for a claim the ledger has no row of (a release of an unknown claim): sequence
        0, before any status a claim of that name will have, and kept by JetStream `ttl` seconds only, so
        a name never submitted leaves no subject behind. No history: there is no claim."""
        payload = events.claim_status(namespace=namespace, name=name, state=State.RELEASED.value, allocation=None,
                                      reason=reason, sequence=0)
        self.outbox.append({"subject": subjects.status(namespace, name), "payload": payload,
                            "message_id": f"status:unknown:{uuid.uuid4().hex}", "ttl_s": ttl})

    def event(self, subject: str, message_id: str, payload: Mapping[str, Any]) -> None:
        """An event with its own id, unique whatever `message_id` says (the same message id comes back from
        another tenant, or again once the inbox forgot it, and the outbox's ids are unique): `message_id`
        names it, cut to fit, with a suffix of its own."""
        if len(message_id) > _MESSAGE_ID - 33:
            digest = hashlib.sha256(message_id.encode("utf-8", "surrogatepass")).hexdigest()
            message_id = f"{message_id[:120]}:{digest}"
        self.outbox.append({"subject": subject, "message_id": f"{message_id}:{uuid.uuid4().hex}",
                            "payload": payload, "ttl_s": None})

    def decision(self, row: ClaimRow, decision: Decision,
                 flavors: Mapping[DeviceKey, tuple[str | None, float]] | None = None) -> bool:
        """The decision on the row, with the devices it holds; returns whether the claim's visible state
        changed (and a status is due)."""
        allocation = decision.allocation.to_json() if decision.allocation else None
        changed = (row.state, row.reason, row.allocation) != (decision.state.value, decision.reason, allocation)
        row.state = decision.state.value
        row.reason = decision.reason
        row.allocation = allocation
        row.node = decision.allocation.node if decision.allocation else None
        self.claims[row.id] = row
        row.flavor = None
        if decision.allocation is not None:
            row.estimated_start = None
            row.estimate_reason = None
            node = decision.allocation.node
            for result in decision.allocation.results:
                if result.admin_access:
                    continue  # monitoring access holds no device
                flavor, units = (flavors or {}).get(result.key, (None, 0.0))
                row.flavor = row.flavor or flavor
                self.devices.append({"driver": result.driver, "pool": result.pool, "device": result.device,
                                     "claim_id": row.id, "node": node, "request": result.request,
                                     "flavor": flavor, "units": units})
        return changed

    def deleted(self, row: StatusRow) -> None:
        """The row is deleted (its name taken by a new claim): its history goes with it, its statuses are
        still sent, under the id it had."""
        kept: list[_Status | dict[str, Any]] = []
        for written in self.outbox:
            if isinstance(written, _Status) and written.row is row:
                kept.append(_event_of(written))
            else:
                kept.append(written)
        self.outbox = kept


def _event_of(status: _Status) -> dict[str, Any]:
    return {**status.outbox, "message_id": f"status:{status.row.id}:{status.sequence}"}


_WRITTEN_COLUMNS = ("state", "reason", "allocation", "node", "sequence", "updated_at", "allocated_at", "explain",
                    "flavor", "estimated_start", "estimate_reason")
_UPDATE_CLAIM = (update(_CLAIMS).where(_CLAIMS.c.id == bindparam("row_id"))
                 .values({name: bindparam(f"new_{name}", type_=_CLAIMS.c[name].type) for name in
                          (*_WRITTEN_COLUMNS, "revision")}))


class UnitOfWork:
    """One transaction: `session` is for the ledger's repositories (shared.ledger), `writes` what it will
    write. Every claim row it writes carries `revision`: the allocator revision it took the shard's turn
    at (`take_turn`), else OUTSIDE."""

    def __init__(self, session: AsyncSession) -> None:
        self.session = session
        self.writes = Writes()
        # the outbox rows `flush` wrote, in order: once the unit commits, its relay may publish them from here
        # instead of reading them back (services/allocator/outbox_relay.py)
        self.flushed: list[dict[str, Any]] = []
        # the documents of the claims this unit queued, as parsed from their messages: the queue read takes
        # them instead of reading their rows' specs back and parsing them again (what a row's spec parses to
        # is the same document: tests/hostile/test_corpus_documents.py)
        self.queued_documents: dict[tuple[str, str], Any] = {}

    @property
    def revision(self) -> int | None:
        return cast(int | None, self.session.info.get(REVISION))

    async def take_turn(self, shard: str, holder: str, expires: float) -> int:
        """Take the shard's row lock for this transaction (deciders take turns) and renew the lease;
        returns the ledger revision this transaction writes. One statement: the UPDATE locks the row as
        SELECT ... FOR UPDATE did, and returns the revision it bumped (a read and a write were two round
        trips of every decision transaction)."""
        session = self.session
        renew = (update(AllocatorLease).where(AllocatorLease.shard == shard)
                 .values(holder=holder, expires_at=datetime.fromtimestamp(expires, UTC),
                         revision=func.coalesce(AllocatorLease.revision, 0) + 1)
                 .returning(AllocatorLease.revision).execution_options(synchronize_session=False))
        revision = (await session.execute(renew)).scalar_one_or_none()
        if revision is None:  # the shard's first turn: its row, then the same statement
            session.add(AllocatorLease(shard=shard, revision=0))
            await session.flush()
            revision = (await session.execute(renew)).scalar_one()
        session.info[REVISION] = revision  # the schema stamps every claim row the ORM writes with it
        return int(revision)

    async def flush(self) -> None:
        """Write what `writes` holds: the decided claim rows, then their devices, the history and outbox rows
        in the order they were recorded, one statement each; then `writes` holds none of them (its
        `states` stay, for the transaction's metrics). The unit calls it as it commits."""
        writes, session = self.writes, self.session
        if writes.claims:
            revision = session.info.get(REVISION, OUTSIDE)
            await session.execute(_UPDATE_CLAIM, [
                {"row_id": row.id, "new_revision": revision,
                 **{f"new_{c}": getattr(row, c) for c in _WRITTEN_COLUMNS}} for row in writes.claims.values()])
        history = [{**written.history, "claim_id": written.row.id} for written in writes.outbox
                   if isinstance(written, _Status)]
        outbox = [_event_of(written) if isinstance(written, _Status) else written for written in writes.outbox]
        devices = writes.devices
        writes.claims, writes.devices, writes.outbox = {}, [], []
        for table, rows in ((_DEVICES, devices), (_HISTORY, history), (_OUTBOX, outbox)):
            if rows:
                await session.execute(insert(table), rows)
        self.flushed.extend(outbox)


@asynccontextmanager
async def unit_of_work(sessions: Callable[[], AsyncSession]) -> AsyncIterator[UnitOfWork]:
    """A transaction as a unit of work: what its `writes` hold is written as it commits; when the block
    raises, nothing is."""
    async with sessions() as session, session.begin():
        work = UnitOfWork(session)
        yield work
        await work.flush()
