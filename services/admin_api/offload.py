"""Heavy admin requests (what-if, quota import and export) run beside the allocator, in worker processes.

`up` runs the allocator and this API on one event loop, and a thread would share the GIL with it: a
20,000-node what-if on the loop answered after 27.8 s and stalled every tenant's claims for up to 20 s.
Each heavy request here is a job in a process of its own, forked from multiprocessing's fork server (which
has the broker's modules loaded already), at a lower CPU priority, under a memory limit, and killed at its
deadline. A job reads what it needs itself (the ledger; the fleet from the bus), so nothing large is copied
on the loop, and what it sends back is its answer's JSON, passed on unparsed.

At most `Limits.jobs` run at once and `Limits.queue` wait for one; a further request is answered 503 at once.
Every heavy request is answered within `Limits.timeout`, a 503 when its job was still waiting or running
then (the job is stopped). Each answer says what to do (Retry-After, propose less).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import multiprocessing
import os
import pickle
import resource
import select
import signal
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import orjson
from fastapi import HTTPException, Request
from fastapi.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.admin_api.problems import PROBLEM, Problem, phrase, problem
from services.runtime.logs import mask_last_resort
from shared.ledger.handles import SessionFactory
from shared.settings import AdminApiSettings, BrokerSettings

log = logging.getLogger("claimbroker.admin")

# A job yields the CPU to the allocator when they contend (the probe ran on 2 cores).
WORKER_NICENESS = 10
# What the fork server loads once, so that a job starts in milliseconds rather than importing for seconds.
PRELOAD = ["services.admin_api.whatif", "services.admin_api.quotas"]


@dataclass(frozen=True)
class Limits:
    """What the admin API accepts, and spends on one heavy request (shared/settings.py, `admin_*`)."""

    jobs: int
    queue: int
    timeout: float
    memory: int  # bytes a job may allocate beyond what its process starts with; 0: no limit
    max_body: int
    whatif_max_nodes: int
    whatif_max_devices: int
    import_max_tenants: int
    import_max_quotas: int

    @classmethod
    def of(cls, settings: AdminApiSettings) -> Limits:
        return cls(jobs=settings.admin_jobs, queue=settings.admin_queue, timeout=settings.admin_job_timeout,
                   memory=settings.admin_job_memory, max_body=settings.admin_max_body,
                   whatif_max_nodes=settings.whatif_max_nodes, whatif_max_devices=settings.whatif_max_devices,
                   import_max_tenants=settings.quota_import_max_tenants,
                   import_max_quotas=settings.quota_import_max_quotas)

    @classmethod
    def defaults(cls) -> Limits:
        """The settings' defaults, without reading the environment (an app built without settings)."""
        return cls.of(BrokerSettings.model_construct().admin_api)


@dataclass(frozen=True)
class Reach:
    """Where a job reads the broker's data itself: the ledger, and the bus for the fleet (None: the app
    hands the job its fleet). URLs may hold passwords: kept out of repr."""

    db_url: str = field(repr=False)
    bus_url: str | None = field(default=None, repr=False)
    tls_ca: Path | None = None


@dataclass(frozen=True)
class Answer:
    """A job's HTTP answer, its body rendered in the worker."""

    status: int
    body: bytes
    media_type: str = "application/json"
    headers: Mapping[str, str] = field(default_factory=dict)

    def response(self) -> Response:
        return Response(self.body, self.status, dict(self.headers), media_type=self.media_type)


def problem_answer(status: int, title: str, detail: Any, headers: Mapping[str, str] | None = None) -> Answer:
    """As every error of this API reads (common.problem), built in a worker."""
    body = {"type": "about:blank", "title": title, "status": status, "detail": detail}
    return Answer(status, orjson.dumps(body), PROBLEM, dict(headers or {}))


def validation_detail(errors: Any, prefix: tuple[str, ...] = ()) -> str:
    """Pydantic's errors as the API words them: `body.field: message; ...`."""
    return "; ".join(f"{'.'.join(map(str, (*prefix, *e['loc'])))}: {e['msg'].removeprefix('Value error, ')}"
                     for e in errors)


def json_answer(value: Any) -> Answer:
    return Answer(200, orjson.dumps(value))


# A job: a module-level coroutine function (pickled by name), called in its worker as job(reach, limits, *args).
Job = Callable[..., Awaitable[Answer]]


@contextlib.asynccontextmanager
async def ledger(reach: Reach) -> AsyncIterator[SessionFactory]:
    """The job's own engine on the broker's ledger, for the job's life."""
    from shared.ledger.engine import create_engine, sessions

    engine = create_engine(reach.db_url)
    try:
        yield sessions(engine)
    finally:
        await engine.dispose()


def _exit_when_unread(answers: Connection) -> None:
    """A thread of the worker: the process ends once nobody can read its answer (the request stopped it,
    or the API's process is gone, kill -9 of `up` included), so no job computes on for nobody. A pipe's
    write end reports an error as soon as its read end is closed."""
    watch = select.poll()
    watch.register(answers.fileno(), 0)  # errors and hang-ups are always reported
    watch.poll()
    os._exit(1)


def _second_to_the_broker(memory: int) -> None:
    """The job's process gives way: the CPU to the allocator first (nice), the first to go should a
    container's memory run out (OOM score), and an address space of what it holds now plus `memory`
    (0: no limit), past which an allocation fails (MemoryError) in this job alone."""
    os.nice(WORKER_NICENESS)
    with contextlib.suppress(OSError), open("/proc/self/oom_score_adj", "w") as score:
        score.write("1000")
    if not memory:
        return
    with contextlib.suppress(OSError, ValueError):
        with open("/proc/self/status") as status:
            size = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:"))
        resource.setrlimit(resource.RLIMIT_AS, (size + memory, size + memory))


async def _answer(job: Job, reach: Reach, limits: Limits, args: tuple[Any, ...]) -> Answer:
    try:
        return await job(reach, limits, *args)
    except HTTPException as error:  # a refusal, as the app's handler words it
        title = error.title if isinstance(error, Problem) else (
            error.detail if isinstance(error.detail, str) else phrase(error.status_code))
        return problem_answer(error.status_code, title, error.detail, error.headers)


def _work(answers: Connection, job: Job, reach: Reach, limits: Limits, args: tuple[Any, ...]) -> None:
    """A worker process: one job, its answer sent back, then it exits (the memory of a large job goes
    with it)."""
    mask_last_resort()  # its log lines (it configures no handler) without a password
    threading.Thread(target=_exit_when_unread, args=(answers,), daemon=True).start()
    signal.alarm(math.ceil(limits.timeout) + 5)  # never past its deadline, even when nobody is left to stop it
    _second_to_the_broker(limits.memory)
    try:
        answer = asyncio.run(_answer(job, reach, limits, args))
    except Exception as error:  # the worker's last resort: whatever the job raised, the request gets an answer
        answer = _failed(job, limits, error)
    answers.send_bytes(pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL))
    answers.close()


def _failed(job: Job, limits: Limits, error: Exception) -> Answer:
    """The answer to a job that raised. Out of memory is said as such: a MemoryError, or any error raised
    with the address space at its limit (an allocation that fails inside C code may surface as another
    error, SystemError "error return without exception set" among them)."""
    if isinstance(error, MemoryError) or _at_memory_limit(max(64 * 2**20, limits.memory // 4)):
        return problem_answer(503, "admin work out of memory", (
            f"the job needed more than {limits.memory / 2**20:,.0f} MiB (CLAIMBROKER_ADMIN_JOB_MEMORY) and was "
            "stopped: propose less (fewer nodes, tenants or quotas)"))
    log.error("admin job %s failed", getattr(job, "__name__", job), exc_info=error)
    return problem_answer(500, "Internal Server Error", "the server failed; see its log")


def _at_memory_limit(margin: int) -> bool:
    """Whether this process's address space is within `margin` of its limit (RLIMIT_AS, set by
    `_second_to_the_broker`): an allocation of a job that raised here most likely failed for want of it."""
    limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    if limit == resource.RLIM_INFINITY:
        return False
    try:
        with open("/proc/self/status") as status:
            size = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmPeak:"))
    except (OSError, ValueError, StopIteration):
        return False
    return size >= limit - margin


def _context() -> Any:
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)  # used when the fork server starts (the first job of the process)
    return context


def _busy(what: str, detail: str, retry_after: float, title: str = "admin work busy") -> Problem:
    """A 503 that says when to try again."""
    error = Problem(503, title, f"{what}: {detail}")
    error.headers = {"Retry-After": str(max(1, math.ceil(retry_after)))}
    return error


class AdminWorkers:
    """The admin API's heavy requests, each a job in a worker process; see the module's docstring.

    Usable from any event loop (an ASGI test client may run each request on its own): waiters are woken
    on their own loop, and nothing else here belongs to one."""

    def __init__(self, limits: Limits, reach: Reach) -> None:
        self.limits, self.reach = limits, reach
        self._active = 0  # jobs holding a slot (running, or about to)
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._deadlines: dict[int, float] = {}  # per running process: when it is stopped
        self._processes: dict[int, BaseProcess] = {}

    @property
    def running(self) -> int:
        """Jobs whose worker process runs now."""
        return len(self._processes)

    @property
    def waiting(self) -> int:
        """Requests waiting for a worker."""
        return sum(1 for turn in self._waiters if not turn.done())

    async def run(self, request: Request, what: str, job: Job, *args: Any) -> Response:
        """`job(reach, limits, *args)` in a worker, answered within the timeout; `what` names it in errors.
        A request whose client goes away (its body already read) stops its job and frees its place."""
        work = asyncio.ensure_future(self._run(what, job, args))
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not work.done():
                work.cancel()
        try:
            return await work
        except asyncio.CancelledError:
            if gone.cancelled() or not gone.done():
                raise  # this request itself is cancelled
            return Response(status_code=499)  # nobody reads it: the client left

    async def _run(self, what: str, job: Job, args: tuple[Any, ...]) -> Response:
        deadline = time.monotonic() + self.limits.timeout
        await self._acquire(what, deadline)
        try:
            return (await self._in_process(what, job, args, deadline)).response()
        finally:
            self._release()

    def _retry_after(self) -> float:
        return min(self._deadlines.values(), default=time.monotonic() + 1) - time.monotonic()

    async def _acquire(self, what: str, deadline: float) -> None:
        if self._active < self.limits.jobs and not self._waiters:
            self._active += 1
            return
        if len(self._waiters) >= self.limits.queue:
            raise _busy(what, f"{self._active} heavy admin request(s) run and {len(self._waiters)} wait, as many as "
                              f"CLAIMBROKER_ADMIN_JOBS ({self.limits.jobs}) and CLAIMBROKER_ADMIN_QUEUE "
                              f"({self.limits.queue}) allow; retry later", self._retry_after())
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(turn)
        try:
            await asyncio.wait_for(asyncio.shield(turn), max(0.0, deadline - time.monotonic()))
        except (TimeoutError, asyncio.CancelledError) as error:
            if turn.done() and not turn.cancelled():
                self._release()  # the slot was handed over as the wait ended: pass it on
            else:
                turn.cancel()
                with contextlib.suppress(ValueError):
                    self._waiters.remove(turn)
            if isinstance(error, TimeoutError):
                raise _busy(what, f"waited {self.limits.timeout:g}s (CLAIMBROKER_ADMIN_JOB_TIMEOUT) for another "
                                  "heavy admin request to finish; retry later", self._retry_after()) from None
            raise

    def _release(self) -> None:
        """The slot goes to the first waiter still waiting, else back to the pool."""
        while self._waiters:
            turn = self._waiters.popleft()
            if not turn.done():
                turn.get_loop().call_soon_threadsafe(self._hand_over, turn)
                return
        self._active -= 1

    def _hand_over(self, turn: asyncio.Future[None]) -> None:
        if turn.done():  # its request left between the release and now: the next one's turn
            self._release()
        else:
            turn.set_result(None)

    async def _in_process(self, what: str, job: Job, args: tuple[Any, ...], deadline: float) -> Answer:
        context = _context()
        answers, sender = context.Pipe(duplex=False)
        process = context.Process(target=_work, args=(sender, job, self.reach, self.limits, args), daemon=True,
                                  name=f"claimbroker-admin-{what}")
        try:
            # Off the loop: the first start waits for the fork server to load the broker's modules, and the
            # arguments (a request body) are pickled and written to it.
            await asyncio.to_thread(process.start)
        except asyncio.CancelledError:
            answers.close()  # a worker that starts all the same ends at once: nobody can read its answer
            raise
        except Exception as error:  # whatever stops the start (fork, the fork server, pickling the arguments)
            log.exception("cannot start a worker process for %s", what)
            answers.close()
            raise Problem(503, "admin work failed", f"{what}: cannot start a worker process "
                                                    f"({type(error).__name__}); see the server's log") from None
        finally:
            sender.close()
        pid = process.pid or 0
        self._processes[pid], self._deadlines[pid] = process, deadline
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[None] = loop.create_future()
        loop.add_reader(answers.fileno(), _settle, ready)
        try:
            try:
                await asyncio.wait_for(ready, max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                self._deadlines.pop(pid, None)
                raise _busy(what, f"did not finish within {self.limits.timeout:g}s (CLAIMBROKER_ADMIN_JOB_TIMEOUT) "
                                  "and was stopped; propose less (fewer nodes, tenants or quotas), or retry when the "
                                  "broker is less busy", self._retry_after(), "admin work timed out") from None
            finally:
                loop.remove_reader(answers.fileno())
            try:
                answer: Answer = await asyncio.to_thread(_receive, answers)
            except EOFError:
                await asyncio.to_thread(process.join, 5)
                log.error("admin job %s ended without an answer (exit status %s)", what, process.exitcode)
                raise Problem(503, "admin work failed", (
                    f"{what} stopped without an answer (exit status {process.exitcode}: out of memory?); "
                    "propose less, or see the server's log")) from None
            return answer
        finally:
            answers.close()
            if process.is_alive():
                process.kill()
            await asyncio.to_thread(process.join, 5)
            self._processes.pop(pid, None)
            self._deadlines.pop(pid, None)

    def close(self) -> None:
        """Stop every running job (the app is stopping; their requests are cancelled)."""
        for process in list(self._processes.values()):
            with contextlib.suppress(ValueError, OSError):
                process.kill()


async def _disconnected(request: Request) -> None:
    """Returns when the client has gone: once the body is read, the server's next message is a disconnect."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _receive(answers: Connection) -> Answer:
    """Off the loop: an answer may be tens of megabytes (a dry run of 100,000 tenants)."""
    answer: Answer = pickle.loads(answers.recv_bytes())
    return answer


def _settle(ready: asyncio.Future[None]) -> None:
    if not ready.done():
        ready.set_result(None)


def workers(request: Request) -> AdminWorkers:
    found: AdminWorkers = request.app.state.workers
    return found


class BodyLimit:
    """Every request's body at most `limit` bytes: 413 before any of it is read when Content-Length says
    more, or as soon as a streamed body passes it, so no handler parses (or holds) an oversized body."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit

    def _problem(self, size: int | None) -> Problem:
        said = f"{size:,} bytes" if size is not None else "more"
        return Problem(413, "request body too large", f"the body has {said}, over the limit of {self.limit:,} "
                                                      "bytes (CLAIMBROKER_ADMIN_MAX_BODY)")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.limit:
            refused = self._problem(int(declared))
            await problem(413, refused.title, refused.detail)(scope, receive, send)
            return
        received = 0

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    raise self._problem(None)  # inside the app: its handler answers the problem
            return message

        await self.app(scope, counted, send)
