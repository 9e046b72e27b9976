"""shared/fleet/freshness.py: the one rule by which the allocator, /v1/nodes and the notifier judge a node."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from shared.alerts import rules
from shared.fleet.freshness import Freshness, iso, judge
from shared.settings import BrokerSettings

T = 1_800_000_000.0  # 2027-01-15T08:00:00Z


@pytest.mark.parametrize(("last_heard", "now", "removed", "freshness", "age"), [
    (T, T, False, Freshness.FRESH, 0.0),
    (T, T + 89.9, False, Freshness.FRESH, 89.9),
    (T, T + 90, False, Freshness.STALE, 90.0),  # the TTL has passed: stale, for every reader alike
    (T, T + 3600, False, Freshness.STALE, 3600.0),
    (T + 5, T, False, Freshness.FRESH, -5.0),  # a watcher's clock ahead of the reader's: heard "later"
    (None, T, False, Freshness.FRESH, None),  # no time known (a what-if's proposed node): never stale
    (0.0, T, False, Freshness.FRESH, None),  # a fleet node built without a message carries 0
    (T, T + 1, True, Freshness.LOST, 1.0),  # its removal was heard
    (T, T + 3600, True, Freshness.LOST, 3600.0),  # lost wins over stale
])
def test_judge(last_heard: float | None, now: float, removed: bool, freshness: Freshness, age: float | None) -> None:
    verdict = judge(last_heard, now, 90.0, removed=removed)
    assert verdict.freshness is freshness
    assert verdict.age == pytest.approx(age) if age is not None else verdict.age is None
    assert verdict.stale is (freshness is Freshness.STALE)
    assert bool(verdict.reason) is (freshness is not Freshness.FRESH)


def test_the_reason_names_the_time_and_the_ttl_and_stays_put_while_nothing_is_heard() -> None:
    """The allocator compares the reasons of its unusable nodes cycle to cycle: a reason with the age in it
    would change every cycle and rebuild the decision core's state."""
    first, later = judge(T, T + 90, 90.0), judge(T, T + 500, 90.0)
    assert first.reason == later.reason == "stale inventory: last heard 2027-01-15T08:00:00Z, over the 90s TTL"
    assert judge(T, T + 3, 2.5).reason.endswith("over the 2.5s TTL")
    assert iso(T + 0.9) == "2027-01-15T08:00:00Z"


def inventory(at: float, node: str = "n1", removed: bool = False) -> dict[str, object]:
    return {"node": node, "observedAtUnix": at, "removed": removed}


def kinds(actions: list[rules.Action]) -> list[tuple[str, str]]:
    return [("raise" if isinstance(a, rules.Raise) else "resolve", a.alert.key if isinstance(a, rules.Raise)
             else a.key) for a in actions]


def test_the_notifier_judges_as_the_allocator_does_on_every_message_heartbeats_included() -> None:
    """The same messages and clock: the notifier raises inventory-stale exactly when judge says stale."""
    fleet = rules.InventoryRules(ttl=90)
    for at in (T, T + 30, T + 60, T + 90, T + 120):  # heartbeats every 30 s, far past the first one's TTL
        assert kinds(fleet.on_inventory(inventory(at), at)) == []
        assert kinds(fleet.due(at + 29)) == []
    assert not judge(T + 120, T + 209, 90).stale and kinds(fleet.due(T + 209)) == []
    assert judge(T + 120, T + 210, 90).stale and kinds(fleet.due(T + 210)) == [("raise", "inventory-stale:n1")]
    assert kinds(fleet.due(T + 400)) == []  # once per stale spell
    assert kinds(fleet.on_inventory(inventory(T + 120), T + 400)) == []  # a late copy of an old one: still stale
    assert kinds(fleet.on_inventory(inventory(T + 400), T + 400)) == [("resolve", "inventory-stale:n1")]


def test_the_notifier_seeded_from_open_alerts_resolves_them_when_the_replay_shows_the_node_back() -> None:
    """A restart: the ledger holds inventory-stale for n1 and node-lost for n2 open; the stream's replay shows
    both fresh, which resolves both (without the seed, neither would ever resolve)."""
    fleet = rules.InventoryRules(ttl=90)
    fleet.seed(stale=["n1", "n3"], lost=["n2"])
    assert ("resolve", "inventory-stale:n1") in kinds(fleet.on_inventory(inventory(T), T + 1))
    assert ("resolve", "node-lost:n2") in kinds(fleet.on_inventory(inventory(T, "n2"), T + 1))
    assert kinds(fleet.on_inventory(inventory(T, "n3"), T + 100)) == []  # its last word is still stale
    assert kinds(fleet.due(T + 200)) == [("raise", "inventory-stale:n1"), ("raise", "inventory-stale:n2")]  # not n3:
    # its alert is open already
    assert kinds(fleet.on_inventory(inventory(T + 300), T + 300)) == [("resolve", "inventory-stale:n1")]
    fleet.seed(stale=["n1"])  # a node it knows keeps what it knows (a rebuild from the ledger)
    assert not fleet.nodes["n1"].stale


@pytest.mark.parametrize(("ttl", "heartbeat", "accepted"), [
    ("90s", "30s", True), ("60s", "30s", True), ("59s", "30s", False), ("90s", "1m", False), ("4s", "400ms", True)])
def test_settings_refuse_a_ttl_that_heartbeats_cannot_keep(ttl: str, heartbeat: str, accepted: bool) -> None:
    """The settings every container shares: a TTL under two heartbeat intervals would grey live nodes."""
    values = {"inventory_ttl": ttl, "heartbeat_interval": heartbeat}
    if accepted:
        BrokerSettings.model_validate(values)
    else:
        with pytest.raises(ValidationError, match="must be at least twice heartbeat_interval"):
            BrokerSettings.model_validate(values)
