"""Message ids count per tenant and per kind of message, and a release of a claim the broker never knew leaves
nothing for good and is answered: against a real nats-server and real SQLite and PostgreSQL ledgers.

JetStream's duplicate window is one per stream and keyed on Nats-Msg-Id alone, so the claims stream keeps
it at its 100 ms floor and the ledger's inbox (per tenant and kind) is what makes a re-sent message change
nothing. A publish JetStream drops inside that window says so in its acknowledgement; `stored` publishes
until it is stored, as a client that sees `duplicate` would."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path
from typing import Any

import pytest

from services.bus.connection import connect
from services.bus.consumer import PullConsumer
from services.bus.embedded import EmbeddedNats
from services.bus.publish import publish_json, publish_pipelined
from services.bus.streams import ensure_streams
from shared.contract import subjects
from shared.ledger.schema import Claim, EarlyRelease, InboxMessage
from tests.e2e.helpers import FakeClock, statuses
from tests.e2e.test_allocator_semantics import broker, claim
from tests.e2e.test_bus_auth import _api, _stack, credential, statuses_of
from tests.e2e.test_cli import run

pytestmark = pytest.mark.e2e


async def stored(js: Any, subject: str, payload: Any, msg_id: str, timeout: float = 10.0) -> Any:
    """Publish until JetStream stores the message (its acknowledgement is not a duplicate's)."""
    deadline = time.monotonic() + timeout
    while True:
        ack = await publish_json(js, subject, payload, msg_id=msg_id)
        if not ack.duplicate:
            return ack
        assert time.monotonic() < deadline, f"{msg_id} was still a duplicate after {timeout}s"
        await asyncio.sleep(0.02)


async def until(condition: Any, timeout: float = 20.0, what: str = "") -> None:
    """Wait for a condition (a function, maybe async), checked every 50 ms, up to `timeout`."""
    deadline = time.monotonic() + timeout
    while not (await condition() if asyncio.iscoroutinefunction(condition) else condition()):
        assert time.monotonic() < deadline, f"not within {timeout}s: {what}"
        await asyncio.sleep(0.05)


async def pruned_twice(allocator: Any) -> None:
    """Two pruning passes that started after the caller moved the clock."""
    target = allocator.pruner.passes + 2
    await until(lambda: allocator.pruner.passes >= target, what="two pruning passes")


def a_clock() -> FakeClock:
    clock = FakeClock()
    clock.now = time.time()  # the inventory stays fresh; the test moves it past retentions
    return clock


async def test_one_tenants_id_never_hides_anothers(nats_server: EmbeddedNats, ledger_url: str, tmp_path: Path) -> None:
    async with broker(nats_server, ledger_url, tmp_path) as b:
        await b.start_allocator()
        nc = await connect(b.url, name="tenants")
        js, seen = nc.jetstream(), await statuses(nc)
        for first, second, shared_id in (("alpha", "beta", "X"), ("beta", "alpha", "Y")):  # both orders
            name = f"claim-{shared_id.lower()}"
            await stored(js, subjects.submit(first), claim(name, first), shared_id)
            await stored(js, subjects.submit(second), claim(name, second), shared_id)
            for tenant in (first, second):
                await seen.wait_for(lambda t=tenant, n=name: (t, n) in seen.latest())
        assert {key: s["state"] for key, s in seen.latest().items()} == {
            ("alpha", "claim-x"): "Allocated", ("beta", "claim-x"): "Allocated",
            ("beta", "claim-y"): "Pending", ("alpha", "claim-y"): "Pending"}  # two GPUs
        assert await b.count(InboxMessage, InboxMessage.message_id.in_(["X", "Y"])) == 4
        await nc.close()


async def test_a_release_reusing_its_submissions_id_is_applied(nats_server: EmbeddedNats, ledger_url: str,
                                                               tmp_path: Path) -> None:
    async with broker(nats_server, ledger_url, tmp_path) as b:
        await b.start_allocator()
        nc = await connect(b.url, name="tenant")
        js, seen = nc.jetstream(), await statuses(nc)
        await stored(js, subjects.submit("team"), claim("a"), "job-7")
        await seen.wait_for(lambda: ("team", "a") in seen.latest())
        await stored(js, subjects.release("team"), {"name": "a"}, "job-7")
        await seen.wait_for(lambda: seen.latest()[("team", "a")]["state"] == "Released")
        assert [s["state"] for s in seen.for_claim("team", "a")] == ["Allocated", "Released"]
        await nc.close()


async def test_a_resent_message_changes_nothing_until_its_id_is_past_retention(
        nats_server: EmbeddedNats, ledger_url: str, tmp_path: Path) -> None:
    clock, retention = a_clock(), 3600.0
    async with broker(nats_server, ledger_url, tmp_path) as b:
        allocator = await b.start_allocator(clock=clock, inbox_retention=retention, prune_interval=0.05)
        nc = await connect(b.url, name="tenant")
        js, seen = nc.jetstream(), await statuses(nc)
        await stored(js, subjects.release("team"), {"name": "a"}, "id-r")  # a release first: same id, other kind
        await stored(js, subjects.submit("team"), claim("a"), "id-r")
        await seen.wait_for(lambda: [s["state"] for s in seen.for_claim("team", "a")] == ["Released", "Allocated"])
        await stored(js, subjects.release("team"), {"name": "a"}, "id-r")  # re-sent past JetStream's window
        await stored(js, subjects.submit("team"), claim("sentinel"), "id-sentinel")
        await seen.wait_for(lambda: ("team", "sentinel") in seen.latest())
        assert [s["state"] for s in seen.for_claim("team", "a")] == ["Released", "Allocated"]  # unchanged
        assert await b.count(InboxMessage, InboxMessage.message_id == "id-r") == 2  # one per kind

        clock.now += retention - 60
        await pruned_twice(allocator)
        assert await b.count(InboxMessage) == 3  # kept until their retention
        clock.now += 120
        await pruned_twice(allocator)
        assert await b.count(InboxMessage) == 0
        await nc.close()


async def test_releases_of_unknown_claims_leave_nothing_for_good_and_are_answered(
        nats_server: EmbeddedNats, ledger_url: str, tmp_path: Path) -> None:
    clock, retention, kept = a_clock(), 3600.0, 100
    async with broker(nats_server, ledger_url, tmp_path) as b:
        allocator = await b.start_allocator(clock=clock, inbox_retention=retention, prune_interval=0.05,
                                            early_releases_per_tenant=kept, release_answer_ttl=1.0)
        nc = await connect(b.url, name="tenants")
        js, seen = nc.jetstream(), await statuses(nc)
        await ensure_streams(js, tenant_backlog=1000)  # the whole flood waits on the bus at once
        await stored(js, subjects.release("calm"), {"name": "its-own"}, "calm-1")
        await seen.wait_for(lambda: ("calm", "its-own") in seen.latest())
        names = [f"never-{i}" for i in range(1000)]
        await publish_pipelined(js, [(subjects.release("team"), {"name": n}, f"r-{n}") for n in names])

        def answered() -> list[dict[str, Any]]:
            return [s for _, s in seen.messages if s["namespace"] == "team"]

        await seen.wait_for(lambda: len(answered()) == len(names), timeout=60)
        assert sorted(s["name"] for s in answered()) == sorted(names)
        assert {(s["state"], s["sequence"], s["allocation"]) for s in answered()} == {("Released", 0, None)}
        assert "nothing to release" in answered()[0]["reason"]
        assert await b.count(Claim) == 0  # no row from nothing
        assert await b.count(EarlyRelease, EarlyRelease.tenant == "team") == kept  # the newest
        assert await b.count(EarlyRelease, EarlyRelease.tenant == "calm") == 1  # another tenant's are its own

        async def answers_expired() -> bool:  # JetStream drops each answer after its TTL: no subject left
            info = await js.stream_info(subjects.STATUS_STREAM, subjects_filter=subjects.PREFIX + ".claims.status.>")
            return not (info.state.subjects or {})

        await until(answers_expired, timeout=30, what="the answers' subjects gone from the status stream")
        clock.now += retention + 1
        await pruned_twice(allocator)
        assert await b.count(EarlyRelease) == 0 and await b.count(InboxMessage) == 0
        await nc.close()


async def test_a_release_before_its_late_submission_still_ends_released(
        nats_server: EmbeddedNats, ledger_url: str, tmp_path: Path) -> None:
    """The submission is published first, but an allocator dies holding it; the release reaches the next
    allocator first (remembered, answered), and the submission, delivered after it, ends Released."""
    async with broker(nats_server, ledger_url, tmp_path) as b:
        nc = await connect(b.url, name="tenant")
        js, seen = nc.jetstream(), await statuses(nc)
        dead = PullConsumer(nc, stream=subjects.CLAIMS_STREAM, durable="allocator",
                            subject=subjects.PREFIX + ".claims.>",
                            filter_subjects=[subjects.SUBMIT_ALL, subjects.RELEASE_ALL], ack_wait=60.0,
                            max_deliver=10, batch=1, log=logging.getLogger("test"))
        await dead.open()
        await publish_json(js, subjects.submit("team"), claim("late"), msg_id="s-late")
        held = await dead.fetch(timeout=5.0)
        assert [m.subject for m in held] == [subjects.submit("team")]
        await publish_json(js, subjects.release("team"), {"name": "late"}, msg_id="r-late")
        await b.start_allocator(ack_wait=60.0)  # the submission stays with the dead one until it comes back
        await seen.wait_for(lambda: ("team", "late") in seen.latest())
        assert await b.count(Claim) == 0 and await b.count(EarlyRelease) == 1
        await held[0].nak()  # redelivered now, after its release
        await seen.wait_for(lambda: seen.latest()[("team", "late")]["sequence"] == 1)
        assert [(s["state"], s["sequence"]) for s in seen.for_claim("team", "late")] == [
            ("Released", 0), ("Released", 1)]
        assert json.dumps(seen.latest()[("team", "late")]["reason"]).count("before the broker read") == 1
        assert await b.count(Claim, Claim.state == "Released") == 1 and await b.count(EarlyRelease) == 0
        await nc.close()


async def test_a_tenant_reads_the_answer_in_its_own_account_until_it_expires(tmp_path: Path) -> None:
    """With credentials (a NATS account per tenant): the answer reaches the tenant's own status stream,
    `claimbroker release` of that name exits 1 with one line, and the answer expires there too."""
    async for stack in _stack(tmp_path, ("watcher", "allocator")):
        async for api in _api(stack):
            await _answered_in_its_own_account(stack, api)


async def _answered_in_its_own_account(stack: Any, api: Any) -> None:
    _, url = await credential(api, stack, tenant="vision")
    assert stack.allocator is not None and stack.authority is not None
    await until(lambda: "vision" in stack.authority.provisioned, what="the tenant's status stream")
    stack.allocator.release_answer_ttl = 1.0
    nc = await connect(url, name="vision")
    try:
        await publish_json(nc.jetstream(), subjects.release("vision"), {"name": "never"}, msg_id="r-never")
    finally:
        await nc.close()

    async def answered() -> bool:
        return await statuses_of(url) == [("vision", "never", "Released")]

    await until(answered, what="the answer in the tenant's own stream")
    code, out, err = await run("--nats", url, "release", "never")
    assert code == 1 and out == "" and len(err.strip().splitlines()) == 1, (code, out, err)
    assert "vision/never is neither waiting nor allocated" in err

    async def expired() -> bool:
        return await statuses_of(url) == []

    await until(expired, what="the answer gone from the tenant's own stream")
