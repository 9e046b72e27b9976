"""Running the broker: `up`, `serve`, `migrate`, `demo`, and the AsyncAPI document.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Annotated

import typer
import yaml

from services.cli.bus import bus_error_text, publish_claims, read_statuses, status_table
from services.cli.common import (
    LogFormat,
    MaybeOutput,
    Output,
    Unreachable,
    app,
    cli_settings,
    configure_cli_logging,
    console,
    emit_document,
    log,
    print_done,
    say_error,
)
from services.runtime.gc_tuning import tune_gc
from shared.contract.messages import ClaimStatus
from shared.settings import BrokerSettings


@app.command()
def up(
    inventory: Annotated[list[Path] | None, typer.Option("--inventory", help="inventory file", exists=True,
                                                         dir_okay=False, readable=True)] = None,
    kube: Annotated[bool, typer.Option(help="take the fleet from the Kubernetes cluster only, and its ResourceClaims "
                                            "annotated claimbroker.io/broker")] = False,
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
    mig_advice_min: Annotated[int | None, typer.Option(
        help="alert mig-relayout-suggested when a MIG re-layout would admit this many waiting claims (0: off)")]
    = None,
) -> None:
    """Run watcher, allocator, notifier and admin API until Ctrl-C."""
    from services.runtime.stack import SERVICES, LedgerUnreachable, StartRefused
    from shared.settings import Webhook

    tune_gc()
    settings = cli_settings(inventory=inventory or None, kube=kube or None, kubeconfig=kubeconfig, db=db,
                         nats_url=nats, api_port=api_port, stream_replicas=stream_replicas, insecure=insecure or None,
                         mig_advice_min=mig_advice_min,
                         pending_alert_after=pending_alert_after, log_format=log_format,
                         webhooks=[Webhook.parse(url) for url in webhook] if webhook else None)
    _refuse_unless_ready(settings, SERVICES)
    if settings.nats_url:  # an external server that is not there, or refuses the credential: said, not waited on
        asyncio.run(_answers(settings.nats_url))
    configure_cli_logging(True, settings.log_format)
    try:
        told = asyncio.run(_up(settings))
    except LedgerUnreachable as error:
        raise Unreachable(str(error)) from None
    except StartRefused as error:
        say_error(f"claimbroker: {error}")
        raise typer.Exit(2) from None
    if not told:
        raise typer.Exit(1)  # a service ended on its own: everything it started is stopped


def _refuse_unless_ready(settings: BrokerSettings, services: tuple[str, ...]) -> None:
    """The ports the services need, checked before anything starts or is written: one line that says which
    option to change, exit 2."""
    from services.runtime.stack import StartRefused, preflight

    try:
        preflight(settings, services)
    except StartRefused as error:
        say_error(f"claimbroker: {error}")
        raise typer.Exit(2) from None


async def _answers(url: str) -> None:
    """One bounded connection to `url`: Unreachable (exit 3) or Refused (exit 1) in one line, the URL
    masked, where the services would retry it for good without a word."""
    from services.cli.bus import connect_bus

    nc = await connect_bus(url)
    await nc.close()


def _shown(url: str) -> str:
    """A NATS or ledger URL as the banner prints it: without its password."""
    from services.runtime.logs import mask_secrets
    from shared.contract import bus_auth
    from shared.ledger.handles import BadLedgerUrl, masked_url

    if url.startswith(("nats://", "tls://", "ws://", "wss://")):
        return bus_auth.redact(url)
    try:
        return masked_url(url)
    except BadLedgerUrl:
        return mask_secrets(url)


async def _up(settings: BrokerSettings) -> bool:
    """Whether it stopped because it was told to (False: a service failed for good; see supervise)."""
    from services.bus.cancel import wait_closed
    from services.runtime.stack import (
        ESTIMATOR_SERVICE,
        SERVICES,
        StartRefused,
        estimates_on,
        running_stack,
        supervise,
    )
    from shared.contract import bus_auth
    from shared.ledger.engine import sessions
    from shared.ledger.tokens import create_token

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    # the allocator in a process of its own (a core for its decisions), start estimates in another
    # (services/runtime/service_process.py)
    services = (*SERVICES, ESTIMATOR_SERVICE) if estimates_on(settings) else SERVICES
    async with running_stack(settings, services=services, own_process=("allocator", ESTIMATOR_SERVICE)) as stack:
        if stack.api_url is None:  # its port was taken after preflight's check, or it never listened
            serving = stack.tasks.get("admin-api")
            failure = serving.exception() if serving is not None and serving.done() and not serving.cancelled() \
                else None
            raise StartRefused(str(failure) if failure else "the admin API did not listen within 30s")
        url_file = settings.data_dir / "nats.url"  # where the other commands find it
        url_file.write_text(stack.nats_url)
        if bus_auth.user_of(stack.nats_url) is not None:  # an external server's credential: the owner's only
            url_file.chmod(0o600)
        (settings.data_dir / "api.url").write_text(stack.api_url)
        token_file = settings.data_dir / "admin.token"
        if not token_file.exists():
            token = await create_token(sessions(stack.engine), "admin", None, actor="up")
            token_file.write_text(token)
            token_file.chmod(0o600)
            console.print(f"admin token (shown once, kept in {token_file}): {token}")
        console.print(f"NATS      {_shown(stack.nats_url)}", markup=False)
        if stack.authority is not None:
            console.print("          every client needs a credential: `claimbroker credentials create --tenant T`")
            console.print("          (the CLI run in this folder uses its bus admin)")
        elif stack.embedded is not None:
            log.warning("the bus is open (--insecure): anyone who reaches %s may submit, release and read any "
                        "tenant's claims, and delete the streams", stack.nats_url)
            console.print("          [bold red]OPEN BUS (--insecure): no credential asked; anyone who reaches it "
                          "acts as any tenant[/bold red]")
        console.print(f"admin API {stack.api_url}", markup=False)
        console.print(f"ledger    {_shown(stack.db_url)}", markup=False)
        health = None
        if settings.health_port is not None:  # /healthz, /readyz (every service ready) and /metrics
            from services.runtime.health import serve_health

            def not_ready() -> str | None:
                return next((why for name in stack.tasks if (why := stack.not_ready(name))), None)

            def processes_metrics() -> list[bytes]:
                return [process.metrics() for process in stack.processes.values()]

            health = asyncio.create_task(serve_health(settings.health_host, settings.health_port, not_ready,
                                                      processes_metrics))
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
    from services.bus.authority import BusAuthority, FileTarget, Provisioner, own_identities, tenant_limits
    from shared.contract import bus_auth
    from shared.ledger.engine import create_engine
    from shared.ledger.errors import LEDGER_ERRORS

    bus = settings.bus
    if bus.bus_auth_file is None or not bus.bus_passwords:
        say_error("serve bus-auth needs CLAIMBROKER_BUS_AUTH_FILE and CLAIMBROKER_BUS_PASSWORDS")
        raise typer.Exit(2)
    target = FileTarget(bus.bus_auth_file, bus.nats_pid_file)
    own = own_identities(bus.bus_passwords)
    limits = tenant_limits(bus)
    provisioner = None  # tenant accounts' status streams, as the bus admin, through the server's client port
    if bus.nats_url and "admin" in bus.bus_passwords:
        admin = bus_auth.url_with_user(bus.nats_url, bus_auth.admin_user(), bus.bus_passwords["admin"])
        provisioner = Provisioner(admin, limits, bus.tls_ca)
    else:
        log.warning("bus-auth: no CLAIMBROKER_NATS_URL or no admin password: tenants' status streams are not "
                    "provisioned (tenants cannot read their statuses)")

    async def main() -> None:
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            asyncio.get_running_loop().add_signal_handler(sig, stop.set)
        if not bus.bus_auth_file or not bus.bus_auth_file.exists():
            target(bus_auth.render_accounts(own, [], limits))  # the server can start before the ledger answers
        engine = create_engine(settings.database_url())
        authority = BusAuthority(engine, own, target, bus.bus_auth_poll_interval, limits, provisioner)
        authority.served = bus_auth.served_tenants(target.path.read_text())  # what the running server has
        try:
            while not stop.is_set():
                try:
                    await authority.apply()
                    break
                except LEDGER_ERRORS as error:  # the ledger not there yet (not migrated, not up): keep trying
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
    service: Annotated[str, typer.Argument(
        help="watcher | allocator | estimator (start estimates) | notifier | admin-api | bus-auth")],
    inventory: Annotated[list[Path] | None, typer.Option("--inventory")] = None,
    db: Annotated[str | None, typer.Option()] = None,
    nats: Annotated[str | None, typer.Option()] = None,
    kube: Annotated[bool, typer.Option(help="watcher: the fleet from the Kubernetes cluster; allocator: its "
                                            "ResourceClaims annotated claimbroker.io/broker")] = False,
    kubeconfig: Annotated[Path | None, typer.Option(help="--kube's kubeconfig (default: in-cluster)")] = None,
    nvml: Annotated[bool, typer.Option(help="watcher: this host's GPUs, read with NVML")] = False,
    stream_replicas: Annotated[int | None, typer.Option(help="servers of a NATS cluster keeping each stream")] = None,
    log_format: LogFormat = None,
) -> None:
    """Run one service against external NATS and database (compose, Kubernetes)."""
    tune_gc()
    settings = cli_settings(inventory=inventory or None, db=db, nats_url=nats, kube=kube or None,
                         kubeconfig=kubeconfig, nvml=nvml or None, stream_replicas=stream_replicas,
                         log_format=log_format)
    configure_cli_logging(True, settings.log_format)
    if service == "bus-auth":
        _serve_bus_auth(settings)
        return
    if not settings.nats_url:
        say_error("serve needs --nats or CLAIMBROKER_NATS_URL")
        raise typer.Exit(2)
    if service == "watcher" and settings.kube and settings.nvml:
        say_error("serve watcher takes one source: --kube (the cluster) or --nvml (this host), not both")
        raise typer.Exit(2)
    if service == "watcher" and not (settings.kube or settings.nvml or settings.inventory):
        say_error("serve watcher needs --kube, --nvml or --inventory FILE "
                  "(a deployed watcher never publishes the demo fleet)")
        raise typer.Exit(2)

    _refuse_unless_ready(settings, (service,))
    from shared.ledger.engine import LedgerNotReady, require_sqlite_file

    try:
        require_sqlite_file(settings.database_url())
    except LedgerNotReady as error:
        say_error(f"claimbroker: {error}")
        raise typer.Exit(3) from None

    async def main() -> bool:
        from services.bus.cancel import wait_closed
        from services.bus.connection import connect
        from services.bus.streams import ensure_streams
        from services.runtime.stack import Stack, start_service
        from shared.ledger.engine import create_engine

        # the allocator retries any ledger error: no round trip to test each connection first
        engine = create_engine(settings.database_url(), pre_ping=service != "allocator")
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
            from services.runtime.health import serve_health

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
def migrate(db: Annotated[str | None, typer.Option()] = None, output: MaybeOutput = None) -> None:
    """Bring the ledger schema to the newest revision."""
    from shared.ledger.engine import migrate as run_migrations
    from shared.ledger.handles import LedgerError, masked_url

    settings = cli_settings(db=db)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    shown = masked_url(settings.database_url())
    try:
        asyncio.run(run_migrations(settings.database_url()))
    except (OSError, LedgerError) as error:
        raise Unreachable(f"cannot reach the ledger at {shown}: {bus_error_text(error)}") from None
    print_done(f"ledger at head: {shown}", {"ledger": shown, "atHead": True}, output)


@app.command()
def demo(
    timeout: Annotated[float, typer.Option(help="seconds to wait for all statuses")] = 60.0,
    output: Output = "table",
) -> None:
    """Start the embedded stack, replay the lab workload (and a MIG, a NUMA and an unsatisfiable claim)
    over NATS, print a summary and stop."""
    import tempfile

    configure_cli_logging(False)
    with tempfile.TemporaryDirectory(prefix="claimbroker-demo-") as folder:
        settings = cli_settings(data_dir=Path(folder), api_port=0).model_copy(update={"data_dir": Path(folder)})
        statuses, expected = asyncio.run(_demo(settings, timeout))
    if not emit_document(statuses, output):
        console.print(status_table(statuses, datetime.now(UTC)))
        counts: dict[str, int] = {}
        for s in statuses:
            counts[s["state"]] = counts.get(s["state"], 0) + 1
        console.print(", ".join(f"{n} {state}" for state, n in sorted(counts.items())))
    if len(statuses) < expected:
        say_error("claimbroker: demo: not every claim got a status in time")
        raise typer.Exit(1)


async def _demo(settings: BrokerSettings, timeout: float) -> tuple[list[ClaimStatus], int]:
    from services.runtime.stack import running_stack

    workloads = resources.files("shared.workloads")
    documents = [d for name in ("lab.yaml", "showcase.yaml")
                 for d in yaml.safe_load_all(workloads.joinpath(name).read_text()) if d]
    for d in documents:
        d["metadata"]["namespace"] = "lab"
    async with running_stack(settings, services=("watcher", "allocator", "notifier")) as stack:
        assert stack.allocator is not None
        if not await stack.allocator.wait_for_inventory(timeout):
            raise RuntimeError("no inventory arrived")
        await publish_claims(stack.admin_url, documents, None)
        deadline = time.monotonic() + timeout
        statuses: list[ClaimStatus] = []
        while time.monotonic() < deadline:
            statuses = await read_statuses(stack.admin_url, "lab")
            if len(statuses) >= len(documents):
                break
            await asyncio.sleep(0.1)
        return statuses, len(documents)


@app.command()
def asyncapi(
    output: Annotated[str, typer.Option("--output", "-o", help="json | yaml")] = "json",
) -> None:
    """The AsyncAPI 3.0 document of every subject and payload (the same the admin API serves at
    /asyncapi.json): enough to write a client."""
    from services.bus.asyncapi import document

    if output not in ("json", "yaml"):
        say_error(f"claimbroker: --output must be json or yaml, not {output!r}")
        raise typer.Exit(2)
    emit_document(document(), output)
