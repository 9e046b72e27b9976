"""One decision cycle inside the decision transaction: lost nodes' claims back to the queue, the queue and
the quotas read, the pure core run (shared/admission/cycle.py), its preemptions and decisions written
with their statuses. The queue read takes only the claim rows written since the last cycle (by either
allocator: rows carry the lease revision they were written at), so its cost follows what changed, not
the depth."""

from __future__ import annotations

import collections
import itertools
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from services.allocator.decision_metrics import DecisionMetrics, Parts
from services.allocator.gang_clocks import ClockedKeptState, GangClocks
from services.allocator.inventory import Inventory
from services.allocator.reasons import ReasonRefresh
from services.runtime import metrics
from services.runtime.gc_tuning import CollectorPacing
from shared.admission.cycle import run_cycle
from shared.admission.model import Snapshot, Waiting
from shared.admission.quota import DEFAULT_GANG_RESERVE_AFTER, QuotaConfig
from shared.contract import events, subjects
from shared.dra import model as dra
from shared.dra.budget import TENANT_BUDGET
from shared.dra.results import State
from shared.ledger import decisions, queue
from shared.ledger.past_use import PastUseKeeper, held_units
from shared.ledger.quota_store import QuotaConfigCache
from shared.ledger.unit_of_work import UnitOfWork, Writes


@dataclass
class Cycled:
    """What a cycle did: the lost nodes whose claims it sent back (handled once it commits), and its
    preemptions per rule."""

    lost: set[str] = field(default_factory=set)
    preempted: collections.Counter[str] = field(default_factory=collections.Counter)


class DecisionCycle:
    """The cycle and what it keeps from one to the next: the core's state (`kept`), the queue as last read
    (`queue_cache`), when waiting claims were answered (`reasons`), the claims set aside after an internal
    error. `waiting`: the last cycle left claims waiting (cycles keep running); `work_left`: it cut some
    placement work short (the next one comes soon)."""

    def __init__(self, classes: Mapping[str, dra.DeviceClass], inventory: Inventory, metrics: DecisionMetrics, *,
                 reason_refresh: float = 60.0, min_runtime: float = 0.0,
                 gang_reserve_after: float = DEFAULT_GANG_RESERVE_AFTER, tenant_budget: int = TENANT_BUDGET,
                 clock: Callable[[], float] = time.time) -> None:
        self.classes = dict(classes)
        self.inventory = inventory
        self.metrics = metrics
        self.kept = ClockedKeptState()  # selector results and the cycle's states, kept from one cycle to the next
        self.gang_clocks = GangClocks(self.kept)  # waiting gangs' clocks, kept in the ledger as they change
        self.queue_cache = queue.QueueCache()
        self.quotas = QuotaConfigCache()  # read again when the ledger's config_revision moved
        self.past_use = PastUseKeeper()  # with fairSharing.halfLife: stepped every transaction, kept in the ledger
        self._running_seen: set[tuple[str, str]] | None = None  # running claims whose units past use last counted
        self.collector = CollectorPacing()  # what a cycle keeps is frozen: young GC passes skip it
        self.reasons = ReasonRefresh(reason_refresh, clock)
        self.set_aside: dict[tuple[str, str], float] = {}  # claims that hit an internal error: until when
        self.min_runtime = min_runtime  # for tenants without a minRuntime of their own
        self.gang_reserve_after = gang_reserve_after  # for tenants without a gangReserveAfter of their own
        self.tenant_budget = tenant_budget  # placement work per tenant and cycle (shared/dra/budget.py)
        self.clock = clock
        self.waiting = True
        self.work_left = False
        self._snapshot: Snapshot | None = None  # the last cycle's input (None: nothing waited), until it commits
        self.committed_snapshot: Snapshot | None = None  # the last committed cycle's input: what estimates run on
        self.changes = 0  # committed cycles that changed something (statuses written): the estimator's cue

    def committed(self, changed: bool) -> None:
        """The transaction of the last cycle committed: its input is what estimates run on next (a snapshot is
        never changed once built), and `changed` says whether it wrote anything."""
        self.committed_snapshot = self._snapshot
        self.changes += changed
        self.past_use.committed()

    def rolled_back(self) -> None:
        """The transaction of the last cycle rolled back: what it stepped of past use is forgotten."""
        self.past_use.rolled_back()
        self._running_seen = None

    async def run(self, work: UnitOfWork, config: QuotaConfig | None = None, parts: Parts | None = None) -> Cycled:
        """Send lost nodes' claims back to the queue, decide, write. `config`: the quotas, when this
        transaction read them already; `parts`: where its time goes (queue, decide, write)."""
        parts = parts or Parts()
        cycled = Cycled(set(self.inventory.lost_nodes))
        writes = work.writes
        if cycled.lost:
            stranded = await queue.claims_on_nodes(work, cycled.lost)
            await decisions.release_devices(work, [row.id for row in stranded])
            for stranded_row in stranded:
                stranded_row.reason = f"node {row_node_of(stranded_row)} was lost; waiting to be placed again"
                stranded_row.state, stranded_row.allocation, stranded_row.node = State.PENDING.value, None, None
                writes.status(stranded_row)
                stranded_row.reason = None  # not answered yet: the cycle below decides it like a new claim
        held = await queue.load_queue(work, self.queue_cache)
        self.metrics.waiting = held.waiting
        config = config if config is not None else await self.quotas.load(work.session)
        cycle_at = self.clock()
        # past use up to now with what was held since the last transaction, before this one's changes count
        past = await self.past_use.step(work.session, cycle_at, config.half_life)
        if not held.waiting:
            self._snapshot = None
            self.waiting = self.work_left = False
            self.reasons.clear()
            await self.gang_clocks.after_cycle(work.session, None)
            await self._count_held_without_cycle(work, held)
            parts.lap("queue")
            return cycled
        self.reasons.ask_again(held)
        waiting, changes = held.waiting.snapshot()
        if self.set_aside:  # compared in full, not by the changes recorded
            waiting = self._without_set_aside(waiting, held)
        if (config.default_min_runtime, config.default_gang_reserve_after) != (self.min_runtime,
                                                                               self.gang_reserve_after):
            config = replace(config, default_min_runtime=self.min_runtime,
                             default_gang_reserve_after=self.gang_reserve_after)
        limited = any(t.max_preemptions_per_minute is not None for t in config.tenants.values())
        recent = await queue.recent_preemptions(work, cycle_at - 60.0) if limited else {}
        snapshot = Snapshot(self.inventory.fleet, self.classes, config, tuple(held.running.values()), waiting,
                            self.inventory.unusable_nodes(), None if self.set_aside else changes, now=cycle_at,
                            recent_preemptions=recent, tenant_budget=self.tenant_budget, past_use=past)
        self._snapshot = snapshot
        await self.gang_clocks.before_cycle(work.session)
        parts.lap("queue")
        started = time.perf_counter()
        result = run_cycle(snapshot, self.kept)
        self.work_left = result.deferred > 0
        metrics.CYCLE_SECONDS.observe(time.perf_counter() - started)
        self.collector.after_cycle()
        parts.lap("decide")
        now = datetime.now(UTC)
        rows = await decisions.claim_rows(work, held, itertools.chain(
            (p.victim for p in result.preemptions), ((d.tenant, d.name) for d in result.decisions)))
        await decisions.release_devices(work, [rows[p.victim].id for p in result.preemptions])
        for preemption in result.preemptions:
            row = rows[preemption.victim]
            by = "/".join(preemption.by)
            row.state, row.reason, row.allocation, row.node = State.PREEMPTED.value, preemption.reason, None, None
            writes.status(row, by=by)
            row.state, row.reason = State.PENDING.value, f"{preemption.reason}; waiting to be placed again"
            writes.status(row)
            row.reason = None  # not answered yet: the next cycle decides it like a new claim
        settled = 0  # waiting claims admitted or Rejected
        answered_now = self.clock()
        for decided in result.decisions:
            key = (decided.tenant, decided.name)
            row = rows[key]
            decision = decided.decision
            if decision.state is State.PENDING:
                self.reasons.answered(key, answered_now)
            elif key in held.waiting:
                settled += 1
            if decided.internal_error is not None:
                self.set_aside[key] = answered_now + self.reasons.refresh
                _internal_error(writes, key, decided.internal_error, row.sequence)
            changed = writes.decision(row, decision, result.flavors)
            row.explain = dict(decided.explain) if decided.explain is not None else None
            if decided.explain is not None:
                self.metrics.flavors_of[key] = tuple(decided.explain.get("flavors") or ())
            if decision.allocation is not None:
                row.allocated_at = now
            if changed:
                writes.status(row, unsatisfiable=decision.unsatisfiable)
        await self.gang_clocks.after_cycle(work.session, self.kept.admission)
        if self.past_use.stepped:
            self.past_use.holds(result.units_in_use)
            self._running_seen = None  # the cycle counted them; the next idle transaction counts again
            await self.past_use.write(work.session)
        cycled.preempted.update(preemption.rule for preemption in result.preemptions)
        self.waiting = len(held.waiting) > settled or bool(result.preemptions)
        parts.lap("write")
        return cycled

    async def _count_held_without_cycle(self, work: UnitOfWork, held: queue.Queue) -> None:
        """With past use and no cycle to count what is held: the ledger's units, read again only when the
        running claims changed (releases, lost nodes) since they were last counted."""
        if not self.past_use.stepped:
            self._running_seen = None
            return
        running = set(held.running)
        if running != self._running_seen:
            self.past_use.holds(await held_units(work.session))
            self._running_seen = running
        await self.past_use.write(work.session)

    def _without_set_aside(self, waiting: tuple[Waiting, ...], held: queue.Queue) -> tuple[Waiting, ...]:
        """Claims whose deciding failed through a fault of ours sit out `reason_refresh` (each try costs the
        core a cycle built anew), then are tried again; the queue is then compared in full, not by changes."""
        now = self.clock()
        for key, until in list(self.set_aside.items()):
            if until <= now or key not in held.waiting:
                del self.set_aside[key]
        return tuple(w for w in waiting if w.key not in self.set_aside)


def _internal_error(writes: Writes, key: tuple[str, str], error: str, sequence: int) -> None:
    tenant, name = key
    writes.event(*alert("internal-error", f"{tenant}/{name}", f"alert:internal:{tenant}/{name}:{sequence}",
                        f"internal error while deciding claim {tenant}/{name}: {error}",
                        {"tenant": tenant, "claim": name, "error": error}, tenant=tenant))


def alert(kind: str, about: str, message_id: str, summary: str, details: dict[str, Any], *,
          tenant: str | None = None) -> tuple[str, str, dict[str, Any]]:
    """A critical alert of the allocator's own: its subject, outbox message id and payload."""
    now = time.time()
    payload = events.alert(kind=kind, severity="critical", key=f"{kind}:{about}", summary=summary, details=details,
                           labels={"tenant": tenant} if tenant else {}, first_seen=now, last_seen=now)
    return subjects.alert("critical", kind, tenant), message_id, payload


def row_node_of(row: Any) -> str:
    return str(row.node or (row.allocation or {}).get("nodeName") or "?")
