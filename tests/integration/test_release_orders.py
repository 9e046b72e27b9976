"""No release is lost and none applies to the wrong claim, whatever order submissions and releases reach the
allocator in: every sequence of up to four submit/release messages for one claim name, delivered in stream
order or with one message redelivered after all the others (its first delivery was lost with a crash),
in one batch or one message per batch. The outcome must be the one the stream's order gives."""

from __future__ import annotations

import itertools
import json
from types import SimpleNamespace
from typing import Any

from sqlalchemy import select

from services.allocator.service import Allocator
from shared.contract import subjects
from shared.dra.classes import BUILTIN_CLASSES
from shared.ledger.engine import create_engine, migrate, sessions
from shared.ledger.schema import Claim
from tests.builders import a_claim

QUEUED = ("Pending", "Allocated")


def _message(subject: str, body: dict[str, Any], message_id: str, sequence: int) -> Any:
    return SimpleNamespace(subject=subject, data=json.dumps(body).encode(), headers={"Nats-Msg-Id": message_id},
                           metadata=SimpleNamespace(sequence=SimpleNamespace(stream=sequence), num_delivered=1))


def stream_outcome(operations: str) -> bool:
    """Whether the claim is queued after the operations in stream order (S: submit, R: release)."""
    queued = False
    for operation in operations:
        queued = operation == "S" or (queued and operation != "R")
    return queued


def deliveries(count: int) -> list[tuple[int, ...]]:
    """Stream order, and stream order with one message moved to the end (redelivered after a crash)."""
    in_order = tuple(range(count))
    moved = [(*in_order[:i], *in_order[i + 1:], i) for i in range(count - 1)]
    return [in_order, *moved]


CASES = [
    (operations, order, batched)
    for length in range(1, 5)
    for operations in ("".join(p) for p in itertools.product("SR", repeat=length))
    for order in deliveries(length)
    for batched in (True, False)
]


async def test_every_order_of_submissions_and_releases_ends_as_the_stream_says(ledger_url: str) -> None:
    await migrate(ledger_url)
    engine = create_engine(ledger_url)
    allocator = Allocator(engine, BUILTIN_CLASSES)
    sequence = itertools.count(1)
    expected: dict[str, bool] = {}
    try:
        for number, (operations, order, batched) in enumerate(CASES):
            name = f"c{number}"
            expected[name] = stream_outcome(operations)
            messages = []
            for position, operation in enumerate(operations):
                at = next(sequence)
                if operation == "S":
                    messages.append(_message(subjects.submit("t"), a_claim(name, "t").request().document(),
                                             f"{name}-{position}", at))
                else:
                    messages.append(_message(subjects.release("t"), {"name": name}, f"{name}-{position}", at))
            delivered = [messages[i] for i in order]
            for batch in ([delivered] if batched else [[m] for m in delivered]):
                await allocator.transaction.decide(batch)
        async with sessions(engine)() as session:
            states = {row.name: row.state for row in await session.scalars(select(Claim))}
        wrong = {f"{CASES[int(n[1:])]}": (expected[n], states.get(n)) for n in expected
                 if expected[n] != (states.get(n) in QUEUED)}
        assert not wrong, f"{len(wrong)} of {len(CASES)} orders end wrong (queued expected, state): {wrong}"
    finally:
        await engine.dispose()


async def test_releases_in_the_batch_of_their_submissions_release_every_claim(ledger_url: str) -> None:
    """Submissions of A to E, then their releases, in one batch: all five end Released."""
    await migrate(ledger_url)
    engine = create_engine(ledger_url)
    allocator = Allocator(engine, BUILTIN_CLASSES)
    names = "abcde"
    try:
        await allocator.transaction.decide([
            *(_message(subjects.submit("t"), a_claim(n, "t").request().document(), f"s-{n}", i)
              for i, n in enumerate(names, 1)),
            *(_message(subjects.release("t"), {"name": n}, f"r-{n}", i) for i, n in enumerate(names, 10)),
        ])
        async with sessions(engine)() as session:
            states = {row.name: row.state for row in await session.scalars(select(Claim))}
        assert states == dict.fromkeys(names, "Released")
    finally:
        await engine.dispose()
