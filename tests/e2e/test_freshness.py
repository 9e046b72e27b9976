"""A node's freshness, live (issue 36: every node turned stale 90 s after `up` while heartbeats flowed).

The whole broker under `up` (real nats-server, the four services in one process) with a short heartbeat and
TTL: heartbeats keep every node fresh well past the TTL for /v1/nodes (the allocator's view and the bus's,
as `serve admin-api` reads it), for the allocator and for the notifier alike; a node whose heartbeats stop
turns stale for all three, at the same last-heard time, and fresh again for all three when they resume."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from services.admin_api.app import create_app
from services.bus.cancel import wait_closed
from services.bus.connection import connect
from services.bus.embedded import EmbeddedNats
from services.bus.publish import publish_json
from services.bus.streams import ensure_streams, read_fleet
from services.runtime.stack import running_stack
from services.watcher.files import slices_by_node
from services.watcher.publish import InventoryPublisher, heartbeat_loop
from shared.contract import events, subjects
from shared.fleet.sources import load_inventory
from shared.ledger.engine import sessions
from shared.ledger.tokens import create_token
from shared.settings import BrokerSettings
from tests.builders import a_claim
from tests.e2e.helpers import Collector, FakeClock, alerts, free_port, statuses
from tests.e2e.test_notifier_alerts import Start, start  # noqa: F401 - the notifier harness's fixture

pytestmark = pytest.mark.e2e

HEARTBEAT, TTL = 0.4, 4.0  # seconds: ten heartbeats to a TTL, margin for a loaded machine
H100 = "device.attributes['gpu.nvidia.com'].productName == 'H100'"
A100 = "device.attributes['gpu.nvidia.com'].productName == 'A100'"
FILE_FLEET = "kind: Topology\nnodes:\n  - {name: h1, gpuModel: H100, gpuCount: 2}\n"  # the stack's watcher
OWN_FLEET = "kind: Topology\nnodes:\n  - {name: a1, gpuModel: A100, gpuCount: 2}\n"  # the test's watcher


class Heard:
    """Every inventory message on the bus, as (node, observedAtUnix) in arrival order."""

    def __init__(self) -> None:
        self.times: dict[str, list[float]] = {}
        self.changed = asyncio.Condition()

    async def start(self, nc: Any) -> Heard:
        async def on_message(message: Any) -> None:
            payload = json.loads(message.data)
            async with self.changed:
                self.times.setdefault(payload["node"], []).append(float(payload["observedAtUnix"]))
                self.changed.notify_all()

        await nc.subscribe(subjects.INVENTORY_ALL, cb=on_message)
        await nc.flush()
        return self

    async def wait_for(self, condition: Callable[[], bool], timeout: float) -> None:
        async with self.changed:
            await asyncio.wait_for(self.changed.wait_for(condition), timeout)


@asynccontextmanager
async def own_watcher(nats_url: str, folder: Path) -> AsyncIterator[tuple[InventoryPublisher, Any]]:
    """A second watcher, for node a1, whose heartbeats the test stops and starts: the publisher the kube and
    NVML sources use, with their heartbeat loop."""
    source = folder / "own.yaml"
    source.write_text(OWN_FLEET)
    nc = await connect(nats_url, name="test-watcher")
    publisher = InventoryPublisher(nc.jetstream(), heartbeat_interval=HEARTBEAT)
    for node, slices in slices_by_node(load_inventory([source])).items():
        await publisher.publish(node, slices, labels={})
    try:
        yield publisher, nc
    finally:
        await nc.close()


async def nodes_of(api: httpx.AsyncClient) -> dict[str, dict[str, Any]]:
    response = await api.get("/v1/nodes")
    assert response.status_code == 200, response.text
    return {n["node"]: n for n in response.json()}


async def submit(nc: Any, name: str, selector: str) -> None:
    document = a_claim(name, "vision").request(selectors=(selector,)).document()
    await publish_json(nc.jetstream(), subjects.submit("vision"), document, msg_id=name)


def state_of(seen: Collector, name: str) -> dict[str, Any] | None:
    return seen.latest().get(("vision", name))


def stale_alerts(watched: Collector, node: str) -> list[bool]:
    """The inventory-stale messages about `node`: False raised, True resolved."""
    return [a["resolved"] for _, a in watched.messages if a.get("key") == f"inventory-stale:{node}"]


async def test_heartbeats_keep_nodes_fresh_and_silence_turns_one_stale_for_everyone(
        nats_server: EmbeddedNats, tmp_path: Path) -> None:
    fleet_file = tmp_path / "fleet.yaml"
    fleet_file.write_text(FILE_FLEET)
    settings = BrokerSettings(nats_url=nats_server.url, data_dir=tmp_path / "d", api_port=free_port(),
                              inventory=[fleet_file], heartbeat_interval=HEARTBEAT, inventory_ttl=TTL,
                              inventory_poll_interval=0.1, pending_alert_after=3600)
    probe = await connect(nats_server.url, name="test")
    heard = await Heard().start(probe)
    watched, seen = await alerts(probe), await statuses(probe)
    async with running_stack(settings) as stack, own_watcher(nats_server.url, tmp_path) as (publisher, _):
        beating = asyncio.create_task(heartbeat_loop(publisher))
        assert stack.allocator is not None and stack.api_url is not None
        token = await create_token(sessions(stack.engine), "admin", None)
        headers = {"Authorization": f"Bearer {token}"}
        # `serve admin-api`: no allocator in its process, the fleet read from the bus (stack.py's fallback)
        serve_app = create_app(stack.engine, fleet=lambda: read_fleet(nats_server.url), inventory_ttl=TTL)
        async with httpx.AsyncClient(base_url=stack.api_url, headers=headers) as up_api, \
                httpx.AsyncClient(transport=httpx.ASGITransport(app=serve_app), base_url="http://serve",
                                  headers=headers) as serve_api:
            views = {"up": up_api, "serve": serve_api}

            # 1. Past the TTL and two heartbeat intervals more since each node's first message: heartbeats
            # flowed all along (the bus shows them), and every view says every node is fresh.
            def beat_past_ttl() -> bool:
                return set(heard.times) == {"h1", "a1"} and all(
                    times[-1] >= times[0] + TTL + 2 * HEARTBEAT for times in heard.times.values())

            await heard.wait_for(beat_past_ttl, timeout=60)
            for name, api in views.items():
                nodes = await nodes_of(api)
                assert set(nodes) == {"h1", "a1"}, (name, nodes)
                for node in nodes.values():
                    assert node["stale"] is False and node["staleReason"] is None, (name, node)
                    assert node["ageSeconds"] < TTL and node["lastHeard"], (name, node)
                    assert {d["state"] for d in node["devices"]} == {"idle"}, (name, node)
            await submit(probe, "train-h", H100)
            await submit(probe, "train-a", A100)
            await seen.wait_for(lambda: all((state_of(seen, n) or {}).get("state") == "Allocated"
                                            for n in ("train-h", "train-a")), timeout=30)
            assert stale_alerts(watched, "h1") == stale_alerts(watched, "a1") == []

            # 2. a1's watcher falls silent: the notifier raises inventory-stale for a1 alone; then the API's
            # views and the allocator say stale too, naming the time the notifier names.
            await wait_closed(beating)
            last = (await read_fleet(nats_server.url)).nodes["a1"].observed_at  # a1's last word on the bus
            await watched.wait_for(lambda: stale_alerts(watched, "a1") == [False], timeout=TTL + 30)
            raised = next(a for _, a in watched.messages if a.get("key") == "inventory-stale:a1")
            assert raised["details"]["ageSeconds"] >= TTL and "stale inventory: last heard" in raised["summary"]
            for name, api in views.items():
                nodes = await nodes_of(api)
                assert nodes["a1"]["stale"] is True and nodes["a1"]["ageSeconds"] >= TTL, (name, nodes["a1"])
                assert nodes["a1"]["lastHeard"] == raised["details"]["lastHeard"], (name, nodes["a1"], raised)
                assert nodes["a1"]["staleReason"].startswith("stale inventory: last heard"), (name, nodes["a1"])
                assert nodes["h1"]["stale"] is False, (name, nodes["h1"])
                assert sorted(d["state"] for d in nodes["a1"]["devices"]) == ["allocated", "stale"], (name, nodes["a1"])
            assert abs(stack.allocator.last_heard()["a1"] - last) < 1e-6  # the allocator heard the same last word
            await submit(probe, "more-a", A100)  # a1's other A100 is idle, but its node is stale
            await submit(probe, "more-h", H100)  # h1 keeps taking claims
            await seen.wait_for(lambda: (state_of(seen, "more-a") or {}).get("state") == "Pending"
                                and (state_of(seen, "more-h") or {}).get("state") == "Allocated", timeout=30)
            reason = state_of(seen, "more-a")["reason"]  # type: ignore[index]
            assert "stale inventory" in reason, reason

            # 3. Its heartbeats resume: the waiting claim is placed on a1, the alert resolves, the views agree.
            beating = asyncio.create_task(heartbeat_loop(publisher))
            try:
                await seen.wait_for(lambda: (state_of(seen, "more-a") or {}).get("state") == "Allocated", timeout=30)
                await watched.wait_for(lambda: stale_alerts(watched, "a1") == [False, True], timeout=30)
                for name, api in views.items():
                    nodes = await nodes_of(api)
                    assert not nodes["a1"]["stale"] and not nodes["h1"]["stale"], (name, nodes)
                    assert {d["state"] for d in nodes["a1"]["devices"]} == {"allocated"}, (name, nodes["a1"])
            finally:
                await wait_closed(beating)
            assert stale_alerts(watched, "h1") == []  # h1's heartbeats never stopped: never stale
    await probe.close()


async def test_a_node_heard_again_while_the_notifier_was_away_resolves_its_alerts_at_restart(
        start: Start) -> None:  # noqa: F811 - the fixture imported above
    """The notifier keeps node freshness in memory: restarted, it learns from the ledger which inventory-stale
    and node-lost alerts are open, so the stream's replay of a node that came back resolves them."""
    first = await start()
    await first.inventory("n1")
    await first.inventory("n2")
    await first.inventory("n2", removed=True)
    await first.wait_seen(("node-lost:n2", 1, False))
    await first.advance(90)  # n1 silent for the TTL
    await first.wait_seen(("inventory-stale:n1", 1, False))
    await first.stop()
    for node in ("n1", "n2"):  # both heard again while no notifier runs
        payload = events.inventory_payload(node, [], labels={}, sequence=10, observed_at=first.clock.now)
        await publish_json(first.nc.jetstream(), subjects.inventory(node), payload)
    await start()  # its alerts are published as it replays the stream: the first's collector hears them
    await first.wait_seen(("inventory-stale:n1", 1, True))
    await first.wait_seen(("node-lost:n2", 1, True))


async def test_a_restarted_watcher_leaves_the_stream_no_older_or_other_than_it_counts_on(
        nats_server: EmbeddedNats, tmp_path: Path) -> None:
    """Message ids carry a heartbeat-interval bucket, so a watcher restarted inside its predecessor's bucket
    sends an id JetStream has seen, and the predecessor's message stays the node's last: readers judge the
    node by its time, so the new watcher's next heartbeat counts from it; had the content flipped meanwhile,
    the stream would keep other content than the files say, so that message goes again."""
    nc = await connect(nats_server.url, name="test")
    js = nc.jetstream()
    await ensure_streams(js)
    source = tmp_path / "fleet.yaml"
    slices = {}
    for model in ("H100", "A100"):
        source.write_text(f"kind: Topology\nnodes:\n  - {{name: n1, gpuModel: {model}, gpuCount: 1}}\n")
        slices[model] = slices_by_node(load_inventory([source]))["n1"]
    clock = FakeClock()
    clock.now = 30.0 * int(clock.now // 30.0)  # the start of a bucket: every publish below but the last in it

    async def last() -> tuple[str, float, int]:
        message = await js.get_last_msg(subjects.INVENTORY_STREAM, subjects.inventory("n1"))
        node = events.read_inventory(json.loads(message.data or b"{}"))
        return str(node.devices[0].attributes["gpu.nvidia.com/productName"]), node.observed_at, message.seq

    first = InventoryPublisher(js, heartbeat_interval=30.0, clock=clock)
    assert await first.publish("n1", slices["H100"], labels={})
    clock.now += 1
    assert await first.publish("n1", slices["A100"], labels={})
    clock.now += 1
    second = InventoryPublisher(js, heartbeat_interval=30.0, clock=clock)  # restarted: the files say H100 again
    assert await second.publish("n1", slices["H100"], labels={})
    published_at = clock.now
    product, heard, seq = await last()
    assert (product, heard) == ("H100", published_at)  # its own, not the predecessor's A100
    clock.now += 1
    third = InventoryPublisher(js, heartbeat_interval=30.0, clock=clock)  # restarted again, same content
    assert await third.publish("n1", slices["H100"], labels={})
    assert await last() == ("H100", published_at, seq)  # a duplicate: nothing new on the stream
    assert third.due_in() == 29.0  # its heartbeat counts from the time the stream holds
    clock.now = published_at + 30
    assert await third.heartbeat() == 1
    assert (await last())[1] == clock.now
    await nc.close()
