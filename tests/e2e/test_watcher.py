"""The file watcher republishes a node when its file changes, drops identical content, and removes nodes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from services.bus.connection import connect
from services.bus.embedded import EmbeddedNats
from services.bus.streams import ensure_streams
from services.watcher.files import FileWatcher
from shared.contract import subjects
from tests.e2e.helpers import Collector

pytestmark = pytest.mark.e2e


async def test_republish_on_change_and_removal(nats_server: EmbeddedNats, tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("kind: Topology\nnodes:\n- {name: a, gpuModel: H100, gpuCount: 1}\n"
                     "- {name: b, gpuModel: A100, gpuCount: 2}\n")
    nc = await connect(nats_server.url, name="test")
    js = nc.jetstream()
    await ensure_streams(js)
    seen = await Collector().start(nc, subjects.INVENTORY_ALL)
    watcher = FileWatcher(js, [fleet])
    assert await watcher.publish_once() == 2
    assert await watcher.publish_once() == 0  # same content: nothing new
    fleet.write_text("kind: Topology\nnodes:\n- {name: a, gpuModel: H100, gpuCount: 2}\n")
    assert await watcher.publish_once() == 2  # a changed, b removed
    await seen.wait_for(lambda: len(seen.messages) == 4)
    by_node = {(s, m["removed"]): m for s, m in seen.messages}
    assert len(by_node[("claimbroker.v1.inventory.a", False)]["slices"][0]["spec"]["devices"]) == 2
    assert by_node[("claimbroker.v1.inventory.b", True)]["slices"] == []
    last = await js.get_last_msg(subjects.INVENTORY_STREAM, "claimbroker.v1.inventory.a")
    assert json.loads(last.data or b"{}")["sequence"] > 0
    await nc.close()


class FakeClock:
    """Wall time the test moves by hand, so heartbeat intervals pass without sleeping."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


async def test_heartbeat_republishes_unchanged_nodes_with_a_new_message_id(
    nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("kind: Topology\nnodes:\n- {name: a, gpuModel: H100, gpuCount: 1}\n")
    nc = await connect(nats_server.url, name="test")
    js = nc.jetstream()
    await ensure_streams(js)
    clock = FakeClock()
    watcher = FileWatcher(js, [fleet], heartbeat_interval=30.0, clock=clock)
    assert await watcher.publish_once() == 1
    first = await js.get_last_msg(subjects.INVENTORY_STREAM, "claimbroker.v1.inventory.a")
    clock.now += 29
    assert await watcher.publish_once() == 0  # unchanged inside the interval: nothing
    assert await watcher.publisher.heartbeat() == 0
    clock.now += 2
    assert await watcher.publisher.heartbeat() == 1
    beat = await js.get_last_msg(subjects.INVENTORY_STREAM, "claimbroker.v1.inventory.a")
    assert beat.seq > first.seq  # a new message in the stream, not a JetStream duplicate
    assert beat.headers and first.headers
    assert beat.headers["Nats-Msg-Id"] != first.headers["Nats-Msg-Id"]
    before, after = json.loads(first.data or b"{}"), json.loads(beat.data or b"{}")
    assert after["sequence"] > before["sequence"]
    assert after["observedAtUnix"] == clock.now
    assert {k: v for k, v in after.items() if k not in ("sequence", "observedAt", "observedAtUnix")} == \
        {k: v for k, v in before.items() if k not in ("sequence", "observedAt", "observedAtUnix")}
    clock.now += 31
    assert await watcher.publish_once() == 1  # a poll after the interval is a heartbeat too
    await nc.close()


async def test_a_restart_republishing_the_same_content_is_a_duplicate_but_flapping_content_is_not(
    nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    fleet = tmp_path / "fleet.yaml"
    one = "kind: Topology\nnodes:\n- {name: a, gpuModel: H100, gpuCount: 1}\n"
    two = "kind: Topology\nnodes:\n- {name: a, gpuModel: H100, gpuCount: 2}\n"
    fleet.write_text(one)
    nc = await connect(nats_server.url, name="test")
    js = nc.jetstream()
    await ensure_streams(js)
    clock = FakeClock()
    assert await FileWatcher(js, [fleet], clock=clock).publish_once() == 1
    first = await js.get_last_msg(subjects.INVENTORY_STREAM, "claimbroker.v1.inventory.a")
    restarted = FileWatcher(js, [fleet], clock=clock)
    assert await restarted.publish_once() == 1  # it does not know what went out before it
    again = await js.get_last_msg(subjects.INVENTORY_STREAM, "claimbroker.v1.inventory.a")
    assert again.seq == first.seq  # JetStream dropped it as a duplicate
    for text in (two, one):  # A, B, A inside one interval: the last A must not be dropped
        fleet.write_text(text)
        clock.now += 1
        assert await restarted.publish_once() == 1
    last = await js.get_last_msg(subjects.INVENTORY_STREAM, "claimbroker.v1.inventory.a")
    assert len(json.loads(last.data or b"{}")["slices"][0]["spec"]["devices"]) == 1
    assert last.seq == first.seq + 2
    fleet.write_text("kind: Topology\nnodes: []\n")
    assert await restarted.publish_once() == 1  # removed
    fleet.write_text(one)
    assert await restarted.publish_once() == 1  # back in the same bucket: published, not dropped
    back = await js.get_last_msg(subjects.INVENTORY_STREAM, "claimbroker.v1.inventory.a")
    assert json.loads(back.data or b"{}")["removed"] is False
    await nc.close()


async def test_an_edit_is_published_as_it_happens_not_at_the_next_poll(nats_server: EmbeddedNats,
                                                                        tmp_path: Path) -> None:
    """The poll interval is a minute here: the edit arrives as a file system event. The file is replaced
    (written beside it, then renamed over it), as editors and Kubernetes' ConfigMap mounts do."""
    import asyncio

    from services.bus.cancel import wait_closed

    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("kind: Topology\nnodes:\n- {name: a, gpuModel: H100, gpuCount: 1}\n")
    nc = await connect(nats_server.url, name="test")
    js = nc.jetstream()
    await ensure_streams(js)
    seen = await Collector().start(nc, subjects.INVENTORY_ALL)
    running = asyncio.create_task(FileWatcher(js, [fleet], poll_interval=60.0).run())
    try:
        await seen.wait_for(lambda: len(seen.messages) == 1)
        staged = tmp_path / "fleet.yaml.new"
        staged.write_text("kind: Topology\nnodes:\n- {name: a, gpuModel: H100, gpuCount: 4}\n")
        staged.replace(fleet)
        await seen.wait_for(lambda: len(seen.messages) == 2, timeout=10)
        assert len(seen.messages[-1][1]["slices"][0]["spec"]["devices"]) == 4
    finally:
        await wait_closed(running)
        await nc.close()
