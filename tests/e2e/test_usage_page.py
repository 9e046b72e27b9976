"""The usage page in headless Chromium against a running admin API with tenants, quotas, allocated
devices, pending claims and alerts in the ledger: the bars carry the right numbers, the pending queue its
reasons. A screenshot is kept under test-artifacts/ (gitignored)."""

from __future__ import annotations

import asyncio
import math
import re
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from html.parser import HTMLParser
from pathlib import Path

import pytest
import uvicorn
from sqlalchemy import insert

from services.admin_api.app import create_app
from services.notifier import history
from shared.alerts.book import Alert, Message
from shared.dra.inventory import THROTTLED, Fleet
from shared.ledger.engine import create_engine, migrate, sessions
from shared.ledger.schema import Claim, DeviceAllocation, Quota, Tenant, UsageSample
from shared.ledger.tokens import create_token
from tests.builders import fleet, gpu, node
from tests.e2e.browser import Browser, browse, chromium

pytestmark = pytest.mark.e2e
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


# node-03: a hot, throttled H100 and one cut into MIG slices (the map draws them inside their GPU)
MIG_NODE = [
    replace(gpu("node-03", 0, "H100", architecture="Hopper"), health=THROTTLED, temperature_c=88,
            throttle_reasons=("SwThermalSlowdown", "HwThermalSlowdown")),
    replace(gpu("node-03", 1, "H100", architecture="Hopper"), temperature_c=41),
    *(gpu("node-03", 2 + i, "H100", architecture="Hopper", type="mig", parentUUID="GPU-node-03-1",
          profile="3g.40gb" if i < 2 else "1g.10gb") for i in range(3)),
]


def day_of_samples(now: float) -> list[dict[str, object]]:
    """A day of the notifier's minute samples, with an hour's gap (the notifier was down)."""
    minute = int(now) // 60 * 60
    rows: list[dict[str, object]] = []
    for m in range(1440):
        if 300 <= m < 360:
            continue
        at = minute - 60 * m
        rows += [{"at": at, "tenant": "vision", "flavor": "H100", "used": min(8, round(5 + 3 * math.sin(m / 90))),
                  "nominal": 4, "capacity": 0},
                 {"at": at, "tenant": "speech", "flavor": "H100", "used": round(1 + math.cos(m / 60)),
                  "nominal": 2, "capacity": 0},
                 {"at": at, "tenant": "speech", "flavor": "A100", "used": 1 + (m // 200) % 3, "nominal": 3,
                  "capacity": 0},
                 {"at": at, "tenant": "", "flavor": "H100", "used": 0, "nominal": 0, "capacity": 10},
                 {"at": at, "tenant": "", "flavor": "A100", "used": 0, "nominal": 0, "capacity": 4}]
    return rows


@dataclass
class Page:
    url: str
    token: str


@pytest.fixture
async def page(tmp_path: Path) -> AsyncIterator[Page]:
    url = f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}"
    await migrate(url)
    engine = create_engine(url)
    factory = sessions(engine)
    token = await create_token(factory, "viewer", None)
    async with factory() as s, s.begin():
        s.add_all([Tenant(name="vision", cohort=None, weight=2.0), Tenant(name="speech", weight=1.0)])
        await s.flush()
        s.add_all([Quota(tenant="vision", flavor="H100", nominal=4, borrowing_limit=4),
                   Quota(tenant="speech", flavor="H100", nominal=2),
                   Quota(tenant="speech", flavor="A100", nominal=3)])
        now = datetime.now(UTC)
        held = Claim(namespace="vision", name="train", state="Allocated", spec={}, sequence=1, node="node-01",
                     flavor="H100", submitted_at=now - timedelta(minutes=50), allocated_at=now - timedelta(minutes=41))
        small = Claim(namespace="speech", name="asr", state="Allocated", spec={}, sequence=1, node="node-02",
                      flavor="A100", submitted_at=now - timedelta(minutes=20), allocated_at=now - timedelta(minutes=19))
        s.add_all([held, small])
        await s.flush()
        s.add_all([DeviceAllocation(driver="gpu.nvidia.com", pool="node-01", device=f"gpu-{i}", claim_id=held.id,
                                    node="node-01", request="gpu", flavor="H100", units=2.0) for i in range(6)])
        s.add(DeviceAllocation(driver="gpu.nvidia.com", pool="node-02", device="gpu-0", claim_id=small.id,
                               node="node-02", request="gpu", flavor="A100", units=1.0))
        spec = {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "gpu.nvidia.com", "count": 2}}]}}}
        s.add_all([
            Claim(namespace="speech", name="wait-big", state="Pending", spec=spec, sequence=1,
                  reason="Insufficient nvidia.com/gpu: requested 2, free 0 of 8 on 1 node"),
            Claim(namespace="vision", name="wait-quota", state="Pending", spec=spec, sequence=1,
                  reason="quota H100 of vision: nominal 4 + borrowing 4, used 6, requested 2 more"),
        ])
        await history.record(s, [Message(Alert("claim-pending-too-long", "warning",
                                               "claim-pending-too-long:speech/wait-big", "speech/wait-big waits",
                                               {}, {"tenant": "speech", "claim": "wait-big"}),
                                         1_800_000_000.0, 1_800_000_010.0, 1, False)])
        await s.execute(insert(UsageSample), day_of_samples(time.time()))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]

    async def fleet_view() -> Fleet:  # node-01's H100s, node-02's A100s: the ledger's devices above are theirs
        return fleet(*node("node-01", "H100", 8), *node("node-02", "A100", 4), *MIG_NODE)

    server = uvicorn.Server(uvicorn.Config(create_app(engine, fleet=fleet_view), log_level="warning",
                                           lifespan="off"))
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.05)
    yield Page(f"http://127.0.0.1:{port}", token)
    server.should_exit = True
    await serving
    sock.close()
    await engine.dispose()


class Rows(HTMLParser):
    """The usage rows' data attributes and the pending claims' reasons, from the dumped DOM."""

    def __init__(self) -> None:
        super().__init__()
        self.usage: dict[tuple[str, str], dict[str, str]] = {}
        self.pending: dict[str, str] = {}  # tenant -> the reason of its group (one group each here)
        self.groups: dict[str, dict[str, str]] = {}
        self.waits: list[str] = []
        self.cells: dict[tuple[str, str], tuple[str, str]] = {}  # (node, device) -> (state, tenant)
        self.alerts: list[str] = []
        self.generations: list[str] = []
        self.admitted: list[tuple[str, str]] = []
        self.charts: dict[str, str] = {}  # flavor -> stretches of samples drawn
        self._claim: str | None = None
        self._in_reason = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        classes = a.get("class", "").split()
        if "usage-row" in classes:
            self.usage[(a["data-tenant"], a["data-flavor"])] = a
        elif "waiting-group" in classes:
            self._claim = a["data-tenant"]
            self.groups[a["data-tenant"]] = a
        elif "cell" in classes:
            self.cells[(a["data-node"], a["data-device"])] = (a["data-state"], a["data-tenant"])
        elif "admitted-waits" in classes:
            self.admitted.append((a["data-tenant"], a["data-flavor"]))
        elif "tenant-waits" in classes:
            self.waits.append(a["data-tenant"])
        elif "reason" in classes and self._claim is not None:
            self._in_reason = True
        elif "alert" in classes:
            self.alerts.append(a["data-key"])
        elif "generation" in classes:
            self.generations.append(a["data-generation"])
        elif "chart" in classes:
            self.charts[a["data-flavor"]] = a["data-runs"]

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "summary"):
            self._in_reason = False

    def handle_data(self, data: str) -> None:
        if self._in_reason and self._claim is not None:
            self.pending[self._claim] = self.pending.get(self._claim, "") + data


async def test_usage_page_shows_bars_and_pending_reasons(page: Page, tmp_path: Path) -> None:
    binary = chromium()
    address = f"{page.url}/?token={page.token}"
    dom = await browse(binary, tmp_path / "profile-dom", "--dump-dom", address)
    parsed = Rows()
    parsed.feed(dom)

    vision = parsed.usage[("vision", "H100")]
    assert (vision["data-used"], vision["data-nominal"], vision["data-borrowed"]) == ("6", "4", "2")
    speech_h100 = parsed.usage[("speech", "H100")]
    assert (speech_h100["data-used"], speech_h100["data-nominal"], speech_h100["data-borrowed"]) == ("0", "2", "0")
    speech_a100 = parsed.usage[("speech", "A100")]
    assert (speech_a100["data-used"], speech_a100["data-nominal"]) == ("1", "3")
    assert "6 / 4 used, 2 borrowed (12 GPU units)" in dom
    # The bar widths follow the numbers: the flavor's scale is its largest of used and nominal (6).
    assert re.search(r'class="in" style="width: 66\.66\d*%;?"', dom), "vision's 4 within nominal of 6"
    assert re.search(r'class="over" style="left: 66\.66\d*%; width: 33\.33\d*%;?"', dom), "2 borrowed"

    assert parsed.pending == {  # the queue grouped by tenant and reason, with the devices asked
        "speech": "Insufficient nvidia.com/gpu: requested 2, free 0 of 8 on 1 node",
        "vision": "quota H100 of vision: nominal 4 + borrowing 4, used 6, requested 2 more"}
    assert {t: (g["data-claims"], g["data-devices"]) for t, g in parsed.groups.items()} == {
        "speech": ("1", "2"), "vision": ("1", "2")}
    assert parsed.waits == ["speech", "vision"]
    assert parsed.admitted == [("speech", "A100"), ("vision", "H100")]  # waited 1 and 9 minutes
    assert "Waited before admission, per tenant and flavor, over the last hour" in dom
    # the node map: a cell per device and MIG slice, allocated ones with their tenant, the rest idle
    assert len(parsed.cells) == 17
    allocated = {("node-01", f"gpu-{i}"): ("allocated", "vision") for i in range(6)}
    allocated[("node-02", "gpu-0")] = ("allocated", "speech")
    assert {k: v for k, v in parsed.cells.items() if v[0] == "allocated"} == allocated
    assert sum(1 for state, _ in parsed.cells.values() if state == "idle") == 9
    assert parsed.cells[("node-03", "gpu-0")] == ("throttled", "")
    assert "88 °C; throttle reasons: SwThermalSlowdown, HwThermalSlowdown" in dom
    assert parsed.generations == ["A100", "H100", "Hopper H100"]
    assert dom.count('class="gpu-box"') == 1, "node-03's slices drawn inside gpu-1"
    # the fleet over time: a chart per flavor, the hour's samples drawn as one stretch (the gap is hours ago)
    assert parsed.charts == {"A100": "1", "H100": "1"}
    assert "speech: 1 claims, 2 devices" in dom and "vision: 1 claims, 2 devices" in dom
    assert parsed.alerts == ["claim-pending-too-long:speech/wait-big"]
    assert "polling every 5s" in dom, "no bus in this API process: it polls"

    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "usage-page.png"
    shot.unlink(missing_ok=True)
    await browse(binary, tmp_path / "profile-shot", f"--screenshot={shot}", address)
    assert shot.exists() and shot.stat().st_size > 10_000
    print(f"usage page screenshot: {shot}")


async def test_usage_page_asks_for_a_token(page: Page, tmp_path: Path) -> None:
    binary = chromium()
    dom = await browse(binary, tmp_path / "profile", "--dump-dom", f"{page.url}/")
    assert '<form id="login">' in dom and 'id="data" hidden' in dom, "no token: the form, no data"
    refused = await browse(binary, tmp_path / "profile2", "--dump-dom", f"{page.url}/?token=cb_wrong")
    assert "the token was refused" in refused and 'class="row usage-row"' not in refused


PANELS = ("history", "usage", "nodes", "waiting", "alerts")


async def test_each_panel_renders_and_is_photographed(page: Page, tmp_path: Path) -> None:
    """Driven in real time: the day's window shows the notifier's missing hour as a gap (and the waits
    before admission follow the window), a tenant's name
    shows its usage over time against its nominal quota; each panel's screenshot lands in test-artifacts/
    (the ones in docs/ are these)."""
    browser = await Browser.open(chromium(), tmp_path / "profile", f"{page.url}/?token={page.token}")
    try:
        times = await browser.wait_for("window.renderTimes.total && window.renderTimes.history !== undefined && "
                                       "window.renderTimes")
        print(f"render ms per panel: {times}")
        await browser.evaluate("document.querySelector('#windows [data-window=day]').click()")
        assert await browser.wait_for("document.querySelector('#history .chart[data-flavor=H100]')"
                                      "?.dataset.runs === '2' && document.querySelectorAll('#history .chart').length")
        assert await browser.wait_for("document.getElementById('admitted-title').textContent.endsWith('last day')")
        ARTIFACTS.mkdir(exist_ok=True)
        for panel in PANELS:
            await browser.screenshot(ARTIFACTS / f"usage-page-{panel}.png", f"#panel-{panel}")
        await browser.evaluate("document.querySelector('.usage-row[data-tenant=vision] .who').click()")
        assert await browser.wait_for("document.querySelector('#history .nominal-line') && "
                                      "document.getElementById('history-tenant').value") == "vision"
        assert await browser.evaluate("[...document.querySelectorAll('#history .chart')].map(c => c.dataset.flavor)"
                                      ) == ["H100"], "vision has samples of H100 only"
        await browser.screenshot(ARTIFACTS / "usage-page-tenant.png", "#panel-history")
        for name in (*PANELS, "tenant"):
            assert (ARTIFACTS / f"usage-page-{name}.png").stat().st_size > 3_000
    finally:
        await browser.close()
