"""Chaos run (`make chaos`): the broker as it is deployed, one service per process, under faults, then an
invariant checker over the ledger and the status stream. Prints one JSON line.

Real parts: a nats-server on a fixed port (so it can be restarted under its clients), a PostgreSQL
database of its own, `serve watcher`, `serve notifier` and two `serve allocator` replicas as separate
processes. Tenants with quotas in cohorts publish claims at a steady rate and release some of their
allocated claims. Meanwhile an allocator replica is killed with SIGKILL every `--kill-every` seconds and
started again, nats-server is restarted `--nats-restarts` times, every PostgreSQL backend of the
database is terminated `--pg-terminations` times, and PostgreSQL itself is stopped and started
`--pg-restarts` times. The database lives in a PostgreSQL cluster the run starts itself on a free port
(`tests.private_postgres`), so that it can be restarted; where the machine cannot run one, the run uses
the shared server at CLAIMBROKER_TEST_PG, terminates backends only, and the output says so.

Checked: devices allocated twice, quota and cohort breaches (sampled every second during the run, and at
the end), claims lost (published but no row, or a last status that disagrees with the ledger), releases
lost (a release published for a claim that is still queued at the end), claims without any status,
claims stuck (Pending at the end although the decision core, run once on the final ledger, would admit
them: a decision the allocator missed), service processes that exited without being killed; and
submit-to-first-status latency and, per fault, the time to the next status. Goal: every count 0.

Run: `make chaos`, or `python bench/chaos.py --claims 2000 --tenants 5 --duration 30` for a short one.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import random
import shutil
import signal
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import asyncpg  # noqa: E402
import nats  # noqa: E402
import yaml  # noqa: E402
from sqlalchemy import select  # noqa: E402

from services.bus.embedded import EmbeddedNats  # noqa: E402
from services.bus.streams import ensure_streams  # noqa: E402
from shared.admission.cycle import run_cycle  # noqa: E402
from shared.admission.invariant import violations  # noqa: E402
from shared.admission.model import Running, Snapshot  # noqa: E402
from shared.admission.quota import QuotaConfig, parse_quotas  # noqa: E402
from shared.contract import subjects  # noqa: E402
from shared.dra.classes import merge_classes  # noqa: E402
from shared.dra.inventory import Fleet  # noqa: E402
from shared.dra.results import (
    Allocation,  # noqa: E402
    State,  # noqa: E402
)
from shared.fleet.sources import load_inventory  # noqa: E402
from shared.ledger.engine import create_engine, migrate, sessions  # noqa: E402
from shared.ledger.queue import load_queue  # noqa: E402
from shared.ledger.quota_store import apply_quota_config  # noqa: E402
from shared.ledger.schema import Claim, DeadLetter, InboxMessage  # noqa: E402
from shared.ledger.unit_of_work import UnitOfWork  # noqa: E402
from shared.settings import BrokerSettings  # noqa: E402
from tests.e2e.helpers import free_port  # noqa: E402
from tests.private_postgres import PrivatePostgres  # noqa: E402

SHARED_PG = os.environ.get("CLAIMBROKER_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
MODELS = ("A100", "H100", "H200")
QUEUED = ("Pending", "Allocated")


def topology(nodes: int) -> dict[str, Any]:
    per = max(1, nodes // len(MODELS))
    return {"kind": "Topology", "nodes": [{"namePrefix": f"{m.lower()}-", "count": per, "gpuModel": m, "gpuCount": 8}
                                          for m in MODELS]}


def quotas(tenants: int, nodes: int) -> QuotaConfig:
    """Every GPU of each model split among the tenants' nominal quotas, in cohorts of four, some lending
    and borrowing limits: the configuration under which a cohort once held more than its nominal."""
    per_model = max(1, nodes // len(MODELS)) * 8
    rows = []
    for t in range(tenants):
        limits: dict[str, Any] = {}
        for m in MODELS:
            limit: dict[str, Any] = {"nominal": per_model // tenants}
            if t % 3 == 0:
                limit["borrowingLimit"] = 8
            if t % 4 == 1:
                limit["lendingLimit"] = limit["nominal"] // 2
            limits[m] = limit
        rows.append({"name": f"t{t:02d}", "cohort": f"c{t // 4}", "quotas": limits})
    return parse_quotas({"kind": "Quotas", "tenants": rows})


class Services:
    """The broker's processes: started, killed with SIGKILL, started again; an exit we did not cause counts."""

    def __init__(self, env: dict[str, str], inventory: Path, logs: Path) -> None:
        self.env, self.inventory, self.logs = env, inventory, logs
        self.processes: dict[str, asyncio.subprocess.Process] = {}
        self.killed: set[int] = set()
        self.unexpected_exits: list[str] = []

    async def start(self, name: str) -> None:
        service = name.split("-")[0]
        extra = ["--inventory", str(self.inventory)] if service == "watcher" else []
        log = open(self.logs / f"{name}.log", "ab")  # noqa: SIM115 - the process owns it
        self.processes[name] = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "services.cli", "serve", service, *extra, env=self.env,
            stdout=log, stderr=log)

    async def kill(self, name: str) -> None:
        process = self.processes[name]
        self.killed.add(process.pid)
        process.send_signal(signal.SIGKILL)
        await process.wait()

    def check(self) -> None:
        for name, process in self.processes.items():
            if process.returncode is not None and process.pid not in self.killed:
                self.unexpected_exits.append(f"{name} exited with {process.returncode}")
                self.killed.add(process.pid)

    async def stop(self) -> None:
        self.check()
        for process in self.processes.values():
            if process.returncode is None:
                self.killed.add(process.pid)
                process.terminate()
        for process in self.processes.values():
            try:
                await asyncio.wait_for(process.wait(), 15)
            except TimeoutError:
                process.kill()
                await process.wait()


async def terminate_backends(admin_url: str, database: str) -> int:
    admin = await asyncpg.connect(admin_url.replace("postgresql://", "postgres://", 1))
    try:
        return int(await admin.fetchval(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = $1", database))
    finally:
        await admin.close()


async def drop_database(admin_url: str, database: str) -> None:
    await terminate_backends(admin_url, database)
    admin = await asyncpg.connect(admin_url.replace("postgresql://", "postgres://", 1))
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
    finally:
        await admin.close()


async def run(claims: int, tenants: int, nodes: int, duration: float, kill_every: float, nats_restarts: int,
              pg_terminations: int, pg_restarts: int, seed: int) -> dict[str, Any]:
    """Whatever fails on the way, the processes, servers and database it started are stopped and removed."""
    async with contextlib.AsyncExitStack() as cleanup:
        return await _run(cleanup, claims, tenants, nodes, duration, kill_every, nats_restarts, pg_terminations,
                          pg_restarts, seed)


async def _run(cleanup: contextlib.AsyncExitStack, claims: int, tenants: int, nodes: int, duration: float,
               kill_every: float, nats_restarts: int, pg_terminations: int, pg_restarts: int,
               seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    work = Path(tempfile.mkdtemp(prefix="claimbroker-chaos-"))
    database = f"cb_chaos_{uuid.uuid4().hex[:10]}"
    cannot = PrivatePostgres.unavailable()
    cluster = None if cannot else PrivatePostgres()
    if cluster is not None:
        await asyncio.to_thread(cluster.start)
        cleanup.push_async_callback(asyncio.to_thread, cluster.destroy)
    else:
        pg_restarts = 0
    pg_admin = cluster.url if cluster is not None else SHARED_PG
    admin = await asyncpg.connect(pg_admin.replace("postgresql://", "postgres://", 1))
    await admin.execute(f'CREATE DATABASE "{database}"')
    await admin.close()
    if cluster is None:
        cleanup.push_async_callback(drop_database, pg_admin, database)
    db_url = pg_admin.rsplit("/", 1)[0] + "/" + database
    inventory = work / "fleet.yaml"
    inventory.write_text(yaml.safe_dump(topology(nodes)))
    documents = load_inventory([inventory])
    fleet = Fleet.from_slices(documents.slices, documents.labels)
    config = quotas(tenants, nodes)
    await migrate(db_url)
    engine = create_engine(db_url)
    cleanup.push_async_callback(engine.dispose)
    async with sessions(engine)() as session, session.begin():
        await apply_quota_config(session, config, "chaos")
    server = EmbeddedNats(work / "nats", port=free_port())
    server.start()
    cleanup.callback(server.stop)
    env = {**os.environ, "CLAIMBROKER_NATS_URL": server.url, "CLAIMBROKER_DB": db_url,
           "CLAIMBROKER_DATA_DIR": str(work / "data"), "CLAIMBROKER_ALLOCATOR_ACK_WAIT": "2"}
    services = Services(env, inventory, work)
    cleanup.push_async_callback(services.stop)
    for name in ("watcher", "notifier", "allocator-a", "allocator-b"):
        await services.start(name)

    async def quiet(_: Exception) -> None:  # nats-py reports every reconnect try
        return None

    nc = await nats.connect(server.url, max_reconnect_attempts=-1, reconnect_time_wait=0.2, error_cb=quiet)
    cleanup.push_async_callback(nc.close)
    js = nc.jetstream()
    for _ in range(100):
        try:
            await ensure_streams(js)
            break
        except Exception:
            await asyncio.sleep(0.1)
    published: dict[tuple[str, str], float] = {}  # claim -> when its submission was acknowledged
    first_status: dict[tuple[str, str], float] = {}
    last_status: dict[tuple[str, str], dict[str, Any]] = {}
    status_times: list[float] = []
    released: set[tuple[str, str]] = set()
    allocated: dict[tuple[str, str], None] = {}  # claims whose last status is Allocated, not yet released

    async def on_status(message: Any) -> None:
        status = json.loads(message.data)
        key = (status["namespace"], status["name"])
        now = time.monotonic()
        first_status.setdefault(key, now)
        previous = last_status.get(key)
        if previous is None or status["sequence"] >= previous["sequence"]:
            last_status[key] = status
            if status["state"] == "Allocated" and key not in released:
                allocated[key] = None
            else:
                allocated.pop(key, None)
        status_times.append(now)

    await nc.subscribe(subjects.STATUS_ALL, cb=on_status)
    faults: list[tuple[str, float]] = []
    breaches: list[str] = []
    samples = 0
    started = time.monotonic()

    async def publish(subject: str, payload: dict[str, Any], message_id: str) -> bool:
        for _ in range(50):  # through a NATS restart: the client reconnects, the id dedupes a resend
            try:
                await js.publish(subject, json.dumps(payload).encode(), headers={"Nats-Msg-Id": message_id},
                                 timeout=2)
                return True
            except Exception:
                await asyncio.sleep(0.2)
        return False

    async def load() -> None:
        interval = duration / claims
        for serial in range(claims):
            tenant = f"t{rng.randrange(tenants):02d}"
            name = f"c{serial:06d}"
            body: dict[str, Any] = {"deviceClassName": "gpu.nvidia.com", "count": rng.choice((1, 1, 2, 4, 8))}
            if rng.random() < 0.6:
                body["selectors"] = [{"cel": {"expression": f'device.attributes["gpu.nvidia.com"].productName == '
                                                            f'"{rng.choice(MODELS)}"'}}]
            document = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                        "metadata": {"name": name, "namespace": tenant},
                        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": body}]}}}
            if await publish(subjects.submit(tenant), document, f"submit-{tenant}-{name}"):
                published[(tenant, name)] = time.monotonic()
            if allocated and rng.random() < 0.4:  # releases interleaved with submissions
                victim = next(iter(allocated))  # the longest allocated
                if await publish(subjects.release(victim[0]), {"name": victim[1]}, f"release-{victim[0]}-{victim[1]}"):
                    released.add(victim)
                    allocated.pop(victim, None)
            await asyncio.sleep(interval)

    async def chaos() -> None:
        plan: list[tuple[float, str]] = []
        t = kill_every
        while t < duration * 0.9:
            plan.append((t, "kill"))
            t += kill_every
        plan += [(duration * (i + 1) / (nats_restarts + 1) + 0.3, "nats") for i in range(nats_restarts)]
        plan += [(duration * (i + 1) / (pg_terminations + 1) + 0.6, "pg") for i in range(pg_terminations)]
        plan += [(duration * (2 * i + 1) / (2 * pg_restarts + 2) + 0.9, "pg-restart") for i in range(pg_restarts)]
        victims = ["allocator-a", "allocator-b"]
        for at, what in sorted(plan):
            await asyncio.sleep(max(0.0, started + at - time.monotonic()))
            faults.append((what, time.monotonic()))
            if what == "kill":
                victim = victims[len(faults) % 2]
                await services.kill(victim)
                await asyncio.sleep(1.0)
                await services.start(victim)
            elif what == "nats":
                server.stop()
                await asyncio.sleep(1.5)
                server.start()
            elif what == "pg-restart" and cluster is not None:
                await asyncio.to_thread(cluster.stop)
                await asyncio.sleep(1.5)
                await asyncio.to_thread(cluster.start)
            else:
                await terminate_backends(pg_admin, database)

    async def sample() -> None:
        nonlocal samples
        while True:
            await asyncio.sleep(1.0)
            services.check()
            try:
                found = await ledger_violations()
            except Exception:  # PostgreSQL restarting: the next sample reads it
                continue
            samples += 1
            breaches.extend(found[:3])

    async def ledger_violations() -> list[str]:
        async with sessions(engine)() as session:
            held = [Running(t, n, Allocation.from_json(a)) for t, n, a in await session.execute(
                select(Claim.namespace, Claim.name, Claim.allocation).where(Claim.state == "Allocated"))]
        return violations(fleet, config, held)

    sampler = asyncio.create_task(sample())
    try:
        await asyncio.gather(load(), chaos())
        settle = time.monotonic() + 30  # until every published claim has a status, or 30 s
        while time.monotonic() < settle and any(k not in first_status for k in published):
            await asyncio.sleep(0.2)
        await asyncio.sleep(2.0)  # releases published at the end reach the ledger
    finally:
        sampler.cancel()
    final_breaches = await ledger_violations()
    diagnosis: list[str] = []  # for claims with no status: is the submission in the stream, and the consumer's view
    for key in [k for k in published if k not in first_status][:3]:
        try:
            stream = await js.stream_info(subjects.CLAIMS_STREAM)
            found = "not in the stream"
            for seq in range(stream.state.first_seq, stream.state.last_seq + 1):
                with contextlib.suppress(Exception):
                    stored = await js.get_msg(subjects.CLAIMS_STREAM, seq)
                    if f'"{key[1]}"'.encode() in (stored.data or b"") and stored.subject == subjects.submit(key[0]):
                        found = f"in the stream at seq {seq}"
            async with sessions(engine)() as session:
                inbox = await session.scalar(select(InboxMessage.message_id).where(
                    InboxMessage.message_id == f"submit-{key[0]}-{key[1]}"))
                dead = await session.scalar(select(DeadLetter.error).where(
                    DeadLetter.message_id == f"submit-{key[0]}-{key[1]}"))
            info = await js.consumer_info(subjects.CLAIMS_STREAM, "allocator")
            diagnosis.append(f"{key}: {found}; inbox {inbox!r}; dead letter {dead!r}; consumer delivered "
                             f"{info.delivered.stream_seq}, ack floor {info.ack_floor.stream_seq}, "
                             f"pending {info.num_pending}, ack pending {info.num_ack_pending}, "
                             f"redelivered {info.num_redelivered}")
        except Exception as error:
            diagnosis.append(f"{key}: {error!r}")
    await services.stop()  # stopped first: the stuck check reads a ledger that no longer changes
    async with sessions(engine)() as session:
        rows = {(r.namespace, r.name): r.state for r in await session.scalars(select(Claim))}
        allocations = list(await session.scalars(select(Claim.allocation).where(Claim.state == "Allocated")))
        stuck = await missed_admissions(session, fleet, documents.classes, config)
    await cleanup.aclose()
    if not services.unexpected_exits:  # else the services' logs stay, named in the output
        shutil.rmtree(work, ignore_errors=True)

    keys = [(r["driver"], r["pool"], r["device"]) for a in allocations for r in (a or {}).get("devices", {})
            .get("results", []) if not r.get("adminAccess")]
    latencies = sorted(first_status[k] - t for k, t in published.items() if k in first_status)
    recoveries = []
    recovery_by_fault: dict[str, float] = {}
    for what, at in faults:
        after = [t for t in status_times if t > at]
        recoveries.append(min(after) - at if after else float("inf"))
        recovery_by_fault[what] = round(max(recovery_by_fault.get(what, 0.0), recoveries[-1]), 2)
    lost = [k for k in published if k not in rows]
    disagree = [k for k, s in last_status.items() if k in rows and s["state"] != rows[k]
                and not (s["state"] == "Preempted" and rows[k] in QUEUED)]
    return {
        "claims": len(published), "tenants": tenants, "nodes": nodes, "duration_s": round(duration, 1),
        "faults": {"allocator_kills": sum(w == "kill" for w, _ in faults), "nats_restarts": nats_restarts,
                   "pg_backend_terminations": pg_terminations,
                   "pg_restarts": pg_restarts if cluster is not None
                   else f"not done: no private PostgreSQL cluster here ({cannot}); backends terminated instead"},
        "devices_allocated_twice": len(keys) - len(set(keys)),
        "quota_breaches": len(breaches) + len(final_breaches), "quota_samples": samples,
        "claims_lost": len(lost), "statuses_disagreeing": len(disagree),
        "releases": len(released), "releases_lost": sum(1 for k in released if rows.get(k) in QUEUED),
        "claims_without_status": sum(1 for k in published if k not in first_status),
        "claims_stuck": len(stuck),
        "service_exits": services.unexpected_exits,
        "first_status_p50_s": round(statistics.median(latencies), 3) if latencies else None,
        "first_status_p99_s": round(latencies[int(len(latencies) * 0.99)], 3) if latencies else None,
        "first_status_max_s": round(latencies[-1], 3) if latencies else None,
        "recovery_max_s": round(max(recoveries), 2) if recoveries else None,
        "recovery_max_s_by_fault": recovery_by_fault,
        "logs": str(work) if services.unexpected_exits else None,
        "examples": {"lost": lost[:3], "disagreeing": disagree[:3], "breaches": (breaches + final_breaches)[:3],
                     "without_status": diagnosis, "stuck": stuck[:3]},
    }


async def missed_admissions(session: Any, fleet: Fleet, classes: Any, config: QuotaConfig) -> list[str]:
    """Claims Pending in the final ledger that one more cycle of the decision core would admit: the
    allocator should have admitted them already (every release and submission has been decided)."""
    queue = await load_queue(UnitOfWork(session))  # a read: nothing of it is written
    waiting = tuple(dataclasses.replace(w, answered=False) for w in queue.waiting.values())
    # by the allocator's rules: now, and its minRuntime (a claim it holds back from preemption is not stuck)
    config = dataclasses.replace(config, default_min_runtime=BrokerSettings().min_runtime)
    result = run_cycle(Snapshot(fleet, merge_classes(classes), config, tuple(queue.running.values()), waiting,
                                now=time.time()))
    return [f"{d.tenant}/{d.name}" for d in result.decisions if d.decision.state is State.ALLOCATED]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--claims", type=int, default=20_000)
    parser.add_argument("--tenants", type=int, default=20)
    parser.add_argument("--nodes", type=int, default=60, help="nodes of 8 GPUs (A100, H100, H200 in thirds)")
    parser.add_argument("--duration", type=float, default=240.0, help="seconds over which claims are published")
    parser.add_argument("--kill-every", type=float, default=8.0)
    parser.add_argument("--nats-restarts", type=int, default=2)
    parser.add_argument("--pg-terminations", type=int, default=2)
    parser.add_argument("--pg-restarts", type=int, default=1, help="of the run's own PostgreSQL cluster")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    result = asyncio.run(run(args.claims, args.tenants, args.nodes, args.duration, args.kill_every,
                             args.nats_restarts, args.pg_terminations, args.pg_restarts, args.seed))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
