"""Names as Kubernetes has them, through the live stack (issue 36: claims named `train.v2`, `My.Claim` or
`UpperCase` were "submitted", then nothing).

One stack (real nats-server, watcher, allocator, SQLite) runs in a thread of its own for every example of a
hypothesis property, so a few dozen names cost one start:
- a name Kubernetes accepts (a DNS subdomain): `claimbroker submit` publishes it, and the claim gets a
  status on its subject (each '.' written '_'), with the name unchanged in the payload, that
  `claimbroker status NAME` reads;
- any other name: `claimbroker submit` refuses the file (exit 2, one line naming the file, the document and
  Kubernetes' rule) and publishes nothing; published anyway by another client, it gets a Rejected status
  naming the rule where a subject can carry the name, else an invalid-message alert naming the message.
Tenants alike: the CLI refuses a tenant that is no DNS label, the bus answers one with an alert. Nodes too:
a dotted node name travels from a topology file to a placed claim and the node map.
"""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from services.bus.connection import connect
from services.bus.embedded import EmbeddedNats
from services.bus.publish import publish_json
from services.bus.streams import read_fleet
from services.cli.common import app
from services.runtime.stack import running_stack
from shared.contract import subjects
from shared.dra import model as dra
from shared.ledger.engine import sessions
from shared.ledger.tokens import create_token
from shared.settings import BrokerSettings
from tests.builders import a_claim
from tests.e2e.helpers import Collector, alerts, free_port, statuses

pytestmark = pytest.mark.e2e
T = TypeVar("T")
TENANT = "names"
ANSWER_S = 30.0  # a loaded machine's patience; a missing answer is a failure, never a wait that passes


class StackThread:
    """The broker in a thread with its own event loop, and a client there that collects every status and
    alert: each example asks it for what it needs (`run`), while the CLI runs in the test's thread."""

    def __init__(self, settings: BrokerSettings) -> None:
        assert settings.nats_url is not None
        self.settings, self.url = settings, settings.nats_url
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="stack", daemon=True)
        self.statuses = self.alerts = Collector()

    def run(self, work: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
        return asyncio.run_coroutine_threadsafe(work, self.loop).result(timeout)

    def __enter__(self) -> StackThread:
        self.thread.start()
        self._stack = running_stack(self.settings, services=("watcher", "allocator"))
        stack = self.run(self._stack.__aenter__())
        assert stack.allocator is not None and self.run(stack.allocator.wait_for_inventory(20))
        self.nc = self.run(connect(self.url, name="test"))
        self.statuses = self.run(statuses(self.nc))
        self.alerts = self.run(alerts(self.nc))
        return self

    def __exit__(self, *_: object) -> None:
        try:
            self.run(self.nc.close())
            self.run(self._stack.__aexit__(None, None, None))
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)

    def publish(self, subject: str, payload: bytes) -> str:
        """Publish as any NATS client would; the message id, which an invalid-message alert names."""
        message_id = uuid.uuid4().hex

        async def send() -> None:
            await self.nc.jetstream().publish(subject, payload, headers={"Nats-Msg-Id": message_id})

        self.run(send())
        return message_id

    def submissions(self) -> int:
        """Every message the claims stream ever stored: its last sequence (the count of those it holds drops as
        the allocator acknowledges them, a work queue's retention, and failed the check of a refused file
        when the allocator took the message of the example before between the two reads)."""

        async def count() -> int:
            return int((await self.nc.jetstream().stream_info(subjects.CLAIMS_STREAM)).state.last_seq)

        return self.run(count())

    def wait(self, collector: Collector, found: Any) -> tuple[str, dict[str, Any]]:
        """The first message (subject, payload) `found` accepts, waiting for it."""

        def first() -> tuple[str, dict[str, Any]] | None:
            return next(((s, m) for s, m in collector.messages if found(s, m)), None)

        self.run(collector.wait_for(lambda: first() is not None, ANSWER_S), ANSWER_S + 5)
        answer = first()
        assert answer is not None
        return answer


@pytest.fixture
def stack(nats_server: EmbeddedNats, tmp_path: Path) -> Iterator[StackThread]:
    with StackThread(BrokerSettings(nats_url=nats_server.url, data_dir=tmp_path / "data")) as running:
        yield running


# --- names ----------------------------------------------------------------------------------------------

LABEL = st.from_regex(r"\A[a-z0-9]([-a-z0-9]{0,14}[a-z0-9])?\Z")
LONG_LABEL = st.from_regex(r"\A[a-z0-9][-a-z0-9]{40,61}[a-z0-9]\Z")
KUBERNETES_NAMES = st.one_of(
    st.lists(LABEL, min_size=1, max_size=4).map(".".join),
    st.lists(LONG_LABEL, min_size=3, max_size=4).map(".".join),  # up to 255: the 254s and 255s are filtered
).filter(lambda name: len(name) <= 253)


def _with_upper(name: str) -> str:
    at = next((i for i, c in enumerate(name) if c.isalpha()), None)
    return name[:at] + name[at].upper() + name[at + 1:] if at is not None else "X" + name


REFUSED_NAMES = st.one_of(
    KUBERNETES_NAMES.map(_with_upper),  # UpperCase, My.Claim: carried, Rejected
    st.tuples(KUBERNETES_NAMES, st.sampled_from(["-", "."])).map(lambda t: t[0] + t[1]),  # trailing '-' or '.'
    st.tuples(st.sampled_from(["-", "."]), KUBERNETES_NAMES).map(lambda t: t[0] + t[1]),  # leading
    KUBERNETES_NAMES.map(lambda name: name + "..x"),  # an empty label
    KUBERNETES_NAMES.map(lambda name: name + "_x"),  # '_' stands for '.' in subjects: no subject carries it
    st.integers(254, 400).map(lambda n: "n" * n),  # too long
    st.just(""),
    st.text(st.characters(exclude_categories=["Cs"]), min_size=1, max_size=12),  # spaces, '*', '>', unicode
).filter(lambda name: not dra.is_dns_subdomain(name))

runner = CliRunner()


def claimbroker(stack: StackThread, *args: str) -> tuple[int, str, str]:
    """The command line in this thread (its own event loop), against the stack's NATS."""
    result = runner.invoke(app, ["--nats", stack.url, *args])
    return result.exit_code, result.stdout, result.stderr


def claim_file(folder: Path, name: str, namespace: str | None = TENANT) -> Path:
    document = a_claim(name, TENANT).request().document()
    if namespace is None:
        del document["metadata"]["namespace"]
    else:
        document["metadata"]["namespace"] = namespace
    path = folder / f"claim-{uuid.uuid4().hex}.yaml"
    path.write_text(yaml.safe_dump(document, allow_unicode=False))
    return path


def answered_on_its_subject(stack: StackThread, name: str) -> dict[str, Any]:
    """The claim's first status: on its own subject, its name in the payload as it was written."""
    subject, status = stack.wait(stack.statuses, lambda _, s: (s["namespace"], s["name"]) == (TENANT, name))
    assert subject == f"{subjects.PREFIX}.claims.status.{TENANT}.{name.replace('.', '_')}"
    assert subjects.name_of(subjects.status_parts(subject)[1]) == name
    return status


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(name=KUBERNETES_NAMES)
@example(name="train.v2")
@example(name="a" * 63 + "." + "b" * 63 + "." + "c" * 63 + "." + "d" * 61)  # 253 characters
def test_a_name_kubernetes_accepts_gets_a_status(stack: StackThread, tmp_path: Path, name: str) -> None:
    code, out, err = claimbroker(stack, "submit", str(claim_file(tmp_path, name)))
    assert code == 0, err
    assert f"{TENANT}/{name}" in out.split(), out  # one line, however long the name
    status = answered_on_its_subject(stack, name)
    assert status["state"] in ("Allocated", "Pending"), status

    code, out, err = claimbroker(stack, "status", name, "--tenant", TENANT, "--output", "json")
    assert code == 0, err
    assert [(s["namespace"], s["name"]) for s in json.loads(out)] == [(TENANT, name)]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(name=REFUSED_NAMES)
@example(name="UpperCase")
@example(name="My.Claim")
@example(name="train_v2")
@example(name=">")
def test_any_other_name_is_refused_by_the_cli_and_answered_by_the_broker(stack: StackThread, tmp_path: Path,
                                                                         name: str) -> None:
    path = claim_file(tmp_path, name)
    before = stack.submissions()
    code, out, err = claimbroker(stack, "submit", str(path))
    assert code == 2 and out == "", (code, out, err)
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"{path}: document 1: metadata.name: "), err
    assert "is required" in err if name == "" else "as Kubernetes requires of an object's name" in err, err
    assert stack.submissions() == before, "the CLI published the file it refused"

    document = a_claim(name, TENANT).request().document()
    message_id = stack.publish(subjects.submit(TENANT), json.dumps(document).encode())
    if subjects.carries(name):
        status = answered_on_its_subject(stack, name)
        assert status["state"] == "Rejected" and "as Kubernetes requires of an object's name" in status["reason"]
    else:
        subject, alert = stack.wait(stack.alerts, lambda _, a: a.get("details", {}).get("messageId") == message_id)
        assert alert["kind"] == "invalid-message" and subject.endswith(f".{TENANT}"), (subject, alert)
        assert "metadata.name" in alert["summary"], alert


TENANTS_KUBERNETES_REFUSES = ["Vision", "vision_1", "-vision", "v" * 64, "vision.team"]


@pytest.mark.parametrize("tenant", TENANTS_KUBERNETES_REFUSES)
def test_a_tenant_kubernetes_refuses_is_refused_by_the_cli_and_answered_by_the_broker(
        stack: StackThread, tmp_path: Path, tenant: str) -> None:
    for command in (["submit", str(claim_file(tmp_path, "one", namespace=None)), "--tenant", tenant],
                    ["submit", str(claim_file(tmp_path, "one", namespace=tenant))],
                    ["status", "--tenant", tenant], ["release", "one", "--tenant", tenant]):
        code, out, err = claimbroker(stack, *command)
        assert code == 2 and out == "" and "must be a DNS label" in err, (command, code, out, err)
        assert len(err.strip().splitlines()) == 1, err
    # published anyway by another client: an alert about no tenant a subject could name (a dotted one makes
    # a subject of more tokens than a submission's)
    message_id = stack.publish(f"{subjects.PREFIX}.claims.submit.{tenant}",
                               json.dumps(a_claim("one", tenant).request().document()).encode())
    subject, alert = stack.wait(stack.alerts, lambda _, a: a.get("details", {}).get("messageId") == message_id)
    assert alert["kind"] == "invalid-message" and subject.endswith(f".{subjects.FLEET}"), (subject, alert)
    assert "must be a DNS label" in alert["summary"] or "is not a claim subject" in alert["summary"], alert


def test_a_dotted_claim_is_released_and_its_status_read_by_name(stack: StackThread, tmp_path: Path) -> None:
    code, _, err = claimbroker(stack, "submit", str(claim_file(tmp_path, "train.v2")), "--wait", "30")
    assert code == 0, err
    assert answered_on_its_subject(stack, "train.v2")["state"] == "Allocated"
    # a bad copy of the running claim leaves it as it is, and is answered (it once vanished without a word)
    bad_copy = a_claim("train.v2", TENANT).request(count=-1).document()
    message_id = stack.publish(subjects.submit(TENANT), json.dumps(bad_copy).encode())
    _, alert = stack.wait(stack.alerts, lambda _, a: a.get("details", {}).get("messageId") == message_id)
    assert alert["kind"] == "invalid-message" and "claim train.v2 is Allocated and stays so" in alert["summary"]
    assert [s["state"] for s in stack.statuses.for_claim(TENANT, "train.v2")] == ["Allocated"]
    code, _, err = claimbroker(stack, "release", "train.v2", "--tenant", TENANT)
    assert code == 0, err
    stack.wait(stack.statuses, lambda _, s: (s["name"], s["state"]) == ("train.v2", "Released"))
    code, out, err = claimbroker(stack, "status", "train.v2", "--tenant", TENANT, "--output", "json")
    assert code == 0 and [s["state"] for s in json.loads(out)] == ["Released"], (out, err)
    # a name no subject can carry has no status: said, not looked for
    code, out, err = claimbroker(stack, "status", "train v2", "--tenant", TENANT)
    assert code == 2 and out == "" and "as Kubernetes requires of an object's name" in err, (code, out, err)



DOTTED_NODE = "gpu-1.example.com"


async def test_a_dotted_node_from_a_topology_file_to_a_placed_claim_and_the_node_map(
        nats_server: EmbeddedNats, tmp_path: Path) -> None:
    """Topology file -> watcher (inventory subject with the '.' written '_') -> the allocator places a claim
    there -> /v1/nodes shows the node, its device held; the bus's view of the fleet (what `serve admin-api`
    and `whatif` read) has it by name too."""
    fleet_file = tmp_path / "fleet.yaml"
    fleet_file.write_text(f"kind: Topology\nnodes:\n  - {{name: {DOTTED_NODE}, gpuModel: H100, gpuCount: 1}}\n")
    settings = BrokerSettings(nats_url=nats_server.url, data_dir=tmp_path / "data", api_port=free_port(),
                              inventory=[fleet_file])
    probe = await connect(nats_server.url, name="test")
    inventory = await Collector().start(probe, subjects.INVENTORY_ALL)
    seen = await statuses(probe)
    try:
        async with running_stack(settings, services=("watcher", "allocator", "admin-api")) as stack:
            assert stack.allocator is not None and stack.api_url is not None
            await inventory.wait_for(lambda: bool(inventory.messages))
            subject, payload = inventory.messages[0]
            assert (subject, payload["node"]) == (f"{subjects.PREFIX}.inventory.gpu-1_example_com", DOTTED_NODE)

            await publish_json(probe.jetstream(), subjects.submit(TENANT),
                               a_claim("train.v2", TENANT).request().document(), msg_id="train.v2")
            await seen.wait_for(lambda: bool(seen.for_claim(TENANT, "train.v2")))
            status = seen.for_claim(TENANT, "train.v2")[-1]
            assert status["state"] == "Allocated" and status["allocation"]["nodeName"] == DOTTED_NODE, status

            token = await create_token(sessions(stack.engine), "admin", None)
            async with httpx.AsyncClient(base_url=stack.api_url,
                                         headers={"Authorization": f"Bearer {token}"}) as api:
                response = await api.get("/v1/nodes")
                assert response.status_code == 200, response.text
                nodes = {n["node"]: n for n in response.json()}
                assert list(nodes) == [DOTTED_NODE]
                assert [(d["state"], d["tenant"], d["claim"]) for d in nodes[DOTTED_NODE]["devices"]] == [
                    ("allocated", TENANT, "train.v2")]
            assert list((await read_fleet(nats_server.url)).nodes) == [DOTTED_NODE]
    finally:
        await probe.close()
