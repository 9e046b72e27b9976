"""The CLI on the bus: connecting (bounded and quiet), publishing claims (waiting on a full tenant backlog),
reading statuses through a consumer of its own (what a tenant's credential allows).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import secrets
import time
import uuid
from pathlib import Path
from typing import Any

import typer
import yaml
from rich.table import Table

from services.cli.common import Refused, Unreachable, _settings, err
from shared.contract import subjects
from shared.settings import BrokerSettings

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


def _claim_documents(path: Path, tenant: str | None) -> list[dict[str, Any]]:
    try:
        documents = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    except (OSError, yaml.YAMLError) as error:
        err.print(f"{path}: cannot read claims: {error}")
        raise typer.Exit(1) from None
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
        metadata["namespace"] = metadata.get("namespace") or tenant or "default"
        out.append({**document, "metadata": metadata})
    if not out:
        err.print(f"{path}: no ResourceClaim in it: nothing was submitted")
        raise typer.Exit(2)
    return out


async def _publish_claims(url: str, claims: list[dict[str, Any]], priority: int | None) -> list[tuple[str, str]]:
    for document in claims:
        _own_tenant_only(url, str(document["metadata"]["namespace"]))
    nc = await _connect(url)
    # Ids unique to this invocation: a retry inside it is deduplicated, a later `submit` of the same file is
    # a new submission (the broker ignores it while the claim waits or runs, and takes it once it ended).
    run = uuid.uuid4().hex[:12]
    progress = _Progress(len(claims))
    try:
        js = nc.jetstream()
        sent: list[tuple[str, str]] = []
        for document in claims:
            progress.step(len(sent))
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
        progress.done(len(sent))
        await nc.close()


class _Progress:
    """A long submit says how far it got, once a second, on stderr when that is a terminal (a script's
    output stays the one line per claim)."""

    EVERY_S = 1.0

    def __init__(self, total: int) -> None:
        self.total, self.shown, self.started = total, False, time.monotonic()
        self.next = self.started + self.EVERY_S

    def step(self, sent: int) -> None:
        if err.is_terminal and time.monotonic() >= self.next:
            err.print(f"\rsubmitted {sent:,} of {self.total:,}", end="")
            self.shown, self.next = True, time.monotonic() + self.EVERY_S

    def done(self, sent: int) -> None:
        if self.shown:
            err.print(f"\rsubmitted {sent:,} of {self.total:,} in {time.monotonic() - self.started:.1f}s")


async def read_statuses(url: str, tenant: str = "*", name: str = "*") -> list[dict[str, Any]]:
    """The newest status of every matching claim, from the status stream, through a consumer of this
    reader's own: the one way to read statuses that a tenant's bus credential allows (bus_auth)."""
    from shared.contract import bus_auth

    own = bus_auth.tenant_of_user(bus_auth.user_of(url) or "")
    if own is not None and tenant == "*":
        tenant = own
    _own_tenant_only(url, tenant)
    latest = await last_per_subject(url, subjects.STATUS_STREAM,
                                    bus_auth.status_filter(tenant, name if name != "*" else ">"))
    return sorted((json.loads(data) for data in latest.values()), key=lambda s: (s["namespace"], s["name"]))


async def last_per_subject(url: str, stream: str, wanted: str) -> dict[str, bytes]:
    """The last message of each subject matching `wanted` in `stream`, read through a consumer of this
    reader's own (created on the subject that names its filter, so a credential's permission can limit it)."""
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

    from shared.contract import bus_auth

    shown = bus_auth.redact(url)
    nc = await _connect(url)
    try:
        latest: dict[str, bytes] = {}
        done = asyncio.Event()

        async def on_message(message: Any) -> None:
            latest[message.subject] = message.data
            if message.metadata.num_pending == 0:
                done.set()

        deliver = nc.new_inbox()
        sub = await nc.subscribe(deliver, cb=on_message)
        try:
            consumer = f"cli-{secrets.token_hex(8)}"
            config = ConsumerConfig(name=consumer, deliver_subject=deliver, filter_subject=wanted,
                                    deliver_policy=DeliverPolicy.LAST_PER_SUBJECT, ack_policy=AckPolicy.NONE,
                                    inactive_threshold=5.0, mem_storage=True)  # gone 5 s after this read
            try:
                reply = await nc.request(bus_auth.consumer_create_subject(stream, consumer, wanted),
                                         json.dumps({"stream_name": stream, "config": config.as_dict()}).encode(),
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
                return {}
            await asyncio.wait_for(done.wait(), 30)
        finally:
            await sub.unsubscribe()
        return latest
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
