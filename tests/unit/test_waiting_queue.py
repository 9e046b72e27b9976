"""The waiting queue a shell keeps: what it records as came and went, and that a cycle handed those
changes decides exactly as one that compares the whole queue."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from shared.admission.cycle import run_cycle
from shared.admission.kept import KeptState
from shared.admission.model import QueueChanges, Snapshot, Waiting
from shared.admission.quota import QuotaConfig
from shared.admission.waiting_queue import WaitingQueue
from shared.dra.classes import BUILTIN_CLASSES
from shared.dra.inventory import Fleet
from tests.builders import a_claim
from tests.unit.test_admission import arriving, scenarios
from tests.waves import Waves


def claim(name: str, tenant: str = "t", arrival: int = 0) -> Waiting:
    return Waiting(tenant, name, a_claim(name, tenant).request().build(), arrival=arrival)


def names(waiting: tuple[Waiting, ...]) -> list[str]:
    return sorted(w.name for w in waiting)


def test_the_first_snapshot_follows_none_and_holds_every_claim() -> None:
    queue = WaitingQueue()
    a, b = claim("a"), claim("b")
    queue.put(a)
    queue.put(b)
    queued, changes = queue.snapshot()
    assert queued == (a, b)
    assert changes.since == 0 and changes.version > 0
    assert names(changes.came) == ["a", "b"] and changes.went == ()


def test_changes_are_what_differs_from_the_last_snapshot() -> None:
    queue = WaitingQueue()
    a, b, c = claim("a"), claim("b"), claim("c")
    for w in (a, b, c):
        queue.put(w)
    _, first = queue.snapshot()
    answered = replace(a, answered=True)
    queue.put(answered)  # rebuilt: the old one went, the new one came
    queue.pop(b.key)  # admitted
    queue.put(claim("d"))
    queue.pop(("t", "d"))  # came and went between two snapshots: no change
    queue.pop(c.key)
    queue.put(c)  # put back as it was: no change
    queued, changes = queue.snapshot()
    assert changes.since == first.version and changes.version > first.version
    assert changes.came == (answered,)
    assert set(changes.went) == {a, b}
    assert queued == (answered, c)
    assert queue.snapshot()[1].came == queue.snapshot()[1].went == ()  # nothing since


def test_versions_of_two_queues_never_collide() -> None:
    one, two = WaitingQueue(), WaitingQueue()
    versions = [q.snapshot()[1].version for q in (one, two, one, two)]
    assert len(set(versions)) == 4


@settings(max_examples=40, deadline=None)
@given(scenarios(), st.randoms(use_true_random=False))
def test_a_cycle_handed_the_changes_decides_as_one_that_compares_the_queue(
        scenario: tuple[Fleet, QuotaConfig, list[list[Any]]], rng: Any) -> None:
    """Cycles on one memo get the queue's changes (sometimes none, sometimes a record that does not add
    up, as a shell bug would give: both fall back to comparing); cycles on another memo get only the
    queue. Their decisions and preemptions are the same, cycle after cycle."""
    f, config, waves = scenario
    with_changes, without = KeptState(), KeptState()
    shell = Waves([[arriving(c, 0) for c in wave] for wave in waves], rng)
    for _ in shell.cycles():
        queued, changes = shell.queue.snapshot()
        roll = rng.random()
        handed: QueueChanges | None = changes
        if roll < 0.15:
            handed = None  # a shell that does not keep the record
        elif roll < 0.3 and changes.went:
            handed = replace(changes, went=changes.went[1:])  # one that lost a claim that went
        elif roll < 0.4:
            handed = replace(changes, since=changes.since + 1)  # one that follows another snapshot
        now = tuple(shell.running.values())
        result = run_cycle(Snapshot(f, BUILTIN_CLASSES, config, now, queued, changes=handed), with_changes)
        compared = run_cycle(Snapshot(f, BUILTIN_CLASSES, config, now, queued), without)
        assert result.decisions == compared.decisions
        assert result.preemptions == compared.preemptions
        shell.settle(result)
