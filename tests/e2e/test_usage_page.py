"""The usage page in headless Chromium against a running admin API with tenants, quotas, allocated
devices, pending claims and alerts in the ledger: the bars carry the right numbers, the pending queue its
reasons. A screenshot is kept under test-artifacts/ (gitignored)."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

import pytest
import uvicorn

from services.admin_api.app import create_app
from services.notifier import history
from shared.alerts.book import Alert, Message
from shared.dra.inventory import Fleet
from shared.ledger.engine import create_engine, migrate, sessions
from shared.ledger.schema import Claim, DeviceAllocation, Quota, Tenant
from shared.ledger.tokens import create_token
from tests.builders import fleet, node

pytestmark = pytest.mark.e2e
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
         "--virtual-time-budget=5000", "--window-size=1200,900"]


def chromium() -> str:
    found = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed (make test installs Debian's chromium)")
        pytest.skip("chromium is not installed; `make test` installs it")
    return found


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
        held = Claim(namespace="vision", name="train", state="Allocated", spec={}, sequence=1, node="node-01")
        small = Claim(namespace="speech", name="asr", state="Allocated", spec={}, sequence=1, node="node-02")
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
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    async def fleet_view() -> Fleet:  # node-01's H100s, node-02's A100s: the ledger's devices above are theirs
        return fleet(*node("node-01", "H100", 8), *node("node-02", "A100", 4))

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


async def browse(binary: str, profile: Path, *args: str) -> str:
    process = await asyncio.create_subprocess_exec(
        binary, *FLAGS, f"--user-data-dir={profile}", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(process.communicate(), 90)
    assert process.returncode == 0, err.decode()[-2000:]
    return out.decode()


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
        elif "tenant-waits" in classes:
            self.waits.append(a["data-tenant"])
        elif "reason" in classes and self._claim is not None:
            self._in_reason = True
        elif "alert" in classes:
            self.alerts.append(a["data-key"])

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
    # the node map: a cell per device, allocated ones with their tenant, the rest idle
    assert len(parsed.cells) == 12
    allocated = {("node-01", f"gpu-{i}"): ("allocated", "vision") for i in range(6)}
    allocated[("node-02", "gpu-0")] = ("allocated", "speech")
    assert {k: v for k, v in parsed.cells.items() if v[0] == "allocated"} == allocated
    assert sum(1 for state, _ in parsed.cells.values() if state == "idle") == 5
    assert "speech: 1 claims, 2 devices" in dom and "vision: 1 claims, 2 devices" in dom
    assert parsed.alerts == ["claim-pending-too-long:speech/wait-big"]
    assert "polling every 5s" in dom

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
