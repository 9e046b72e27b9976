"""`claimbroker whatif` against a running broker: the live fleet from the bus, the queue and quotas from the
ledger, a proposed drain and quota, and nothing written."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import yaml
from sqlalchemy import func, select

from services.bus.connection import connect
from services.bus.publish import publish_json
from services.runtime.stack import running_stack
from shared.contract import subjects
from shared.ledger.engine import sessions
from shared.ledger.schema import Claim, ClaimEvent
from shared.settings import BrokerSettings
from tests.builders import a_claim
from tests.e2e.test_cli import run

pytestmark = pytest.mark.e2e


async def test_a_drain_and_a_quota_on_the_live_broker_change_nothing(tmp_path: Path) -> None:
    settings = BrokerSettings(data_dir=tmp_path / "data")
    async with running_stack(settings, services=("watcher", "allocator")) as stack:
        assert stack.allocator is not None and await stack.allocator.wait_for_inventory(20)
        nc = await connect(stack.admin_url, name="test")
        try:
            for i in range(3):
                await publish_json(nc.jetstream(), subjects.submit("vision"),
                                   a_claim(f"c{i}", "vision").request(count=2).document(), msg_id=f"c{i}")
            async with sessions(stack.engine)() as s:
                for _ in range(400):
                    held = {n: node for n, node in (await s.execute(
                        select(Claim.name, Claim.node).where(Claim.state == "Allocated"))).all()}
                    # ended before the wait: on SQLite every transaction holds the write lock (BEGIN
                    # IMMEDIATE), and one kept open while waiting starved the allocator (19 s for 3 claims)
                    await s.rollback()
                    if len(held) == 3:
                        break
                    await asyncio.sleep(0.05)  # the allocator decides them
        finally:
            await nc.close()
        assert len(held) == 3
        node = sorted(held.values())[0]
        on_it = sorted(f"vision/{n}" for n, where in held.items() if where == node)
        quotas = tmp_path / "quotas.yaml"
        quotas.write_text(yaml.safe_dump({"kind": "Quotas", "tenants": [
            {"name": "vision", "quotas": {"H100": {"nominal": 0, "borrowingLimit": 0}}}]}))
        async with sessions(stack.engine)() as s:
            before = (await s.scalar(select(func.count()).select_from(ClaimEvent)),
                      await s.scalar(select(func.count()).select_from(Claim)))
        code, out, err = await run("--nats", stack.admin_url, "whatif", "--db", stack.db_url, "--drain", node,
                                   "-o", "json")
        assert code == 0, err
        answer = json.loads(out)
        assert [p["claim"] for p in answer["preempted"] if p["rule"] == "drain"] == on_it
        code, out, err = await run("--nats", stack.admin_url, "whatif", "--db", stack.db_url, "--quotas",
                                   str(quotas), "-o", "json")
        assert code == 0, err
        beyond = {c["claim"] for c in json.loads(out)["overQuota"]["claims"]}
        assert beyond <= {f"vision/{n}" for n in held} and all(c["flavor"] == "H100"
                                                              for c in json.loads(out)["overQuota"]["claims"])
        code, out, err = await run("--nats", stack.admin_url, "whatif", "--db", stack.db_url, "--drain", node)
        assert code == 0 and "SHARE NOW" in out and "drain" in out, err
        code, _, err = await run("--nats", stack.admin_url, "whatif", "--db", stack.db_url, "--drain", "no-such")
        assert code == 1 and "no node no-such" in err
        async with sessions(stack.engine)() as s:
            after = (await s.scalar(select(func.count()).select_from(ClaimEvent)),
                     await s.scalar(select(func.count()).select_from(Claim)))
        assert after == before  # nothing written


async def test_advise_mig_plans_a_layout_for_the_slices_that_wait(tmp_path: Path) -> None:
    """The built-in fleet has one H100 carved into seven 1g.10gb slices: an eighth slice waits, and the plan
    carves an idle whole GPU so that it would be admitted."""
    settings = BrokerSettings(data_dir=tmp_path / "data")
    profile = 'device.attributes["gpu.nvidia.com"].profile == "1g.10gb"'
    async with running_stack(settings, services=("watcher", "allocator")) as stack:
        assert stack.allocator is not None and await stack.allocator.wait_for_inventory(20)
        nc = await connect(stack.admin_url, name="test")
        try:
            for i in range(8):
                claim = a_claim(f"s{i}", "lab").request(cls="mig.nvidia.com", selectors=(profile,)).document()
                await publish_json(nc.jetstream(), subjects.submit("lab"), claim, msg_id=f"s{i}")
            async with sessions(stack.engine)() as s:
                for _ in range(200):
                    states = dict((await s.execute(select(Claim.name, Claim.state))).all())
                    await s.rollback()  # the write lock released before the wait, as above
                    if len(states) == 8 and "Allocated" in states.values() and "Pending" in states.values():
                        break
                    await asyncio.sleep(0.05)  # the allocator decides them
        finally:
            await nc.close()
        waiting = sorted(f"lab/{n}" for n, state in states.items() if state == "Pending")
        assert waiting, states
        code, out, err = await run("--nats", stack.admin_url, "advise", "mig", "--db", stack.db_url, "-o", "json")
        assert code == 0, err
        plan = json.loads(out)
        assert plan["gained"] == waiting and plan["layouts"]
        assert all(layout["now"] == "whole" for layout in plan["layouts"])  # idle whole GPUs, no running slice moved
        code, out, _ = await run("--nats", stack.admin_url, "advise", "mig", "--db", stack.db_url, "-o", "yaml")
        assert code == 0 and yaml.safe_load(out)["version"] == "v1"
        code, out, err = await run("--nats", stack.admin_url, "whatif", "--mig-plan", "--db", stack.db_url,
                                   "-o", "json")
        assert code == 0 and json.loads(out)["admitted"] == waiting, err  # the plan's effect, through whatif
