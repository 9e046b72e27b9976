"""The allocator asks again about Pending claims whose answer is older than `reason_refresh`."""

from types import SimpleNamespace

from services.allocator.ledger_ops import Queue
from services.allocator.service import Allocator
from shared.admission import Waiting
from tests.builders import a_claim


def test_only_answers_older_than_the_refresh_are_asked_again() -> None:
    claim = a_claim("c", "t").request().build()
    queue = Queue(waiting={("t", "old"): Waiting("t", "old", claim, answered=True),
                           ("t", "recent"): Waiting("t", "recent", claim, answered=True),
                           ("t", "new"): Waiting("t", "new", claim)})
    now = [1000.0]
    allocator = SimpleNamespace(clock=lambda: now[0], reason_refresh=60.0,
                                _answered_at={("t", "old"): 900.0, ("t", "recent"): 990.0, ("t", "gone"): 10.0})
    Allocator._refresh_stale_reasons(allocator, queue)  # type: ignore[arg-type]
    assert {k[1]: w.answered for k, w in queue.waiting.items()} == {"old": False, "recent": True, "new": False}
    assert set(allocator._answered_at) == set(queue.waiting)  # claims no longer waiting are forgotten
