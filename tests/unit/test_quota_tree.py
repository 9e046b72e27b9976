"""Nested cohorts (contract, Quotas; Kueue KEP-79): the Quotas document's tree and its refusals, the tree
rule as admission applies it (borrowing up the tree within borrowingLimit, lending within lendingLimit),
reclaim down the tree from the nearest borrowers first, reasons that name the cohort whose limit binds,
and the invariant recount of the tree (shared/admission/invariant.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from shared.admission.cycle import run_cycle
from shared.admission.flavors import Flavors
from shared.admission.invariant import held_per_flavor, violations
from shared.admission.kept import KeptState
from shared.admission.model import Running, Snapshot, Waiting
from shared.admission.quota import (
    CohortQuota,
    QuotaConfig,
    QuotaFileError,
    QuotaLimit,
    duration_text,
    parse_quotas,
)
from shared.dra.classes import BUILTIN_CLASSES
from shared.dra.inventory import Fleet
from shared.dra.matching import SelectorMemo
from shared.dra.results import Allocation, DeviceResult, State
from tests.builders import a_claim, fleet, node


def quotas(cohorts: list[dict[str, Any]], tenants: list[dict[str, Any]]) -> QuotaConfig:
    return parse_quotas({"kind": "Quotas", "cohorts": cohorts, "tenants": tenants})


# -- the document -------------------------------------------------------------------------------------------


def test_cohorts_nest_with_quotas_of_their_own_and_export_as_they_were_read() -> None:
    config = parse_quotas({"kind": "Quotas", "fairSharing": {"halfLife": "24h"}, "cohorts": [
        {"name": "org"},
        {"name": "research", "parent": "org", "quotas": {"H100": {"nominal": 8, "borrowingLimit": 8,
                                                                  "lendingLimit": 4}}}],
        "tenants": [{"name": "vision", "cohort": "research", "quotas": {"H100": {"nominal": 8}}}]})
    assert config.half_life == 86400
    assert config.cohorts == ("org", "research")
    assert config.cohort("research") == CohortQuota("research", "org", {"H100": QuotaLimit(8, 8, 4)})
    assert config.cohort("org") == CohortQuota("org")
    assert config.nested and config.ancestors("research") == ["research", "org"]
    assert parse_quotas(config.to_document()) == config


@pytest.mark.parametrize("document", [
    {"kind": "Quotas", "cohorts": [{"name": "lab"}], "tenants": [{"name": "t", "cohort": "lab"}]},
    {"kind": "Quotas", "cohorts": ["lab"], "tenants": [{"name": "t", "cohort": "lab"}]},
    {"kind": "Quotas", "tenants": [{"name": "t", "cohort": "lab"}]},
], ids=["objects", "names", "named-by-a-tenant"])
def test_old_documents_parse_and_mean_what_they_meant(document: dict[str, Any]) -> None:
    config = parse_quotas(document)
    assert config.cohorts == ("lab",) and config.cohort_tree == {} and not config.nested
    assert config.half_life == 0 and "fairSharing" not in config.to_document()
    assert config.to_document()["cohorts"] == [{"name": "lab"}]


@pytest.mark.parametrize(("cohorts", "message"), [
    ([{"name": "a", "parent": "b"}, {"name": "b", "parent": "a"}],
     "Quotas: cohorts: a cohort may not be its own ancestor: a -> b -> a"),
    ([{"name": "a", "parent": "a"}], "a cohort may not be its own ancestor: a -> a"),
    ([{"name": "a", "parent": "nowhere"}], "cohorts[0].parent: cohort 'a' names parent 'nowhere', which is no cohort"),
    ([{"name": "a", "quotas": {"H999": {"nominal": 1}}}], "cohorts[0].quotas.H999: unknown flavor"),
    ([{"name": "a", "quotas": {"H100": {"nominal": 1, "lendingLimit": 2}}}],
     "cohorts[0].quotas.H100.lendingLimit: 2 is more than the nominal quota 1"),
    ([{"name": "a", "parent": "b", "colour": "red"}, {"name": "b"}], "cohorts[0].colour: unknown field"),
    ([{"name": "a", "parent": "b"}, {"name": "a"}, {"name": "b"}], "cohorts[1].name: cohort 'a' is listed twice"),
], ids=["cycle", "own-parent", "unknown-parent", "unknown-flavor", "lending-over-nominal", "unknown-field", "twice"])
def test_a_tree_that_cannot_be_is_refused_naming_the_cohorts(cohorts: list[dict[str, Any]], message: str) -> None:
    with pytest.raises(QuotaFileError, match=None) as refused:
        quotas(cohorts, [])
    assert message in str(refused.value)


@pytest.mark.parametrize(("fair_sharing", "message"), [
    ({"halfLife": "soon"}, "fairSharing.halfLife: invalid duration"),
    ({"halfLife": "1h", "window": "1w"}, "fairSharing.window: unknown field"),
    ("24h", "fairSharing: expected a mapping"),
])
def test_a_half_life_that_does_not_read_is_refused(fair_sharing: Any, message: str) -> None:
    with pytest.raises(QuotaFileError) as refused:
        parse_quotas({"kind": "Quotas", "fairSharing": fair_sharing})
    assert message in str(refused.value)


# -- the tree rule, KEP-79's example: a root of 16, two organisations of 8 that lend it 4 each -------------

KEP: list[dict[str, Any]] = [
       {"name": "root"},
       {"name": "org-a", "parent": "root", "quotas": {"H100": {"nominal": 8, "lendingLimit": 4}}},
       {"name": "org-b", "parent": "root", "quotas": {"H100": {"nominal": 8, "lendingLimit": 4}}}]
TEAMS = [{"name": "a1", "cohort": "org-a"}, {"name": "b1", "cohort": "org-b"}]
SIXTEEN = fleet(*node("n0", "H100", 8), *node("n1", "H100", 8))


def kep(org_b: dict[str, Any] | None = None) -> QuotaConfig:
    cohorts = [dict(c) for c in KEP]
    if org_b:
        cohorts[2]["quotas"] = {"H100": {"nominal": 8, "lendingLimit": 4, **org_b}}
    return quotas(cohorts, TEAMS)


def wait(name: str, tenant: str, count: int, *, arrival: int = 0, preemptible: bool = True) -> Waiting:
    return Waiting(tenant, name, a_claim(name, tenant).request(count=count).build(), 0, preemptible, arrival)


@dataclass
class Shell:
    """Cycles over one fleet and quotas, applied as the allocator applies them; the invariants checked
    after each."""

    fleet: Fleet
    quotas: QuotaConfig
    running: dict[tuple[str, str], Running] = field(default_factory=dict)
    kept: KeptState = field(default_factory=KeptState)
    last: dict[str, Any] = field(default_factory=dict)
    preempted: list[tuple[str, str, str]] = field(default_factory=list)  # (tenant, claim, rule)

    def cycle(self, *waiting: Waiting) -> None:
        result = run_cycle(Snapshot(self.fleet, BUILTIN_CLASSES, self.quotas, tuple(self.running.values()),
                                    tuple(w for w in waiting if w.key not in self.running)), self.kept)
        for p in result.preemptions:
            del self.running[p.victim]
            self.preempted.append((*p.victim, p.rule))
        for d in result.decisions:
            self.last[d.name] = d.decision
            if d.decision.allocation is not None:
                w = next(w for w in waiting if w.key == (d.tenant, d.name))
                self.running[w.key] = Running(w.tenant, w.name, d.decision.allocation, w.priority, w.preemptible,
                                              w.arrival, len(self.running) + 100 + w.arrival)
        assert violations(self.fleet, self.quotas, self.running.values()) == []

    def held(self) -> dict[str, int]:
        flavors = Flavors(self.quotas.flavors, SelectorMemo())
        return {t: h.get("H100", 0) for t, h in held_per_flavor(self.fleet, self.running.values(), flavors).items()}


@dataclass
class TreeRow:
    quotas: QuotaConfig
    asks: list[Waiting]  # in one cycle
    held: dict[str, int]
    pending: str | None = None  # a claim left Pending, and part of its reason
    reason: str = ""


B_FOUR = [wait(f"b{i}", "b1", 4, arrival=i) for i in range(4)]
TREE_ROWS = {
    # org-b borrows up to the root: its own 8 and the 4 org-a lends it; org-a keeps 4 (lendingLimit)
    "borrow-up-to-what-the-sibling-lends": TreeRow(kep(), B_FOUR, {"b1": 12}, "b3",
                                                   "cohort org-b has 0 of its pool of 8 free; cohort root has 0"),
    # org-b's borrowingLimit 2: its subtree holds at most its nominal 8 plus 2
    "a-cohort-borrows-within-its-borrowing-limit": TreeRow(
        kep({"borrowingLimit": 2}), [*B_FOUR[:2], wait("b2", "b1", 2, arrival=2), wait("b3", "b1", 1, arrival=3)],
        {"b1": 10}, "b3", "cohort org-b may draw only 0 more from cohort root (it lends cohort root 4 and its "
                          "borrowingLimit is 2; its subtree draws 6)"),
    # borrowingLimit 0: nothing beyond its own 8
    "borrowing-limit-zero-keeps-a-cohort-to-its-nominal": TreeRow(
        kep({"borrowingLimit": 0}), B_FOUR, {"b1": 8}, "b2", "cohort org-b may draw only 0 more"),
    # both organisations use their own: neither lends what it uses
    "each-organisation-uses-its-own": TreeRow(
        kep(), [wait("a", "a1", 8), wait("b", "b1", 8)], {"a1": 8, "b1": 8}),
}


@pytest.mark.parametrize("row", TREE_ROWS.values(), ids=list(TREE_ROWS))
def test_the_tree_rule(row: TreeRow) -> None:
    shell = Shell(SIXTEEN, row.quotas)
    shell.cycle(*row.asks)
    assert shell.held() == row.held
    if row.pending is not None:
        decision = shell.last[row.pending]
        assert decision.state is State.PENDING
        assert row.reason in (decision.reason or ""), decision.reason


def test_reclaim_down_the_tree_takes_back_what_the_sibling_lent() -> None:
    """org-b borrows org-a's 4 lent H100; org-a's team asks for its organisation's 8: the 4 it keeps, and
    the 4 it lent back by reclaim from org-b's team, whose shares do not matter."""
    shell = Shell(SIXTEEN, kep())
    shell.cycle(*B_FOUR[:3])
    assert shell.held() == {"b1": 12}
    shell.cycle(wait("a", "a1", 8, arrival=10))
    assert shell.last["a"].state is State.ALLOCATED
    assert shell.preempted == [("b1", "b2", "reclaim")]
    assert shell.held() == {"a1": 8, "b1": 8}


def test_a_tenant_without_room_in_its_organisation_does_not_reclaim() -> None:
    """a1 already holds org-a's 8: asking for more, it would borrow; org-b's team keeps what it holds."""
    shell = Shell(SIXTEEN, kep())
    shell.cycle(wait("a", "a1", 8), *B_FOUR[:2])
    shell.cycle(wait("more", "a1", 1, arrival=10))
    assert shell.preempted == [] and shell.last["more"].state is State.PENDING


# three levels: root > org-a > (team-x, team-y), root > org-b; x1 lends its 4, y1 (a sibling team, one
# level up) and b1 (another organisation, two levels up) borrow them
THREE = quotas([{"name": "root"}, {"name": "org-a", "parent": "root"},
                {"name": "team-x", "parent": "org-a"}, {"name": "team-y", "parent": "org-a"},
                {"name": "org-b", "parent": "root", "quotas": {"H100": {"nominal": 4}}}],
               [{"name": "x1", "cohort": "team-x", "quotas": {"H100": {"nominal": 4}}},
                {"name": "y1", "cohort": "team-y"}, {"name": "b1", "cohort": "org-b"}])


def test_reclaim_takes_from_the_nearest_borrower_first() -> None:
    """x1 wants 2 of its 4 back: y1 (nearest: they share org-a) gives them, not b1 (they share only the root),
    although b1's claim of the same size was allocated more recently (which would go first between equals)."""
    shell = Shell(fleet(*node("n0", "H100", 8)), THREE)
    shell.cycle(wait("y", "y1", 2, arrival=1))
    shell.cycle(wait("b-own", "b1", 4, arrival=2), wait("b-more", "b1", 2, arrival=3))
    assert shell.held() == {"y1": 2, "b1": 6}
    shell.cycle(wait("x", "x1", 2, arrival=10))
    assert shell.last["x"].state is State.ALLOCATED
    assert shell.preempted == [("y1", "y", "reclaim")]
    assert shell.held() == {"x1": 2, "b1": 6}


def test_flat_cohorts_reclaim_and_order_as_before() -> None:
    """One level (no parents, no cohort quotas): the book runs its flat arithmetic, reclaim is within the cohort."""
    config = quotas([{"name": "lab"}], [{"name": "t1", "cohort": "lab", "quotas": {"H100": {"nominal": 4}}},
                                        {"name": "t2", "cohort": "lab", "quotas": {"H100": {"nominal": 4}}}])
    assert not config.nested
    shell = Shell(fleet(*node("n0", "H100", 8)), config)
    shell.cycle(wait("a", "t2", 6))
    shell.cycle(wait("b", "t1", 4, arrival=5))
    assert shell.preempted == [("t2", "a", "reclaim")]


# -- the recount --------------------------------------------------------------------------------------------


def _run(tenant: str, name: str, keys: list[tuple[str, str, str]]) -> Running:
    return Running(tenant, name, Allocation(keys[0][1], tuple(DeviceResult("gpu", *k) for k in keys)))


def test_the_recount_checks_every_level_of_the_tree() -> None:
    keys = [d.key for d in SIXTEEN.devices]
    capped = kep({"borrowingLimit": 2})
    # b1 holds 11: org-b's subtree is over its nominal 8 plus its borrowingLimit 2 (T = 8 - 11 = -3)
    assert violations(SIXTEEN, capped, [_run("b1", "x", keys[:11])]) == [
        "cohort org-b: T(H100) = -3, below minus its borrowingLimit 2 (KEP-79)",
        "cohort org-b's subtree holds 11 H100, over its nominal 8 plus its borrowingLimit 2"]
    assert violations(SIXTEEN, capped, [_run("b1", "x", keys[:10])]) == []
    # a1 holds 3 and b1 holds 13: org-a lends only 4, so b1's fifth borrowed H100 is one org-a keeps
    assert violations(SIXTEEN, kep(), [_run("a1", "y", keys[:3]), _run("b1", "x", keys[3:16])]) == [
        "top cohorts draw 1 H100 beyond their subtrees' quota, over the free capacity 0"]
    assert violations(SIXTEEN, kep(), [_run("a1", "y", keys[:6]), _run("b1", "x", keys[6:16])]) == []
    assert violations(SIXTEEN, kep(), [_run("a1", "y", keys[:4]), _run("b1", "x", keys[4:16])]) == []
    tenant_capped = quotas(KEP, [{"name": "b1", "cohort": "org-b", "quotas": {"H100": {"nominal": 0,
                                                                                     "borrowingLimit": 3}}}])
    assert violations(SIXTEEN, tenant_capped, [_run("b1", "x", keys[:4])]) == [
        "tenant b1 holds 4 H100, over its nominal 0 plus its borrowingLimit 3"]


def test_fair_share_works_between_the_cohorts_of_one_tree() -> None:
    """Two teams under one root that holds the quota: y1 took all 8 H100; x1, with no nominal of its own or
    its team's to reclaim, takes a share of them by fair share, as between cohorts that do not nest (its
    share afterwards, 4, stays below y1's, 12). Cohort-mates still only reclaim from each other."""
    config = quotas([{"name": "root", "quotas": {"H100": {"nominal": 8}}},
                     {"name": "team-x", "parent": "root"}, {"name": "team-y", "parent": "root"}],
                    [{"name": "x1", "cohort": "team-x"}, {"name": "y1", "cohort": "team-y"},
                     {"name": "y2", "cohort": "team-y"}])
    shell = Shell(fleet(*node("n0", "H100", 8)), config)
    shell.cycle(*(wait(f"y{i}", "y1", 2, arrival=i) for i in range(4)))
    assert shell.held() == {"y1": 8}
    shell.cycle(wait("mate", "y2", 2, arrival=9))
    assert shell.preempted == [] and shell.last["mate"].state is State.PENDING
    shell.cycle(wait("x", "x1", 2, arrival=10))
    assert shell.last["x"].state is State.ALLOCATED
    assert [(t, rule) for t, _, rule in shell.preempted] == [("y1", "fair-share")]
    assert shell.held() == {"x1": 2, "y1": 6}


def test_the_answer_says_which_cohort_limit_to_raise() -> None:
    shell = Shell(SIXTEEN, kep({"borrowingLimit": 2}))
    shell.cycle(*B_FOUR)
    result = run_cycle(Snapshot(SIXTEEN, BUILTIN_CLASSES, shell.quotas, tuple(shell.running.values()),
                                (B_FOUR[2],)), shell.kept)
    [decided] = result.decisions
    assert decided.explain is not None
    assert decided.explain["quota"][0]["cohortLimit"] == {"cohort": "org-b", "borrowingLimit": 2, "enough": 4}
    assert decided.explain["toAdmit"][0].startswith("raise cohort org-b's H100 borrowingLimit from 2 to 4")


@pytest.mark.parametrize(("seconds", "text"), [(0.0, "0s"), (0.5, "0.5s"), (90.0, "90s"), (120.0, "2m"),
                                               (3600.0, "1h"), (14 * 86400.0, "14d"), (10_000_000.25, "10000000.25s")])
def test_exported_durations_read_back_exactly(seconds: float, text: str) -> None:
    """`:g` wrote a 14-day half-life as 1.2096e+06s, which the Quotas parser refuses."""
    assert duration_text(seconds) == text
    document = {"kind": "Quotas", "fairSharing": {"halfLife": text},
                "tenants": [{"name": "t", "minRuntime": text, "quotas": {}}]}
    config = parse_quotas(document)
    assert (config.half_life, config.tenants["t"].min_runtime) == (seconds, seconds)
    assert parse_quotas(config.to_document()) == config
