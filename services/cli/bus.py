"""The CLI on the bus: connecting (bounded and quiet), publishing claims (waiting on a full tenant backlog),
reading statuses without a consumer: the last of each claim by direct get on `CLAIMBROKER_STATUS` in the
reader's own account (a tenant's holds its statuses alone, the broker's every tenant's), then each change
on a plain subscription made before that read, so nothing falls between.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import time
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import typer
import yaml
from rich.table import Table

from services.cli.common import Refused, Unreachable, cli_settings, err
from shared.admission.estimate_text import first_clause, rough_duration
from shared.contract import subjects
from shared.contract.messages import ClaimStatus, UnreadableStatus, read_status
from shared.settings import BrokerSettings

NATS_TIMEOUT_S = 5.0  # a command gives up on NATS after this long, never hangs


def nats_url_of(settings: BrokerSettings) -> str:
    """--nats (or CLAIMBROKER_NATS), else the URL `up` wrote in the data folder; never a guess."""
    if settings.nats_url:
        return settings.nats_url
    url_file = settings.data_dir / "nats.url"
    if url_file.exists():  # `up`'s server: its bus admin's credential, kept beside it, goes with it
        from services.bus.authority import ADMIN_PASSWORD_FILE
        from shared.contract import bus_auth

        url = url_file.read_text().strip()
        password = settings.data_dir / ADMIN_PASSWORD_FILE
        if password.exists() and bus_auth.user_of(url) is None:
            url = bus_auth.url_with_user(url, bus_auth.admin_user(), password.read_text().strip())
        return url
    err.print(f"no NATS URL: pass --nats URL (or CLAIMBROKER_NATS), or run where `claimbroker up` keeps its data "
              f"({url_file} does not exist)")
    raise typer.Exit(2)


async def connect_bus(url: str) -> Any:
    """The CLI's connection: bounded and quiet. nats-py retries a refused first connection for good,
    whatever its reconnect options, reporting each try to `error_cb`: the first report ends it here, with
    one line instead of a hang."""
    import nats

    loop = asyncio.get_running_loop()
    failed: asyncio.Future[BaseException] = loop.create_future()

    async def first_failure(error: Exception) -> None:
        if not failed.done():
            failed.set_result(error)

    from services.bus.connection import tls_context
    from shared.contract import bus_auth

    connecting: asyncio.Future[Any] = asyncio.ensure_future(nats.connect(
        url, name="claimbroker-cli", connect_timeout=2, allow_reconnect=False, error_cb=first_failure,
        tls=tls_context(cli_settings().tls_ca), **bus_auth.client_options(url)))
    futures: set[asyncio.Future[Any]] = {connecting, failed}
    await asyncio.wait(futures, timeout=NATS_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED)
    if connecting.done() and connecting.exception() is None:
        return connecting.result()
    connecting.cancel()
    await asyncio.wait({connecting})
    error = failed.result() if failed.done() else None
    if error is None and not connecting.cancelled():
        error = connecting.exception()
    why = bus_error_text(error) if error is not None else f"no answer within {NATS_TIMEOUT_S:g}s"
    if error is not None and "authorization violation" in str(error).lower():
        raise Refused(f"NATS at {bus_auth.redact(url)}: {why}")
    raise Unreachable(f"cannot reach NATS at {bus_auth.redact(url)}: {why}")


def bus_error_text(error: BaseException) -> str:
    text = str(error).strip() or type(error).__name__
    if "authorization violation" in text.lower():
        return ("the server refused the credential (a bus credential from `claimbroker credentials create`, "
                "as --nats nats://USER:PASSWORD@HOST:PORT)")
    return text if "no servers" not in text.lower() else "nothing answered there"


def _no_streams(shown_url: str) -> Unreachable:
    return Unreachable(f"NATS at {shown_url} has no claim-broker streams: is the broker running against it?")


BACKLOG_WAIT_S = 60.0  # how long a publish waits on a full tenant backlog for the broker to take some


async def publish_document(js: Any, url: str, subject: str, payload: Any, message_id: str) -> None:
    """Publish to the broker's stream; only `up`, `serve` and `migrate` create what the broker needs. A
    tenant's backlog on the bus is bounded (settings.tenant_backlog): past it, wait for the broker."""
    from nats.errors import ConnectionClosedError
    from nats.js.errors import APIError, NoStreamResponseError

    from services.bus.publish import publish_json
    from services.bus.streams import BACKLOG_FULL_CODE
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
            if getattr(getattr(js, "_nc", None), "is_closed", False):
                raise Unreachable(f"lost the connection to NATS at {shown}") from None
            raise Unreachable(f"NATS at {shown} did not acknowledge {subject} within {NATS_TIMEOUT_S:g}s "
                              f"(may this credential publish there?)") from None
        except ConnectionClosedError:  # the server stopped, or a revoked credential was cut off
            raise Unreachable(f"lost the connection to NATS at {shown}") from None
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


def _refuse_bad_names(path: Path, number: int, metadata: dict[str, Any]) -> None:
    """A name or namespace Kubernetes would refuse stops the file before anything is published (the
    broker would only answer it with a Rejected status or an alert)."""
    from shared.dra.claims import claim_name_problem, namespace_problem

    problem = claim_name_problem(metadata.get("name")) or namespace_problem(metadata.get("namespace"))
    if problem is not None:
        err.print(f"{path}: document {number}: {problem}: nothing was submitted", markup=False, highlight=False)
        raise typer.Exit(2)


def _checked_tenant(tenant: str, option: str = "--tenant") -> str:
    """A tenant is a namespace, a DNS label: any other is refused here (exit 2) rather than sent to a subject
    that no broker reads. '*' stands for every tenant."""
    from shared.dra.claims import namespace_problem

    if tenant != "*" and (problem := namespace_problem(tenant, option)) is not None:
        err.print(f"claimbroker: {problem}", markup=False, highlight=False)
        raise typer.Exit(2)
    return tenant


def claim_documents(path: Path, tenant: str | None, default_tenant: str = "default") -> list[dict[str, Any]]:
    """FILE's claims, each with its namespace: its own, else --tenant, else `default_tenant` (a tenant
    credential's tenant, else `default`). A file that cannot be read, or is not claims, is a usage error."""
    if tenant is not None:
        _checked_tenant(tenant)
    try:
        documents = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    except (OSError, yaml.YAMLError) as error:
        err.print(f"{path}: cannot read claims: {' '.join(str(error).split())}", markup=False)
        raise typer.Exit(2) from None
    out = []
    for number, document in enumerate(documents, 1):
        if not isinstance(document, dict) or document.get("kind") != "ResourceClaim":
            kind = document.get("kind") if isinstance(document, dict) else type(document).__name__
            err.print(f"{path}: document {number} is a {kind!r}, not a ResourceClaim: nothing was submitted")
            raise typer.Exit(2)
        metadata = dict(document.get("metadata") or {})
        if tenant and metadata.get("namespace") and metadata["namespace"] != tenant:
            err.print(f"{path}: claim {metadata.get('name')!r} is in namespace {metadata['namespace']!r}, not --tenant "
                      f"{tenant!r}: nothing was submitted (drop --tenant, or the claim's namespace)")
            raise typer.Exit(2)  # as kubectl -n refuses an object of another namespace
        metadata["namespace"] = metadata.get("namespace") or tenant or default_tenant
        _refuse_bad_names(path, number, metadata)
        out.append({**document, "metadata": metadata})
    if not out:
        err.print(f"{path}: no ResourceClaim in it: nothing was submitted")
        raise typer.Exit(2)
    return out


async def publish_claims(url: str, claims: list[dict[str, Any]], priority: int | None,
                          progress: SendProgress | None = None) -> list[tuple[str, str]]:
    for document in claims:
        own_tenant_only(url, str(document["metadata"]["namespace"]))
    nc = await connect_bus(url)
    try:
        return await _publish_on(nc, url, claims, priority, progress)
    finally:
        await nc.close()


async def _publish_on(nc: Any, url: str, claims: list[dict[str, Any]], priority: int | None,
                      progress: SendProgress | None = None) -> list[tuple[str, str]]:
    """Publish `claims` in order; `progress` counts them as they are acknowledged (what an interrupted
    submit says it sent)."""
    # Ids unique to this invocation: a retry inside it is deduplicated, a later `submit` of the same file is
    # a new submission (the broker ignores it while the claim waits or runs, and takes it once it ended).
    run = uuid.uuid4().hex[:12]
    progress = progress or SendProgress(len(claims))
    js = nc.jetstream()
    sent: list[tuple[str, str]] = []
    try:
        for document in claims:
            progress.step(len(sent))
            if priority is not None:
                metadata = document["metadata"]
                metadata["annotations"] = {**(metadata.get("annotations") or {}),
                                           "claimbroker.io/priority": str(priority)}
            tenant, name = document["metadata"]["namespace"], str(document["metadata"].get("name", ""))
            digest = hashlib.sha256(json.dumps(document, sort_keys=True).encode()).hexdigest()[:16]
            await publish_document(js, url, subjects.submit(tenant), document, f"submit:{tenant}:{name}:{digest}:{run}")
            sent.append((tenant, name))
            progress.sent = len(sent)
        return sent
    finally:
        progress.done(len(sent))


class SendProgress:
    """A long submit says how far it got, once a second, on stderr when that is a terminal (a script's
    output stays the one line per claim)."""

    EVERY_S = 1.0

    def __init__(self, total: int) -> None:
        self.total, self.shown, self.started = total, False, time.monotonic()
        self.next = self.started + self.EVERY_S
        self.sent = 0  # acknowledged by the bus

    def summary(self) -> str:
        """How far a cut submission got, and what to do: sending the file again is safe, as the broker
        ignores a claim it holds waiting or running (and the rest are new)."""
        return (f"sent {self.sent:,} of {self.total:,} claim(s); sending the file again is safe (the broker "
                "ignores a claim it already holds waiting or running)")

    def step(self, sent: int) -> None:
        if err.is_terminal and time.monotonic() >= self.next:
            err.print(f"\rsubmitted {sent:,} of {self.total:,}", end="")
            self.shown, self.next = True, time.monotonic() + self.EVERY_S

    def done(self, sent: int) -> None:
        if self.shown:
            err.print(f"\rsubmitted {sent:,} of {self.total:,} in {time.monotonic() - self.started:.1f}s")


Key = tuple[str, str]  # (tenant, claim)


async def read_statuses(url: str, tenant: str = "*", name: str = "*") -> list[ClaimStatus]:
    """The newest status of every matching claim (a tenant credential's own tenant's by default)."""
    tenant = _reader_tenant(url, tenant)
    nc = await connect_bus(url)
    try:
        return await _statuses_on(nc, url, tenant, name)
    finally:
        await nc.close()


def _reader_tenant(url: str, tenant: str) -> str:
    from shared.contract import bus_auth

    own = bus_auth.tenant_of_user(bus_auth.user_of(url) or "")
    if own is not None and tenant == "*":
        tenant = own
    _checked_tenant(tenant)
    own_tenant_only(url, tenant)
    return tenant


def _wanted(tenant: str, name: str) -> str:
    """The status subjects of `tenant`'s claim `name` ('*': all), as the broker writes them
    (shared.contract.subjects: a '.' of a claim name is a '_' there). A name no subject carries has no
    status: refused here (exit 2)."""
    from shared.contract import bus_auth

    if name == "*":
        return bus_auth.status_filter(tenant)
    if not subjects.carries(name):
        from shared.dra.claims import claim_name_problem

        problem = claim_name_problem(name, "NAME") or f"NAME {name!r} has no status subject"
        err.print(f"claimbroker: {problem}", markup=False, highlight=False)
        raise typer.Exit(2)
    return bus_auth.status_filter(tenant, subjects.name_token(name))


async def _statuses_on(nc: Any, url: str, tenant: str, name: str) -> list[ClaimStatus]:
    latest = await _last_on(nc, url, subjects.STATUS_STREAM, _wanted(tenant, name))
    found = (_status_of(message.data) for message in latest.values())
    return sorted((s for s in found if s is not None), key=lambda s: (s["namespace"], s["name"]))


def _status_of(data: bytes) -> ClaimStatus | None:
    """A claim status, or None for what is none (a tenant's own stream holds whatever the tenant had the
    server put there: it reads only its own)."""
    try:
        return read_status(data)
    except UnreadableStatus:
        return None


async def last_per_subject(url: str, stream: str, wanted: str) -> dict[str, bytes]:
    """The last message of each subject matching `wanted` in `stream` of this reader's account."""
    nc = await connect_bus(url)
    try:
        return {subject: message.data for subject, message in (await _last_on(nc, url, stream, wanted)).items()}
    finally:
        await nc.close()


async def _last_on(nc: Any, url: str, stream: str, wanted: str) -> dict[str, Any]:
    from services.bus.streams import DirectGetError, last_messages
    from shared.contract import bus_auth

    shown = bus_auth.redact(url)
    try:
        return await last_messages(nc, stream, wanted, timeout=NATS_TIMEOUT_S)
    except TimeoutError:
        raise Unreachable(f"NATS at {shown} did not answer within {NATS_TIMEOUT_S:g}s (may this credential read "
                          f"{wanted}?)") from None
    except DirectGetError as error:
        if error.status != "503":
            raise Unreachable(f"NATS at {shown}: {error}") from None
        if bus_auth.tenant_of_user(bus_auth.user_of(url) or "") is not None:
            raise Unreachable(f"NATS at {shown} has no status stream for this credential's tenant yet: the broker "
                              f"makes one when a credential is created (is it running?)") from None
        raise _no_streams(shown) from None


class StatusFeed:
    """The newest status of each claim as they arrive, on plain subscriptions: opened before the snapshot
    is read, so a status published in between is in one or the other. A status older than the one held
    (by its per-claim `sequence`) changes nothing."""

    def __init__(self) -> None:
        self.latest: dict[Key, ClaimStatus] = {}
        self.changed = asyncio.Event()

    async def open(self, nc: Any, wanted: list[str]) -> None:
        async def on_status(message: Any) -> None:
            if (status := _status_of(message.data)) is not None:
                self.offer(status)

        for subject in wanted:
            await nc.subscribe(subject, cb=on_status)
        await nc.flush(timeout=NATS_TIMEOUT_S)  # the server has them before anything is read or sent

    def offer(self, status: ClaimStatus) -> None:
        key = (status["namespace"], status["name"])
        held = self.latest.get(key)
        if held is None or (status.get("sequence", 0) >= held.get("sequence", 0) and status != held):
            self.latest[key] = status
            self.changed.set()

    async def next_change(self, nc: Any, timeout: float) -> None:
        """Until a status arrived since `changed` was cleared, or `timeout` passed; a lost connection is
        said, never waited on."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.changed.wait(), timeout)
        if nc.is_closed:
            raise Unreachable("the connection to NATS was lost")


async def watch_statuses(url: str, tenant: str, name: str) -> AsyncIterator[list[ClaimStatus]]:
    """Every matching claim's newest status now, then again at each change (an async generator of lists)."""
    tenant = _reader_tenant(url, tenant)
    nc = await connect_bus(url)
    try:
        feed = StatusFeed()
        await feed.open(nc, [_wanted(tenant, name)])
        for status in await _statuses_on(nc, url, tenant, name):
            feed.offer(status)
        while True:
            feed.changed.clear()
            yield sorted(feed.latest.values(), key=lambda s: (s["namespace"], s["name"]))
            while not feed.changed.is_set():
                await feed.next_change(nc, 2.0)
            await asyncio.sleep(WATCH_COALESCE_S)  # a burst of changes is one print
    finally:
        await nc.close()


WATCH_COALESCE_S = 0.2


async def submit_and_wait(url: str, claims: list[dict[str, Any]], priority: int | None, wait: float,
                          progress: SendProgress | None = None) -> tuple[list[Key], list[ClaimStatus]]:
    """Publish `claims` and wait up to `wait` seconds for each one's answer: the claims sent, and the
    statuses that answered them, in the order sent. The subscription comes first, then the statuses
    before this submission (to tell an answer from an old status), then the publish."""
    tenants = sorted({str(c["metadata"]["namespace"]) for c in claims})
    for tenant in tenants:
        own_tenant_only(url, tenant)
    nc = await connect_bus(url)
    try:
        feed = StatusFeed()
        await feed.open(nc, [_wanted(tenant, "*") for tenant in tenants])
        before: dict[Key, ClaimStatus] = {}
        for tenant in tenants:
            before.update({(s["namespace"], s["name"]): s for s in await _statuses_on(nc, url, tenant, "*")})
        sent = await _publish_on(nc, url, claims, priority, progress)
        deadline = time.monotonic() + wait
        found: dict[Key, ClaimStatus] = {}
        while True:
            feed.changed.clear()  # before looking: a status arriving after the look wakes the wait below
            for key in sent:
                current = feed.latest.get(key) or before.get(key)
                if key not in found and current is not None and _answers(current, before.get(key)):
                    found[key] = current
            left = deadline - time.monotonic()
            if len(found) == len(set(sent)) or left <= 0:
                return sent, [found[k] for k in dict.fromkeys(sent) if k in found]
            await feed.next_change(nc, left)
    finally:
        await nc.close()


def _answers(status: ClaimStatus, before: ClaimStatus | None) -> bool:
    """Whether `status` answers this submission: a newer status than the claim had, or, for a claim that
    still waits or runs (the broker keeps it and ignores the copy), the one it has."""
    return (before is None or status.get("sequence", 0) > before.get("sequence", 0)
            or before["state"] in ("Pending", "Allocated"))


def own_tenant_only(url: str, tenant: str) -> None:
    """A tenant's bus credential reaches only its tenant: said here in one line, before the server refuses
    it without a word (a publish it forbids is dropped)."""
    from shared.contract import bus_auth

    own = bus_auth.tenant_of_user(bus_auth.user_of(url) or "")
    if own is not None and tenant != own:
        err.print(f"claimbroker: this bus credential is tenant {own}'s: it cannot reach tenant {tenant}'s claims")
        raise typer.Exit(1)


def eta(status: Mapping[str, Any], now: datetime | None = None, *, whole: bool = True) -> str:
    """A Pending claim's estimated start (the p50 of its estimatedStart, and how far off it is from `now`
    when given: "2026-12-07T02:15:49Z (in 20m)"; 'none: <why>' for a null one with its reason, or only
    its first clause unless `whole` (a table's cell: explain says the rest); '-': none published), else ''."""
    if status.get("state") != "Pending":
        return ""
    estimate = status.get("estimatedStart")
    if not isinstance(estimate, dict) or not estimate.get("p50"):
        why = status.get("estimatedStartReason")
        if estimate is None and isinstance(why, str) and why:
            return f"none: {why if whole else first_clause(why)}"
        return "-"
    p50 = str(estimate["p50"])
    try:
        ahead = (datetime.fromisoformat(p50.replace("Z", "+00:00")) - now).total_seconds() if now else None
    except ValueError:
        ahead = None
    if ahead is None:
        return p50
    return f"{p50} ({'in ' + rough_duration(ahead) if ahead >= 60 else 'now'})"


def status_table(statuses: Sequence[Mapping[str, Any]], now: datetime | None = None) -> Table:
    """The statuses as a table; with `now`, each ETA also says how far off it is. The ETA column only when
    some status carries an estimate, or why none can be said (the broker publishes them with
    CLAIMBROKER_ESTIMATE_INTERVAL set)."""
    with_eta = any(isinstance(s.get("estimatedStart"), dict) or s.get("estimatedStartReason") for s in statuses)
    table = Table(show_lines=False)
    for column in ("TENANT", "CLAIM", "STATE", "NODE", "DEVICES", *(("ETA",) if with_eta else ()), "REASON"):
        table.add_column(column, overflow="fold")
    for s in statuses:
        allocation = s.get("allocation") or {}
        devices = ", ".join(r["device"] for r in (allocation.get("devices") or {}).get("results", []))
        table.add_row(s["namespace"], s["name"], s["state"], allocation.get("nodeName", ""), devices,
                      *((eta(s, now, whole=False),) if with_eta else ()), s.get("reason") or "")
    return table
