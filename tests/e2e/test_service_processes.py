"""Issue 42: `up` runs the allocator in a process of its own, and start estimates in another, at a lower CPU
priority (issue 39). The allocator decides there; the estimator publishes a waiting claim's estimate; /metrics
of `up` carries their series; a killed allocator is started again and goes on deciding; one SIGINT to the
terminal's process group stops everything; a killed `up` leaves no process of its behind."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import httpx
import nats
import pytest

from bench.e2e import free_port
from services.bus.authority import ADMIN_PASSWORD_FILE
from shared.contract import bus_auth, subjects
from tests.e2e.test_supervision import _alive

pytestmark = pytest.mark.e2e
WAIT_S = 60.0


class Up:
    """`claimbroker up` on the demo fleet, in a session of its own (its process group is the terminal's)."""

    def __init__(self, data: Path, health_port: int) -> None:
        self.data, self.health = data, f"http://127.0.0.1:{health_port}"
        self.process: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CLAIMBROKER_")}
        env["CLAIMBROKER_HEALTH_PORT"] = self.health.rsplit(":", 1)[1]
        self.process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "services.cli", "--data-dir", str(self.data), "up", "--api-port", "0",
            env=env, stdout=asyncio.subprocess.DEVNULL, stderr=(self.data.parent / "up.log").open("wb"),
            start_new_session=True)

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def children(self) -> dict[int, int]:
        """The processes `up` spawned (not the resource tracker), with their niceness."""
        found = {}
        for children in Path(f"/proc/{self.pid}/task").glob("*/children"):
            for pid in map(int, children.read_text().split()):
                try:
                    command = Path(f"/proc/{pid}/cmdline").read_bytes()
                    nice = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[16])
                except (OSError, ValueError, IndexError):
                    continue
                if b"spawn_main" in command and _alive(pid):
                    found[pid] = nice
        return found

    def allocators(self) -> list[int]:
        """The allocator's process: the one spawned at `up`'s own priority."""
        return [pid for pid, nice in self.children().items() if nice == os.getpriority(os.PRIO_PROCESS, self.pid)]

    def estimators(self) -> list[int]:
        """The start estimates' process: the one spawned 10 lower."""
        return [pid for pid, nice in self.children().items() if nice == os.getpriority(os.PRIO_PROCESS, self.pid) + 10]

    async def bus(self) -> nats.NATS:
        written = self.data / "nats.url"
        url = str(await until(lambda: written.exists() and written.read_text().strip(), "up wrote no nats.url", self))
        password = (self.data / ADMIN_PASSWORD_FILE).read_text().strip()
        return await nats.connect(bus_auth.url_with_user(url, bus_auth.admin_user(), password))

    def log(self) -> str:
        return (self.data.parent / "up.log").read_text(errors="replace")[-3000:]


async def until(check: Callable[[], object], what: str, up: Up, timeout: float = WAIT_S) -> object:
    """Poll `check` until it answers something true; fail with `up`'s log after `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (value := check()):
            return value
        assert up.process is not None and up.process.returncode is None, f"up exited:\n{up.log()}"
        await asyncio.sleep(0.05)
    raise AssertionError(f"{what} within {timeout:.0f}s:\n{up.log()}")


@pytest.fixture
async def up(tmp_path: Path) -> AsyncIterator[Up]:
    running = Up(tmp_path / "data", free_port())
    await running.start()
    try:
        yield running
    finally:
        if running.process is not None and running.process.returncode is None:
            with_children = list(running.children())
            os.killpg(running.pid, signal.SIGKILL)
            await running.process.wait()
            for pid in with_children:
                if _alive(pid):
                    os.kill(pid, signal.SIGKILL)


class Statuses:
    def __init__(self) -> None:
        self.latest: dict[str, dict[str, object]] = {}

    async def on(self, message: object) -> None:
        status = json.loads(message.data)  # type: ignore[attr-defined]
        self.latest[status["name"]] = status


def one_gpu(name: str, count: int = 1) -> bytes:
    return json.dumps({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                       "metadata": {"name": name, "namespace": "team"},
                       "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                           "deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount",
                           "count": count}}]}}}).encode()


async def decided(js: object, statuses: Statuses, name: str, up: Up) -> None:
    await js.publish(subjects.submit("team"), one_gpu(name), headers={"Nats-Msg-Id": name})  # type: ignore[attr-defined]
    await until(lambda: statuses.latest.get(name, {}).get("state") == "Allocated", f"{name} allocated", up)


def metrics(up: Up) -> str:
    try:
        return httpx.get(f"{up.health}/metrics", timeout=5).text
    except httpx.HTTPError:
        return ""


async def test_up_decides_in_an_allocator_process_that_is_restarted_and_stopped_with_it(up: Up) -> None:
    nc = await up.bus()
    statuses = Statuses()
    await nc.subscribe(subjects.STATUS_ALL, cb=statuses.on)
    try:
        await until(lambda: len(up.allocators()) == 1 and len(up.estimators()) == 1,
                    "an allocator's process and an estimator's, niced", up)
        first = up.allocators()
        await decided(nc.jetstream(), statuses, "in-its-own-process", up)
        # start estimates come from a process of their own, at a lower priority: a claim that cannot fit
        # (16 GPUs: the demo's nodes have at most 8) gets its status with an estimate, null with its reason
        assert len(up.estimators()) == 1 and up.estimators()[0] not in up.allocators()
        await nc.jetstream().publish(subjects.submit("team"), one_gpu("never-fits", 16),  # type: ignore[attr-defined]
                                     headers={"Nats-Msg-Id": "never-fits"})
        await until(lambda: "estimatedStartReason" in statuses.latest.get("never-fits", {}),
                    "an estimate for a waiting claim", up)
        assert statuses.latest["never-fits"]["estimatedStart"] is None
        # the node map, from the fleet the API's process follows on the bus: every node, the claim's GPU taken
        api, token = ((up.data / name).read_text().strip() for name in ("api.url", "admin.token"))
        nodes = httpx.get(f"{api}/v1/nodes", headers={"Authorization": f"Bearer {token}"}, timeout=30).json()
        assert len(nodes) == 6 and sum(d.get("claim") is not None for n in nodes for d in n["devices"]) == 1, nodes
        # its decisions are counted in its process and served by `up`'s /metrics
        await until(lambda: 'claimbroker_decisions_total{state="Allocated"} 1.0' in metrics(up),
                    "the allocator's series in up's /metrics", up)
        assert metrics(up).count("# TYPE claimbroker_decisions_total counter") == 1

        os.kill(first[0], signal.SIGKILL)  # a crash: `up` starts it again
        await until(lambda: (now := up.allocators()) and now != first, "a new allocator process", up)
        await until(lambda: httpx.get(f"{up.health}/readyz", timeout=5).status_code == 200, "ready again", up)
        await decided(nc.jetstream(), statuses, "after-a-crash", up)
        assert "allocator" in up.log() and "restarting it" in up.log()
    finally:
        await nc.close()
    children = list(up.children())
    os.killpg(up.pid, signal.SIGINT)  # Ctrl-C in the terminal: every process of the group gets it
    assert up.process is not None
    assert await asyncio.wait_for(up.process.wait(), 30) == 0, up.log()
    assert not [pid for pid in children if _alive(pid)], "an allocator outlived its up"


async def test_a_killed_up_takes_its_processes_along(up: Up) -> None:
    await until(lambda: len(up.children()) == 2, "the allocator's and the estimator's processes", up)
    found = list(up.children())
    assert up.process is not None
    up.process.send_signal(signal.SIGKILL)
    await up.process.wait()
    deadline = time.monotonic() + 20
    while any(_alive(pid) for pid in found) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    outlived = [pid for pid in found if _alive(pid)]
    for pid in outlived:
        os.kill(pid, signal.SIGKILL)
    assert not outlived, "a process of up's outlived it"
