"""The tree invariants after every cycle of random waves over random cohort trees (shared/admission/invariant.py):
KEP-79's T(x) >= -borrowingLimit(x) at every node, no subtree over its nominal plus its borrowingLimit, the
free capacity covering what the top cohorts draw, and no tenant over its nominal plus its borrowingLimit;
with and without past use ordering the tenants."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.admission.cycle import run_cycle
from shared.admission.flavors import Flavors
from shared.admission.invariant import held_per_flavor, violations
from shared.admission.kept import KeptState
from shared.admission.model import Snapshot, Waiting
from shared.admission.quota import QuotaConfig, parse_quotas
from shared.dra.classes import BUILTIN_CLASSES
from shared.dra.inventory import Fleet
from shared.dra.matching import SelectorMemo
from tests.builders import a_claim, fleet, node
from tests.waves import Waves

MODELS = ("H100", "A100")
TENANTS = ("t0", "t1", "t2", "t3", "t4")
COHORTS = ("c0", "c1", "c2", "c3", "c4")
SHARED = SelectorMemo()  # selector results depend only on the selector and the device: kept across examples
FLAVOR_OF = Flavors(QuotaConfig().flavors, SHARED)


@st.composite
def fleets(draw: Any) -> Fleet:
    return fleet(*(d for i in range(draw(st.integers(1, 3)))
                   for d in node(f"n{i}", draw(st.sampled_from(MODELS)), draw(st.integers(1, 8)))))


@st.composite
def limits(draw: Any) -> dict[str, Any]:
    nominal = draw(st.integers(0, 8))
    out: dict[str, Any] = {"nominal": nominal}
    if draw(st.integers(0, 2)) == 0:
        out["borrowingLimit"] = draw(st.integers(0, 4))
    if draw(st.integers(0, 2)) == 0:
        out["lendingLimit"] = draw(st.integers(0, nominal))
    return out


@st.composite
def trees(draw: Any) -> QuotaConfig:
    """One to five cohorts, each the child of an earlier one or a top cohort, some with quotas of their own;
    tenants in a cohort or none, some with quotas; sometimes a half-life."""
    cohorts = []
    for i in range(draw(st.integers(1, len(COHORTS)))):
        cohort: dict[str, Any] = {"name": COHORTS[i]}
        if i and draw(st.integers(0, 3)):
            cohort["parent"] = COHORTS[draw(st.integers(0, i - 1))]
        quotas = {m: draw(limits()) for m in MODELS if draw(st.integers(0, 2)) == 0}
        if quotas:
            cohort["quotas"] = quotas
        cohorts.append(cohort)
    tenants = []
    for name in TENANTS:
        tenant: dict[str, Any] = {"name": name, "weight": draw(st.sampled_from((1.0, 2.0)))}
        home = draw(st.sampled_from((None, *(c["name"] for c in cohorts))))
        if home is not None:
            tenant["cohort"] = home
        tenant["quotas"] = {m: draw(limits()) for m in MODELS if draw(st.integers(0, 1))}
        tenants.append(tenant)
    document: dict[str, Any] = {"kind": "Quotas", "cohorts": cohorts, "tenants": tenants}
    if draw(st.booleans()):
        document["fairSharing"] = {"halfLife": "1h"}
    return parse_quotas(document)


@st.composite
def claims(draw: Any, name: str) -> Waiting:
    tenant = draw(st.sampled_from(TENANTS))
    model = draw(st.sampled_from((None, *MODELS)))
    selectors = (f'device.attributes["gpu.nvidia.com"].productName == "{model}"',) if model else ()
    claim = a_claim(name, tenant).request(count=draw(st.sampled_from((1, 1, 2, 3, 4, 8))), selectors=selectors).build()
    return Waiting(tenant, name, claim, draw(st.integers(0, 2)), draw(st.integers(0, 3)) > 0, 0)


@pytest.mark.timeout(600)
@settings(max_examples=150, deadline=None)
@given(fleets(), trees(), st.data(), st.randoms(use_true_random=False))
def test_no_cycle_breaks_a_tree_invariant(f: Fleet, config: QuotaConfig, data: Any, rng: Any) -> None:
    waves = [[data.draw(claims(f"w{w}c{i}")) for i in range(data.draw(st.integers(1, 6)))]
             for w in range(data.draw(st.integers(2, 4)))]
    past = {(t, m): data.draw(st.sampled_from((0.0, 1.0, 6.0))) for t in TENANTS for m in MODELS}
    kept = KeptState(SelectorMemo(results=SHARED.results, signatures=SHARED.signatures, shapes=SHARED.shapes))
    flavors = Flavors(config.flavors, SHARED)
    shell = Waves(waves, rng)
    for cycle, _ in enumerate(shell.cycles()):
        snapshot = Snapshot(f, BUILTIN_CLASSES, config, tuple(shell.running.values()), tuple(shell.queue.values()),
                            past_use=past)
        shell.settle(run_cycle(snapshot, kept))
        found = violations(f, config, shell.running.values(), flavors)
        held = held_per_flavor(f, shell.running.values(), flavors)
        assert not found, (f"cycle {cycle + 1}: {found}; held {held}; capacity "
                           f"{Counter(FLAVOR_OF.name_of(d) for d in f.devices)}\n{config.to_document()}")
        for tenant, per_flavor in held.items():  # checked here too, without the recount's arithmetic
            for flavor, n in per_flavor.items():
                limit = config.tenant(tenant).limit(flavor)
                if limit is not None and limit.borrowing_limit is not None:
                    assert n <= limit.nominal + limit.borrowing_limit, (tenant, flavor, n, limit)
