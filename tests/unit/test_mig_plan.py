"""The MIG re-layout planner: from waiting claims a profile would satisfy and the GPUs where nothing runs,
the layouts that admit them, valid for the GPU model, never moving a running slice."""

from __future__ import annotations

from typing import Any

from shared.admission.cycle import run_cycle
from shared.admission.mig_plan import WHOLE, plan_mig
from shared.admission.model import Running, Snapshot, Waiting
from shared.admission.quota import QuotaConfig
from shared.dra.classes import BUILTIN_CLASSES
from shared.dra.inventory import Fleet
from shared.fleet.sources import documents_from
from shared.fleet.topology import lookup_model
from tests.builders import a_claim


def topology_fleet(nodes: list[dict[str, Any]]) -> Fleet:
    docs = documents_from([{"kind": "Topology", "nodes": nodes}], "test")
    return Fleet.from_slices(docs.slices, docs.labels)


def slice_claim(name: str, profile: str, arrival: int) -> Waiting:
    claim = a_claim(name, "lab").request(cls="mig.nvidia.com", selectors=(
        f'device.attributes["gpu.nvidia.com"].profile == "{profile}"',)).build()
    return Waiting("lab", name, claim, 0, True, arrival)


def held(fleet: Fleet, claims: list[Waiting]) -> list[Running]:
    result = run_cycle(Snapshot(fleet, BUILTIN_CLASSES, QuotaConfig(), (), tuple(claims)))
    return [Running(d.tenant, d.name, d.decision.allocation, 0, True, i, i)
            for i, d in enumerate(result.decisions) if d.decision.allocation is not None]


def test_waiting_slices_get_a_layout_that_admits_them_without_moving_a_running_one() -> None:
    fleet = topology_fleet([{"name": "m", "gpuModel": "H100", "gpuCount": 3, "mig": {0: ["3g.40gb", "3g.40gb"]}}])
    running = held(fleet, [slice_claim("runs", "3g.40gb", 0)])  # one 3g slice of GPU 0 runs
    assert [r.allocation.node for r in running] == ["m"]
    waiting = [slice_claim(f"small-{i}", "1g.10gb", 10 + i) for i in range(5)] + [slice_claim("big", "3g.40gb", 20),
                                                                                   slice_claim("big2", "3g.40gb", 21)]
    plan = plan_mig(fleet, BUILTIN_CLASSES, QuotaConfig(), running, waiting)
    assert ("lab", "big") in plan.admits and all(("lab", f"small-{i}") in plan.gained for i in range(5))
    assert ("lab", "big") in plan.without  # the other 3g slice of GPU 0 was free already
    assert all(g.gpu != 0 for g in plan.layouts), "GPU 0 runs a slice: it is not re-laid"
    model = lookup_model("H100")
    for g in plan.layouts:  # every planned layout is one the topology can carve on this model
        assert g.planned == WHOLE or g.planned == "all-balanced" or any(
            g.planned == f"all-{p.name}" for p in model.profiles)
    config = plan.mig_parted()["mig-configs"]["claimbroker-m"]
    assert {tuple(entry["devices"]) for entry in config} == {(g.gpu,) for g in plan.layouts}
    assert all(entry["mig-enabled"] for entry in config)
    for g, entry in zip(plan.layouts, config, strict=True):  # what mig-parted would carve fits one GPU
        slices = sum(next(p.memory_slices for p in model.profiles if p.name == name) * n
                     for name, n in entry["mig-devices"].items())
        assert slices <= 8 and sum(entry["mig-devices"].values()) <= 7, (g, entry)


def test_nothing_waits_for_a_slice_nothing_changes() -> None:
    fleet = topology_fleet([{"name": "m", "gpuModel": "H100", "gpuCount": 2, "mig": {0: "all-1g.10gb"}}])
    whole = a_claim("whole", "lab").request().build()
    plan = plan_mig(fleet, BUILTIN_CLASSES, QuotaConfig(), [], [Waiting("lab", "whole", whole, 0, True, 1)])
    assert plan.layouts == [] and plan.admits == [("lab", "whole")]


def test_idle_slices_go_back_to_a_whole_gpu_when_a_whole_gpu_is_wanted() -> None:
    fleet = topology_fleet([{"name": "m", "gpuModel": "A100", "gpuCount": 1, "mig": {0: "all-1g.10gb"}}])
    whole = a_claim("whole", "lab").request().build()
    plan = plan_mig(fleet, BUILTIN_CLASSES, QuotaConfig(), [], [Waiting("lab", "whole", whole, 0, True, 1)])
    assert [(g.gpu, g.planned) for g in plan.layouts] == [(0, WHOLE)]
    assert plan.admits == [("lab", "whole")]
    assert plan.mig_parted()["mig-configs"] == {"claimbroker-m": [{"devices": [0], "mig-enabled": False}]}


def test_the_lab_fleet_gets_slices_for_its_waiting_1g_and_3g_claims() -> None:
    """The built-in mixed fleet: its MIG node's seven 1g.10gb slices run; more 1g.10gb and four 3g.40gb
    claims wait (two fit its free 3g slices). The plan admits them all, re-laying idle whole GPUs only,
    each layout one the model can carve."""
    from shared.fleet.sources import load_inventory

    docs = load_inventory([])
    lab = Fleet.from_slices(docs.slices, docs.labels)
    running = held(lab, [slice_claim(f"run-{i}", "1g.10gb", i) for i in range(7)])
    assert len(running) == 7
    waiting = [slice_claim(f"one-{i}", "1g.10gb", 10 + i) for i in range(3)] + [
        slice_claim(f"three-{i}", "3g.40gb", 20 + i) for i in range(4)]  # two fit the MIG node's 3g slices
    plan = plan_mig(lab, BUILTIN_CLASSES, QuotaConfig(), running, waiting)
    assert sorted(plan.admits) == sorted(w.key for w in waiting)
    assert len(plan.without) == 2 and len(plan.gained) == 5
    busy = {(r.allocation.node, int(r.allocation.keys[0][2].split("-")[1])) for r in running}
    assert all(g.now == WHOLE and (g.node, g.gpu) not in busy for g in plan.layouts)
    for g in plan.layouts:
        assert sum(g.planned == f"all-{p.name}" for p in lookup_model(g.model).profiles) == 1 \
            or g.planned == "all-balanced"
