"""The bus asks who is there: `up`'s embedded nats-server with an account per tenant from the ledger, the
services on identities of their own, revocation at once, a tenant's backlog bounded on the bus, and what one
tenant does on the bus costing only itself (consumers, connections, subscriptions, reply and delivery
subjects)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import nats
import pytest
import yaml
from nats.aio.client import Client
from nats.js.api import ConsumerConfig, DeliverPolicy
from nats.js.errors import APIError, BadRequestError

from services.admin_api.app import create_app
from services.bus.authority import Provisioner
from services.bus.connection import connect
from services.bus.embedded import EmbeddedNats
from services.bus.publish import encode
from services.bus.streams import BACKLOG_FULL_CODE, ensure_streams
from services.cli import read_statuses
from services.runtime.stack import Stack, running_stack
from shared.contract import bus_auth, subjects
from shared.ledger.engine import sessions
from shared.ledger.tokens import create_token
from shared.settings import BrokerSettings
from tests.builders import a_claim
from tests.e2e.test_cli import run

pytestmark = pytest.mark.e2e

WAIT_S = 10.0
CAPS = {"tenant_connections": 4, "tenant_subscriptions": 16, "tenant_consumers": 4}
MAX_CONSUMERS = 10026  # JetStream's "maximum consumers limit reached"
STREAM_NOT_FOUND = 10059


@dataclass
class Connection:
    """A client and what the server told it: permission refusals arrive asynchronously, as errors."""

    nc: Client = field(default_factory=Client)
    errors: list[str] = field(default_factory=list)
    refused: asyncio.Event = field(default_factory=asyncio.Event)
    lost: asyncio.Event = field(default_factory=asyncio.Event)
    closed: asyncio.Event = field(default_factory=asyncio.Event)

    async def open(self, url: str, **options: Any) -> Connection:
        async def error(e: Exception) -> None:
            self.errors.append(str(e))
            if "violation" in str(e).lower():
                self.refused.set()

        async def disconnected() -> None:
            self.lost.set()

        async def closed() -> None:
            self.closed.set()

        await self.nc.connect(url, error_cb=error, disconnected_cb=disconnected, closed_cb=closed,
                              **bus_auth.client_options(url), **options)
        return self

    async def refusal(self) -> str:
        await asyncio.wait_for(self.refused.wait(), WAIT_S)
        self.refused.clear()
        return self.errors[-1]


class Inbox:
    """What arrives on some subjects of one connection, in order; `reached`: the subscriptions it came on
    (a push consumer's delivery carries the subject it was stored under, not its deliver subject)."""

    def __init__(self) -> None:
        self.messages: list[tuple[str, bytes]] = []
        self.reached: set[str] = set()
        self.arrived = asyncio.Event()

    async def watch(self, nc: Client, *wanted: str) -> Inbox:
        def on(subject: str) -> Any:
            async def on_message(message: Any) -> None:
                self.messages.append((message.subject, message.data))
                self.reached.add(subject)
                self.arrived.set()

            return on_message

        for subject in wanted:
            await nc.subscribe(subject, cb=on(subject))
        await nc.flush()
        return self

    async def first(self) -> tuple[str, bytes]:
        while not self.messages:
            self.arrived.clear()
            await asyncio.wait_for(self.arrived.wait(), WAIT_S)
        return self.messages[0]


async def _stack(tmp_path: Path, services: tuple[str, ...], **caps: int) -> AsyncIterator[Stack]:
    settings = BrokerSettings(data_dir=tmp_path / "data", inventory=[], bus_auth_poll_interval=0.05,
                              **{**CAPS, **caps})
    async with running_stack(settings, services=services) as running:
        yield running


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[Stack]:
    async for running in _stack(tmp_path, ("watcher", "allocator")):
        yield running


@pytest.fixture
async def quiet_stack(tmp_path: Path) -> AsyncIterator[Stack]:
    """No allocator: what reaches the claims stream stays there to be counted."""
    async for running in _stack(tmp_path, (), tenant_consumers=16):
        yield running


async def _api(stack: Stack) -> AsyncIterator[httpx.AsyncClient]:
    """The admin API of this stack (in process), applying credential changes to its server as `up` does."""
    assert stack.authority is not None
    token = await create_token(sessions(stack.engine), "admin", None, actor="test")
    app = create_app(stack.engine, stack.authority.apply)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api",
                                 headers={"Authorization": f"Bearer {token}"}) as client:
        yield client


@pytest.fixture
async def api(stack: Stack) -> AsyncIterator[httpx.AsyncClient]:
    async for client in _api(stack):
        yield client


@pytest.fixture
async def quiet_api(quiet_stack: Stack) -> AsyncIterator[httpx.AsyncClient]:
    async for client in _api(quiet_stack):
        yield client


async def credential(api: httpx.AsyncClient, stack: Stack, **body: Any) -> tuple[int, str]:
    response = await api.post("/v1/credentials", json=body)
    assert response.status_code == 201, response.text
    created = response.json()
    assert "password" in created and created["inboxPrefix"] == f"_I.{created['user']}"
    return created["id"], bus_auth.url_with_user(stack.nats_url, created["user"], created["password"])


async def statuses_of(url: str, tenant: str = "*") -> list[tuple[str, str, str]]:
    return [(s["namespace"], s["name"], s["state"]) for s in await read_statuses(url, tenant)]


async def eventually(read: Any, expected: Any) -> Any:
    """`read()` until it returns `expected` (a decision arrives on its own time), within WAIT_S."""
    seen = None
    for _ in range(int(WAIT_S / 0.05)):
        if (seen := await read()) == expected:
            return seen
        await asyncio.sleep(0.05)
    raise AssertionError(f"still {seen!r}, expected {expected!r}")


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
            assert ack.stream == subjects.CLAIMS_STREAM  # the broker's stream, from the tenant's account

        # another tenant's subjects: submit, release, its statuses; the broker's statuses
        for subject in (subjects.submit("research"), subjects.release("research")):
            await vision.nc.publish(subject, b"{}")
            assert f'publish to "{subject}"' in await vision.refusal()
        for wanted in (subjects.STATUS_ALL, bus_auth.status_filter("research")):
            await vision.nc.subscribe(wanted)
            assert "subscription" in await vision.refusal()

        # its own status stream: no stream API but reading; the broker's streams are not in its account
        own = subjects.STATUS_STREAM
        for subject in (f"$JS.API.STREAM.DELETE.{own}", f"$JS.API.STREAM.PURGE.{own}", f"$JS.API.STREAM.UPDATE.{own}",
                        f"$JS.API.STREAM.MSG.DELETE.{own}", "$JS.API.STREAM.CREATE.MINE",
                        f"$JS.API.STREAM.INFO.{subjects.CLAIMS_STREAM}"):
            await vision.nc.publish(subject, b"{}")
            assert "violation" in await vision.refusal(), subject
        with pytest.raises(APIError) as absent:
            await vision.nc.jetstream().add_consumer(subjects.CLAIMS_STREAM, ConsumerConfig(name="allocator"))
        assert absent.value.err_code == STREAM_NOT_FOUND

        # its own statuses, read the way the CLI reads them, and none of the other tenant's
        for url, tenant in ((vision_url, "vision"), (research_url, "research")):
            await eventually(lambda url=url: statuses_of(url), [(tenant, "one", "Allocated")])
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


async def test_a_consumer_flood_costs_only_the_tenant_that_floods(stack: Stack, api: httpx.AsyncClient,
                                                                  tmp_path: Path) -> None:
    """The issue's attack: consumers until the server refuses. The cap is the flooding tenant's account's;
    `status` and `submit --wait` read without consumers, for everyone, the flooder included."""
    _, flood_url = await credential(api, stack, tenant="flood")
    _, calm_url = await credential(api, stack, tenant="calm")
    assert stack.allocator is not None and await stack.allocator.wait_for_inventory(WAIT_S)
    flood = await Connection().open(flood_url)
    try:
        js, made = flood.nc.jetstream(), 0
        with pytest.raises(BadRequestError) as refused:
            for made in range(1000):  # noqa: B007 - how many were made is the point
                await js.add_consumer(subjects.STATUS_STREAM, ConsumerConfig(durable_name=f"c{made}"))
        assert refused.value.err_code == MAX_CONSUMERS and made == CAPS["tenant_consumers"]

        for url, tenant in ((calm_url, "calm"), (flood_url, "flood")):
            claims = tmp_path / f"{tenant}.yaml"
            claims.write_text(yaml.safe_dump(a_claim("job", tenant).request().document()))
            code, out, err = await run("--nats", url, "submit", str(claims), "--wait", "20")
            assert code == 0, err
            assert [(s["namespace"], s["name"], s["state"]) for s in map(json.loads, out.splitlines())] == [
                (tenant, "job", "Allocated")]
            code, out, err = await run("--nats", url, "status", "--output", "json")
            assert code == 0 and [s["name"] for s in json.loads(out)] == ["job"], err
        code, out, err = await run("--nats", stack.admin_url, "status", "--output", "json")
        assert code == 0 and {(s["namespace"], s["name"]) for s in json.loads(out)} == {("calm", "job"),
                                                                                        ("flood", "job")}, err

        await js.delete_consumer(subjects.STATUS_STREAM, "c0")  # its own, to delete as it likes
        await js.add_consumer(subjects.STATUS_STREAM, ConsumerConfig(durable_name="again"))
    finally:
        await flood.nc.close()


async def test_replies_and_deliveries_a_tenant_aims_elsewhere_stay_in_its_account(
        quiet_stack: Stack, quiet_api: httpx.AsyncClient) -> None:
    """A consumer's deliver subject and a request's reply subject are whatever the tenant names: aimed at
    another tenant's submit subject, an alert, an inventory subject or another identity's inbox, they reach
    nothing and no stream of the broker's, while the same aimed at its own inbox arrives."""
    stack, api = quiet_stack, quiet_api
    _, mallory_url = await credential(api, stack, tenant="mallory")
    _, victim_url = await credential(api, stack, tenant="victim")
    victim_user = bus_auth.user_of(victim_url)
    targets = [subjects.submit("victim"), subjects.alert("critical", "evil", "victim"),
               subjects.alert("warning", "evil"), subjects.inventory("evil-node"), f"_I.{victim_user}.evil",
               "_I.service.allocator.evil"]
    admin = await Connection().open(stack.admin_url)
    victim = await Connection().open(victim_url)
    mallory = await Connection().open(mallory_url)
    try:
        watched = await Inbox().watch(admin.nc, *[t for t in targets if not t.startswith(f"_I.{victim_user}")])
        victims_inbox = await Inbox().watch(victim.nc, f"_I.{victim_user}.>")
        await admin.nc.jetstream().publish(subjects.status("mallory", "c1"), b'{"namespace": "mallory"}')
        js, own = mallory.nc.jetstream(), f"_I.{bus_auth.user_of(mallory_url)}"
        for number, target in enumerate(targets):
            await js.add_consumer(subjects.STATUS_STREAM, ConsumerConfig(
                durable_name=f"aimed{number}", deliver_subject=target, deliver_policy=DeliverPolicy.ALL))
            await mallory.nc.publish(subjects.submit("mallory"), b"{}", reply=target)
            await mallory.nc.publish(f"$JS.API.STREAM.INFO.{subjects.STATUS_STREAM}", b"", reply=target)
        # the same, aimed at its own inbox, arrives: the control that the ones above were carried out (a
        # push consumer delivers to a subject someone subscribed to by its name, not through a wildcard)
        control = await Inbox().watch(mallory.nc, f"{own}.delivery", f"{own}.ack", f"{own}.info")
        await js.add_consumer(subjects.STATUS_STREAM, ConsumerConfig(
            durable_name="own", deliver_subject=f"{own}.delivery", deliver_policy=DeliverPolicy.ALL))
        await mallory.nc.publish(subjects.submit("mallory"), b"{}", reply=f"{own}.ack")
        await mallory.nc.publish(f"$JS.API.STREAM.INFO.{subjects.STATUS_STREAM}", b"", reply=f"{own}.info")
        for _ in range(int(WAIT_S / 0.05)):
            if control.reached == {f"{own}.delivery", f"{own}.ack", f"{own}.info"}:
                break
            await asyncio.sleep(0.05)
        assert control.reached == {f"{own}.delivery", f"{own}.ack", f"{own}.info"}
        await admin.nc.flush()
        await victim.nc.flush()
        assert watched.messages == [] and victims_inbox.messages == []

        broker = admin.nc.jetstream()
        for stream in (subjects.CLAIMS_STREAM, subjects.INVENTORY_STREAM, subjects.ALERTS_STREAM):
            held = (await broker.stream_info(stream, subjects_filter=">")).state.subjects or {}
            assert not set(held) & set(targets), (stream, held)
        claims = (await broker.stream_info(subjects.CLAIMS_STREAM, subjects_filter=">")).state.subjects
        assert claims == {subjects.submit("mallory"): len(targets) + 1}  # its own publishes, nothing else
    finally:
        for connection in (admin, victim, mallory):
            await connection.nc.close()


async def test_a_tenant_has_so_many_connections_and_subscriptions_and_others_do_not_notice(
        stack: Stack, api: httpx.AsyncClient) -> None:
    _, vision_url = await credential(api, stack, tenant="vision")
    _, research_url = await credential(api, stack, tenant="research")
    opened = [await Connection().open(vision_url) for _ in range(CAPS["tenant_connections"])]
    research = await Connection().open(research_url)
    try:
        with pytest.raises(nats.errors.Error, match="maximum account active connections exceeded"):
            await nats.connect(vision_url, allow_reconnect=False, connect_timeout=2, max_reconnect_attempts=0)
        other = await Connection().open(research_url)  # another tenant's account: its own count
        await other.nc.close()

        crowded = opened[0]
        inbox = f"_I.{bus_auth.user_of(vision_url)}"
        for number in range(CAPS["tenant_subscriptions"] + 1):
            await crowded.nc.subscribe(f"{inbox}.s{number}")
        await asyncio.wait_for(crowded.closed.wait(), WAIT_S)  # nats-py closes on the server's error
        assert "maximum subscriptions exceeded" in str(crowded.nc.last_error).lower()
        for number in range(CAPS["tenant_subscriptions"]):  # another connection's own count, and another tenant's
            await opened[1].nc.subscribe(f"{inbox}.t{number}")
            await research.nc.subscribe(f"_I.{bus_auth.user_of(research_url)}.t{number}")
        await opened[1].nc.flush()
        await research.nc.flush()
        assert opened[1].nc.is_connected and research.nc.is_connected
    finally:
        for connection in (*opened, research):
            await connection.nc.close()


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


async def test_alerts_credentials_read_every_tenant_or_one_and_publish_nothing(
        stack: Stack, api: httpx.AsyncClient) -> None:
    _, fleet_url = await credential(api, stack, role="alerts")
    _, vision_url = await credential(api, stack, role="alerts", tenant="vision")
    fleet = await Connection().open(fleet_url)
    vision = await Connection().open(vision_url)
    admin = await Connection().open(stack.admin_url)
    try:
        everything = await Inbox().watch(fleet.nc, subjects.ALERTS_ALL)
        visions = await Inbox().watch(vision.nc, subjects.alerts_of("vision"))
        # A new credential's account reaches the alerts once nats-server has reloaded what the bus authority
        # wrote (a loaded machine takes a moment): probe until both readers hear, then start from nothing.
        for _ in range(int(WAIT_S / 0.1)):
            await admin.nc.publish(subjects.alert("info", "probe", "vision"), b"{}")
            await asyncio.sleep(0.1)
            if visions.messages and everything.messages:
                break
        for connection in (admin, fleet, vision):
            await connection.nc.flush()  # every probe delivered before the readers are emptied
        everything.messages.clear()
        visions.messages.clear()
        sent = [subjects.alert("warning", "test", "research"), subjects.alert("critical", "node-lost"),
                subjects.alert("warning", "test", "vision")]
        for subject in sent:  # in this order: vision's last, so once it arrived the others had their chance
            await admin.nc.publish(subject, b"{}")
        await visions.first()
        for _ in range(int(WAIT_S / 0.05)):
            if len(everything.messages) == len(sent):
                break
            await asyncio.sleep(0.05)
        assert [s for s, _ in everything.messages] == sent
        assert [s for s, _ in visions.messages] == [subjects.alert("warning", "test", "vision")]

        await vision.nc.subscribe(subjects.ALERTS_ALL)
        assert "violation" in await vision.refusal()
        for reader in (fleet, vision):
            await reader.nc.publish(subjects.submit("vision"), b"{}")
            assert "violation" in await reader.refusal()
            await reader.nc.subscribe(subjects.STATUS_ALL)
            assert "violation" in await reader.refusal()
    finally:
        for connection in (fleet, vision, admin):
            await connection.nc.close()


async def test_a_credential_made_after_a_decision_reads_it_and_a_copy_never_replaces_a_newer_status(
        stack: Stack, api: httpx.AsyncClient) -> None:
    assert stack.allocator is not None and await stack.allocator.wait_for_inventory(WAIT_S)
    admin = await Connection().open(stack.admin_url)
    try:
        js = admin.nc.jetstream()
        await js.publish(subjects.submit("late"), encode(a_claim("early", "late").request().document()))
        await eventually(lambda: statuses_of(stack.admin_url, "late"), [("late", "early", "Allocated")])

        _, late_url = await credential(api, stack, tenant="late")  # its account and stream are made now
        assert await statuses_of(late_url) == [("late", "early", "Allocated")]

        # the tenant's stream now holds a status newer than the broker's last (removed there), and is
        # copied into again: the copy is refused, the newer status stays
        newer = {**(await read_statuses(stack.admin_url, "late"))[0], "state": "Released", "sequence": 99}
        ack = await js.publish(subjects.status("late", "early"), encode(newer))
        await eventually(lambda: statuses_of(late_url), [("late", "early", "Released")])
        await js.delete_msg(subjects.STATUS_STREAM, ack.seq)
        assert await statuses_of(stack.admin_url, "late") == [("late", "early", "Allocated")]
        info = json.loads((await admin.nc.request(bus_auth.provision_subject("late", "info"), b"")).data)
        config = {**info["config"], "metadata": {}}  # as if never copied into
        assert "error" not in json.loads((await admin.nc.request(bus_auth.provision_subject("late", "update"),
                                                                 json.dumps(config).encode())).data)
        assert stack.authority is not None
        provisioner = Provisioner(stack.admin_url, stack.authority.limits)
        try:
            await provisioner.provision("late")
        finally:
            await provisioner.close()
        assert await statuses_of(late_url) == [("late", "early", "Released")]
        info = json.loads((await admin.nc.request(bus_auth.provision_subject("late", "info"), b"")).data)
        assert bus_auth.BACKFILLED in info["config"]["metadata"]
    finally:
        await admin.nc.close()


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
        await nc.publish(subjects.submit("anyone"), b"{}")  # anything, as anyone: no account but the broker's
        assert (await nc.jetstream().stream_info(subjects.CLAIMS_STREAM)).config.name == subjects.CLAIMS_STREAM
        await nc.close()


async def test_a_data_folder_of_a_version_before_accounts_keeps_what_waited_on_the_bus(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Its streams are in the server's global account, which no client enters any more: they move to the
    broker's account, with the claim that waited on the bus and the statuses already published."""
    data = tmp_path / "data"
    before = EmbeddedNats(data / "nats", accounts="")  # no accounts: every client in the global account
    nc = await connect(await asyncio.to_thread(before.start), name="older-version")
    try:
        js = nc.jetstream()
        await ensure_streams(js)
        await js.publish(subjects.submit("vision"), encode(a_claim("waiting", "vision").request().document()))
        old = {"namespace": "vision", "name": "done", "state": "Released", "sequence": 3}
        await js.publish(subjects.status("vision", "done"), encode(old))
    finally:
        await nc.close()
        before.stop()
    settings = BrokerSettings(data_dir=data, inventory=[], bus_auth_poll_interval=0.05, **CAPS)
    with caplog.at_level(logging.WARNING, logger="claimbroker.nats"):
        async with running_stack(settings, services=("watcher", "allocator")) as stack:
            assert await eventually(lambda: statuses_of(stack.admin_url, "vision"), [
                ("vision", "done", "Released"), ("vision", "waiting", "Allocated")])
    assert "moved from the global account to account CLAIMBROKER" in caplog.text
    assert not (data / "nats" / "js" / "jetstream" / "$G").exists()


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
    includes, a SIGHUP to the pid in its pid file, and the tenant's status stream made through the server."""
    from services.bus.authority import BusAuthority, FileTarget, own_identities
    from shared.ledger.bus_credentials import add_credential, revoke_credential
    from shared.ledger.engine import create_engine, migrate

    db = f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}"
    await migrate(db)
    engine = create_engine(db)
    own = own_identities({"admin": "secret-admin"})
    limits = bus_auth.TenantLimits()
    server = EmbeddedNats(tmp_path / "nats", accounts=bus_auth.render_accounts(own, [], limits))
    url = await asyncio.to_thread(server.start)
    admin_url = bus_auth.url_with_user(url, bus_auth.admin_user(), "secret-admin")
    try:
        assert server.process is not None
        setup = await connect(admin_url, name="setup")
        await ensure_streams(setup.jetstream())
        await setup.close()
        pid_file = tmp_path / "nats.pid"
        pid_file.write_text(str(server.process.pid))
        target = FileTarget(tmp_path / "nats" / "auth.conf", pid_file, settle=0.3)  # one server, reloading at once
        authority = BusAuthority(engine, own, target,
                                 poll_interval=0.05, limits=limits, provisioner=Provisioner(admin_url, limits))
        following = asyncio.create_task(authority.run())  # provisions once the server reloaded
        async with sessions(engine)() as session, session.begin():
            password, row = await add_credential(session, "tenant", "vision", actor="test")
        tenant_url = bus_auth.url_with_user(url, row.user, password)
        async def provisioned() -> bool:
            return "vision" in authority.provisioned

        await eventually(provisioned, True)
        assert await read_statuses(tenant_url) == []  # its stream is there, and empty
        async with sessions(engine)() as session, session.begin():
            await revoke_credential(session, row.id, "test")
        await authority.apply()

        async def refused() -> bool:
            try:
                nc = await nats.connect(tenant_url, allow_reconnect=False, connect_timeout=2, max_reconnect_attempts=0)
            except nats.errors.Error as error:
                return "Authorization Violation" in str(error)
            await nc.close()
            return False

        await eventually(refused, True)  # the server reloads on its own time after the signal
        following.cancel()
    finally:
        server.stop()
        await engine.dispose()
