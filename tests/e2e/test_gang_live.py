"""Gangs as a user meets them: `claimbroker up` (its own nats-server and SQLite) killed with SIGKILL between the
arrivals of two interleaved gangs' members, started again on the same data folder: the gang whose last member
came after the restart is admitted whole, the other holds nothing while it lacks members, and no claim is
lost."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.e2e
CLI = [sys.executable, "-m", "services.cli"]
DEADLINE_S = 60.0

# three nodes of 2 GPUs: one 2 x 2-GPU gang fits at a time
FLEET = "kind: Topology\nnodes:\n- {namePrefix: node-, count: 3, gpuModel: H100, gpuCount: 2}\n"


def member(gang: str, index: int) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": f"{gang}-{index}", "namespace": "ml",
                         "annotations": {"claimbroker.io/gang": gang, "claimbroker.io/gang-size": "2"}},
            "spec": {"devices": {"requests": [{"name": "gpus", "exactly": {
                "deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 2}}]}}}


async def cli(data: Path, *args: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(*CLI, "--data-dir", str(data), *args,
                                                   stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(process.communicate(), DEADLINE_S)
    return process.returncode or 0, out.decode(), err.decode()


@contextlib.asynccontextmanager
async def up(data: Path, inventory: Path) -> AsyncIterator[asyncio.subprocess.Process]:
    """`claimbroker up` until its banner's last line (the stack runs); killed with SIGKILL at the end unless the
    test killed it first."""
    process = await asyncio.create_subprocess_exec(*CLI, "--data-dir", str(data), "up", "--inventory", str(inventory),
                                                   "--api-port", "0", stdout=asyncio.subprocess.PIPE,
                                                   stderr=asyncio.subprocess.DEVNULL)
    try:
        assert process.stdout is not None
        banner = ""
        while "ledger" not in banner:
            line = (await asyncio.wait_for(process.stdout.readline(), DEADLINE_S)).decode()
            assert line, f"up ended before its banner: {banner}"
            banner += line
        yield process
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGKILL)
        await process.wait()


async def submit(data: Path, tmp_path: Path, *claims: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Submit and wait for each claim's first status."""
    file = tmp_path / f"{claims[0]['metadata']['name']}.yaml"
    file.write_text(yaml.safe_dump_all(claims))
    code, out, err = await cli(data, "submit", str(file), "--wait", "30", "-o", "json")
    assert code in (0, 4), err  # 4: some claim is not Allocated
    return {s["name"]: s for s in json.loads(out)}


async def statuses(data: Path, wanted: dict[str, str]) -> dict[str, dict[str, Any]]:
    """The tenant's latest statuses, once each claim in `wanted` is in its state (the gang's last member's
    arrival decides the others too)."""
    latest: dict[str, dict[str, Any]] = {}
    for _ in range(int(DEADLINE_S / 0.2)):
        code, out, err = await cli(data, "status", "--tenant", "ml", "-o", "json")
        assert code in (0, 4), err
        latest = {s["name"]: s for s in json.loads(out)}
        if all(latest.get(n, {}).get("state") == s for n, s in wanted.items()):
            return latest
        await asyncio.sleep(0.2)
    raise AssertionError(f"never {wanted}: {latest}")


async def test_a_killed_allocator_between_members_loses_nothing_and_splits_no_gang(tmp_path: Path) -> None:
    data, inventory = tmp_path / "data", tmp_path / "fleet.yaml"
    inventory.write_text(FLEET)
    async with up(data, inventory) as first:
        said = await submit(data, tmp_path, member("train-a", 0), member("train-b", 0))
        for name in ("train-a-0", "train-b-0"):
            assert said[name]["state"] == "Pending"
            assert said[name]["reason"].endswith(": 1 of 2 members received"), said[name]
        first.send_signal(signal.SIGKILL)  # the allocator dies with its members half arrived
        await first.wait()

    async with up(data, inventory):
        await submit(data, tmp_path, member("train-a", 1))  # train-a's last member, after the restart
        latest = await statuses(data, {"train-a-0": "Allocated", "train-a-1": "Allocated"})
        nodes = {latest[f"train-a-{i}"]["allocation"]["nodeName"] for i in (0, 1)}
        assert len(nodes) == 2  # 2 GPUs each on nodes of 2: two nodes
        waiting = latest["train-b-0"]
        assert waiting["state"] == "Pending" and waiting.get("allocation") is None
        assert waiting["reason"] == "gang train-b: 1 of 2 members received"

        # train-b complete: 4 GPUs, 2 free (one node): it waits whole, holding nothing
        said = await submit(data, tmp_path, member("train-b", 1))
        latest = await statuses(data, {"train-b-0": "Pending", "train-b-1": "Pending"})
        assert latest["train-b-0"]["reason"].startswith("gang train-b: member"), latest["train-b-0"]
        assert all(latest[f"train-b-{i}"].get("allocation") is None for i in (0, 1))

        code, _, err = await cli(data, "release", "--tenant", "ml", "train-a-0")
        assert code == 0, err
        latest = await statuses(data, {"train-b-0": "Allocated", "train-b-1": "Allocated", "train-a-0": "Released",
                                       "train-a-1": "Allocated"})
        devices = [(r["pool"], r["device"]) for s in latest.values() if s["state"] == "Allocated"
                   for r in s["allocation"]["devices"]["results"]]
        assert len(devices) == len(set(devices)) == 6  # the whole fleet, no device twice
