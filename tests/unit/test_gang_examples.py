"""The gang examples the docs run, run as the docs say: `simulate` on shared/workloads' files, with the outcome
the docs describe (so the docs cannot drift from what the broker does)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from services.cli import app

runner = CliRunner()
WORKLOADS = Path(__file__).resolve().parents[2] / "shared" / "workloads"


def simulate(*args: str) -> dict[str, str]:
    result = runner.invoke(app, ["simulate", *args, "-o", "json"])
    assert result.exit_code in (0, 4), result.output
    return {c["name"]: c["state"] for c in json.loads(result.stdout)["claims"]}


@pytest.mark.parametrize(("reserve_after", "gang", "small"), [
    ("0s", "Pending", "Allocated"),  # nlp's 1-GPU claims take each GPU as it frees: the gang starves
    ("5m", "Allocated", "Pending"),  # first in vision's order since 00:00: from 00:05 it keeps what frees
])
def test_gang_reserve_after_example(reserve_after: str, gang: str, small: str) -> None:
    folder = WORKLOADS / "gang-reserve"
    waves = [arg for i in range(1, 5) for arg in ("--claims", str(folder / f"wave-{i}.yaml"))]
    states = simulate("--inventory", str(folder / "fleet.yaml"), *waves, "--gang-reserve-after", reserve_after)
    assert (states["train-0"], states["train-1"]) == (gang, gang)
    assert {states[f"small-{i}"] for i in (9, 10, 11)} == {small}


def test_distributed_example_on_cliques() -> None:
    states = simulate("--inventory", str(WORKLOADS / "cliques.yaml"), "--claims", str(WORKLOADS / "distributed.yaml"))
    assert set(states.values()) == {"Allocated"} and len(states) == 2
