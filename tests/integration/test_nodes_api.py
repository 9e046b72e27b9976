"""GET /v1/nodes: every device of the fleet with its state, its holder shown only to who may see it."""

from __future__ import annotations

from dataclasses import replace

import httpx

from services.admin_api.app import create_app
from shared.dra.inventory import THROTTLED, Fleet
from shared.dra.model import DeviceCounterConsumption
from shared.ledger.engine import create_engine, migrate, sessions
from shared.ledger.schema import Claim, DeviceAllocation
from shared.ledger.tokens import create_token
from tests.builders import fleet, gpu, node


async def test_devices_with_their_state_and_holder_for_whom_may_see_it(ledger_url: str) -> None:
    await migrate(ledger_url)
    engine = create_engine(ledger_url)
    factory = sessions(engine)
    async with factory() as s, s.begin():
        train = Claim(namespace="vision", name="train", state="Allocated", spec={}, sequence=1, node="n1")
        s.add(train)
        await s.flush()
        s.add(DeviceAllocation(driver="gpu.nvidia.com", pool="n1", device="gpu-1", claim_id=train.id, node="n1",
                               request="gpu", flavor="H100", units=2.0))
    viewer = {"Authorization": f"Bearer {await create_token(factory, 'viewer', None)}"}
    speech = {"Authorization": f"Bearer {await create_token(factory, 'viewer', 'speech')}"}

    hot = replace(gpu("n3", 0, "H100", architecture="Hopper"), health=THROTTLED, temperature_c=91,
                  throttle_reasons=("HwThermalSlowdown",))
    slice_ = gpu("n3", 1, "H100", architecture="Hopper", type="mig", parentUUID="GPU-n3-0", profile="1g.10gb")
    carvable = replace(gpu("n3", 2, "H100", architecture="Hopper", type="mig", parentUUID="GPU-n3-0"),
                       consumes_counters=(DeviceCounterConsumption.model_validate(
                           {"counterSet": "gpu-0-counter-set", "counters": {"memory": {"value": "10Gi"}}}),))

    async def fleet_view() -> Fleet:
        return fleet(*node("n2", "A100", 1), *node("n1", "H100", 2), hot, slice_, carvable)

    transport = httpx.ASGITransport(app=create_app(engine, fleet=fleet_view))
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as api:
            seen = (await api.get("/v1/nodes", headers=viewer)).json()
            # grouped by generation (architecture and product), then by name; an unheld DynamicMIG
            # placement is not a device
            assert [(n["generation"], n["node"], [(d["name"], d["state"], d["tenant"]) for d in n["devices"]])
                    for n in seen] == [
                ("A100", "n2", [("gpu-0", "idle", None)]),
                ("H100", "n1", [("gpu-0", "idle", None), ("gpu-1", "allocated", "vision")]),
                ("Hopper H100", "n3", [("gpu-0", "throttled", None), ("gpu-1", "idle", None)])]
            hot_cell, slice_cell = seen[2]["devices"]
            assert (hot_cell["temperatureC"], hot_cell["throttleReasons"], hot_cell["kind"]) == (
                91, ["HwThermalSlowdown"], "gpu")
            assert (slice_cell["kind"], slice_cell["parent"], slice_cell["temperatureC"]) == ("mig", "gpu-0", None)
            scoped = (await api.get("/v1/nodes", headers=speech)).json()
            assert scoped[1]["devices"][1] == {**seen[1]["devices"][1], "tenant": None, "claim": None}
            assert "vision" not in str(scoped)
            assert (await api.get("/v1/nodes")).status_code == 401
    finally:
        await engine.dispose()
