"""`explain` of a gang member: the gang's members and what it lacks, with a topology key what each value has
free, and what would let the gang in first among `toAdmit`."""

from __future__ import annotations

from typing import Any

import pytest

from shared.admission.cycle import run_cycle
from shared.admission.model import Snapshot, Waiting
from shared.admission.quota import QuotaConfig
from shared.dra.classes import BUILTIN_CLASSES
from shared.dra.inventory import Fleet
from tests.builders import a_claim, fleet, labelled, node


def member(name: str, gang: str = "g", size: int = 2, *, count: int = 1, arrival: int = 0,
           topology: str | None = None) -> Waiting:
    claim = a_claim(name, "t").request(count=count).gang(gang, size, topology=topology).build()
    return Waiting("t", name, claim, 0, True, arrival)


def explained(f: Fleet, waiting: list[Waiting]) -> dict[str, Any]:
    result = run_cycle(Snapshot(f, BUILTIN_CLASSES, QuotaConfig(), (), tuple(waiting)))
    return {d.name: d.explain for d in result.decisions}


TWO = fleet(*node("n1", "H100", 4), *node("n2", "H100", 4))
CLIQUES = labelled(fleet(*node("a1", "H100", 4), *node("a2", "H100", 4), *node("b1", "H100", 4)),
                   {"a1": {"clique": "c1"}, "a2": {"clique": "c1"}, "b1": {"clique": "c2"}})


@pytest.mark.parametrize(("f", "waiting", "gang", "first_to_admit"), [
    (TWO, [member("a", size=3), member("b", size=3, arrival=1)],
     {"name": "g", "size": 3, "received": 2, "members": ["a", "b"], "rejected": [], "topology": None},
     "submit the gang's 1 missing member(s): gang-size 3, 2 received"),
    (CLIQUES, [member("a", count=4, topology="clique", size=3), member("b", count=4, topology="clique", size=3,
                                                                       arrival=1),
               member("c", count=4, topology="clique", size=3, arrival=2)],
     {"name": "g", "size": 3, "received": 3, "members": ["a", "b", "c"], "rejected": [],
      "topology": {"key": "clique", "mode": "required", "waitSeconds": 0.0, "values": 2,
                   "mostFree": [{"value": "c1", "free": 8, "nodes": 2}, {"value": "c2", "free": 4, "nodes": 1}]}},
     "wait for room on one clique value, or set gang-topology-mode: preferred"),
    (TWO, [member("a", count=4, topology="rack"), member("b", count=4, topology="rack", arrival=1)],
     {"name": "g", "size": 2, "received": 2, "members": ["a", "b"], "rejected": [],
      "topology": {"key": "rack", "mode": "required", "waitSeconds": 0.0, "values": 0, "mostFree": []}},
     "no node has the label rack"),
], ids=["incomplete", "no-clique-with-room", "no-node-with-the-label"])
def test_a_waiting_members_explanation_carries_its_gang(f: Fleet, waiting: list[Waiting], gang: dict[str, Any],
                                                         first_to_admit: str) -> None:
    explanations = explained(f, waiting)
    for w in waiting:
        found = explanations[w.name]
        assert found is not None and found["gang"] == gang, found
        assert found["toAdmit"][0].startswith(first_to_admit), found["toAdmit"]


def test_a_claim_of_no_gang_has_no_gang_part() -> None:
    plain = Waiting("t", "solo", a_claim("solo", "t").request(count=8).build(), 0, True, 0)
    found = explained(fleet(*node("n1", "H100", 4)), [plain])["solo"]
    assert found is not None and "gang" not in found
