"""Services in a process of their own under `up`: the allocator (issue 42), so that its decisions get a
core of their own while the watcher, the notifier and the admin API share the parent's event loop, and
nothing they do (a page's poll, a what-if's answer, an alert's webhook) delays a claim's first status; and
start estimates (services/allocator/estimates_app.py), at a lower CPU priority (nice), so that running the
decision core forward takes neither the allocator's core nor its GIL.

The parent starts the child with `spawn` and hands it what it needs through the process's own pipe: the
service's settings, its bus URL with its own credential and the ledger URL (never argv or the environment,
which other users of the host can read). The child logs to the same stderr in the same format (logs stay
together), and reports back over a second pipe: its readiness whenever it changes and its Prometheus
metrics every second (the parent's /metrics serves them beside its own). It stops when the parent closes
its lifeline, which also happens when the parent dies: the allocator finishes the transaction in hand (no
decision is cut in half), then exits. Ctrl-C reaches the whole process group; the child ignores it and leaves the
stopping to the parent, so that one Ctrl-C stops everything in order."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import signal
import sys
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from shared.settings import AllocatorSettings

log = logging.getLogger("claimbroker")
FATAL_EXIT = 78  # the child cannot run with these settings (EX_CONFIG): restarting it would fail again
BACKGROUND_NICENESS = 10  # start estimates: the CPU goes to decisions and the API first
READY_EVERY = 0.2  # seconds between the child's readiness checks (sent only when they change)
METRICS_EVERY = 1.0  # seconds between the child's metrics reports
STOP_WAIT = 10.0  # seconds the child gets to finish its transaction before it is killed


@dataclass(frozen=True)
class ChildArgs:
    """What the child needs, pickled through the process's pipe. `service`: "allocator" or "estimator"."""

    service: str
    settings: AllocatorSettings
    nats_url: str  # with the allocator's own credential
    db_url: str
    log_format: str


class ServiceProcess:
    """The parent's side: `run()` is the service's task (it ends when the child does: an exit code other
    than on request is a failure `supervise` restarts; FATAL_EXIT ends the broker), `not_ready()` and
    `metrics()` are what the child last reported."""

    def __init__(self, args: ChildArgs) -> None:
        self.args = args
        self.what = f"the {args.service}'s process"
        self.reason: str | None = f"{self.what} is starting"
        self.metrics_text = b""
        self.pid: int | None = None

    def not_ready(self) -> str | None:
        return self.reason

    def metrics(self) -> bytes:
        return self.metrics_text

    async def run(self) -> None:
        from services.runtime.stack import FatalServiceError

        context = multiprocessing.get_context("spawn")
        lifeline_end, lifeline = context.Pipe(duplex=False)  # the child reads; closed here: stop
        reports, reports_end = context.Pipe(duplex=False)  # the child writes
        process = context.Process(target=child_main, args=(self.args, lifeline_end, reports_end),
                                  name=f"claimbroker-{self.args.service}")
        self.reason = f"{self.what} is starting"
        await asyncio.to_thread(process.start)  # spawn pickles the arguments and starts an interpreter
        lifeline_end.close()
        reports_end.close()
        self.pid = process.pid
        loop = asyncio.get_running_loop()
        ended: asyncio.Future[None] = loop.create_future()

        def on_exit() -> None:
            if not ended.done():
                ended.set_result(None)

        loop.add_reader(process.sentinel, on_exit)
        loop.add_reader(reports.fileno(), self._on_report, reports)
        try:
            await asyncio.shield(ended)
        except asyncio.CancelledError:
            lifeline.close()  # the child finishes its transaction and exits
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(ended), STOP_WAIT)
            if not ended.done():
                log.warning("%s did not stop within %.0fs; killing it", self.what, STOP_WAIT)
                process.kill()
                await asyncio.to_thread(process.join, 5)
            raise
        finally:
            loop.remove_reader(process.sentinel)
            with contextlib.suppress(ValueError, OSError):  # closed when the child went
                loop.remove_reader(reports.fileno())
            reports.close()
            lifeline.close()
            await asyncio.to_thread(process.join, 5)
            self.reason = f"{self.what} is not running"
            self.metrics_text = b""
        if process.exitcode == FATAL_EXIT:
            raise FatalServiceError(f"the {self.args.service} cannot run with these settings (its log says why)")
        code = process.exitcode or 0
        how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
        raise RuntimeError(f"{self.what} {how}")

    def _on_report(self, reports: Connection) -> None:
        try:
            kind, value = reports.recv()
        except (EOFError, OSError):  # the child is gone: its sentinel ends run()
            asyncio.get_running_loop().remove_reader(reports.fileno())
            return
        if kind == "ready":
            self.reason = value
        elif kind == "metrics":
            self.metrics_text = value


def child_main(args: ChildArgs, lifeline: Connection, reports: Connection) -> None:
    """The child's entry point: the service's app until the lifeline closes."""
    import os

    from services.runtime.gc_tuning import tune_gc
    from services.runtime.logs import configure

    configure(True, args.log_format)
    tune_gc()
    if args.service == "estimator":
        os.nice(BACKGROUND_NICENESS)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops this process, after its own Ctrl-C
    from services.runtime.stack import FatalServiceError

    try:
        asyncio.run(_serve(args, lifeline, reports))
    except FatalServiceError as error:
        log.error("the %s cannot run: %s", args.service, error)
        sys.exit(FATAL_EXIT)


async def _serve(args: ChildArgs, lifeline: Connection, reports: Connection) -> None:
    from services.allocator import app as allocator_app
    from services.allocator import estimates_app
    from services.bus.cancel import wait_closed
    from shared.ledger.engine import create_engine

    if args.service == "allocator":
        engine = create_engine(args.db_url, pre_ping=False)  # its transactions are retried on any ledger error
        app = allocator_app.create_app(args.settings, engine, args.nats_url)
    else:
        engine = create_engine(args.db_url)
        app = estimates_app.create_app(args.settings, engine, args.nats_url)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_reader(lifeline.fileno(), stop.set)  # closed by the parent, or with it
    running = asyncio.create_task(app.run(), name=args.service)
    reporting = asyncio.create_task(_report(reports, app.not_ready))
    waiter = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait([running, waiter], return_when=asyncio.FIRST_COMPLETED)
        if running.done():
            running.result()  # a failure ends the process with its trace: the parent restarts it
            raise RuntimeError(f"the {args.service} ended on its own")
        if args.service == "allocator":
            app.service.stop()  # finish the batch in hand rather than cut it
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(running), STOP_WAIT / 2)
    finally:
        waiter.cancel()
        await wait_closed(running)
        await wait_closed(reporting)
        await engine.dispose()


async def _report(reports: Connection, not_ready: Any) -> None:
    """Readiness when it changes, metrics every METRICS_EVERY seconds (only the broker's own series: the
    parent has its process's)."""
    from services.runtime.metrics import own_series

    last: object = object()
    ticks_per_metrics = max(1, round(METRICS_EVERY / READY_EVERY))
    tick = 0
    with contextlib.suppress(OSError):  # the parent is gone: the lifeline stops this process
        while True:
            reason = not_ready()
            if reason != last:
                reports.send(("ready", reason))
                last = reason
            if tick % ticks_per_metrics == 0:
                reports.send(("metrics", own_series()))
            tick += 1
            await asyncio.sleep(READY_EVERY)
