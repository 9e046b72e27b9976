"""`claimbroker simulate`: waves through the same core, JSON as in the contract, clear errors on bad files."""

from __future__ import annotations

import json
import re
from importlib import resources
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from services.cli import app, globals_first

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


def test_every_printing_command_takes_o_yaml_and_refuses_an_unknown_format(tmp_path: Path) -> None:
    """The contract: -o/--output table|json|yaml; a format it does not know is a usage error, not a table."""
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(LAB_NODE)
    lab = tmp_path / "lab.yaml"
    lab.write_text(resources.files("shared.workloads").joinpath("lab.yaml").read_text())
    base = ["simulate", "--inventory", str(fleet), "--claims", str(lab)]
    as_yaml = runner.invoke(app, [*base, "-o", "yaml"])
    as_json = runner.invoke(app, [*base, "--output", "json"])
    assert as_yaml.exit_code == 0 and yaml.safe_load(as_yaml.output) == json.loads(as_json.output)
    refused = runner.invoke(app, [*base, "-o", "xml"])
    assert refused.exit_code == 2 and "must be table, json or yaml, not 'xml'" in refused.output
    for command in (["status"], ["token", "list"], ["quota", "list"], ["quota", "usage"], ["explain", "c"]):
        assert re.search(r"\s-o\s", runner.invoke(app, [*command, "--help"]).output), command


@pytest.mark.parametrize(("given", "moved"), [
    (["status", "--data-dir", "d", "--tenant", "t"], ["--data-dir", "d", "status", "--tenant", "t"]),
    (["--nats", "u", "status"], ["--nats", "u", "status"]),
    (["quota", "list", "--api=http://a", "-o", "json"], ["--api=http://a", "quota", "list", "-o", "json"]),
    (["up", "--nats", "u", "--db", "x"], ["--nats", "u", "up", "--db", "x"]),
    (["submit", "f", "--", "--token", "t"], ["submit", "f", "--", "--token", "t"]),
])
def test_global_options_are_accepted_after_the_command(given: list[str], moved: list[str]) -> None:
    assert globals_first(given) == moved


def test_simulate_says_which_claims_of_a_later_wave_reuse_a_name(tmp_path: Path) -> None:
    """Claims are immutable: a later wave's claim under a name the run has already is not applied, and the
    run says so on stderr (the JSON on stdout keeps the contract's shape)."""
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(LAB_NODE)
    first, again = tmp_path / "first.yaml", tmp_path / "again.yaml"
    claim = ("apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {{name: train, namespace: vision}}\n"
             "spec: {{devices: {{requests: [{{name: gpu,\n"
             "  exactly: {{deviceClassName: gpu.nvidia.com, count: {n}}}}}]}}}}\n")
    first.write_text(claim.format(n=1))
    again.write_text(claim.format(n=2))
    result = runner.invoke(app, ["simulate", "--inventory", str(fleet), "--claims", str(first), "--claims", str(again),
                                 "--output", "json"])
    assert result.exit_code == 0, result.output
    assert "wave 2: claim vision/train is not applied" in result.stderr
    [train] = json.loads(result.stdout)["claims"]
    assert len(train["allocation"]["devices"]["results"]) == 1  # the first one stands
