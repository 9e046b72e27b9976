"""The tenant's CLI against a running broker: submit --wait, status, release, as subprocesses."""

from __future__ import annotations

import asyncio
import json
import sys
from datetime import datetime, timedelta
from pathlib import Path

import pytest
import yaml

from services.natsio import EmbeddedNats
from services.stack import running_stack
from shared.settings import BrokerSettings
from tests.builders import a_claim
from tests.e2e.helpers import free_port

pytestmark = pytest.mark.e2e
CLI = [sys.executable, "-m", "services.cli"]


async def run(*args: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(*CLI, *args, stdout=asyncio.subprocess.PIPE,
                                                   stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(process.communicate(), 60)
    return process.returncode or 0, out.decode(), err.decode()


async def test_submit_wait_status_release(nats_server: EmbeddedNats, tmp_path: Path) -> None:
    settings = BrokerSettings(nats_url=nats_server.url, data_dir=tmp_path / "data")
    claims = tmp_path / "claims.yaml"
    claims.write_text(yaml.safe_dump_all([
        {**a_claim("one").request().document(), "metadata": {"name": "one"}},  # no namespace: --tenant
        a_claim("two", "vision").request(count=99).document(),
    ]))
    async with running_stack(settings, services=("watcher", "allocator")) as stack:
        assert stack.allocator is not None and await stack.allocator.wait_for_inventory(20)
        code, out, err = await run("--nats", nats_server.url, "submit", str(claims), "--tenant", "vision",
                                   "--wait", "20")
        assert code == 1 and "rejected: vision/two" in err, err  # a Rejected claim is a refusal: exit 1
        statuses = {s["name"]: s for s in map(json.loads, out.splitlines())}
        assert statuses["one"]["state"] == "Allocated" and statuses["one"]["namespace"] == "vision"
        assert statuses["two"]["state"] == "Rejected" and "over the claim limit of 32" in statuses["two"]["reason"]

        code, out, _ = await run("--nats", nats_server.url, "status", "--tenant", "vision", "--output", "json")
        assert code == 0 and {s["name"] for s in json.loads(out)} == {"one", "two"}

        code, _, err = await run("--nats", nats_server.url, "release", "one", "--tenant", "vision")
        assert code == 0, err
        for _ in range(100):
            code, out, _ = await run("--nats", nats_server.url, "status", "one", "--tenant", "vision",
                                     "--output", "json")
            if json.loads(out)[0]["state"] == "Released":
                break
        assert json.loads(out)[0]["state"] == "Released"

        # the same file again: "one" ended, so it is a new claim (not a JetStream duplicate of the first)
        code, out, err = await run("--nats", nats_server.url, "submit", str(claims), "--tenant", "vision",
                                   "--wait", "20")
        again = {s["name"]: s for s in map(json.loads, out.splitlines())}
        assert again["one"]["state"] == "Allocated" and again["one"]["sequence"] > statuses["one"]["sequence"]


async def test_without_a_nats_url_the_cli_says_so_instead_of_guessing(tmp_path: Path) -> None:
    code, out, err = await run("--data-dir", str(tmp_path / "none"), "status")
    assert code == 2 and out == ""
    assert err.startswith("no NATS URL") and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("command", [["submit", "CLAIMS"], ["status"], ["release", "one", "--tenant", "t"]])
async def test_an_unreachable_nats_is_one_line_and_a_bounded_wait(tmp_path: Path, command: list[str]) -> None:
    claims = tmp_path / "claims.yaml"
    claims.write_text(yaml.safe_dump(a_claim("one", "t").request().document()))
    url = f"nats://127.0.0.1:{free_port()}"  # nothing listens there
    started = asyncio.get_running_loop().time()
    code, _, err = await run("--nats", url, *[str(claims) if a == "CLAIMS" else a for a in command])
    assert code == 3 and err.startswith(f"claimbroker: cannot reach NATS at {url}")
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert asyncio.get_running_loop().time() - started < 10  # the interpreter's start included


async def test_a_nats_without_the_broker_is_refused_and_left_as_it_was(nats_server: EmbeddedNats,
                                                                      tmp_path: Path) -> None:
    from services.natsio import connect

    claims = tmp_path / "claims.yaml"
    claims.write_text(yaml.safe_dump(a_claim("one", "t").request().document()))
    code, _, err = await run("--nats", nats_server.url, "submit", str(claims))
    assert code == 3 and "has no claim-broker streams" in err and len(err.strip().splitlines()) == 1
    nc = await connect(nats_server.url, name="test")
    try:
        assert await nc.jetstream().streams_info() == []  # no streams created
    finally:
        await nc.close()


async def test_up_on_a_busy_api_port_stops_what_it_started_and_fails(tmp_path: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, _, err = await run("--data-dir", str(tmp_path / "data"), "up", "--api-port", str(port))
    assert code == 1, err
    assert f"cannot listen on 127.0.0.1:{port}" in err and "Traceback" not in err
    ports = list((tmp_path / "data" / "nats" / "ports").glob("*.ports"))  # the embedded server's, while it ran
    alive = [p for p in ports if Path(f"/proc/{p.stem.rsplit('_', 1)[1]}").exists()]
    assert not alive, "the embedded nats-server was left running"


async def test_token_create_needs_an_existing_ledger_and_creates_none(tmp_path: Path) -> None:
    data = tmp_path / "data"
    code, out, err = await run("--data-dir", str(data), "token", "create", "--role", "viewer")
    assert code == 3 and out == "" and "no ledger at" in err and "claimbroker migrate" in err
    assert not data.exists()
    code, _, err = await run("--data-dir", str(data), "migrate")
    assert code == 0, err
    code, out, err = await run("--data-dir", str(data), "token", "create", "--role", "viewer")
    assert code == 0 and out.startswith("cb_"), err


async def test_tokens_expire_are_listed_and_revoked(tmp_path: Path) -> None:
    data = str(tmp_path / "data")
    assert (await run("--data-dir", data, "migrate"))[0] == 0
    code, out, err = await run("--data-dir", data, "token", "create", "--role", "viewer", "--tenant", "vision",
                               "--ttl", "30d")
    assert code == 0 and out.startswith("cb_"), err
    code, _, err = await run("--data-dir", data, "token", "create", "--role", "viewer", "--ttl", "soon")
    assert code == 2 and "--ttl: invalid duration 'soon'" in err
    code, out, err = await run("--data-dir", data, "token", "list", "--output", "json")
    [listed] = json.loads(out)
    assert (listed["id"], listed["role"], listed["tenant"], listed["revokedAt"]) == (1, "viewer", "vision", None)
    created, expires = (datetime.fromisoformat(listed[k].replace("Z", "+00:00")) for k in ("createdAt", "expiresAt"))
    assert expires - created == timedelta(days=30) and "cb_" not in out
    code, out, _ = await run("--data-dir", data, "token", "revoke", "1")
    assert code == 0 and "revoked" in out
    code, _, err = await run("--data-dir", data, "token", "revoke", "7")
    assert code == 1 and "no token 7" in err
    code, out, _ = await run("token", "list", "--data-dir", data, "-o", "json")  # global options after it too
    assert json.loads(out)[0]["revokedAt"] is not None


async def test_submit_refuses_a_claim_of_another_namespace_than_tenant(tmp_path: Path) -> None:
    """As kubectl -n refuses an object of another namespace: nothing is published, so no NATS is needed."""
    claims = tmp_path / "claims.yaml"
    claims.write_text(yaml.safe_dump_all([a_claim("ok", "vision").request().document(),
                                          a_claim("other", "research").request().document()]))
    code, _, err = await run("--nats", f"nats://127.0.0.1:{free_port()}", "submit", str(claims), "--tenant", "vision")
    assert code == 2 and "'research', not --tenant 'vision'" in err and "nothing was submitted" in err


@pytest.mark.parametrize("command", [["migrate"], ["token", "create", "--role", "viewer"]])
async def test_an_unreachable_ledger_is_one_line_without_the_password(tmp_path: Path, command: list[str]) -> None:
    url = f"postgresql://postgres:secret@127.0.0.1:{free_port()}/ledger"  # nothing listens there
    code, out, err = await run("--data-dir", str(tmp_path), *command, "--db", url)
    assert code == 3 and out == "" and err.startswith("claimbroker: cannot reach the ledger at postgresql")
    assert len(err.strip().splitlines()) == 1 and "secret" not in err and "127.0.0.1:" in err


async def test_refusals_and_usage_errors_exit_as_the_contract_says(nats_server: EmbeddedNats, tmp_path: Path) -> None:
    settings = BrokerSettings(nats_url=nats_server.url, data_dir=tmp_path / "data")
    typo = tmp_path / "typo.yaml"
    typo.write_text(yaml.safe_dump({**a_claim("one", "vision").request().document(), "kind": "ResourceClam"}))
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing here\n")
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump(a_claim("one", "research").request().document()))
    cases = [  # (arguments, exit status, what stderr says)
        (["release", "nobody", "--tenant", "vision"], 1, "neither waiting nor allocated"),
        (["submit", str(typo)], 2, "document 1 is a 'ResourceClam', not a ResourceClaim: nothing was submitted"),
        (["submit", str(empty)], 2, "no ResourceClaim in it: nothing was submitted"),
        (["submit", str(other), "--tenant", "vision"], 2, "is in namespace 'research', not --tenant 'vision'"),
        (["status", "-o", "xml"], 2, "must be table, json or yaml"),
    ]
    async with running_stack(settings, services=("allocator",)):
        for arguments, status, said in cases:
            code, out, err = await run("--nats", nats_server.url, *arguments)
            assert (code, said in err, "Traceback" in err) == (status, True, False), (arguments, code, err)
    code, out, _ = await run("--version")
    assert code == 0 and out.startswith("claimbroker ")


async def test_status_reads_more_claims_than_one_direct_get_batch_answers(nats_server: EmbeddedNats) -> None:
    """A direct get batch answers 1,024 subjects at most: past that the stream is read in pages, and each
    claim still shows its newest status."""
    from services.cli import read_statuses
    from services.natsio import connect, encode, ensure_streams, publish_pipelined
    from shared.contract import subjects

    nc = await connect(nats_server.url, name="test")
    try:
        await ensure_streams(nc.jetstream())
        claims = [f"c{n}" for n in range(1100)]
        await publish_pipelined(nc.jetstream(), [
            (subjects.status("big", name), {"namespace": "big", "name": name, "state": "Pending", "sequence": 1},
             f"{name}-1") for name in claims])
        await publish_pipelined(nc.jetstream(), [
            (subjects.status("big", name), {"namespace": "big", "name": name, "state": "Allocated", "sequence": 2},
             f"{name}-2") for name in claims[::2]])
        await nc.jetstream().publish(subjects.status("other", "x"), encode({"namespace": "other", "name": "x",
                                                                            "state": "Pending", "sequence": 1}))
    finally:
        await nc.close()
    statuses = await read_statuses(nats_server.url, "big")
    assert len(statuses) == len(claims) and {s["namespace"] for s in statuses} == {"big"}
    assert {s["name"]: s["state"] for s in statuses} == {
        name: "Allocated" if number % 2 == 0 else "Pending" for number, name in enumerate(claims)}


async def test_status_watch_prints_again_as_a_status_arrives(nats_server: EmbeddedNats, tmp_path: Path) -> None:
    """`status --watch` reads the statuses, then follows them on a subscription: a new claim's status is
    printed without a poll."""
    from services.natsio import connect, encode, ensure_streams
    from shared.contract import subjects

    nc = await connect(nats_server.url, name="test")
    try:
        js = nc.jetstream()
        await ensure_streams(js)
        await js.publish(subjects.status("vision", "first"), encode(
            {"namespace": "vision", "name": "first", "state": "Allocated", "sequence": 1}))
        watch = await asyncio.create_subprocess_exec(*CLI, "--nats", nats_server.url, "status", "--watch",
                                                     "--tenant", "vision", "-o", "json",
                                                     stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        try:
            assert watch.stdout is not None

            async def printed() -> list[str]:
                text = ""
                while not text.rstrip().endswith("]"):  # one JSON list per print
                    text += (await asyncio.wait_for(watch.stdout.readline(), 30)).decode()
                return [s["name"] for s in json.loads(text)]

            assert await printed() == ["first"]
            await js.publish(subjects.status("vision", "second"), encode(
                {"namespace": "vision", "name": "second", "state": "Pending", "sequence": 1}))
            assert await printed() == ["first", "second"]
        finally:
            watch.kill()
            await watch.wait()
    finally:
        await nc.close()
