"""The outbox relay (services/allocator/outbox_relay.py) with a real nats-server and ledger: once it has read
the ledger empty, commits handed over are published from memory in commit order and marked by the next
transaction; a failure to publish sends it back to the ledger, which publishes what was committed meanwhile,
in order, and nothing is lost or published out of order."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import nats
import pytest
from sqlalchemy import func, select

from services.allocator.outbox_relay import OutboxRelay
from services.bus.embedded import EmbeddedNats
from services.bus.streams import ensure_streams
from shared.contract import subjects
from shared.ledger import outbox
from shared.ledger.engine import create_engine, migrate, sessions
from shared.ledger.schema import OutboxEvent
from shared.ledger.unit_of_work import unit_of_work

pytestmark = pytest.mark.e2e


async def test_handed_over_commits_are_published_in_order_and_a_failure_falls_back_to_the_ledger(
        nats_server: EmbeddedNats, tmp_path: Path) -> None:
    db_url = f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}"
    await migrate(db_url)
    engine = create_engine(db_url)
    make = sessions(engine)
    nc = await nats.connect(nats_server.url)
    seen: list[int] = []

    async def on_alert(message: Any) -> None:
        seen.append(json.loads(message.data)["n"])

    try:
        js = nc.jetstream()
        await ensure_streams(js)
        await nc.subscribe(subjects.alert("warning", "test", "t"), cb=on_alert)
        relay = OutboxRelay(make)
        relay.js = js

        async def commit(*numbers: int) -> None:
            async with unit_of_work(make) as work:
                for n in numbers:
                    work.writes.event(subjects.alert("warning", "test", "t"), f"event-{n}", {"n": n})
            relay.committed(work.flushed)

        async def unmarked() -> int:
            async with make() as session:
                return int(await session.scalar(select(func.count()).select_from(OutboxEvent)
                                                 .where(OutboxEvent.published_at.is_(None))) or 0)

        await commit(1)  # before the relay has read the ledger: it reads it back
        await relay.publish()
        await commit(2, 3)  # from memory now
        await commit(4)
        await relay.publish()
        await nc.flush()
        assert await unmarked() == 3, "published from memory, marked by the next transaction"
        marks = relay.take_marks()
        async with unit_of_work(make) as work:
            await outbox.mark_published_by_message_id(work, marks)
        assert await unmarked() == 0 and len(marks) == 3

        relay.js = nc.jetstream(timeout=0.5)
        await nc.drain()  # NATS gone: the next publish fails
        await commit(5)
        with pytest.raises(Exception):  # noqa: B017 - whatever nats-py raises on a closed connection
            await relay.publish()
        await commit(6)  # committed while the relay is back on the ledger
        nc = await nats.connect(nats_server.url)
        await nc.subscribe(subjects.alert("warning", "test", "t"), cb=on_alert)
        relay.js = nc.jetstream()
        await relay.publish()
        await nc.flush()
        assert await unmarked() == 0
        await commit(7)
        await relay.publish()
        await nc.flush()
        for _ in range(100):
            if seen[-1:] == [7]:
                break
            await nc.flush()
        assert seen == [1, 2, 3, 4, 5, 6, 7]
    finally:
        if not nc.is_closed:
            await nc.close()
        await engine.dispose()
