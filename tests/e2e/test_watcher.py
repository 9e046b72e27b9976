"""The file watcher republishes a node when its file changes, drops identical content, and removes nodes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from services.natsio import EmbeddedNats, connect, ensure_streams
from services.watcher.files import FileWatcher
from shared import subjects
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
