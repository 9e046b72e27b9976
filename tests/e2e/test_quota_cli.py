"""The quota admin's CLI against a running admin API (uvicorn on a random 127.0.0.1 port), as subprocesses."""

from __future__ import annotations

import asyncio
import json
import socket
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import uvicorn
import yaml

from services.admin_api.app import create_app
from shared.ledger.engine import create_engine, migrate, sessions
from shared.ledger.schema import Claim, DeviceAllocation
from shared.ledger.tokens import create_token

pytestmark = pytest.mark.e2e
CLI = [sys.executable, "-m", "services.cli"]


@dataclass
class Running:
    url: str
    token: str
    data_dir: Path
    factory: object

    async def cli(self, *args: str, token: bool = True) -> tuple[int, str, str]:
        """Without --token the CLI reads <data-dir>/admin.token, as after `claimbroker up`."""
        auth = ["--token", self.token] if token else []
        process = await asyncio.create_subprocess_exec(
            *CLI, "--api", self.url, "--data-dir", str(self.data_dir), *auth, *args,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(process.communicate(), 60)
        return process.returncode or 0, out.decode(), err.decode()


@pytest.fixture
async def running(tmp_path: Path) -> AsyncIterator[Running]:
    url = f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}"
    await migrate(url)
    engine = create_engine(url)
    token = await create_token(sessions(engine), "admin", None)
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    (data_dir / "admin.token").write_text(token + "\n")
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(engine), log_level="warning", lifespan="off"))
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.05)
    yield Running(f"http://127.0.0.1:{port}", token, data_dir, sessions(engine))
    server.should_exit = True
    await serving
    sock.close()
    await engine.dispose()


async def hold(running: Running, namespace: str, name: str, flavor: str, devices: int) -> None:
    async with running.factory() as s, s.begin():  # type: ignore[attr-defined]
        claim = Claim(namespace=namespace, name=name, state="Allocated", spec={}, sequence=1, node="node-01")
        s.add(claim)
        await s.flush()
        s.add_all([DeviceAllocation(driver="gpu.nvidia.com", pool="node-01", device=f"{name}-{i}", claim_id=claim.id,
                                    node="node-01", request="gpu", flavor=flavor, units=2.0) for i in range(devices)])


async def test_quota_set_list_export_import_dry_run(running: Running, tmp_path: Path) -> None:
    code, out, err = await running.cli("quota", "set", "vision", "H100", "--nominal", "8", "--borrowing-limit", "4",
                                       token=False)
    assert code == 0, err
    assert "vision" in out and "H100" in out and "8" in out
    code, _, err = await running.cli("quota", "set", "vision", "H1OO", "--nominal", "1")
    assert code == 1 and "422" in err and "H1OO" in err and "H100" in err

    code, out, err = await running.cli("quota", "list", "--output", "json")
    assert code == 0, err
    assert json.loads(out) == [{"tenant": "vision", "flavor": "H100", "nominal": 8, "borrowingLimit": 4,
                                "lendingLimit": None}]
    code, out, _ = await running.cli("quota", "list")
    assert "BORROWING" in out and "vision" in out

    code, exported, err = await running.cli("quota", "export")
    assert code == 0, err
    document = yaml.safe_load(exported)
    assert document["tenants"] == [{"name": "vision", "weight": 1.0, "quotas": {"H100": {
        "nominal": 8, "borrowingLimit": 4}}}]

    await hold(running, "vision", "train", "H100", 10)
    document["tenants"][0]["quotas"]["H100"] = {"nominal": 6, "borrowingLimit": 2}
    file = tmp_path / "quotas.yaml"
    file.write_text(yaml.safe_dump(document))
    code, out, err = await running.cli("quota", "import", str(file), "--dry-run")
    assert code == 0, err
    assert "quota/vision/H100" in out and "nominal=8" in out and "nominal=6" in out and "would change" in out
    assert "vision holds 10 H100" in err and "vision/train (10)" in err
    assert (await running.cli("quota", "export"))[1] == exported, "a dry run writes nothing"

    code, out, err = await running.cli("quota", "import", str(file), "--output", "json")
    assert code == 0, err
    assert json.loads(out)["dryRun"] is False
    code, out, _ = await running.cli("quota", "usage", "--output", "json")
    row = json.loads(out)["items"][0]
    assert (row["tenant"], row["flavor"], row["nominal"], row["used"], row["borrowed"]) == ("vision", "H100", 6, 10, 4)
    code, out, _ = await running.cli("quota", "usage")
    assert code == 0 and "BORROWED" in out

    code, out, err = await running.cli("quota", "delete", "vision", "H100")
    assert code == 0, err
    code, out, err = await running.cli("quota", "delete", "vision", "H100")
    assert code == 1 and "404" in err


async def test_explain_and_errors(running: Running) -> None:
    async with running.factory() as s, s.begin():  # type: ignore[attr-defined]
        s.add(Claim(namespace="vision", name="waits", state="Pending", spec={}, sequence=1,
                    reason="quota H100 exhausted", explain={"quota": [{"flavor": "H100", "why": "exhausted"}]}))
    code, out, err = await running.cli("explain", "waits", "--tenant", "vision")
    assert code == 0, err
    assert "Pending" in out and "quota H100 exhausted" in out and "BLOCKING QUOTA" in out and "exhausted" in out
    code, out, _ = await running.cli("explain", "waits", "--tenant", "vision", "--output", "json")
    assert json.loads(out)["explain"] == {"quota": [{"flavor": "H100", "why": "exhausted"}]}
    code, _, err = await running.cli("explain", "ghost", "--tenant", "vision")
    assert code == 1 and "404" in err
    code, _, err = await running.cli("--token", "cb_wrong", "quota", "list", token=False)
    assert code == 1 and "401" in err
    process = await asyncio.create_subprocess_exec(*CLI, "--api", "http://127.0.0.1:9", "--token", "x", "quota",
                                                   "list", stdout=asyncio.subprocess.PIPE,
                                                   stderr=asyncio.subprocess.PIPE)
    _, err_bytes = await process.communicate()
    assert process.returncode == 3 and err_bytes.decode().startswith(
        "claimbroker: cannot reach the admin API at http://127.0.0.1:9")
    assert len(err_bytes.decode().strip().splitlines()) == 1


async def test_the_api_url_is_the_one_up_wrote_never_a_guess(running: Running, tmp_path: Path) -> None:
    """Without --api the CLI takes the URL `up` wrote in the data folder (so `up --api-port 9000` and
    `quota list` with the same --data-dir meet); with neither it says so instead of trying port 8080."""
    bare = [*CLI, "--data-dir", str(running.data_dir), "--token", running.token, "quota", "list"]
    process = await asyncio.create_subprocess_exec(*bare, stdout=asyncio.subprocess.PIPE,
                                                   stderr=asyncio.subprocess.PIPE)
    out, err = await process.communicate()
    assert process.returncode == 2 and out == b"" and b"no admin API URL" in err and b"api.url" in err
    (running.data_dir / "api.url").write_text(running.url)
    process = await asyncio.create_subprocess_exec(*bare, stdout=asyncio.subprocess.PIPE,
                                                   stderr=asyncio.subprocess.PIPE)
    out, err = await process.communicate()
    assert process.returncode == 0, err
