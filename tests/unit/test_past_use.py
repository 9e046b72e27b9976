"""Past use (contract, Quotas: fairSharing.halfLife): the decay as a pure function, and what it does to fair
share: a tenant that ran much a while ago waits behind one that did not, an admission's entry penalty
keeps a burst from winning every slot of one cycle, and fair-share victims are picked by the share with
past use."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest

from shared.admission.cycle import run_cycle
from shared.admission.flavors import Flavors
from shared.admission.model import Running, Snapshot, Waiting
from shared.admission.past_use import (
    ENTRY_PENALTY_SECONDS,
    advance_past_use,
    bring_up_to,
    decay_factor,
    entry_penalty,
    halves_in,
    per_tenant,
    units_in_use,
)
from shared.admission.quota import QuotaConfig, parse_quotas
from shared.admission.whatif import Change, what_if
from shared.dra.classes import BUILTIN_CLASSES
from shared.dra.matching import SelectorMemo
from shared.dra.results import State
from tests.builders import a_claim, fleet, node

HOUR = 3600.0


def open_fleet(half_life: str | None = "1h") -> QuotaConfig:
    """No quotas (an open fleet), shares with past use when a half-life is given."""
    return parse_quotas({"kind": "Quotas", **({"fairSharing": {"halfLife": half_life}} if half_life else {})})


@pytest.mark.parametrize(("elapsed", "factor"), [
    (0.0, 1.0), (HOUR, 0.5), (2 * HOUR, 0.25), (HOUR / 2, math.sqrt(0.5)), (10 * HOUR, 2 ** -10)])
def test_the_factor_after_half_lives(elapsed: float, factor: float) -> None:
    assert decay_factor(elapsed, HOUR) == pytest.approx(factor, abs=1e-6)


@dataclass
class DecayRow:
    previous: float  # past use of (t, A100) before
    held: float  # GPU units held meanwhile
    elapsed: float  # seconds
    after: float


DECAY_ROWS = {
    "one-half-life-after-releasing-8": DecayRow(8.0, 0.0, HOUR, 4.0),
    "two-half-lives-after-releasing-8": DecayRow(8.0, 0.0, 2 * HOUR, 2.0),
    "holding-8-for-one-half-life-from-nothing": DecayRow(0.0, 8.0, HOUR, 4.0),
    "holding-8-for-two-half-lives-from-nothing": DecayRow(0.0, 8.0, 2 * HOUR, 6.0),
    "holding-8-for-ten-half-lives-is-near-8": DecayRow(0.0, 8.0, 10 * HOUR, 8.0 * (1 - 2 ** -10)),
    "holding-what-it-averaged-keeps-it": DecayRow(3.0, 3.0, 5 * HOUR, 3.0),
    "no-time-no-change": DecayRow(5.0, 1.0, 0.0, 5.0),
}


@pytest.mark.parametrize("row", DECAY_ROWS.values(), ids=list(DECAY_ROWS))
def test_past_use_decays_towards_what_is_held(row: DecayRow) -> None:
    key = ("t", "A100")
    previous = {key: row.previous} if row.previous else {}
    held = {key: row.held} if row.held else {}
    after = advance_past_use(previous, held, row.elapsed, HOUR)
    assert after.get(key, 0.0) == pytest.approx(row.after, abs=1e-6)


def test_steps_add_up_to_one_step_so_a_restart_gap_decays_alike() -> None:
    """Sixty one-minute steps (an allocator's cycles) and one step of an hour (after a restart) agree."""
    key = ("t", "H100")
    stepped: dict[tuple[str, str], float] = {key: 8.0}
    for _ in range(60):
        stepped = advance_past_use(stepped, {key: 2.0}, 60.0, HOUR)
    once = advance_past_use({key: 8.0}, {key: 2.0}, HOUR, HOUR)
    assert stepped[key] == pytest.approx(once[key], abs=1e-9) == pytest.approx(5.0, abs=1e-9)


def test_without_a_half_life_there_is_no_past_use() -> None:
    assert advance_past_use({("t", "A100"): 8.0}, {("t", "A100"): 8.0}, HOUR, 0.0) == {}
    assert entry_penalty(8.0, 0.0) == 0.0 and decay_factor(HOUR, 0.0) == 1.0


def test_what_has_decayed_to_nothing_is_dropped() -> None:
    assert advance_past_use({("t", "A100"): 1.0}, {}, 40 * HOUR, HOUR) == {}


def test_halves_in() -> None:
    assert halves_in(8.0, 0.0, HOUR) == pytest.approx(HOUR)
    assert halves_in(8.0, 2.0, HOUR) == pytest.approx(HOUR * math.log2(6 / 2))  # 8 -> 4 while it holds 2
    assert halves_in(8.0, 4.0, HOUR) is None  # holding half of it, it never gets there
    assert halves_in(0.0, 0.0, HOUR) is None and halves_in(8.0, 0.0, 0.0) is None


def test_units_in_use_weigh_each_device_by_its_flavor() -> None:
    f = fleet(*node("h", "H100", 2), *node("a", "A100", 2))
    config = open_fleet()
    flavors = Flavors(config.flavors, SelectorMemo())
    running = run_cycle(Snapshot(f, BUILTIN_CLASSES, config, (), (
        wait("both-h100", "t", 2, model="H100"), wait("one-a100", "t", 1, model="A100"))))
    held = [Running(d.tenant, d.name, d.decision.allocation) for d in running.decisions if d.decision.allocation]
    assert units_in_use(f, held, flavors) == {("t", "H100"): 4.0, ("t", "A100"): 1.0}  # H100 weighs 2.0
    assert per_tenant({("t", "H100"): 4.0, ("t", "A100"): 1.0, ("u", "A100"): 0.5}) == {"t": 5.0, "u": 0.5}


def test_the_entry_penalty_is_what_one_sampling_interval_of_holding_adds() -> None:
    assert entry_penalty(8.0, HOUR) == pytest.approx(8.0 * (1 - 0.5 ** (ENTRY_PENALTY_SECONDS / HOUR)))


# -- fair share with past use --------------------------------------------------------------------------------


def wait(name: str, tenant: str, count: int = 1, *, arrival: int = 0, model: str = "A100") -> Waiting:
    claim = a_claim(name, tenant).request(
        count=count, selectors=(f'device.attributes["gpu.nvidia.com"].productName == "{model}"',)).build()
    return Waiting(tenant, name, claim, 0, True, arrival)


def ran_8_gpu_hours_an_hour_ago() -> dict[tuple[str, str], float]:
    """Tenant `busy` held 8 A100 for an hour, from two hours ago to one hour ago (half-life 1h)."""
    held = advance_past_use({}, {("busy", "A100"): 8.0}, HOUR, HOUR)
    return advance_past_use(held, {}, HOUR, HOUR)


@pytest.mark.parametrize(("half_life", "first"), [("1h", "idle"), (None, "busy")], ids=["remembers", "forgets"])
def test_the_tenant_that_ran_nothing_is_admitted_first(half_life: str | None, first: str) -> None:
    """Equal weights, one free A100; `busy` asked first. With a half-life its past use (2 units: 4 after its
    hour, halved since) puts it behind; without, only what runs now counts and arrival decides."""
    past = ran_8_gpu_hours_an_hour_ago()
    assert past[("busy", "A100")] == pytest.approx(2.0, abs=1e-6)
    result = run_cycle(Snapshot(fleet(*node("a", "A100", 1)), BUILTIN_CLASSES, open_fleet(half_life), (),
                                (wait("x", "busy", arrival=1), wait("y", "idle", arrival=2)), past_use=past))
    [admitted] = [d.tenant for d in result.decisions if d.decision.state is State.ALLOCATED]
    assert admitted == first


def test_past_use_orders_tenants_under_quotas_too() -> None:
    config = parse_quotas({"kind": "Quotas", "fairSharing": {"halfLife": "1h"}, "cohorts": [{"name": "lab"}],
                           "tenants": [{"name": n, "cohort": "lab", "quotas": {"A100": {"nominal": 1}}}
                                       for n in ("busy", "idle")]})
    result = run_cycle(Snapshot(fleet(*node("a", "A100", 1)), BUILTIN_CLASSES, config, (),
                                (wait("x", "busy", arrival=1), wait("y", "idle", arrival=2)),
                                past_use=ran_8_gpu_hours_an_hour_ago()))
    assert [d.tenant for d in result.decisions if d.decision.state is State.ALLOCATED] == ["idle"]


@dataclass
class PenaltyRow:
    other_past: float  # other's past use of A100; a has none
    admitted: list[str]  # names, in the order admitted


PENALTY_ROWS = {
    # a's first admission lifts its share to 1 plus the penalty, above other's 1.0 (without the penalty they
    # would tie, and a's earlier arrival would take the second slot too): other takes it
    "the-entry-penalty-lets-the-other-tenant-in": PenaltyRow(1.0, ["a1", "o1"]),
    # other's past use is more than a's GPU plus the penalty: a takes both
    "a-larger-past-use-still-waits": PenaltyRow(1.0 + entry_penalty(1.0, HOUR) + 0.01, ["a1", "a2"]),
}


@pytest.mark.parametrize("row", PENALTY_ROWS.values(), ids=list(PENALTY_ROWS))
def test_a_burst_does_not_win_every_slot_of_one_cycle(row: PenaltyRow) -> None:
    waiting = (wait("a1", "a", arrival=1), wait("a2", "a", arrival=2), wait("o1", "other", arrival=3))
    result = run_cycle(Snapshot(fleet(*node("a", "A100", 2)), BUILTIN_CLASSES, open_fleet("1h"), (), waiting,
                                past_use={("other", "A100"): row.other_past}))
    assert [d.name for d in result.decisions if d.decision.state is State.ALLOCATED] == row.admitted


def test_fair_share_picks_victims_by_the_share_with_past_use() -> None:
    """An open fleet of 2 A100, `light` and `heavy` run one each; `new` waits. Without past use no victim's
    share stays at or above new's afterwards; with heavy's past use of 5 its claim is preempted."""
    f = fleet(*node("a", "A100", 2))
    first = run_cycle(Snapshot(f, BUILTIN_CLASSES, open_fleet(), (),
                               (wait("l", "light", arrival=1), wait("h", "heavy", arrival=2))))
    running = tuple(Running(d.tenant, d.name, d.decision.allocation, 0, True, i, i)
                    for i, d in enumerate(first.decisions) if d.decision.allocation is not None)
    waiting = (wait("n", "new", arrival=3),)
    for past, victims in (({}, []), ({("heavy", "A100"): 5.0}, [("heavy", "h")])):
        result = run_cycle(Snapshot(f, BUILTIN_CLASSES, open_fleet(), running, waiting, past_use=past))
        assert [p.victim for p in result.preemptions] == victims
        if victims:
            assert "plus past use" in result.preemptions[0].reason


def test_the_shell_brings_past_use_up_to_now() -> None:
    key = ("t", "A100")
    assert bring_up_to({key: 8.0}, None, {}, 10 * HOUR, HOUR) == {key: 8.0}  # never kept: nothing to decay
    assert bring_up_to({key: 8.0}, 0.0, {}, HOUR, HOUR)[key] == pytest.approx(4.0, abs=1e-6)
    assert bring_up_to({key: 8.0}, HOUR, {}, 0.0, HOUR) == {key: 8.0}  # the clock went back: no step
    assert bring_up_to({key: 8.0}, 0.0, {}, HOUR, 0.0) == {}


def test_whatif_with_a_half_life_weighs_past_use() -> None:
    """What if the quotas gained fairSharing.halfLife: the tenant that ran 8 GPU-hours an hour ago would wait
    behind the one that ran nothing, and its share counts its past use."""
    waiting = [wait("x", "busy", arrival=1), wait("y", "idle", arrival=2)]
    change = Change(quotas=open_fleet("1h"))
    answer = what_if(fleet(*node("a", "A100", 1)), BUILTIN_CLASSES, open_fleet(None), (), waiting, {}, change,
                     past_use=ran_8_gpu_hours_an_hour_ago())
    assert answer.admitted == [("idle", "y")] and answer.preempted == [(("busy", "x"), "preempted")]
    assert answer.shares["busy"] == (1.0, pytest.approx(2.0, abs=1e-6))  # before: its A100; after: past use


def test_a_cycle_says_what_is_held_for_the_next_step() -> None:
    """With a half-life the result carries the GPU units held per tenant and flavor after the cycle (what the
    shell's next bring_up_to counts), the same figures as units_in_use over what then runs."""
    f = fleet(*node("h", "H100", 2), *node("a", "A100", 2))
    config = open_fleet()
    result = run_cycle(Snapshot(f, BUILTIN_CLASSES, config, (), (
        wait("both-h100", "t", 2, model="H100"), wait("one-a100", "u", 1, model="A100"))))
    held = [Running(d.tenant, d.name, d.decision.allocation) for d in result.decisions if d.decision.allocation]
    assert result.units_in_use == units_in_use(f, held, Flavors(config.flavors, SelectorMemo())) == {
        ("t", "H100"): 4.0, ("u", "A100"): 1.0}
    assert run_cycle(Snapshot(f, BUILTIN_CLASSES, open_fleet(None), (), (wait("x", "t"),))).units_in_use == {}
