"""Loading DRA objects verbatim, refusing bad ones by field, and topology inventories."""

from __future__ import annotations

from typing import Any

import pytest

from shared.dra import model as dra
from shared.dra.claims import InvalidClaim, read_submission
from shared.dra.inventory import Fleet
from shared.fleet.sources import InventoryFileError, documents_from
from shared.fleet.topology import lookup_model, topology_to_resource_slices

TRAINING_GPU = {
    "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "training-gpu"},
    "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
        "deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 1,
        "selectors": [{"cel": {"expression": 'device.attributes["gpu.nvidia.com"].productName == "H100"'}}]}}]}},
}


def test_lab_claim_loads_verbatim() -> None:
    claim = dra.parse_claim(TRAINING_GPU)
    assert claim.spec.devices.requests[0].exactly is not None
    assert claim.spec.devices.requests[0].exactly.device_class_name == "gpu.nvidia.com"


def _with(path: str, value: Any) -> dict[str, Any]:
    import copy

    document = copy.deepcopy(TRAINING_GPU)
    target = document
    keys = path.split(".")
    for key in keys[:-1]:
        target = target[int(key)] if key.isdigit() else target[key]
    target[keys[-1]] = value
    return document


@pytest.mark.parametrize(("document", "message"), [
    pytest.param(_with("kind", "Pod"), "kind: unknown kind 'Pod'", id="unknown-kind"),
    pytest.param(_with("apiVersion", "resource.k8s.io/v1beta1"), "apiVersion", id="old-api"),
    pytest.param(_with("spec.devices.requests.0.exactly.count", "many"),
                 "exactly.count: Input should be a valid integer", id="count-not-int"),
    pytest.param(_with("spec.devices.requests.0.exactly.colour", "red"), "colour", id="unknown-field"),
    pytest.param(_with("spec.devices.requests.0.exactly.count", -1), "count: must be greater than zero", id="negative"),
    pytest.param(_with("spec.devices.requests.0.name", "Not_A_Label"), "DNS label", id="bad-request-name"),
    pytest.param(_with("metadata", {}), "metadata.name: is required", id="no-name"),
    pytest.param(_with("spec.devices.requests.0.exactly.selectors", [{"cel": {"expression": "true || " * 1500}}]),
                 "over the limit of 10240", id="cel-over-10Ki"),
])
def test_malformed_claims_name_the_field(document: dict[str, Any], message: str) -> None:
    with pytest.raises(dra.DocumentError, match=message.replace(".", r"\.").replace("(", r"\(")):
        dra.parse_claim(document)


def test_submission_namespace_must_match_tenant() -> None:
    import json

    document = {**TRAINING_GPU, "metadata": {"name": "x", "namespace": "other"}}
    with pytest.raises(InvalidClaim, match="does not match the subject's tenant 'team'") as caught:
        read_submission(json.dumps(document).encode(), "team")
    assert caught.value.name == "x"
    assert read_submission(json.dumps(TRAINING_GPU).encode(), "team").metadata.namespace == "team"


@pytest.mark.parametrize(("model", "key"), [("H100", "H100"), ("h100-sxm", "H100"),
                                            ("NVIDIA H100 80GB HBM3", "H100"), ("A100-40GB", "A100-40GB"),
                                            ("a100", "A100"), ("B300", "B300"), ("NVIDIA H200", "H200")])
def test_model_lookup_is_case_insensitive_substring(model: str, key: str) -> None:
    assert lookup_model(model).key == key


def topology(**node: Any) -> dict[str, Any]:
    return {"kind": "Topology", "nodes": [{"name": "n1", "gpuModel": "H100", "gpuCount": 4, **node}]}


def test_lab_node_becomes_four_a100s_with_numa_spread() -> None:
    docs = documents_from([topology(gpuModel="A100", numaNodes=2, nodeLabels={"nvidia.com/gpu.product": "A100"})],
                          "test")
    fleet = Fleet.from_slices(docs.slices, docs.labels)
    devices = fleet.nodes["n1"].devices
    assert [d.name for d in devices] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    assert [d.attributes["gpu.nvidia.com/numa-node"] for d in devices] == [0, 0, 1, 1]
    assert {d.attribute_text("gpu.nvidia.com/productName") for d in devices} == {"A100"}
    assert str(devices[0].memory) == "81920Mi"
    assert fleet.nodes["n1"].labels == {"nvidia.com/gpu.product": "A100"}


def test_mig_gpu_is_offered_only_as_its_partitions() -> None:
    [slice_doc] = topology_to_resource_slices(topology(gpuCount=1, mig={0: ["3g.40gb", "3g.40gb"]}))
    names = [d["name"] for d in slice_doc["spec"]["devices"]]
    assert names == ["gpu-0-mig-3g40gb-9-0", "gpu-0-mig-3g40gb-9-4"]
    assert slice_doc["spec"]["devices"][1]["capacity"]["memorySlice7"] == {"value": "1"}


@pytest.mark.parametrize(("node", "message"), [
    ({"gpuModel": "T4"}, "gpuModel 'T4' is not a known GPU"),
    ({"mig": {0: ["7g.80gb", "1g.10gb"]}}, "does not fit"),
    ({"mig": {0: ["9g.1tb"]}}, "has no MIG profile '9g.1tb'"),
    ({"gpuCount": -1}, "gpuCount must be a non-negative integer"),
])
def test_bad_topologies_name_node_and_field(node: dict[str, Any], message: str) -> None:
    with pytest.raises(InventoryFileError, match=message):
        documents_from([topology(**node)], "fleet.yaml")
