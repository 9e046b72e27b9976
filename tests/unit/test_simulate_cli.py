"""`claimbroker simulate`: waves through the same core, JSON as in the contract, clear errors on bad files."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

from typer.testing import CliRunner

from services.cli import app

runner = CliRunner()
LAB_NODE = """kind: Topology
nodes:
- {name: node-01, gpuModel: A100, gpuCount: 4}
- {name: node-02, gpuModel: H100, gpuCount: 2}
"""


def test_simulate_lab_waves(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(LAB_NODE)
    lab = tmp_path / "lab.yaml"
    lab.write_text(resources.files("shared.workloads").joinpath("lab.yaml").read_text())
    broken = tmp_path / "broken.yaml"
    broken.write_text("apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: bad}\n"
                      "spec: {devices: 3}\n")
    result = runner.invoke(app, ["simulate", "--inventory", str(fleet), "--claims", str(lab), "--claims", str(broken),
                                 "--output", "json"])
    assert result.exit_code == 0, result.output
    claims = {c["name"]: c for c in json.loads(result.output)["claims"]}
    assert [claims[f"gpu-greedy-{i}"]["state"] for i in range(1, 7)] == ["Allocated"] * 4 + ["Pending"] * 2
    assert claims["gpu-greedy-5"]["reason"] == "Insufficient nvidia.com/gpu: requested 1, free 0 of 4 on 1 node"
    assert claims["training-gpu"]["allocation"]["nodeName"] == "node-02"
    assert claims["training-gpu"]["allocation"]["devices"]["results"] == [
        {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-02", "device": "gpu-0"}]
    assert claims["bad"]["state"] == "Rejected" and "spec.devices" in claims["bad"]["reason"]


def test_simulate_refuses_an_unreadable_inventory_by_name(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("kind: Topology\nnodes:\n- {name: n1, gpuModel: T4, gpuCount: 1}\n")
    claims = tmp_path / "claims.yaml"
    claims.write_text("")
    result = runner.invoke(app, ["simulate", "--inventory", str(fleet), "--claims", str(claims)])
    assert result.exit_code == 1
    assert "fleet.yaml: document 1 (Topology): gpuModel 'T4' is not a known GPU" in result.output
