"""`claimbroker top`: a frame rendered from a hand-made snapshot, and `top --once` against a running stack."""

from __future__ import annotations

import asyncio
import re
import sys
from pathlib import Path

import httpx
import pytest
from rich.console import Console

from services.bus.connection import connect
from services.bus.embedded import EmbeddedNats
from services.bus.publish import publish_json
from services.cli.top import FlavorLine, Gatherer, Snapshot, TenantLine, Waiting, render, snapshot_of
from services.runtime.stack import running_stack
from shared.contract import subjects
from shared.ledger.engine import sessions
from shared.ledger.tokens import create_token
from shared.settings import BrokerSettings
from tests.builders import a_claim
from tests.e2e.helpers import free_port, statuses

CLI = [sys.executable, "-m", "services.cli"]
H100 = "device.attributes['gpu.nvidia.com'].productName == 'H100'"
FLEET = """kind: Topology
nodes:
  - {name: h1, gpuModel: H100, gpuCount: 4}
  - {name: a1, gpuModel: A100, gpuCount: 2}
"""


def text_of(snapshot: Snapshot) -> str:
    console = Console(record=True, width=160)
    console.print(render(snapshot))
    return console.export_text()


def row(text: str, *cells: str) -> bool:
    """Some line holds these cells in this order, separated by table borders or spaces only."""
    pattern = r"[\s│|]+".join(re.escape(c) for c in cells)
    return any(re.search(pattern, line) for line in text.splitlines())


def test_render_shows_the_numbers() -> None:
    snapshot = Snapshot(
        flavors=[FlavorLine("H100", total=16, used=11, pending=3), FlavorLine("A100-3g.40gb", 14, 0, 0)],
        tenants=[TenantLine("vision", "H100", used=9, nominal=8, borrowed=1, pending=2),
                 TenantLine("nlp", "H100", used=2, nominal=8, borrowed=0, pending=1)],
        queue=[Waiting("vision", "train-7", "quota H100 of vision: nominal 8 + borrowingLimit 1", ("H100",))],
        pending_claims=3, pending_devices=5, enforced=True, at=1.0)
    text = text_of(snapshot)
    assert row(text, "H100", "16", "11", "5", "3")
    assert row(text, "A100-3g.40gb", "14", "0", "14", "0")
    assert row(text, "vision", "H100", "9/8", "1", "2")
    assert row(text, "nlp", "H100", "2/8", "0", "1")
    assert row(text, "vision", "train-7", "H100", "quota H100 of vision")
    assert "3 claim(s), 5 device(s)" in text


def test_snapshot_of_combines_usage_queue_and_inventory() -> None:
    """Pending devices come from the usage rows, which count the whole queue (each claim at its cheapest
    flavor), not from the head of the queue that is listed: 5,000 waiting claims count 5,000."""
    usage = {"enforced": True,
             "pending": [{"tenant": "vision", "claims": 5_000, "devices": 5_003}, {"tenant": "nlp", "claims": 1,
                                                                                   "devices": 8}],
             "items": [{"tenant": "vision", "flavor": "H100", "nominal": 3, "used": 3, "borrowed": 0,
                        "pending": 4_000},
                       {"tenant": "vision", "flavor": "H200", "nominal": 0, "used": 0, "borrowed": 0,
                        "pending": 1_000},
                       {"tenant": "nlp", "flavor": None, "nominal": 0, "used": 1, "borrowed": 1}]}
    head = [{"namespace": "vision", "name": f"c{i}", "reason": "r"} for i in range(50)]
    snapshot = snapshot_of(usage, head, {("vision", "c0"): ["H100", "H200"]}, {"H100": 4, "A100": 2},
                           order=["A100", "H100", "H200"])
    assert [(f.name, f.total, f.used, f.free, f.pending) for f in snapshot.flavors] == [
        ("A100", 2, 0, 2, 0), ("H100", 4, 3, 1, 4_000), ("H200", 0, 0, 0, 1_000), ("-", 0, 1, 0, 11)]
    assert [(t.tenant, t.flavor, t.used, t.pending) for t in snapshot.tenants] == [
        ("nlp", "-", 1, 8), ("vision", "H100", 3, 4_000), ("vision", "H200", 0, 1_000), ("vision", "-", 0, 3)]
    assert len(snapshot.queue) == 10 and snapshot.queue[0].flavors == ("H100", "H200")


@pytest.mark.e2e
async def test_top_once_against_a_running_stack(nats_server: EmbeddedNats, tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(FLEET)
    settings = BrokerSettings(nats_url=nats_server.url, data_dir=tmp_path / "d", api_port=free_port(),
                              inventory=[fleet], pending_alert_after=3600)
    async with running_stack(settings) as stack:
        assert stack.allocator is not None and stack.api_url is not None
        assert await stack.allocator.wait_for_inventory(20)
        token = await create_token(sessions(stack.engine), "admin", None)
        async with httpx.AsyncClient(base_url=stack.api_url, headers={"Authorization": f"Bearer {token}"}) as api:
            assert (await api.put("/v1/tenants/vision", json={})).status_code < 300
            response = await api.put("/v1/tenants/vision/quotas/H100", json={"nominal": 3, "borrowingLimit": 0})
            assert response.status_code < 300, response.text
        nc = await connect(stack.nats_url, name="tenant")
        seen = await statuses(nc)
        names = [f"train-{i}" for i in range(4)]
        for name in names:
            document = a_claim(name, "vision").request(selectors=(H100,)).document()
            await publish_json(nc.jetstream(), subjects.submit("vision"), document, msg_id=name)
        await seen.wait_for(lambda: len(seen.latest()) == 4, timeout=30)
        states = sorted(s["state"] for s in seen.latest().values())
        assert states == ["Allocated"] * 3 + ["Pending"], seen.latest()
        waiting = next(s for s in seen.latest().values() if s["state"] == "Pending")

        # the live view's trigger: a status message sets `changed`, and the next snapshot counts the new claim
        gatherer = Gatherer(stack.api_url, {"Authorization": f"Bearer {token}"}, stack.nats_url)
        try:
            await gatherer.start()
            gatherer.changed.clear()
            document = a_claim("train-4", "vision").request(selectors=(H100,)).document()
            await publish_json(nc.jetstream(), subjects.submit("vision"), document, msg_id="train-4")
            await asyncio.wait_for(gatherer.changed.wait(), 30)
            await seen.wait_for(lambda: ("vision", "train-4") in seen.latest(), timeout=30)
            live = await gatherer.snapshot()
            numbers = [(f.name, f.total, f.used, f.pending) for f in live.flavors]
            assert numbers == [("A100", 2, 0, 0), ("H100", 4, 3, 2)]
            assert live.stale == ()
            # a node not heard of within the TTL takes nothing: its devices are not counted, and it is named
            gatherer.ttl = -1.0
            quiet = await gatherer.snapshot()
            assert [(f.name, f.total) for f in quiet.flavors if f.total] == []
            assert set(quiet.stale) == set(gatherer.inventories)
            assert "not counted: " in render_text(quiet)
        finally:
            await gatherer.close()
        await nc.close()

        process = await asyncio.create_subprocess_exec(
            *CLI, "--api", stack.api_url, "--nats", stack.nats_url, "--data-dir", str(tmp_path / "cli"),
            "--token", token, "top", "--once", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(process.communicate(), 60)
    text = out.decode()
    assert process.returncode == 0, err.decode()
    assert row(text, "H100", "4", "3", "1", "2"), text  # total, used, free, pending
    assert row(text, "A100", "2", "0", "2", "0"), text
    assert row(text, "vision", "H100", "3/3", "0", "2"), text
    assert "2 claim(s), 2 device(s)" in text, text
    assert row(text, "vision", waiting["name"], "H100", waiting["reason"][:30]), text


async def test_top_once_with_nothing_to_read_fails_in_one_line(tmp_path: Path) -> None:
    """Neither the admin API nor NATS answers: one line naming both URLs and exit 3, within seconds, instead
    of a frame of an empty fleet and exit 0."""
    api, nats = f"http://127.0.0.1:{free_port()}", f"nats://127.0.0.1:{free_port()}"
    started = asyncio.get_running_loop().time()
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "services.cli", "--api", api, "--nats", nats, "--token", "x", "top", "--once",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await process.communicate()
    assert process.returncode == 3 and out == b""
    line = err.decode().strip()
    assert len(line.splitlines()) == 1 and api in line and nats in line and "Traceback" not in line
    assert asyncio.get_running_loop().time() - started < 15


def render_text(snapshot: Snapshot) -> str:
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(render(snapshot))
    return console.export_text()
