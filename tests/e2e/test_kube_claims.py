"""Issue 40: the cluster's own ResourceClaims. Against the fake API server (tests/kube_api.py: resourceVersion
conflicts, the status subresource, finalizers, gates, evictions, a scheduler and claim controller), the
broker's watcher and allocator with `--kube`, a real nats-server and a real ledger: a brokered claim is
decided as one from the queue and its allocation written to status.allocation; a gated pod is ungated and
bound where the broker decided; a deleted claim frees its devices; a preemption evicts the pod before the
allocation is cleared; a restart on a drifted cluster mends it; conflicts are retried; a bad object gets a
condition (the claim's state and reason annotations, and an Event) and nothing else. `claimbroker up --kube`
itself is run once, as a user would.

Where the fake cannot stand for the real server: a claim of another apiVersion cannot reach the broker (a v1
watch converts every stored object to v1), so that case is a unit test of the plan
(tests/unit/test_kube_writeback.py), not one here."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from services.bus.connection import connect
from services.bus.embedded import EmbeddedNats
from services.runtime.stack import running_stack
from shared.contract import subjects
from shared.fleet.sources import BUILTIN_TOPOLOGY
from shared.fleet.topology import topology_to_resource_slices
from shared.kube_claims.cluster_claim import FINALIZER, REASON_ANNOTATION, STATE_ANNOTATION
from shared.kube_claims.writeback import status_allocation
from shared.ledger.engine import create_engine, sessions
from shared.ledger.tenants import TenantSettings, put_tenant
from shared.settings import BrokerSettings
from tests.e2e.helpers import Collector, free_port
from tests.kube_api import (
    CLAIMS,
    NODES,
    PDBS,
    PODS,
    SLICES,
    FakeApiServer,
    disruption_budget,
    node,
    pod,
    serving,
    write_kubeconfig,
)

pytestmark = pytest.mark.e2e
WAIT_S = 30.0
H100 = 'device.attributes["gpu.nvidia.com"].productName == "H100" && device.attributes["gpu.nvidia.com"].type == "gpu"'


def cluster_fleet(api: FakeApiServer) -> None:
    """The broker's built-in mixed fleet as a cluster has it: Nodes with their labels, ResourceSlices."""
    for spec in BUILTIN_TOPOLOGY["nodes"]:
        api.apply(NODES, "ADDED", node(spec["name"], spec.get("nodeLabels", {}), {}))
    for resource_slice in topology_to_resource_slices(BUILTIN_TOPOLOGY):
        api.apply(SLICES, "ADDED", {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", **resource_slice})


def lab_claim(name: str, namespace: str = "lab") -> dict[str, Any]:
    """The lab's Part B claims, as `kubectl apply` would send them, annotated for the broker."""
    if name == "training-gpu":
        spec = {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 1,
            "selectors": [{"cel": {"expression": 'device.attributes["gpu.nvidia.com"].productName == "H100"'}}]}}]}}
    else:
        spec = {"devices": {"requests": [{"name": "gpu-pair", "exactly": {
            "deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 2}}],
            "constraints": [{"requests": ["gpu-pair"], "matchAttribute": "gpu.nvidia.com/numa-node"}]}}
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace, "annotations": {"claimbroker.io/broker": "true"}},
            "spec": spec}


def h100s(name: str, count: int = 8, *, priority: int | None = None, namespace: str = "lab") -> dict[str, Any]:
    annotations = {"claimbroker.io/broker": "true"}
    if priority is not None:
        annotations["claimbroker.io/priority"] = str(priority)
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace, "annotations": annotations},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": count,
                "selectors": [{"cel": {"expression": H100}}]}}]}}}


class Cluster:
    """The fake cluster and what the broker published on NATS."""

    def __init__(self, api: FakeApiServer, statuses: Collector) -> None:
        self.api, self.statuses = api, statuses

    def claim(self, name: str, namespace: str = "lab") -> dict[str, Any] | None:
        return self.api.get(CLAIMS, namespace, name)

    def allocation(self, name: str, namespace: str = "lab") -> dict[str, Any] | None:
        claim = self.claim(name, namespace)
        return ((claim or {}).get("status") or {}).get("allocation")

    def said(self, name: str, namespace: str = "lab") -> tuple[str | None, str | None]:
        notes = ((self.claim(name, namespace) or {}).get("metadata") or {}).get("annotations") or {}
        return notes.get(STATE_ANNOTATION), notes.get(REASON_ANNOTATION)

    def status(self, name: str, tenant: str = "lab") -> dict[str, Any]:
        return self.statuses.latest().get((tenant, name), {})

    async def until(self, check: Callable[[], object], what: str, timeout: float = WAIT_S) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if check():
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"{what} within {timeout:.0f}s; claims: "
                             f"{json.dumps(self.api.items(CLAIMS), default=str)[:3000]}")


def waits_for(api: FakeApiServer, name: str) -> tuple[str, str] | None:
    """The reason and message of the pod's condition claimbroker.io/ClaimsAllocated, if it has one."""
    for condition in ((api.get(PODS, "lab", name) or {}).get("status") or {}).get("conditions") or []:
        if condition["type"] == "claimbroker.io/ClaimsAllocated":
            return condition["reason"], condition["message"]
    return None


@pytest.fixture
def cluster_api() -> Iterator[tuple[FakeApiServer, str]]:
    with serving() as (api, url):
        cluster_fleet(api)
        yield api, url


@asynccontextmanager
async def broker(api: FakeApiServer, api_url: str, nats_server: EmbeddedNats, db: str, tmp_path: Path, *,
                 tenants: tuple[str, ...] = (), services: tuple[str, ...] = ("watcher", "allocator")
                 ) -> AsyncIterator[Cluster]:
    """The watcher and the allocator, both `--kube`, on the fake cluster."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api_url)
    settings = BrokerSettings(nats_url=nats_server.url, db=db, data_dir=tmp_path / "data", kube=True,
                              kubeconfig=kubeconfig, api_port=free_port(), estimate_interval=0)
    async with running_stack(settings, services=services) as stack:
        if tenants:
            engine = create_engine(db)
            async with sessions(engine)() as session, session.begin():
                for tenant in tenants:
                    await put_tenant(session, tenant, TenantSettings(None, 1.0, None, False, None, None, None))
            await engine.dispose()
        assert stack.allocator is not None
        if "watcher" in services:
            assert await stack.allocator.wait_for_inventory(20)
        nc = await connect(stack.nats_url, name="test")
        seen = await Collector().start(nc, subjects.STATUS_ALL)
        try:
            yield Cluster(api, seen)
        finally:
            await nc.close()


def sqlite(tmp_path: Path) -> str:
    return f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}"


async def test_the_labs_claims_are_allocated_in_the_cluster_as_on_nats_and_their_pod_is_ungated_there(
        cluster_api: tuple[FakeApiServer, str], nats_server: EmbeddedNats, ledger_url: str, tmp_path: Path) -> None:
    api, url = cluster_api
    async with broker(api, url, nats_server, ledger_url, tmp_path) as cluster:
        for name in ("training-gpu", "distributed-training"):
            api.create(CLAIMS, lab_claim(name))
        api.create(PODS, pod("trainer", "lab", claims=("training-gpu",)))
        for name in ("training-gpu", "distributed-training"):
            # the state is said after the allocation is written: both awaited
            await cluster.until(lambda n=name: cluster.allocation(n) is not None  # type: ignore[misc]
                                and cluster.status(n).get("state") == "Allocated"
                                and cluster.said(n) == ("Allocated", None), f"{name} allocated and said so")
            published = cluster.status(name)["allocation"]
            written = cluster.allocation(name)
            assert written is not None
            assert written["devices"] == status_allocation(published)["devices"]  # the same devices as on NATS
            assert written["nodeSelector"] == published["nodeSelector"]
            claim = cluster.claim(name)
            assert claim is not None and FINALIZER in claim["metadata"]["finalizers"]
            assert cluster.said(name) == ("Allocated", None)
        assert cluster.status("training-gpu")["allocation"]["nodeName"] == "node-02"  # the fleet's whole H100s

        await cluster.until(lambda: (api.get(PODS, "lab", "trainer") or {}).get("spec", {}).get("nodeName"),
                            "the trainer pod ungated and bound")
        trainer = api.get(PODS, "lab", "trainer")
        assert trainer is not None
        assert "schedulingGates" not in trainer["spec"] or not trainer["spec"]["schedulingGates"]
        assert trainer["spec"]["nodeName"] == "node-02"  # where the claim's nodeSelector sends it
        claim = cluster.claim("training-gpu")
        assert claim is not None
        assert [r["name"] for r in claim["status"]["reservedFor"]] == ["trainer"]
        await cluster.until(lambda: api.events("lab", involved="training-gpu"), "an Event for training-gpu")
        assert [e["reason"] for e in api.events("lab", involved="training-gpu")] == ["Allocated"]
        assert api.count("update", CLAIMS, name="training-gpu", subresource="status") == 1  # written once


async def test_deleting_a_claim_frees_its_devices_for_the_next(
        cluster_api: tuple[FakeApiServer, str], nats_server: EmbeddedNats, tmp_path: Path) -> None:
    api, url = cluster_api
    async with broker(api, url, nats_server, sqlite(tmp_path), tmp_path) as cluster:
        api.create(CLAIMS, h100s("first"))
        await cluster.until(lambda: cluster.allocation("first") is not None, "first allocated")
        api.create(CLAIMS, h100s("second"))
        await cluster.until(lambda: cluster.said("second")[0] == "Pending", "second said Pending")
        state, reason = cluster.said("second")
        assert state == "Pending" and reason == cluster.status("second")["reason"]
        await cluster.until(lambda: api.events("lab", involved="second"), "an Event for second")
        assert [e["reason"] for e in api.events("lab", involved="second")] == ["Pending"]
        api.create(PODS, pod("second-pod", "lab", claims=("second",)))
        await cluster.until(lambda: waits_for(api, "second-pod"), "the pod says why it waits")
        assert waits_for(api, "second-pod") == ("Pending", f"claim second is Pending: {reason}")

        api.delete(CLAIMS, "lab", "first")
        await cluster.until(lambda: cluster.claim("first") is None, "first deleted once released")
        assert cluster.status("first").get("state") == "Released"
        await cluster.until(lambda: cluster.allocation("second") is not None
                            and cluster.said("second") == ("Allocated", None), "second allocated and said so")
        await cluster.until(lambda: (api.get(PODS, "lab", "second-pod") or {}).get("spec", {}).get("nodeName"),
                            "second's pod ungated and bound")
        assert waits_for(api, "second-pod") == ("Allocated", "every broker claim of the pod is Allocated")


async def test_a_preemption_evicts_the_pod_first_and_clears_the_allocation_after(
        cluster_api: tuple[FakeApiServer, str], nats_server: EmbeddedNats, tmp_path: Path) -> None:
    api, url = cluster_api
    async with broker(api, url, nats_server, sqlite(tmp_path), tmp_path) as cluster:
        api.create(CLAIMS, h100s("low"))
        api.create(PODS, pod("low-pod", "lab", claims=("low",), labels={"app": "low"}))
        await cluster.until(lambda: (cluster.claim("low") or {}).get("status", {}).get("reservedFor"),
                            "low's pod running on it")
        api.create(PDBS, disruption_budget("keep-low", "lab", {"app": "low"},
                                                     min_available=1))
        api.create(CLAIMS, h100s("urgent", priority=10))
        await cluster.until(lambda: cluster.status("low").get("state") == "Preempted"
                            or cluster.status("urgent").get("state") == "Allocated", "the ledger preempts low")
        await cluster.until(lambda: api.count("create", PODS, subresource="eviction", code=429) >= 1,
                            "an eviction refused by the disruption budget")
        assert api.get(PODS, "lab", "low-pod") is not None  # the budget holds it
        assert cluster.allocation("urgent") is None  # its devices are still low's in the cluster
        assert cluster.allocation("low") is not None

        api.delete(PDBS, "lab", "keep-low")
        await cluster.until(lambda: cluster.allocation("urgent") is not None, "urgent written", timeout=45)
        assert api.get(PODS, "lab", "low-pod") is None
        order = [(r.verb, r.kind, r.name, r.subresource) for r in api.requests if r.code < 300]
        evicted = order.index(("create", PODS, "low-pod", "eviction"))
        cleared = max(i for i, r in enumerate(order) if r == ("update", CLAIMS, "low", "status"))
        written = order.index(("update", CLAIMS, "urgent", "status"))
        assert evicted < cleared < written
        preempted = api.events("lab", involved="low-pod", reason="Preempted")
        assert len(preempted) == 1 and "preempted by lab/urgent" in preempted[0]["message"]


async def test_a_restart_mends_a_drifted_cluster(
        cluster_api: tuple[FakeApiServer, str], nats_server: EmbeddedNats, tmp_path: Path) -> None:
    api, url = cluster_api
    async with broker(api, url, nats_server, sqlite(tmp_path), tmp_path) as cluster:
        api.create(CLAIMS, lab_claim("training-gpu"))
        await cluster.until(lambda: cluster.allocation("training-gpu") is not None, "training-gpu allocated")
        decided = cluster.allocation("training-gpu")
    # while the broker is down: someone rewrites the allocation, and a claim appears with one the ledger never gave
    drifted = api.get(CLAIMS, "lab", "training-gpu")
    assert drifted is not None and decided is not None
    drifted["status"]["allocation"]["devices"]["results"][0]["device"] = "gpu-7"
    api.apply(CLAIMS, "MODIFIED", drifted)
    stranger = h100s("stranger", count=1)
    stranger["status"] = {"allocation": {**decided, "devices": {"results": [
        {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-02", "device": "gpu-6"}]}}}
    api.apply(CLAIMS, "ADDED", stranger)
    async with broker(api, url, nats_server, sqlite(tmp_path), tmp_path / "again") as cluster:
        await cluster.until(lambda: (cluster.allocation("training-gpu") or {}).get("devices") == decided["devices"],
                            "training-gpu's allocation written again as the ledger has it")
        await cluster.until(lambda: cluster.status("stranger").get("state") == "Allocated"
                            and cluster.allocation("stranger") is not None, "stranger decided by the ledger")
        published = cluster.status("stranger")["allocation"]
        assert cluster.allocation("stranger")["devices"] == status_allocation(published)["devices"]  # type: ignore[index]


async def test_write_conflicts_are_read_again_and_retried(
        cluster_api: tuple[FakeApiServer, str], nats_server: EmbeddedNats, tmp_path: Path) -> None:
    api, url = cluster_api
    async with broker(api, url, nats_server, sqlite(tmp_path), tmp_path) as cluster:
        api.create(CLAIMS, lab_claim("training-gpu"))
        api.arm_conflict(CLAIMS, "lab", "training-gpu", times=3)
        await cluster.until(lambda: cluster.allocation("training-gpu") is not None
                            and cluster.said("training-gpu") == ("Allocated", None), "allocated despite conflicts")
        assert api.conflicts >= 3


async def test_of_two_allocators_one_writes_to_the_cluster(
        cluster_api: tuple[FakeApiServer, str], nats_server: EmbeddedNats, postgres_url: str, tmp_path: Path) -> None:
    """Two allocators on one ledger and one cluster (PostgreSQL, as replicas would share it): the one holding
    the writer's lease writes, so each claim gets one finalizer, one allocation, one state and one Event."""
    api, url = cluster_api
    async with broker(api, url, nats_server, postgres_url, tmp_path / "a") as cluster, \
            broker(api, url, nats_server, postgres_url, tmp_path / "b", services=("allocator",)):
        names = [f"two-{i}" for i in range(6)]
        for name in names:
            api.create(CLAIMS, h100s(name, count=1))
        for name in names:
            await cluster.until(lambda n=name: cluster.allocation(n) is not None  # type: ignore[misc]
                                and cluster.said(n) == ("Allocated", None)
                                and api.events("lab", involved=n), f"{name} allocated and said so")
        for name in names:
            assert api.count("update", CLAIMS, name=name, subresource="status") == 1
            assert api.count("patch", CLAIMS, name=name, subresource="") == 2  # the finalizer, then what it said
            assert [e["reason"] for e in api.events("lab", involved=name)] == ["Allocated"]


async def test_a_bad_object_gets_a_condition_and_nothing_else(
        cluster_api: tuple[FakeApiServer, str], nats_server: EmbeddedNats, tmp_path: Path) -> None:
    api, url = cluster_api
    async with broker(api, url, nats_server, sqlite(tmp_path), tmp_path, tenants=("lab",)) as cluster:
        no_spec = h100s("no-spec")
        del no_spec["spec"]
        api.apply(CLAIMS, "ADDED", no_spec)  # as etcd would hold it: the API server itself requires a spec
        api.create(CLAIMS, h100s("elsewhere", namespace="kube-system"))
        api.create(CLAIMS, lab_claim("training-gpu"))  # a good one beside them, decided as usual
        await cluster.until(lambda: cluster.allocation("training-gpu") is not None, "the good claim allocated")
        for name, namespace in (("no-spec", "lab"), ("elsewhere", "kube-system")):
            await cluster.until(lambda n=name, ns=namespace: cluster.said(n, ns)[0] == "Rejected",  # type: ignore[misc]
                                f"{name} said Rejected")
            claim = cluster.claim(name, namespace)
            assert claim is not None
            assert FINALIZER not in (claim["metadata"].get("finalizers") or [])
            assert not (claim.get("status") or {}).get("allocation")
            await cluster.until(lambda n=name, ns=namespace: api.events(ns, involved=n),  # type: ignore[misc]
                                f"an Event for {name}")
            assert [e["type"] for e in api.events(namespace, involved=name)] == ["Warning"]
        assert "no spec" in str(cluster.said("no-spec")[1])
        assert "namespace kube-system maps to no tenant" in str(cluster.said("elsewhere", "kube-system")[1])
        # nothing was submitted for them: no status on NATS
        assert not any(name in ("no-spec", "elsewhere") for _, name in cluster.statuses.latest())


async def test_up_kube_writes_a_claims_allocation_into_the_cluster(
        cluster_api: tuple[FakeApiServer, str], tmp_path: Path) -> None:
    """As a user runs it: `claimbroker up --kube --kubeconfig FILE`, then `kubectl apply` of a claim."""
    api, url = cluster_api
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", url)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLAIMBROKER_")}
    env["CLAIMBROKER_ESTIMATE_INTERVAL"] = "0"
    log = (tmp_path / "up.log").open("wb")
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "services.cli", "--data-dir", str(tmp_path / "data"), "up", "--kube",
        "--kubeconfig", str(kubeconfig), "--api-port", "0", env=env, stdout=asyncio.subprocess.DEVNULL, stderr=log,
        start_new_session=True)
    try:
        api.create(CLAIMS, lab_claim("training-gpu"))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (api.get(CLAIMS, "lab", "training-gpu") or {}).get(
                "status", {}).get("allocation"):
            assert process.returncode is None, (tmp_path / "up.log").read_text()[-3000:]
            await asyncio.sleep(0.1)
        claim = api.get(CLAIMS, "lab", "training-gpu")
        assert claim is not None and claim["status"].get("allocation"), (tmp_path / "up.log").read_text()[-3000:]
        assert claim["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0][
            "values"] == ["node-02"]
    finally:
        if process.returncode is None:
            os.killpg(process.pid, signal.SIGINT)
            try:
                await asyncio.wait_for(process.wait(), 30)
            except TimeoutError:
                os.killpg(process.pid, signal.SIGKILL)
                await process.wait()
        log.close()
