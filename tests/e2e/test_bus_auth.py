"""The bus asks who is there: `up`'s embedded nats-server with per-tenant credentials from the ledger, the
services on identities of their own, revocation at once, and a tenant's backlog bounded on the bus."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import nats
import pytest
from nats.aio.client import Client
from nats.js.errors import APIError

from services.admin_api.app import create_app
from services.cli import read_statuses
from services.natsio import BACKLOG_FULL_CODE, encode
from services.stack import Stack, running_stack
from shared.contract import bus_auth, subjects
from shared.ledger.engine import sessions
from shared.ledger.tokens import create_token
from shared.settings import BrokerSettings
from tests.builders import a_claim

pytestmark = pytest.mark.e2e

WAIT_S = 10.0


@dataclass
class Connection:
    """A client and what the server told it: permission refusals arrive asynchronously, as errors."""

    nc: Client = field(default_factory=Client)
    errors: list[str] = field(default_factory=list)
    refused: asyncio.Event = field(default_factory=asyncio.Event)
    lost: asyncio.Event = field(default_factory=asyncio.Event)

    async def open(self, url: str, **options: Any) -> Connection:
        async def error(e: Exception) -> None:
            self.errors.append(str(e))
            if "violation" in str(e).lower():
                self.refused.set()

        async def disconnected() -> None:
            self.lost.set()

        await self.nc.connect(url, error_cb=error, disconnected_cb=disconnected, **bus_auth.client_options(url),
                              **options)
        return self

    async def refusal(self) -> str:
        await asyncio.wait_for(self.refused.wait(), WAIT_S)
        self.refused.clear()
        return self.errors[-1]


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[Stack]:
    settings = BrokerSettings(data_dir=tmp_path / "data", inventory=[], bus_auth_poll_interval=0.05)
    async with running_stack(settings, services=("watcher", "allocator")) as running:
        yield running


@pytest.fixture
async def api(stack: Stack) -> AsyncIterator[httpx.AsyncClient]:
    """The admin API of this stack (in process), applying credential changes to its server as `up` does."""
    assert stack.authority is not None
    token = await create_token(sessions(stack.engine), "admin", None, actor="test")
    app = create_app(stack.engine, stack.authority.apply)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api",
                                 headers={"Authorization": f"Bearer {token}"}) as client:
        yield client


async def credential(api: httpx.AsyncClient, stack: Stack, **body: Any) -> tuple[int, str]:
    response = await api.post("/v1/credentials", json=body)
    assert response.status_code == 201, response.text
    created = response.json()
    assert "password" in created and created["inboxPrefix"] == f"_I.{created['user']}"
    return created["id"], bus_auth.url_with_user(stack.nats_url, created["user"], created["password"])


async def test_a_tenant_credential_reaches_its_own_claims_only(stack: Stack, api: httpx.AsyncClient) -> None:
    _, vision_url = await credential(api, stack, tenant="vision")
    _, research_url = await credential(api, stack, tenant="research")
    assert stack.allocator is not None and await stack.allocator.wait_for_inventory(WAIT_S)
    vision = await Connection().open(vision_url)
    research = await Connection().open(research_url)
    try:
        for connection, tenant in ((vision, "vision"), (research, "research")):
            ack = await connection.nc.jetstream().publish(
                subjects.submit(tenant), encode(a_claim("one", tenant).request().document()))
            assert ack.stream == subjects.CLAIMS_STREAM

        # another tenant's subjects: submit, release, its statuses (plain or through a consumer)
        for subject in (subjects.submit("research"), subjects.release("research")):
            await vision.nc.publish(subject, b"{}")
            assert f'publish to "{subject}"' in await vision.refusal()
        await vision.nc.subscribe(subjects.STATUS_ALL)
        assert "subscription" in await vision.refusal()
        other = bus_auth.consumer_create_subject(subjects.STATUS_STREAM, "mine", bus_auth.status_filter("research"))
        await vision.nc.publish(other, b"{}")
        assert "violation" in await vision.refusal()

        # what manages the bus: streams, the services' consumers, another's consumers
        claims, statuses = subjects.CLAIMS_STREAM, subjects.STATUS_STREAM
        notifier = bus_auth.consumer_create_subject(statuses, "notifier", bus_auth.status_filter("vision"))
        for subject in (f"$JS.API.STREAM.DELETE.{claims}", f"$JS.API.STREAM.PURGE.{statuses}",
                        f"$JS.API.CONSUMER.DELETE.{claims}.allocator", f"$JS.API.CONSUMER.CREATE.{claims}.allocator",
                        notifier, "$JS.API.STREAM.NAMES", f"$JS.API.STREAM.INFO.{claims}"):
            await vision.nc.publish(subject, b"{}")
            assert "violation" in await vision.refusal(), subject

        # its own statuses, read the way the CLI reads them, and none of the other tenant's
        for url, tenant in ((vision_url, "vision"), (research_url, "research")):
            seen: list[dict[str, Any]] = []
            for _ in range(200):
                if seen := await read_statuses(url):
                    break
                await asyncio.sleep(0.05)  # polling the stream, as `submit --wait` does
            assert [(s["namespace"], s["name"], s["state"]) for s in seen] == [(tenant, "one", "Allocated")]
    finally:
        await vision.nc.close()
        await research.nc.close()
    admin = await Connection().open(stack.admin_url)
    try:
        assert (await admin.nc.jetstream().stream_info(subjects.CLAIMS_STREAM)).config.name  # untouched
        audit = [e["entity"] for e in (await api.get("/v1/audit")).json()]
        assert "credential/1" in audit and "credential/2" in audit
    finally:
        await admin.nc.close()


async def test_a_revoked_credential_loses_its_connection_and_is_refused_at_once(
    stack: Stack, api: httpx.AsyncClient
) -> None:
    credential_id, url = await credential(api, stack, tenant="vision")
    live = await Connection().open(url, max_reconnect_attempts=0)
    assert (await api.delete(f"/v1/credentials/{credential_id}")).status_code == 204
    await asyncio.wait_for(live.lost.wait(), WAIT_S)  # closed by the server's reload, before the 204
    with pytest.raises(nats.errors.Error, match="Authorization Violation"):
        await nats.connect(url, allow_reconnect=False, connect_timeout=2, max_reconnect_attempts=0)
    listed = {c["id"]: c for c in (await api.get("/v1/credentials")).json()}
    assert listed[credential_id]["revokedAt"] is not None and "password" not in listed[credential_id]
    assert (await api.delete("/v1/credentials/99")).status_code == 404


async def test_no_credential_or_a_wrong_one_is_refused(stack: Stack) -> None:
    for url in (stack.nats_url, bus_auth.url_with_user(stack.nats_url, bus_auth.admin_user(), "guess")):
        with pytest.raises(nats.errors.Error, match="Authorization Violation"):
            await nats.connect(url, allow_reconnect=False, connect_timeout=2, max_reconnect_attempts=0)


async def test_an_alerts_credential_reads_alerts_and_publishes_nothing(stack: Stack, api: httpx.AsyncClient) -> None:
    _, url = await credential(api, stack, role="alerts")
    reader = await Connection().open(url)
    try:
        seen: asyncio.Queue[str] = asyncio.Queue()

        async def on_alert(message: Any) -> None:
            await seen.put(message.subject)

        await reader.nc.subscribe(subjects.ALERTS_ALL, cb=on_alert)
        await reader.nc.flush()
        admin = await Connection().open(stack.admin_url)
        await admin.nc.publish(subjects.alert("warning", "test"), b"{}")
        await admin.nc.close()
        assert await asyncio.wait_for(seen.get(), WAIT_S) == subjects.alert("warning", "test")
        await reader.nc.publish(subjects.submit("vision"), b"{}")
        assert "violation" in await reader.refusal()
        await reader.nc.subscribe(subjects.STATUS_ALL)
        assert "violation" in await reader.refusal()
    finally:
        await reader.nc.close()


async def test_each_service_has_just_its_subjects(stack: Stack) -> None:
    """The stack runs on these identities (the other tests show it works); here, what they may not do."""
    assert set(stack.service_urls) == set(bus_auth.SERVICES)
    watcher = await Connection().open(stack.service_urls["watcher"])
    try:
        for subject in (subjects.submit("vision"), subjects.status("vision", "one")):
            await watcher.nc.publish(subject, b"{}")
            assert "violation" in await watcher.refusal()
        await watcher.nc.subscribe(subjects.STATUS_ALL)
        assert "violation" in await watcher.refusal()
    finally:
        await watcher.nc.close()


async def test_insecure_leaves_the_bus_open(tmp_path: Path) -> None:
    settings = BrokerSettings(data_dir=tmp_path / "data", inventory=[], insecure=True)
    async with running_stack(settings, services=()) as stack:
        assert stack.authority is None and stack.admin_url == stack.nats_url
        nc = await nats.connect(stack.nats_url)
        await nc.close()


async def test_a_tenant_backlog_on_the_bus_is_bounded_per_tenant(tmp_path: Path) -> None:
    """No allocator takes them: the fourth submission of one tenant is refused, another tenant's goes in."""
    settings = BrokerSettings(data_dir=tmp_path / "data", inventory=[], tenant_backlog=3)
    async with running_stack(settings, services=()) as stack:
        admin = await Connection().open(stack.admin_url)
        js = admin.nc.jetstream()
        try:
            for n in range(3):
                await js.publish(subjects.submit("flood"), json.dumps({"n": n}).encode())
            with pytest.raises(APIError) as refused:
                await js.publish(subjects.submit("flood"), b"{}")
            assert refused.value.err_code == BACKLOG_FULL_CODE
            await js.publish(subjects.release("flood"), b"{}")  # its releases are a backlog of their own
            await js.publish(subjects.submit("calm"), b"{}")
        finally:
            await admin.nc.close()


async def test_beside_an_external_server_the_file_follows_the_ledger(tmp_path: Path) -> None:
    """`serve bus-auth`'s parts: the ledger's credentials rendered into the file an external server
    includes, and a SIGHUP to the pid in its pid file."""
    from services.bus_authority import BusAuthority, FileTarget, own_identities
    from services.natsio import EmbeddedNats
    from shared.ledger.bus_credentials import add_credential, revoke_credential
    from shared.ledger.engine import create_engine, migrate

    db = f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}"
    await migrate(db)
    engine = create_engine(db)
    own = own_identities({"admin": "secret-admin"})
    server = EmbeddedNats(tmp_path / "nats", authorization=bus_auth.render_authorization(own))
    url = await asyncio.to_thread(server.start)
    try:
        assert server.process is not None
        pid_file = tmp_path / "nats.pid"
        pid_file.write_text(str(server.process.pid))
        authority = BusAuthority(engine, own, FileTarget(tmp_path / "nats" / "auth.conf", pid_file))
        async with sessions(engine)() as session, session.begin():
            password, row = await add_credential(session, "tenant", "vision", actor="test")
        reloaded = (tmp_path / "nats" / "nats-server.log").read_bytes().count(b"Reloaded server configuration")
        await authority.apply()
        tenant_url = bus_auth.url_with_user(url, row.user, password)
        for _ in range(200):  # the server reloads on its own time after the signal
            log = (tmp_path / "nats" / "nats-server.log").read_bytes()
            if log.count(b"Reloaded server configuration") > reloaded:
                break
            await asyncio.sleep(0.02)
        nc = await nats.connect(tenant_url, allow_reconnect=False, **bus_auth.client_options(tenant_url))
        await nc.close()
        async with sessions(engine)() as session, session.begin():
            await revoke_credential(session, row.id, "test")
        await authority.apply()
        for _ in range(200):
            try:
                nc = await nats.connect(tenant_url, allow_reconnect=False, connect_timeout=2, max_reconnect_attempts=0)
            except nats.errors.Error as error:
                assert "Authorization Violation" in str(error)
                break
            await nc.close()
            await asyncio.sleep(0.02)
        else:
            raise AssertionError("the revoked credential still connects")
    finally:
        server.stop()
        await engine.dispose()
