"""The tenant's CLI against a running broker: submit --wait, status, release, as subprocesses."""

from __future__ import annotations

import asyncio
import json
import sys
from datetime import datetime, timedelta
from pathlib import Path

import pytest
import yaml

from services.bus.embedded import EmbeddedNats
from services.runtime.stack import running_stack
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
    from services.bus.connection import connect

    claims = tmp_path / "claims.yaml"
    claims.write_text(yaml.safe_dump(a_claim("one", "t").request().document()))
    code, _, err = await run("--nats", nats_server.url, "submit", str(claims))
    assert code == 3 and "has no claim-broker streams" in err and len(err.strip().splitlines()) == 1
    nc = await connect(nats_server.url, name="test")
    try:
        assert await nc.jetstream().streams_info() == []  # no streams created
    finally:
        await nc.close()


async def test_up_on_a_busy_api_port_says_so_first_and_creates_nothing(tmp_path: Path) -> None:
    """The port is checked before anything starts: no data folder, no ledger, no admin token, no nats-server;
    one line that names the option to change (it used to start everything, create a token, then print
    "admin API None")."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, out, err = await run("--data-dir", str(tmp_path / "data"), "up", "--api-port", str(port))
    assert code == 2 and out == "", err
    assert err.strip() == (f"claimbroker: the admin API cannot listen on 127.0.0.1:{port} (the port is in use): "
                           "pass --api-port with a free port (0: any)")
    assert not (tmp_path / "data").exists()  # nothing created: no ledger, no token, no embedded server's store


async def test_token_create_needs_an_existing_ledger_and_creates_none(tmp_path: Path) -> None:
    data = tmp_path / "data"
    code, out, err = await run("--data-dir", str(data), "token", "create", "--role", "viewer")
    assert code == 3 and out == "" and "no ledger at" in err and "claimbroker migrate" in err
    assert not data.exists()
    code, _, err = await run("--data-dir", str(data), "migrate")
    assert code == 0, err
    code, out, err = await run("--data-dir", str(data), "token", "create", "--role", "viewer")
    assert code == 0 and out.startswith("cb_"), err


async def test_commands_that_do_one_thing_print_it_as_asked(tmp_path: Path) -> None:
    """-o on the commands that print one line: the same as a document."""
    data = str(tmp_path / "data")
    code, out, err = await run("--data-dir", data, "migrate", "-o", "json")
    assert code == 0 and json.loads(out)["atHead"] is True and ".db" in json.loads(out)["ledger"], err
    code, out, err = await run("--data-dir", data, "token", "create", "--role", "viewer", "-o", "yaml")
    created = yaml.safe_load(out)
    assert code == 0 and created["token"].startswith("cb_") and created["role"] == "viewer", err
    code, out, err = await run("--data-dir", data, "token", "revoke", "1", "-o", "json")
    assert code == 0 and json.loads(out) == {"id": 1, "revoked": True}, err
    code, out, err = await run("--data-dir", data, "token", "revoke", "1", "-o", "table")
    assert code == 0 and "REVOKED" in out, err
    code, out, err = await run("--data-dir", data, "token", "create", "--role", "viewer", "-o", "xml")
    assert code == 2 and out == "" and _one_line(err)


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
    from services.bus.connection import connect
    from services.bus.publish import encode, publish_pipelined
    from services.bus.streams import ensure_streams
    from services.cli import read_statuses
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
    from services.bus.connection import connect
    from services.bus.publish import encode
    from services.bus.streams import ensure_streams
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


def _one_line(err: str) -> bool:
    return len(err.strip().splitlines()) == 1 and "Traceback" not in err


async def test_exit_statuses_and_outputs_of_the_claim_commands(nats_server: EmbeddedNats, tmp_path: Path) -> None:
    """The contract's promises, one row each: 0 for a claim Allocated or Pending, 1 for a Rejected or unknown
    claim, 2 for usage (options checked before anything is sent), -o on every command that prints, and one
    line on stderr for every error."""
    from services.bus.connection import connect
    from shared.contract import subjects

    settings = BrokerSettings(nats_url=nats_server.url, data_dir=tmp_path / "data")
    claims = tmp_path / "claims.yaml"
    claims.write_text(yaml.safe_dump_all([a_claim("waits", "vision").request().document(),  # no fleet: Pending
                                          a_claim("wrong", "vision").request(count=99).document()]))  # Rejected
    fresh = tmp_path / "fresh.yaml"
    fresh.write_text(yaml.safe_dump({**a_claim("fresh").request().document(), "metadata": {"name": "fresh"}}))
    nc = await connect(nats_server.url, name="test")

    async def published() -> int:
        return int((await nc.jetstream().stream_info(subjects.CLAIMS_STREAM)).state.last_seq)

    async with running_stack(settings, services=("allocator",)):
        code, out, err = await run("--nats", nats_server.url, "submit", str(claims), "--wait", "20", "-o", "json")
        assert code == 1 and _one_line(err) and "rejected: vision/wrong" in err  # a Rejected claim: exit 1
        assert {s["name"]: s["state"] for s in json.loads(out)} == {"waits": "Pending", "wrong": "Rejected"}

        def states(out: str) -> list[str]:
            return [s["state"] for s in yaml.safe_load(out)]

        cases = [  # (arguments, exit status, what stdout holds, what stderr says: "" for nothing)
            (["status", "nobody", "--tenant", "vision"], 1, lambda out: out == "", "no claim 'nobody' has a status"),
            (["status", "nobody"], 1, lambda out: out == "", "among any tenant's claims"),
            (["status", "wrong", "--tenant", "vision"], 1, lambda out: "Rejected" in out, "vision/wrong is Rejected"),
            (["status", "wrong", "--tenant", "vision", "-o", "json"], 1, lambda out: states(out) == ["Rejected"],
             "is Rejected"),
            (["status", "waits", "--tenant", "vision", "-o", "yaml"], 0, lambda out: states(out) == ["Pending"], ""),
            (["status", "--tenant", "vision", "-o", "json"], 0, lambda out: states(out) == ["Pending", "Rejected"],
             ""),  # a listing did what it says, whatever its claims' states
            (["submit", str(fresh), "--wait", "-5"], 2, lambda out: out == "", "--wait"),
            (["submit", str(fresh), "--wait", "nan"], 2, lambda out: out == "", "positive number of seconds"),
            (["submit", str(fresh), "--priority", "2147483648"], 2, lambda out: out == "", "--priority"),
            (["submit", str(tmp_path)], 2, lambda out: out == "", "is a directory"),
            (["submit", str(tmp_path / "missing.yaml")], 2, lambda out: out == "", "does not exist"),
            (["submit", str(fresh), "-o", "xml"], 2, lambda out: out == "", "must be table, json or yaml"),
            (["status", "-o", "xml"], 2, lambda out: out == "", "must be table, json or yaml, not 'xml'"),
            (["release", "waits", "--tenant", "vision", "-o", "json"], 0,
             lambda out: json.loads(out) == {"namespace": "vision", "name": "waits", "stateBefore": "Pending",
                                             "release": "requested"}, ""),
            (["release", "nobody", "--tenant", "vision", "-o", "json"], 1, lambda out: out == "",
             "neither waiting nor allocated"),
        ]
        before = await published()
        for arguments, status, printed, said in cases:
            code, out, err = await run("--nats", nats_server.url, *arguments)
            assert (code, printed(out)) == (status, True), (arguments, code, out, err)
            assert (_one_line(err) and said in err) if said else err == "", (arguments, err)
        assert await published() == before + 1  # the release only: no refused submit sent anything

        code, out, err = await run("--nats", nats_server.url, "submit", str(fresh), "--tenant", "vision", "-o", "yaml")
        assert code == 0 and yaml.safe_load(out) == [{"namespace": "vision", "name": "fresh"}], err
        code, out, err = await run("--nats", nats_server.url, "submit", str(fresh), "--tenant", "vision")
        assert code == 0 and out == "submitted vision/fresh\n", err  # without -o: as before, a line a claim
    await nc.close()


async def test_explain_prints_a_table_and_top_a_document(nats_server: EmbeddedNats, tmp_path: Path) -> None:
    """explain's table reads as sentences and tables (no JSON dump); top --once -o json|yaml is its frame's
    numbers; -o json without --once is a usage error."""
    from shared.ledger.engine import sessions
    from shared.ledger.tokens import create_token

    settings = BrokerSettings(nats_url=nats_server.url, data_dir=tmp_path / "data", api_port=0)
    claims = tmp_path / "claims.yaml"
    claims.write_text(yaml.safe_dump(a_claim("big", "vision").request(count=12).document()))  # 8 a node at most
    async with running_stack(settings, services=("watcher", "allocator", "admin-api")) as stack:
        assert stack.allocator is not None and await stack.allocator.wait_for_inventory(20) and stack.api_url
        token = await create_token(sessions(stack.engine), "admin", None, actor="test")
        api = ["--nats", nats_server.url, "--api", stack.api_url, "--token", token]
        code, out, err = await run(*api, "submit", str(claims), "--wait", "20")
        assert code == 0 and json.loads(out)["state"] == "Pending", err
        code, out, err = await run(*api, "explain", "big", "--tenant", "vision")
        assert code == 0, err
        assert out.startswith("vision/big: Pending\nreason: Insufficient nvidia.com/gpu: requested 12")
        assert "REQUEST" in out and "MATCHING" in out and "to admit it:" in out and "no node has 12" in out
        assert '"matching"' not in out and "{" not in out  # no JSON dump
        code, out, _ = await run(*api, "explain", "big", "--tenant", "vision", "-o", "json")
        assert code == 0 and json.loads(out)["explain"]["capacity"][0]["requested"] == 12

        code, out, err = await run(*api, "top", "--once", "-o", "json")
        assert code == 0, err
        frame = json.loads(out)
        assert frame["pending"] == {"claims": 1, "devices": 12} and frame["queue"][0]["name"] == "big"
        assert sum(f["total"] for f in frame["flavors"]) > 0
        code, out, err = await run(*api, "top", "--once", "-o", "yaml")
        assert code == 0 and yaml.safe_load(out)["queue"][0]["tenant"] == "vision", err
        code, out, err = await run(*api, "top", "-o", "json")
        assert code == 2 and out == "" and _one_line(err) and "add --once" in err


@pytest.mark.parametrize("cut", ["ctrl-c", "server stopped"])
async def test_an_interrupted_submit_says_how_many_it_sent(nats_server: EmbeddedNats, tmp_path: Path,
                                                           cut: str) -> None:
    """A tenant's backlog on the bus of 3 and no allocator: the 4th claim waits for room. Cut there, by
    Ctrl-C or by the server going away, submit says it sent 3 of 5 and that sending again is safe."""
    import signal

    from services.bus.connection import connect
    from services.bus.streams import ensure_streams

    nc = await connect(nats_server.url, name="test")
    await ensure_streams(nc.jetstream(), None, 3)
    await nc.close()
    claims = tmp_path / "claims.yaml"
    claims.write_text(yaml.safe_dump_all([a_claim(f"c{n}", "vision").request().document() for n in range(5)]))
    submit = await asyncio.create_subprocess_exec(*CLI, "--nats", nats_server.url, "submit", str(claims),
                                                  stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    assert submit.stderr is not None
    waiting = (await asyncio.wait_for(submit.stderr.readline(), 30)).decode()
    assert "backlog on the bus is full; waiting for the broker" in waiting  # the 4th waits for room
    if cut == "ctrl-c":
        submit.send_signal(signal.SIGINT)
    else:
        await asyncio.to_thread(nats_server.stop)
    out, rest = await asyncio.wait_for(submit.communicate(), 30)
    err = rest.decode()
    assert submit.returncode == (130 if cut == "ctrl-c" else 3) and out == b"", err
    assert _one_line(err) and "Traceback" not in err and "CLAIMBROKER_DEBUG" not in err
    assert err.strip().endswith("sent 3 of 5 claim(s); sending the file again is safe (the broker ignores a claim "
                                "it already holds waiting or running)")
    assert err.startswith("claimbroker: interrupted:" if cut == "ctrl-c" else "claimbroker: lost the connection")


async def test_status_watch_prints_only_what_changed(nats_server: EmbeddedNats) -> None:
    """A status sent again unchanged prints nothing: the next print is the next change."""
    from services.bus.connection import connect
    from services.bus.publish import encode
    from services.bus.streams import ensure_streams
    from shared.contract import subjects

    nc = await connect(nats_server.url, name="test")
    js = nc.jetstream()
    await ensure_streams(js)
    first = {"namespace": "vision", "name": "first", "state": "Pending", "sequence": 1, "reason": "waits"}
    await js.publish(subjects.status("vision", "first"), encode(first))
    watch = await asyncio.create_subprocess_exec(*CLI, "--nats", nats_server.url, "status", "--watch",
                                                 "--tenant", "vision", "-o", "json",
                                                 stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    stdout = watch.stdout
    try:
        assert stdout is not None

        async def printed() -> list[tuple[str, str]]:
            assert stdout is not None
            text = ""
            while not text.rstrip().endswith("]"):  # one JSON list per print
                text += (await asyncio.wait_for(stdout.readline(), 30)).decode()
            return [(s["name"], s["state"]) for s in json.loads(text)]

        assert await printed() == [("first", "Pending")]
        for _ in range(3):  # the same status again (a republish, a backfill): no news
            await js.publish(subjects.status("vision", "first"), encode(first))
        await js.publish(subjects.status("vision", "first"), encode({**first, "state": "Allocated", "sequence": 2}))
        assert await printed() == [("first", "Allocated")]
        watch.send_signal(2)  # Ctrl-C ends a watch: exit 0, nothing on stderr
        _, err = await asyncio.wait_for(watch.communicate(), 30)
        assert watch.returncode == 0 and b"Traceback" not in err and err == b"", err
    finally:
        if watch.returncode is None:
            watch.kill()
            await watch.wait()
        await nc.close()


async def test_a_tenant_credential_submits_as_its_tenant(tmp_path: Path) -> None:
    """Without --tenant, a claim without a namespace is the credential's tenant's (as status and release
    read it), not tenant default's, which the credential cannot reach."""
    from shared.contract import bus_auth
    from shared.ledger.bus_credentials import add_credential
    from shared.ledger.engine import sessions

    claims = tmp_path / "claims.yaml"
    claims.write_text(yaml.safe_dump({**a_claim("mine").request().document(), "metadata": {"name": "mine"}}))
    settings = BrokerSettings(data_dir=tmp_path / "data")
    async with running_stack(settings, services=("watcher", "allocator")) as stack:
        assert stack.authority is not None and stack.allocator is not None
        # connected first: a service whose connection the server authenticates while it reloads its accounts
        # can be refused (`up` restarts it; this stack runs no supervisor)
        assert await stack.allocator.wait_for_inventory(20)
        async with sessions(stack.engine)() as session, session.begin():
            password, row = await add_credential(session, "tenant", "vision", actor="test")
        await stack.authority.apply()
        for _ in range(200):  # its account's status stream, made once the server took the credential
            if "vision" in stack.authority.provisioned:
                break
            await asyncio.sleep(0.05)
        url = bus_auth.url_with_user(stack.nats_url, row.user, password)
        code, out, err = await run("--nats", url, "submit", str(claims), "--wait", "20")
        assert code == 0 and json.loads(out)["namespace"] == "vision" and json.loads(out)["state"] == "Allocated", err
        code, out, err = await run("--nats", url, "status", "mine", "-o", "json")
        assert code == 0 and [s["namespace"] for s in json.loads(out)] == ["vision"], err
