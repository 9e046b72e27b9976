"""Claim and node names in subjects (contract, NATS subjects): each '.' of a name is written '_', which no
Kubernetes name holds, so the token reads back as the name; a name no subject can carry is refused."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, cast

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.watcher.publish import InventoryPublisher
from shared.contract import subjects
from shared.dra import model as dra
from shared.fleet.sources import InventoryFileError, load_inventory

LABEL = st.from_regex(r"\A[a-z0-9]([-a-z0-9]{0,20}[a-z0-9])?\Z")
KUBERNETES_NAMES = st.lists(LABEL, min_size=1, max_size=6).map(".".join).filter(lambda n: len(n) <= 253)


@pytest.mark.parametrize(("name", "token"), [
    ("train", "train"),
    ("train.v2", "train_v2"),
    ("node-1.example.com", "node-1_example_com"),
    ("a" * 253, "a" * 253),
    # names Kubernetes refuses that a subject still carries: their Rejected status goes there
    ("UpperCase", "UpperCase"),
    ("My.Claim", "My_Claim"),
    ("-lead", "-lead"),
    ("a..b", "a__b"),
    (".", "_"),
])
def test_a_carried_name_and_its_token(name: str, token: str) -> None:
    assert subjects.carries(name)
    assert subjects.name_token(name) == token
    assert subjects.name_of(token) == name
    assert subjects.status("vision", name) == f"claimbroker.v1.claims.status.vision.{token}"
    assert subjects.status_parts(subjects.status("vision", name)) == ("vision", token)
    assert subjects.inventory(name) == f"claimbroker.v1.inventory.{token}"


@pytest.mark.parametrize("name", [
    "", "a" * 254, "under_score",  # '_' stands for '.': `a_b` would share `a.b`'s subject
    "a b", "a*", ">", "a>b", "tab\tname", "nul\x00", "ünïcode", "a/b", "a\udc00",
])
def test_a_name_no_subject_carries_is_refused(name: str) -> None:
    assert not subjects.carries(name)
    for build in (subjects.name_token, lambda n: subjects.status("vision", n), subjects.inventory):
        with pytest.raises(subjects.SubjectError, match="cannot be carried in a subject"):
            build(name)


def test_a_tenant_is_one_token_still() -> None:
    with pytest.raises(subjects.SubjectError):
        subjects.status("vision.team", "train")


@pytest.mark.parametrize("subject", ["claimbroker.v1.claims.submit.vision", "claimbroker.v1.claims.status.vision",
                                     "claimbroker.v1.claims.status.vision.a.b", "claimbroker.v1.inventory.n1"])
def test_only_a_status_subject_has_status_parts(subject: str) -> None:
    with pytest.raises(subjects.SubjectError, match="not a status subject"):
        subjects.status_parts(subject)


@given(KUBERNETES_NAMES)
def test_every_kubernetes_name_is_one_token_that_reads_back(name: str) -> None:
    assert dra.is_dns_subdomain(name)
    token = subjects.name_token(name)
    assert "." not in token and token == token.strip() and token
    assert subjects.name_of(token) == name
    subject = subjects.status("t1", name)
    assert len(subject.split(".")) == 6 and subjects.status_parts(subject)[1] == token


@given(st.lists(st.text(st.sampled_from("aZ.-_"), min_size=1, max_size=6), min_size=2, max_size=2, unique=True))
def test_two_carried_names_never_share_a_token(names: list[str]) -> None:
    carried = [n for n in names if subjects.carries(n)]
    assert len({subjects.name_token(n) for n in carried}) == len(carried)


TOPOLOGY = "kind: Topology\nnodes:\n  - {{name: {node}, gpuModel: H100, gpuCount: 1}}\n"
SLICE = """apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata: {{name: s1}}
spec:
  driver: gpu.nvidia.com
  nodeName: {node}
  pool: {{name: p1, generation: 1, resourceSliceCount: 1}}
  devices: [{{name: gpu-0}}]
"""


@pytest.mark.parametrize("document", [TOPOLOGY, SLICE])
def test_an_inventory_file_takes_a_dotted_node(tmp_path: Path, document: str) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(document.format(node="gpu-1.example.com"))
    assert load_inventory([path]).nodes() == ["gpu-1.example.com"]


@pytest.mark.parametrize(("document", "where"), [(TOPOLOGY, "document 1 (Topology): nodes[0].name"),
                                                 (SLICE, "document 1: spec.nodeName")])
@pytest.mark.parametrize("node", ["Node-1", "node_1", "node-1.", "'n 1'"])
def test_an_inventory_file_with_a_node_name_kubernetes_refuses_is_refused_by_name(
        tmp_path: Path, document: str, where: str, node: str) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(document.format(node=node))
    with pytest.raises(InventoryFileError) as refused:
        load_inventory([path])
    assert str(refused.value).startswith(f"{path}: {where}: "), refused.value
    assert str(refused.value).endswith("as Kubernetes requires of a node's name"), refused.value


async def test_the_watcher_publishes_no_node_kubernetes_refuses_and_says_so_once(
        caplog: pytest.LogCaptureFixture) -> None:
    """Any source's node (kube, NVML, files) goes through the publisher: one error per name, nothing sent."""
    publisher = InventoryPublisher(cast(Any, None), heartbeat_interval=30)  # no bus: nothing may reach it
    with caplog.at_level(logging.ERROR, logger="claimbroker.watcher"):
        for _ in range(3):
            assert await publisher.publish("GPU_Box", [], labels={}) is False
    assert [r.getMessage() for r in caplog.records] == [
        "node \"GPU_Box\": the name must be a DNS subdomain (lowercase letters, digits, '-' and '.', starting and "
        "ending "
        "with a letter or digit, at most 253 characters), as Kubernetes requires of a node's name: its inventory is "
        "not published"]
    assert publisher.nodes() == set() and await publisher.remove("GPU_Box") is False
