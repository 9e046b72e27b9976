"""The queue a decision cycle reads: the waiting and running claims, read from the claim rows written since
the allocator's last cycle (`QueueCache`), so a cycle's cost follows what changed, not the queue's depth;
and what else a cycle reads of the claims (the running claims on lost nodes, recent preemptions)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from shared.admission.model import Running, Waiting
from shared.admission.waiting_queue import WaitingQueue
from shared.dra import model as dra
from shared.dra.claims import expected_runtime, gang_name
from shared.dra.results import Allocation, State
from shared.ledger.schema import OUTSIDE, Claim, ClaimEvent
from shared.ledger.unit_of_work import UnitOfWork, in_chunks, one_of

log = logging.getLogger("claimbroker.allocator")
QUEUED = (State.PENDING.value, State.ALLOCATED.value)  # a claim in these states waits or runs


@dataclass
class Queue:
    """What a decision cycle reads: running and waiting claims, and their rows' ids (`claim_rows` reads the
    rows a cycle writes back to). The waiting claims record what came and went since their last
    `snapshot()`, which the cycle is handed with them, so a deep queue is not compared claim by claim."""

    ids: dict[tuple[str, str], int] = field(default_factory=dict)
    running: dict[tuple[str, str], Running] = field(default_factory=dict)
    waiting: WaitingQueue = field(default_factory=WaitingQueue)


COUNT_EVERY_S = 1.0  # how often a read since a revision is checked against a count of the queued rows


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
    counted_at: float = float("-inf")  # monotonic time of the last count of the queued rows (the check)
    count_every: float = COUNT_EVERY_S  # seconds between two such counts

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


def read_document(spec: dict[str, Any]) -> dra.ResourceClaim:
    """A claim row's document, parsed once while the claim stays queued or running (the cache keeps it, and
    nothing else: a claim's memory goes when it ends)."""
    claim = dra.ResourceClaim.model_validate(spec)
    dra.share_fields_sets(claim)
    return claim


_COLUMNS = (Claim.id, Claim.namespace, Claim.name, Claim.state, Claim.sequence, Claim.priority, Claim.preemptible,
            Claim.arrival, Claim.reason.is_not(None), Claim.allocated_at)


async def recent_preemptions(work: UnitOfWork, since: float) -> dict[str, int]:
    """Per tenant, its claims preempted for fair share or reclaim (by another tenant's claim) since `since`
    (seconds since the epoch): what its maxPreemptionsPerMinute is checked against."""
    rows = await work.session.execute(
        select(Claim.namespace, func.count()).select_from(ClaimEvent).join(Claim, Claim.id == ClaimEvent.claim_id)
        .where(ClaimEvent.state == State.PREEMPTED.value, ClaimEvent.at >= datetime.fromtimestamp(since, UTC),
               ClaimEvent.by.is_not(None), ~ClaimEvent.by.startswith(Claim.namespace + "/"))
        .group_by(Claim.namespace))
    return {tenant: int(count) for tenant, count in rows}


async def load_queue(work: UnitOfWork, cache: QueueCache | None = None) -> Queue:
    """Running and waiting claims; a waiting claim carries the claims that ever preempted it (from its
    history), which it may never preempt back.

    In a decision transaction (`UnitOfWork.take_turn`) with a cache of an earlier one, only the claim rows written
    since are read, whatever their state: a cycle at a depth of 10,000 reads its few hundred changes, not
    the 10,000 rows (reading every queued row's columns was most of a cycle's time). A count of the
    queued rows checks the result (a mismatch, which no writer taking the shard's turn can cause, falls
    back to a full read; at most every COUNT_EVERY_S: counting 7,500 queued rows took a tenth of the read under
    churn). Otherwise every queued row's columns are read. Either way documents and
    allocations are read only for rows the cache does not hold as they are (new, or their sequence moved).

    What comes back is the queue the cache holds, not a copy (a deep queue's dicts are not copied each
    cycle): a claim the caller puts into its `waiting` is a change like one read from the
    ledger, and the row read next time brings the cache back to what the ledger holds."""
    session = work.session
    cache = cache if cache is not None else QueueCache()
    revision = work.revision
    since = cache.seen if revision is not None and cache.seen is not None and cache.seen < revision else None
    listed: list[Any]
    outside_read = True  # whether rows written outside a decision transaction may be waiting for a revision
    if since is None:
        listed = list((await session.execute(select(*_COLUMNS).where(Claim.state.in_(QUEUED))
                                             .order_by(Claim.id))).all())
    else:
        # OUTSIDE rows too (OUTSIDE is above every revision). Sorted here, not by the database: asked to order
        # by id, SQLite scans the whole table in id order instead of searching the revision index (a cost that
        # grows with the depth, for the same hundred rows)
        read = sorted((await session.execute(select(*_COLUMNS, Claim.revision).where(Claim.revision > since))).all(),
                      key=lambda row: row[0])
        outside_read = any(row[-1] == OUTSIDE for row in read)
        listed = [tuple(row)[:-1] for row in read]
    cache.rows_read = len(listed)
    queued = [row for row in listed if row[3] in QUEUED]
    gone = ({row[0] for row in listed} - {row[0] for row in queued} if since is not None  # released, Rejected
            else set(cache.keys) - {row[0] for row in queued})  # not queued any more
    for row_id in gone:
        cache.drop(row_id)
    await _read_rows(session, cache, queued, full=since is None, parsed=work.queued_documents)
    if since is not None and time.monotonic() >= cache.counted_at + cache.count_every:
        cache.counted_at = time.monotonic()
        count = await session.scalar(select(func.count()).select_from(Claim).where(Claim.state.in_(QUEUED)))
        if count != len(cache.keys):
            log.warning("queue read since revision %d holds %d claims, the ledger %d: reading it all", since,
                        len(cache.keys), count)
            cache.invalidate()
            return await load_queue(work, cache)
    # rows written outside a decision transaction are read once more, then as any row; when this read saw
    # none, the statement is left out (one that commits meanwhile is still OUTSIDE: the next read takes it)
    if revision is not None and outside_read:
        await session.execute(update(Claim).where(Claim.revision == OUTSIDE).values(revision=revision))
    cache.seen = revision - 1 if revision is not None else None  # this transaction's own writes: read next time
    return cache.held


async def _read_rows(session: AsyncSession, cache: QueueCache, listed: Sequence[Any], *, full: bool,
                     parsed: Mapping[tuple[str, str], dra.ResourceClaim] | None = None) -> None:
    """Bring the cache's entries of these queued rows up to date (`full`: they are all the queued rows).
    `parsed`: documents of claims queued in this transaction, by claim, taken instead of their rows' specs."""
    pending = [row[0] for row in listed if row[3] == State.PENDING.value]
    displaced: dict[int, set[tuple[str, str]]] = {}
    preempted = select(ClaimEvent.claim_id, ClaimEvent.by).where(ClaimEvent.state == State.PREEMPTED.value)
    if full:
        queries = [preempted.join(Claim, Claim.id == ClaimEvent.claim_id).where(Claim.state == State.PENDING.value)]
    else:
        queries = [preempted.where(one_of(session, ClaimEvent.claim_id, chunk)) for chunk in in_chunks(pending)]
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
    for row_id, namespace, name, state, sequence, *_ in listed:
        if row_id not in documents:
            document = parsed.get((namespace, name)) if parsed and state == State.PENDING.value else None
            if document is not None:
                dra.share_fields_sets(document)
                documents[row_id] = document
            else:
                unread.append(row_id)
        elif state == State.ALLOCATED.value and cache.sequences.get(row_id) != sequence:
            stale.append(row_id)
    for chunk in in_chunks(unread):
        for row_id, spec, allocation in await session.execute(
                select(Claim.id, Claim.spec, Claim.allocation).where(one_of(session, Claim.id, chunk))):
            documents[row_id] = read_document(spec)
            allocations[row_id] = allocation
    for chunk in in_chunks(stale):
        for row_id, allocation in await session.execute(
                select(Claim.id, Claim.allocation).where(one_of(session, Claim.id, chunk))):
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
                                      since, running.gang, running.expected_runtime)
            elif allocation := allocations.get(row_id):
                running = Running(namespace, name, Allocation.from_json(allocation), priority, preemptible,
                                  arrival, order, since, gang_name(documents[row_id]),
                                  expected_runtime(documents[row_id]))
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


async def claims_on_nodes(work: UnitOfWork, nodes: Iterable[str]) -> list[Claim]:
    """The claims allocated on these nodes (lost ones: their claims go back to the queue)."""
    rows = await work.session.scalars(select(Claim).where(Claim.state == State.ALLOCATED.value,
                                                          Claim.node.in_(list(nodes))))
    return list(rows)


async def queue_version(session: AsyncSession) -> tuple[int | None, int, int]:
    """What moves whenever the queue may have: the highest revision a claim row was written at, how many
    rows were written outside a decision transaction and not yet read by one, and how many claims are
    queued. A reader outside the allocator (start estimates beside it) reads the queue again only when
    this changed."""
    top, outside, queued = (await session.execute(select(
        func.max(Claim.revision),
        func.count().filter(Claim.revision == OUTSIDE),
        func.count().filter(Claim.state.in_(QUEUED))))).one()
    return top, int(outside or 0), int(queued or 0)
