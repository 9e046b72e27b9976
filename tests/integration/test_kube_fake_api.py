"""The fake API server (tests/kube_api.py) driven by the real `kubernetes.aio` client, one semantic per test:
optimistic concurrency (stale versions and armed conflicts answer 409), the status subresource, immutable
claim specs and allocations, finalizers holding deletion, gates that may only be removed, bodies checked with
the client's models, evictions under disruption budgets, the scheduler/kubelet/claim-controller simulation,
watch events, Events, and the three patch types. What the fake does not do as the real server does is listed
in its module docstring."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest
from kubernetes.aio import client, watch
from kubernetes.aio.client.exceptions import ApiException

from tests.kube_api import (
    CLAIMS,
    EVENTS,
    GATE,
    JSON_PATCH,
    MERGE_PATCH,
    NODES,
    PDBS,
    PODS,
    STRATEGIC_PATCH,
    FakeApiServer,
    allocation,
    disruption_budget,
    fake_api,
    json_patch,
    merge_patch,
    node,
    pod,
    resource_claim,
    strategic_merge_patch,
)

__all__ = ["fake_api"]  # the fixture, used by `kube`

NS = "team-a"
Model = TypeVar("Model")
FINALIZER = "claimbroker.io/allocation"


@dataclass
class Kube:
    api: FakeApiServer
    api_client: client.ApiClient
    resource: client.ResourceV1Api
    core: client.CoreV1Api

    def plain(self, model: Any) -> dict[str, Any]:
        """A client model as the API's JSON (camelCase, no nulls)."""
        return dict(self.api_client.sanitize_for_serialization(model))

    async def send(self, method: str, path: str, body: Any, *, query: list[tuple[str, str]] | None = None,
                   content_type: str = "application/json") -> Any:
        """A request the typed methods would refuse to build (an invalid body): the client's own transport."""
        serialized = await self.api_client.param_serialize(method=method, resource_path=path, query_params=query or [],
                                                        header_params={"Content-Type": content_type,
                                                                       "Accept": "application/json"}, body=body)
        response = await self.api_client.call_api(*serialized)
        await response.read()
        return self.api_client.response_deserialize(response, {"200": "object", "201": "object"}).data

    async def claim(self, name: str, **options: Any) -> dict[str, Any]:
        body = as_claim(resource_claim(name, NS, **options))
        return self.plain(await self.resource.create_namespaced_resource_claim(NS, body))

    async def allocate(self, name: str, node_name: str = "node-a", devices: tuple[str, ...] = ("gpu-0",)
                       ) -> dict[str, Any]:
        current = self.plain(await self.resource.read_namespaced_resource_claim(name, NS))
        current["status"] = {"allocation": allocation(node_name, list(devices))}
        return self.plain(await self.resource.replace_namespaced_resource_claim_status(name, NS, as_claim(current)))

    async def pod(self, name: str, **options: Any) -> dict[str, Any]:
        return self.plain(await self.core.create_namespaced_pod(NS, model(client.V1Pod, pod(name, NS, **options))))


@pytest.fixture
async def kube(fake_api: tuple[FakeApiServer, str]) -> AsyncIterator[Kube]:
    api, url = fake_api
    api.apply(NODES, "ADDED", node("node-a", {}, {"nvidia.com/gpu": "4"}))
    api_client = client.ApiClient(client.Configuration(host=url))
    try:
        yield Kube(api, api_client, client.ResourceV1Api(api_client), client.CoreV1Api(api_client))
    finally:
        await api_client.close()


def model(cls: type[Model], document: dict[str, Any]) -> Model:
    """A client model from the API's JSON (the typed methods take models)."""
    built = cls.from_dict(document)  # type: ignore[attr-defined]
    assert built is not None
    return built


def as_claim(document: dict[str, Any]) -> client.ResourceV1ResourceClaim:
    return model(client.ResourceV1ResourceClaim, document)


def as_eviction(document: dict[str, Any]) -> client.V1Eviction:
    return model(client.V1Eviction, document)


def status_of(error: ApiException) -> dict[str, Any]:
    return dict(json.loads(error.body or "{}"))


def message(error: ApiException) -> str:
    return str(status_of(error)["message"])


async def refused(call: Any) -> ApiException:
    """The ApiException a call must raise."""
    with pytest.raises(ApiException) as caught:
        await call
    return caught.value


async def test_a_stale_resource_version_and_an_armed_conflict_answer_409(kube: Kube) -> None:
    created = await kube.claim("train")
    stale = dict(created, metadata={**created["metadata"]})
    await kube.allocate("train")  # someone else wrote first
    stale["status"] = {"allocation": allocation("node-a", ["gpu-1"])}
    error = await refused(kube.resource.replace_namespaced_resource_claim_status("train", NS, as_claim(stale)))
    assert error.status == 409
    assert status_of(error)["reason"] == "Conflict"
    assert message(error) == (
        'Operation cannot be fulfilled on resourceclaims.resource.k8s.io "train": the object has been modified; '
        "please apply your changes to the latest version and try again")

    # a concurrent writer: the next write answers 409 with a matching version, and moves the version on
    kube.api.arm_conflict(CLAIMS, NS, "train", times=1)
    current = kube.plain(await kube.resource.read_namespaced_resource_claim("train", NS))
    patch = {"metadata": {"resourceVersion": current["metadata"]["resourceVersion"], "labels": {"a": "b"}}}
    error = await refused(kube.resource.patch_namespaced_resource_claim("train", NS, patch,
                                                                        _content_type=MERGE_PATCH))
    assert error.status == 409
    retry = await refused(kube.resource.patch_namespaced_resource_claim("train", NS, patch,
                                                                        _content_type=MERGE_PATCH))
    assert retry.status == 409  # the same version again is stale now: a retry must read first
    current = kube.plain(await kube.resource.read_namespaced_resource_claim("train", NS))
    patch["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
    updated = kube.plain(await kube.resource.patch_namespaced_resource_claim("train", NS, patch,
                                                                             _content_type=MERGE_PATCH))
    assert updated["metadata"]["labels"] == {"a": "b"}
    assert kube.api.conflicts == 3
    assert kube.api.count("patch", CLAIMS, code=409) == 2 and kube.api.count("patch", CLAIMS, code=200) == 1
    assert kube.api.count("update", CLAIMS, subresource="status") == 2


async def test_the_status_subresource_writes_status_only_and_the_main_resource_ignores_status(kube: Kube) -> None:
    created = await kube.claim("train")
    body = dict(created, metadata={**created["metadata"], "labels": {"changed": "yes"}},
                spec={"devices": {"requests": []}}, status={"allocation": allocation("node-a", ["gpu-0"])})
    written = kube.plain(await kube.resource.replace_namespaced_resource_claim_status("train", NS, as_claim(body)))
    assert written["status"]["allocation"]["devices"]["results"][0]["device"] == "gpu-0"
    assert written["spec"] == created["spec"] and "labels" not in written["metadata"]
    assert int(written["metadata"]["resourceVersion"]) > int(created["metadata"]["resourceVersion"])

    main = dict(written, metadata={**written["metadata"], "labels": {"team": "a"}}, status={})
    updated = kube.plain(await kube.resource.replace_namespaced_resource_claim("train", NS, as_claim(main)))
    assert updated["metadata"]["labels"] == {"team": "a"}
    assert updated["status"] == written["status"]  # status in a main update is ignored
    status_patch = {"status": {"reservedFor": []}, "metadata": {"labels": {"team": "b"}}}
    patched = kube.plain(await kube.resource.patch_namespaced_resource_claim_status("train", NS, status_patch,
                                                                                    _content_type=MERGE_PATCH))
    assert patched["metadata"]["labels"] == {"team": "a"}

    # a write that changes nothing is not stored: same version, no watch event
    again = kube.plain(await kube.resource.replace_namespaced_resource_claim("train", NS, as_claim(patched)))
    assert again["metadata"]["resourceVersion"] == patched["metadata"]["resourceVersion"]


async def test_a_claim_spec_and_a_set_allocation_are_immutable(kube: Kube) -> None:
    created = await kube.claim("train")
    changed = dict(created, spec=resource_claim("train", NS, count=2)["spec"])
    error = await refused(kube.resource.replace_namespaced_resource_claim("train", NS, as_claim(changed)))
    assert error.status == 422 and status_of(error)["reason"] == "Invalid"
    assert 'ResourceClaim.resource.k8s.io "train" is invalid: spec: Invalid value: field is immutable' in (
        message(error))

    allocated = await kube.allocate("train")
    moved = dict(allocated, status={"allocation": allocation("node-a", ["gpu-3"])})
    error = await refused(kube.resource.replace_namespaced_resource_claim_status("train", NS, as_claim(moved)))
    assert error.status == 422 and "status.allocation: Invalid value: field is immutable" in message(error)
    cleared = kube.plain(await kube.resource.replace_namespaced_resource_claim_status(
        "train", NS, as_claim(dict(allocated, status={}))))
    assert "allocation" not in cleared.get("status", {})  # clear, then set: allowed


@pytest.mark.parametrize(("status", "expected"), [
    ({"reservedFor": [{"resource": "pods", "name": "p", "uid": "u1"}]},
     "status.reservedFor: Forbidden: may not be specified when `allocated` is not set"),
    ({"allocation": allocation("node-a", ["gpu-0"], request="nope")},
     'status.allocation.devices.results[0].request: Invalid value: "nope"'),
    ({"allocation": allocation("node-a", ["gpu-0"]), "reservedFor": [{"resource": "pods", "name": "p", "uid": "u1"},
                                                                   {"resource": "pods", "name": "q", "uid": "u1"}]},
     "status.reservedFor[1]: Duplicate value"),
])
async def test_claim_status_is_validated_as_the_server_does(kube: Kube, status: dict[str, Any], expected: str
                                                            ) -> None:
    created = await kube.claim("train")
    body = as_claim(dict(created, status=status))
    error = await refused(kube.resource.replace_namespaced_resource_claim_status("train", NS, body))
    assert error.status == 422 and expected in message(error)


async def test_a_finalizer_holds_deletion_until_the_last_one_is_removed(kube: Kube) -> None:
    created = await kube.claim("train")
    await kube.resource.patch_namespaced_resource_claim("train", NS, {"metadata": {"finalizers": [FINALIZER]}},
                                                        _content_type=MERGE_PATCH)
    held = kube.plain(await kube.resource.delete_namespaced_resource_claim("train", NS))
    assert held["metadata"]["deletionTimestamp"] and held["metadata"]["deletionGracePeriodSeconds"] == 0
    assert kube.api.get(CLAIMS, NS, "train") is not None
    assert kube.api.requests[-1].code == 202  # accepted, not done

    error = await refused(kube.resource.patch_namespaced_resource_claim(
        "train", NS, {"metadata": {"finalizers": [FINALIZER, "other.io/x"]}}, _content_type=MERGE_PATCH))
    assert error.status == 422 and "no new finalizers can be added if the object is being deleted" in message(error)

    await kube.resource.patch_namespaced_resource_claim("train", NS, {"metadata": {"finalizers": None}},
                                                        _content_type=MERGE_PATCH)
    assert kube.api.get(CLAIMS, NS, "train") is None
    events = [(event, obj["metadata"].get("deletionTimestamp") is not None)
              for _, event, obj in kube.api.history[CLAIMS]]
    assert events == [("ADDED", False), ("MODIFIED", False), ("MODIFIED", True), ("DELETED", True)]
    assert created["metadata"]["uid"] == kube.api.history[CLAIMS][-1][2]["metadata"]["uid"]


async def test_scheduling_gates_may_only_be_removed(kube: Kube) -> None:
    created = await kube.pod("worker", gates=(GATE, "other.io/gate"))
    assert created["status"]["phase"] == "Pending"
    assert created["status"]["conditions"][0]["reason"] == "SchedulingGated"
    error = await refused(kube.pod("placed", node_name="node-a"))
    assert error.status == 422 and "cannot be set until all schedulingGates have been cleared" in message(error)

    added = {"spec": {"schedulingGates": [{"name": GATE}, {"name": "other.io/gate"}, {"name": "third.io/gate"}]}}
    error = await refused(kube.core.patch_namespaced_pod("worker", NS, added, _content_type=MERGE_PATCH))
    assert error.status == 422 and "only deletion is allowed, but found new scheduling gate 'third.io/gate'" in (
        message(error))
    image = [{"op": "replace", "path": "/spec/containers/0/image", "value": "other:2"}]
    error = await refused(kube.core.patch_namespaced_pod("worker", NS, image, _content_type=JSON_PATCH))
    assert error.status == 422 and "pod updates may not change fields" in message(error)

    removed = [{"op": "test", "path": "/spec/schedulingGates/0/name", "value": GATE},
               {"op": "remove", "path": "/spec/schedulingGates/0"}]
    patched = kube.plain(await kube.core.patch_namespaced_pod("worker", NS, removed, _content_type=JSON_PATCH))
    assert patched["spec"]["schedulingGates"] == [{"name": "other.io/gate"}]
    # the client's default for a dict body is a strategic merge patch: `$patch: delete` removes by key
    ungated = {"spec": {"schedulingGates": [{"name": "other.io/gate", "$patch": "delete"}]}}
    patched = kube.plain(await kube.core.patch_namespaced_pod("worker", NS, ungated))
    assert not patched["spec"].get("schedulingGates")
    assert kube.api.requests[-1].content_type == STRATEGIC_PATCH
    assert kube.api.read(PODS, NS, "worker")["spec"]["nodeName"] == "node-a"  # no claims: the first node


async def test_bodies_are_checked_with_the_client_models(kube: Kube) -> None:
    path = f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims"
    bad_type = resource_claim("bad", NS)
    bad_type["spec"]["devices"]["requests"] = "one gpu"
    error = await refused(kube.send("POST", path, bad_type))
    assert error.status == 422 and 'ResourceClaim.resource.k8s.io "bad" is invalid' in message(error)
    assert "V1DeviceRequest" in message(error)  # the model that refused it

    error = await refused(kube.send("POST", path, dict(resource_claim("pod", NS), apiVersion="v1")))
    assert error.status == 400 and "does not match the expected API version (resource.k8s.io/v1)" in message(error)
    error = await refused(kube.send("POST", path, dict(resource_claim("pod", NS), kind="Pod")))
    assert error.status == 400
    # stored at another version (apply is raw): served as the endpoint's version, so a patch works on it
    kube.api.apply(CLAIMS, "ADDED", dict(resource_claim("old", NS), apiVersion="resource.k8s.io/v1beta1"))
    patched = await kube.send("PATCH", f"{path}/old", {"metadata": {"labels": {"a": "b"}}}, content_type=MERGE_PATCH)
    assert patched["apiVersion"] == "resource.k8s.io/v1" and patched["metadata"]["labels"] == {"a": "b"}

    unknown = resource_claim("extra", NS)
    unknown["spec"]["surprise"] = {"a": 1}
    created = await kube.send("POST", path, unknown)
    assert "surprise" not in created["spec"]  # dropped, with a warning, as the real server does
    assert kube.api.requests[-1].warnings == ('unknown field "spec.surprise"',)
    error = await refused(kube.send("POST", path, dict(unknown, metadata={"name": "strict"}),
                                    query=[("fieldValidation", "Strict")]))
    assert error.status == 400 and 'unknown field "spec.surprise"' in message(error)

    no_spec = await kube.send("POST", path, {"metadata": {"name": "bare"}})  # a claim needs no spec
    assert no_spec["kind"] == "ResourceClaim" and no_spec["metadata"]["uid"]
    assert no_spec["metadata"]["generation"] == 1 and no_spec["metadata"]["creationTimestamp"]
    error = await refused(kube.resource.create_namespaced_resource_claim(
        NS, as_claim(resource_claim("bare", NS))))
    assert error.status == 409 and status_of(error)["reason"] == "AlreadyExists"


async def test_the_scheduler_binds_an_ungated_pod_to_its_claims_node_and_reserves_them(kube: Kube) -> None:
    kube.api.apply(NODES, "ADDED", node("node-b", {}, {"nvidia.com/gpu": "4"}))
    await kube.claim("train")
    created = await kube.pod("worker", claims=("train",))
    ungate = {"metadata": {"resourceVersion": created["metadata"]["resourceVersion"]},
              "spec": {"schedulingGates": None}}
    await kube.core.patch_namespaced_pod("worker", NS, ungate, _content_type=MERGE_PATCH)
    waiting = kube.api.read(PODS, NS, "worker")
    assert "nodeName" not in waiting["spec"]  # ungated, but its claim is not allocated: the fake never allocates
    assert waiting["status"]["conditions"][-1]["reason"] == "Unschedulable"

    await kube.allocate("train", "node-b", ("gpu-2",))  # the allocation lets it in
    bound = kube.api.read(PODS, NS, "worker")
    assert bound["spec"]["nodeName"] == "node-b" and bound["status"]["phase"] == "Running"
    reserved = kube.api.read(CLAIMS, NS, "train")["status"]["reservedFor"]
    assert reserved == [{"resource": "pods", "name": "worker", "uid": created["metadata"]["uid"]}]

    # the claim controller: a deleted pod leaves reservedFor; then the allocation may be cleared
    await kube.core.delete_namespaced_pod("worker", NS)
    claim = kube.api.read(CLAIMS, NS, "train")
    assert "reservedFor" not in claim["status"]
    cleared = kube.plain(await kube.resource.replace_namespaced_resource_claim_status("train", NS,
                                                                                      as_claim(dict(claim, status={}))))
    assert "allocation" not in (cleared.get("status") or {})


async def test_a_finished_pod_leaves_reserved_for_and_switches_hold_the_control_plane(kube: Kube) -> None:
    await kube.claim("train")
    await kube.allocate("train")
    await kube.pod("worker", claims=("train",), gates=())
    assert kube.api.read(CLAIMS, NS, "train")["status"]["reservedFor"][0]["name"] == "worker"
    kube.api.finish_pod(NS, "worker")
    assert "reservedFor" not in kube.api.read(CLAIMS, NS, "train")["status"]

    kube.api.kubelet = False
    await kube.pod("bound-only", gates=())
    assert kube.api.read(PODS, NS, "bound-only")["status"]["phase"] == "Pending"
    kube.api.scheduler = False
    await kube.pod("unscheduled", gates=())
    assert "nodeName" not in kube.api.read(PODS, NS, "unscheduled")["spec"]


async def test_an_eviction_is_refused_by_a_disruption_budget_and_honoured_within_it(kube: Kube) -> None:
    for name in ("w-0", "w-1", "w-2"):
        await kube.pod(name, gates=(), labels={"app": "train"})
    await kube.pod("other", gates=())
    selected = await kube.core.list_namespaced_pod(NS, label_selector="app=train",
                                                   field_selector="spec.nodeName=node-a,status.phase!=Pending")
    assert sorted(p.metadata.name or "" for p in selected.items if p.metadata) == ["w-0", "w-1", "w-2"]
    kube.api.create(PDBS, disruption_budget("train", NS, {"app": "train"}, min_available=3))
    eviction = client.V1Eviction(api_version="policy/v1", kind="Eviction",
                                 metadata=client.V1ObjectMeta(name="w-0", namespace=NS))
    error = await refused(kube.core.create_namespaced_pod_eviction("w-0", NS, eviction))
    assert error.status == 429
    assert message(error) == "Cannot evict pod as it would violate the pod's disruption budget."
    assert status_of(error)["details"]["causes"][0]["message"] == (
        "The disruption budget train needs 3 healthy pods and has 3 currently")
    assert kube.api.get(PODS, NS, "w-0") is not None

    kube.api.apply(PDBS, "MODIFIED", disruption_budget("train", NS, {"app": "train"}, min_available=2))
    await kube.core.create_namespaced_pod_eviction("w-0", NS, eviction)
    assert kube.api.get(PODS, NS, "w-0") is None
    second = dict(kube.plain(eviction), metadata={"name": "w-1", "namespace": NS})
    error = await refused(kube.core.create_namespaced_pod_eviction("w-1", NS, as_eviction(second)))
    assert error.status == 429  # two must stay, and two are left
    missing = as_eviction(dict(second, metadata={"name": "gone"}))
    error = await refused(kube.core.create_namespaced_pod_eviction("gone", NS, missing))
    assert error.status == 404
    assert kube.api.count("create", PODS, subresource="eviction") == 4


async def test_watches_of_claims_and_pods_see_every_change_including_the_control_planes(kube: Kube) -> None:
    listed = await kube.resource.list_resource_claim_for_all_namespaces()
    assert listed.metadata is not None
    start = listed.metadata.resource_version
    await kube.claim("train")
    await kube.resource.patch_namespaced_resource_claim("train", NS, {"metadata": {"finalizers": [FINALIZER]}},
                                                        _content_type=MERGE_PATCH)
    await kube.allocate("train")
    await kube.pod("worker", claims=("train",), gates=())  # bound and reserved by the control plane
    await kube.core.delete_namespaced_pod("worker", NS)  # reservation dropped by the claim controller
    await kube.resource.delete_namespaced_resource_claim("train", NS)
    await kube.resource.patch_namespaced_resource_claim("train", NS, {"metadata": {"finalizers": None}},
                                                        _content_type=MERGE_PATCH)

    async def events(list_fn: Callable[..., Any], model: Any, count: int) -> list[tuple[str, Any]]:
        """`return_type`: the client's Watch guesses `V1ResourceClaim` from the list type, a model v37 lacks."""
        seen: list[tuple[str, Any]] = []
        async with watch.Watch(return_type=model) as stream:
            async for event in stream.stream(list_fn, resource_version=start, timeout_seconds=5):
                seen.append((event["type"], kube.plain(event["object"])))
                if len(seen) == count:
                    break
        return seen

    claims = await events(kube.resource.list_resource_claim_for_all_namespaces, client.ResourceV1ResourceClaim, 7)
    assert [t for t, _ in claims] == ["ADDED", "MODIFIED", "MODIFIED", "MODIFIED", "MODIFIED", "MODIFIED",
                                      "DELETED"]
    assert [len(o.get("status", {}).get("reservedFor", [])) for _, o in claims[3:5]] == [1, 0]
    pods = await events(kube.core.list_pod_for_all_namespaces, client.V1Pod, 4)
    assert [t for t, _ in pods] == ["ADDED", "MODIFIED", "MODIFIED", "DELETED"]
    assert pods[1][1]["spec"]["nodeName"] == "node-a" and pods[2][1]["status"]["phase"] == "Running"

    # one namespace, from now: the current objects first
    kube.api.create(PODS, pod("elsewhere", "team-b", gates=()))
    async with watch.Watch() as stream:
        async for event in stream.stream(kube.core.list_namespaced_pod, "team-b", timeout_seconds=5):
            assert event["type"] == "ADDED" and event["object"].metadata.name == "elsewhere"
            break
    # 410 after compaction, for a stale version
    kube.api.compact(PODS)
    with pytest.raises(ApiException) as gone:
        async with watch.Watch() as stream:
            async for _ in stream.stream(kube.core.list_pod_for_all_namespaces, resource_version=start,
                                         timeout_seconds=5):
                pass
    assert gone.value.status == 410


async def test_events_are_created_with_generated_names_and_listed(kube: Kube) -> None:
    claim = await kube.claim("train")
    for reason in ("Pending", "Allocated"):
        event = client.CoreV1Event(
            metadata=client.V1ObjectMeta(generate_name="train.", namespace=NS),
            involved_object=client.V1ObjectReference(api_version="resource.k8s.io/v1", kind="ResourceClaim",
                                                     name="train", namespace=NS, uid=claim["metadata"]["uid"]),
            reason=reason, message=f"claim {reason}", type="Normal", count=1)
        created = await kube.core.create_namespaced_event(NS, event)
        name = created.metadata.name or ""
        assert name.startswith("train.") and len(name) == len("train.") + 5
    assert [e["reason"] for e in kube.api.events(NS)] == ["Pending", "Allocated"]
    assert [e["reason"] for e in kube.api.events(NS, reason="Allocated", involved="train")] == ["Allocated"]
    assert kube.api.events("other") == []
    listed = await kube.core.list_namespaced_event(NS)
    assert len(listed.items) == 2
    error = await refused(kube.send("POST", f"/api/v1/namespaces/{NS}/events",
                                    {"metadata": {"generateName": "x."}, "reason": "NoObject"}))
    assert error.status == 422  # involvedObject is required by the model
    assert kube.api.writes(EVENTS) == 3


async def test_a_threaded_server_answers_concurrent_writers(kube: Kube) -> None:
    """Many clients at once (the e2e tests' allocator and watcher): each write gets its own version."""
    await asyncio.gather(*(kube.claim(f"c-{i}") for i in range(20)))
    versions = {c["metadata"]["resourceVersion"] for c in kube.api.items(CLAIMS, NS)}
    assert len(versions) == 20 and kube.api.count("create", CLAIMS, code=201) == 20


@pytest.mark.parametrize(("function", "target", "patch", "expected"), [
    (merge_patch, {"a": {"b": 1, "c": 2}, "l": [1, 2]}, {"a": {"b": None, "d": 3}, "l": [3]},
     {"a": {"c": 2, "d": 3}, "l": [3]}),
    (json_patch, {"a": [1, 2]}, [{"op": "add", "path": "/a/-", "value": 3}, {"op": "move", "from": "/a/0",
                                                                            "path": "/b"}],
     {"a": [2, 3], "b": 1}),
    (json_patch, {"a/b": {"~": 1}}, [{"op": "copy", "from": "/a~1b/~0", "path": "/c"},
                                     {"op": "replace", "path": "/a~1b", "value": None}],
     {"a/b": None, "c": 1}),
    (strategic_merge_patch, {"metadata": {"finalizers": ["a"]}}, {"metadata": {"finalizers": ["b"]}},
     {"metadata": {"finalizers": ["a", "b"]}}),  # finalizers merge as a set, unlike a merge patch
    (strategic_merge_patch, {"metadata": {"finalizers": ["a", "b"]}},
     {"metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]}}, {"metadata": {"finalizers": ["b"]}}),
    (strategic_merge_patch, {"status": {"conditions": [{"type": "A", "status": "True"}, {"type": "B"}]}},
     {"status": {"conditions": [{"type": "A", "status": "False"}, {"type": "C"}]}},
     {"status": {"conditions": [{"type": "A", "status": "False"}, {"type": "B"}, {"type": "C"}]}}),
    (strategic_merge_patch, {"spec": {"tolerations": [{"key": "a"}], "x": {"y": 1}}},
     {"spec": {"tolerations": [{"key": "b"}], "x": {"$patch": "replace", "z": 2}}},
     {"spec": {"tolerations": [{"key": "b"}], "x": {"z": 2}}}),  # a list without a merge key is replaced
])
def test_patch_functions(function: Callable[[Any, Any], Any], target: Any, patch: Any, expected: Any) -> None:
    assert function(target, patch) == expected
