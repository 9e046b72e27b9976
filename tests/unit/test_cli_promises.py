"""What the CLI and the reasons promise a reader (issue 36): credentials masked in any text, CEL syntax errors
named with their place and the whole expression (a caret in a file check), a did-you-mean among the devices
the claim's class accepts, and explain's table readable."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from services.cli import app
from services.runtime.logs import mask_secrets, url_origin
from shared.dra.cel import SelectorError, compile_selector

runner = CliRunner()
A = 'device.attributes["gpu.nvidia.com"]'


@pytest.mark.parametrize(("text", "shown"), [
    ("nats://admin.local:s3cr%40t@127.0.0.1:4222", "nats://admin.local:***@127.0.0.1:4222"),
    ("at nats://u:p@ss@h:1/x, mail a@b", "at nats://u:***@h:1/x, mail a@b"),  # an unencoded '@' in it
    ("nats://u:p1@h1:4222,nats://u:p2@h2:4222", "nats://u:***@h1:4222,nats://u:***@h2:4222"),
    ("(postgresql+asyncpg://postgres:hunter2@db:5432/ledger)", "(postgresql+asyncpg://postgres:***@db:5432/ledger)"),
    ("nats://t0ken@h:4222", "nats://***@h:4222"),  # a NATS token is the secret itself
    ("postgresql://postgres@db/ledger", "postgresql://postgres@db/ledger"),  # a user alone is no secret
    ("host=db password=hunter2 user=x", "host=db password=*** user=x"),
    ("postgresql://db/ledger?user=u&password=hunter2", "postgresql://db/ledger?user=u&password=***"),
    ('{"password": "hunter2", "user": "u"}', '{"password": "***", "user": "u"}'),
    ("Authorization: Bearer cb_abc.DEF-1", "Authorization: Bearer ***"),
    ('password authentication failed for user "postgres"', 'password authentication failed for user "postgres"'),
    ("connect call failed ('127.0.0.1', 4222)", "connect call failed ('127.0.0.1', 4222)"),
])
def test_credentials_are_masked_wherever_they_are_in_a_text(text: str, shown: str) -> None:
    assert mask_secrets(text) == shown


def test_a_webhook_is_named_by_its_origin() -> None:
    """A Slack webhook's path is its secret: a log names the host."""
    assert url_origin("https://hooks.slack.com/services/T0/B0/XYZsecret") == "https://hooks.slack.com/..."
    assert url_origin("http://u:pw@alerts.example:8080") == "http://alerts.example:8080"


@pytest.mark.parametrize(("expression", "where", "what", "caret"), [
    ('device.driver == "x" &&& true', "line 1, column 24", "unexpected character '&'", (0, 23)),
    (f'{A}.productName == "H100" &&', "line 1, column 61", "the expression ends too early: a value is missing",
     (0, 60)),
    ('device.driver == "x" true', "line 1, column 22", "unexpected 'true': an operator is missing", (0, 21)),
    ('(device.driver == "x"', "line 1, column 22", "expected ')'", (0, 21)),
    ('device.driver == "abc', "line 1, column 18", "a string that is never closed", (0, 17)),
    (f'{A}.productName ==\n  "H100" )', "line 2, column 10", "unexpected ')'", (1, 9)),
    (f'{A}.?memory.orValue(0) > 1 &&& true', "line 1, column 62", "unexpected character '&'", (0, 61)),  # rewritten
])
def test_a_cel_syntax_error_is_named_with_its_place_and_the_whole_expression(
        expression: str, where: str, what: str, caret: tuple[int, int]) -> None:
    """One line for a status reason or an API's detail (it used to be a fragment lark cut at a token, with a
    caret on a second line); the caret form for a file check, under the right character."""
    with pytest.raises(SelectorError) as refused:
        compile_selector(expression)
    message = str(refused.value)
    assert "\n" not in message and message.startswith(f"CEL compile error: syntax error at {where}: ")
    assert what in message and message.endswith(f", in: {' '.join(expression.splitlines())}")
    row, column = caret
    shown = ["  " + line for line in expression.splitlines()]
    assert refused.value.pointed.splitlines() == [message.split(", in: ")[0], *shown[:row + 1],
                                                  "  " + " " * column + "^", *shown[row + 1:]]
    with pytest.raises(SelectorError) as again:  # from the cache: the same words
        compile_selector(expression)
    assert (str(again.value), again.value.pointed) == (message, refused.value.pointed)


def test_a_long_expression_is_quoted_around_its_error() -> None:
    expression = " || ".join([f'{A}.productName == "H{n}"' for n in range(40)]) + " ||| true"
    with pytest.raises(SelectorError) as refused:
        compile_selector(expression)
    message = str(refused.value)
    assert message.endswith("||| true") and "..." in message and len(message) < 500


LAB = """kind: Topology
nodes:
- {name: node-01, gpuModel: A100, gpuCount: 2}
- {name: node-06, gpuModel: H100, gpuCount: 2, mig: {0: "all-1g.10gb", 1: ["3g.40gb", "3g.40gb"]}}
"""


def test_a_quotas_file_with_a_cel_syntax_error_shows_the_caret(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(LAB)
    claims = tmp_path / "claims.yaml"
    claims.write_text("")
    quotas = tmp_path / "quotas.yaml"
    quotas.write_text(f"kind: Quotas\nflavors:\n- name: H100\n  selector: '{A}.productName == \"H100\" &&& true'\n")
    result = runner.invoke(app, ["simulate", "--inventory", str(fleet), "--claims", str(claims),
                                 "--quotas", str(quotas)])
    assert result.exit_code == 1
    assert result.output.splitlines()[-3:] == [
        f"{quotas}: flavors[0].selector: CEL compile error: syntax error at line 1, column 61: unexpected "
        "character '&': a value is missing",
        f'  {A}.productName == "H100" &&& true',
        "  " + " " * 60 + "^"]


def _reasons(tmp_path: Path, *selectors: str, cls: str = "gpu.nvidia.com") -> list[str]:
    from tests.builders import a_claim

    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(LAB)
    claims = tmp_path / "claims.yaml"
    claims.write_text("\n---\n".join(json.dumps(a_claim(f"c{n}", "t").request(cls=cls, selectors=(s,)).document())
                                      for n, s in enumerate(selectors)))
    result = runner.invoke(app, ["simulate", "--inventory", str(fleet), "--claims", str(claims), "-o", "json"])
    assert result.exit_code == 0, result.output
    return [c["reason"] for c in sorted(json.loads(result.output)["claims"], key=lambda c: c["name"])]


def test_did_you_mean_looks_only_at_the_devices_the_class_accepts(tmp_path: Path) -> None:
    """Every H100 of the fleet is cut into MIG slices: a gpu.nvidia.com claim for "H100" matches nothing,
    and the slices' "H100" (which the class excludes) used to silence the hint."""
    h100, a10, typo = _reasons(tmp_path, f'{A}.productName == "H100"', f'{A}.productName == "A10"',
                               f'{A}.productName == "H10"')
    assert h100.endswith("gpu.nvidia.com/productName is never 'H100' among gpu.nvidia.com devices (it is on 9 "
                         "devices of class mig.nvidia.com); did you mean 'A100'?")
    assert a10.endswith("gpu.nvidia.com/productName is never 'A10' among gpu.nvidia.com devices; did you mean "
                        "'A100'?")
    assert typo.endswith("is never 'H10' among gpu.nvidia.com devices; did you mean 'A100'?")
    mig, = _reasons(tmp_path, f'{A}.productName == "A100"', cls="mig.nvidia.com")  # no A100 is cut into slices
    assert mig.endswith("is never 'A100' among mig.nvidia.com devices (it is on 2 devices of class "
                        "gpu.nvidia.com); did you mean 'H100'?")


def test_explain_reads_as_sentences_and_tables() -> None:
    from services.cli.admin import explanation_lines, explanation_tables

    result: dict[str, Any] = {
              "namespace": "vision", "name": "big", "state": "Pending", "reason": "Insufficient nvidia.com/gpu",
              "explain": {"state": "Pending", "reason": "Insufficient nvidia.com/gpu", "unsatisfiable": False,
                          "tenant": {"name": "vision", "unitsInUse": 2.0, "weight": 1, "share": 0.1},
                          "priority": 5, "flavors": ["H100", "H200"],
                          "quota": [{"flavor": "H100", "requested": 4, "nominal": 2, "used": 2, "borrowingLimit": 0,
                                     "lendable": 0, "borrowedBy": {"research": 2}, "why": "over nominal"}],
                          "capacity": [{"request": "gpu", "requested": 4, "matching": 10, "free": 3,
                                        "mostFreeOnOneNode": 2, "mostOnOneNode": 8, "nodes": 2,
                                        "unavailable": {"in use": 7}}],
                          "preemption": {"candidates": 0, "outcome": "nothing runs that could be preempted"},
                          "toAdmit": ["raise vision's H100 borrowingLimit from 0 to 4"]}}
    assert explanation_lines(result) == [
        "vision/big: Pending", "reason: Insufficient nvidia.com/gpu",
        "tenant: vision (units in use 2.0, weight 1, share 0.1)", "priority: 5", "flavors it accepts: H100, H200",
        "preemption: 0 preemptible claim(s) running; nothing runs that could be preempted",
        "to admit it:", "  - raise vision's H100 borrowingLimit from 0 to 4"]
    (quota_columns, quotas), (capacity_columns, capacity) = explanation_tables(result["explain"])
    assert quotas == [["H100", 4, 2, 2, 0, "research (2)", "over nominal"]]
    assert capacity == [["gpu", 4, 10, 3, 2, 2, "7 in use"]]
    assert explanation_lines({**result, "explain": None})[-1] == "no structured explanation recorded"
    gang = {"name": "train", "size": 4, "received": 3, "members": ["w0", "w1", "w2"], "rejected": ["w3"],
            "topology": {"key": "nvidia.com/gpu.clique", "mode": "required", "waitSeconds": 0, "values": 2,
                         "mostFree": [{"value": "c1", "free": 24, "nodes": 3}, {"value": "c2", "free": 8, "nodes": 1}]}}
    assert explanation_lines({**result, "explain": {**result["explain"], "gang": gang}})[5] == (
        "gang: train, 3 of 4 members received (w0, w1, w2); Rejected: w3; on one nvidia.com/gpu.clique (required): "
        "most free 24 on c1, 8 on c2")


def test_whatif_checks_its_files_before_it_reads_the_bus(tmp_path: Path) -> None:
    """A proposed Quotas file with a syntax error: the caret form, exit 1, and no NATS needed to say so; a
    file that is not there: a usage error."""
    quotas = tmp_path / "quotas.yaml"
    quotas.write_text(f"kind: Quotas\nflavors:\n- name: H100\n  selector: '{A}.productName = \"H100\"'\n")
    result = runner.invoke(app, ["--nats", "nats://127.0.0.1:1", "whatif", "--quotas", str(quotas)])
    assert result.exit_code == 1 and "unexpected character '='" in result.output
    assert result.output.splitlines()[-1] == "  " + " " * len(f"{A}.productName ") + "^"
    result = runner.invoke(app, ["--nats", "nats://127.0.0.1:1", "whatif", "--quotas", str(tmp_path / "none")])
    assert result.exit_code == 2
