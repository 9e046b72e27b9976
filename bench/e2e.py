"""End-to-end speed (`make bench-e2e`): the broker started as a user starts it, measured from a plain NATS
client, against a do-nothing service on the same nats-server. Prints one JSON line per database and phase.

For each database (SQLite, the default in the data folder; PostgreSQL, a fresh database of its own on the
shared server at CLAIMBROKER_TEST_PG, created and dropped here) the run writes a Topology inventory
(`--nodes` nodes of 8 GPUs, numaNodes 2: A100, H100 and H200 nodes, and one node in twenty an H100 with MIG
slices 1g.10gb and 3g.40gb), loads quotas for `--tenants` tenants in cohorts of four into the ledger (after
`migrate`, with `apply_quota_config`), starts `python -m services.cli --data-dir DIR up --inventory FILE
--api-port PORT [--db URL]` (embedded nats-server; the allocator in a process of its own, the other services
in another), waits for DIR/nats.url, for
every node's inventory in its stream and for a probe claim to be Allocated, then measures:

- `echo`: the ceiling for a Python JetStream service on this nats-server. A do-nothing service in a
  subprocess (a durable pull consumer on a stream of its own, fetch 64, parse the JSON, publish a status-like
  JSON message with a Nats-Msg-Id and await its ack, ack the input: the allocator's loop without a decision or
  a ledger) carries as many claim documents as the burst has; messages/s from the first publish to the last
  reply received, p50/p99 from each publish to its reply.
- `burst`: `--claims` claims (one, two and four GPUs, some on one NUMA node by `matchAttribute:
  gpu.nvidia.com/numa-node`, some by GPU model, some MIG slices by profile) from all tenants, published at
  once with `js.publish_async` and Nats-Msg-Id headers; claims/s = claims / (first publish to the last
  claim's first status on `claimbroker.v1.claims.status.>`), p50/p99 from each publish to its first status.
- `churn`: then, `--churn-rate` times a second for `--churn-seconds`, release one Allocated claim and submit
  a new one; claims/s as for the burst, p50/p99 from each new claim's publish to its first status.
- `echo-churn`: the echo service again, its messages published at the churn's rate (two a tick, as many as
  the churn's releases and claims): p50/p99 from each publish to its reply, the floor of what this bus and
  machine allow the churn's first statuses.

Every line: {"db", "phase", "claims", "claims_per_s", "echo_per_s", "ratio" (claims_per_s / echo_per_s,
both of this run and this nats-server), "p50_ms", "p99_ms", "without_status" (claims that got no status
before the run gave up waiting: 0 when all is well)}. Progress goes to stderr. The broker is stopped with
SIGINT (a non-zero exit fails the run) and its data folder and database are removed.

Run: `make bench-e2e`, or `python bench/e2e.py --db sqlite --claims 2000 --churn-seconds 5`; `--quick` is
the test's small run (tests/e2e/test_bench_e2e.py).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import asyncpg  # noqa: E402
import nats  # noqa: E402
import yaml  # noqa: E402
from nats.errors import TimeoutError as NatsTimeout  # noqa: E402
from nats.js.api import AckPolicy, ConsumerConfig, StorageType, StreamConfig  # noqa: E402

from services.bus.authority import ADMIN_PASSWORD_FILE  # noqa: E402
from shared.contract import bus_auth, subjects  # noqa: E402

SHARED_PG = os.environ.get("CLAIMBROKER_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
MODELS = ("A100", "H100", "H200")
MIG_LAYOUT = {0: "all-1g.10gb", 1: "all-1g.10gb", 2: ["3g.40gb", "3g.40gb"], 3: ["3g.40gb", "3g.40gb"]}
MIG_PER_NODE = {"H100-1g.10gb": 14, "H100-3g.40gb": 4}  # what MIG_LAYOUT makes of a node's GPUs 0 to 3
ECHO_IN, ECHO_OUT = "BENCH_E2E_ECHO_IN", "BENCH_E2E_ECHO_OUT"
ECHO_IN_SUBJECTS, ECHO_OUT_SUBJECTS = "bench.e2e.echo.in.>", "bench.e2e.echo.out.>"
NUMA = "gpu.nvidia.com/numa-node"
ATTR = 'device.attributes["gpu.nvidia.com"]'
STALL_S = 90.0  # give up waiting for statuses after this long without a new first status


def log(message: str) -> None:
    print(f"[bench-e2e {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


# ----------------------------------------------------------------------------------------------- workload


def node_counts(nodes: int) -> tuple[list[int], int]:
    """Whole-GPU nodes per model, and the H100 nodes with MIG slices (one in twenty, at least one)."""
    mig = max(1, nodes // 20)
    rest = max(len(MODELS), nodes - mig)
    per = rest // len(MODELS)
    return [per, per, rest - 2 * per], mig


def topology(nodes: int) -> dict[str, Any]:
    counts, mig = node_counts(nodes)
    entries: list[dict[str, Any]] = [
        {"namePrefix": f"{model.lower()}-", "count": count, "gpuModel": model, "gpuCount": 8, "numaNodes": 2,
         "nodeLabels": {"nvidia.com/gpu.product": model}} for model, count in zip(MODELS, counts, strict=True)]
    entries.append({"namePrefix": "h100mig-", "count": mig, "gpuModel": "H100", "gpuCount": 8, "numaNodes": 2,
                    "nodeLabels": {"nvidia.com/gpu.product": "H100", "nvidia.com/mig.strategy": "mixed"},
                    "mig": MIG_LAYOUT})
    return {"kind": "Topology", "nodes": entries}


def quota_document(tenants: int, nodes: int) -> dict[str, Any]:
    """Each flavor's devices split among the tenants' nominal quotas (what the division leaves over is free
    capacity), in cohorts of four; every third tenant may borrow 8 of each whole-GPU flavor, every fourth
    lends at most half of its nominal."""
    counts, mig = node_counts(nodes)
    totals = {model: count * 8 for model, count in zip(MODELS, counts, strict=True)}
    totals["H100"] += mig * (8 - len(MIG_LAYOUT))
    totals.update({flavor: per_node * mig for flavor, per_node in MIG_PER_NODE.items()})
    rows = []
    for t in range(tenants):
        limits: dict[str, Any] = {}
        for flavor, total in totals.items():
            nominal = total // tenants
            if nominal == 0:
                continue
            limit: dict[str, Any] = {"nominal": nominal}
            if t % 3 == 0 and flavor in MODELS:
                limit["borrowingLimit"] = 8
            if t % 4 == 1:
                limit["lendingLimit"] = nominal // 2
            limits[flavor] = limit
        rows.append({"name": tenant_name(t), "cohort": f"c{t // 4}", "quotas": limits})
    return {"kind": "Quotas", "cohorts": [{"name": f"c{c}"} for c in range((tenants + 3) // 4)], "tenants": rows}


def tenant_name(t: int) -> str:
    return f"t{t:02d}"


def claim_document(rng: random.Random, tenant: str, name: str) -> dict[str, Any]:
    """One claim of the mix: 12% a MIG slice by profile, 40% one GPU, 15% two GPUs, 15% two GPUs on one NUMA
    node, 18% four GPUs on one NUMA node; half of the whole-GPU claims name a model."""
    roll = rng.random()
    constraints: list[dict[str, Any]] = []
    if roll < 0.12:
        profile = rng.choice(("1g.10gb", "1g.10gb", "1g.10gb", "3g.40gb"))
        body: dict[str, Any] = {"deviceClassName": "mig.nvidia.com", "allocationMode": "ExactCount", "count": 1,
                                "selectors": [{"cel": {"expression": f'{ATTR}.profile == "{profile}"'}}]}
    else:
        count = 1 if roll < 0.52 else 2 if roll < 0.82 else 4
        body = {"deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": count}
        if rng.random() < 0.5:
            model = rng.choice(MODELS)
            body["selectors"] = [{"cel": {"expression": f'{ATTR}.productName == "{model}"'}}]
        if roll >= 0.67:
            constraints.append({"requests": ["gpu"], "matchAttribute": NUMA})
    devices: dict[str, Any] = {"requests": [{"name": "gpu", "exactly": body}]}
    if constraints:
        devices["constraints"] = constraints
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": tenant}, "spec": {"devices": devices}}


# ------------------------------------------------------------------------------------------------ figures


def percentile(values: list[float], fraction: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))]


def line(db: str, phase: str, published: dict[Any, float], answered: dict[Any, float],
         echo_per_s: float | None) -> dict[str, Any]:
    """The phase's JSON line: rate over first publish to last answer, latency per message."""
    latencies = [answered[k] - t for k, t in published.items() if k in answered]
    rate = None
    if latencies and published:
        span = max(answered[k] for k in published if k in answered) - min(published.values())
        rate = round(len(latencies) / span, 1) if span > 0 else None
    echo = rate if phase == "echo" else echo_per_s
    p50, p99 = percentile(latencies, 0.5), percentile(latencies, 0.99)
    return {"db": db, "phase": phase, "claims": len(published), "claims_per_s": rate, "echo_per_s": echo,
            "ratio": round(rate / echo, 3) if rate and echo else None,
            "p50_ms": round(p50 * 1000, 1) if p50 is not None else None,
            "p99_ms": round(p99 * 1000, 1) if p99 is not None else None,
            "without_status": sum(1 for k in published if k not in answered)}


async def wait_until_answered(what: str, published: dict[Any, float], answered: dict[Any, float],
                              stall: float = STALL_S) -> None:
    """Until every published key has an answer, or none came for `stall` seconds; progress every 5 s."""
    last_count, last_progress, last_report = -1, time.monotonic(), time.monotonic()
    while True:
        count = sum(1 for k in published if k in answered)
        now = time.monotonic()
        if count == len(published):
            return
        if count != last_count:
            last_count, last_progress = count, now
        elif now - last_progress > stall:
            log(f"{what}: gave up: {len(published) - count} of {len(published)} without an answer after "
                f"{stall:.0f}s without progress")
            return
        if now - last_report >= 5:
            log(f"{what}: {count} of {len(published)} answered")
            last_report = now
        await asyncio.sleep(0.05)


# --------------------------------------------------------------------------------------------------- echo


async def echo_serve(url: str, count: int, deadline_s: float) -> None:
    """The do-nothing service (a subprocess of the benchmark): the allocator's loop without its work."""
    nc = await nats.connect(url, max_reconnect_attempts=1)  # the benchmark's nats-server gone: stop
    js = nc.jetstream()
    sub = await js.pull_subscribe(ECHO_IN_SUBJECTS, durable="echo", stream=ECHO_IN)
    print("ready", flush=True)
    done, sequence = 0, 0
    deadline = time.monotonic() + deadline_s
    while done < count and time.monotonic() < deadline and not nc.is_closed:
        try:
            messages = await sub.fetch(64, timeout=0.5)
        except (NatsTimeout, TimeoutError):
            continue
        for message in messages:
            claim = json.loads(message.data)
            metadata = claim["metadata"]
            sequence += 1
            status = {"namespace": metadata["namespace"], "name": metadata["name"], "state": "Allocated",
                      "allocation": {"nodeName": "node", "devices": {"results": []}}, "reason": None,
                      "observedAt": datetime.now(UTC).isoformat(), "sequence": 1}
            await js.publish(f"bench.e2e.echo.out.{metadata['namespace']}.{metadata['name']}",
                             json.dumps(status).encode(), headers={"Nats-Msg-Id": f"echo-out-{sequence}"})
            await message.ack()
        done += len(messages)
    await nc.close()


async def echo_phase(url: str, documents: list[dict[str, Any]],
                     per_second: float | None = None) -> tuple[dict[Any, float], dict[Any, float]]:
    """The echo service carrying `documents`: all at once (its ceiling), or `per_second` a second (its
    latency at the churn's message rate: the floor of what this bus allows a first status)."""
    nc = await nats.connect(url)
    js = nc.jetstream(publish_async_max_pending=len(documents) + 1)
    for name, subject in ((ECHO_IN, ECHO_IN_SUBJECTS), (ECHO_OUT, ECHO_OUT_SUBJECTS)):
        await js.add_stream(StreamConfig(name=name, subjects=[subject], storage=StorageType.FILE,
                                         duplicate_window=600.0))
    await js.add_consumer(ECHO_IN, ConsumerConfig(durable_name="echo", ack_policy=AckPolicy.EXPLICIT,
                                                  ack_wait=30.0))
    answered: dict[Any, float] = {}

    async def on_reply(message: Any) -> None:
        status = json.loads(message.data)
        answered.setdefault((status["namespace"], status["name"]), time.perf_counter())

    await nc.subscribe(ECHO_OUT_SUBJECTS, cb=on_reply)
    await nc.flush()
    service = await asyncio.create_subprocess_exec(
        sys.executable, str(Path(__file__).resolve()), "--echo-serve", url, "--echo-count", str(len(documents)),
        stdout=asyncio.subprocess.PIPE, cwd=str(ROOT))
    assert service.stdout is not None
    ready = await asyncio.wait_for(service.stdout.readline(), 60)
    if ready.strip() != b"ready":
        raise RuntimeError(f"echo service did not start: {ready!r}")
    published, acks = await publish_all(js, documents, lambda tenant: f"bench.e2e.echo.in.{tenant}", "echo-in",
                                        per_second)
    await report_failed_acks("echo", acks)
    await wait_until_answered("echo", published, answered, stall=30)
    try:
        await asyncio.wait_for(service.wait(), 30)
    except TimeoutError:
        service.kill()
        await service.wait()
    for name in (ECHO_IN, ECHO_OUT):
        with contextlib.suppress(Exception):
            await js.delete_stream(name)
    await nc.close()
    return published, answered


async def report_failed_acks(what: str, acks: list[Any]) -> None:
    results = await asyncio.gather(*acks, return_exceptions=True)
    failed = [r for r in results if isinstance(r, BaseException)]
    duplicates = sum(1 for r in results if not isinstance(r, BaseException) and getattr(r, "duplicate", False))
    if failed or duplicates:
        log(f"{what}: {len(failed)} publishes failed ({failed[:1]!r}), {duplicates} dropped as duplicates")


# ------------------------------------------------------------------------------------------------- broker


class Statuses:
    """Every claim status: when each claim got its first, and which claims are Allocated now (oldest first)."""

    def __init__(self) -> None:
        self.first: dict[tuple[str, str], float] = {}
        self.last: dict[tuple[str, str], tuple[int, str]] = {}
        self.allocated: dict[tuple[str, str], None] = {}
        self.released: set[tuple[str, str]] = set()

    async def on_status(self, message: Any) -> None:
        status = json.loads(message.data)
        key = (status["namespace"], status["name"])
        self.first.setdefault(key, time.perf_counter())
        previous = self.last.get(key)
        if previous is not None and status["sequence"] < previous[0]:
            return
        self.last[key] = (status["sequence"], status["state"])
        if status["state"] == "Allocated" and key not in self.released:
            self.allocated.setdefault(key, None)
        else:
            self.allocated.pop(key, None)


class Broker:
    """`claimbroker up` as a subprocess, stopped with SIGINT."""

    def __init__(self, work: Path, inventory: Path, db_url: str | None, env: dict[str, str] | None = None) -> None:
        self.extra_env = dict(env or {})  # CLAIMBROKER_* settings asked for with --env; no other is passed on
        self.data = work / "data"
        self.log_path = work / "broker.log"
        self.inventory, self.db_url = inventory, db_url
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        # the burst publishes every claim at once, far deeper than a tenant's backlog on the bus may be
        # (settings.tenant_backlog): lifted here, so the figures measure the broker, not the limit
        env = ({k: v for k, v in os.environ.items() if not k.startswith("CLAIMBROKER_")}
               | {"CLAIMBROKER_TENANT_BACKLOG": "1000000"} | self.extra_env)
        command = [sys.executable, "-m", "services.cli", "--data-dir", str(self.data), "up",
                   "--inventory", str(self.inventory), "--api-port", str(free_port())]
        if self.db_url:
            command += ["--db", self.db_url]
        with open(self.log_path, "ab") as output:
            self.process = subprocess.Popen(command, cwd=str(ROOT), env=env, stdout=output,
                                            stderr=subprocess.STDOUT, start_new_session=True)

    def alive(self) -> None:
        assert self.process is not None
        if self.process.poll() is not None:
            raise RuntimeError(f"claimbroker up exited with {self.process.returncode}:\n{self.tail()}")

    def tail(self, lines: int = 30) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return ""

    def cpu_seconds(self) -> dict[str, float]:
        """CPU seconds (user and system) each of the broker's processes has used so far: `up`, its
        nats-server, and its service processes (`spawn-<pid>`; the allocator is the busiest). Unlike the
        latencies, their difference over a phase hardly moves with what else the machine runs."""
        assert self.process is not None
        ticks = os.sysconf("SC_CLK_TCK")
        used: dict[str, float] = {}
        for stat in Path("/proc").glob("[0-9]*/stat"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                fields = stat.read_text().rsplit(")", 1)[1].split()
                pid = int(stat.parent.name)
                if pid != self.process.pid and int(fields[1]) != self.process.pid:
                    continue
                command = (stat.parent / "cmdline").read_bytes()
                name = ("up" if pid == self.process.pid else "nats-server" if b"nats-server" in command
                        else f"spawn-{pid}")
                used[name] = (int(fields[11]) + int(fields[12])) / ticks
        return used

    async def nats_url(self, timeout: float = 120.0) -> str:
        path = self.data / "nats.url"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.alive()
            password = self.data / ADMIN_PASSWORD_FILE  # the data folder's bus admin, as its CLI uses it
            if path.exists() and (url := path.read_text().strip()):
                return bus_auth.url_with_user(url, bus_auth.admin_user(), password.read_text().strip())
            await asyncio.sleep(0.05)
        raise RuntimeError(f"no {path} after {timeout:.0f}s:\n{self.tail()}")

    async def stop(self, timeout: float = 60.0) -> int:
        """SIGINT, as Ctrl-C; the exit status (killed after `timeout`: then the embedded nats-server too)."""
        if self.process is None:
            return 0
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
        try:
            return await asyncio.to_thread(self.process.wait, timeout)
        except subprocess.TimeoutExpired:
            log(f"claimbroker up did not stop within {timeout:.0f}s of SIGINT; killing it")
            self.process.kill()
            self.process.wait()
            for ports in (self.data / "nats" / "ports").glob("nats-server_*.ports"):  # its own nats-server
                with contextlib.suppress(ValueError, ProcessLookupError):
                    os.kill(int(ports.stem.rsplit("_", 1)[1]), signal.SIGKILL)
            return -9


async def wait_ready(broker: Broker, js: Any, statuses: Statuses, nodes: int, tenant: str,
                     timeout: float = 180.0) -> None:
    """Every node's inventory in its stream, then probe claims until one is Allocated (the allocator has
    read the fleet and decides); the probes are released."""
    deadline = time.monotonic() + timeout
    held = 0
    while time.monotonic() < deadline:
        broker.alive()
        with contextlib.suppress(Exception):
            held = (await js.stream_info(subjects.INVENTORY_STREAM)).state.messages
            if held >= nodes:
                break
        await asyncio.sleep(0.1)
    else:
        raise RuntimeError(f"only {held} of {nodes} nodes' inventory in the stream after {timeout:.0f}s")
    probe = 0
    while time.monotonic() < deadline:
        probe += 1
        key = (tenant, f"probe-{probe}")
        document = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                    "metadata": {"name": key[1], "namespace": tenant},
                    "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                        "deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 1}}]}}}
        await js.publish(subjects.submit(tenant), json.dumps(document).encode(),
                         headers={"Nats-Msg-Id": f"probe-{tenant}-{key[1]}"})
        until = time.monotonic() + 10
        while time.monotonic() < until and key not in statuses.first:
            broker.alive()
            await asyncio.sleep(0.02)
        state = statuses.last.get(key, (0, "none"))[1]
        statuses.released.add(key)
        statuses.allocated.pop(key, None)
        await js.publish(subjects.release(tenant), json.dumps({"name": key[1]}).encode(),
                         headers={"Nats-Msg-Id": f"probe-release-{tenant}-{key[1]}"})
        if state == "Allocated":
            await asyncio.sleep(0.5)  # the probe's release decided before the burst
            return
        await asyncio.sleep(0.5)
    raise RuntimeError(f"no probe claim was Allocated within {timeout:.0f}s:\n{broker.tail()}")


async def publish_all(js: Any, documents: list[dict[str, Any]], subject_of: Callable[[str], str],
                      id_prefix: str, per_second: float | None = None) -> tuple[dict[Any, float], list[Any]]:
    """Publish every claim document (publish_async), each to its tenant's subject with a Nats-Msg-Id: at
    once, or `per_second` a second; when each was published, and the acknowledgements to await."""
    published: dict[Any, float] = {}
    acks = []
    start = time.perf_counter()
    for i, document in enumerate(documents):
        if per_second is not None and (delay := start + i / per_second - time.perf_counter()) > 0:
            await asyncio.sleep(delay)
        metadata = document["metadata"]
        key = (metadata["namespace"], metadata["name"])
        published[key] = time.perf_counter()
        acks.append(await js.publish_async(subject_of(key[0]), json.dumps(document).encode(),
                                           headers={"Nats-Msg-Id": f"{id_prefix}-{key[0]}-{key[1]}"}))
    return published, acks


async def burst_phase(js: Any, statuses: Statuses, documents: list[dict[str, Any]]) -> dict[Any, float]:
    published, acks = await publish_all(js, documents, subjects.submit, "submit")
    log(f"burst: {len(documents)} claims published in {time.perf_counter() - min(published.values()):.2f}s")
    await report_failed_acks("burst", acks)
    await wait_until_answered("burst", published, statuses.first)
    return published


async def churn_phase(js: Any, statuses: Statuses, rng: random.Random, tenants: int, rate: float,
                      seconds: float) -> dict[Any, float]:
    published: dict[Any, float] = {}
    acks = []
    ticks = round(rate * seconds)
    no_release = 0
    start = time.perf_counter()
    for tick in range(ticks):
        delay = start + tick / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if statuses.allocated:
            victim = next(iter(statuses.allocated))  # the longest allocated
            statuses.allocated.pop(victim)
            statuses.released.add(victim)
            acks.append(await js.publish_async(subjects.release(victim[0]), json.dumps({"name": victim[1]}).encode(),
                                               headers={"Nats-Msg-Id": f"release-{victim[0]}-{victim[1]}"}))
        else:
            no_release += 1
        tenant = tenant_name(rng.randrange(tenants))
        key = (tenant, f"churn-{tick:06d}")
        document = claim_document(rng, *key)
        published[key] = time.perf_counter()
        acks.append(await js.publish_async(subjects.submit(tenant), json.dumps(document).encode(),
                                           headers={"Nats-Msg-Id": f"submit-{tenant}-{key[1]}"}))
    behind = time.perf_counter() - start - seconds
    log(f"churn: {ticks} ticks published ({no_release} without an Allocated claim to release); "
        f"the publisher ended {behind:.2f}s behind schedule")
    await report_failed_acks("churn", acks)
    await wait_until_answered("churn", published, statuses.first)
    return published


def parts_of(log_path: Path, start: int) -> dict[str, Any]:
    """Where the allocator's time went, from its JSON log after byte `start`: per message, each part of the
    decision transactions (turn, inbox, parse, quotas, intake, queue, decide, write, flush, commit) summed
    over the transactions and divided by their messages; per event, the outbox relay's (read, publish,
    mark); and the transactions' mean size and depth waiting."""
    transactions: list[dict[str, Any]] = []
    relays: list[dict[str, Any]] = []
    with log_path.open("rb") as lines:
        lines.seek(start)
        for raw in lines:
            if not raw.startswith(b"{"):
                continue
            record = json.loads(raw)
            if record.get("message") == "decision batch":
                transactions.append(record)
            elif record.get("message") == "outbox batch":
                relays.append(record)

    def per(records: list[dict[str, Any]], count: str) -> dict[str, float]:
        total = sum(r[count] for r in records) or 1
        sums: dict[str, float] = {}
        for r in records:
            for part, ms in r.get("parts_ms", {}).items():
                sums[part] = sums.get(part, 0.0) + ms
        return {part: round(ms / total, 3) for part, ms in sums.items()}

    messages = sum(r["messages"] for r in transactions)
    return {"transactions": len(transactions), "messages": messages,
            "messages_per_transaction": round(messages / len(transactions), 1) if transactions else None,
            "transaction_ms_mean": round(sum(r["transaction_ms"] for r in transactions) / len(transactions), 1)
            if transactions else None,
            "waiting_mean": round(sum(r["waiting"] for r in transactions) / len(transactions))
            if transactions else None,
            "per_message_ms": per(transactions, "messages"), "outbox_batches": len(relays),
            "outbox_per_event_ms": per(relays, "events")}


def state_counts(statuses: Statuses, keys: dict[Any, float]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for key in keys:
        state = statuses.last.get(key, (0, "no status"))[1]
        counts[state] = counts.get(state, 0) + 1
    return counts


# ---------------------------------------------------------------------------------------------------- run


async def create_database() -> tuple[str, Callable[[], Awaitable[None]]]:
    name = f"cb_bench_e2e_{uuid.uuid4().hex[:10]}"
    admin_url = SHARED_PG.replace("postgresql://", "postgres://", 1)
    admin = await asyncpg.connect(admin_url)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()

    async def drop() -> None:
        connection = await asyncpg.connect(admin_url)
        try:
            await connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await connection.close()

    return SHARED_PG.rsplit("/", 1)[0] + "/" + name, drop


async def load_quotas(db_url: str, document: dict[str, Any]) -> None:
    from shared.admission.quota import parse_quotas
    from shared.ledger.engine import create_engine, migrate, sessions
    from shared.ledger.quota_store import apply_quota_config

    await migrate(db_url)
    engine = create_engine(db_url)
    try:
        async with sessions(engine)() as session, session.begin():
            await apply_quota_config(session, parse_quotas(document), "bench-e2e")
    finally:
        await engine.dispose()


async def run_one(db: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix=f"claimbroker-bench-e2e-{db}-"))
    inventory = work / "fleet.yaml"
    inventory.write_text(yaml.safe_dump(topology(args.nodes)))
    drop: Callable[[], Awaitable[None]] | None = None
    broker_db: str | None = None
    # JSON logs: a line per decision transaction, where its time went (parts_of)
    broker = Broker(work, inventory, None, {"CLAIMBROKER_LOG_FORMAT": "json",
                                            **dict(item.split("=", 1) for item in args.env)})
    nc = None
    lines: list[dict[str, Any]] = []
    failed = False
    try:
        if db == "postgresql":
            broker_db, drop = await create_database()
            broker.db_url = ledger = broker_db
        else:
            ledger = f"sqlite+aiosqlite:///{(work / 'data' / 'ledger.db').resolve()}"  # up's default, in its data dir
            (work / "data").mkdir()
        await load_quotas(ledger, quota_document(args.tenants, args.nodes))
        started = time.monotonic()
        broker.start()
        url = await broker.nats_url()
        statuses = Statuses()

        async def quiet(_: Exception) -> None:
            return None

        nc = await nats.connect(url, error_cb=quiet, **bus_auth.client_options(url))
        js = nc.jetstream(publish_async_max_pending=args.claims + int(args.churn_rate * args.churn_seconds) * 2 + 100)
        await nc.subscribe(subjects.STATUS_ALL, cb=statuses.on_status)
        await nc.flush()
        await wait_ready(broker, js, statuses, args.nodes, tenant_name(0))
        log(f"{db}: broker ready in {time.monotonic() - started:.1f}s ({args.nodes} nodes, {args.tenants} tenants)")

        echo_docs = [claim_document(random.Random(args.seed + 1), tenant_name(i % args.tenants), f"echo-{i:06d}")
                     for i in range(args.claims)]
        sent, replied = await echo_phase(url, echo_docs)
        lines.append(line(db, "echo", sent, replied, None))
        echo_per_s = lines[-1]["claims_per_s"]
        print(json.dumps(lines[-1]), flush=True)

        documents = [claim_document(rng, tenant_name(rng.randrange(args.tenants)), f"burst-{i:06d}")
                     for i in range(args.claims)]
        published = await burst_phase(js, statuses, documents)
        lines.append(line(db, "burst", published, statuses.first, echo_per_s))
        print(json.dumps(lines[-1]), flush=True)
        log(f"burst: states {state_counts(statuses, published)}")

        log_from = broker.log_path.stat().st_size
        cpu_from = broker.cpu_seconds()
        published = await churn_phase(js, statuses, rng, args.tenants, args.churn_rate, args.churn_seconds)
        cpu_used = {name: seconds - cpu_from.get(name, 0.0) for name, seconds in broker.cpu_seconds().items()}
        lines.append(line(db, "churn", published, statuses.first, echo_per_s))
        print(json.dumps(lines[-1]), flush=True)
        log(f"churn: states {state_counts(statuses, published)}")
        # CPU of each broker process per churn message (a release or a claim), busiest first
        cpu = {name: round(seconds * 1000 / max(1, 2 * len(published)), 3)
               for name, seconds in sorted(cpu_used.items(), key=lambda item: -item[1])}
        print(json.dumps({"db": db, "phase": "churn-parts", **parts_of(broker.log_path, log_from),
                          "cpu_ms_per_message": cpu}), flush=True)

        # the echo service at the churn's message rate (a release and a claim a tick): its latency beside
        # the broker's, on the same bus in the same run
        paced = [claim_document(random.Random(args.seed + 2), tenant_name(i % args.tenants), f"echo-churn-{i:06d}")
                 for i in range(round(2 * args.churn_rate * args.churn_seconds))]
        sent, replied = await echo_phase(url, paced, 2 * args.churn_rate)
        lines.append(line(db, "echo-churn", sent, replied, echo_per_s))
        print(json.dumps(lines[-1]), flush=True)
    except BaseException:
        failed = True
        raise
    finally:
        if nc is not None:
            with contextlib.suppress(Exception):
                await nc.close()
        code = await broker.stop()
        if code != 0:
            log(f"{db}: claimbroker up exited with {code} after SIGINT, not 0:\n{broker.tail()}")
            if not failed:
                raise SystemExit(1)
        elif failed:
            log(f"{db}: broker log tail:\n{broker.tail()}")
        if drop is not None and not args.keep:
            await drop()
        if args.keep:
            log(f"{db}: kept {work} (broker.log, data){f' and database {broker_db}' if broker_db else ''}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return lines


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--db", choices=("sqlite", "postgresql", "both"), default="both")
    parser.add_argument("--claims", type=int, default=10_000, help="claims in the burst (and messages of echo)")
    parser.add_argument("--nodes", type=int, default=500, help="nodes of 8 GPUs")
    parser.add_argument("--tenants", type=int, default=20)
    parser.add_argument("--churn-rate", type=float, default=200.0, help="releases and submissions a second")
    parser.add_argument("--churn-seconds", type=float, default=20.0)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--quick", action="store_true",
                        help="a small run for the test: 300 claims, 40 nodes, 4 tenants, churn 50/s for 2 s")
    parser.add_argument("--keep", action="store_true", help="keep the data folder, broker log and database")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="a setting for the broker, e.g. CLAIMBROKER_LOG_FORMAT=json (repeatable)")
    parser.add_argument("--echo-serve", metavar="URL", help=argparse.SUPPRESS)  # the echo service subprocess
    parser.add_argument("--echo-count", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.claims, args.nodes, args.tenants, args.churn_rate, args.churn_seconds = 300, 40, 4, 50.0, 2.0
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.echo_serve:
        asyncio.run(echo_serve(args.echo_serve, args.echo_count, deadline_s=600))
        return 0
    databases = ("sqlite", "postgresql") if args.db == "both" else (args.db,)
    missing = 0
    for db in databases:
        lines = asyncio.run(run_one(db, args))
        missing += sum(entry["without_status"] for entry in lines)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
