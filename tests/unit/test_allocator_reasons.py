"""Allocator reasons: Pending answers older than `reason_refresh` are asked again; stale-node texts stay put."""

from typing import Any

from services.allocator.inventory import Heard, Inventory
from services.allocator.reasons import ReasonRefresh
from shared.admission.model import Waiting
from shared.admission.waiting_queue import WaitingQueue
from shared.dra.inventory import Fleet, NodeInventory
from shared.ledger.queue import Queue
from tests.builders import a_claim


def _queued(queue: WaitingQueue, *claims: Waiting) -> WaitingQueue:
    for waiting in claims:
        queue.put(waiting)
    queue.snapshot()  # as a cycle saw them
    return queue


def test_only_answers_older_than_the_refresh_are_asked_again() -> None:
    """A stale answer is asked again by queueing the claim unanswered: a change the next cycle is handed."""
    claim = a_claim("c", "t").request().build()
    old = Waiting("t", "old", claim, answered=True)
    queue = Queue(waiting=_queued(WaitingQueue(), old, Waiting("t", "recent", claim, answered=True),
                                  Waiting("t", "new", claim)))
    now = [1000.0]
    reasons = ReasonRefresh(60.0, lambda: now[0])
    reasons.answered_at.update({("t", "old"): 900.0, ("t", "recent"): 990.0, ("t", "gone"): 10.0})
    reasons.ask_again(queue)
    assert {k[1]: w.answered for k, w in queue.waiting.items()} == {"old": False, "recent": True, "new": False}
    assert set(reasons.answered_at) == set(queue.waiting)  # claims no longer waiting are forgotten
    _, changes = queue.waiting.snapshot()
    assert changes.went == (old,) and changes.came == (queue.waiting[("t", "old")],)


class _Watched(WaitingQueue):
    """Waiting claims that record which of them are read one by one."""

    read: list[tuple[str, str]]

    def __getitem__(self, key: tuple[str, str]) -> Waiting:
        self.read.append(key)
        return super().__getitem__(key)

    def get(self, key: tuple[str, str], default: Any = None) -> Any:
        self.read.append(key)
        return super().get(key, default)

    def items(self) -> Any:
        self.read.extend(self)
        return super().items()

    def keys(self) -> Any:
        self.read.extend(self)
        return super().keys()


def test_only_stale_answers_are_looked_at_not_every_waiting_claim() -> None:
    """Answer times are kept oldest first, so a deep queue of recent answers costs nothing to check."""
    claim = a_claim("c", "t").request().build()
    waiting = _queued(_Watched(), *(Waiting("t", f"c{i}", claim, answered=True) for i in range(1000)))
    waiting.read = []
    now = [1000.0]
    reasons = ReasonRefresh(60.0, lambda: now[0])
    reasons.matched_at = 980.0  # matched lately
    reasons.answered_at.update({("t", "c7"): 900.0, **{("t", f"c{i}"): 990.0 for i in range(1000)
                                                        if i != 7 and i != 8}})  # c8: unknown
    reasons.ask_again(Queue(waiting=waiting))
    assert waiting.read == [("t", "c7")] and not waiting[("t", "c7")].answered
    assert ("t", "c8") not in reasons.answered_at
    now[0] = 1040.0  # a refresh period after the last match: every waiting claim is matched once
    waiting.read = []
    reasons.ask_again(Queue(waiting=waiting))
    assert set(waiting.read) == set(waiting) and reasons.answered_at[("t", "c8")] == 1040.0


def test_a_stale_node_reads_the_same_from_cycle_to_cycle() -> None:
    """Nodes over the inventory TTL get no allocation; their reason names when they were last heard, so it
    does not change every cycle (the decision core keeps its state while the unusable nodes stay the same)."""
    now = [1_200.0]
    inventory = Inventory(90.0, lambda: now[0])
    inventory.fleet = Fleet().with_node(NodeInventory("old", ())).with_node(NodeInventory("fresh", ()))
    inventory.heard.update({"old": Heard(1, 1_000.0, b""), "fresh": Heard(2, 1_150.0, b"")})
    first = inventory.unusable_nodes()
    now[0] = 1_230.0
    assert inventory.unusable_nodes() == first
    assert first == {"old": "stale inventory: last heard 1970-01-01T00:16:40Z, over the 90s TTL"}
