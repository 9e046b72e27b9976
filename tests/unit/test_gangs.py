"""Gangs: claims admitted all or nothing. The annotations (read by settings_of), then the cycle's rules,
each a table row driven through public entry points."""

from __future__ import annotations

import pytest

from shared.dra.claims import GangSettings, InvalidClaim, settings_of
from tests.builders import a_claim


@pytest.mark.parametrize(("annotations", "gang"), [
    ({}, None),
    ({"claimbroker.io/gang": "train-7", "claimbroker.io/gang-size": "4"}, GangSettings("train-7", 4)),
    ({"claimbroker.io/gang": "g", "claimbroker.io/gang-size": "1"}, GangSettings("g", 1)),
    ({"claimbroker.io/gang": "g", "claimbroker.io/gang-size": "256"}, GangSettings("g", 256)),
    ({"claimbroker.io/gang": "g", "claimbroker.io/gang-size": "2",
      "claimbroker.io/gang-topology": "nvidia.com/gpu.clique"}, GangSettings("g", 2, "nvidia.com/gpu.clique")),
    ({"claimbroker.io/gang": "g", "claimbroker.io/gang-size": "2", "claimbroker.io/gang-topology": "rack",
      "claimbroker.io/gang-topology-mode": "preferred", "claimbroker.io/gang-topology-wait": "1h30m"},
     GangSettings("g", 2, "rack", "preferred", 5400.0)),
    ({"claimbroker.io/gang": "g", "claimbroker.io/gang-size": "2", "claimbroker.io/gang-topology": "rack",
      "claimbroker.io/gang-topology-wait": "0"}, GangSettings("g", 2, "rack")),
])
def test_gang_annotations_read(annotations: dict[str, str], gang: GangSettings | None) -> None:
    claim = a_claim().request().build()
    claim.metadata.annotations.update(annotations)
    assert settings_of(claim).gang == gang


@pytest.mark.parametrize(("annotations", "names"), [
    ({"claimbroker.io/gang": "g", "claimbroker.io/gang-size": "0"}, ['gang-size', '"0"', '1 to 256']),
    ({"claimbroker.io/gang": "g", "claimbroker.io/gang-size": "257"}, ["gang-size", '"257"']),
    ({"claimbroker.io/gang": "g", "claimbroker.io/gang-size": "abc"}, ["gang-size", '"abc"']),
    ({"claimbroker.io/gang": "g", "claimbroker.io/gang-size": "-1"}, ["gang-size", '"-1"']),
    ({"claimbroker.io/gang": "g", "claimbroker.io/gang-size": "٣"}, ["gang-size"]),
    ({"claimbroker.io/gang": "g", "claimbroker.io/gang-size": " 4"}, ["gang-size"]),
    ({"claimbroker.io/gang": "g"}, ["gang-size", "is required"]),
    ({"claimbroker.io/gang": "Train_7", "claimbroker.io/gang-size": "4"}, ["claimbroker.io/gang]", '"Train_7"',
                                                                          "DNS label"]),
    ({"claimbroker.io/gang": "", "claimbroker.io/gang-size": "4"}, ["claimbroker.io/gang]", "DNS label"]),
    ({"claimbroker.io/gang": "a" * 64, "claimbroker.io/gang-size": "4"}, ["claimbroker.io/gang]"]),
    ({"claimbroker.io/gang-size": "4"}, ["gang-size", "only with claimbroker.io/gang"]),
    ({"claimbroker.io/gang": "g", "claimbroker.io/gang-size": "2", "claimbroker.io/gang-topology": "bad key/x/y"},
     ["gang-topology", "node label key"]),
    ({"claimbroker.io/gang": "g", "claimbroker.io/gang-size": "2", "claimbroker.io/gang-topology": "-rack"},
     ["gang-topology"]),
    ({"claimbroker.io/gang": "g", "claimbroker.io/gang-size": "2", "claimbroker.io/gang-topology": "rack",
      "claimbroker.io/gang-topology-mode": "strict"}, ["gang-topology-mode", '"strict"', "required"]),
    ({"claimbroker.io/gang": "g", "claimbroker.io/gang-size": "2", "claimbroker.io/gang-topology": "rack",
      "claimbroker.io/gang-topology-wait": "5 minutes"}, ["gang-topology-wait", '"5 minutes"', "duration"]),
    ({"claimbroker.io/gang": "g", "claimbroker.io/gang-size": "2", "claimbroker.io/gang-topology-mode": "preferred"},
     ["gang-topology-mode", "only with claimbroker.io/gang-topology"]),
])
def test_bad_gang_annotations_reject_the_claim_naming_annotation_and_value(annotations: dict[str, str],
                                                                          names: list[str]) -> None:
    claim = a_claim().request().build()
    claim.metadata.annotations.update(annotations)
    with pytest.raises(InvalidClaim) as raised:
        settings_of(claim)
    for name in names:
        assert name in str(raised.value)
