"""The allocator's reads and writes in the ledger. Nothing here commits: the caller's transaction does."""

from __future__ import annotations

import collections
import hashlib
import logging
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from typing import Any, TypeVar, cast

from sqlalchemy import Table, bindparam, delete, event, func, insert, select, update
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session, defer

from shared.admission.model import Running, Waiting
from shared.admission.waiting_queue import WaitingQueue
from shared.contract import events, subjects
from shared.dra import model as dra
from shared.dra.claims import settings_of
from shared.dra.results import Allocation, Decision, DeviceKey, State
from shared.ledger.schema import (
    OUTSIDE,
    REVISION,
    AllocatorLease,
    Claim,
    ClaimEvent,
    DeviceAllocation,
    EarlyRelease,
    InboxMessage,
    OutboxEvent,
)

log = logging.getLogger("claimbroker.allocator")


async def pending_claims(session: AsyncSession) -> list[Claim]:
    rows = await session.scalars(select(Claim).where(Claim.state == State.PENDING.value).order_by(Claim.id))
    return list(rows)


async def find_claim(session: AsyncSession, namespace: str, name: str) -> Claim | None:
    return await session.scalar(select(Claim).where(Claim.namespace == namespace, Claim.name == name))


# Columns of claim rows a message's lookup does not load: parsing their JSON cost most of it. Reading one
# by mistake raises instead of querying. A message clears the allocation and the explanation.
_UNREAD_BY_MESSAGES = tuple(defer(column, raiseload=True) for column in (Claim.spec, Claim.explain, Claim.allocation))


async def pending_counts(session: AsyncSession, tenants: Iterable[str]) -> dict[str, int]:
    """Waiting claims per tenant (every tenant asked has an entry)."""
    wanted = sorted(set(tenants))
    counts = dict.fromkeys(wanted, 0)
    counts.update({namespace: int(n) for namespace, n in await session.execute(
        select(Claim.namespace, func.count()).where(Claim.state == State.PENDING.value, Claim.namespace.in_(wanted))
        .group_by(Claim.namespace))})
    return counts


async def claims_named(session: AsyncSession, keys: Iterable[tuple[str, str]]) -> dict[tuple[str, str], Claim]:
    """The rows of these claims (namespace, name) that exist, read in bulk. Asked as namespaces and names
    (a few rows more, dropped here), which the (namespace, name) index answers: SQLite scans the whole
    table for a tuple IN."""
    wanted = set(keys)
    rows: dict[tuple[str, str], Claim] = {}
    namespaces = sorted({namespace for namespace, _ in wanted})
    for chunk in _chunks(sorted({name for _, name in wanted})):
        for row in await session.scalars(select(Claim).options(*_UNREAD_BY_MESSAGES).where(
                Claim.namespace.in_(namespaces), Claim.name.in_(chunk))):
            if (key := (row.namespace, row.name)) in wanted:
                rows[key] = row
    return rows


# Rows the allocator writes many of per transaction go in as one statement per table through these: as ORM
# objects they were a statement per row (the ORM reads each new id back, and on SQLite it cannot do that for
# many rows at once), most of a decision transaction's statements.
_CLAIMS, _DEVICES, _HISTORY, _OUTBOX, _INBOX = (
    cast(Table, model.__table__) for model in (Claim, DeviceAllocation, ClaimEvent, OutboxEvent, InboxMessage))
_STATES = "claimbroker.states_written"
_WRITES = "claimbroker.writes"  # session.info: what was decided or emitted, not yet written


@dataclass(eq=False)
class ClaimRow:
    """A claim row as a decision cycle writes it: its plain columns, read in bulk (`claim_rows`), changed
    in place and written back by `write_buffered`, one statement for the transaction's rows. Through the
    ORM's unit of work, the decided claims and their devices cost a fifth of a decision transaction.
    `explain` is not read: what a decision writes replaces it (None unless set)."""

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


@dataclass
class _Writes:
    claims: dict[int, ClaimRow] = field(default_factory=dict)  # by id: written once, as last changed
    devices: list[dict[str, Any]] = field(default_factory=list)
    history: list[dict[str, Any]] = field(default_factory=list)
    outbox: list[dict[str, Any]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.claims or self.devices or self.history or self.outbox)


def _writes(session: AsyncSession) -> _Writes:
    found = session.info.get(_WRITES)
    if found is None:
        found = session.info[_WRITES] = _Writes()
    return cast(_Writes, found)


def emit_status(session: AsyncSession, row: Claim | ClaimRow, *, by: str | None = None,
                unsatisfiable: bool = False) -> None:
    """Bump the claim's sequence, record it in the claim's history and queue its status event, all in the
    caller's transaction (written by `write_buffered`, with the row when it is a `ClaimRow`)."""
    row.sequence = (row.sequence or 0) + 1
    row.updated_at = datetime.now(UTC)
    payload = events.claim_status(
        namespace=row.namespace, name=row.name, state=row.state, allocation=row.allocation,
        reason=row.reason, sequence=row.sequence, by=by, unsatisfiable=unsatisfiable,
    )
    writes = _writes(session)
    if isinstance(row, ClaimRow):
        writes.claims[row.id] = row
    writes.history.append({"claim_id": row.id, "sequence": row.sequence, "state": row.state,
                           "reason": row.reason, "node": row.node, "by": by})
    writes.outbox.append({"subject": subjects.status(row.namespace, row.name),
                          "message_id": f"status:{row.id}:{row.sequence}", "payload": payload, "ttl_s": None})


def emit_answer(session: AsyncSession, namespace: str, name: str, ttl: float, reason: str) -> None:
    """A Released status for a claim the ledger has no row of (a release of an unknown claim): sequence 0,
    before any status a claim of that name will have, and kept by JetStream `ttl` seconds only, so a name
    never submitted leaves no subject behind. No history: there is no claim."""
    payload = events.claim_status(namespace=namespace, name=name, state=State.RELEASED.value, allocation=None,
                                  reason=reason, sequence=0)
    _writes(session).outbox.append({"subject": subjects.status(namespace, name), "payload": payload,
                                    "message_id": f"status:unknown:{uuid.uuid4().hex}", "ttl_s": ttl})


_MESSAGE_ID = 255  # the outbox's column


def emit_event(session: AsyncSession, subject: str, message_id: str, payload: dict[str, Any]) -> None:
    """An event with its own id, unique whatever `message_id` says (the same message id comes back from
    another tenant, or again once the inbox forgot it, and the outbox's ids are unique): `message_id`
    names it, cut to fit, with a suffix of its own."""
    if len(message_id) > _MESSAGE_ID - 33:
        digest = hashlib.sha256(message_id.encode("utf-8", "surrogatepass")).hexdigest()
        message_id = f"{message_id[:120]}:{digest}"
    _writes(session).outbox.append({"subject": subject, "message_id": f"{message_id}:{uuid.uuid4().hex}",
                                    "payload": payload, "ttl_s": None})


_WRITTEN_COLUMNS = ("state", "reason", "allocation", "node", "sequence", "updated_at", "allocated_at", "explain",
                    "flavor")
_UPDATE_CLAIM = (update(_CLAIMS).where(_CLAIMS.c.id == bindparam("row_id"))
                 .values({name: bindparam(f"new_{name}", type_=_CLAIMS.c[name].type) for name in
                          (*_WRITTEN_COLUMNS, "revision")}))


async def write_buffered(session: AsyncSession) -> None:
    """Write what the transaction decided and emitted so far: the decided claim rows, then their devices,
    the history and outbox rows in their order and the messages handled, one statement each. Called before
    the transaction commits (committing with rows not written raises) and before a claim row they may
    refer to is deleted."""
    writes = session.info.pop(_WRITES, None)
    if writes is None:
        return
    states_written(session).update(row["state"] for row in writes.history)
    if writes.claims:
        revision = session.info.get(REVISION, OUTSIDE)
        await session.execute(_UPDATE_CLAIM, [
            {"row_id": row.id, "new_revision": revision, **{f"new_{c}": getattr(row, c) for c in _WRITTEN_COLUMNS}}
            for row in writes.claims.values()])
    for table, rows in ((_DEVICES, writes.devices), (_HISTORY, writes.history), (_OUTBOX, writes.outbox)):
        if rows:
            await session.execute(insert(table), rows)


def states_written(session: AsyncSession) -> collections.Counter[str]:
    """The states of the statuses this transaction has written so far (for metrics once it commits)."""
    found = session.info.get(_STATES)
    if found is None:
        found = session.info[_STATES] = collections.Counter()
    return cast(collections.Counter[str], found)


@event.listens_for(Session, "before_commit")
def _buffered_written(session: Session) -> None:
    if session.info.get(_WRITES):
        raise RuntimeError("claim decisions or events were not written (ledger_ops.write_buffered)")


def claim_values(claim: dra.ResourceClaim, sequence: int = 0) -> dict[str, Any]:
    """A new claim row's columns. `sequence`: where the claim's status sequence carries on (a claim
    submitted again under the name of one that ended continues its statuses, so they stay in order for
    whoever follows the claim)."""
    settings = settings_of(claim)
    return {"namespace": claim.metadata.namespace or "default", "name": claim.metadata.name,
            "state": State.PENDING.value, "spec": claim.model_dump(mode="json", by_alias=True, exclude_none=True),
            "priority": settings.priority, "preemptible": settings.preemptible, "sequence": sequence}


async def insert_claims(session: AsyncSession, values: Sequence[dict[str, Any]]) -> None:
    """New claim rows (`claim_values`) in one statement. Their `arrival` stays empty, which means their
    id: the order they were queued in. They carry the transaction's revision, as `_stamp_revision` gives
    ORM writes."""
    if values:
        revision = session.info.get(REVISION, OUTSIDE)
        await session.execute(insert(_CLAIMS), [{**v, "revision": revision} for v in values])


def apply_decision(session: AsyncSession, row: ClaimRow, decision: Decision,
                   flavors: Mapping[DeviceKey, tuple[str | None, float]] | None = None) -> bool:
    """Write the decision (with `write_buffered`); returns whether the claim's visible state changed (and an
    event is due)."""
    allocation = decision.allocation.to_json() if decision.allocation else None
    changed = (row.state, row.reason, row.allocation) != (decision.state.value, decision.reason, allocation)
    row.state = decision.state.value
    row.reason = decision.reason
    row.allocation = allocation
    row.node = decision.allocation.node if decision.allocation else None
    writes = _writes(session)
    writes.claims[row.id] = row
    row.flavor = None
    if decision.allocation is not None:
        node = decision.allocation.node
        for result in decision.allocation.results:
            if result.admin_access:
                continue  # monitoring access holds no device
            flavor, units = (flavors or {}).get(result.key, (None, 0.0))
            row.flavor = row.flavor or flavor
            writes.devices.append({"driver": result.driver, "pool": result.pool, "device": result.device,
                                   "claim_id": row.id, "node": node, "request": result.request,
                                   "flavor": flavor, "units": units})
    return changed


async def lock_shard(session: AsyncSession, shard: str, holder: str, expires: float) -> int:
    """Take the shard's row lock for this transaction (deciders take turns) and renew the lease;
    returns the ledger revision this cycle writes."""
    row = await session.scalar(select(AllocatorLease).where(AllocatorLease.shard == shard).with_for_update())
    if row is None:
        row = AllocatorLease(shard=shard, revision=0)
        session.add(row)
        await session.flush()
        row = await session.scalar(select(AllocatorLease).where(AllocatorLease.shard == shard).with_for_update())
        assert row is not None
    row.holder = holder
    row.expires_at = datetime.fromtimestamp(expires, UTC)
    row.revision = (row.revision or 0) + 1
    session.info[REVISION] = row.revision  # every claim row this transaction writes carries it
    return row.revision


async def claims_on_nodes(session: AsyncSession, nodes: Iterable[str]) -> list[Claim]:
    rows = await session.scalars(select(Claim).where(Claim.state == State.ALLOCATED.value,
                                                     Claim.node.in_(list(nodes))))
    return list(rows)


@dataclass
class Queue:
    """What a decision cycle reads: running and waiting claims, and their rows' ids (`claim_rows` reads the
    rows a cycle writes back to). The waiting claims record what came and went since their last
    `snapshot()`, which the cycle is handed with them, so a deep queue is not compared claim by claim."""

    ids: dict[tuple[str, str], int] = field(default_factory=dict)
    running: dict[tuple[str, str], Running] = field(default_factory=dict)
    waiting: WaitingQueue = field(default_factory=WaitingQueue)


@dataclass
class QueueCache:
    """The queue as the last cycle read it, kept per claim row. A row whose fields did not change gives
    back the same object, which the decision core recognises by identity: a deep queue costs a comparison
    per claim per cycle, not a parse and a re-grouping. A row's document never changes, and its
    allocation changes only with its sequence, so neither is read again while the claim stays queued or
    running.

    `seen`: every claim row written at or before this allocator revision is as the cache holds it, so a
    cycle in a later revision reads only the rows written since (and those written outside a decision
    transaction); None: the next read reads every queued row and corrects what the cache holds. Decision
    transactions take turns on the shard's lock and each writes a higher revision, so what a cycle reads
    has committed before it. The caller invalidates the cache when its transaction does not commit.
    Revisions are a shard's: the claims a shard reads must be written under its lock (today the one shard,
    `default`, reads every claim; shards on one ledger would each read only their own tenants' claims)."""

    held: Queue = field(default_factory=Queue)  # what `load_queue` gives back
    keys: dict[int, tuple[str, str]] = field(default_factory=dict)  # every queued row's claim
    documents: dict[int, dra.ResourceClaim] = field(default_factory=dict)
    sequences: dict[int, int] = field(default_factory=dict)  # per running claim's row: the one it was read at
    seen: int | None = None
    rows_read: int = 0  # by the last load: what it cost

    def invalidate(self) -> None:
        """What it holds may be of writes that did not commit: the next read reads every queued row."""
        self.seen = None

    def drop(self, row_id: int) -> None:
        key = self.keys.pop(row_id, None)
        if key is not None and self.held.ids.get(key) == row_id:
            del self.held.ids[key]
            self.held.waiting.pop(key)
            self.held.running.pop(key, None)
        self.sequences.pop(row_id, None)
        self.documents.pop(row_id, None)




def _document(spec: dict[str, Any]) -> dra.ResourceClaim:
    """A claim row's document, parsed once while the claim stays queued or running (the cache keeps it, and
    nothing else: a claim's memory goes when it ends)."""
    claim = dra.ResourceClaim.model_validate(spec)
    dra.share_fields_sets(claim)
    return claim


QUEUED = (State.PENDING.value, State.ALLOCATED.value)  # a claim in these states waits or runs
_IDS_PER_QUERY = 500  # under every database's limit on bound parameters
_T = TypeVar("_T")


def _chunks(ids: Sequence[_T]) -> Iterable[Sequence[_T]]:
    return (ids[i:i + _IDS_PER_QUERY] for i in range(0, len(ids), _IDS_PER_QUERY))


_COLUMNS = (Claim.id, Claim.namespace, Claim.name, Claim.state, Claim.sequence, Claim.priority, Claim.preemptible,
            Claim.arrival, Claim.reason.is_not(None), Claim.allocated_at)


async def recent_preemptions(session: AsyncSession, since: float) -> dict[str, int]:
    """Per tenant, its claims preempted for fair share or reclaim (by another tenant's claim) since `since`
    (seconds since the epoch): what its maxPreemptionsPerMinute is checked against."""
    rows = await session.execute(
        select(Claim.namespace, func.count()).select_from(ClaimEvent).join(Claim, Claim.id == ClaimEvent.claim_id)
        .where(ClaimEvent.state == State.PREEMPTED.value, ClaimEvent.at >= datetime.fromtimestamp(since, UTC),
               ClaimEvent.by.is_not(None), ~ClaimEvent.by.startswith(Claim.namespace + "/"))
        .group_by(Claim.namespace))
    return {tenant: int(count) for tenant, count in rows}


async def load_queue(session: AsyncSession, cache: QueueCache | None = None) -> Queue:
    """Running and waiting claims; a waiting claim carries the claims that ever preempted it (from its
    history), which it may never preempt back.

    In a decision transaction (`lock_shard`) with a cache of an earlier one, only the claim rows written
    since are read, whatever their state: a cycle at a depth of 10,000 reads its few hundred changes, not
    the 10,000 rows (reading every queued row's columns was most of a cycle's time). A count of the
    queued rows checks the result (a mismatch, which no writer taking the shard's turn can cause, falls
    back to a full read). Otherwise every queued row's columns are read. Either way documents and
    allocations are read only for rows the cache does not hold as they are (new, or their sequence moved).

    What comes back is the queue the cache holds, not a copy (a deep queue's dicts are not copied each
    cycle): a claim the caller puts into its `waiting` is a change like one read from the
    ledger, and the row read next time brings the cache back to what the ledger holds."""
    cache = cache if cache is not None else QueueCache()
    revision = session.info.get(REVISION)
    since = cache.seen if revision is not None and cache.seen is not None and cache.seen < revision else None
    if since is None:
        listed = list((await session.execute(select(*_COLUMNS).where(Claim.state.in_(QUEUED))
                                             .order_by(Claim.id))).all())
    else:
        # OUTSIDE rows too. Sorted here, not by the database: asked to order by id, SQLite scans the whole
        # table in id order instead of searching the revision index (a cost that grows with the
        # depth, for the same hundred rows)
        listed = sorted((await session.execute(select(*_COLUMNS).where(Claim.revision > since))).all(),
                        key=lambda row: row[0])
    cache.rows_read = len(listed)
    queued = [row for row in listed if row[3] in QUEUED]
    gone = ({row[0] for row in listed} - {row[0] for row in queued} if since is not None  # released, Rejected
            else set(cache.keys) - {row[0] for row in queued})  # not queued any more
    for row_id in gone:
        cache.drop(row_id)
    await _read_rows(session, cache, queued, full=since is None)
    if since is not None:
        count = await session.scalar(select(func.count()).select_from(Claim).where(Claim.state.in_(QUEUED)))
        if count != len(cache.keys):
            log.warning("queue read since revision %d holds %d claims, the ledger %d: reading it all", since,
                        len(cache.keys), count)
            cache.invalidate()
            return await load_queue(session, cache)
    if revision is not None:  # rows written outside a decision transaction are read once more, then as any row
        await session.execute(update(Claim).where(Claim.revision == OUTSIDE).values(revision=revision))
    cache.seen = revision - 1 if revision is not None else None  # this transaction's own writes: read next time
    return cache.held


async def _read_rows(session: AsyncSession, cache: QueueCache, listed: Sequence[Any], *, full: bool) -> None:
    """Bring the cache's entries of these queued rows up to date (`full`: they are all the queued rows)."""
    pending = [row[0] for row in listed if row[3] == State.PENDING.value]
    displaced: dict[int, set[tuple[str, str]]] = {}
    preempted = select(ClaimEvent.claim_id, ClaimEvent.by).where(ClaimEvent.state == State.PREEMPTED.value)
    if full:
        queries = [preempted.join(Claim, Claim.id == ClaimEvent.claim_id).where(Claim.state == State.PENDING.value)]
    else:
        queries = [preempted.where(ClaimEvent.claim_id.in_(chunk)) for chunk in _chunks(pending)]
    for query in queries:
        for claim_id, by in await session.execute(query):
            if by and "/" in by:
                tenant, name = by.split("/", 1)
                displaced.setdefault(claim_id, set()).add((tenant, name))
    for row_id, namespace, name, *_ in listed:
        if (before := cache.keys.get(row_id)) is not None and before != (namespace, name):
            cache.drop(row_id)  # the row id was deleted and taken again by another claim
    allocations: dict[int, Any] = {}
    unread: list[int] = []  # new to the cache: document and allocation are read
    stale: list[int] = []  # running, and not as the cache holds it: the allocation is read
    documents = cache.documents
    for row_id, _, _, state, sequence, *_ in listed:
        if row_id not in documents:
            unread.append(row_id)
        elif state == State.ALLOCATED.value and cache.sequences.get(row_id) != sequence:
            stale.append(row_id)
    for chunk in _chunks(unread):
        for row_id, spec, allocation in await session.execute(
                select(Claim.id, Claim.spec, Claim.allocation).where(Claim.id.in_(chunk))):
            documents[row_id] = _document(spec)
            allocations[row_id] = allocation
    for chunk in _chunks(stale):
        for row_id, allocation in await session.execute(
                select(Claim.id, Claim.allocation).where(Claim.id.in_(chunk))):
            allocations[row_id] = allocation
    held = cache.held
    for row_id, namespace, name, state, sequence, priority, preemptible, arrival, answered, allocated_at in listed:
        key = (namespace, name)
        same_row = held.ids.get(key) == row_id  # what the cache holds for the claim is this row's
        cache.keys[row_id] = key
        held.ids[key] = row_id
        arrival = arrival or row_id
        if state == State.ALLOCATED.value:
            held.waiting.pop(key)
            since = allocated_at.timestamp() if allocated_at else None
            order = int(since * 1e6) if since is not None else row_id
            running = held.running.get(key) if same_row and cache.sequences.get(row_id) == sequence else None
            if running is not None:  # the same allocation
                if (running.priority, running.preemptible, running.arrival, running.allocated_order) != (
                        priority, preemptible, arrival, order):
                    running = Running(namespace, name, running.allocation, priority, preemptible, arrival, order,
                                      since)
            elif allocation := allocations.get(row_id):
                running = Running(namespace, name, Allocation.from_json(allocation), priority, preemptible,
                                  arrival, order, since)
            else:  # an allocated row without an allocation holds nothing
                cache.drop(row_id)
                continue
            cache.sequences[row_id] = sequence
            held.running[key] = running
        else:
            cache.sequences.pop(row_id, None)
            held.running.pop(key, None)
            displaced_by = frozenset(displaced.get(row_id, ()))
            waiting = held.waiting.get(key) if same_row else None
            if waiting is None or (waiting.priority, waiting.preemptible, waiting.arrival, waiting.answered,
                                   waiting.displaced_by) != (priority, preemptible, arrival, answered, displaced_by):
                waiting = Waiting(namespace, name, documents[row_id], priority, preemptible, arrival,
                                  answered=answered, displaced_by=displaced_by)
            held.waiting.put(waiting)


_ROW_COLUMNS = tuple(getattr(Claim, f.name) for f in fields(ClaimRow) if f.name != "explain")  # in field order


async def claim_rows(session: AsyncSession, queue: Queue,
                     keys: Iterable[tuple[str, str]]) -> dict[tuple[str, str], ClaimRow]:
    """The ledger rows of these queued claims, to write a cycle's decisions to (read in bulk, as plain
    columns: a decision replaces the explanation and does not read the document)."""
    wanted = {queue.ids[key]: key for key in keys}
    rows: dict[tuple[str, str], ClaimRow] = {}
    for chunk in _chunks(sorted(wanted)):
        for values in await session.execute(select(*_ROW_COLUMNS).where(Claim.id.in_(chunk))):
            rows[wanted[values[0]]] = ClaimRow(*values)
    return rows


async def early_releases_named(session: AsyncSession,
                               keys: Iterable[tuple[str, str]]) -> dict[tuple[str, str], int]:
    """The remembered releases of these claims (namespace, name): the stream sequence of each. Asked as
    tenants and names, as `claims_named` does; nothing is asked for a batch that names no unknown claim."""
    wanted = set(keys)
    found: dict[tuple[str, str], int] = {}
    tenants = sorted({tenant for tenant, _ in wanted})
    for chunk in _chunks(sorted({name for _, name in wanted})):
        for tenant, name, released in await session.execute(
                select(EarlyRelease.tenant, EarlyRelease.name, EarlyRelease.released_seq).where(
                    EarlyRelease.tenant.in_(tenants), EarlyRelease.name.in_(chunk))):
            if (tenant, name) in wanted:
                found[(tenant, name)] = int(released)
    return found


async def write_early_releases(session: AsyncSession, changed: Mapping[tuple[str, str], int | None],
                               now: datetime, per_tenant: int) -> None:
    """Remember (a sequence) or forget (None) releases of unknown claims; then a tenant that remembers more
    than `per_tenant` forgets its oldest, so a flood of releases of names never submitted stays bounded."""
    by_tenant: dict[str, list[str]] = collections.defaultdict(list)
    for tenant, name in changed:
        by_tenant[tenant].append(name)
    for tenant, names in by_tenant.items():
        for chunk in _chunks(sorted(names)):
            await session.execute(delete(EarlyRelease).where(EarlyRelease.tenant == tenant,
                                                             EarlyRelease.name.in_(chunk)))
    remembered = {key: released for key, released in changed.items() if released is not None}
    if not remembered:
        return
    await session.execute(insert(EarlyRelease), [
        {"tenant": tenant, "name": name, "released_seq": released, "released_at": now}
        for (tenant, name), released in remembered.items()])
    for tenant in sorted({tenant for tenant, _ in remembered}):
        count = int(await session.scalar(select(func.count()).select_from(EarlyRelease)
                                         .where(EarlyRelease.tenant == tenant)) or 0)
        if count > per_tenant:
            oldest = (select(EarlyRelease.name).where(EarlyRelease.tenant == tenant)
                      .order_by(EarlyRelease.released_at, EarlyRelease.released_seq).limit(count - per_tenant))
            await session.execute(delete(EarlyRelease).where(EarlyRelease.tenant == tenant,
                                                             EarlyRelease.name.in_(oldest)))


async def prune_early_releases(session: AsyncSession, before: datetime, limit: int) -> int:
    """Forget up to about `limit` releases of unknown claims remembered before `before`; how many went."""
    oldest = select(EarlyRelease.released_at).where(EarlyRelease.released_at < before).order_by(
        EarlyRelease.released_at).limit(limit)
    cutoff = await session.scalar(select(func.max(oldest.subquery().c.released_at)))
    if cutoff is None:
        return 0
    result = await session.execute(delete(EarlyRelease).where(EarlyRelease.released_at <= cutoff,
                                                              EarlyRelease.released_at < before))
    return int(result.rowcount or 0)  # type: ignore[attr-defined]


async def release_devices(session: AsyncSession, claim_ids: Iterable[int]) -> None:
    """The devices these claim rows hold go back, in one statement per chunk."""
    for chunk in _chunks(sorted(set(claim_ids))):
        await session.execute(delete(DeviceAllocation).where(DeviceAllocation.claim_id.in_(chunk)))


async def unpublished(session: AsyncSession, limit: int = 500) -> Sequence[OutboxEvent]:
    rows = await session.scalars(
        select(OutboxEvent).where(OutboxEvent.published_at.is_(None)).order_by(OutboxEvent.id).limit(limit)
    )
    return list(rows)


async def mark_published(session: AsyncSession, ids: Sequence[int]) -> None:
    await session.execute(
        update(OutboxEvent).where(OutboxEvent.id.in_(ids)).values(published_at=datetime.now(UTC))
    )
