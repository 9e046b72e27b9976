"""The claim status is one typed model: the builder the allocator publishes with writes the contract's JSON
byte for byte (keys in order, `by` and `unsatisfiable` only when they apply), and `read_status` is what
readers parse with: it gives back what was published, keeps what a newer broker adds, and names the field
of what is no status."""

from __future__ import annotations

import json

import orjson
import pytest

from shared.contract import events
from shared.contract.messages import UnreadableStatus, read_status
from shared.dra.results import Allocation, DeviceResult

ALLOCATION = Allocation("node-03", (DeviceResult("gpu", "gpu.nvidia.com", "node-03", "gpu-1"),
                                    DeviceResult("mon", "gpu.nvidia.com", "node-03", "gpu-2", admin_access=True)),
                        ({"opaque": {"driver": "x", "parameters": {"a": 1.5}}},)).to_json()


def test_the_published_bytes_are_the_contract_s() -> None:
    allocated = events.claim_status(namespace="vision", name="training-gpu", state="Allocated", allocation=ALLOCATION,
                                    reason=None, sequence=3, observed_at=1700000000.25)
    assert orjson.dumps(allocated) == (
        b'{"namespace":"vision","name":"training-gpu","state":"Allocated","allocation":{"nodeName":"node-03",'
        b'"devices":{"results":[{"request":"gpu","driver":"gpu.nvidia.com","pool":"node-03","device":"gpu-1"},'
        b'{"request":"mon","driver":"gpu.nvidia.com","pool":"node-03","device":"gpu-2","adminAccess":true}],'
        b'"config":[{"opaque":{"driver":"x","parameters":{"a":1.5}}}]},"nodeSelector":{"nodeSelectorTerms":'
        b'[{"matchFields":[{"key":"metadata.name","operator":"In","values":["node-03"]}]}]}},"reason":null,'
        b'"observedAt":"2023-11-14T22:13:20.250000Z","sequence":3}')
    preempted = events.claim_status(namespace="vision", name="low", state="Preempted", allocation=None,
                                    reason="preempted by vision/urgent", sequence=4, observed_at=1.0,
                                    by="vision/urgent")
    assert orjson.dumps(preempted) == (
        b'{"namespace":"vision","name":"low","state":"Preempted","allocation":null,'
        b'"reason":"preempted by vision/urgent","observedAt":"1970-01-01T00:00:01Z","sequence":4,"by":"vision/urgent"}')
    unsatisfiable = events.claim_status(namespace="t", name="big", state="Pending", allocation=None, reason="no device",
                                        sequence=1, observed_at=2.5, unsatisfiable=True)
    assert orjson.dumps(unsatisfiable) == (
        b'{"namespace":"t","name":"big","state":"Pending","allocation":null,"reason":"no device",'
        b'"observedAt":"1970-01-01T00:00:02.500000Z","sequence":1,"unsatisfiable":true}')
    released = events.claim_status(namespace="t", name="x", state="Released", allocation={}, reason="gone",
                                   sequence=0, observed_at=3.0, by=None, unsatisfiable=False)
    assert list(released) == ["namespace", "name", "state", "allocation", "reason", "observedAt", "sequence"]
    assert released["allocation"] is None


@pytest.mark.parametrize("extra", [{}, {"by": "vision/urgent"}, {"unsatisfiable": True}])
def test_a_reader_gets_back_what_was_published_in_its_order(extra: dict[str, object]) -> None:
    status = events.claim_status(namespace="vision", name="c", state="Allocated", allocation=ALLOCATION,
                                 reason="why", sequence=7, **extra)  # type: ignore[arg-type]
    data = orjson.dumps(status)
    read = read_status(data)
    assert read == status and orjson.dumps(read) == data
    assert read_status(data.decode()) == status


def test_a_newer_broker_s_fields_are_kept_after_the_known_ones() -> None:
    data = json.dumps({"queuePosition": {"ahead": 3}, "namespace": "t", "name": "c", "state": "Pending",
                       "allocation": None, "reason": "waits", "observedAt": "x", "sequence": 2,
                       "by": "t/o"})
    read = read_status(data)
    assert list(read) == ["namespace", "name", "state", "allocation", "reason", "observedAt", "sequence", "by",
                          "queuePosition"]
    assert read["queuePosition"] == {"ahead": 3}  # type: ignore[typeddict-item]


def test_a_reader_needs_only_namespace_name_and_state() -> None:
    """What the CLI and the notifier always accepted: a hand-written status without the rest."""
    assert read_status(b'{"namespace": "big", "name": "c1", "state": "Pending"}') == {
        "namespace": "big", "name": "c1", "state": "Pending"}


@pytest.mark.parametrize(("data", "named"), [
    (b'{"namespace": "mallory"}', "name: Field required"),
    (b'{"namespace": "t", "name": "c", "state": "Lost"}', "state: Input should be 'Pending'"),
    (b'{"namespace": "t", "name": "c", "state": "Pending", "sequence": "1"}', "sequence: Input should be a valid int"),
    (b'{"namespace": "t", "name": "c", "state": "Pending", "sequence": 1.0}', "sequence: Input should be a valid int"),
    (b'{"namespace": "t", "name": 1, "state": "Pending"}', "name: Input should be a valid string"),
    (b'{"namespace": "t", "name": "c", "state": "Allocated", "allocation": {"devices": {"results": []}}}',
     "allocation.nodeName: Field required"),
    (b'[1]', "Input should be an object"),
    (b'not json', "Invalid JSON"),
])
def test_what_is_no_status_is_refused_with_its_field_named(data: bytes, named: str) -> None:
    with pytest.raises(UnreadableStatus, match=named) as refused:
        read_status(data)
    assert isinstance(refused.value, ValueError)
