"""simulate's clock: Advance documents let time pass, Release documents release a claim, and the time rules
(minRuntime, maxPreemptionsPerMinute) hold as in the allocator. Table tests through `run_waves` and
`read_wave`, the entry points the CLI uses."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from shared.admission.quota import QuotaConfig, parse_quotas
from shared.admission.simulate import SIMULATION_START, run_waves
from shared.admission.wave_documents import Advance, Release, WaveFileError, WaveItem, read_wave
from shared.dra.classes import BUILTIN_CLASSES
from tests.builders import a_claim, fleet, labelled, node

FLEET = fleet(*node("h", "H100", 2))


def claim(name: str, tenant: str, count: int = 1, priority: int = 0) -> Any:
    builder = a_claim(name, tenant).request(count=count)
    if priority:
        builder.annotations["claimbroker.io/priority"] = str(priority)
    return builder.build()


def lab_quotas(vision: dict[str, Any] | None = None, nlp: dict[str, Any] | None = None) -> QuotaConfig:
    """vision has no H100 of its own and borrows nlp's; nlp may reclaim them."""
    return parse_quotas({"kind": "Quotas", "cohorts": [{"name": "lab"}], "tenants": [
        {"name": "vision", "cohort": "lab", "quotas": {"H100": {"nominal": 0}}, **(vision or {})},
        {"name": "nlp", "cohort": "lab", "quotas": {"H100": {"nominal": 2}}, **(nlp or {})}]})


BORROW = [claim("borrow", "vision", count=2)]  # wave 1: vision borrows the whole node


@dataclass
class Row:
    quotas: QuotaConfig
    waves: list[list[WaveItem]]
    states: dict[str, str]  # tenant/name: its last state
    preempted: list[str] = field(default_factory=list)
    reason_has: dict[str, str] = field(default_factory=dict)
    ignored: int = 0


ROWS = {
    "no-clock-no-reclaim-within-min-runtime": Row(
        lab_quotas({"minRuntime": "30m"}), [BORROW, [claim("own", "nlp")]],
        {"vision/borrow": "Allocated", "nlp/own": "Pending"},
        reason_has={"nlp/own": "reclaim preemption of vision's claims possible from 00:30:00 UTC"}),
    "an-advance-short-of-min-runtime-still-protects": Row(
        lab_quotas({"minRuntime": "30m"}), [BORROW, [Advance(600), claim("own", "nlp")]],
        {"vision/borrow": "Allocated", "nlp/own": "Pending"}),
    "an-advance-past-min-runtime-lets-reclaim-happen": Row(
        lab_quotas({"minRuntime": "30m"}), [BORROW, [Advance(1800), claim("own", "nlp")]],
        {"vision/borrow": "Pending", "nlp/own": "Allocated"}, ["vision/borrow"]),
    "the-claim-that-waits-reclaims-when-min-runtime-ends-within-an-advance": Row(
        lab_quotas({"minRuntime": "30m"}), [BORROW, [Advance(600), claim("own", "nlp")], [Advance(3600)]],
        {"vision/borrow": "Pending", "nlp/own": "Allocated"}, ["vision/borrow"]),
    "the-simulate-default-min-runtime-is-0": Row(
        lab_quotas(), [BORROW, [claim("own", "nlp")]],
        {"vision/borrow": "Pending", "nlp/own": "Allocated"}, ["vision/borrow"]),
    "a-default-min-runtime-applies-to-tenants-without-their-own": Row(
        replace(lab_quotas(), default_min_runtime=300.0), [BORROW, [claim("own", "nlp")]],
        {"vision/borrow": "Allocated", "nlp/own": "Pending"}),
    "release-frees-devices-for-a-waiting-claim": Row(
        QuotaConfig(), [[claim("big", "vision", count=2)], [claim("next", "nlp")], [Release("vision", "big")]],
        {"vision/big": "Released", "nlp/next": "Allocated"}),
    "release-of-a-waiting-claim-takes-it-out-of-the-queue": Row(
        QuotaConfig(), [[claim("big", "vision", count=2)], [claim("next", "nlp")], [Release("nlp", "next")]],
        {"vision/big": "Allocated", "nlp/next": "Released"}),
    "release-then-the-same-name-again-in-one-wave": Row(
        QuotaConfig(), [[claim("big", "vision", count=2)],
                        [claim("big", "vision", count=1), Release("vision", "big")]],
        {"vision/big": "Allocated"}),
    "release-of-an-unknown-claim-is-said-and-the-run-goes-on": Row(
        QuotaConfig(), [[claim("one", "vision")], [Release("vision", "nobody"), claim("two", "vision")]],
        {"vision/one": "Allocated", "vision/two": "Allocated"}, ignored=1),
    "advance-alone-changes-nothing-else": Row(
        QuotaConfig(), [[claim("big", "vision", count=2), claim("next", "nlp")], [Advance(86400)]],
        {"vision/big": "Allocated", "nlp/next": "Pending"}),
}


@pytest.mark.parametrize("row", ROWS.values(), ids=ROWS.keys())
def test_time_and_releases_in_waves(row: Row) -> None:
    result = run_waves(FLEET, BUILTIN_CLASSES, row.waves, row.quotas)
    states = {f"{o.namespace}/{o.name}": o.decision.state.value for o in result.outcomes}
    assert states == row.states
    assert [e["claim"] for e in result.events] == row.preempted
    reasons = {f"{o.namespace}/{o.name}": o.decision.reason or "" for o in result.outcomes}
    for key, part in row.reason_has.items():
        assert part in reasons[key], reasons[key]
    assert len(result.ignored) == row.ignored, result.ignored


def test_what_a_time_rule_lets_go_during_an_advance_happens_when_it_lets_go() -> None:
    """n1 waits for vision's minRuntime (30m) and reclaims at 00:30, within the hour wave 3 lets pass, as
    the allocator's cycles would: so its own minRuntime (1h) ends at 01:30, which v3's answer names."""
    config = parse_quotas({"kind": "Quotas", "cohorts": [{"name": "lab"}], "tenants": [
        {"name": "vision", "cohort": "lab", "minRuntime": "30m", "quotas": {"H100": {"nominal": 1}}},
        {"name": "nlp", "cohort": "lab", "minRuntime": "1h", "quotas": {"H100": {"nominal": 1}}}]})
    waves: list[list[WaveItem]] = [
        [claim("v1", "vision"), claim("v2", "vision")],  # 00:00, v2 borrows nlp's nominal
        [Advance(600), claim("n1", "nlp")],  # 00:10: v2 is within its minRuntime
        [Advance(3600), Release("vision", "v1"), Release("vision", "v2"), claim("n2", "nlp")],  # 01:10
        [claim("v3", "vision")]]  # reclaims nlp's borrowed GPU once a minRuntime lets it
    result = run_waves(FLEET, BUILTIN_CLASSES, waves, config)
    assert [(e["claim"], e["by"], e["rule"]) for e in result.events] == [("vision/v2", "nlp/n1", "reclaim")]
    last = {f"{o.namespace}/{o.name}": o.decision for o in result.outcomes}
    assert [last[k].state.value for k in ("vision/v1", "vision/v2", "nlp/n1", "nlp/n2")] == [
        "Released", "Released", "Allocated", "Allocated"]
    assert "reclaim preemption of nlp's claims possible from 01:30:00 UTC" in (last["vision/v3"].reason or "")


def test_the_released_claim_of_a_second_wave_gets_a_new_allocation() -> None:
    result = run_waves(FLEET, BUILTIN_CLASSES, [[claim("big", "vision", count=2)],
                                                [Release("vision", "big"), claim("big", "vision", count=1)]])
    [big] = result.outcomes
    assert big.decision.allocation is not None and len(big.decision.allocation.keys) == 1


def test_advance_alone_decides_as_without_it() -> None:
    """Without time rules, time passing changes no decision: the same outcomes with or without Advances."""
    waves: list[list[WaveItem]] = [[claim("a", "vision", count=2)], [claim("b", "nlp"), claim("c", "vision")]]
    timed: list[list[WaveItem]] = [[Advance(60), *waves[0]], [Advance(7200), *waves[1]], [Advance(1)]]
    plain, later = run_waves(FLEET, BUILTIN_CLASSES, waves), run_waves(FLEET, BUILTIN_CLASSES, timed)
    assert [o.to_json() for o in plain.outcomes] == [o.to_json() for o in later.outcomes]
    assert plain.events == later.events


def test_max_preemptions_per_minute_counts_on_the_simulated_clock() -> None:
    """vision may lose one claim a minute to reclaim: nlp's second claim waits for the minute to pass."""
    config = lab_quotas({"maxPreemptionsPerMinute": 1})
    borrow = [claim("b1", "vision"), claim("b2", "vision")]
    same_minute = run_waves(FLEET, BUILTIN_CLASSES, [borrow, [claim("n1", "nlp"), claim("n2", "nlp")]], config)
    assert len(same_minute.events) == 1
    later = run_waves(FLEET, BUILTIN_CLASSES, [borrow, [claim("n1", "nlp"), claim("n2", "nlp")], [Advance(61)]],
                      config)
    assert len(later.events) == 2
    assert {f"{o.namespace}/{o.name}": o.decision.state.value for o in later.outcomes if o.namespace == "nlp"} == {
        "nlp/n1": "Allocated", "nlp/n2": "Allocated"}


def test_the_clock_starts_at_a_fixed_instant() -> None:
    assert SIMULATION_START == 1_767_225_600.0  # 2026-01-01T00:00:00Z: the same files, the same output


DOCUMENT_ERRORS = {
    "no-duration": ({"kind": "Advance"}, "document 1 (Advance): duration: required"),
    "a-bad-duration": ({"kind": "Advance", "duration": "soon"}, "duration: invalid duration 'soon'"),
    "a-negative-duration": ({"kind": "Advance", "duration": -5}, "duration: \"-5\" must be from 0s to 365d"),
    "not-a-number": ({"kind": "Advance", "duration": float("nan")}, "must be from 0s to 365d"),
    "a-huge-number": ({"kind": "Advance", "duration": 10**400}, "must be from 0s to 365d"),
    "a-list": ({"kind": "Advance", "duration": [1]}, "is not a duration"),
    "a-boolean": ({"kind": "Advance", "duration": True}, "is not a duration"),
    "a-misspelt-field": ({"kind": "Advance", "duraton": "1h"}, "\"duraton\": unknown field"),
    "no-name": ({"kind": "Release", "namespace": "vision"}, "document 1 (Release): name: required"),
    "a-bad-name": ({"kind": "Release", "name": "Bad_Name"}, "name: \"Bad_Name\" must be a DNS subdomain"),
    "a-bad-namespace": ({"kind": "Release", "name": "x", "namespace": 3}, "namespace: \"3\" must be a DNS label"),
}


@pytest.mark.parametrize(("document", "message"), DOCUMENT_ERRORS.values(), ids=DOCUMENT_ERRORS.keys())
def test_an_invalid_advance_or_release_names_the_file_the_document_and_the_field(document: Any, message: str
                                                                               ) -> None:
    with pytest.raises(WaveFileError) as raised:
        read_wave([document], "default", "wave.yaml")
    assert str(raised.value).startswith("wave.yaml: document 1 (")
    assert message in str(raised.value)


def test_a_wave_passes_at_most_a_year() -> None:
    with pytest.raises(WaveFileError, match="document 3 \\(Advance\\): duration: the wave's Advance documents"):
        read_wave([{"kind": "Advance", "duration": "200d"}, None, {"kind": "Advance", "duration": "200d"}],
                  "default", "wave.yaml")


def test_a_wave_file_reads_claims_advances_and_releases() -> None:
    document = a_claim("c", "vision").request().document()
    items = read_wave([{"kind": "Advance", "duration": "2h"}, None, document, {"kind": "Release", "name": "old"},
                       {"kind": "Release", "namespace": "nlp", "name": "x"}], "team", "wave.yaml")
    assert items[0] == Advance(7200.0)
    assert items[1].metadata.name == "c"  # type: ignore[union-attr]
    assert items[2:] == [Release("team", "old"), Release("nlp", "x")]


def test_a_preferred_gang_is_split_when_its_wait_ends_within_an_advance() -> None:
    """A gang that fits only split across two cliques, with gang-topology-wait 30m, waits; wave 2 lets an
    hour pass and then brings a higher-priority claim of its tenant. The gang is split at 00:30, as the
    allocator's cycles would do, so it holds the fleet when the claim arrives at 01:00 (its members may not
    be preempted); without that instant the claim would come first at 01:00 and the gang would wait on."""
    cliques = labelled(fleet(*node("n1", "H100", 4), *node("n2", "H100", 4)), {"n1": {"clique": "c1"},
                                                                              "n2": {"clique": "c2"}})

    def member(name: str) -> Any:
        builder = a_claim(name, "t").request(count=4).gang("g", 2, topology="clique", mode="preferred", wait="30m")
        builder.annotations["claimbroker.io/preemptible"] = "false"
        return builder.build()

    waves: list[list[WaveItem]] = [[member("m1"), member("m2")], [Advance(3600), claim("urgent", "t", 4, priority=10)]]
    result = run_waves(cliques, BUILTIN_CLASSES, waves, QuotaConfig())
    states = {o.name: o.decision.state.value for o in result.outcomes}
    assert states == {"m1": "Allocated", "m2": "Allocated", "urgent": "Pending"}, result.outcomes


@pytest.mark.parametrize(("fair_sharing", "admitted"), [({"halfLife": "1h"}, "nlp/first"), ({}, "vision/again")],
                         ids=["past-use-decays-between-waves", "without-a-half-life-arrival-decides"])
def test_past_use_decays_over_advances(fair_sharing: dict[str, str], admitted: str) -> None:
    """vision holds both H100 for an hour (4 GPU units: past use 2 at its release), then an hour passes
    (past use 1); vision asks again before nlp, which ran nothing. With fairSharing.halfLife nlp goes
    first; without it both shares are 0 and vision's earlier arrival decides."""
    config = parse_quotas({"kind": "Quotas", **({"fairSharing": fair_sharing} if fair_sharing else {})})
    waves: list[list[WaveItem]] = [
        [claim("big", "vision", count=2)],
        [Advance(3600), Release("vision", "big")],
        [Advance(3600), claim("again", "vision", count=2), claim("first", "nlp", count=2)]]
    result = run_waves(FLEET, BUILTIN_CLASSES, waves, config)
    states = {f"{o.namespace}/{o.name}": o.decision.state.value for o in result.outcomes}
    assert [k for k, state in states.items() if state == "Allocated"] == [admitted]
