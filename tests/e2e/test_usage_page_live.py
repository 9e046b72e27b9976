"""The usage page in real time, in headless Chromium driven over the DevTools protocol:
- on `up`'s whole stack (embedded nats-server with bus credentials, SQLite, the lab fleet), a claim's
  allocation reaches the node map within 2 s of its status, over the page's live stream (no polling), and
  a tenant-scoped viewer sees another tenant's devices taken without learning whose or which claim;
- on the same stack with claims allocated, waiting and one that no device matches (a critical alert), the
  summary strip says what the API says (GPUs in use of all per generation from /v1/nodes, claims waiting
  and the oldest wait from /v1/waiting, open critical alerts from /v1/alerts/counts) for the whole fleet's
  viewer and for a tenant-scoped one (its own queue and alerts, the fleet's GPUs), follows a release live,
  and no wrong plural or needless decimal is shown; the wall screen's and the laptop's first screens are
  photographed (docs/usage-page-wall.png, docs/usage-page-laptop.png are these);
- a generated fleet of 1,000 nodes x 8 GPUs with 10,000 waiting claims renders each panel, the node map
  within a second (every panel's time printed)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from sqlalchemy import insert

from services.admin_api.app import create_app
from services.bus.connection import connect
from services.bus.publish import publish_json
from services.runtime.stack import Stack, running_stack
from shared.contract import subjects
from shared.dra.inventory import Fleet
from shared.ledger.engine import create_engine, migrate, sessions
from shared.ledger.schema import Claim, DeviceAllocation, Quota, Tenant, UsageSample
from shared.ledger.tokens import create_token
from shared.settings import BrokerSettings
from tests.builders import a_claim, fleet, node
from tests.e2e.browser import Browser, chromium
from tests.e2e.helpers import alerts, statuses

pytestmark = pytest.mark.e2e
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
LIVE = "document.getElementById('status').classList.contains('live') && document.querySelectorAll('.cell').length"


def cell(key: str) -> str:
    return f"document.querySelector({json.dumps(f'[data-key={json.dumps(key)}]')})"


@dataclass
class Lab:
    stack: Stack
    viewer: str  # a viewer token of the whole fleet
    scoped: str  # a viewer token of tenant speech


@pytest.fixture
async def lab(tmp_path: Path) -> AsyncIterator[Lab]:
    """`up`'s whole stack on the lab fleet, its inventory in, with two viewer tokens."""
    settings = BrokerSettings(data_dir=tmp_path / "data", api_port=0, pending_alert_after=3600)
    async with running_stack(settings) as stack:
        assert stack.allocator is not None and stack.api_url is not None
        assert await stack.allocator.wait_for_inventory(20)
        factory = sessions(stack.engine)
        yield Lab(stack, await create_token(factory, "viewer", None), await create_token(factory, "viewer", "speech"))


@pytest.fixture
async def browsers() -> AsyncIterator[list[Browser]]:
    opened: list[Browser] = []
    yield opened
    for browser in opened:
        await browser.close()


async def test_an_allocation_reaches_the_node_map_within_two_seconds_of_its_status(
        lab: Lab, tmp_path: Path, browsers: list[Browser]) -> None:
    binary = chromium()
    stack, viewer, scoped = lab.stack, lab.viewer, lab.scoped
    everyone = await Browser.open(binary, tmp_path / "everyone", f"{stack.api_url}/?token={viewer}")
    browsers.append(everyone)
    speech = await Browser.open(binary, tmp_path / "speech", f"{stack.api_url}/?token={scoped}")
    browsers.append(speech)
    for page in (everyone, speech):
        assert await page.wait_for(LIVE) > 0, "the node map is drawn and the live stream open"
    # every panel drawn on the lab's fleet: its six nodes by generation, the MIG node's slices inside
    # their GPUs, a chart per flavor from the notifier's first sample
    assert set(await everyone.wait_for("window.renderTimes.history !== undefined && window.renderTimes")) >= {
        "usage", "waiting", "alerts", "nodes", "history", "total"}
    assert await everyone.evaluate("document.querySelectorAll('.node').length") == 6
    assert await everyone.evaluate("document.querySelectorAll('.gpu-box .cell.mig').length") > 0
    assert await everyone.evaluate("document.querySelectorAll('#history .chart').length") > 0

    nc = await connect(stack.admin_url, name="test")
    try:
        seen = await statuses(nc)
        claim = a_claim("train", "vision").request("gpu", count=1).document()
        await publish_json(nc.jetstream(), subjects.submit("vision"), claim, msg_id="page:train")
        await seen.wait_for(lambda: seen.latest().get(("vision", "train"), {}).get("state") == "Allocated")
        heard = time.monotonic()
        result = seen.latest()[("vision", "train")]["allocation"]["devices"]["results"][0]
        key = f"{result['driver']}/{result['pool']}/{result['device']}"
        await everyone.wait_for(f"{cell(key)}?.dataset.tenant === 'vision'", timeout=5)
        latency = time.monotonic() - heard
        print(f"allocation on the node map {latency * 1000:.0f} ms after the test heard its status")
        assert latency < 2.0
        assert (await everyone.evaluate(f"{cell(key)}.title")).endswith("allocated to vision (train)")
        assert await everyone.wait_for("document.querySelector('.usage-row[data-tenant=vision]')"
                                       "?.dataset.used === '1'"), "the usage panel followed, unpolled"

        # another tenant's viewer: the device is taken, by someone it is not told about
        await speech.wait_for(f"{cell(key)}?.dataset.state === 'allocated'", timeout=5)
        assert await speech.evaluate(f"{cell(key)}.dataset.tenant") == ""
        assert (await speech.evaluate(f"{cell(key)}.className")).endswith("allocated others")
        assert await speech.wait_for("document.getElementById('history-tenant').selectedOptions[0].textContent"
                                     " === 'speech'"), "its own history, not the whole fleet's"
        text = await speech.evaluate("document.body.innerHTML")
        assert "vision" not in text and "train" not in text

        await publish_json(nc.jetstream(), subjects.release("vision"), {"name": "train"}, msg_id="page:release")
        await seen.wait_for(lambda: seen.latest()[("vision", "train")]["state"] == "Released")
        for page in (everyone, speech):
            assert await page.wait_for(f"{cell(key)}.dataset.state === 'idle'", timeout=5)
        assert await everyone.evaluate("window.renderTimes.nodes") is not None
    finally:
        await nc.close()


# The strip as the page shows it: per tile what it counts, and the text a person reads.
STRIP = """[...document.querySelectorAll('#summary .tile')].map(t => [t.dataset.summary, t.dataset.generation || '',
    t.dataset.used || '', t.dataset.total || '', t.dataset.mine || '', t.dataset.value || '',
    t.dataset.submittedAt || '', t.dataset.warnings || ''])"""
TILE_TEXT = "[...document.querySelectorAll('#summary .tile')].map(t => t.innerText.replace(/\\s+/g, ' ').trim())"
# Words a person reads anywhere on the page, tooltips and the charts' labels included.
READ = """[document.body.innerText, ...[...document.querySelectorAll('[title], [aria-label]')]
    .map(e => (e.getAttribute('title') || '') + ' ' + (e.getAttribute('aria-label') || '')),
    ...[...document.querySelectorAll('svg text')].map(t => t.textContent)].join('\\n')"""
WRONG = re.compile(r"\b1 (claims|devices|GPUs|nodes|alerts|groups|kinds|warnings|GPU units|MIG slices)\b"
                   r"|\(no flavor\)|\b\d+\.0\b")


async def api_strip(client: httpx.AsyncClient, token: str) -> tuple[list[list[str]], dict[str, Any]]:
    """The strip the page should show, worked out here from the API the page reads: per generation the GPUs
    (a MIG slice counts towards its GPU, which is in use while any of its slices is), then the claims
    waiting, the oldest wait and the open critical alerts."""
    headers = {"Authorization": f"Bearer {token}"}
    answers = await asyncio.gather(*(client.get(path, headers=headers) for path in (
        "/v1/nodes", "/v1/waiting", "/v1/alerts/counts", "/v1/usage", "/v1/alerts?resolved=false&limit=1000")))
    nodes, waiting, counts, usage, open_alerts = (r.raise_for_status().json() for r in answers)
    generations: dict[str, dict[tuple[str, str], tuple[bool, bool]]] = {}
    for n in nodes:
        gpus = generations.setdefault(n["generation"], {})
        for d in n["devices"]:
            gpu = (d["pool"], d["parent"] if d["kind"] == "mig" and d["parent"] else d["name"])
            used, mine = gpus.get(gpu, (False, False))
            gpus[gpu] = (used or d["state"] == "allocated", mine or d["tenant"] is not None)
    strip = [["gpus", generation, str(sum(u for u, _ in gpus.values())), str(len(gpus)),
              str(sum(m for _, m in gpus.values())), "", "", ""] for generation, gpus in generations.items()]
    claims = sum(t["waiting"] for t in waiting["tenants"])
    assert claims == sum(p["claims"] for p in usage["pending"]), "the API agrees with itself"
    strip.append(["waiting", "", "", "", "", str(claims), "", ""])
    oldest = max(waiting["groups"], key=lambda g: g["oldestWaitSeconds"], default=None)
    strip.append(["oldest", "", "", "", "", "", oldest["oldestSubmittedAt"] if oldest else "", ""])
    critical = sum(c["open"] for c in counts if c["severity"] == "critical")
    warnings = sum(c["open"] for c in counts if c["severity"] == "warning")
    assert critical == sum(a["severity"] == "critical" for a in open_alerts), "counted as listed"
    strip.append(["critical", "", "", "", "", str(critical), "", str(warnings)])
    return strip, {"nodes": nodes, "waiting": waiting, "counts": counts}


async def strip_says_what_the_api_says(page: Browser, client: httpx.AsyncClient, token: str
                                       ) -> tuple[list[list[str]], dict[str, Any]]:
    """The API's strip, once the page shows it (the page follows within its live stream's coalescing; a
    notifier's alert may land meanwhile, so the API is asked again a few times)."""
    for _ in range(5):
        expected, answers = await api_strip(client, token)
        with contextlib.suppress(TimeoutError):
            shown = json.dumps(json.dumps(expected, separators=(",", ":")))
            await page.wait_for(f"JSON.stringify({STRIP}) === {shown}", timeout=10)
            return expected, answers
    shown = await page.evaluate(STRIP)
    assert shown == expected
    return expected, answers


async def test_the_summary_strip_says_what_the_api_says_on_the_lab_fleet(
        lab: Lab, tmp_path: Path, browsers: list[Browser]) -> None:
    binary = chromium()
    stack, viewer, scoped = lab.stack, lab.viewer, lab.scoped
    nc = await connect(stack.admin_url, name="test")
    try:
        seen, raised = await statuses(nc), await alerts(nc)
        claims = [a_claim(f"train-{i}", "vision").request("gpu", count=2) for i in range(3)] + [
            a_claim(f"sweep-{i}", "vision").request("gpu", count=8) for i in range(3)] + [
            a_claim("asr", "speech").request("gpu", count=1),
            a_claim("gb300", "speech").request("gpu", count=1, selectors=(
                'device.attributes["gpu.nvidia.com"].productName == "GB300"',))]  # no such GPU: critical
        for c in claims:
            await publish_json(nc.jetstream(), subjects.submit(c.namespace), c.document(),
                               msg_id=f"strip:{c.namespace}/{c.name}")
        await seen.wait_for(lambda: len(seen.latest()) == len(claims))
        await raised.wait_for(lambda: any(a.get("kind") == "claim-unsatisfiable" for _, a in raised.messages))
        states = [s["state"] for s in seen.latest().values()]
        assert states.count("Allocated") >= 4 and states.count("Pending") >= 2, states

        async with httpx.AsyncClient(base_url=stack.api_url) as client:
            everyone = await Browser.open(binary, tmp_path / "everyone", f"{stack.api_url}/?token={viewer}")
            browsers.append(everyone)
            await everyone.resize(1920, 1080)
            assert await everyone.wait_for(LIVE)
            expected, answers = await strip_says_what_the_api_says(everyone, client, viewer)
            gpus = {row[1]: (int(row[2]), int(row[3])) for row in expected if row[0] == "gpus"}
            assert set(gpus) == {n["generation"] for n in answers["nodes"]} and sum(u for u, _ in gpus.values()) > 0
            assert int(expected[-3][5]) >= 2 and int(expected[-1][5]) >= 1, "claims wait and an alert is critical"
            texts = await everyone.evaluate(TILE_TEXT)
            for generation, (used, total) in gpus.items():
                assert any(t.startswith(f"{generation} {used} / {total} GPUs in use") for t in texts), texts
            assert any(t.startswith(f"waiting {expected[-3][5]} claims waiting") for t in texts), texts
            assert any(t.startswith("alerts 1 critical alert open") for t in texts), texts
            read = await everyone.evaluate(READ)
            assert not WRONG.search(read), WRONG.search(read)
            ARTIFACTS.mkdir(exist_ok=True)
            await everyone.screenshot(ARTIFACTS / "usage-page-wall.png", viewport=True)
            await everyone.resize(1280, 800)
            assert await everyone.wait_for("document.querySelector('#panel-waiting').getBoundingClientRect().top"
                                           " < 800"), "on a laptop the queue starts on the first screen"
            await everyone.screenshot(ARTIFACTS / "usage-page-laptop.png", viewport=True)

            # a tenant-scoped viewer: its own queue and alerts, the whole fleet's GPUs (and which are its own)
            speech = await Browser.open(binary, tmp_path / "speech", f"{stack.api_url}/?token={scoped}")
            browsers.append(speech)
            assert await speech.wait_for(LIVE)
            mine, _ = await strip_says_what_the_api_says(speech, client, scoped)
            assert [r[:4] for r in mine if r[0] == "gpus"] == [r[:4] for r in expected if r[0] == "gpus"]
            assert sum(int(r[4]) for r in mine if r[0] == "gpus") == 1, "speech's asr holds one GPU"
            assert mine[-3][5] == "1" and mine[-1][5] == "1", "its gb300 waits, its alert is critical"
            assert await speech.wait_for("document.getElementById('scope').textContent.startsWith('tenant speech')")
            text = await speech.evaluate(READ)
            assert "vision" not in text and "train" not in text and not WRONG.search(text)

            # live: a release frees two GPUs; the strip follows without a reload
            await publish_json(nc.jetstream(), subjects.release("vision"), {"name": "train-0"},
                               msg_id="strip:release")
            await seen.wait_for(lambda: seen.latest()[("vision", "train-0")]["state"] == "Released")
            after, _ = await strip_says_what_the_api_says(everyone, client, viewer)
            assert after != expected
            for page in (everyone, speech):
                assert page.errors == []
    finally:
        await nc.close()


TENANTS, NODES, GPUS, WAITING = 100, 1000, 8, 10_000
REASONS = ("Insufficient nvidia.com/gpu: requested {n}, free 0 of 8 on 1000 nodes",
           "quota H100 of {t}: nominal 40, used 40, requested {n} more",
           "fair share: {t} uses 1.4 times its share; waits behind lower shares")


async def test_a_thousand_nodes_and_ten_thousand_waiting_claims_render_within_a_second(
        tmp_path: Path, browsers: list[Browser]) -> None:
    binary = chromium()
    url = f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}"
    await migrate(url)
    engine = create_engine(url)
    factory = sessions(engine)
    token = await create_token(factory, "viewer", None)
    now = datetime.now(UTC)
    names = [f"team-{i:03d}" for i in range(TENANTS)]

    def spec(count: int) -> dict[str, object]:
        return {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "gpu.nvidia.com", "count": count}}]}}}

    async with factory() as s, s.begin():
        await s.execute(insert(Tenant), [{"name": t, "weight": 1.0} for t in names])
        await s.execute(insert(Quota), [{"tenant": t, "flavor": "H100", "nominal": 40} for t in names])
        await s.execute(insert(Claim), [
            {"namespace": names[i % TENANTS], "name": f"wait-{i}", "state": "Pending", "spec": spec(1 + i % 4),
             "sequence": 1, "reason": REASONS[i % 3].format(n=1 + i % 4, t=names[i % TENANTS]),
             "submitted_at": now - timedelta(seconds=7 * i)} for i in range(WAITING)])
        running = [{"namespace": names[i % TENANTS], "name": f"run-{i}", "state": "Allocated", "spec": spec(4),
                    "sequence": 1, "node": f"node-{i // 2:04d}"} for i in range(1200)]
        await s.execute(insert(Claim), running)
        ids = {name: claim_id for name, claim_id in (await s.execute(
            Claim.__table__.select().with_only_columns(Claim.name, Claim.id).where(Claim.state == "Allocated")))}
        await s.execute(insert(DeviceAllocation), [
            {"driver": "gpu.nvidia.com", "pool": f"node-{i // 2:04d}", "device": f"gpu-{(i % 2) * 4 + d}",
             "claim_id": ids[f"run-{i}"], "node": f"node-{i // 2:04d}", "request": "gpu", "flavor": "H100",
             "units": 2.0} for i in range(1200) for d in range(4)])
        minute = int(time.time()) // 60 * 60
        await s.execute(insert(UsageSample), [
            {"at": minute - 60 * m, "tenant": t, "flavor": "H100", "used": (k + m) % 60, "nominal": 40, "capacity": 0}
            for m in range(60) for k, t in enumerate(names)] + [
            {"at": minute - 60 * m, "tenant": "", "flavor": "H100", "used": 0, "nominal": 0, "capacity": NODES * GPUS}
            for m in range(60)])
    big = fleet(*(d for n in range(NODES) for d in node(f"node-{n:04d}", "H100", GPUS)))

    async def fleet_view() -> Fleet:
        return big

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(create_app(engine, fleet=fleet_view), log_level="warning",
                                           lifespan="off"))
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            await asyncio.sleep(0.05)
        opened = time.monotonic()
        page = await Browser.open(binary, tmp_path / "profile", f"http://127.0.0.1:{sock.getsockname()[1]}/?token={token}")
        browsers.append(page)
        times = await page.wait_for("window.renderTimes.total && window.renderTimes.history !== undefined && "
                                    "window.renderTimes", timeout=60)
        shown = time.monotonic() - opened
        print(f"1,000 nodes x 8 GPUs, {WAITING:,} waiting claims: every panel shown {shown:.2f} s after the browser "
              f"started; render ms per panel {json.dumps(times)}")
        assert await page.evaluate("document.querySelectorAll('.cell').length") == NODES * GPUS
        assert await page.evaluate("document.querySelectorAll('.cell.allocated').length") == 1200 * 4
        assert await page.evaluate("document.getElementById('nodes').classList.contains('small')")
        assert await page.evaluate("document.querySelectorAll('tr.waiting-group').length") == TENANTS * 3
        assert await page.evaluate("document.querySelectorAll('tr.tenant-waits').length") == TENANTS
        assert await page.evaluate("document.querySelectorAll('.usage-row').length") == TENANTS
        assert await page.evaluate("document.querySelectorAll('#history .chart').length") == 1
        late = sum(1 for i in range(WAITING) if 7 * i > 600)  # past the broker's pendingAlertAfter
        gpus, waiting, oldest, critical = await page.evaluate(TILE_TEXT)
        assert (gpus, waiting, critical) == (
            "H100 4,800 / 8,000 GPUs in use 3,200 idle",
            f"waiting 10,000 claims waiting 25,000 devices asked · {late:,} past their alert time",
            "alerts 0 critical alerts open no warnings open")
        assert re.fullmatch(r"oldest wait 19\.\d h team-099 · not explained", oldest), oldest
        assert times["nodes"] < 1000, f"the node map took {times['nodes']} ms to render"
        assert all(times[panel] < 1000 for panel in ("usage", "waiting", "alerts", "history", "summary")), times
    finally:
        server.should_exit = True
        await serving
        sock.close()
        await engine.dispose()
