"""The consumer shell's delivery policy (services/bus/consumer.Deliveries): what becomes of a batch by the kind of
error its handler raised and the delivery count of its messages."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import pytest
from sqlalchemy.exc import DBAPIError, IntegrityError

from services.bus.consumer import Deliveries, PermanentError, TemporaryError, Unavailable, kind_of
from services.runtime.outage import Outage

log = logging.getLogger("test")


class Message:
    def __init__(self, name: str, delivered: int = 1) -> None:
        self.name = name
        self.metadata = SimpleNamespace(num_delivered=delivered)
        self.answers: list[tuple[str, float | None]] = []

    async def ack(self) -> None:
        self.answers.append(("ack", None))

    async def nak(self, delay: float | None = None) -> None:
        self.answers.append(("nak", delay))


class Handler:
    """Fails the messages named in `failing` with their error (while it is in the dict), records the rest."""

    def __init__(self, **failing: Exception) -> None:
        self.failing = failing
        self.handled: list[list[str]] = []
        self.calls: list[str] = []
        self.dead: list[str] = []

    async def handle(self, messages: Sequence[Any]) -> None:
        for message in messages:
            if message.name in self.failing:
                raise self.failing[message.name]
        self.handled.append([m.name for m in messages])

    async def after_failure(self, error: Exception) -> None:
        self.calls.append("after_failure")

    async def dead_letter(self, message: Any, error: Exception) -> bool:
        self.dead.append(message.name)
        return True

    async def degraded(self, error: Exception, *, unavailable: bool) -> None:
        self.calls.append(f"degraded({unavailable})")

    async def unhandled(self, error: Exception, message: Any) -> None:
        self.calls.append("unhandled")

    async def recovered(self) -> None:
        self.calls.append("recovered")

    async def settled(self, messages: Sequence[Any]) -> None:
        self.calls.append(f"settled({','.join(m.name for m in messages)})")


def shell(handler: Handler, **options: Any) -> Deliveries:
    return Deliveries(handler, log=log, max_deliver=5, retry_delay=lambda d: 0.2 * d,
                      failing_delay=lambda d: 10.0 + d, **options)


async def test_a_committed_batch_is_acked() -> None:
    handler, batch = Handler(), [Message("a"), Message("b")]
    await shell(handler).deliver(batch)
    assert [m.answers for m in batch] == [[("ack", None)], [("ack", None)]] and handler.calls == ["settled(a,b)"]


async def test_a_batch_is_held_while_the_ledger_is_away_and_acked_once_it_commits() -> None:
    handler, batch = Handler(a=Unavailable("away")), [Message("a"), Message("b")]
    outage = Outage("the ledger", log, first_wait=0.0)
    tries = 0

    async def failed(error: BaseException) -> None:
        nonlocal tries
        tries += 1
        if tries == 3:
            del handler.failing["a"]  # back

    outage.failed = failed  # type: ignore[method-assign]
    deliveries = shell(handler, holding=outage)
    await deliveries.deliver(batch)
    assert tries == 3 and handler.handled == [["a", "b"]] and not deliveries.failing
    assert handler.calls == ["after_failure", "degraded(True)", "after_failure", "after_failure", "recovered",
                             "settled(a,b)"]
    assert [m.answers for m in batch] == [[("ack", None)], [("ack", None)]]  # no delivery spent


async def test_a_held_batch_goes_back_at_once_when_the_consumer_stops() -> None:
    handler, batch = Handler(a=Unavailable("away")), [Message("a")]
    await shell(handler, holding=Outage("the ledger", log), stopping=lambda: True).deliver(batch)
    assert batch[0].answers == [("nak", None)] and handler.calls == ["after_failure"]


async def test_a_database_fault_that_passes_is_unavailable_and_one_that_refuses_is_temporary() -> None:
    lost = DBAPIError("SELECT 1", None, Exception("gone"), connection_invalidated=True)
    refused = IntegrityError("INSERT", None, Exception("duplicate key"))
    assert kind_of(lost) is Unavailable and kind_of(ConnectionError()) is Unavailable
    assert kind_of(refused) is TemporaryError and kind_of(ValueError()) is None
    assert kind_of(PermanentError()) is PermanentError


async def test_a_failing_message_does_not_take_its_batch_mates_and_is_blamed_on_its_second_delivery() -> None:
    handler = Handler(poison=ValueError("bad"))
    batch = [Message("a"), Message("poison"), Message("b")]
    await shell(handler, dead_letters=True).deliver(batch)
    assert [m.answers for m in batch] == [[("ack", None)], [("nak", 0.2)], [("ack", None)]]
    again = Message("poison", delivered=2)
    await shell(handler, dead_letters=True).deliver([again])
    assert again.answers == [("ack", None)] and handler.dead == ["poison"]
    assert handler.handled == [["a"], ["b"], []]  # the work without the message committed: it is at fault


@pytest.mark.parametrize(("error", "delivered", "answer"), [
    (TemporaryError("refused"), 2, ("nak", 0.4)),  # a fault that passes: redelivered until the last but one
    (TemporaryError("refused", delay=2.5), 3, ("nak", 2.5)),
    (TemporaryError("refused"), 4, ("ack", None)),  # then dead-lettered
    (PermanentError("never"), 1, ("ack", None)),  # dead-lettered at once
])
async def test_what_a_message_that_fails_alone_gets_by_its_error_and_deliveries(
        error: Exception, delivered: int, answer: tuple[str, float | None]) -> None:
    handler, message = Handler(m=error), Message("m", delivered)
    await shell(handler, dead_letters=True).deliver([message])
    assert message.answers == [answer] and handler.dead == ([] if answer[0] == "nak" else ["m"])


async def test_when_the_work_without_the_message_fails_no_message_is_blamed() -> None:
    handler, message = Handler(m=ValueError("bad")), Message("m", delivered=2)
    broken = RuntimeError("the cycle is broken")

    async def handle(messages: Sequence[Any]) -> None:
        raise broken

    handler.handle = handle  # type: ignore[method-assign]
    deliveries = shell(handler, dead_letters=True)
    await deliveries.deliver([message])
    assert message.answers == [("nak", 12.0)] and handler.dead == [] and deliveries.failing
    assert handler.calls == ["after_failure", "degraded(False)", "unhandled"]


async def test_without_dead_letters_a_message_that_fails_alone_is_redelivered_and_reported() -> None:
    handler, message = Handler(m=ValueError("bad")), Message("m", delivered=9)
    await shell(handler).deliver([message])
    assert message.answers == [("nak", 19.0)] and handler.calls == ["after_failure", "degraded(False)", "unhandled"]
