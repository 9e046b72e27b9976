"""gang-incomplete with a fake clock: tables of member statuses and ticks, what is raised and resolved
(gang-incomplete and claim-pending-too-long), the alert's words and numbers, a restart's seeding, bounded
memory for 10,000 gangs, and a hypothesis invariant over random member stories."""

from __future__ import annotations

import itertools
import tracemalloc
from typing import cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.alerts.book import Action, AlertBook, AlertPolicy, Raise, Resolve, apply
from shared.alerts.gangs import duration
from shared.alerts.rules import ClaimRules
from shared.contract.gang_reasons import incomplete_reason, read_incomplete, rejected_note
from shared.contract.messages import ClaimStatus

AFTER = 600.0  # the broker-wide pending threshold of the tables
SEQUENCE = itertools.count(1)


def incomplete(have: int, size: int, gang: str = "g", rejected: tuple[str, ...] = ()) -> str:
    return incomplete_reason(gang, have, size, rejected_note(rejected))


def status(name: str, state: str, reason: str = "", tenant: str = "t") -> ClaimStatus:
    """As read_status gives it: the allocator's statuses of a claim carry increasing sequences."""
    return cast(ClaimStatus, {"namespace": tenant, "name": name, "state": state, "reason": reason,
                              "sequence": next(SEQUENCE)})


Step = tuple[float, str, str, str] | tuple[float, str]  # (time, claim, state, reason) or (time, "tick")


def run(steps: list[Step], rules: ClaimRules | None = None) -> list[tuple[float, str, str]]:
    """The gang-incomplete and claim-pending-too-long actions, as (time, raise/resolve, key); resolves only
    of keys that were raised (others are no-ops in the book)."""
    rules = rules or ClaimRules(AFTER)
    raised: set[str] = set()
    out: list[tuple[float, str, str]] = []
    for step in steps:
        now = step[0]
        if step[1] == "tick":
            actions = rules.due(now)
        else:
            _, name, state, reason = cast(tuple[float, str, str, str], step)
            actions = rules.on_status(status(name, state, reason), now)
        for action in actions:
            key = action.alert.key if isinstance(action, Raise) else action.key
            if not key.startswith(("gang-incomplete:", "claim-pending-too-long:")):
                continue
            if isinstance(action, Raise):
                raised.add(key)
                out.append((now, "raise", key))
            elif key in raised:
                raised.discard(key)
                out.append((now, "resolve", key))
    return out


GANG, PENDING_A, PENDING_B = "gang-incomplete:t/g", "claim-pending-too-long:t/a", "claim-pending-too-long:t/b"
NEEDS = "gang g needs 16 GPUs on one nvidia.com/gpu.clique; the most free on one is 8"

TABLE: list[tuple[str, list[Step], list[tuple[float, str, str]]]] = [
    ("1 of 2 past the threshold: one gang alert, no member's; the second member's arrival resolves it",
     [(0, "a", "Pending", incomplete(1, 2)), (599, "tick"), (600, "tick"), (1200, "tick"),
      (1300, "b", "Pending", ""), (1300, "a", "Allocated", ""), (1300, "b", "Allocated", ""), (2000, "tick")],
     [(600, "raise", GANG), (1300, "resolve", GANG)]),
    ("three members waiting: still one alert",
     [(0, "a", "Pending", incomplete(1, 4)), (10, "b", "Pending", incomplete(2, 4)),
      (10, "a", "Pending", incomplete(2, 4)), (20, "c", "Pending", incomplete(3, 4)), (600, "tick"),
      (700, "tick")],
     [(600, "raise", GANG)]),
    ("the gang counts from its first member",
     [(0, "a", "Pending", incomplete(1, 3)), (500, "b", "Pending", incomplete(2, 3)),
      (500, "a", "Pending", incomplete(2, 3)), (599, "tick"), (600, "tick")],
     [(600, "raise", GANG)]),
    ("complete in time: nothing",
     [(0, "a", "Pending", incomplete(1, 2)), (300, "a", "Allocated", ""), (300, "b", "Allocated", ""),
      (5000, "tick")],
     []),
    ("complete but waiting for devices: the gang resolves, its members' own waits count from their start",
     [(0, "a", "Pending", incomplete(1, 3)), (10, "b", "Pending", incomplete(2, 3)),
      (10, "a", "Pending", incomplete(2, 3)), (600, "tick"), (700, "c", "Pending", NEEDS),
      (700, "a", "Pending", NEEDS), (700, "b", "Pending", NEEDS), (700, "tick"), (1300, "tick")],
     [(600, "raise", GANG), (700, "resolve", GANG), (700, "raise", PENDING_A), (700, "raise", PENDING_B),
      (1300, "raise", "claim-pending-too-long:t/c")]),
    ("members leave one by one: resolved when the last has gone",
     [(0, "a", "Pending", incomplete(2, 3)), (0, "b", "Pending", incomplete(2, 3)), (600, "tick"),
      (700, "a", "Released", ""), (700, "b", "Pending", incomplete(1, 3)), (800, "tick"),
      (900, "b", "Rejected", "its CEL selects no device")],
     [(600, "raise", GANG), (900, "resolve", GANG)]),
    ("incomplete again after being whole: a new wait, counted from then",
     [(0, "a", "Pending", NEEDS), (0, "b", "Pending", NEEDS), (100, "a", "Released", ""),
      (100, "b", "Pending", incomplete(1, 2)), (600, "tick"), (699, "tick"), (700, "tick")],
     [(700, "raise", GANG)]),  # b has waited 600s at 600, but for its gang's members since 100
    ("a pending alert raised while the gang was whole stays open; no second one while it is incomplete",
     [(0, "a", "Pending", NEEDS), (0, "b", "Pending", NEEDS), (600, "tick"), (650, "b", "Released", ""),
      (650, "a", "Pending", incomplete(1, 2)), (1250, "tick"), (1300, "a", "Allocated", "")],
     [(600, "raise", PENDING_A), (600, "raise", PENDING_B), (650, "resolve", PENDING_B), (1250, "raise", GANG),
      (1300, "resolve", GANG), (1300, "resolve", PENDING_A)]),
    ("a tick between the members' Allocated statuses raises no pending alert for the one not read yet",
     [(0, "a", "Pending", incomplete(1, 2)), (0, "b", "Pending", incomplete(1, 2)), (600, "tick"),
      (700, "a", "Allocated", ""), (700, "tick"), (701, "b", "Allocated", ""), (800, "tick")],
     [(600, "raise", GANG), (700, "resolve", GANG)]),
    ("two gangs of a tenant are two alerts",
     [(0, "a", "Pending", incomplete(1, 2)), (0, "b", "Pending", incomplete(1, 2, "h")), (600, "tick"),
      (601, "b", "Released", "")],
     [(600, "raise", GANG), (600, "raise", "gang-incomplete:t/h"), (601, "resolve", "gang-incomplete:t/h")]),
]


@pytest.mark.parametrize(("steps", "expected"), [row[1:] for row in TABLE], ids=[row[0] for row in TABLE])
def test_gang_incomplete(steps: list[Step], expected: list[tuple[float, str, str]]) -> None:
    assert run(steps) == expected


def test_the_tenants_own_threshold() -> None:
    rules = ClaimRules(AFTER)
    rules.thresholds["t"] = 60
    assert run([(0, "a", "Pending", incomplete(1, 2)), (59, "tick"), (60, "tick")], rules) == [(60, "raise", GANG)]


def raised(actions: list[Action]) -> list[Raise]:
    return [a for a in actions if isinstance(a, Raise)]


def test_the_alert_says_what_a_person_can_act_on() -> None:
    rules = ClaimRules(AFTER)
    for name in "abc":
        rules.on_status(status(name, "Pending", incomplete(3, 4, "train-7"), tenant="ml"), 0)
    [alert] = [a.alert for a in raised(rules.due(720))]
    assert (alert.kind, alert.severity, alert.key) == ("gang-incomplete", "warning", "gang-incomplete:ml/train-7")
    assert alert.summary == ("gang train-7 of tenant ml: 3 of 4 members received for 12m (threshold 10m); "
                             "missing 1 member")
    assert alert.labels == {"tenant": "ml", "gang": "train-7"}
    assert alert.details == {"gang": "train-7", "received": 3, "size": 4, "missing": 1, "rejected": [],
                             "rejectedNotNamed": 0, "incompleteSeconds": 720.0, "thresholdSeconds": 600.0}


def test_the_alert_names_the_members_rejected_on_their_own() -> None:
    rules = ClaimRules(AFTER)
    rules.on_status(status("a", "Pending", incomplete(1, 8, rejected=("b", "c", "d", "e", "f", "h"))), 0)
    [alert] = [a.alert for a in raised(rules.due(600))]
    assert alert.summary.endswith("missing 7 members, among them b, c, d, e and 2 more Rejected on their own: "
                                  "submit them again")
    assert alert.details["rejected"] == ["b", "c", "d", "e"] and alert.details["rejectedNotNamed"] == 2


def test_the_book_publishes_one_message_and_its_resolve() -> None:
    rules, book = ClaimRules(AFTER), AlertBook(AlertPolicy(300))
    sent = apply(book, rules.on_status(status("a", "Pending", incomplete(1, 2)), 0), 0)
    for now in range(0, 2000, 5):  # the notifier's ticks
        sent += apply(book, rules.due(now), now) + book.flush(now)
    sent += apply(book, rules.on_status(status("a", "Allocated"), 2000), 2000)
    gang = [(m.alert.key, m.count, m.resolved) for m in sent if m.alert.kind == "gang-incomplete"]
    assert gang == [(GANG, 1, False), (GANG, 1, True)]
    assert [m.alert.kind for m in sent if not m.resolved] == ["gang-incomplete"]  # no claim-pending-too-long
    assert sent[-1].alert.summary == "gang g of tenant t is complete: member a is Allocated"


def test_a_restart_seeds_gangs_from_waiting_claims_and_open_alerts() -> None:
    """The ledger's waiting claims rebuild each gang's wait (from its earliest member); an alert open for a
    gang whose members are still waiting is not raised again, one for a gang that completed or left while
    the notifier was away is resolved at the first tick."""
    rules = ClaimRules(AFTER)
    rules.seed("t", "a", since=100, reason=incomplete(2, 3), alerted=False)
    rules.seed("t", "b", since=50, reason=incomplete(2, 3), alerted=False)
    rules.seed("t", "c", since=0, reason=incomplete(1, 2, "h"), alerted=False)
    rules.seed_gang_alert("t", "g")
    rules.seed_gang_alert("t", "gone")
    first = rules.due(649)
    assert [a.key for a in first if isinstance(a, Resolve)] == ["gang-incomplete:t/gone"]
    assert [a.alert.key for a in raised(first)] == ["gang-incomplete:t/h"]  # g's alert is open already
    assert rules.due(2000) == []
    assert [a.key for a in rules.on_status(status("a", "Allocated"), 2000) if isinstance(a, Resolve)
            and a.key.startswith("gang")] == [GANG]
    assert set(rules.gangs.gangs) == {("t", "h")}


def test_ten_thousand_incomplete_gangs_cost_a_small_record_each_and_nothing_once_resolved() -> None:
    rules = ClaimRules(AFTER)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(10_000):
            rules.on_status(status(f"m{i}", "Pending", incomplete(1, 2, f"g{i}"), tenant=f"t{i % 50}"), 0)
        per_gang = (tracemalloc.get_traced_memory()[0] - before) / 10_000
    finally:
        tracemalloc.stop()
    assert len(rules.gangs.gangs) == 10_000 and len(rules.waiting) == 10_000
    # a gang's record, its member's waiting entry, the status read (sequence) and the keys: well under 2 KB
    assert per_gang < 2048, per_gang
    assert len(raised(rules.due(600))) == 10_000
    assert rules.due(1200) == []  # each once
    for i in range(10_000):
        rules.on_status(status(f"m{i}", "Allocated", tenant=f"t{i % 50}"), 1300)
    assert rules.gangs.gangs == {} and rules.waiting == {}


@pytest.mark.parametrize(("seconds", "shown"), [(0, "0s"), (90, "90s"), (120, "2m"), (720, "12m"),
                                                 (7199, "119m"), (7200, "2h"), (11100, "3h5m")])
def test_duration(seconds: float, shown: str) -> None:
    assert duration(seconds) == shown


# --- hypothesis: one alert per gang at a time, none left once the members are gone ------------------

STATES = st.sampled_from(["incomplete-1", "incomplete-2", "other-gang", "needs", "Allocated", "Released",
                          "Rejected", "tick"])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abcd"), STATES, st.floats(0, 400)), max_size=60))
def test_random_member_stories(story: list[tuple[str, str, float]]) -> None:
    """Members a-c of gang g and d of gang h, in any order of statuses and time: a gang's alert is raised
    only while one of its members last said it waits for members, never twice without a resolve between,
    no claim-pending-too-long is raised for a member whose last status is its gang's incomplete reason, and
    when every claim is released no gang record or open gang alert is left."""
    rules, book, now = ClaimRules(100), AlertBook(AlertPolicy(0, 0, 0)), 0.0
    last: dict[str, str] = {}
    open_gangs: set[str] = set()
    for name, what, dt in story:
        now += dt
        gang = "h" if name == "d" else "g"
        if what == "tick":
            actions = rules.due(now)
        else:
            state, reason = {"incomplete-1": ("Pending", incomplete(1, 4, gang)),
                             "incomplete-2": ("Pending", incomplete(2, 4, gang)),
                             "other-gang": ("Pending", incomplete(1, 2, "x")),
                             "needs": ("Pending", NEEDS)}.get(what, (what, "because"))
            last[name] = reason if state == "Pending" else state
            actions = rules.on_status(status(name, state, reason), now)
        for message in apply(book, actions, now):
            key = message.alert.key
            if message.alert.kind == "claim-pending-too-long":
                assert message.resolved or read_incomplete(last[key.rsplit("/", 1)[1]]) is None, key
            if message.alert.kind != "gang-incomplete":
                continue
            if message.resolved:
                open_gangs.discard(key)
            else:
                assert key not in open_gangs, "raised twice without a resolve"
                open_gangs.add(key)
                gang_of = key.rsplit("/", 1)[1]
                assert any(reason.startswith(f"gang {gang_of}:") for reason in last.values())
    for name in "abcd":
        apply(book, rules.on_status(status(name, "Released"), now), now)
    apply(book, rules.due(now + 1), now + 1)
    assert rules.gangs.gangs == {} and rules.waiting == {}
    assert not [k for k in book.open_keys() if k.startswith("gang-incomplete:")]
