"""The AsyncAPI document says what the contract says, and what the services send fits it: every subject
of docs/contract.md's table is a channel, every payload field it names is in the schema, and payloads
built by the code validate against the models the document is generated from."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from services.bus.asyncapi import document
from shared.contract import events, messages
from shared.dra.results import Allocation, DeviceResult
from shared.fleet.sources import load_inventory

CONTRACT = Path(__file__).resolve().parents[2] / "docs" / "contract.md"


def contract_subjects() -> dict[str, str]:
    """The subject table of the contract: subject (with {placeholders}) -> its payload cell."""
    section = CONTRACT.read_text().split("## NATS subjects", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(claimbroker\.v1\.[^`]+)` \|[^|]+\| (.+) \|$", section, re.MULTILINE)
    return {re.sub(r"<([a-z]+)>", r"{\1}", subject): payload for subject, payload in rows}


def test_every_subject_of_the_contract_is_a_channel_and_nothing_else() -> None:
    subjects = contract_subjects()
    assert len(subjects) == 5
    addresses = {channel["address"] for channel in document()["channels"].values()}
    assert addresses == set(subjects)


def schema_of(address: str) -> dict:  # type: ignore[type-arg]
    spec = document()
    channel = next(c for c in spec["channels"].values() if c["address"] == address)
    message_ref = next(iter(channel["messages"].values()))["$ref"].rsplit("/", 1)[1]
    payload_ref = spec["components"]["messages"][message_ref]["payload"]["$ref"].rsplit("/", 1)[1]
    return spec["components"]["schemas"][payload_ref]  # type: ignore[no-any-return]


def test_the_payload_fields_the_contract_names_are_in_the_schemas() -> None:
    subjects = contract_subjects()
    alert_fields = re.findall(r'"([a-zA-Z]+)"', subjects["claimbroker.v1.alerts.{severity}.{kind}.{tenant}"])
    assert set(alert_fields) <= set(schema_of("claimbroker.v1.alerts.{severity}.{kind}.{tenant}")["properties"])
    example = CONTRACT.read_text().split("```json", 1)[1].split("```", 1)[0]
    status_fields = set(re.findall(r'"(namespace|name|state|allocation|reason)"', example))
    status = schema_of("claimbroker.v1.claims.status.{tenant}.{claim}")
    assert status_fields | {"observedAt", "sequence"} <= set(status["properties"])
    assert {"name"} == set(schema_of("claimbroker.v1.claims.release.{tenant}")["required"])


def test_the_status_schema_is_the_status_model_s() -> None:
    """The document's status schema is the one readers validate with, every field the builder writes
    required, and the message's payload names it."""
    status = schema_of("claimbroker.v1.claims.status.{tenant}.{claim}")
    assert status["title"] == "ClaimStatus"
    written = events.claim_status(namespace="t", name="c", state="Pending", allocation=None, reason=None, sequence=1)
    assert status["required"] == list(written)
    assert set(status["properties"]) == set(messages.ClaimStatus.__annotations__)


def test_the_claim_states_are_the_contracts() -> None:
    states = re.search(r"`state` is one of (.+?)\.", CONTRACT.read_text())
    assert states is not None
    named = set(re.findall(r"`([A-Z][a-z]+)`", states.group(1)))
    status = document()["components"]["schemas"]["ClaimStatus"]
    assert set(status["properties"]["state"]["enum"]) == named


def test_what_the_services_build_validates_against_the_models(tmp_path: Path) -> None:
    allocation = Allocation("node-03", (DeviceResult("gpu", "gpu.nvidia.com", "node-03", "gpu-1"),))
    status = events.claim_status(namespace="vision", name="training-gpu", state="Allocated",
                                 allocation=allocation.to_json(), reason=None, sequence=3, by=None)
    assert messages.read_status(json.dumps(status)) == status
    preempted = events.claim_status(namespace="vision", name="low", state="Preempted", allocation=None,
                                    reason="preempted by vision/urgent", sequence=4, by="vision/urgent")
    assert messages.read_status(json.dumps(preempted)).get("by") == "vision/urgent"
    alert = events.alert(kind="node-lost", severity="critical", key="node-lost:n1", summary="n1 is gone",
                         details={"node": "n1"}, labels={"node": "n1"}, first_seen=1.0, last_seen=2.0)
    assert messages.Alert.model_validate(alert).severity == "critical"
    topology = tmp_path / "fleet.yaml"
    topology.write_text("kind: Topology\nnodes: [{name: n1, gpuModel: A100, gpuCount: 2, mig: {0: [3g.40gb]}}]\n")
    slices = load_inventory([topology]).slices
    inventory = events.inventory_payload("n1", slices, labels={"a": "b"}, sequence=1, observed_at=1.0)
    assert slices and messages.NodeInventory.model_validate(inventory).slices


@pytest.mark.parametrize("document_path", ["shared/workloads/lab.yaml"])
def test_the_lab_claims_are_resource_claims_of_the_schema(document_path: str) -> None:
    root = Path(__file__).resolve().parents[2]
    claims = [d for d in yaml.safe_load_all((root / document_path).read_text())
              if d and d.get("kind") == "ResourceClaim"]
    assert claims
    for claim in claims:
        assert messages.ResourceClaim.model_validate(claim).metadata.name


def test_the_repository_contract_says_what_the_shared_one_says() -> None:
    """docs/contract.md is what users of the repository read; where the product's shared contract is beside
    the checkout (the developers' machines), the two must not differ."""
    shared = CONTRACT.parents[2] / "shared" / "contract.md"
    if not shared.exists():
        pytest.skip("no shared contract beside this checkout")
    assert CONTRACT.read_text() == shared.read_text()
