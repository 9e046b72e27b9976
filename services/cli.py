"""The `claimbroker` command line (see the contract): run the broker, talk to it, simulate offline."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import secrets
import signal
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
import yaml
from rich.console import Console
from rich.table import Table

from services.runtime import tune_gc
from shared.contract import subjects
from shared.dra import model as dra
from shared.settings import BrokerSettings

T = TypeVar("T")

app = typer.Typer(help="claim-broker: an event-driven GPU claim broker with DRA-exact allocation.",
                  no_args_is_help=True, add_completion=False)
token_app = typer.Typer(help="API tokens.", no_args_is_help=True)
app.add_typer(token_app, name="token")
console = Console(width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True, soft_wrap=True, highlight=False)
log = logging.getLogger("claimbroker")


class Globals:
    nats: str | None = None
    api: str | None = None
    token: str | None = None
    data_dir: Path | None = None


G = Globals()


@app.callback()
def _global(
    nats: Annotated[str | None, typer.Option(envvar="CLAIMBROKER_NATS", help="NATS URL")] = None,
    api: Annotated[str | None, typer.Option(envvar="CLAIMBROKER_API", help="admin API URL")] = None,
    token: Annotated[str | None, typer.Option(envvar="CLAIMBROKER_TOKEN", help="API bearer token")] = None,
    data_dir: Annotated[Path | None, typer.Option(envvar="CLAIMBROKER_DATA_DIR", help="data folder")] = None,
) -> None:
    G.nats, G.api, G.token, G.data_dir = nats, api, token, data_dir


def _settings(**overrides: Any) -> BrokerSettings:
    """Options over CLAIMBROKER_* variables, validated (so "5m" becomes 300 seconds)."""
    values = {k: v for k, v in overrides.items() if v is not None}
    if G.data_dir is not None:
        values.setdefault("data_dir", G.data_dir)
    if G.nats:
        values.setdefault("nats_url", G.nats)
    return BrokerSettings(**values)


def _output_format(value: str) -> str:
    if value not in ("table", "json", "yaml"):
        raise typer.BadParameter(f"must be table, json or yaml, not {value!r}")
    return value


Output = Annotated[str, typer.Option("--output", "-o", help="table | json | yaml", callback=_output_format)]


def _emit(data: Any, output: str) -> bool:
    """Print `data` as JSON or YAML when asked (True); False: the caller prints its table."""
    if output == "json":
        print(json.dumps(data, indent=2))
    elif output == "yaml":
        print(yaml.safe_dump(data, sort_keys=False), end="")
    return output != "table"


class Refused(Exception):
    """A server refused who we are (a revoked or wrong credential): one line, exit 1, like a 4xx."""


class Unreachable(Exception):
    """A server the command needs cannot be reached or does not hold the broker: one line, exit 3."""


NATS_TIMEOUT_S = 5.0  # a command gives up on NATS after this long, never hangs


def _nats_url(settings: BrokerSettings) -> str:
    """--nats (or CLAIMBROKER_NATS), else the URL `up` wrote in the data folder; never a guess."""
    if settings.nats_url:
        return settings.nats_url
    url_file = settings.data_dir / "nats.url"
    if url_file.exists():  # `up`'s server: its bus admin's credential, kept beside it, goes with it
        from services.bus_authority import ADMIN_PASSWORD_FILE
        from shared.contract import bus_auth

        url = url_file.read_text().strip()
        password = settings.data_dir / ADMIN_PASSWORD_FILE
        if password.exists() and bus_auth.user_of(url) is None:
            url = bus_auth.url_with_user(url, bus_auth.admin_user(), password.read_text().strip())
        return url
    err.print(f"no NATS URL: pass --nats URL (or CLAIMBROKER_NATS), or run where `claimbroker up` keeps its data "
              f"({url_file} does not exist)")
    raise typer.Exit(2)


async def _connect(url: str) -> Any:
    """The CLI's connection: bounded and quiet. nats-py retries a refused first connection for good,
    whatever its reconnect options, reporting each try to `error_cb`: the first report ends it here, with
    one line instead of a hang."""
    import nats

    loop = asyncio.get_running_loop()
    failed: asyncio.Future[BaseException] = loop.create_future()

    async def first_failure(error: Exception) -> None:
        if not failed.done():
            failed.set_result(error)

    from services.natsio import tls_context
    from shared.contract import bus_auth

    connecting: asyncio.Future[Any] = asyncio.ensure_future(nats.connect(
        url, name="claimbroker-cli", connect_timeout=2, allow_reconnect=False, error_cb=first_failure,
        tls=tls_context(_settings().tls_ca), **bus_auth.client_options(url)))
    futures: set[asyncio.Future[Any]] = {connecting, failed}
    await asyncio.wait(futures, timeout=NATS_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED)
    if connecting.done() and connecting.exception() is None:
        return connecting.result()
    connecting.cancel()
    await asyncio.wait({connecting})
    error = failed.result() if failed.done() else None
    if error is None and not connecting.cancelled():
        error = connecting.exception()
    why = _why(error) if error is not None else f"no answer within {NATS_TIMEOUT_S:g}s"
    if error is not None and "authorization violation" in str(error).lower():
        raise Refused(f"NATS at {bus_auth.redact(url)}: {why}")
    raise Unreachable(f"cannot reach NATS at {bus_auth.redact(url)}: {why}")


def _why(error: BaseException) -> str:
    text = str(error).strip() or type(error).__name__
    if "authorization violation" in text.lower():
        return ("the server refused the credential (a bus credential from `claimbroker credentials create`, "
                "as --nats nats://USER:PASSWORD@HOST:PORT)")
    return text if "no servers" not in text.lower() else "nothing answered there"


def _no_streams(shown_url: str) -> Unreachable:
    return Unreachable(f"NATS at {shown_url} has no claim-broker streams: is the broker running against it?")


BACKLOG_WAIT_S = 60.0  # how long a publish waits on a full tenant backlog for the broker to take some


async def _publish(js: Any, url: str, subject: str, payload: Any, message_id: str) -> None:
    """Publish to the broker's stream; only `up`, `serve` and `migrate` create what the broker needs. A
    tenant's backlog on the bus is bounded (settings.tenant_backlog): past it, wait for the broker."""
    from nats.js.errors import APIError, NoStreamResponseError

    from services.natsio import BACKLOG_FULL_CODE, publish_json
    from shared.contract import bus_auth

    shown = bus_auth.redact(url)
    deadline, pause = time.monotonic() + BACKLOG_WAIT_S, 0.02
    while True:
        try:
            await asyncio.wait_for(publish_json(js, subject, payload, msg_id=message_id), NATS_TIMEOUT_S)
            return
        except NoStreamResponseError:
            raise _no_streams(shown) from None
        except TimeoutError:
            raise Unreachable(f"NATS at {shown} did not acknowledge {subject} within {NATS_TIMEOUT_S:g}s "
                              f"(may this credential publish there?)") from None
        except APIError as error:
            if error.err_code != BACKLOG_FULL_CODE:
                raise
            if time.monotonic() > deadline:
                raise Unreachable(f"the bus still holds as many of {subject}'s messages as a tenant may after "
                                  f"{BACKLOG_WAIT_S:g}s: is the allocator running?") from None
            if pause == 0.64:  # said once a wait is long enough to notice
                err.print(f"{subject}: the tenant's backlog on the bus is full; waiting for the broker to take some")
            await asyncio.sleep(pause)
            pause = min(1.28, pause * 2)


def _logging(verbose: bool, log_format: str = "text") -> None:
    from services.logs import configure

    configure(verbose, log_format)


LogFormat = Annotated[str | None, typer.Option(
    "--log-format", help="text, or json: one object a line and a line per decision batch")]


@app.command()
def up(
    inventory: Annotated[list[Path] | None, typer.Option("--inventory", help="inventory file")] = None,
    kube: Annotated[bool, typer.Option(help="take the fleet from the Kubernetes cluster only")] = False,
    kubeconfig: Annotated[Path | None, typer.Option(help="kubeconfig for --kube (default: in-cluster)")] = None,
    db: Annotated[str | None, typer.Option(help="ledger URL (default: SQLite in the data folder)")] = None,
    nats: Annotated[str | None, typer.Option(help="external NATS URL (default: embedded)")] = None,
    api_port: Annotated[int | None, typer.Option(help="admin API port")] = None,
    pending_alert_after: Annotated[str | None, typer.Option(help="alert after a claim waits this long")] = None,
    webhook: Annotated[list[str] | None, typer.Option(
        "--webhook", help="post alerts to this URL as JSON (repeatable); `slack:URL` posts Slack messages")] = None,
    stream_replicas: Annotated[int | None, typer.Option(help="servers of a NATS cluster keeping each stream")] = None,
    log_format: LogFormat = None,
    insecure: Annotated[bool, typer.Option(
        help="an open bus: the embedded NATS server asks no credential (labs only)")] = False,
) -> None:
    """Run watcher, allocator, notifier and admin API until Ctrl-C."""
    from shared.settings import Webhook

    tune_gc()
    settings = _settings(inventory=inventory or None, kube=kube or None, kubeconfig=kubeconfig, db=db,
                         nats_url=nats, api_port=api_port, stream_replicas=stream_replicas, insecure=insecure or None,
                         pending_alert_after=pending_alert_after, log_format=log_format,
                         webhooks=[Webhook.parse(url) for url in webhook] if webhook else None)
    _logging(True, settings.log_format)
    if not asyncio.run(_up(settings)):
        raise typer.Exit(1)  # a service ended on its own: everything it started is stopped


async def _up(settings: BrokerSettings) -> bool:
    """Whether it stopped because it was told to (False: a service failed for good; see supervise)."""
    from services.natsio import wait_closed
    from services.stack import running_stack, supervise
    from shared.ledger.engine import sessions
    from shared.ledger.tokens import create_token

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with running_stack(settings) as stack:
        (settings.data_dir / "nats.url").write_text(stack.nats_url)  # where the other commands find it
        if stack.api_url:
            (settings.data_dir / "api.url").write_text(stack.api_url)
        token_file = settings.data_dir / "admin.token"
        if not token_file.exists():
            token = await create_token(sessions(stack.engine), "admin", None, actor="up")
            token_file.write_text(token)
            token_file.chmod(0o600)
            console.print(f"admin token (shown once, kept in {token_file}): {token}")
        console.print(f"NATS      {stack.nats_url}")
        if stack.authority is not None:
            console.print("          credentials required: a tenant's from `claimbroker credentials create "
                          f"--tenant T`, as nats://USER:PASSWORD@{stack.nats_url.split('://', 1)[-1]}; the CLI run "
                          "here uses this folder's bus admin")
        elif stack.embedded is not None:
            log.warning("the bus is open (--insecure): anyone who reaches %s may submit, release and read any "
                        "tenant's claims, and delete the streams", stack.nats_url)
            console.print("          [bold red]OPEN BUS (--insecure): no credential asked; anyone who reaches it "
                          "acts as any tenant[/bold red]")
        console.print(f"admin API {stack.api_url}")
        console.print(f"ledger    {stack.db_url}")
        health = None
        if settings.health_port is not None:  # /healthz, /readyz (every service ready) and /metrics
            from services.health import serve_health

            def not_ready() -> str | None:
                return next((why for name in stack.tasks if (why := stack.not_ready(name))), None)

            health = asyncio.create_task(serve_health(settings.health_host, settings.health_port, not_ready))
            console.print(f"health    http://{settings.health_host}:{settings.health_port} (/healthz /readyz /metrics)")
        try:
            told = await supervise(stack, settings, stop)
        finally:
            if health is not None:
                await wait_closed(health)
    console.print("stopped")
    return told


def _serve_bus_auth(settings: BrokerSettings) -> None:
    """Beside an external nats-server: keep the file its config includes equal to the ledger's credentials
    and the services' own users, and reload the server on each change, until SIGTERM."""
    from services.bus_authority import BusAuthority, FileTarget, own_identities
    from shared.contract import bus_auth
    from shared.ledger.engine import create_engine

    if settings.bus_auth_file is None or not settings.bus_passwords:
        err.print("serve bus-auth needs CLAIMBROKER_BUS_AUTH_FILE and CLAIMBROKER_BUS_PASSWORDS")
        raise typer.Exit(2)
    target = FileTarget(settings.bus_auth_file, settings.nats_pid_file)
    own = own_identities(settings.bus_passwords)

    async def main() -> None:
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            asyncio.get_running_loop().add_signal_handler(sig, stop.set)
        if not settings.bus_auth_file or not settings.bus_auth_file.exists():
            target(bus_auth.render_authorization(own))  # the server can start before the ledger answers
        engine = create_engine(settings.database_url())
        authority = BusAuthority(engine, own, target, settings.bus_auth_poll_interval)
        try:
            while not stop.is_set():
                try:
                    await authority.apply()
                    break
                except Exception as error:  # the ledger not there yet (not migrated, not up): keep trying
                    log.warning("bus-auth: cannot read the ledger yet: %s", error)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), 2.0)
            follower = asyncio.create_task(authority.run())
            await stop.wait()
            follower.cancel()
        finally:
            await engine.dispose()

    asyncio.run(main())


@app.command()
def serve(
    service: Annotated[str, typer.Argument(help="watcher | allocator | notifier | admin-api | bus-auth")],
    inventory: Annotated[list[Path] | None, typer.Option("--inventory")] = None,
    db: Annotated[str | None, typer.Option()] = None,
    nats: Annotated[str | None, typer.Option()] = None,
    kube: Annotated[bool, typer.Option(help="watcher: the fleet from the Kubernetes cluster")] = False,
    kubeconfig: Annotated[Path | None, typer.Option(help="watcher: kubeconfig (default: in-cluster)")] = None,
    nvml: Annotated[bool, typer.Option(help="watcher: this host's GPUs, read with NVML")] = False,
    stream_replicas: Annotated[int | None, typer.Option(help="servers of a NATS cluster keeping each stream")] = None,
    log_format: LogFormat = None,
) -> None:
    """Run one service against external NATS and database (compose, Kubernetes)."""
    tune_gc()
    settings = _settings(inventory=inventory or None, db=db, nats_url=nats, kube=kube or None,
                         kubeconfig=kubeconfig, nvml=nvml or None, stream_replicas=stream_replicas,
                         log_format=log_format)
    _logging(True, settings.log_format)
    if service == "bus-auth":
        _serve_bus_auth(settings)
        return
    if not settings.nats_url:
        err.print("serve needs --nats or CLAIMBROKER_NATS_URL")
        raise typer.Exit(2)
    if service == "watcher" and settings.kube and settings.nvml:
        err.print("serve watcher takes one source: --kube (the cluster) or --nvml (this host), not both")
        raise typer.Exit(2)
    if service == "watcher" and not (settings.kube or settings.nvml or settings.inventory):
        err.print("serve watcher needs --kube, --nvml or --inventory FILE "
                  "(a deployed watcher never publishes the demo fleet)")
        raise typer.Exit(2)

    from shared.ledger.engine import LedgerNotReady, require_sqlite_file

    try:
        require_sqlite_file(settings.database_url())
    except LedgerNotReady as error:
        err.print(f"claimbroker: {error}")
        raise typer.Exit(3) from None

    async def main() -> bool:
        from services.natsio import connect, ensure_streams, wait_closed
        from services.stack import Stack, start_service
        from shared.ledger.engine import create_engine

        engine = create_engine(settings.database_url())
        stack = Stack(nats_url=settings.nats_url or "", db_url=settings.database_url(), engine=engine)
        setup = await connect(stack.nats_url, name=f"claimbroker-{service}-setup", tls_ca=settings.tls_ca)
        try:
            # as many replicas, and as deep a tenant's backlog, as configured
            await ensure_streams(setup.jetstream(), settings.stream_replicas, settings.tenant_backlog)
        finally:
            await setup.close()
        await start_service(stack, service, settings)
        health = None
        if settings.health_port is not None:
            from services.health import serve_health

            health = asyncio.create_task(serve_health(settings.health_host, settings.health_port,
                                                      lambda: stack.not_ready(service)))
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        task = stack.tasks[service]
        waiter = asyncio.create_task(stop.wait())
        await asyncio.wait([task, waiter], return_when=asyncio.FIRST_COMPLETED)
        told = waiter.done()
        if not told:
            failure = task.exception() if not task.cancelled() else None
            logging.getLogger("claimbroker").error("service %s %s", service,
                                                   f"failed: {failure!r}" if failure else "ended", exc_info=failure)
        await wait_closed(task)
        if health is not None:
            await wait_closed(health)
        await engine.dispose()
        return told

    if not asyncio.run(main()):
        raise typer.Exit(1)  # it ended without being told to: a supervisor restarts it


@app.command()
def migrate(db: Annotated[str | None, typer.Option()] = None) -> None:
    """Bring the ledger schema to the newest revision."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import DBAPIError

    from shared.ledger.engine import migrate as run_migrations

    settings = _settings(db=db)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    shown = make_url(settings.database_url()).render_as_string(hide_password=True)
    try:
        asyncio.run(run_migrations(settings.database_url()))
    except (OSError, DBAPIError) as error:
        raise Unreachable(f"cannot reach the ledger at {shown}: {_why(error)}") from None
    console.print(f"ledger at head: {shown}")


def _claim_documents(path: Path, tenant: str | None) -> list[dict[str, Any]]:
    try:
        documents = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    except (OSError, yaml.YAMLError) as error:
        err.print(f"{path}: cannot read claims: {error}")
        raise typer.Exit(1) from None
    out = []
    for document in documents:
        if not isinstance(document, dict) or document.get("kind") != "ResourceClaim":
            err.print(f"{path}: skipping a document that is not a ResourceClaim")
            continue
        metadata = dict(document.get("metadata") or {})
        if tenant and metadata.get("namespace") and metadata["namespace"] != tenant:
            err.print(f"{path}: claim {metadata.get('name')!r} is in namespace {metadata['namespace']!r}, not --tenant "
                      f"{tenant!r}: nothing was submitted (drop --tenant, or the claim's namespace)")
            raise typer.Exit(2)  # as kubectl -n refuses an object of another namespace
        metadata["namespace"] = metadata.get("namespace") or tenant or "default"
        out.append({**document, "metadata": metadata})
    return out


async def _publish_claims(url: str, claims: list[dict[str, Any]], priority: int | None) -> list[tuple[str, str]]:
    for document in claims:
        _own_tenant_only(url, str(document["metadata"]["namespace"]))
    nc = await _connect(url)
    # Ids unique to this invocation: a retry inside it is deduplicated, a later `submit` of the same file is
    # a new submission (the broker ignores it while the claim waits or runs, and takes it once it ended).
    run = uuid.uuid4().hex[:12]
    try:
        js = nc.jetstream()
        sent = []
        for document in claims:
            if priority is not None:
                metadata = document["metadata"]
                metadata["annotations"] = {**(metadata.get("annotations") or {}),
                                           "claimbroker.io/priority": str(priority)}
            tenant, name = document["metadata"]["namespace"], str(document["metadata"].get("name", ""))
            digest = hashlib.sha256(json.dumps(document, sort_keys=True).encode()).hexdigest()[:16]
            await _publish(js, url, subjects.submit(tenant), document, f"submit:{tenant}:{name}:{digest}:{run}")
            sent.append((tenant, name))
        return sent
    finally:
        await nc.close()


async def read_statuses(url: str, tenant: str = "*", name: str = "*") -> list[dict[str, Any]]:
    """The newest status of every matching claim, from the status stream, through a consumer of this
    reader's own: the one way to read statuses that a tenant's bus credential allows (bus_auth)."""
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

    from shared.contract import bus_auth

    own = bus_auth.tenant_of_user(bus_auth.user_of(url) or "")
    if own is not None and tenant == "*":
        tenant = own
    _own_tenant_only(url, tenant)
    shown = bus_auth.redact(url)
    nc = await _connect(url)
    try:
        latest: dict[str, dict[str, Any]] = {}
        done = asyncio.Event()

        async def on_message(message: Any) -> None:
            latest[message.subject] = json.loads(message.data)
            if message.metadata.num_pending == 0:
                done.set()

        deliver = nc.new_inbox()
        sub = await nc.subscribe(deliver, cb=on_message)
        try:
            consumer = f"cli-{secrets.token_hex(8)}"
            wanted = bus_auth.status_filter(tenant, name if name != "*" else ">")
            config = ConsumerConfig(name=consumer, deliver_subject=deliver, filter_subject=wanted,
                                    deliver_policy=DeliverPolicy.LAST_PER_SUBJECT, ack_policy=AckPolicy.NONE,
                                    inactive_threshold=5.0, mem_storage=True)  # gone 5 s after this read
            try:
                reply = await nc.request(
                    bus_auth.consumer_create_subject(subjects.STATUS_STREAM, consumer, wanted),
                    json.dumps({"stream_name": subjects.STATUS_STREAM, "config": config.as_dict()}).encode(),
                    timeout=NATS_TIMEOUT_S)
            except TimeoutError:
                raise Unreachable(f"NATS at {shown} did not answer within {NATS_TIMEOUT_S:g}s (may this "
                                  f"credential read {wanted}?)") from None
            created = json.loads(reply.data)
            if "error" in created:
                if created["error"].get("err_code") == 10059:  # stream not found
                    raise _no_streams(shown)
                raise Unreachable(f"NATS at {shown}: {created['error'].get('description')}")
            if created["num_pending"] == 0 and created["delivered"]["consumer_seq"] == 0:
                return []
            await asyncio.wait_for(done.wait(), 10)
        finally:
            await sub.unsubscribe()
        return sorted(latest.values(), key=lambda s: (s["namespace"], s["name"]))
    finally:
        await nc.close()


def _own_tenant_only(url: str, tenant: str) -> None:
    """A tenant's bus credential reaches only its tenant: said here in one line, before the server refuses
    it without a word (a publish it forbids is dropped)."""
    from shared.contract import bus_auth

    own = bus_auth.tenant_of_user(bus_auth.user_of(url) or "")
    if own is not None and tenant != own:
        err.print(f"claimbroker: this bus credential is tenant {own}'s: it cannot reach tenant {tenant}'s claims")
        raise typer.Exit(1)


def _status_table(statuses: list[dict[str, Any]]) -> Table:
    table = Table(show_lines=False)
    for column in ("TENANT", "CLAIM", "STATE", "NODE", "DEVICES", "REASON"):
        table.add_column(column, overflow="fold")
    for s in statuses:
        allocation = s.get("allocation") or {}
        devices = ", ".join(r["device"] for r in (allocation.get("devices") or {}).get("results", []))
        table.add_row(s["namespace"], s["name"], s["state"], allocation.get("nodeName", ""), devices,
                      s.get("reason") or "")
    return table


@app.command()
def submit(
    file: Annotated[Path, typer.Argument(help="YAML with one or more ResourceClaims")],
    tenant: Annotated[str | None, typer.Option(help="tenant for claims without a namespace")] = None,
    priority: Annotated[int | None, typer.Option(help="set claimbroker.io/priority")] = None,
    wait: Annotated[float | None, typer.Option(help="wait this many seconds for each status")] = None,
) -> None:
    """Publish each ResourceClaim in FILE to the queue."""
    settings = _settings()
    url = _nats_url(settings)
    claims = _claim_documents(file, tenant)
    before: dict[tuple[str, str], dict[str, Any]] = {}  # with --wait: each claim's status before this submit
    if wait is not None:
        for tenant_name in sorted({str(c["metadata"]["namespace"]) for c in claims}):
            before.update({(s["namespace"], s["name"]): s for s in asyncio.run(read_statuses(url, tenant_name))})
    sent = asyncio.run(_publish_claims(url, claims, priority))
    for tenant_name, name in sent:
        if wait is None:
            console.print(f"submitted {tenant_name}/{name}")
    if wait is None:
        return

    async def wait_all() -> list[dict[str, Any]]:
        deadline = time.monotonic() + wait
        found: dict[tuple[str, str], dict[str, Any]] = {}
        while time.monotonic() < deadline and len(found) < len(sent):
            for t in sorted({t for t, n in sent if (t, n) not in found}):  # one read a tenant, not a claim
                latest = {(s["namespace"], s["name"]): s for s in await read_statuses(url, t)}
                for key in sent:
                    if key not in found and key in latest and _answers(latest[key], before.get(key)):
                        found[key] = latest[key]
            if len(found) < len(sent):
                await asyncio.sleep(0.2)
        return [found[k] for k in sent if k in found]

    results = asyncio.run(wait_all())
    for status in results:
        print(json.dumps(status))
    if len(results) < len(sent):
        err.print(f"{len(sent) - len(results)} claim(s) had no status within {wait}s")
        raise typer.Exit(1)
    rejected = [f"{s['namespace']}/{s['name']}" for s in results if s.get("state") == "Rejected"]
    if rejected:  # a refusal, as the contract's exit statuses say: the claim is wrong as written
        err.print(f"rejected: {', '.join(rejected)} (the reason is in the status above)")
        raise typer.Exit(1)


def _answers(status: dict[str, Any], before: dict[str, Any] | None) -> bool:
    """Whether `status` answers this submission: a newer status than the claim had, or, for a claim that
    still waits or runs (the broker keeps it and ignores the copy), the one it has."""
    return (before is None or status["sequence"] > before["sequence"]
            or before["state"] in ("Pending", "Allocated"))


@app.command()
def status(
    name: Annotated[str | None, typer.Argument()] = None,
    tenant: Annotated[str | None, typer.Option()] = None,
    output: Output = "table",
    watch: Annotated[bool, typer.Option(help="keep printing as statuses change")] = False,
) -> None:
    """Print claim states."""
    url = _nats_url(_settings())
    while True:
        statuses = asyncio.run(read_statuses(url, tenant or "*", name or "*"))
        if not _emit(statuses, output):
            console.print(_status_table(statuses))
        if not watch:
            return
        time.sleep(2)


@app.command()
def release(
    name: Annotated[str, typer.Argument()],
    tenant: Annotated[str | None, typer.Option(help="the claim's tenant (default: a tenant credential's own)")]
    = None,
) -> None:
    """Release an allocated or pending claim."""
    from shared.contract import bus_auth

    url = _nats_url(_settings())
    tenant = tenant or bus_auth.tenant_of_user(bus_auth.user_of(url) or "") or "default"
    _own_tenant_only(url, tenant)

    async def main() -> None:
        nc = await _connect(url)
        try:
            await _publish(nc.jetstream(), url, subjects.release(tenant), {"name": name},
                           f"release:{tenant}:{name}:{time.time_ns()}")
        finally:
            await nc.close()

    asyncio.run(main())
    console.print(f"release requested for {tenant}/{name}")


@app.command()
def simulate(
    inventory: Annotated[list[Path], typer.Option("--inventory", help="inventory file")],
    claims: Annotated[list[Path], typer.Option("--claims", help="claims file; each file is one wave")],
    quotas: Annotated[Path | None, typer.Option(help="Quotas file")] = None,
    output: Output = "table",
    tenant: Annotated[str, typer.Option(help="tenant of claims without a namespace")] = "default",
) -> None:
    """Run the allocation decisions offline: the same core the allocator runs."""
    from shared.admission.quota import QuotaConfig
    from shared.admission.simulate import read_claim_document, run_waves
    from shared.dra.classes import merge_classes
    from shared.dra.inventory import Fleet
    from shared.fleet.sources import InventoryFileError, load_inventory, load_yaml_documents

    try:
        documents = load_inventory(inventory)
        waves = [[read_claim_document(d, tenant) for d in load_yaml_documents(path) if d is not None]
                 for path in claims]
        config = _read_quotas(quotas) if quotas is not None else QuotaConfig()
    except (InventoryFileError, ValueError) as error:
        err.print(str(error))
        raise typer.Exit(1) from None
    fleet = Fleet.from_slices(documents.slices, documents.labels)
    result = run_waves(fleet, merge_classes(documents.classes), waves, config).to_json()
    if not _emit(result, output):
        console.print(_status_table(result["claims"]))
        for event in result["events"]:
            console.print(f"{event['claim']} {event['state']} by {event['by']} ({event['rule']}): {event['reason']}")


def _read_quotas(path: Path) -> Any:
    """A Quotas file, with every flavor selector compiled: errors name the file and the field."""
    from shared.admission.quota import QuotaFileError, parse_quotas
    from shared.dra.cel import SelectorError, compile_selector
    from shared.fleet.sources import load_yaml_documents

    documents = [d for d in load_yaml_documents(path) if d is not None]
    if len(documents) != 1:
        raise QuotaFileError(f"{path}: expected one Quotas document, found {len(documents)}")
    config = parse_quotas(documents[0], where=str(path))
    for i, flavor in enumerate(config.listed_flavors):
        try:
            compile_selector(flavor.selector)
        except SelectorError as error:
            raise QuotaFileError(f"{path}: flavors[{i}].selector: {error}") from None
    return config


@app.command()
def demo(
    timeout: Annotated[float, typer.Option(help="seconds to wait for all statuses")] = 60.0,
) -> None:
    """Start the embedded stack, replay the lab workload (and a MIG, a NUMA and an unsatisfiable claim)
    over NATS, print a summary and stop."""
    import tempfile

    _logging(False)
    with tempfile.TemporaryDirectory(prefix="claimbroker-demo-") as folder:
        settings = _settings(data_dir=Path(folder), api_port=0).model_copy(update={"data_dir": Path(folder)})
        statuses, expected = asyncio.run(_demo(settings, timeout))
    console.print(_status_table(statuses))
    counts: dict[str, int] = {}
    for s in statuses:
        counts[s["state"]] = counts.get(s["state"], 0) + 1
    console.print(", ".join(f"{n} {state}" for state, n in sorted(counts.items())))
    if len(statuses) < expected:
        err.print("demo: not every claim got a status in time")
        raise typer.Exit(1)


async def _demo(settings: BrokerSettings, timeout: float) -> tuple[list[dict[str, Any]], int]:
    from services.stack import running_stack

    workloads = resources.files("shared.workloads")
    documents = [d for name in ("lab.yaml", "showcase.yaml")
                 for d in yaml.safe_load_all(workloads.joinpath(name).read_text()) if d]
    for d in documents:
        d["metadata"]["namespace"] = "lab"
    async with running_stack(settings, services=("watcher", "allocator", "notifier")) as stack:
        assert stack.allocator is not None
        if not await stack.allocator.wait_for_inventory(timeout):
            raise RuntimeError("no inventory arrived")
        await _publish_claims(stack.admin_url, documents, None)
        deadline = time.monotonic() + timeout
        statuses: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            statuses = await read_statuses(stack.admin_url, "lab")
            if len(statuses) >= len(documents):
                break
            await asyncio.sleep(0.1)
        return statuses, len(documents)


@token_app.command("create")
def token_create(
    role: Annotated[str, typer.Option(help="admin | viewer")],
    tenant: Annotated[str | None, typer.Option(help="limit a viewer to one tenant")] = None,
    ttl: Annotated[str | None, typer.Option(help="stop working after this long (30d, 12h, 90m); default never")]
    = None,
    db: Annotated[str | None, typer.Option()] = None,
) -> None:
    """Create an API token in the ledger and print it once (the ledger must exist: `up` or `migrate`)."""
    from shared.ledger.tokens import create_token
    from shared.settings import parse_duration

    if role not in ("admin", "viewer"):
        err.print("--role must be admin or viewer")
        raise typer.Exit(2)
    from shared.ledger.tokens import MAX_TTL_S

    try:
        seconds = parse_duration(ttl) if ttl is not None else None
        if seconds is not None and not 0 < seconds <= MAX_TTL_S:
            raise ValueError("a token's ttl must be positive and at most ten years")
    except ValueError as error:
        err.print(f"--ttl: {error}")
        raise typer.Exit(2) from None
    print(asyncio.run(_with_ledger(db, lambda factory: create_token(factory, role, tenant, seconds))))


@token_app.command("list")
def token_list(output: Output = "table", db: Annotated[str | None, typer.Option()] = None) -> None:
    """Every API token in the ledger (id, role, tenant, created, expires, revoked); never the token itself."""
    from shared.ledger.tokens import list_tokens, token_json

    async def read(factory: Any) -> list[dict[str, Any]]:
        async with factory() as session:
            return [token_json(row) for row in await list_tokens(session)]

    tokens = asyncio.run(_with_ledger(db, read))
    _show(tokens, output, ["ID", "ROLE", "TENANT", "CREATED", "EXPIRES", "REVOKED"],
          [[t["id"], t["role"], t["tenant"] or "-", t["createdAt"], t["expiresAt"] or "never", t["revokedAt"] or "-"]
           for t in tokens])


@token_app.command("revoke")
def token_revoke(token_id: Annotated[int, typer.Argument(help="the id `token list` shows")],
                 db: Annotated[str | None, typer.Option()] = None) -> None:
    """Revoke an API token: refused at its next request."""
    from shared.ledger.tokens import revoke_token

    async def revoke(factory: Any) -> bool:
        async with factory() as session, session.begin():
            return await revoke_token(session, token_id, "cli") is not None

    if not asyncio.run(_with_ledger(db, revoke)):
        err.print(f"claimbroker: no token {token_id}")
        raise typer.Exit(1)
    print(f"token {token_id} revoked")


async def _with_ledger(db: str | None, work: Callable[[Any], Awaitable[T]]) -> T:
    """Run `work(session_factory)` on the ledger of --db or the data folder, which must exist and be current."""
    from shared.ledger.engine import LedgerNotReady, create_engine, require_current, sessions

    settings = _settings(db=db)
    try:
        await require_current(settings.database_url())
    except LedgerNotReady as error:
        raise Unreachable(str(error)) from None
    engine = create_engine(settings.database_url())
    try:
        return await work(sessions(engine))
    finally:
        await engine.dispose()


# --- bus credentials, over the admin API ------------------------------------------------------------------

credentials_app = typer.Typer(help="Bus credentials (over the admin API: --api, --token).", no_args_is_help=True)
app.add_typer(credentials_app, name="credentials")


@credentials_app.command("create")
def credentials_create(
    tenant: Annotated[str | None, typer.Option(help="submit and release this tenant's claims, read its statuses")]
    = None,
    alerts: Annotated[bool, typer.Option("--alerts", help="read claimbroker.v1.alerts.> only")] = False,
    output: Output = "table",
) -> None:
    """Create a bus credential and print its password once."""
    from shared.contract import bus_auth

    if (tenant is None) == (not alerts):
        err.print("claimbroker: give --tenant T or --alerts (one of them)")
        raise typer.Exit(2)
    body = {"role": "alerts"} if alerts else {"role": "tenant", "tenant": tenant}
    created = _request("POST", "/v1/credentials", json=body).json()
    nats_file = _settings().data_dir / "nats.url"
    where = nats_file.read_text().strip() if nats_file.exists() else "nats://HOST:4222"
    created["url"] = bus_auth.url_with_user(where, created["user"], created["password"])
    if not _emit(created, output):
        console.print(f"credential {created['id']} for {tenant or 'alerts'} (the password is shown this once):")
        console.print(f"  user      {created['user']}")
        console.print(f"  password  {created['password']}")
        console.print(f"  use it as --nats {created['url']}", soft_wrap=True)


@credentials_app.command("list")
def credentials_list(output: Output = "table") -> None:
    """Every bus credential (revoked ones too); never a password."""
    rows = _request("GET", "/v1/credentials").json()
    _show(rows, output, ["ID", "USER", "ROLE", "TENANT", "CREATED", "REVOKED"],
          [[c["id"], c["user"], c["role"], c["tenant"] or "-", c["createdAt"], c["revokedAt"] or "-"] for c in rows])


@credentials_app.command("revoke")
def credentials_revoke(credential_id: Annotated[int, typer.Argument(help="the id `credentials list` shows")]) -> None:
    """Revoke a bus credential: its connections are closed and it is refused from then on."""
    _request("DELETE", f"/v1/credentials/{credential_id}")
    print(f"credential {credential_id} revoked")


# --- quota admins: `quota ...` and `explain`, over the admin API --------------------------------------------

quota_app = typer.Typer(help="Quotas over the admin API (--api, --token; see `claimbroker --help`).",
                        no_args_is_help=True)
app.add_typer(quota_app, name="quota")


API_TIMEOUT = 10.0  # seconds a command waits for the admin API, never longer


def _admin_api() -> tuple[str, dict[str, str]]:
    """--api (or CLAIMBROKER_API), else the URL `up` wrote in the data folder, never a guess; --token,
    else the admin token `up` kept there."""
    data_dir = _settings().data_dir
    url = G.api
    if not url:
        url_file = data_dir / "api.url"
        if not url_file.exists():
            err.print(f"claimbroker: no admin API URL: pass --api URL (or CLAIMBROKER_API), or run where "
                      f"`claimbroker up` keeps its data ({url_file} does not exist)")
            raise typer.Exit(2)
        url = url_file.read_text().strip()
    token = G.token
    if not token:
        kept = data_dir / "admin.token"
        token = kept.read_text().strip() if kept.exists() else None
    return url.rstrip("/"), ({"Authorization": f"Bearer {token}"} if token else {})


def _request(method: str, path: str, *, allow: tuple[int, ...] = (), **kwargs: Any) -> Any:
    """One call; a problem response (unless its status is in `allow`) is printed as `status title:
    detail` and exits 1."""
    import httpx

    url, headers = _admin_api()
    headers.update(kwargs.pop("headers", {}))
    try:
        ca = _settings().tls_ca
        response = httpx.request(method, url + path, headers=headers, timeout=API_TIMEOUT,
                                 verify=str(ca) if ca is not None else True, **kwargs)
    except httpx.TimeoutException:
        raise Unreachable(f"cannot reach the admin API at {url}: no answer within {API_TIMEOUT:g}s") from None
    except httpx.HTTPError as error:
        raise Unreachable(f"cannot reach the admin API at {url}: {_why(error)}") from None
    if response.status_code >= 400 and response.status_code not in allow:
        try:
            body = response.json()
            title, detail = body.get("title"), body.get("detail")
            message = detail if title == detail or not title else f"{title}: {detail}"
        except ValueError:
            message = response.text
        err.print(f"{method} {path}: {response.status_code} {message}")
        raise typer.Exit(1)
    return response


def _table(columns: list[str], rows: list[list[Any]]) -> Table:
    table = Table(show_lines=False)
    for column in columns:
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*("" if v is None else str(v) for v in row))
    return table


def _show(data: Any, output: str, columns: list[str], rows: list[list[Any]]) -> None:
    if not _emit(data, output):
        console.print(_table(columns, rows))


@quota_app.command("list")
def quota_list(output: Output = "table") -> None:
    """Every tenant's quotas, per flavor."""
    tenants = {t["name"]: t for t in _request("GET", "/v1/tenants").json()}
    quotas = _request("GET", "/v1/quotas").json()
    rows = [[q["tenant"], tenants.get(q["tenant"], {}).get("cohort"), tenants.get(q["tenant"], {}).get("weight"),
             q["flavor"], q["nominal"], q["borrowingLimit"], q["lendingLimit"]] for q in quotas]
    _show(quotas, output, ["TENANT", "COHORT", "WEIGHT", "FLAVOR", "NOMINAL", "BORROWING", "LENDING"], rows)


@quota_app.command("set")
def quota_set(
    tenant: Annotated[str, typer.Argument()],
    flavor: Annotated[str, typer.Argument(help="a flavor name, e.g. H100 or H100-3g.40gb")],
    nominal: Annotated[int, typer.Option(min=0, help="devices of the flavor the tenant is guaranteed")],
    borrowing_limit: Annotated[int | None, typer.Option(min=0, help="at most this many beyond nominal")] = None,
    lending_limit: Annotated[int | None, typer.Option(min=0, help="lend at most this much unused nominal")] = None,
    output: Output = "table",
) -> None:
    """Set a tenant's quota for one flavor; a tenant named for the first time is created."""
    if _request("GET", f"/v1/tenants/{tenant}", allow=(404,)).status_code == 404:
        _request("PUT", f"/v1/tenants/{tenant}", json={})
    quota = _request("PUT", f"/v1/tenants/{tenant}/quotas/{flavor}", json={
        "nominal": nominal, "borrowingLimit": borrowing_limit, "lendingLimit": lending_limit}).json()
    _show(quota, output, ["TENANT", "FLAVOR", "NOMINAL", "BORROWING", "LENDING"],
          [[quota["tenant"], quota["flavor"], quota["nominal"], quota["borrowingLimit"], quota["lendingLimit"]]])


@quota_app.command("delete")
def quota_delete(tenant: Annotated[str, typer.Argument()], flavor: Annotated[str, typer.Argument()]) -> None:
    """Remove a tenant's quota for one flavor."""
    _request("DELETE", f"/v1/tenants/{tenant}/quotas/{flavor}")
    console.print(f"deleted quota {tenant}/{flavor}")


@quota_app.command("import")
def quota_import(
    file: Annotated[Path, typer.Argument(help="a Quotas YAML (or JSON) document")],
    dry_run: Annotated[bool, typer.Option(help="show what would change, write nothing")] = False,
    output: Output = "table",
) -> None:
    """Make the ledger hold exactly FILE's quotas; what it does not name is deleted (see --dry-run)."""
    try:
        content = file.read_bytes()
    except OSError as error:
        err.print(f"{file}: {error}")
        raise typer.Exit(1) from None
    result = _request("POST", "/v1/quotas/import", content=content, params={"dryRun": str(dry_run).lower()},
                      headers={"Content-Type": "application/yaml"}).json()
    if _emit(result, output):
        return
    verb = "would change" if dry_run else "changed"

    def brief(row: dict[str, Any] | None) -> str:
        keys = ("nominal", "borrowingLimit", "lendingLimit", "cohort", "weight", "selector", "value")
        return ", ".join(f"{k}={row[k]}" for k in keys if row is not None and row.get(k) is not None) or "-"

    console.print(_table(["ACTION", "ENTITY", "BEFORE", "AFTER"],
                         [[c["action"], c["entity"], brief(c["before"]) if c["before"] else "",
                           brief(c["after"]) if c["after"] else ""] for c in result["changes"]]))
    console.print(f"{len(result['changes'])} row(s) {verb}")
    for over in result["exceeding"]:
        holders = ", ".join(f"{c['namespace']}/{c['name']} ({c['devices']})" for c in over["claims"])
        err.print(f"{over['tenant']} holds {over['used']} {over['flavor']}, over its new quota "
                  f"{over['nominal']} + {over['borrowingLimit']} borrowing: {holders}")


@quota_app.command("export")
def quota_export(output: Annotated[str, typer.Option("--output", "-o", help="yaml | json")] = "yaml") -> None:
    """Print the Quotas document (what `quota import` reads)."""
    response = _request("GET", "/v1/quotas/export", params={"format": "json" if output == "json" else "yaml"})
    sys.stdout.write(response.text if output != "json" else json.dumps(response.json(), indent=2) + "\n")


@quota_app.command("usage")
def quota_usage(output: Output = "table") -> None:
    """Used, borrowed and lent devices per tenant and flavor, and the pending demand."""
    usage = _request("GET", "/v1/usage").json()
    rows = [[r["tenant"], r["cohort"], r["flavor"] or "(none)", r["nominal"], r["used"], r["usedUnits"],
             r["borrowed"], r["lent"]] for r in usage["items"]]
    _show(usage, output, ["TENANT", "COHORT", "FLAVOR", "NOMINAL", "USED", "UNITS", "BORROWED", "LENT"], rows)
    if output == "table" and usage["pending"]:
        console.print(_table(["TENANT", "PENDING CLAIMS", "DEVICES REQUESTED"],
                             [[p["tenant"], p["claims"], p["devices"]] for p in usage["pending"]]))
    if output == "table" and not usage["enforced"]:
        console.print("no quota is set: the fleet is open to every tenant")


@app.command()
def explain(
    claim: Annotated[str, typer.Argument(help="the claim's name")],
    tenant: Annotated[str, typer.Option(help="the claim's tenant (namespace)")] = "default",
    output: Output = "table",
) -> None:
    """Why a claim waits: its state, reason and the allocator's structured explanation."""
    result = _request("GET", f"/v1/claims/{tenant}/{claim}/explain").json()
    if _emit(result, output):
        return
    console.print(f"{result['namespace']}/{result['name']}: {result['state']}")
    if result["reason"]:
        console.print(f"reason: {result['reason']}", highlight=False)
    if result["explain"] is None:
        console.print("no structured explanation recorded")
    else:
        console.print_json(data=result["explain"])


@app.command()
def top(
    once: Annotated[bool, typer.Option(help="print one frame and exit")] = False,
    interval: Annotated[float, typer.Option(min=0.5, help="redraw at least this often, in seconds")] = 5.0,
) -> None:
    """A live view of the fleet per flavor and tenant (used, free, pending, borrowed) and the Pending queue,
    redrawn as statuses and inventory arrive; the admin API (--api, --token) and NATS (--nats)."""
    import contextlib

    from services import top as view

    url, headers = _admin_api()
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C is how a live view ends
        try:
            settings = _settings()
            asyncio.run(view.run(url, headers, _nats_url(settings), console=console, once=once,
                                 interval=interval, tls_ca=settings.tls_ca))
        except view.Unavailable as error:
            raise Unreachable(str(error)) from None


@app.command()
def asyncapi(
    output: Annotated[str, typer.Option("--output", "-o", help="json | yaml")] = "json",
) -> None:
    """The AsyncAPI 3.0 document of every subject and payload (the same the admin API serves at
    /asyncapi.json): enough to write a client."""
    from services.asyncapi import document

    if output not in ("json", "yaml"):
        err.print(f"claimbroker: --output must be json or yaml, not {output!r}")
        raise typer.Exit(2)
    _emit(document(), output)


GLOBAL_OPTIONS = ("--nats", "--api", "--token", "--data-dir")


def globals_first(argv: list[str]) -> list[str]:
    """kubectl's habit: the global options are accepted after the command too (`status --data-dir X`); they
    are moved before it, with their values. What follows `--` is left as it is."""
    front: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            rest.extend(argv[i:])
            break
        if arg.split("=", 1)[0] in GLOBAL_OPTIONS:
            taken = 1 if "=" in arg else 2
            front.extend(argv[i:i + taken])
            i += taken
            continue
        rest.append(arg)
        i += 1
    return front + rest


def main() -> None:
    """Errors are one line on stderr, never a traceback (CLAIMBROKER_DEBUG=1 shows it)."""
    import os

    try:
        app(args=globals_first(sys.argv[1:]))
    except dra.DocumentError as error:
        err.print(str(error))
        sys.exit(1)
    except Unreachable as error:
        err.print(f"claimbroker: {error}")
        sys.exit(3)
    except Refused as error:
        err.print(f"claimbroker: {error}")
        sys.exit(1)
    except Exception as error:
        if os.environ.get("CLAIMBROKER_DEBUG"):
            raise
        err.print(f"claimbroker: {type(error).__name__}: {error} (CLAIMBROKER_DEBUG=1 shows where)")
        sys.exit(3)


if __name__ == "__main__":
    main()
