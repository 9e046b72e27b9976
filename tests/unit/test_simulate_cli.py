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


CLOCK_FLEET = "kind: Topology\nnodes:\n- {name: node-01, gpuModel: H100, gpuCount: 2}\n"
CLOCK_QUOTAS = """kind: Quotas
cohorts: [{name: lab}]
tenants:
- {name: vision, cohort: lab, minRuntime: 30m, quotas: {H100: {nominal: 0}}}
- {name: nlp, cohort: lab, quotas: {H100: {nominal: 2}}}
"""
CLOCK_CLAIM = ("apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {{name: {name}, namespace: {tenant}}}\n"
               "spec: {{devices: {{requests: [{{name: gpu, exactly: {{deviceClassName: gpu.nvidia.com, "
               "count: {n}}}}}]}}}}\n")


def test_simulate_scripts_time_with_advance_and_release(tmp_path: Path) -> None:
    """vision borrows nlp's GPUs at 00:00 with a minRuntime of 30m: nlp's claim at 00:10 waits, and reclaims
    them at 00:30, within the hour the third wave lets pass; a Release of a claim that is not there is said
    on stderr and the run goes on."""
    files = {"fleet.yaml": CLOCK_FLEET, "quotas.yaml": CLOCK_QUOTAS,
             "w1.yaml": CLOCK_CLAIM.format(name="borrow", tenant="vision", n=2),
             "w2.yaml": "kind: Advance\nduration: 10m\n---\n" + CLOCK_CLAIM.format(name="own", tenant="nlp", n=1),
             "w3.yaml": "{kind: Advance, duration: 1h}\n---\n{kind: Release, namespace: vision, name: gone}\n"}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    base = ["simulate", "--inventory", str(tmp_path / "fleet.yaml"), "--quotas", str(tmp_path / "quotas.yaml"),
            "--claims", str(tmp_path / "w1.yaml"), "--claims", str(tmp_path / "w2.yaml"), "--output", "json"]
    waiting = runner.invoke(app, base)
    assert waiting.exit_code == 0, waiting.output
    claims = {c["name"]: c for c in json.loads(waiting.stdout)["claims"]}
    assert (claims["borrow"]["state"], claims["own"]["state"]) == ("Allocated", "Pending")
    assert "reclaim preemption of vision's claims possible from 00:30:00 UTC" in claims["own"]["reason"]
    later = runner.invoke(app, [*base, "--claims", str(tmp_path / "w3.yaml")])
    assert later.exit_code == 0, later.output
    out = json.loads(later.stdout)
    assert {c["name"]: c["state"] for c in out["claims"]} == {"borrow": "Pending", "own": "Allocated"}
    assert [(e["claim"], e["by"], e["rule"]) for e in out["events"]] == [("vision/borrow", "nlp/own", "reclaim")]
    assert "wave 3: Release of vision/gone changes nothing" in later.stderr


@pytest.mark.parametrize(("document", "message"), [
    ("{kind: Advance, duration: soon}", "document 2 (Advance): duration: invalid duration 'soon'"),
    ("{kind: Release, namespace: vision}", "document 2 (Release): name: required"),
])
def test_simulate_refuses_an_invalid_advance_or_release_by_name(tmp_path: Path, document: str, message: str) -> None:
    (tmp_path / "fleet.yaml").write_text(CLOCK_FLEET)
    wave = tmp_path / "wave.yaml"
    wave.write_text(CLOCK_CLAIM.format(name="one", tenant="vision", n=1) + "---\n" + document + "\n")
    result = runner.invoke(app, ["simulate", "--inventory", str(tmp_path / "fleet.yaml"), "--claims", str(wave)])
    assert result.exit_code == 1
    assert f"wave.yaml: {message}" in result.stderr


def test_simulate_min_runtime_is_the_default_for_tenants_without_their_own(tmp_path: Path) -> None:
    """The contract: the broker-wide minRuntime is 0 in simulate unless --min-runtime gives it."""
    quotas = CLOCK_QUOTAS.replace("minRuntime: 30m, ", "")
    files = {"fleet.yaml": CLOCK_FLEET, "quotas.yaml": quotas,
             "w1.yaml": CLOCK_CLAIM.format(name="borrow", tenant="vision", n=2),
             "w2.yaml": CLOCK_CLAIM.format(name="own", tenant="nlp", n=1)}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    base = ["simulate", "--inventory", str(tmp_path / "fleet.yaml"), "--quotas", str(tmp_path / "quotas.yaml"),
            "--claims", str(tmp_path / "w1.yaml"), "--claims", str(tmp_path / "w2.yaml"), "-o", "json"]
    states = {}
    for extra in ([], ["--min-runtime", "5m"]):
        result = runner.invoke(app, [*base, *extra])
        assert result.exit_code == 0, result.output
        states[bool(extra)] = {c["name"]: c["state"] for c in json.loads(result.stdout)["claims"]}
    assert states == {False: {"borrow": "Pending", "own": "Allocated"},
                      True: {"borrow": "Allocated", "own": "Pending"}}
    refused = runner.invoke(app, [*base, "--min-runtime", "soon"])
    assert refused.exit_code == 2 and "invalid duration 'soon'" in refused.output


def test_simulate_takes_gang_reserve_after_as_a_duration(tmp_path: Path) -> None:
    """The contract: the broker-wide gangReserveAfter is 0 in simulate unless --gang-reserve-after gives it."""
    fleet, claims = tmp_path / "fleet.yaml", tmp_path / "w1.yaml"
    fleet.write_text(CLOCK_FLEET)
    claims.write_text(CLOCK_CLAIM.format(name="one", tenant="vision", n=1))
    base = ["simulate", "--inventory", str(fleet), "--claims", str(claims), "-o", "json"]
    accepted = runner.invoke(app, [*base, "--gang-reserve-after", "5m"])
    assert accepted.exit_code == 0, accepted.output
    assert [c["state"] for c in json.loads(accepted.stdout)["claims"]] == ["Allocated"]
    refused = runner.invoke(app, [*base, "--gang-reserve-after", "soon"])
    assert refused.exit_code == 2 and "invalid duration 'soon'" in refused.output
