"""One tenant floods the bus while another submits at a steady rate: does the calm tenant still get answers?
With `--bomb N`, a third phase: a third tenant submits N claims that exhaust the placement search (32
requests, each a firstAvailable of 8 subrequests with selectors of their own, under a matchAttribute on the
GPU's uuid: no node can ever hold one), and the calm tenant submits again while they wait. Its line adds the
broker's memory (the `up` process's resident set) before the bombs and after the calm phase.

`claimbroker up` on PostgreSQL (or SQLite) with a generated fleet and two tenants. The calm tenant (t00)
submits `--calm` one-GPU claims at `--calm-rate` a second, first alone (steady), then while the flooding
tenant (t01, maxPending `--max-pending`) publishes up to `--flood` claims from a process of its own as fast
as the bus takes them, retrying a refused publish at once (a hostile client, not the CLI, which backs off),
until the calm tenant's claims are answered. What
bounds the flood is the tenant's backlog on the bus (settings.tenant_backlog, `--backlog`) and its
maxPending in the ledger. One JSON line per phase: the calm tenant's publish-to-first-status p50/p99/max;
the flood line adds what the flood got through and the ratio of the p99s (the issue asks at most 2).

    python bench/flood.py [--db postgresql|sqlite] [--flood 50000] [--calm 100] [--calm-rate 10] [--bomb 200]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import nats
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from nats.js.errors import APIError  # noqa: E402

from bench.e2e import (  # noqa: E402
    Broker,
    Statuses,
    create_database,
    load_quotas,
    log,
    percentile,
    quota_document,
    tenant_name,
    topology,
)
from services.bus.streams import BACKLOG_FULL_CODE  # noqa: E402
from shared.contract import bus_auth, subjects  # noqa: E402

CALM, FLOOD, BOMB = tenant_name(0), tenant_name(1), tenant_name(2)
ATTR = 'device.attributes["gpu.nvidia.com"]'


def one_gpu(tenant: str, name: str, count: int = 1) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": tenant},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": count}}]}}}


def search_bomb(tenant: str, name: str) -> dict[str, Any]:
    """A claim Kubernetes accepts whose placement search has no end: 32 requests of 8 firstAvailable
    subrequests (256 combinations tried), each with a selector of its own, and every device of one uuid."""
    requests = [{"name": f"r{r}", "firstAvailable": [
        {"name": f"s{s}", "deviceClassName": "gpu.nvidia.com", "count": 1,
         "selectors": [{"cel": {"expression": f'{ATTR}.productName != "{name}-{r}-{s}"'}}]} for s in range(8)]}
        for r in range(32)]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": tenant},
            "spec": {"devices": {"requests": requests, "constraints": [{"matchAttribute": "gpu.nvidia.com/uuid"}]}}}


def resident_mb(pid: int) -> float:
    """The process's resident set, in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    raise RuntimeError(f"no VmRSS for process {pid}")


async def bomb_phase(js: Any, statuses: Statuses, count: int, first: int = 0) -> None:
    """The bombing tenant's claims (numbered from `first`), published as the CLI would (patiently, past its
    backlog), until every one has its first status."""
    keys = [(BOMB, f"bomb-{i:04d}") for i in range(first, first + count)]
    for key in keys:
        await publish_patiently(js, subjects.submit(BOMB), json.dumps(search_bomb(*key)).encode(), f"bomb-{key[1]}")
    deadline = time.monotonic() + 300
    while any(k not in statuses.first for k in keys):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{sum(k not in statuses.first for k in keys)} bombs had no status")
        await asyncio.sleep(0.05)


async def flood_serve(url: str, count: int) -> None:
    """The flooding tenant: every claim published, each refused one again at once, until all are in or it
    is told to stop (SIGTERM: the calm tenant's measurement is over); then its counts as one JSON line."""
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    nc = await nats.connect(url, **bus_auth.client_options(url))
    js = nc.jetstream()
    accepted = refused = 0
    started = time.perf_counter()
    while accepted < count and not stop.is_set():
        payload = json.dumps(one_gpu(FLOOD, f"flood-{accepted:06d}", 4)).encode()
        try:
            await js.publish(subjects.submit(FLOOD), payload, headers={"Nats-Msg-Id": f"flood-{accepted}"})
            accepted += 1
        except APIError as error:
            if error.err_code != BACKLOG_FULL_CODE:
                raise
            refused += 1
    print(json.dumps({"accepted": accepted, "refused_publishes": refused,
                      "seconds": round(time.perf_counter() - started, 1)}), flush=True)
    await nc.close()


async def publish_patiently(js: Any, subject: str, payload: bytes, message_id: str) -> None:
    """As the CLI publishes: on a full backlog, wait a little and publish again."""
    while True:
        try:
            await js.publish(subject, payload, headers={"Nats-Msg-Id": message_id})
            return
        except APIError as error:
            if error.err_code != BACKLOG_FULL_CODE:
                raise
            await asyncio.sleep(0.005)


async def calm_phase(js: Any, statuses: Statuses, count: int, rate: float, prefix: str) -> list[float]:
    """`count` claims at `rate` a second; each one's seconds from publish to first status. Released after,
    so the next phase starts from the same fleet."""
    published: dict[tuple[str, str], float] = {}
    start = time.perf_counter()
    for i in range(count):
        await asyncio.sleep(max(0.0, start + i / rate - time.perf_counter()))
        key = (CALM, f"{prefix}-{i:04d}")
        published[key] = time.perf_counter()
        await publish_patiently(js, subjects.submit(CALM), json.dumps(one_gpu(*key)).encode(), f"calm-{prefix}-{i}")
    deadline = time.monotonic() + 120
    while any(k not in statuses.first for k in published):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{sum(k not in statuses.first for k in published)} calm claims had no status")
        await asyncio.sleep(0.05)
    for tenant, name in published:
        await publish_patiently(js, subjects.release(tenant), json.dumps({"name": name}).encode(),
                                f"calm-release-{name}")
    return [statuses.first[k] - published[k] for k in published]


def figures(phase: str, latencies: list[float]) -> dict[str, Any]:
    def ms(value: float | None) -> float | None:
        return round(value * 1000, 1) if value is not None else None

    return {"bench": "flood", "phase": phase, "calm_claims": len(latencies),
            "p50_ms": ms(percentile(latencies, 0.5)), "p99_ms": ms(percentile(latencies, 0.99)),
            "max_ms": ms(max(latencies))}


async def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    work = Path(tempfile.mkdtemp(prefix="claimbroker-bench-flood-"))
    inventory = work / "fleet.yaml"
    inventory.write_text(yaml.safe_dump(topology(args.nodes)))
    quotas = quota_document(3 if args.bomb else 2, args.nodes)
    quotas["tenants"][1]["maxPending"] = args.max_pending
    broker = Broker(work, inventory, None, {"CLAIMBROKER_TENANT_BACKLOG": str(args.backlog)})
    drop: Callable[[], Awaitable[None]] | None = None
    flooder = None
    try:
        if args.db == "postgresql":
            broker.db_url, drop = await create_database()
            ledger = broker.db_url
        else:
            (work / "data").mkdir()
            ledger = f"sqlite+aiosqlite:///{(work / 'data' / 'ledger.db').resolve()}"
        await load_quotas(ledger, quotas)
        broker.start()
        url = await broker.nats_url()
        nc = await nats.connect(url, **bus_auth.client_options(url))
        statuses = Statuses()
        await nc.subscribe(subjects.STATUS_ALL, cb=statuses.on_status)
        js = nc.jetstream()
        probe = (CALM, "probe")
        deadline = time.monotonic() + 120
        while probe not in statuses.allocated:  # the fleet is in and the allocator answers
            broker.alive()
            if time.monotonic() > deadline:
                raise RuntimeError(f"the probe was not Allocated:\n{broker.tail()}")
            await js.publish(subjects.submit(CALM), json.dumps(one_gpu(*probe)).encode())
            await asyncio.sleep(0.5)
        await js.publish(subjects.release(CALM), json.dumps({"name": "probe"}).encode())
        lines = [figures("steady", await calm_phase(js, statuses, args.calm, args.calm_rate, "steady"))]
        log(f"steady: {lines[0]}")

        flooder = await asyncio.create_subprocess_exec(
            sys.executable, str(Path(__file__)), "--flood-serve", url, "--flood", str(args.flood),
            stdout=asyncio.subprocess.PIPE)
        while not any(key[0] == FLOOD for key in statuses.first):  # the flood is being decided
            await asyncio.sleep(0.05)
        await asyncio.sleep(1.0)  # and in full swing
        flood_line = figures("flood", await calm_phase(js, statuses, args.calm, args.calm_rate, "flood"))
        flooded = sum(1 for key in statuses.first if key[0] == FLOOD)
        flooder.terminate()  # what it would send on is beside the point once the calm tenant is measured
        out, _ = await asyncio.wait_for(flooder.communicate(), 60)
        flood = json.loads(out.decode().strip().splitlines()[-1])
        states: dict[str, int] = {}
        for key, (_, state) in statuses.last.items():
            if key[0] == FLOOD:
                states[state] = states.get(state, 0) + 1
        flood_line |= {"flood_claims": args.flood, "flood_accepted": flood["accepted"],
                       "flood_decided_during_calm": flooded, "flood_refused_publishes": flood["refused_publishes"],
                       "flood_seconds": flood["seconds"],
                       "flood_claims_per_s": round(flood["accepted"] / flood["seconds"]),
                       "flood_states_at_end": states, "tenant_backlog": args.backlog, "max_pending": args.max_pending,
                       "p99_ratio": round(flood_line["p99_ms"] / max(lines[0]["p99_ms"], 0.1), 2), "db": args.db}
        lines.append(flood_line)
        if args.bomb:
            assert broker.process is not None
            quiet_mb = resident_mb(broker.process.pid)
            started = time.perf_counter()
            await bomb_phase(js, statuses, args.bomb)
            answered_s = time.perf_counter() - started
            bomb_line = figures("bomb", await calm_phase(js, statuses, args.calm, args.calm_rate, "bomb"))
            bomb_line |= {"bombs": args.bomb, "bombs_answered_s": round(answered_s, 1),
                          "p50_ratio": round(bomb_line["p50_ms"] / max(lines[0]["p50_ms"], 0.1), 2),
                          "p99_ratio": round(bomb_line["p99_ms"] / max(lines[0]["p99_ms"], 0.1), 2),
                          "rss_before_mb": quiet_mb, "rss_after_mb": resident_mb(broker.process.pid), "db": args.db}
            lines.append(bomb_line)
        await nc.close()
        return lines
    finally:
        if flooder is not None and flooder.returncode is None:
            flooder.kill()
        await broker.stop()
        if drop is not None:
            await drop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--db", choices=("postgresql", "sqlite"), default="postgresql")
    parser.add_argument("--nodes", type=int, default=40)
    parser.add_argument("--flood", type=int, default=50_000)
    parser.add_argument("--calm", type=int, default=100)
    parser.add_argument("--calm-rate", type=float, default=10.0)
    parser.add_argument("--backlog", type=int, default=16, help="the tenants' backlog on the bus (the default's)")
    parser.add_argument("--max-pending", type=int, default=1000, help="the flooding tenant's maxPending")
    parser.add_argument("--bomb", type=int, default=0, help="claims of a third tenant that exhaust the search")
    parser.add_argument("--flood-serve", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    random.seed(args.seed)
    if args.flood_serve:
        asyncio.run(flood_serve(args.flood_serve, args.flood))
        return 0
    for figure in asyncio.run(run(args)):
        print(json.dumps(figure), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
