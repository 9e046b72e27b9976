"""The Kubernetes source against a fake API server that speaks list/watch, with the real `kubernetes`
client and a real nats-server: inventories published, bookmarks followed, 410 Gone relisted, a dropped
watch resumed from the last resourceVersion, a deleted node removed."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
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
from tests.kube_api import GFD, FakeApiServer, driver_slice, fake_api, node, write_kubeconfig

__all__ = ["fake_api"]  # the fixture, used by the tests below


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
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", url)
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
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", url)
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
