"""Composition root: build and run the four services from settings, in one process or one each."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import logging
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from services.allocator import app as allocator_app
from services.allocator import estimates_app
from services.allocator.service import Allocator
from services.bus.authority import BusAuthority, Identity, Provisioner, admin_password, tenant_limits
from services.bus.cancel import wait_closed
from services.bus.connection import connect
from services.bus.embedded import EmbeddedNats
from services.bus.streams import ensure_streams, read_fleet
from services.notifier import app as notifier_app
from services.runtime.service_app import ServiceApp
from services.runtime.service_process import ChildArgs, ServiceProcess
from services.watcher import app as watcher_app
from shared.contract import bus_auth
from shared.dra.inventory import Fleet
from shared.ledger.bus_credentials import new_password
from shared.ledger.engine import create_engine, migrate
from shared.ledger.handles import AsyncEngine, LedgerError, masked_url
from shared.settings import AdminApiSettings, AllocatorSettings, BrokerSettings

log = logging.getLogger("claimbroker")


@dataclass
class Stack:
    nats_url: str
    db_url: str
    engine: AsyncEngine
    api_url: str | None = None
    allocator: Allocator | None = None
    tasks: dict[str, asyncio.Task[Any]] = field(default_factory=dict)
    embedded: EmbeddedNats | None = None
    authority: BusAuthority | None = None
    # with bus auth: the data folder's admin (what `up` and the CLI there use) and each service's own URL
    admin_url: str = ""
    service_urls: dict[str, str] = field(default_factory=dict)
    readiness: dict[str, Callable[[], str | None]] = field(default_factory=dict)  # per service: why not ready
    api_ready: asyncio.Event = field(default_factory=asyncio.Event)  # the admin API listens, at api_url
    # `up`: services in a process of their own (the allocator: then `allocator` is None here), by name
    processes: dict[str, ServiceProcess] = field(default_factory=dict)
    own_process: tuple[str, ...] = ()  # services run in a process of their own

    def __post_init__(self) -> None:
        self.admin_url = self.admin_url or self.nats_url  # no bus auth here: the server's own business

    def not_ready(self, name: str) -> str | None:
        task = self.tasks.get(name)
        if task is None or task.done():
            return f"{name} is not running"
        check = self.readiness.get(name)
        return check() if check is not None else None


class FatalServiceError(RuntimeError):
    """A service cannot run with these settings (its port is taken): restarting it would fail again."""


class StartRefused(RuntimeError):
    """What the broker needs before it starts is not there (a port taken, the ledger unreachable): one
    line that says what to change; nothing was started or created."""


def port_problem(host: str, port: int, what: str, option: str) -> str | None:
    """Why `what` could not listen on host:port (taken, or not an address of this host), else None. Bound
    as uvicorn and asyncio bind (SO_REUSEADDR), then closed: a check, which a process taking the port after
    it can still beat (the service then fails with FatalServiceError)."""
    import socket

    if port == 0:
        return None  # any free port
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as error:
        return f"{what} cannot listen on {host}:{port}: {error.strerror or error}; pass another host or {option}"
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as error:
            why = "the port is in use" if error.errno == errno.EADDRINUSE else (error.strerror or str(error))
            return f"{what} cannot listen on {host}:{port} ({why}): pass {option} with a free port (0: any)"
    return None


def preflight(settings: BrokerSettings, services: tuple[str, ...]) -> None:
    """Raise StartRefused when a port a service needs is taken; checked before anything is started or
    written (the data folder, the ledger, an admin token)."""
    checks = []
    if "admin-api" in services:
        checks.append((settings.api_host, settings.api_port, "the admin API", "--api-port"))
    if settings.health_port is not None:
        checks.append((settings.health_host, settings.health_port, "the health endpoint", "CLAIMBROKER_HEALTH_PORT"))
    for host, port, what, option in checks:
        problem = port_problem(host, port, what, option)
        if problem is not None:
            raise StartRefused(problem)


class LedgerUnreachable(StartRefused):
    """The ledger does not answer at start: the broker cannot run without it."""


async def _migrate_or_refuse(db_url: str) -> None:
    """The ledger migrated; unreachable, it is one line with the password hidden (exit 3 in `up`)."""
    try:
        await migrate(db_url)
    except (OSError, LedgerError) as error:
        shown = masked_url(db_url)
        why = " ".join(str(getattr(error, "orig", None) or error).split()) or type(error).__name__
        raise LedgerUnreachable(f"cannot reach the ledger at {shown}: {why}") from None


@dataclass(frozen=True)
class RestartPolicy:
    """How `supervise` restarts a service that ended on its own: after a wait that doubles from `first_wait`
    to `most_wait`, at most `most_restarts` times within `window` seconds (more is a fault no restart
    mends: the broker stops)."""

    first_wait: float = 1.0
    most_wait: float = 30.0
    most_restarts: int = 5
    window: float = 300.0


async def supervise(stack: Stack, settings: BrokerSettings, stop: asyncio.Event,
                    policy: RestartPolicy = RestartPolicy()) -> bool:
    """Run until `stop` is set (True) or a service fails for good (False): a service that ends on its own is
    started again per `policy`, with its failure logged; a FatalServiceError ends the broker at once."""
    loop = asyncio.get_running_loop()
    restarts: dict[str, list[float]] = {}
    waiter = asyncio.create_task(stop.wait())
    try:
        while True:
            done, _ = await asyncio.wait([waiter, *stack.tasks.values()], return_when=asyncio.FIRST_COMPLETED)
            if waiter in done:
                return True
            for task in done:
                name = task.get_name()
                failure = task.exception() if not task.cancelled() else None
                what = f"failed: {failure!r}" if failure else "ended"
                recent = [t for t in restarts.get(name, []) if loop.time() - t < policy.window]
                if isinstance(failure, FatalServiceError) or len(recent) >= policy.most_restarts:
                    log.error("service %s %s; stopping the broker", name, what)
                    return False
                wait = min(policy.most_wait, policy.first_wait * 2 ** len(recent))
                log.error("service %s %s; restarting it in %.0fs", name, what, wait, exc_info=failure)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(waiter), wait)
                if waiter.done():
                    return True
                restarts[name] = [*recent, loop.time()]
                await start_service(stack, name, settings)
    finally:
        waiter.cancel()


def _url(stack: Stack, name: str) -> str:
    """The service's bus URL, with its own identity (start estimates are the allocator's: they publish its
    statuses)."""
    return stack.service_urls.get("allocator" if name == "estimator" else name, stack.nats_url)


def _allocator_settings(name: str, settings: BrokerSettings) -> AllocatorSettings:
    """The allocator's settings for the allocator or for start estimates: the allocator runs no estimates of
    its own (they are the estimator's, a service beside it: ESTIMATOR_SERVICE)."""
    if name == "allocator":
        return dataclasses.replace(settings.allocator, estimate_interval=0.0)
    return settings.allocator


def estimates_on(settings: BrokerSettings) -> bool:
    return settings.allocator.estimate_interval > 0


def _app(stack: Stack, name: str, settings: BrokerSettings) -> ServiceApp:
    """The service's app, from its app factory."""
    url = _url(stack, name)
    if name == "watcher":
        return watcher_app.create_app(settings.watcher, url)
    if name == "allocator":
        return allocator_app.create_app(_allocator_settings(name, settings), stack.engine, url)
    if name == ESTIMATOR_SERVICE:
        return estimates_app.create_app(settings.allocator, stack.engine, url)
    if name == "notifier":
        return notifier_app.create_app(settings.notifier, stack.engine, url)
    raise ValueError(f"unknown service {name!r}")


async def start_service(stack: Stack, name: str, settings: BrokerSettings) -> None:
    """Start one service as a task of this process: a FastStream app on its own connection, the admin
    API's ASGI app, or (the allocator, where `stack.own_process` names it) a task that runs and watches the
    service's own process."""
    if name == "admin-api":
        runner: Coroutine[Any, Any, None] = _serve_api(stack, settings.admin_api)
    elif name in stack.own_process:
        process = stack.processes[name] = ServiceProcess(ChildArgs(
            name, _allocator_settings(name, settings), _url(stack, name), stack.db_url, settings.log_format))
        stack.readiness[name] = process.not_ready
        runner = process.run()
    else:
        app = _app(stack, name, settings)
        if isinstance(app.service, Allocator):
            stack.allocator = app.service
        stack.readiness[name] = app.not_ready
        runner = app.run()
    stack.tasks[name] = asyncio.create_task(runner, name=name)


async def _serve_api(stack: Stack, settings: AdminApiSettings) -> None:
    import uvicorn

    from services.admin_api.app import create_app
    from services.admin_api.live import LiveFeed
    from services.admin_api.offload import Limits
    from services.bus.fleet_view import FleetView

    apply = stack.authority.apply if stack.authority is not None else None

    bus_url = stack.service_urls.get("admin-api", stack.admin_url)  # its own identity: it only reads the bus

    # the allocator in its own process (`up`): the bus's fleet, followed in this process
    view = FleetView(lambda: connect(bus_url, name="claimbroker-admin-api-fleet", tls_ca=settings.tls_ca)) \
        if stack.own_process else None

    async def fleet() -> Fleet:
        """The allocator's when it runs in this process, else every node's last inventory on the bus."""
        if stack.allocator is not None:
            return stack.allocator.fleet
        if view is not None:
            return await view.current()
        return await read_fleet(bus_url, settings.tls_ca)

    def last_heard() -> dict[str, float] | None:
        """The allocator's fleet keeps a node as its content was last read (a heartbeat changes nothing in
        it): when each node was last heard is the allocator's own record. None: the bus's fleet has it."""
        return stack.allocator.last_heard() if stack.allocator is not None else None

    live = LiveFeed(lambda: connect(bus_url, name="claimbroker-admin-api-live", tls_ca=settings.tls_ca))
    # heavy requests' workers read the ledger and the bus themselves, beside the allocator's loop
    app = create_app(stack.engine, apply, fleet, settings.pending_alert_after, settings.inventory_ttl, live,
                     Limits.of(settings), bus_url, settings.tls_ca, last_heard)
    config = uvicorn.Config(app, host=settings.api_host, port=settings.api_port,
                            log_level="warning", lifespan="on", timeout_graceful_shutdown=5,
                            log_config=None,  # its lines go through the broker's handler: masked, JSON if asked
                            ssl_certfile=str(settings.api_tls_cert) if settings.api_tls_cert else None,
                            ssl_keyfile=str(settings.api_tls_key) if settings.api_tls_key else None)
    server = uvicorn.Server(config)

    async def serve() -> None:
        try:
            await server.serve()
        except SystemExit as stop:  # uvicorn exits the process when it cannot listen: fail this service instead
            raise FatalServiceError(f"the admin API cannot listen on {settings.api_host}:{settings.api_port} "
                                    f"(is the port in use? uvicorn exited with {stop.code})") from None

    serving = asyncio.create_task(serve())
    while not server.started and not serving.done():  # then the port it listens on, also when asked for 0
        await asyncio.sleep(0.01)
    if server.started:
        port = server.servers[0].sockets[0].getsockname()[1]
        scheme = "https" if settings.api_tls_cert is not None else "http"
        stack.api_url = f"{scheme}://{settings.api_host}:{port}"
        stack.api_ready.set()
    try:
        await asyncio.shield(serving)
    except asyncio.CancelledError:
        await live.close()  # open event streams end first: uvicorn waits for every response to finish
        server.should_exit = True  # a clean uvicorn shutdown instead of a cancelled lifespan
        await serving
        raise
    finally:
        await live.close()
        if view is not None:
            await view.close()


SERVICES = ("watcher", "allocator", "notifier", "admin-api")
# Start estimates, a service beside the allocator: `up` runs it (in a process of its own) when
# CLAIMBROKER_ESTIMATE_INTERVAL is above 0, `serve estimator` alone; stacks run in one process (demo, tests)
# only when named, their allocator then running none of its own.
ESTIMATOR_SERVICE = "estimator"


def _start_embedded(embedded: EmbeddedNats, last_url: Path) -> str:
    """On the port of its last run where that is free (the URLs handed to tenants keep working across
    restarts), else on one the server picks. On this thread, the loop's (it blocks it for the server's
    start, before any service runs): the server dies with the thread that started it."""
    with contextlib.suppress(ValueError, OSError):
        embedded.port = urlsplit(last_url.read_text().strip()).port or -1
    try:
        return embedded.start()
    except RuntimeError:
        if embedded.port == -1:
            raise
        log.warning("NATS port %d of the last run is taken; the server picks another", embedded.port)
        embedded.port = -1
        return embedded.start()


@contextlib.asynccontextmanager
async def running_stack(
    settings: BrokerSettings, *, services: tuple[str, ...] = SERVICES, own_process: tuple[str, ...] = ()
) -> AsyncIterator[Stack]:
    """Embedded NATS and SQLite unless settings name external ones; migrations run first. The embedded
    server asks every client for a credential unless settings say `insecure`: the services and the data
    folder's admin get identities of their own, tenants theirs from the ledger (services/bus/authority.py).
    `own_process`: services run in a process of their own (`up`: the allocator), the others as tasks here."""
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    bus = settings.bus
    db_url = settings.database_url()
    await _migrate_or_refuse(db_url)
    engine = create_engine(db_url)
    embedded = authority = None
    identities: dict[str, Identity] = {}
    nats_url = bus.nats_url
    if not nats_url:
        embedded = EmbeddedNats(Path(settings.data_dir) / "nats", sync=bus.nats_sync,
                                tls_cert=bus.nats_tls_cert, tls_key=bus.nats_tls_key)
        if not bus.insecure:
            identities = {name: Identity(bus_auth.service_user(name), new_password(), "service")
                          for name in bus_auth.SERVICES}
            identities["admin"] = Identity(bus_auth.admin_user(), admin_password(settings.data_dir), "admin")
            own = await asyncio.to_thread(lambda: [identity.bus_user() for identity in identities.values()])
            authority = BusAuthority(engine, own, embedded.reload_accounts, bus.bus_auth_poll_interval,
                                     tenant_limits(bus))
            embedded.accounts = authority.applied = await authority.render()
        nats_url = _start_embedded(embedded, settings.data_dir / "nats.url")
    urls = {name: bus_auth.url_with_user(nats_url, i.user, i.password) for name, i in identities.items()}
    if authority is not None:  # tenant accounts' status streams, as the bus admin, once the server runs
        authority.provisioner = Provisioner(urls["admin"], authority.limits, bus.tls_ca)
    stack = Stack(nats_url=nats_url, db_url=db_url, engine=engine, embedded=embedded, authority=authority,
                  admin_url=urls.pop("admin", nats_url), service_urls=urls, own_process=own_process)
    nc = await connect(stack.admin_url, name="claimbroker-setup", tls_ca=bus.tls_ca)
    await ensure_streams(nc.jetstream(), bus.stream_replicas, bus.tenant_backlog)
    await nc.close()
    try:
        if authority is not None:
            stack.tasks["bus-auth"] = asyncio.create_task(authority.run(), name="bus-auth")
        for name in services:
            await start_service(stack, name, settings)
        if "admin-api" in services:  # its URL once it listens (the port it got, when asked for 0)
            waiting = asyncio.create_task(stack.api_ready.wait())
            await asyncio.wait([waiting, stack.tasks["admin-api"]], timeout=30, return_when=asyncio.FIRST_COMPLETED)
            waiting.cancel()
        yield stack
    finally:
        allocating = stack.tasks.get("allocator")
        if stack.allocator is not None and allocating is not None and not allocating.done():
            stack.allocator.stop()  # let it finish its transaction rather than cut it
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(allocating), 5)
        for task in list(stack.tasks.values())[::-1]:
            await wait_closed(task)
        await engine.dispose()
        if embedded is not None:
            await asyncio.to_thread(embedded.stop)
