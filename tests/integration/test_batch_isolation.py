"""A message whose transaction fails never takes its batch-mates with it: the batch is decided again one
message at a time, and the one that still fails alone, while the cycle without it commits, is kept in the
dead-letter table with its error and an alert, and acknowledged. When the cycle itself fails, no message
is blamed: each is redelivered."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest
from sqlalchemy import select

from services.allocator.claim_batch import ClaimBatch
from services.allocator.service import Allocator
from shared.contract import subjects
from shared.dra.classes import BUILTIN_CLASSES
from shared.ledger.engine import create_engine, migrate
from shared.ledger.schema import Claim, DeadLetter, InboxMessage, OutboxEvent
from tests.builders import a_claim


class Message:
    """What the allocator reads of a JetStream message, and what it answers."""

    def __init__(self, name: str, sequence: int, delivered: int = 1) -> None:
        self.subject = subjects.submit("t")
        self.data = json.dumps(a_claim(name, "t").request().document()).encode()
        self.headers = {"Nats-Msg-Id": f"m-{name}"}
        self.metadata = SimpleNamespace(sequence=SimpleNamespace(stream=sequence), num_delivered=delivered)
        self.answer: str | None = None

    async def ack(self) -> None:
        self.answer = "ack"

    async def nak(self, delay: float | None = None) -> None:
        self.answer = "nak"


@pytest.fixture
async def allocator(db_url: str) -> Any:
    await migrate(db_url)
    engine = create_engine(db_url)
    allocator = Allocator(engine, BUILTIN_CLASSES)

    async def degraded(why: str, resolved: bool) -> None:
        allocator.alerts.append((why, resolved))

    allocator.alerts = []
    allocator.intake.report = degraded  # the service-degraded alert, without NATS
    yield allocator
    await engine.dispose()


def poisoned(monkeypatch: pytest.MonkeyPatch) -> None:
    """Writing the claim named `poison` fails inside the transaction, as a value the database refuses would."""
    submit = ClaimBatch.submit

    def failing(self: Any, message: Any, claim: Any) -> bool:
        if claim.metadata.name == "poison":
            raise ValueError("value too long for type character varying(253)")
        return submit(self, message, claim)

    monkeypatch.setattr(ClaimBatch, "submit", failing)


async def test_a_message_that_fails_alone_is_dead_lettered_and_its_batch_mates_are_decided(
        allocator: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    poisoned(monkeypatch)
    messages = [Message("a", 1), Message("poison", 2), Message("b", 3)]

    await allocator.intake.take(messages)
    assert [m.answer for m in messages] == ["ack", "nak", "ack"]  # blamed only when it fails again
    again = Message("poison", 2, delivered=2)
    await allocator.intake.take([again])

    assert again.answer == "ack"
    async with allocator.sessions() as session:
        states = {row.name: row.state for row in await session.scalars(select(Claim))}
        letters = list(await session.scalars(select(DeadLetter)))
        inbox = set(await session.scalars(select(InboxMessage.message_id)))
        alerts = [e.payload for e in await session.scalars(select(OutboxEvent)) if ".alerts." in e.subject]
    assert states == {"a": "Pending", "b": "Pending"}
    assert [(d.message_id, d.payload, d.deliveries) for d in letters] == [("m-poison", messages[1].data, 2)]
    assert "value too long" in letters[0].error
    assert inbox == {"m-a", "m-poison", "m-b"}  # a redelivery of the dead letter changes nothing
    assert [(a["kind"], a["details"]["messageId"]) for a in alerts] == [("message-dead-lettered", "m-poison")]


async def test_a_redelivered_dead_letter_changes_nothing(allocator: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    poisoned(monkeypatch)
    await allocator.intake.take([Message("poison", 1, delivered=2)])
    again = Message("poison", 1, delivered=3)

    await allocator.intake.take([again])

    assert again.answer == "ack"
    async with allocator.sessions() as session:
        assert len(list(await session.scalars(select(DeadLetter)))) == 1


async def test_when_the_cycle_itself_fails_no_message_is_blamed(
        allocator: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    async def broken(work: Any, config: Any = None) -> Any:
        raise RuntimeError("the cycle is broken")

    monkeypatch.setattr(allocator.cycle, "run", broken)
    messages = [Message("a", 1, delivered=2), Message("b", 2, delivered=2)]  # a first failure is only retried

    await allocator.intake.take(messages)

    assert [m.answer for m in messages] == ["nak", "nak"]
    async with allocator.sessions() as session:
        assert list(await session.scalars(select(DeadLetter))) == []
        assert list(await session.scalars(select(Claim))) == []
    assert [(why.split(":")[0], resolved) for why, resolved in allocator.alerts] == [("decision cycles fail", False)]
    assert allocator.not_ready() is not None

    monkeypatch.undo()  # the cycle works again; the alert is resolved once
    allocator.inventory.seen.set()  # as once an inventory was read
    await allocator.intake.take([Message("c", 3)])
    await allocator.intake.take([Message("d", 4)])
    assert allocator.alerts[1:] == [("decision cycles commit again", True)] and allocator.not_ready() is None


def test_a_lost_database_connection_is_a_passing_fault() -> None:
    """What a terminated PostgreSQL backend raises: the ledger unavailable (held and tried again, never
    dead-lettered: the chaos run lost a claim when the message was blamed for the connection); a value the
    ledger refuses is a fault of unknown kind."""
    from sqlalchemy.exc import DBAPIError

    from services.bus.consumer import Unavailable, kind_of

    lost = DBAPIError("SELECT 1", None, Exception("connection was closed in the middle of operation"),
                      connection_invalidated=True)
    refused = DBAPIError("INSERT", None, Exception("value too long for type character varying(253)"))
    assert kind_of(lost) is Unavailable and kind_of(refused) is None
