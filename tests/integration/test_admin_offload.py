"""Heavy admin requests in worker processes (services/admin_api/offload.py): bounded bodies (413), bounded
imports (422 with the numbers), a deadline (503 with Retry-After, the worker stopped), a bounded queue (503
at once past it), a memory limit, and what a cancelled request leaves (nothing running)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from typing import Any

import httpx
import pytest
import uvicorn
import yaml

from services.admin_api.app import create_app
from services.admin_api.offload import AdminWorkers, Limits
from shared.dra.inventory import Fleet
from shared.ledger.engine import create_engine, migrate, sessions
from shared.ledger.tokens import create_token
from tests.integration.admin import assert_problem, bearer

Client = Callable[..., Awaitable[tuple[httpx.AsyncClient, dict[str, str], AdminWorkers]]]


def nodes(count: int) -> dict[str, Any]:
    """A what-if adding `count` nodes of 8 H100s: a few bytes that cost a worker seconds per thousand."""
    return {"addInventory": [{"kind": "Topology", "nodes": [
        {"namePrefix": "extra-", "count": count, "gpuModel": "H100", "gpuCount": 8}]}]}


@pytest.fixture
async def app_with(tmp_path: Any) -> AsyncIterator[Client]:
    """An admin API on a SQLite ledger with the limits a test names; each client is closed after it."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}"
    await migrate(url)
    engine = create_engine(url)
    admin = bearer(await create_token(sessions(engine), "admin", None))
    opened: list[httpx.AsyncClient] = []

    async def empty() -> Fleet:
        return Fleet()

    async def build(**limits: Any) -> tuple[httpx.AsyncClient, dict[str, str], AdminWorkers]:
        app = create_app(engine, fleet=empty, limits=replace(Limits.defaults(), **limits))
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api", timeout=120)
        opened.append(client)
        return client, admin, app.state.workers

    yield build
    for client in opened:
        await client.aclose()
    await engine.dispose()


async def wait_until(condition: Callable[[], bool], timeout: float = 60.0) -> None:
    """Polls an in-process counter (no event to wait on across the worker's process boundary)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "the condition did not hold in time"
        await asyncio.sleep(0.01)


async def test_a_body_over_the_limit_is_refused_before_it_is_read(app_with: Client) -> None:
    api, admin, _ = await app_with(max_body=4096)
    declared = assert_problem(await api.post("/v1/whatif", content=b"{" + b" " * 5000 + b"}", headers={
        **admin, "Content-Type": "application/json"}), 413)
    assert "5,002 bytes" in declared["detail"] and "4,096" in declared["detail"], declared

    async def streamed() -> AsyncIterator[bytes]:  # no Content-Length: counted as it arrives
        for _ in range(10):
            yield b" " * 1000

    chunked = assert_problem(await api.post("/v1/quotas/import", content=streamed(), headers=admin), 413)
    assert "CLAIMBROKER_ADMIN_MAX_BODY" in chunked["detail"]
    assert_problem(await api.put("/v1/tenants/vision", content=b" " * 5000, headers=admin), 413)  # every route
    assert (await api.put("/v1/tenants/vision", json={}, headers=admin)).status_code == 200


async def test_an_import_past_the_limits_is_refused_with_the_numbers_and_writes_nothing(app_with: Client) -> None:
    api, admin, _ = await app_with(import_max_tenants=2, import_max_quotas=3)
    tenants = [{"name": f"t{i}", "quotas": {"H100": {"nominal": 1}}} for i in range(3)]
    for document, said in (({"kind": "Quotas", "tenants": tenants}, "3 tenants, over the limit of 2"),
                           ({"kind": "Quotas", "tenants": [{"name": "t0", "quotas": {
                               f: {"nominal": 1} for f in ("H100", "H200", "B200", "A100")}}]},
                            "4 quotas, over the limit of 3")):
        for dry_run in ("true", "false"):
            refused = assert_problem(await api.post("/v1/quotas/import", params={"dryRun": dry_run},
                                                    content=yaml.safe_dump(document), headers=admin), 422)
            assert said in refused["detail"] and "CLAIMBROKER_QUOTA_IMPORT_MAX_" in refused["detail"], refused
    accepted = await api.post("/v1/quotas/import", json={"kind": "Quotas", "tenants": tenants[:2]}, headers=admin)
    assert accepted.status_code == 200, accepted.text
    assert [c["entity"] for c in accepted.json()["changes"]] == ["tenant/t0", "quota/t0/H100", "tenant/t1",
                                                                  "quota/t1/H100"]
    exported = await api.get("/v1/quotas/export", params={"format": "json"}, headers=admin)
    assert [t["name"] for t in exported.json()["tenants"]] == ["t0", "t1"]


async def test_a_job_past_its_deadline_is_stopped_and_answered_503(app_with: Client) -> None:
    api, admin, pool = await app_with(timeout=0.5, whatif_max_nodes=100_000, whatif_max_devices=10**6)
    late = await api.post("/v1/whatif", json=nodes(3000), headers=admin)
    body = assert_problem(late, 503)
    assert body["title"] == "admin work timed out" and "within 0.5s" in body["detail"], body
    assert "propose less" in body["detail"] and int(late.headers["Retry-After"]) >= 1
    assert pool.running == 0 and pool.waiting == 0, "the worker was stopped and its place freed"


async def test_one_runs_one_waits_and_a_third_is_turned_away_at_once(app_with: Client) -> None:
    api, admin, pool = await app_with(jobs=1, queue=1, whatif_max_nodes=100_000, whatif_max_devices=10**6)
    slow = asyncio.create_task(api.post("/v1/whatif", json=nodes(2000), headers=admin))
    await wait_until(lambda: pool.running == 1)
    queued = asyncio.create_task(api.post("/v1/whatif", json={}, headers=admin))
    await wait_until(lambda: pool.waiting == 1)
    turned = await api.post("/v1/whatif", json={}, headers=admin)
    body = assert_problem(turned, 503)
    assert body["title"] == "admin work busy" and "CLAIMBROKER_ADMIN_QUEUE (1)" in body["detail"], body
    assert 1 <= int(turned.headers["Retry-After"]) <= 60
    assert not slow.done(), "turned away while the first still ran"
    assert (await slow).status_code == 200 and (await queued).status_code == 200
    assert pool.running == 0 and pool.waiting == 0


async def test_a_cancelled_request_stops_its_worker_and_frees_its_place(app_with: Client) -> None:
    api, admin, pool = await app_with(jobs=1, queue=0, whatif_max_nodes=100_000, whatif_max_devices=10**6)
    slow = asyncio.create_task(api.post("/v1/whatif", json=nodes(5000), headers=admin))
    await wait_until(lambda: pool.running == 1)
    slow.cancel()
    await wait_until(lambda: pool.running == 0)
    assert (await api.post("/v1/whatif", json={}, headers=admin)).status_code == 200


async def test_a_client_that_goes_away_stops_its_job(tmp_path: Any) -> None:
    """Over a real connection (uvicorn): a client that gives up (Ctrl-C on a CLI) frees the worker."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}"
    await migrate(url)
    engine = create_engine(url)
    admin = bearer(await create_token(sessions(engine), "admin", None))

    async def empty() -> Fleet:
        return Fleet()

    app = create_app(engine, fleet=empty, limits=replace(Limits.defaults(), whatif_max_nodes=100_000,
                                                         whatif_max_devices=10**6))
    pool: AdminWorkers = app.state.workers
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            await asyncio.sleep(0.05)
        base = f"http://127.0.0.1:{sock.getsockname()[1]}"
        async with httpx.AsyncClient(base_url=base, headers=admin) as client:
            # 20,000 nodes: half a minute of work, far longer than the wait below
            leaving = asyncio.create_task(client.post("/v1/whatif", json=nodes(20_000), timeout=120))
            await wait_until(lambda: pool.running == 1)
            leaving.cancel()  # the connection closes with it
        await wait_until(lambda: pool.running == 0, timeout=5)
        async with httpx.AsyncClient(base_url=base, headers=admin, timeout=60) as client:
            assert (await client.post("/v1/whatif", json={})).status_code == 200
    finally:
        server.should_exit = True
        await serving
        sock.close()
        await engine.dispose()


async def test_a_job_over_its_memory_is_stopped_with_a_503(app_with: Client) -> None:
    api, admin, pool = await app_with(memory=64 * 2**20, whatif_max_nodes=100_000, whatif_max_devices=10**6)
    body = assert_problem(await api.post("/v1/whatif", json=nodes(4000), headers=admin), 503)
    assert "memory" in f"{body['title']} {body['detail']}".lower(), body
    assert pool.running == 0
    assert (await api.post("/v1/whatif", json={}, headers=admin)).status_code == 200, "the next job has its own"


async def test_a_dry_run_writes_nothing_and_a_real_import_commits_from_the_worker(app_with: Client) -> None:
    api, admin, _ = await app_with()
    document = {"kind": "Quotas", "tenants": [{"name": f"t{i:04d}", "quotas": {"H100": {"nominal": 1}}}
                                              for i in range(2000)]}
    dry = await api.post("/v1/quotas/import", params={"dryRun": "true"}, json=document, headers=admin)
    assert dry.status_code == 200 and len(dry.json()["changes"]) == 4000 and dry.json()["dryRun"] is True
    exported = await api.get("/v1/quotas/export", params={"format": "json"}, headers=admin)
    assert exported.json().get("tenants", []) == []
    real = await api.post("/v1/quotas/import", json=document, headers=admin)
    assert real.status_code == 200 and real.json()["changes"] == dry.json()["changes"]
    exported = await api.get("/v1/quotas/export", params={"format": "json"}, headers=admin)
    assert [t["name"] for t in exported.json()["tenants"]] == [t["name"] for t in document["tenants"]]
