"""Node labels in Topology documents: `nodeLabels` per entry, and `groupLabels` that give the nodes of one
`namePrefix`/`count` entry a shared value per group of N (racks, NVLink cliques), as Kubernetes node labels
the core can group nodes by."""

from __future__ import annotations

from typing import Any

import pytest

from shared.dra.inventory import Fleet
from shared.fleet.sources import InventoryFileError, documents_from
from shared.fleet.topology import topology_node_labels


def entry(**fields: Any) -> dict[str, Any]:
    return {"kind": "Topology", "nodes": [{"namePrefix": "gpu-", "count": 6, "gpuModel": "H100", "gpuCount": 8,
                                           **fields}]}


def test_group_labels_give_each_group_of_n_nodes_one_value() -> None:
    labels = topology_node_labels(entry(
        nodeLabels={"nvidia.com/gpu.product": "H100"},
        groupLabels={"nvidia.com/gpu.clique": {"every": 2, "prefix": "clique-"},
                     "topology.kubernetes.io/rack": {"every": 4, "prefix": "rack-", "start": 7}}))
    assert [labels[f"gpu-{i:02d}"]["nvidia.com/gpu.clique"] for i in range(1, 7)] == [
        "clique-01", "clique-01", "clique-02", "clique-02", "clique-03", "clique-03"]
    assert [labels[f"gpu-{i:02d}"]["topology.kubernetes.io/rack"] for i in range(1, 7)] == [
        "rack-07", "rack-07", "rack-07", "rack-07", "rack-08", "rack-08"]
    assert {labels[n]["nvidia.com/gpu.product"] for n in labels} == {"H100"}


def test_each_entry_numbers_its_own_groups_and_start_continues_another() -> None:
    labels = topology_node_labels({"kind": "Topology", "nodes": [
        {"namePrefix": "a-", "count": 3, "gpuModel": "H100", "gpuCount": 8,
         "groupLabels": {"rack": {"every": 2, "prefix": "r"}}},
        {"namePrefix": "b-", "count": 2, "gpuModel": "B200", "gpuCount": 8,
         "groupLabels": {"rack": {"every": 2, "prefix": "r", "start": 3}}},
        {"name": "solo", "gpuModel": "A100", "gpuCount": 4, "groupLabels": {"rack": {"every": 8}}}]})
    assert {name: node["rack"] for name, node in labels.items()} == {
        "a-01": "r01", "a-02": "r01", "a-03": "r02", "b-01": "r03", "b-02": "r03", "solo": "01"}


def test_a_built_fleets_nodes_carry_the_group_values() -> None:
    """What the core reads: `Fleet.from_slices(slices, labels)` from an inventory file's documents."""
    documents = documents_from([entry(count=4, groupLabels={"nvidia.com/gpu.clique": {"every": 2, "prefix": "c"}})],
                               "fleet.yaml")
    fleet = Fleet.from_slices(documents.slices, documents.labels)
    by_clique: dict[str, list[str]] = {}
    for name, node in sorted(fleet.nodes.items()):
        by_clique.setdefault(node.labels["nvidia.com/gpu.clique"], []).append(name)
    assert by_clique == {"c01": ["gpu-01", "gpu-02"], "c02": ["gpu-03", "gpu-04"]}


def test_node_labels_are_kubernetes_label_values() -> None:
    labels = topology_node_labels(entry(count=1, nodeLabels={"rack": 3, "fast": True, "empty": ""}))
    assert labels["gpu-01"] == {"rack": "3", "fast": "true", "empty": ""}


BAD = {
    "labels-not-a-map": ({"nodeLabels": ["a"]}, "nodes[0].nodeLabels: a map of label key to value"),
    "a-bad-key": ({"nodeLabels": {"a/b/c": "x"}}, "nodes[0].nodeLabels: key \"a/b/c\" must be a name"),
    "a-bad-value": ({"nodeLabels": {"rack": "a b"}}, "nodes[0].nodeLabels[rack]: \"a b\" must be empty or"),
    "a-nested-value": ({"nodeLabels": {"rack": {"x": 1}}}, "is not a label value"),
    "groups-not-a-map": ({"groupLabels": "rack"}, "nodes[0].groupLabels: a map of label key"),
    "a-group-not-a-map": ({"groupLabels": {"rack": 4}}, "nodes[0].groupLabels[rack]: expected {every: N"),
    "no-every": ({"groupLabels": {"rack": {"prefix": "r"}}}, "groupLabels[rack].every: how many nodes share"),
    "every-0": ({"groupLabels": {"rack": {"every": 0}}}, "groupLabels[rack].every: how many nodes share"),
    "every-a-string": ({"groupLabels": {"rack": {"every": "4"}}}, "groupLabels[rack].every"),
    "a-negative-start": ({"groupLabels": {"rack": {"every": 2, "start": -1}}}, "groupLabels[rack].start"),
    "a-prefix-not-a-string": ({"groupLabels": {"rack": {"every": 2, "prefix": ["r"]}}}, "groupLabels[rack].prefix"),
    "a-prefix-no-label-allows": ({"groupLabels": {"rack": {"every": 2, "prefix": "rack "}}},
                                 "groupLabels[rack]: \"rack 01\" must be empty or"),
    "an-unknown-field": ({"groupLabels": {"rack": {"every": 2, "size": 4}}}, "groupLabels[rack].size: unknown field"),
    "a-key-in-both": ({"nodeLabels": {"rack": "r1"}, "groupLabels": {"rack": {"every": 2}}},
                      "groupLabels[rack]: also in nodeLabels"),
}


@pytest.mark.parametrize(("fields", "message"), BAD.values(), ids=BAD.keys())
def test_bad_labels_name_the_file_the_document_and_the_field(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(InventoryFileError) as raised:
        documents_from([entry(**fields)], "fleet.yaml")
    assert str(raised.value).startswith("fleet.yaml: document 1 (Topology): ")
    assert message in str(raised.value)
