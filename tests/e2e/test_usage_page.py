"""The usage page in headless Chromium against a running admin API with tenants, quotas, allocated
devices, pending claims and alerts in the ledger: the bars carry the right numbers, the pending queue its
reasons, the alerts fold by kind with the API's counts; the queue and the alerts sort (by mouse and by
keyboard) and filter by tenant, flavor and kind, and the address keeps it all for a wall screen. Screenshots
are kept under test-artifacts/ (gitignored; the ones in docs/ are these)."""

from __future__ import annotations

import asyncio
import math
import os
import re
import socket
import subprocess
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from html.parser import HTMLParser
from pathlib import Path

import httpx
import pytest
import uvicorn
from sqlalchemy import insert

from services.admin_api.app import create_app
from shared.alerts.book import Alert, Message
from shared.dra.inventory import THROTTLED, Fleet
from shared.ledger import alerts as alert_history
from shared.ledger.engine import create_engine, migrate, sessions
from shared.ledger.schema import (
    Claim,
    Cohort,
    CohortQuotaRow,
    DeviceAllocation,
    PastUse,
    Quota,
    QuotaSettings,
    Tenant,
    UsageSample,
)
from shared.ledger.tokens import create_token
from tests.builders import fleet, gpu, labelled, node
from tests.e2e.browser import Browser, browse, chromium

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"


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


BIG = "Insufficient nvidia.com/gpu: requested 2, free 0 of 8 on 1 node"
A100 = "Insufficient nvidia.com/gpu: requested 4, free 3 of 4 on 1 node"
QUOTA = "quota H100 of vision: nominal 4 + borrowing 4, used 6, requested 2 more"


def spec(count: int) -> dict[str, object]:
    return {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
        "deviceClassName": "gpu.nvidia.com", "count": count}}]}}}


ETA_AHEAD = timedelta(minutes=20, seconds=40)  # wait-big's estimated start: "in 20m" for the test's first 40 s


def stamp(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def explained(flavors: list[str], **parts: object) -> dict[str, object]:
    """An explanation as the allocator writes it, with the parts the page's filters read."""
    return {"state": "Pending", "unsatisfiable": False, "flavors": flavors, "quota": [], **parts}


def alert(kind: str, severity: str, labels: dict[str, str], after: float, *, resolved: bool = False) -> Message:
    key = ":".join([kind, "/".join(labels.values())])
    return Message(Alert(kind, severity, key, f"{key} summary", {}, labels), 1_800_000_000.0,
                   1_800_000_000.0 + after, 1, resolved)


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
        # their start estimates' error (GET /v1/estimates): train started 10 min after its first p50, 1 min after
        # its last; asr 2 min before its only one
        allocated = now - timedelta(minutes=41)
        held = Claim(namespace="vision", name="train", state="Allocated", spec={}, sequence=1, node="node-01",
                     flavor="H100", submitted_at=now - timedelta(minutes=50), allocated_at=allocated,
                     first_estimate_p50=allocated.timestamp() - 600, estimate_p50=allocated.timestamp() - 60)
        small = Claim(namespace="speech", name="asr", state="Allocated", spec={}, sequence=1, node="node-02",
                      flavor="A100", submitted_at=now - timedelta(minutes=20), allocated_at=now - timedelta(minutes=19),
                      estimate_p50=(now - timedelta(minutes=17)).timestamp())
        s.add_all([held, small])
        await s.flush()
        s.add_all([DeviceAllocation(driver="gpu.nvidia.com", pool="node-01", device=f"gpu-{i}", claim_id=held.id,
                                    node="node-01", request="gpu", flavor="H100", units=2.0) for i in range(6)])
        s.add(DeviceAllocation(driver="gpu.nvidia.com", pool="node-02", device="gpu-0", claim_id=small.id,
                               node="node-02", request="gpu", flavor="A100", units=1.0))
        s.add_all([
            Claim(namespace="speech", name="wait-big", state="Pending", spec=spec(2), sequence=1, reason=BIG,
                  explain=explained(["A100", "H100"]), submitted_at=now - timedelta(minutes=5),
                  estimated_start={"p50": stamp(now + ETA_AHEAD), "p90": stamp(now + 2 * ETA_AHEAD),
                                   "blockedBy": ["vision/train"]}),
            Claim(namespace="vision", name="wait-quota", state="Pending", spec=spec(2), sequence=1, reason=QUOTA,
                  explain=explained(["H100"], quota=[{"flavor": "H100"}]), submitted_at=now - timedelta(minutes=2)),
            Claim(namespace="speech", name="wait-a100", state="Pending", spec=spec(4), sequence=1, reason=A100,
                  explain=explained(["A100"]), submitted_at=now - timedelta(hours=2)),
        ])
        await alert_history.record(s, [
            alert("claim-pending-too-long", "warning", {"tenant": "speech", "claim": "wait-big"}, 10),
            alert("claim-pending-too-long", "warning", {"tenant": "speech", "claim": "wait-a100"}, 20),
            alert("claim-pending-too-long", "warning", {"tenant": "vision", "claim": "wait-quota"}, 30),
            alert("quota-near-limit", "warning", {"tenant": "vision", "flavor": "H100"}, 40),
            alert("device-unhealthy", "critical", {"node": "node-03", "device": "gpu-0"}, 50),
            alert("node-lost", "critical", {"node": "node-09"}, 60, resolved=True)])
        await s.execute(insert(UsageSample), day_of_samples(time.time()))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]

    async def fleet_view() -> Fleet:  # node-01's H100s, node-02's A100s: the ledger's devices above are theirs
        return labelled(fleet(*node("node-01", "H100", 8), *node("node-02", "A100", 4), *MIG_NODE),
                        {"node-01": {CLIQUE: "c1"}, "node-02": {CLIQUE: "c2"}})

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


CLIQUE = "nvidia.com/gpu.clique"
GROUPS = "[...document.querySelectorAll('#nodes .generation')].map(g => g.querySelector('h3').textContent)"


async def test_the_node_map_groups_by_a_node_label_as_asked_and_keeps_it_in_the_address(page: Page,
                                                                                         tmp_path: Path) -> None:
    """Grouped by a gang topology key, each value's heading says what a gang asking for it finds there (idle
    GPUs); nodes without the label come last; the choice is kept in the address, and generation is back
    when it is cleared."""
    browser = await Browser.open(chromium(), tmp_path / "profile", f"{page.url}/?token={page.token}")
    try:
        await browser.wait_for("document.querySelectorAll('#nodes .generation[data-generation]').length")
        assert CLIQUE in await browser.evaluate("[...document.getElementById('nodes-group').options].map(o => o.value)")
        await choose(browser, "nodes-group", CLIQUE)
        assert await browser.evaluate(GROUPS) == [f"{CLIQUE}=c1: 1 node, 8 GPUs, 2 idle",
                                                  f"{CLIQUE}=c2: 1 node, 4 GPUs, 3 idle",
                                                  f"no {CLIQUE}: 1 node, 2 GPUs, 1 idle"]  # one throttled
        assert f"group={CLIQUE}" in await browser.evaluate("decodeURIComponent(window.location.search)")
        await choose(browser, "nodes-group", "")
        assert await browser.wait_for("document.querySelectorAll('#nodes .generation[data-generation]').length") == 3
        assert "group=" not in await browser.evaluate("window.location.search")
    finally:
        await browser.close()


class Rows(HTMLParser):
    """The usage rows' data attributes, the waiting groups with their reasons and the tiles of the summary
    strip, from the dumped DOM."""

    def __init__(self) -> None:
        super().__init__()
        self.usage: dict[tuple[str, str], dict[str, str]] = {}
        self.groups: list[dict[str, str]] = []  # each waiting group's attributes, its reason as "reason"
        self.waits: list[str] = []
        self.cells: dict[tuple[str, str], tuple[str, str]] = {}  # (node, device) -> (state, tenant)
        self.folds: list[tuple[str, str, str]] = []  # open alerts per kind: (kind, severity, open)
        self.generations: list[str] = []
        self.admitted: list[tuple[str, str]] = []
        self.charts: dict[str, str] = {}  # flavor -> stretches of samples drawn
        self.tiles: list[dict[str, str]] = []
        self._in_reason = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        classes = a.get("class", "").split()
        if "usage-row" in classes:
            self.usage[(a["data-tenant"], a["data-flavor"])] = a
        elif "waiting-group" in classes:
            self.groups.append({**a, "reason": ""})
        elif "cell" in classes:
            self.cells[(a["data-node"], a["data-device"])] = (a["data-state"], a["data-tenant"])
        elif "admitted-waits" in classes:
            self.admitted.append((a["data-tenant"], a["data-flavor"]))
        elif "tenant-waits" in classes:
            self.waits.append(a["data-tenant"])
        elif "reason" in classes and self.groups:
            self._in_reason = True
        elif "alert-kind" in classes:
            self.folds.append((a["data-kind"], a["data-severity"], a["data-open"]))
        elif "generation" in classes:
            self.generations.append(a["data-generation"])
        elif "chart" in classes:
            self.charts[a["data-flavor"]] = a["data-runs"]
        elif "tile" in classes:
            self.tiles.append(a)

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "summary"):
            self._in_reason = False

    def handle_data(self, data: str) -> None:
        if self._in_reason:
            self.groups[-1]["reason"] += data


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
    assert "6 of 4 nominal · 2 borrowed · 12 GPU units · 2 devices more asked" in dom
    assert "1 of 3 nominal · 1 GPU unit · 6 devices more asked" in dom  # wait-big's 2 count as A100, the cheaper
    # The bar widths follow the numbers: the flavor's scale is its largest of used and nominal (6).
    assert re.search(r'class="in" style="width: 66\.66\d*%;?"', dom), "vision's 4 within nominal of 6"
    assert re.search(r'class="over" style="left: 66\.66\d*%; width: 33\.33\d*%;?"', dom), "2 borrowed"

    # the queue grouped by tenant and reason, the longest waiting first, with the devices asked, the kind
    # of wait and the flavors its claims would take
    assert [(g["data-tenant"], g["reason"], g["data-claims"], g["data-devices"], g["data-kind"], g["data-flavors"])
            for g in parsed.groups] == [("speech", A100, "1", "4", "devices", "A100"),
                                        ("speech", BIG, "1", "2", "devices", "A100 H100"),
                                        ("vision", QUOTA, "1", "2", "quota", "H100")]
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
    assert "Hopper H100: 1 node, 2 GPUs (3 MIG slices): 1 idle · 1 throttled" in dom
    # the fleet over time: a chart per flavor, the hour's samples drawn as one stretch (the gap is hours ago)
    assert parsed.charts == {"A100": "1", "H100": "1"}
    # alerts folded by kind, the critical first, with how many are open of each
    assert parsed.folds == [("device-unhealthy", "critical", "1"), ("claim-pending-too-long", "warning", "3"),
                            ("quota-near-limit", "warning", "1")]
    # the strip: GPUs in use of all per generation (a GPU cut into slices is one), the queue, the alerts
    assert [(t["data-summary"], t.get("data-generation", ""), t.get("data-used", ""), t.get("data-total", ""),
             t.get("data-value", "")) for t in parsed.tiles] == [
        ("gpus", "A100", "1", "4", ""), ("gpus", "H100", "6", "8", ""), ("gpus", "Hopper H100", "0", "2", ""),
        ("waiting", "", "", "", "3"), ("oldest", "", "", "", ""), ("critical", "", "", "", "1")]
    assert float(parsed.tiles[4]["data-seconds"]) >= 7200, "wait-a100 waits two hours"
    assert "2 h" in dom and "4 warnings open" in dom
    for wrong in ("1 claims", "1 devices", "(no flavor)", "1 GPU units", ".0 "):
        assert wrong not in dom, wrong
    assert "polling every 5s" in dom, "no bus in this API process: it polls"

    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "usage-page.png"
    shot.unlink(missing_ok=True)
    await browse(binary, tmp_path / "profile-shot", f"--screenshot={shot}", address)
    assert shot.exists() and shot.stat().st_size > 10_000
    print(f"usage page screenshot: {shot}")


SHARE_ROWS = ("[...document.querySelectorAll('#shares tr')]"
              ".map(r => [r.dataset.tenant, ...[...r.children].slice(1).map(c => c.textContent)].join('|'))")
TREE_ROWS = ("[...document.querySelectorAll('#cohort-tree tr')]"
             ".map(r => [...r.children].map(c => c.textContent.trim()).join('|'))")


async def test_the_page_shows_shares_with_past_use_and_the_cohort_tree(page: Page, tmp_path: Path) -> None:
    """Issue 41: with fairSharing.halfLife, each tenant's share with its past use and when it halves, next
    in line first; the cohort tree with each level's used / nominal, children under their parents."""
    engine = create_engine(f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}")
    async with sessions(engine)() as s, s.begin():
        s.add_all([Cohort(name="org"), Cohort(name="research", parent="org")])
        await s.flush()
        s.add(CohortQuotaRow(cohort="org", flavor="H100", nominal=4, lending_limit=None))
        vision = await s.get(Tenant, "vision")
        assert vision is not None
        vision.cohort = "research"
        await s.merge(QuotaSettings(id=1, half_life_s=3600.0))
        s.add(PastUse(tenant="speech", flavor="H100", units=16.0, as_of=time.time()))  # ran a lot lately
    await engine.dispose()
    browser = await Browser.open(chromium(), tmp_path / "profile-tree", f"{page.url}/?token={page.token}")
    try:
        await browser.wait_for("document.querySelectorAll('#cohort-tree tr').length > 0")
        shares = await browser.evaluate(SHARE_ROWS)
        tree = await browser.evaluate(TREE_ROWS)
        hint = await browser.evaluate("document.getElementById('shares-hint').textContent")
    finally:
        await browser.close()
    # vision: 12 units (6 H100s at 2) over weight 2 = 6; speech: 1 unit + 16 past use, over weight 1
    assert [row.split("|")[0] for row in shares] == ["vision", "speech"]
    weight, in_use, past, share = map(float, shares[0].split("|")[1:5])
    assert (weight, in_use) == (2, 12) and past < 0.1 and 6 <= share < 6.1
    speech = shares[1].split("|")
    assert float(speech[2]) == 1 and 15.9 < float(speech[3]) <= 16.0 and speech[5] != "–"  # it halves: ran more
    assert "past use halves every 60 min" in hint
    assert tree[0].startswith("org|H100|6 / 8|4"), tree  # org's own 4 and vision's 4 beneath it
    assert tree[1].startswith("research|H100|6 / 4|"), tree


ESTIMATE_ROWS = ("[...document.querySelectorAll('tr.estimate-error')]"
                 ".map(r => [...r.children].map(c => c.textContent).join('|'))")


async def test_the_waiting_panel_shows_estimated_starts_and_their_error(page: Page, tmp_path: Path) -> None:
    """A waiting claim's estimated start shows in its opened group (how far off, then when), and the estimates'
    error per tenant and flavor (GET /v1/estimates over the page's window), and over all, follows the filters."""
    browser = await Browser.open(chromium(), tmp_path / "profile", f"{page.url}/?token={page.token}")
    try:
        assert await browser.wait_for(f"{ROWS}.length === 3 && {ESTIMATE_ROWS}.length")
        assert await browser.evaluate(ESTIMATE_ROWS) == ["speech|A100|1|–|–|2 min|2 min",
                                                         "vision|H100|1|10 min|10 min|60 s|60 s",
                                                         "all|2|10 min|10 min|60 s|2 min"]
        assert "over the last hour" in await browser.evaluate("document.getElementById('estimates-title').textContent")
        await browser.evaluate("document.querySelector('tr.waiting-group[data-claims=\"1\"][data-devices=\"2\"]"
                               "[data-tenant=speech] details').open = true")
        eta = await browser.wait_for("document.querySelector('.claim-eta[data-claim=wait-big]')?.textContent")
        assert eta.startswith("wait-big (in 20m, "), eta
        title = await browser.evaluate("document.querySelector('.claim-eta[data-claim=wait-big]').title")
        assert title.startswith("estimated start "), title
        await choose(browser, "filter-tenant", "vision")
        assert await browser.evaluate(ESTIMATE_ROWS) == ["vision|H100|1|10 min|10 min|60 s|60 s"], "no overall row"
        await choose(browser, "filter-flavor", "A100")
        assert await browser.evaluate(ESTIMATE_ROWS) == []
        assert "no claim allocated in the last hour had an estimate published" in await browser.evaluate(
            "document.getElementById('estimates').textContent")
        assert browser.errors == []
    finally:
        await browser.close()


def test_the_page_passes_its_linter() -> None:
    """Biome (npm, pinned in package.json; `make test` and `make lint` install it) over the page's HTML, CSS
    and JS, warnings included."""
    biome = ROOT / "node_modules" / ".bin" / "biome"
    if not biome.exists():
        if os.environ.get("CI"):
            pytest.fail("Biome is not installed (make test installs it with npm ci)")
        pytest.skip("Biome is not installed; `make test` installs it")
    linted = subprocess.run([str(biome), "lint", "--error-on-warnings"], cwd=ROOT, capture_output=True, text=True,
                            timeout=120, check=False)
    assert linted.returncode == 0, linted.stdout + linted.stderr
    assert "Checked 4 files" in linted.stdout + linted.stderr, "biome.jsonc's files: the page's three and itself"


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


# Every piece of text shown, with its colour's contrast against what is behind it (WCAG 2's ratio); large
# text is 24 px, or 18.66 px bold.
CONTRAST = """(() => {
  const rgb = c => (c.match(/[\\d.]+/g) || []).map(Number);
  const f = v => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; };
  const lum = ([r, g, b]) => 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b);
  const behind = e => { for (; e; e = e.parentElement) { const c = rgb(getComputedStyle(e).backgroundColor);
                                                         if (c.length === 3 || c[3] > 0) return c.slice(0, 3); }
                        return [255, 255, 255]; };
  const out = [];
  for (const e of document.querySelectorAll('body *')) {
    const text = [...e.childNodes].filter(n => n.nodeType === 3).map(n => n.textContent.trim()).join('');
    const unseen = !e.getClientRects().length || e.closest('svg, [hidden], details:not([open]) > :not(summary)');
    if (!text || unseen) continue;
    const style = getComputedStyle(e);
    const [a, b] = [lum(rgb(style.color)), lum(behind(e))];
    const ratio = (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
    const size = parseFloat(style.fontSize), bold = Number(style.fontWeight) >= 700;
    out.push([text.slice(0, 40), Math.round(ratio * 10) / 10, size >= 24 || (bold && size >= 18.66) ? 3 : 4.5]);
  }
  return out;
})()"""
ROWS = "[...document.querySelectorAll('tr.waiting-group')].map(r => r.dataset.tenant + ':' + r.dataset.devices)"
FOLDS = "[...document.querySelectorAll('tr.alert-kind')].map(r => r.dataset.kind + ':' + r.dataset.open)"
EXPANDED = "[...document.querySelectorAll('#alerts tr.alert')].map(r => r.dataset.key)"


def header(table: str, key: str) -> str:
    return f"document.querySelector('th[data-table={table}][data-sort={key}]')"


async def choose(browser: Browser, select: str, value: str) -> None:
    """A filter chosen as a person would: the select's value, then its change event."""
    await browser.evaluate(f"(() => {{ const s = document.getElementById('{select}'); s.value = '{value}'; "
                           "s.dispatchEvent(new Event('change')); })()")


async def test_the_queue_and_alerts_sort_filter_and_fold_and_the_address_keeps_them(page: Page, tmp_path: Path
                                                                                     ) -> None:
    """Sorting by a header (mouse, then keyboard), filtering by tenant, flavor and kind, and opening an alert
    kind change the rows as they should; the address holds all of it (never the token), so the same address
    opened again, as a wall screen would be, shows the same."""
    binary = chromium()
    browser = await Browser.open(binary, tmp_path / "profile", f"{page.url}/?token={page.token}")
    try:
        assert await browser.wait_for(f"{ROWS}.length === 3 && document.querySelectorAll('tr.alert-kind').length "
                                      "&& !document.getElementById('data').hidden")
        assert await browser.evaluate(ROWS) == ["speech:4", "speech:2", "vision:2"], "the longest waiting first"
        shown = await browser.evaluate(CONTRAST)
        assert len(shown) > 100 and [s for s in shown if s[1] < s[2]] == [], "text readable against its background"
        assert await browser.evaluate(f"{header('waiting', 'oldest')}.getAttribute('aria-sort')") == "descending"
        await browser.evaluate(f"{header('waiting', 'tenant')}.querySelector('button').click()")
        assert await browser.evaluate(ROWS) == ["speech:2", "speech:4", "vision:2"], "A to Z, ties as the API"
        await browser.evaluate(f"{header('waiting', 'tenant')}.querySelector('button').click()")
        assert await browser.evaluate(ROWS) == ["vision:2", "speech:2", "speech:4"], "again: Z to A"
        # the keyboard: a header is a button to reach with Tab and press with Enter or Space
        await browser.evaluate(f"{header('waiting', 'devices')}.querySelector('button').focus()")
        await browser.press("Enter")
        assert await browser.evaluate(ROWS) == ["speech:4", "speech:2", "vision:2"], "most devices first"
        await browser.press("Space")
        assert await browser.evaluate(ROWS) == ["speech:2", "vision:2", "speech:4"]
        assert await browser.evaluate(f"{header('waiting', 'devices')}.getAttribute('aria-sort')") == "ascending"
        assert await browser.evaluate("location.search") == "?sort-waiting=devices"

        # alerts folded by kind, with the API's counts; a kind opens to its alerts
        headers = {"Authorization": f"Bearer {page.token}"}
        async with httpx.AsyncClient(base_url=page.url, headers=headers) as client:
            counts = (await client.get("/v1/alerts/counts")).json()
        per_kind: dict[str, int] = {}
        for c in counts:
            per_kind[c["kind"]] = per_kind.get(c["kind"], 0) + c["open"]
        assert per_kind == {"claim-pending-too-long": 3, "device-unhealthy": 1, "quota-near-limit": 1}
        assert await browser.evaluate(FOLDS) == [
            f"{k}:{per_kind[k]}" for k in ("device-unhealthy", "claim-pending-too-long", "quota-near-limit")]
        assert await browser.evaluate(EXPANDED) == []
        await browser.evaluate("document.querySelector('tr.alert-kind[data-kind=claim-pending-too-long] button')"
                               ".click()")
        assert await browser.wait_for(f"{EXPANDED}.length === 3 && {EXPANDED}")
        assert "claim-pending-too-long:speech/wait-a100" in await browser.evaluate(EXPANDED)
        assert await browser.evaluate("document.querySelector('tr.alert-kind[data-kind=claim-pending-too-long] "
                                      "button').getAttribute('aria-expanded')") == "true"
        await browser.evaluate(f"{header('alerts', 'open')}.querySelector('button').click()")
        assert (await browser.evaluate(FOLDS))[0] == "claim-pending-too-long:3", "most open first"
        assert "node-lost:node-09" in await browser.evaluate(
            "[...document.querySelectorAll('#resolved tr.alert')].map(r => r.dataset.key)"), "recently resolved"

        # filters: a tenant, a flavor, a kind of wait, a kind of alert
        await choose(browser, "filter-tenant", "speech")
        assert await browser.evaluate(ROWS) == ["speech:2", "speech:4"]
        assert await browser.evaluate(FOLDS) == ["claim-pending-too-long:2"], "speech's only: no fleet, no vision"
        assert await browser.wait_for(f"{EXPANDED}.length === 2 && {EXPANDED}") == [
            "claim-pending-too-long:speech/wait-a100", "claim-pending-too-long:speech/wait-big"]
        assert await browser.evaluate("[...document.querySelectorAll('tr.tenant-waits')].map(r => r.dataset.tenant)"
                                      ) == ["speech"]
        await choose(browser, "filter-tenant", "")
        await choose(browser, "filter-flavor", "H100")
        assert await browser.evaluate(ROWS) == ["speech:2", "vision:2"], "the groups that would take an H100"
        assert await browser.evaluate(FOLDS) == ["quota-near-limit:1"], "the alerts that name H100"
        await choose(browser, "filter-flavor", "")
        await choose(browser, "filter-why", "quota")
        assert await browser.evaluate(ROWS) == ["vision:2"]
        await choose(browser, "filter-alert", "device-unhealthy")
        assert await browser.evaluate(FOLDS) == ["device-unhealthy:1"]
        assert await browser.evaluate("document.getElementById('waiting-shown').textContent") == (
            "1 claim in 1 group of 3 in 3")
        await choose(browser, "filter-tenant", "speech")
        address = await browser.evaluate("location.href")
        assert "token" not in address
        assert address.endswith("/?tenant=speech&why=quota&alert=device-unhealthy&sort-waiting=devices"
                                "&sort-alerts=-open&expand=claim-pending-too-long")
        assert await browser.evaluate(ROWS) == [] and await browser.evaluate(FOLDS) == []
        assert browser.errors == []
    finally:
        await browser.close()

    # the wall screen's bookmark: the same view, opened anew
    view = "tenant=speech&sort-waiting=devices&expand=claim-pending-too-long"
    wall = await Browser.open(binary, tmp_path / "wall", f"{page.url}/?token={page.token}&{view}")
    try:
        assert await wall.wait_for(f"{ROWS}.length === 2 && {EXPANDED}.length === 2")
        assert await wall.evaluate(ROWS) == ["speech:2", "speech:4"]
        assert await wall.evaluate("document.getElementById('filter-tenant').value") == "speech"
        assert await wall.evaluate("location.search") == f"?{view}", "the token gone, the view kept"
        assert wall.errors == []
    finally:
        await wall.close()
