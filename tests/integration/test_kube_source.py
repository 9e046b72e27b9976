"""The Kubernetes source against a fake API server that speaks list/watch, with the real `kubernetes`
client and a real nats-server: inventories published, bookmarks followed, 410 Gone relisted, a dropped
watch resumed from the last resourceVersion, a deleted node removed."""

from __future__ import annotations

import asyncio
import copy
import json
import random
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest
import yaml
from kubernetes.aio import client
from typer.testing import CliRunner

from services.bus.cancel import wait_closed
from services.bus.connection import connect
from services.bus.embedded import EmbeddedNats
from services.bus.streams import ensure_streams
from services.cli import app
from services.runtime.stack import Stack, start_service
from services.watcher.kube import NODES, SLICES, Backoff, KubeWatcher
from services.watcher.publish import InventoryPublisher
from shared.contract import subjects
from shared.ledger.engine import create_engine
from shared.settings import BrokerSettings
from tests.e2e.helpers import Collector

PATHS = {"/api/v1/nodes": NODES, "/apis/resource.k8s.io/v1/resourceslices": SLICES}
LIST_KINDS = {NODES: ("v1", "NodeList"), SLICES: ("resource.k8s.io/v1", "ResourceSliceList")}


class FakeApiServer:
    """Objects with resource versions, an event history per kind, and faults the test arms: a bookmark,
    a dropped connection, a compaction (watches from before it get an ERROR 410)."""

    def __init__(self) -> None:
        self.changed = threading.Condition()
        self.version = 1000
        self.objects: dict[str, dict[str, dict[str, Any]]] = {NODES: {}, SLICES: {}}
        self.history: dict[str, list[tuple[int, str, dict[str, Any]]]] = {NODES: [], SLICES: []}
        self.compacted: dict[str, int] = {NODES: 0, SLICES: 0}
        self.lists: dict[str, int] = {NODES: 0, SLICES: 0}
        self.watches: dict[str, list[tuple[str, bool]]] = {NODES: [], SLICES: []}  # (resourceVersion, bookmarks)
        self.faults: dict[str, list[str]] = {NODES: [], SLICES: []}
        self.bookmarks_sent: list[int] = []
        self.stopping = False

    # test side ---------------------------------------------------------------------------------
    def apply(self, kind: str, event: str, obj: dict[str, Any], *, record: bool = True) -> int:
        with self.changed:
            self.version += 1
            obj = copy.deepcopy(obj)
            obj["metadata"]["resourceVersion"] = str(self.version)
            name = obj["metadata"]["name"]
            if event == "DELETED":
                self.objects[kind].pop(name, None)
            else:
                self.objects[kind][name] = obj
            if record:
                self.history[kind].append((self.version, event, obj))
            self.changed.notify_all()
            return self.version

    def arm(self, kind: str, fault: str) -> None:
        with self.changed:
            self.faults[kind].append(fault)
            self.changed.notify_all()

    def compact(self, kind: str) -> None:
        """etcd compaction: history before now is gone; a watch from an older version gets 410."""
        with self.changed:
            self.compacted[kind] = self.version
            self.history[kind].clear()
            self.changed.notify_all()

    def wait_for(self, condition: Callable[[], bool], timeout: float = 20.0) -> None:
        with self.changed:
            assert self.changed.wait_for(condition, timeout), "fake API server: condition not reached"

    # server side -------------------------------------------------------------------------------
    def list_body(self, kind: str) -> bytes:
        with self.changed:
            self.lists[kind] += 1
            api_version, list_kind = LIST_KINDS[kind]
            items = []
            for obj in self.objects[kind].values():
                item = copy.deepcopy(obj)
                item.pop("apiVersion", None)  # the API server leaves these out of list items
                item.pop("kind", None)
                items.append(item)
            self.changed.notify_all()
            return json.dumps({"apiVersion": api_version, "kind": list_kind,
                               "metadata": {"resourceVersion": str(self.version)}, "items": items}).encode()

    def stream(self, kind: str, since: int, bookmarks: bool, timeout: float,
               send: Callable[[dict[str, Any]], None]) -> str:
        """Send events after `since` until the timeout; returns how the stream ends: 'end' or 'drop'."""
        deadline = time.monotonic() + timeout
        with self.changed:
            self.watches[kind].append((str(since), bookmarks))
            self.changed.notify_all()
            if since < self.compacted[kind]:
                send({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                                  "message": f"too old resource version: {since}",
                                                  "reason": "Expired", "code": 410}})
                return "end"
            position = since
            while not self.stopping and time.monotonic() < deadline:
                for version, event, obj in self.history[kind]:
                    if version > position:
                        send({"type": event, "object": obj})
                        position = version
                if self.faults[kind]:
                    fault = self.faults[kind].pop(0)
                    if fault == "drop":
                        return "drop"
                    if fault == "bookmark" and bookmarks:
                        self.version += 1  # versions move on with changes to other objects
                        position = self.version
                        self.bookmarks_sent.append(position)
                        send({"type": "BOOKMARK", "object": {"kind": LIST_KINDS[kind][1][:-4],
                                                             "apiVersion": LIST_KINDS[kind][0],
                                                             "metadata": {"resourceVersion": str(position)}}})
                        self.changed.notify_all()
                    continue
                self.changed.wait(min(0.5, max(0.0, deadline - time.monotonic())))
        return "end"


def handler_for(api: FakeApiServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
            pass

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            url = urlparse(self.path)
            kind = PATHS.get(url.path)
            query = {k: v[0] for k, v in parse_qs(url.query).items()}
            if kind is None:
                self.send_error(404)
                return
            if query.get("watch") != "true":
                body = api.list_body(kind)
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()

            def send(event: dict[str, Any]) -> None:
                line = json.dumps(event).encode() + b"\n"
                self.wfile.write(f"{len(line):x}\r\n".encode() + line + b"\r\n")
                self.wfile.flush()

            ending = api.stream(kind, int(query.get("resourceVersion", "0")),
                                query.get("allowWatchBookmarks") == "true",
                                float(query.get("timeoutSeconds", "30")), send)
            if ending == "drop":  # no terminating chunk: the client sees a broken payload
                self.close_connection = True
                self.connection.shutdown(2)
                return
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

    return Handler


@pytest.fixture
def fake_api() -> Iterator[tuple[FakeApiServer, str]]:
    api = FakeApiServer()
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler_for(api))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield api, f"http://127.0.0.1:{server.server_address[1]}"
    with api.changed:
        api.stopping = True
        api.changed.notify_all()
    server.shutdown()
    server.server_close()


def node(name: str, labels: dict[str, str], capacity: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "uid": f"uid-{name}", "creationTimestamp": "2026-11-30T08:00:00Z",
                     "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                                "kubernetes.io/arch": "amd64", **labels}},
        "spec": {"podCIDR": "10.244.1.0/24", "providerID": f"kind://docker/lab/{name}"},
        "status": {
            "capacity": {"cpu": "96", "memory": "1056375604Ki", "pods": "110", "ephemeral-storage": "1Ti",
                         **capacity},
            "allocatable": {"cpu": "95", "memory": "1056273204Ki", "pods": "110", **capacity},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "message": "kubelet is posting ready status",
                            "lastHeartbeatTime": "2026-12-03T07:00:00Z",
                            "lastTransitionTime": "2026-11-30T08:01:00Z"}],
            "nodeInfo": {"kubeletVersion": "v1.34.2", "kernelVersion": "6.8.0-60-generic",
                         "osImage": "Ubuntu 24.04.2 LTS", "containerRuntimeVersion": "containerd://2.1.1",
                         "architecture": "amd64", "operatingSystem": "linux", "machineID": "3f2a9c",
                         "systemUUID": "4c4c4544-0051", "bootID": "9b1e", "kubeProxyVersion": ""},
        },
    }


def gpu(index: int) -> dict[str, Any]:
    """A full GPU as NVIDIA's k8s-dra-driver-gpu publishes it."""
    return {
        "name": f"gpu-{index}",
        "attributes": {
            "addressingMode": {"string": "HMM"},
            "architecture": {"string": "Hopper"},
            "brand": {"string": "Nvidia"},
            "cudaComputeCapability": {"version": "9.0.0"},
            "cudaDriverVersion": {"version": "13.0.0"},
            "driverVersion": {"version": "580.105.8"},
            "productName": {"string": "NVIDIA H100 80GB HBM3"},
            "resource.kubernetes.io/pciBusID": {"string": f"0000:{0x18 + 0x11 * index:02x}:00.0"},
            "resource.kubernetes.io/pcieRoot": {"string": f"pci0000:{0x10 + 0x11 * index:02x}"},
            "type": {"string": "gpu"},
            "uuid": {"string": f"GPU-4cf8db2d-06c0-7d70-1a51-e59b25b2c1{index:02d}"},
        },
        "capacity": {"memory": {"value": "81559Mi"}},
    }


def driver_slice(node_name: str, devices: int, generation: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {
            "name": f"{node_name}-gpu.nvidia.com-x7k2p", "generateName": f"{node_name}-gpu.nvidia.com-",
            "uid": f"slice-{node_name}", "creationTimestamp": "2026-11-30T08:02:00Z", "generation": generation,
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node_name, "uid": f"uid-{node_name}",
                                 "controller": True}],
        },
        "spec": {"driver": "gpu.nvidia.com", "nodeName": node_name,
                 "pool": {"name": node_name, "generation": generation, "resourceSliceCount": 1},
                 "devices": [gpu(i) for i in range(devices)]},
    }


GFD = {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
       "nvidia.com/gpu.memory": "81559", "nvidia.com/gpu.count": "4", "nvidia.com/mig.strategy": "none",
       "nvidia.com/gpu.family": "hopper"}


@pytest.fixture
async def watched(fake_api: tuple[FakeApiServer, str], nats_server: EmbeddedNats
                  ) -> AsyncIterator[tuple[FakeApiServer, Collector, KubeWatcher]]:
    api, url = fake_api
    api.apply(NODES, "ADDED", node("dra-1", {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                                             "nvidia.com/dra-driver": "true"}, {}))
    api.apply(NODES, "ADDED", node("dp-1", GFD, {"nvidia.com/gpu": "4"}))
    api.apply(NODES, "ADDED", node("cpu-1", {"node-role.kubernetes.io/worker": ""}, {}))
    api.apply(SLICES, "ADDED", driver_slice("dra-1", 2))
    nc = await connect(nats_server.url, name="test")
    js = nc.jetstream()
    await ensure_streams(js)
    seen = await Collector().start(nc, subjects.INVENTORY_ALL)
    configuration = client.Configuration(host=url)
    api_client = client.ApiClient(configuration)
    watcher = KubeWatcher(InventoryPublisher(js, heartbeat_interval=3600), api_client,
                          backoff_initial=0.01, backoff_cap=0.05, watch_timeout_s=30)
    task = asyncio.create_task(watcher.run())
    try:
        yield api, seen, watcher
    finally:
        await wait_closed(task)
        await api_client.close()
        await nc.close()


def latest(seen: Collector) -> dict[str, dict[str, Any]]:
    return {m["node"]: m for _, m in seen.messages}


def device_names(message: dict[str, Any]) -> list[str]:
    return sorted(d["name"] for s in message["slices"] for d in s["spec"].get("devices", []))


async def test_list_then_watch_publishes_each_gpu_node(watched: tuple[FakeApiServer, Collector, KubeWatcher]
                                                      ) -> None:
    api, seen, watcher = watched
    await seen.wait_for(lambda: {"dra-1", "dp-1"} <= set(latest(seen)))
    fleet = latest(seen)
    assert device_names(fleet["dra-1"]) == ["gpu-0", "gpu-1"]
    assert fleet["dra-1"]["slices"][0]["metadata"]["name"] == "dra-1-gpu.nvidia.com-x7k2p"
    assert fleet["dra-1"]["labels"]["nvidia.com/dra-driver"] == "true"
    assert device_names(fleet["dp-1"]) == [f"gpu-{i}" for i in range(4)]  # device-plugin mode
    attributes = fleet["dp-1"]["slices"][0]["spec"]["devices"][0]["attributes"]
    assert attributes["productName"] == {"string": "NVIDIA H100 80GB HBM3"}
    assert fleet["dp-1"]["labels"]["nvidia.com/gpu.count"] == "4"
    assert all(not m["removed"] and m["sequence"] > 0 for m in fleet.values())
    # watches start from the listed version, with bookmarks asked for
    await asyncio.to_thread(api.wait_for, lambda: bool(api.watches[NODES] and api.watches[SLICES]))
    assert api.watches[SLICES][0] == ("1004", True)
    assert api.lists == {NODES: 1, SLICES: 1}

    # a MODIFIED slice (the driver found a third GPU) republishes that node only
    api.apply(SLICES, "MODIFIED", driver_slice("dra-1", 3, generation=2))
    await seen.wait_for(lambda: device_names(latest(seen)["dra-1"]) == ["gpu-0", "gpu-1", "gpu-2"])
    # the CPU node never publishes; the unchanged device-plugin node was not republished
    assert "cpu-1" not in {m["node"] for _, m in seen.messages}
    assert [m["node"] for _, m in seen.messages].count("dp-1") == 1

    # a node that loses its GPUs, then one that is deleted: removed, with no slices
    api.apply(NODES, "MODIFIED", node("dp-1", GFD, {"nvidia.com/gpu": "0"}))
    await seen.wait_for(lambda: latest(seen)["dp-1"]["removed"])
    assert latest(seen)["dp-1"]["slices"] == []
    api.apply(NODES, "DELETED", node("dra-1", {}, {}))
    await seen.wait_for(lambda: latest(seen)["dra-1"]["removed"])
    assert latest(seen)["dra-1"]["slices"] == []


async def test_bookmark_drop_resume_and_relist_after_410(watched: tuple[FakeApiServer, Collector, KubeWatcher]
                                                        ) -> None:
    api, seen, watcher = watched
    await seen.wait_for(lambda: {"dra-1", "dp-1"} <= set(latest(seen)))
    await asyncio.to_thread(api.wait_for, lambda: len(api.watches[SLICES]) == 1)

    # a bookmark moves the version on; a dropped connection then resumes from the bookmark, not a relist
    api.arm(SLICES, "bookmark")
    api.arm(SLICES, "drop")
    await asyncio.to_thread(api.wait_for, lambda: len(api.watches[SLICES]) == 2)
    assert api.watches[SLICES][1] == (str(api.bookmarks_sent[0]), True)
    assert api.lists[SLICES] == 1

    # an event, then a drop: resumed from that event's version
    changed = api.apply(SLICES, "MODIFIED", driver_slice("dra-1", 1, generation=2))
    await seen.wait_for(lambda: device_names(latest(seen)["dra-1"]) == ["gpu-0"])
    api.arm(SLICES, "drop")
    await asyncio.to_thread(api.wait_for, lambda: len(api.watches[SLICES]) == 3)
    assert api.watches[SLICES][2][0] == str(changed)
    assert api.lists[SLICES] == 1

    # compaction while the watch is down: the resumed watch gets ERROR 410 and the watcher relists,
    # which is the only way it can see a change the history no longer holds
    api.apply(SLICES, "MODIFIED", driver_slice("dra-1", 4, generation=3), record=False)
    api.compact(SLICES)
    api.arm(SLICES, "drop")
    await seen.wait_for(lambda: device_names(latest(seen)["dra-1"]) == [f"gpu-{i}" for i in range(4)])
    assert api.lists[SLICES] == 2
    assert api.lists[NODES] == 1  # only the kind that expired is relisted
    await asyncio.to_thread(api.wait_for, lambda: len(api.watches[SLICES]) == 5)
    assert api.watches[SLICES][3][0] == str(changed)  # the stale version that got 410
    assert api.watches[SLICES][4][0] == str(api.version)  # then a watch from the new list

    # a slice deleted under a node that still has its Node object and no device plugin: removed
    api.apply(SLICES, "DELETED", driver_slice("dra-1", 4, generation=3))
    await seen.wait_for(lambda: latest(seen)["dra-1"]["removed"])
    assert not latest(seen)["dp-1"]["removed"]


async def test_stack_runs_the_kube_source_from_settings_and_a_kubeconfig(
    fake_api: tuple[FakeApiServer, str], nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    """`serve watcher --kube --kubeconfig FILE` wiring: settings pick the source, the kubeconfig the server."""
    api, url = fake_api
    api.apply(NODES, "ADDED", node("dp-1", GFD, {"nvidia.com/gpu": "2"}))
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "lab",
        "clusters": [{"name": "lab", "cluster": {"server": url}}],
        "users": [{"name": "watcher", "user": {"token": "not-checked"}}],
        "contexts": [{"name": "lab", "context": {"cluster": "lab", "user": "watcher"}}],
    }))
    settings = BrokerSettings.model_validate({"nats_url": nats_server.url, "kube": True, "kubeconfig": kubeconfig,
                                              "heartbeat_interval": "1m", "inventory_ttl": "3m", "data_dir": tmp_path})
    nc = await connect(nats_server.url, name="test")
    await ensure_streams(nc.jetstream())
    seen = await Collector().start(nc, subjects.INVENTORY_ALL)
    stack = Stack(nats_url=nats_server.url, db_url="sqlite+aiosqlite://", engine=create_engine("sqlite+aiosqlite://"))
    await start_service(stack, "watcher", settings)
    try:
        await seen.wait_for(lambda: "dp-1" in latest(seen))
        assert device_names(latest(seen)["dp-1"]) == ["gpu-0", "gpu-1"]
        assert settings.heartbeat_interval == 60.0
    finally:
        await wait_closed(stack.tasks["watcher"])
        await stack.engine.dispose()
        await nc.close()


def test_backoff_is_exponential_capped_and_immediate_for_a_first_410() -> None:
    backoff = Backoff(initial=0.5, cap=4.0, rng=random.Random(7))
    assert backoff.next_delay(gone=True) == 0.0  # relisting is the normal answer to an expired version
    delays = [backoff.next_delay(gone=True) for _ in range(6)]  # repeated 410s do wait
    assert all(0.5 * 2 ** i <= d <= 2 ** i for i, d in enumerate(delays[:3]))  # 1s, 2s, 4s with jitter
    assert max(delays) <= 4.0 and delays[-1] >= 2.0
    backoff.reset()
    assert backoff.next_delay() <= 0.5


@pytest.mark.parametrize(("args", "message"), [
    (["serve", "watcher", "--nats", "nats://127.0.0.1:1", "--kube", "--nvml"], "not both"),
    (["serve", "watcher", "--nats", "nats://127.0.0.1:1"], "needs --kube, --nvml or --inventory"),
])
def test_serve_watcher_refuses_no_source_or_two(args: list[str], message: str, monkeypatch: pytest.MonkeyPatch
                                                ) -> None:
    for name in ("CLAIMBROKER_KUBE", "CLAIMBROKER_NVML", "CLAIMBROKER_INVENTORY"):
        monkeypatch.delenv(name, raising=False)
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    assert message in result.output


async def test_a_deleted_node_sends_its_claims_back_to_pending(
    fake_api: tuple[FakeApiServer, str], nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    """Kubernetes to claims: a GPU node from the cluster takes a claim; deleting the Node sends the claim back
    to Pending with the reason; the node's return lets it in again."""
    from services.bus.publish import publish_json
    from services.runtime.stack import running_stack
    from tests.builders import a_claim
    from tests.e2e.helpers import statuses

    api, url = fake_api
    gpu_node = node("dp-1", GFD, {"nvidia.com/gpu": "4"})
    api.apply(NODES, "ADDED", gpu_node)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "lab",
        "clusters": [{"name": "lab", "cluster": {"server": url}}],
        "users": [{"name": "watcher", "user": {"token": "not-checked"}}],
        "contexts": [{"name": "lab", "context": {"cluster": "lab", "user": "watcher"}}],
    }))
    settings = BrokerSettings.model_validate({"nats_url": nats_server.url, "kube": True, "kubeconfig": kubeconfig,
                                              "data_dir": tmp_path / "data"})
    async with running_stack(settings, services=("watcher", "allocator")) as stack:
        assert stack.allocator is not None and await stack.allocator.wait_for_inventory(20)
        nc = await connect(stack.nats_url, name="tenant")
        seen = await statuses(nc)
        claim = a_claim("train", "team").request(count=4).document()
        await publish_json(nc.jetstream(), subjects.submit("team"), claim, msg_id="train")
        await seen.wait_for(lambda: seen.latest().get(("team", "train"), {}).get("state") == "Allocated")
        api.apply(NODES, "DELETED", gpu_node)
        await seen.wait_for(lambda: any("node dp-1 was lost" in (s["reason"] or "")
                                        for s in seen.for_claim("team", "train")))
        await seen.wait_for(lambda: seen.latest()[("team", "train")]["state"] == "Pending")
        api.apply(NODES, "ADDED", gpu_node)
        await seen.wait_for(lambda: seen.latest()[("team", "train")]["state"] == "Allocated")
        await nc.close()
