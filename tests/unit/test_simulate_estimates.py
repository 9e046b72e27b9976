"""simulate gives each claim still Pending at the end its estimatedStart on the simulated clock (contract:
{"p50", "p90", "blockedBy"} or null), through `run_waves` and the CLI, with Advance and Release documents."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from services.cli import app
from services.cli.claims import eta_text
from shared.admission.estimate_text import first_clause
from shared.admission.estimates import HORIZON, UNSATISFIABLE, beyond_horizon
from shared.admission.simulate import run_waves
from shared.admission.wave_documents import Advance, Release, WaveItem
from shared.dra.classes import BUILTIN_CLASSES
from tests.builders import a_claim, fleet, node

FOUR = fleet(*node("n1", "H100", 4))


def claim(name: str, tenant: str = "vision", count: int = 1, runtime: str | None = None,
          preemptible: bool = True) -> Any:
    builder = a_claim(name, tenant).request(count=count)
    if runtime is not None:
        builder.annotations["claimbroker.io/expected-runtime"] = runtime
    if not preemptible:
        builder.annotations["claimbroker.io/preemptible"] = "false"
    return builder.build()


BUSY = [claim(f"busy-{i}", "lab", runtime=f"{m}m", preemptible=False) for i, m in enumerate((10, 20, 30, 40))]


@dataclass
class Row:
    waves: list[list[WaveItem]]
    estimated: dict[str, Any]  # tenant/name -> its estimatedStart as JSON
    states: dict[str, str] = field(default_factory=dict)


ROWS = {
    "a-2-gpu-claim-behind-four-busy-gpus": Row(
        [BUSY, [claim("two", count=2)]],
        {"vision/two": {"p50": "2026-01-01T00:20:00Z", "p90": "2026-01-01T00:20:00Z",
                        "blockedBy": ["lab/busy-0", "lab/busy-1"]}}),
    "a-release-at-00-05-brings-it-to-busy-0-s-end": Row(
        [BUSY, [claim("two", count=2)], [Advance(300), Release("lab", "busy-1")]],
        {"vision/two": {"p50": "2026-01-01T00:10:00Z", "p90": "2026-01-01T00:10:00Z", "blockedBy": ["lab/busy-0"]}},
        {"lab/busy-1": "Released", "vision/two": "Pending"}),
    "a-claim-past-its-expected-end-is-taken-to-end-now": Row(
        [BUSY, [claim("two", count=2)], [Advance(900)]],
        {"vision/two": {"p50": "2026-01-01T00:20:00Z", "p90": "2026-01-01T00:20:00Z",
                        "blockedBy": ["lab/busy-0", "lab/busy-1"]}}),
    "without-expected-runtimes-nothing-can-be-said": Row(
        [[claim(f"held-{i}", "lab", preemptible=False) for i in range(4)], [claim("two", count=2)]],
        {"vision/two": None}),
    "allocated-claims-carry-no-estimate": Row([BUSY], {}),
}


@pytest.mark.parametrize("row", ROWS.values(), ids=ROWS.keys())
def test_pending_claims_get_estimated_start(row: Row) -> None:
    out = run_waves(FOUR, BUILTIN_CLASSES, row.waves).to_json()
    claims = {f"{c['namespace']}/{c['name']}": c for c in out["claims"]}
    estimated = {k: c["estimatedStart"] for k, c in claims.items() if "estimatedStart" in c}
    assert estimated == row.estimated
    assert all(c["state"] == "Pending" for k, c in claims.items() if k in estimated)
    for key, state in row.states.items():
        assert claims[key]["state"] == state


def test_a_null_estimate_says_why() -> None:
    held = [claim(f"held-{i}", "lab", preemptible=False) for i in range(4)]
    out = run_waves(FOUR, BUILTIN_CLASSES, [held, [claim("two", count=2), claim("huge", count=8)]]).to_json()
    claims = {c["name"]: c for c in out["claims"]}
    assert (claims["two"]["estimatedStart"], claims["huge"]["estimatedStart"]) == (None, None)
    assert claims["two"]["estimatedStartReason"] == beyond_horizon(HORIZON), (
        "nothing running has a known runtime: it says what would let an estimate be said")
    assert claims["huge"]["estimatedStartReason"] == UNSATISFIABLE, "8 GPUs of a fleet of 4"
    valued = run_waves(FOUR, BUILTIN_CLASSES, [BUSY, [claim("two", count=2)]]).to_json()
    assert [c for c in valued["claims"] if "estimatedStartReason" in c] == [], "only a null has a reason"


def test_estimates_can_be_left_out() -> None:
    out = run_waves(FOUR, BUILTIN_CLASSES, [BUSY, [claim("two", count=2)]], estimates=False).to_json()
    assert [c.get("estimatedStart") for c in out["claims"] if c["state"] == "Pending"] == [None]


CLAIM = ("apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata:\n  name: {name}\n  namespace: {tenant}\n"
         "  annotations: {{claimbroker.io/expected-runtime: {runtime}, claimbroker.io/preemptible: \"false\"}}\n"
         "spec: {{devices: {{requests: [{{name: gpu, exactly: {{deviceClassName: gpu.nvidia.com, count: {n}}}}}]}}}}\n")


def test_simulate_prints_an_eta_column_and_estimated_start(tmp_path: Path) -> None:
    """Four busy GPUs ending at 10, 20, 30 and 40 minutes; wave 2 lets 5 minutes pass, releases busy-1 and a
    2-GPU claim arrives: it expects to start at 00:10, when busy-0 ends."""
    runner = CliRunner()
    (tmp_path / "fleet.yaml").write_text("kind: Topology\nnodes:\n- {name: node-01, gpuModel: H100, gpuCount: 4}\n")
    (tmp_path / "w1.yaml").write_text("---\n".join(
        CLAIM.format(name=f"busy-{i}", tenant="lab", runtime=f"{m}m", n=1) for i, m in enumerate((10, 20, 30, 40))))
    (tmp_path / "w2.yaml").write_text("{kind: Advance, duration: 5m}\n---\n{kind: Release, namespace: lab, "
                                      "name: busy-1}\n---\n" + CLAIM.format(name="two", tenant="vision", runtime="1h",
                                                                            n=2)
                                      + "---\n" + CLAIM.format(name="eight", tenant="vision", runtime="1h", n=8))
    base = ["simulate", "--inventory", str(tmp_path / "fleet.yaml"), "--claims", str(tmp_path / "w1.yaml"),
            "--claims", str(tmp_path / "w2.yaml")]
    as_json = runner.invoke(app, [*base, "-o", "json"])
    assert as_json.exit_code == 0, as_json.output
    claims = {c["name"]: c for c in json.loads(as_json.stdout)["claims"]}
    assert claims["two"]["estimatedStart"] == {"p50": "2026-01-01T00:10:00Z", "p90": "2026-01-01T00:10:00Z",
                                               "blockedBy": ["lab/busy-0"]}
    assert "estimatedStart" not in claims["busy-0"]
    table = runner.invoke(app, [*base, "-o", "table"], terminal_width=250)
    assert table.exit_code == 0, table.output
    header = next(line for line in table.stdout.splitlines() if "TENANT" in line)
    assert "ETA" in header
    row = next(line for line in table.stdout.splitlines() if " two " in line)
    assert "2026-01-01T00:10:00Z (2026-01-01T00:10:00Z)" in row
    why = claims["eight"]["estimatedStartReason"]  # more GPUs than the node has: null, with the reason
    assert claims["eight"]["estimatedStart"] is None and why
    row = next(line for line in table.stdout.splitlines() if " eight " in line)
    assert "none: no device" in row  # its gist in the cell (which wraps), the whole of it in -o json
    assert eta_text(None, why) == f"none: {first_clause(why)}"
