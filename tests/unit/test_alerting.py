"""The alert engine and rules with a fake clock: tables of scenarios, then hypothesis invariants."""

from __future__ import annotations

import itertools
from collections import defaultdict
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.alerts import rules
from shared.alerts.book import Action, Alert, AlertBook, AlertPolicy, Message, Raise, alert_key, apply

W = 300.0  # fold window of the tables


def an_alert(key: str = "k", tenant: str | None = "t") -> Alert:
    return Alert("claim-rejected", "warning", key, f"summary of {key}", {}, {"tenant": tenant} if tenant else {})


def run(book: AlertBook, script: list[tuple[float, str, str]]) -> list[tuple[float, str, int, bool]]:
    """script rows: (time, op, key) with op raise/resolve/flush; returns (time, key, count, resolved)."""
    out: list[tuple[float, str, int, bool]] = []
    for now, op, key in script:
        if op == "raise":
            sent = book.raise_(an_alert(key), now)
        elif op == "resolve":
            sent = book.resolve(key, now)
        else:
            sent = book.flush(now)
        out.extend((now, m.alert.key, m.count, m.resolved) for m in sent)
    return out


TABLE: list[tuple[str, AlertPolicy, list[tuple[float, str, str]], list[tuple[float, str, int, bool]]]] = [
    ("first raise publishes at once", AlertPolicy(W), [(0, "raise", "a")], [(0, "a", 1, False)]),
    ("repeats fold into one later message",
     AlertPolicy(W), [(0, "raise", "a"), (10, "raise", "a"), (20, "raise", "a"), (100, "flush", ""),
                      (W, "flush", ""), (W + 1, "flush", "")],
     [(0, "a", 1, False), (W, "a", 3, False)]),
    ("no repeats, nothing when the window closes",
     AlertPolicy(W), [(0, "raise", "a"), (W, "flush", ""), (2 * W, "flush", "")], [(0, "a", 1, False)]),
    ("a repeat after a quiet window is published at once",
     AlertPolicy(W), [(0, "raise", "a"), (W + 5, "raise", "a")], [(0, "a", 1, False), (W + 5, "a", 2, False)]),
    ("resolve carries the total count",
     AlertPolicy(W), [(0, "raise", "a"), (1, "raise", "a"), (2, "resolve", "a")],
     [(0, "a", 1, False), (2, "a", 2, True)]),
    ("resolving an unknown key does nothing", AlertPolicy(W), [(0, "resolve", "a")], []),
    ("a new episode after a resolve publishes at once",
     AlertPolicy(W), [(0, "raise", "a"), (1, "resolve", "a"), (2, "raise", "a")],
     [(0, "a", 1, False), (1, "a", 1, True), (2, "a", 1, False)]),
    ("keys are independent",
     AlertPolicy(W), [(0, "raise", "a"), (0, "raise", "b"), (1, "raise", "a")],
     [(0, "a", 1, False), (0, "b", 1, False)]),
    ("per-tenant rate: the third key waits for a token, its count is kept",
     AlertPolicy(W, rate_per_key=0, rate_per_tenant=2),
     [(0, "raise", "a"), (0, "raise", "b"), (0, "raise", "c"), (1, "raise", "c"), (10, "flush", ""),
      (30, "flush", "")],
     [(0, "a", 1, False), (0, "b", 1, False), (30, "c", 2, False)]),
    ("flapping under the per-key limit is reported once, resolved, with its count",
     AlertPolicy(W, rate_per_key=1),
     [(0, "raise", "a"), (1, "resolve", "a"), (2, "raise", "a"), (3, "resolve", "a"), (4, "raise", "a"),
      (5, "resolve", "a"), (30, "flush", ""), (61, "flush", "")],
     [(0, "a", 1, False), (1, "a", 1, True), (61, "a", 2, True)]),
    ("a held-back episode that is raised again keeps counting",
     AlertPolicy(W, rate_per_key=1),
     [(0, "raise", "a"), (1, "resolve", "a"), (2, "raise", "a"), (3, "raise", "a"), (61, "flush", "")],
     [(0, "a", 1, False), (1, "a", 1, True), (61, "a", 2, False)]),
]


@pytest.mark.parametrize(("policy", "script", "expected"), [row[1:] for row in TABLE],
                         ids=[row[0] for row in TABLE])
def test_book(policy: AlertPolicy, script: list[tuple[float, str, str]],
              expected: list[tuple[float, str, int, bool]]) -> None:
    assert run(AlertBook(policy), script) == expected


def test_payload_is_the_contract_shape_and_ids_name_the_message() -> None:
    book = AlertBook()
    first = book.raise_(Alert("node-lost", "critical", "node-lost:n1", "gone", {"a": 1}, {"node": "n1"}), 0.0)[0]
    assert set(first.payload) == {"kind", "severity", "key", "tenant", "summary", "details", "labels", "firstSeen",
                                  "lastSeen", "count", "resolved"}
    assert first.payload["firstSeen"] == "1970-01-01T00:00:00Z" and first.payload["count"] == 1
    assert first.payload["tenant"] is None  # about a node: the fleet's
    claim = book.raise_(Alert("claim-rejected", "warning", "claim-rejected:vision/a", "no", {}, {"tenant": "vision"}),
                        0.0)[0]
    assert claim.payload["tenant"] == "vision"
    resolved = book.resolve("node-lost:n1", 5.0, "back")[0]
    assert resolved.payload["resolved"] is True and resolved.payload["summary"] == "back"
    assert resolved.msg_id != first.msg_id
    assert first.msg_id == Message(first.alert, 0.0, 0.0, 1, False).msg_id  # same content, same id


def test_restored_alert_folds_and_resolves() -> None:
    book = AlertBook(AlertPolicy(W))
    book.restore(an_alert("a"), first_seen=0.0, last_seen=0.0, count=4)
    assert book.raise_(an_alert("a"), 1.0) == []
    assert [(m.count, m.resolved) for m in book.resolve("a", 2.0)] == [(5, True)]


def test_a_long_running_book_forgets_closed_keys() -> None:
    book = AlertBook(AlertPolicy(W))
    for i in range(500):
        book.raise_(an_alert(f"k{i}", f"t{i % 7}"), float(i))
        book.resolve(f"k{i}", float(i) + 0.5)
    book.flush(10_000.0)
    assert book.open_keys() == []
    assert (book._key_buckets, book._tenant_buckets, book._last_first_seen) == ({}, {}, {})


# --- hypothesis: counts add up, ends are reported ------------------------------------------------

ops = st.lists(st.tuples(st.sampled_from(["raise", "resolve", "wait"]), st.sampled_from(["a", "b", "c"]),
                         st.sampled_from(["t1", "t2"]), st.floats(0, 200)), max_size=60)
policies = st.builds(AlertPolicy, fold_window=st.sampled_from([0.0, 10.0, 300.0]),
                     rate_per_key=st.sampled_from([0.0, 1.0, 6.0]), rate_per_tenant=st.sampled_from([0.0, 1.0, 3.0]))


@settings(max_examples=300, deadline=None)
@given(ops, policies)
def test_published_counts_add_up_and_ends_are_reported(script: list[tuple[str, str, str, float]],
                                                        policy: AlertPolicy) -> None:
    book, now = AlertBook(policy), 0.0
    sent: list[Message] = []
    raises: dict[str, int] = defaultdict(int)
    last: dict[str, str] = {}
    tenant_of: dict[str, str] = {}
    for op, key, tenant, dt in script:
        tenant = tenant_of.setdefault(key, tenant)  # a key belongs to one tenant
        if op == "raise":
            raises[key] += 1
            last[key] = op
            sent += book.raise_(an_alert(key, tenant), now)
        elif op == "resolve":
            last[key] = op
            sent += book.resolve(key, now)
        else:
            now += dt
            sent += book.flush(now)
    for _ in range(len(script) + 2):  # let the buckets refill and every window close
        now += 3600
        sent += book.flush(now)
    episodes: dict[tuple[str, str], int] = {}
    for m in sent:
        episode = (m.alert.key, m.payload["firstSeen"])
        assert m.count >= episodes.get(episode, 0), "counts within an episode never go down"
        episodes[episode] = m.count
    published: dict[str, int] = defaultdict(int)
    for (key, _), count in episodes.items():
        published[key] += count
    assert dict(published) == {k: v for k, v in raises.items() if v}
    for key in published:
        final = [m for m in sent if m.alert.key == key][-1]
        assert final.resolved == (last[key] == "resolve"), key


# --- rules ----------------------------------------------------------------------------------------


SEQUENCE = itertools.count(1)


def status(state: str, name: str = "c", tenant: str = "t", **extra: Any) -> dict[str, Any]:
    """The allocator's statuses of a claim carry increasing sequences."""
    return {"namespace": tenant, "name": name, "state": state, "reason": "why", "sequence": next(SEQUENCE),
            **extra}


def test_a_status_older_than_one_read_already_changes_nothing() -> None:
    """A status published again after a failed publish may arrive after a newer one."""
    claims = rules.ClaimRules(600)
    pending, allocated = status("Pending"), status("Allocated")
    claims.on_status(allocated, 0)
    assert claims.on_status(pending, 1) == [] and claims.waiting == {}
    claims.on_status(status("Released"), 2)
    assert claims.sequences == {}  # the claim's story ended: nothing kept for it
    claims.on_status(status("Pending"), 3)
    assert ("t", "c") in claims.waiting  # the name's next claim, its sequence carried on


def kinds(actions: list[Action]) -> list[tuple[str, str]]:
    return [("raise", a.alert.key) if isinstance(a, Raise) else ("resolve", a.key) for a in actions]


@pytest.mark.parametrize(("state", "extra", "raised"), [
    ("Rejected", {}, ["claim-rejected:t/c"]),
    ("Pending", {}, []),
    ("Pending", {"unsatisfiable": True}, ["claim-unsatisfiable:t/c"]),
    ("Pending", {"unsatisfiable": False}, []),
    ("Preempted", {"by": "u/hi"}, ["claim-preempted:t/c"]),
    ("Allocated", {}, []),
])
def test_claim_rules_raise(state: str, extra: dict[str, Any], raised: list[str]) -> None:
    actions = rules.ClaimRules(600).on_status(status(state, **extra), 0)
    assert [k for op, k in kinds(actions) if op == "raise"] == raised


def test_preempted_names_the_preemptor_and_the_victims_tenant() -> None:
    [alert] = [a.alert for a in rules.ClaimRules(600).on_status(status("Preempted", by="u/hi"), 0)
               if isinstance(a, Raise)]
    assert alert.labels["tenant"] == "t" and alert.details["by"] == "u/hi" and "by u/hi" in alert.summary


def test_pending_too_long_uses_the_tenant_threshold_once_and_resolves() -> None:
    claims = rules.ClaimRules(600)
    claims.thresholds["fast"] = 60
    claims.on_status(status("Pending", "a", "fast"), 0)
    claims.on_status(status("Pending", "b", "slow"), 0)
    assert kinds(claims.due(59)) == []
    assert kinds(claims.due(60)) == [("raise", "claim-pending-too-long:fast/a")]
    assert kinds(claims.due(599)) == []
    assert kinds(claims.due(600)) == [("raise", "claim-pending-too-long:slow/b")]
    allocated = claims.on_status(status("Allocated", "a", "fast"), 700)
    assert ("resolve", "claim-pending-too-long:fast/a") in kinds(allocated)


def inventory(node: str = "n1", at: float = 0.0, removed: bool = False, **devices: str) -> dict[str, Any]:
    return {"node": node, "observedAtUnix": at, "removed": removed,
            "telemetry": {"devices": {d: {"health": h, "temperatureC": 90} for d, h in devices.items()}}}


def test_inventory_rules() -> None:
    fleet = rules.InventoryRules(ttl=90)
    assert kinds(fleet.on_inventory(inventory("ghost", removed=True), 0)) == []  # never had it
    assert kinds(fleet.on_inventory(inventory(at=10, gpu0="Healthy"), 10)) == [
        ("resolve", "device-unhealthy:n1/gpu0"), ("resolve", "device-throttled:n1/gpu0")]
    assert kinds(fleet.on_inventory(inventory(at=10, gpu0="Unhealthy"), 11))[0] == ("raise", "device-unhealthy:n1/gpu0")
    assert kinds(fleet.on_inventory(inventory(at=10, gpu0="Throttled"), 12))[0] == ("raise", "device-throttled:n1/gpu0")
    assert kinds(fleet.due(99)) == []
    assert kinds(fleet.due(100)) == [("raise", "inventory-stale:n1")]  # last heard at 10: the TTL has passed
    assert kinds(fleet.due(200)) == []  # once per stale spell
    assert ("resolve", "inventory-stale:n1") in kinds(fleet.on_inventory(inventory(at=200), 200))
    assert kinds(fleet.on_inventory(inventory(removed=True), 201))[0] == ("raise", "node-lost:n1")
    assert kinds(fleet.on_inventory(inventory(at=202), 202))[0] == ("resolve", "node-lost:n1")


@pytest.mark.parametrize(("used", "nominal", "borrowing", "fires"), [
    (9, 10, None, True), (8, 10, None, False), (10, 8, 4, False), (11, 8, 4, True), (0, 0, None, False)])
def test_quota_near_limit(used: int, nominal: int, borrowing: int | None, fires: bool) -> None:
    [action] = rules.quota_near_limit([rules.QuotaUsage("t", "H100", used, nominal, borrowing)])
    assert isinstance(action, Raise) == fires
    assert alert_key("quota-near-limit", "t", "H100") == (action.alert.key if isinstance(action, Raise)
                                                           else action.key)


@pytest.mark.parametrize(("pending", "idle", "raised"), [
    ({"A100": 2}, {"H100": 3}, ["idle-larger-flavor:A100"]),
    ({"A100": 2}, {"H100": 0}, []),
    ({"H100": 2}, {"A100": 3}, []),  # a smaller flavor idling is not a hint
    ({"A100": 0}, {"H100": 3}, []),
])
def test_idle_larger_flavor(pending: dict[str, int], idle: dict[str, int], raised: list[str]) -> None:
    actions = rules.idle_larger_flavor(pending, idle, {"A100": 1.0, "H100": 2.0})
    assert [k for op, k in kinds(actions) if op == "raise"] == raised


def test_rules_through_the_book() -> None:
    book, claims = AlertBook(), rules.ClaimRules(600)
    first = apply(book, claims.on_status(status("Rejected"), 0), 0)
    assert [m.alert.kind for m in first] == ["claim-rejected"]
    assert apply(book, claims.on_status(status("Rejected"), 1), 1) == []
    ended = apply(book, claims.on_status(status("Released"), 2), 2)
    assert [(m.alert.kind, m.count, m.resolved) for m in ended] == [("claim-rejected", 2, True)]
