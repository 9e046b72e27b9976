"""What-if on a snapshot: a quota raise admits exactly the claims it lets in, a drain preempts exactly the
drained node's claims, a cut quota lists exactly the claims beyond it, a removed tenant frees its devices,
and the same inputs give the same answer."""

from __future__ import annotations

from typing import Any

from shared.admission.cycle import run_cycle
from shared.admission.model import Running, Snapshot, Waiting
from shared.admission.quota import QuotaConfig, parse_quotas
from shared.admission.whatif import Change, WhatIf, what_if
from shared.dra import model as dra
from shared.dra.classes import BUILTIN_CLASSES
from shared.dra.inventory import Fleet
from tests.builders import a_claim, fleet, node


def quotas(*tenants: dict[str, Any]) -> QuotaConfig:
    return parse_quotas({"kind": "Quotas", "cohorts": [{"name": "r"}], "tenants": list(tenants)})


def waiting(name: str, tenant: str, arrival: int, count: int = 1) -> Waiting:
    return Waiting(tenant, name, a_claim(name, tenant).request(count=count).build(), 0, True, arrival)


def today(f: Fleet, config: QuotaConfig, claims: list[Waiting]
          ) -> tuple[list[Running], list[Waiting], dict[tuple[str, str], dra.ResourceClaim]]:
    """What the allocator would hold after deciding `claims`: who runs, who waits, and their documents."""
    result = run_cycle(Snapshot(f, BUILTIN_CLASSES, config, (), tuple(claims)))
    by_key = {w.key: w for w in claims}
    running = [Running(d.tenant, d.name, d.decision.allocation, 0, True, by_key[(d.tenant, d.name)].arrival, i)
               for i, d in enumerate(result.decisions) if d.decision.allocation is not None]
    held = {r.key for r in running}
    return running, [w for w in claims if w.key not in held], {w.key: w.claim for w in claims}


def ask(f: Fleet, config: QuotaConfig, claims: list[Waiting], change: Change) -> WhatIf:
    running, queued, documents = today(f, config, claims)
    return what_if(f, BUILTIN_CLASSES, config, running, queued, documents, change)


def test_a_quota_raise_admits_exactly_the_claims_it_lets_in() -> None:
    f = fleet(*node("h", "H100", 4))
    config = quotas({"name": "t", "cohort": "r", "quotas": {"H100": {"nominal": 1, "borrowingLimit": 0}}},
                    {"name": "u", "cohort": "r", "quotas": {"H100": {"nominal": 1, "borrowingLimit": 0}}})
    claims = [waiting(f"t{i}", "t", i) for i in range(4)] + [waiting("u0", "u", 9)]
    raised = quotas({"name": "t", "cohort": "r", "quotas": {"H100": {"nominal": 3, "borrowingLimit": 0}}},
                    {"name": "u", "cohort": "r", "quotas": {"H100": {"nominal": 1, "borrowingLimit": 0}}})
    answer = ask(f, config, claims, Change(quotas=raised))
    assert answer.admitted == [("t", "t1"), ("t", "t2")]
    assert answer.preempted == [] and answer.over_quota_after == []
    assert answer.usage["t"]["H100"] == (1, 3) and answer.pending["t"] == (3, 1)


def test_a_drain_preempts_exactly_the_drained_nodes_claims() -> None:
    f = fleet(*node("a", "H100", 2), *node("b", "H100", 2))
    claims = [waiting(f"c{i}", "t", i) for i in range(4)]
    running, _, _ = today(f, QuotaConfig(), claims)
    on_a = sorted(r.key for r in running if r.allocation.node == "a")
    answer = ask(f, QuotaConfig(), claims, Change(drain=frozenset({"a"})))
    assert answer.preempted == [(key, "drain") for key in on_a] and len(on_a) == 2
    assert answer.admitted == []  # b is full: they wait
    assert answer.pending["t"] == (0, 2)


def test_a_cut_quota_lists_exactly_the_claims_beyond_it_newest_first() -> None:
    f = fleet(*node("h", "H100", 4))
    config = quotas({"name": "t", "cohort": "r", "quotas": {"H100": {"nominal": 4, "borrowingLimit": 0}}})
    claims = [waiting(f"t{i}", "t", i) for i in range(4)]
    cut = quotas({"name": "t", "cohort": "r", "quotas": {"H100": {"nominal": 1, "borrowingLimit": 1}}})
    answer = ask(f, config, claims, Change(quotas=cut))
    assert answer.over_quota_claims == [(("t", "t3"), "H100"), (("t", "t2"), "H100")]
    assert answer.over_quota_before == [] and answer.over_quota_after
    assert answer.preempted == []  # a cut alone preempts nothing: it lists what is beyond


def test_removing_a_tenant_frees_what_it_holds_for_the_others() -> None:
    f = fleet(*node("h", "H100", 2))
    config = quotas({"name": "greedy", "cohort": "r", "quotas": {"H100": {"nominal": 2}}},
                    {"name": "waiter", "cohort": "r", "quotas": {"H100": {"nominal": 0}}})
    claims = [waiting("g0", "greedy", 0), waiting("g1", "greedy", 1), waiting("w0", "waiter", 2)]
    answer = ask(f, config, claims, Change(remove_tenants=frozenset({"greedy"})))
    assert answer.admitted == [("waiter", "w0")]
    assert answer.usage["greedy"]["H100"] == (2, 0)


def test_the_same_inputs_give_the_same_answer() -> None:
    f = fleet(*node("a", "H100", 2), *node("b", "B200", 2))
    claims = [waiting(f"c{i}", t, i, count=1 + i % 2) for i, t in enumerate(["x", "y", "x", "y", "z", "x"])]
    change = Change(drain=frozenset({"a"}))
    assert ask(f, QuotaConfig(), claims, change).to_json() == ask(f, QuotaConfig(), claims, change).to_json()


def test_a_node_the_allocator_leaves_unused_stays_unused_in_what_if() -> None:
    """A stale node takes no claim today: what-if does not admit claims there, before or after a change."""
    from shared.fleet.freshness import stale_nodes

    f = fleet(*node("fresh", "H100", 2), *node("quiet", "H100", 2))
    claims = [waiting(f"c{i}", "t", i) for i in range(4)]
    unusable = stale_nodes({"fresh": 1_000.0, "quiet": 100.0}, now=1_050.0, ttl=90.0)
    assert list(unusable) == ["quiet"] and "stale inventory" in unusable["quiet"]
    documents = {w.key: w.claim for w in claims}
    assert what_if(f, BUILTIN_CLASSES, QuotaConfig(), [], claims, documents, Change()).pending["t"] == (0, 0)
    answer = what_if(f, BUILTIN_CLASSES, QuotaConfig(), [], claims, documents, Change(), unusable)
    assert answer.pending["t"] == (2, 2)  # two fit on the fresh node, before and after
    drained = what_if(f, BUILTIN_CLASSES, QuotaConfig(), [], claims, documents, Change(drain=frozenset({"quiet"})),
                      unusable)
    assert drained.pending["t"] == (2, 2)
