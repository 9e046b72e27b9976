"""Start estimates beside the decisions (issue 39): at most every `interval` seconds, and only when a committed
cycle changed something since the last run (else once `refresh` has passed), the input of the last committed
cycle (an immutable Snapshot) is run forward by shared/admission/estimates.estimate_starts with one
EstimateMemo kept from run to run, in a worker thread (the event loop goes on taking messages and deciding;
the thread holds the GIL while it computes, so the loop runs in the interpreter's switch intervals, about
5 ms), never inside a decision transaction, and not while the allocator has a backlog (a full batch fetched, or
placement work left over) unless `refresh` has passed. The estimates that are due (shared/admission/estimate_publishing:
first wait with one, a move by more than a tenth of the time still to wait; at most `per_run`, the biggest
moves first) are written as statuses in a small transaction of their own (shared/ledger/estimates
.write_estimates: only on claims still Pending, the shard's turn taken so no decision races it) and go out
through the outbox. The runtimes observed in the ledger are read again every `runtimes_every` seconds, and with them the
estimates' error over the last day is exported (claimbroker_estimate_error_seconds)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from services.allocator.outbox_relay import OutboxRelay
from services.runtime import metrics
from services.runtime.outage import Outage
from shared.admission.estimate_publishing import due, error_summary, runtimes_from
from shared.admission.estimates import Estimate, EstimateMemo, Runtimes, estimate_starts
from shared.admission.model import ClaimKey, Snapshot
from shared.ledger import estimates as ledger
from shared.ledger.handles import AsyncSession
from shared.ledger.unit_of_work import unit_of_work

log = logging.getLogger("claimbroker.allocator")
RUNTIMES_WINDOW = 14 * 86400.0  # runs observed over this window
ERROR_WINDOW = 86400.0  # the estimates' error exported over the claims allocated within it
PER_RUN = 500  # estimate statuses written per run at most


@dataclass(frozen=True)
class RunFigures:
    """What one run cost: CPU seconds in the worker thread, wall seconds of the estimate, the event loop's
    longest lateness meanwhile (a probe's sleeps of `PROBE` seconds, measured), estimates worked out and
    statuses written."""

    cpu_s: float
    wall_s: float
    loop_late_s: float
    estimated: int
    published: int


PROBE = 0.002


class SnapshotSource(Protocol):
    """What estimates run on: the allocator's DecisionCycle in its process (its last committed input), or
    LedgerSnapshots in a process of their own (ledger_snapshots.py)."""

    committed_snapshot: Snapshot | None
    changes: int  # moves with every change estimates should see


class Estimator:
    """`cycle`: where the snapshots come from; `read_again`: called before each look (LedgerSnapshots.refresh
    reads the ledger and the fleet again when they moved; the allocator's cycle needs none)."""

    def __init__(self, sessions: Callable[[], AsyncSession], cycle: SnapshotSource, relay: OutboxRelay, *,
                 shard: str, interval: float, refresh: float = 60.0, runtimes_every: float = 300.0,
                 per_run: int = PER_RUN, clock: Callable[[], float] = time.time,
                 busy: Callable[[], bool] = lambda: False,
                 read_again: Callable[[], Awaitable[None]] | None = None) -> None:
        self.sessions, self.cycle, self.relay, self.shard = sessions, cycle, relay, shard
        self.interval, self.refresh, self.runtimes_every, self.per_run = interval, refresh, runtimes_every, per_run
        self.clock = clock
        self.busy = busy  # the allocator has a backlog: estimates wait (at most `refresh`), decisions go first
        self.read_again = read_again
        self.memo = EstimateMemo()
        self.runtimes = Runtimes()
        self.runtimes_at: float | None = None  # monotonic time of the last read
        self.published: dict[ClaimKey, float | None] | None = None  # p50 last published per waiting claim
        self.published_reasons: dict[ClaimKey, str] = {}  # of the null ones published here: said again if it changes
        self.seen_changes = -1  # the cycle's `changes` at the last run
        self.last_run: float | None = None  # monotonic
        self.figures: RunFigures | None = None  # the last run's
        self.runs = 0
        self.outage = Outage("start estimates", log)

    def due_now(self, now: float) -> bool:
        if self.cycle.committed_snapshot is None:
            return False
        if self.last_run is None:
            return True
        if now - self.last_run < self.interval:
            return False
        if now - self.last_run >= self.refresh:
            return True
        # an estimate's thread shares the GIL with the decisions (they run about half as fast beside it)
        return self.cycle.changes != self.seen_changes and not self.busy()

    async def run(self) -> None:
        """The task: looks every `interval` (or sooner while nothing ran yet) whether a run is due."""
        while True:
            now = time.monotonic()
            try:
                if self.read_again is not None and (self.last_run is None or now - self.last_run >= self.interval):
                    await self.read_again()
                due = self.due_now(now)
            except Exception as error:  # the ledger or the bus away: tried again at the next look
                await self.outage.failed(error)
                due = False
            if due:
                try:
                    await self.run_once()
                except Exception as error:  # the task's guard: the ledger away, or a fault of ours in the estimate
                    self.memo = EstimateMemo()  # a run cut short may leave what it keeps half done
                    await self.outage.failed(error)
                else:
                    self.outage.ok()
            wait = self.interval if self.last_run is None else max(0.0, self.last_run + self.interval - now)
            await asyncio.sleep(min(max(wait, 0.05), self.interval))  # pacing: how often it looks, nothing waits on it

    async def run_once(self) -> RunFigures | None:
        """One run on the last committed cycle's input: estimate, publish what is due. None: nothing waited."""
        snapshot = self.cycle.committed_snapshot
        self.seen_changes, self.last_run = self.cycle.changes, time.monotonic()
        if snapshot is None:
            return None
        await self._read_ledger()
        assert self.published is not None
        started = time.perf_counter()
        probe = _Probe(PROBE)
        probing = asyncio.create_task(probe.run())
        try:
            estimates, cpu = await asyncio.to_thread(_estimate, snapshot, self.runtimes, self.memo)
        finally:
            probing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await probing
        wall = time.perf_counter() - started
        metrics.ESTIMATE_RUN_SECONDS.observe(cpu)
        published = self.published
        for key in [k for k in published if k not in estimates]:  # no longer waiting
            del published[key]
            self.published_reasons.pop(key, None)
        found = due(estimates, published, self.clock(), self.per_run, self.published_reasons)
        written: list[ClaimKey] = []
        if found:
            writes = [ledger.EstimateWrite(d.key[0], d.key[1], d.estimate.to_json(), d.estimate.p50, d.estimate.reason)
                      for d in found]
            async with unit_of_work(self.sessions) as work:
                done = await ledger.write_estimates(work, self.shard, writes, now=self.clock())
            self.relay.committed(work.flushed)  # at once: the relay keeps commit order
            written = done.claims
            by_key = {d.key: d.estimate for d in found}
            for key in written:
                published[key] = by_key[key].p50
                if by_key[key].p50 is None and by_key[key].reason:
                    self.published_reasons[key] = by_key[key].reason or ""
                else:
                    self.published_reasons.pop(key, None)
            published.update(done.held)  # published already as it is (by another allocator): what its row holds
            # the others (decided meanwhile, or back in the queue unanswered) are due again as they come
        self.runs += 1
        self.figures = RunFigures(cpu, wall, probe.late, len(estimates), len(written))
        log.debug("start estimates: %d claims, %.3f CPU s, loop late %.1f ms at most, %d published",
                  len(estimates), cpu, self.figures.loop_late_s * 1e3, len(written))
        return self.figures

    async def _read_ledger(self) -> None:
        now = time.monotonic()
        if self.runtimes_at is None or now - self.runtimes_at >= self.runtimes_every:
            async with unit_of_work(self.sessions) as work:
                runs = await ledger.observed_runtimes(work, self.clock() - RUNTIMES_WINDOW)
                errors = await ledger.estimate_errors(work.session, self.clock() - ERROR_WINDOW)
                if self.published is None:  # a restarted estimator goes on from what was published
                    self.published = dict(await ledger.published_estimates(work))
            self.runtimes, self.runtimes_at = runtimes_from(runs), now
            export_errors(errors)
        if self.published is None:
            async with unit_of_work(self.sessions) as work:
                self.published = dict(await ledger.published_estimates(work))


def export_errors(errors: list[ledger.EstimateError]) -> None:
    """The estimates' error, all tenants and flavors together, as Prometheus gauges (NaN: nothing measured)."""
    overall, _ = error_summary((e.tenant, e.flavor, e.first, e.last) for e in errors)
    figures: dict[tuple[str, str], float | None] = {
        ("first", "0.5"): overall.first_p50 if overall else None,
        ("first", "0.9"): overall.first_p90 if overall else None,
        ("last", "0.5"): overall.last_p50 if overall else None,
        ("last", "0.9"): overall.last_p90 if overall else None}
    for (estimate, q), value in figures.items():
        metrics.ESTIMATE_ERROR.labels(estimate, q).set(float("nan") if value is None else value)


def _estimate(snapshot: Snapshot, runtimes: Runtimes, memo: EstimateMemo) -> tuple[dict[ClaimKey, Estimate], float]:
    """In the worker thread: the estimates, and the thread's CPU seconds for them."""
    started = time.thread_time()
    estimates = estimate_starts(snapshot, runtimes, memo=memo)
    return estimates, time.thread_time() - started


class _Probe:
    """Sleeps of `period` until cancelled: `late`, the longest an event loop turn came after its time (how long
    the loop could not serve)."""

    def __init__(self, period: float) -> None:
        self.period, self.late = period, 0.0

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            before = loop.time()
            await asyncio.sleep(self.period)
            self.late = max(self.late, loop.time() - before - self.period)
