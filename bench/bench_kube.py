"""The cluster path's speed (`make bench-kube`): `claimbroker up --kube` on a fake API server
(tests/kube_api.py, in this process) with `--nodes` nodes of 8 H100s as ResourceSlices; `--claims`
ResourceClaims of one GPU, annotated for the broker, created in the cluster (a burst at once, then as many
again at `--rate` a second). Prints one JSON line per phase:

{"phase", "claims", "claims_per_s" (claims / first create to the last allocation written in the cluster),
 "status_p50_ms", "status_p99_ms" (create to the claim's first status on NATS),
 "written_p50_ms", "written_p99_ms" (create to status.allocation in the cluster, polled every 10 ms),
 "unwritten" (claims without an allocation when the run gave up), "writes_per_claim" (API writes / claims),
 "broker_cpu_ms_per_claim" (CPU of `up` and its processes over the phase, less what they burn idle over as
 long (measured for 3 s before the burst), / claims: the broker's own cost, whatever else the machine runs)}.

The broker runs as a user runs it (a subprocess, SQLite in its data folder, or `--db URL`); the fake server
answers from this process's threads, so its cost is in the figures too (it is no faster than a real one).
Run: `make bench-kube`, or `python bench/bench_kube.py --nodes 125 --claims 1000 --rate 100`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import nats  # noqa: E402

from bench.e2e import percentile  # noqa: E402
from services.bus.authority import ADMIN_PASSWORD_FILE  # noqa: E402
from shared.contract import bus_auth, subjects  # noqa: E402
from shared.fleet.topology import topology_to_resource_slices  # noqa: E402
from tests.kube_api import CLAIMS, NODES, SLICES, FakeApiServer, node, serving, write_kubeconfig  # noqa: E402

NAMESPACE = "bench"
IDLE_S = 3.0


def load_fleet(api: FakeApiServer, nodes: int) -> None:
    specs: list[dict[str, Any]] = [{"name": f"node-{i:04d}", "gpuModel": "H100", "gpuCount": 8, "numaNodes": 2}
                                   for i in range(nodes)]
    topology = {"kind": "Topology", "nodes": specs}
    for spec in specs:
        api.apply(NODES, "ADDED", node(str(spec["name"]), {"nvidia.com/gpu.product": "H100"}, {}))
    for resource_slice in topology_to_resource_slices(topology):
        api.apply(SLICES, "ADDED", {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", **resource_slice})


def claim(name: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": NAMESPACE, "annotations": {"claimbroker.io/broker": "true"}},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 1}}]}}}


class Watch:
    """When each claim was created, got its first status on NATS, and had its allocation in the cluster."""

    def __init__(self, api: FakeApiServer) -> None:
        self.api = api
        self.created: dict[str, float] = {}
        self.status: dict[str, float] = {}
        self.written: dict[str, float] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()

    def _poll(self) -> None:
        """Only the claims not yet written, one short hold of the server's lock each round (a scan of every
        claim under it would slow the server being measured)."""
        while not self.stop.is_set():
            now = time.monotonic()
            waiting = [name for name in list(self.created) if name not in self.written]
            with self.api.changed:
                stored = self.api.objects[CLAIMS]
                found = [name for name in waiting
                         if ((stored.get(f"{NAMESPACE}/{name}") or {}).get("status") or {}).get("allocation")]
            for name in found:
                self.written[name] = now
            time.sleep(0.01)

    async def on_status(self, message: Any) -> None:
        name = json.loads(message.data)["name"]
        self.status.setdefault(name, time.monotonic())


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of a process and its descendants: the broker's own cost, whatever else
    the machine runs (the fake API server, this process, other work)."""
    total, stack = 0.0, [pid]
    while stack:
        current = stack.pop()
        try:
            fields = Path(f"/proc/{current}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
            for task in Path(f"/proc/{current}/task").iterdir():
                stack.extend(int(child) for child in (task / "children").read_text().split())
        except (OSError, ValueError, IndexError):
            continue
    return total


def busy_ms(cpu_s: float, idle_per_s: float, started: float, claims: int) -> float:
    """The broker's CPU milliseconds a claim over a phase, less what it burns idle over as long."""
    return round(max(0.0, cpu_s - idle_per_s * (time.monotonic() - started)) * 1000 / claims, 2)


def phase_line(phase: str, names: list[str], watch: Watch, writes: int) -> dict[str, Any]:
    to_status = [(watch.status[n] - watch.created[n]) * 1000 for n in names if n in watch.status]
    to_written = [(watch.written[n] - watch.created[n]) * 1000 for n in names if n in watch.written]
    done = [watch.written[n] for n in names if n in watch.written]
    span = max(done) - min(watch.created[n] for n in names) if done else float("nan")
    return {"phase": phase, "claims": len(names), "claims_per_s": round(len(done) / span, 1) if done else 0.0,
            "status_p50_ms": _ms(percentile(to_status, 0.5)), "status_p99_ms": _ms(percentile(to_status, 0.99)),
            "written_p50_ms": _ms(percentile(to_written, 0.5)), "written_p99_ms": _ms(percentile(to_written, 0.99)),
            "unwritten": len(names) - len(done), "writes_per_claim": round(writes / len(names), 2)}


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


async def wait_for(check: Any, timeout: float, process: asyncio.subprocess.Process, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        if process.returncode is not None:
            raise SystemExit(f"up exited:\n{log.read_text()[-3000:]}")
        await asyncio.sleep(0.05)


async def run(args: argparse.Namespace) -> None:
    with serving() as (api, url), tempfile.TemporaryDirectory(prefix="bench-kube-") as tmp:
        load_fleet(api, args.nodes)
        data, log = Path(tmp) / "data", Path(tmp) / "up.log"
        kubeconfig = write_kubeconfig(Path(tmp) / "kubeconfig", url)
        env = {k: v for k, v in os.environ.items() if not k.startswith("CLAIMBROKER_")}
        env["CLAIMBROKER_ESTIMATE_INTERVAL"] = "0"
        command = [sys.executable, "-m", "services.cli", "--data-dir", str(data), "up", "--kube", "--kubeconfig",
                   str(kubeconfig), "--api-port", "0", *(["--db", args.db] if args.db else [])]
        process = await asyncio.create_subprocess_exec(*command, env=env, stdout=asyncio.subprocess.DEVNULL,
                                                       stderr=log.open("wb"), start_new_session=True, cwd=ROOT)
        try:
            await wait_for(lambda: (data / "nats.url").exists() and (data / "nats.url").read_text().strip(), 60,
                           process, log)
            password = (data / ADMIN_PASSWORD_FILE).read_text().strip()
            nc = await nats.connect(bus_auth.url_with_user((data / "nats.url").read_text().strip(),
                                                           bus_auth.admin_user(), password))
            watch = Watch(api)
            await nc.subscribe(subjects.STATUS_ALL, cb=watch.on_status)
            probe = "probe"
            watch.created[probe] = time.monotonic()
            api.create(CLAIMS, claim(probe))
            await wait_for(lambda: probe in watch.written, 120, process, log)
            print(f"ready: {args.nodes} nodes; probe written in {(watch.written[probe] - watch.created[probe]):.2f}s",
                  file=sys.stderr)
            idle_from = tree_cpu_s(process.pid)
            await asyncio.sleep(IDLE_S)  # what the broker burns with nothing to do (cycles, heartbeats, the bus)
            idle = (tree_cpu_s(process.pid) - idle_from) / IDLE_S
            print(f"idle: {idle:.3f} CPU s a second", file=sys.stderr)
            burst = [f"burst-{i}" for i in range(args.claims)]
            before, cpu, started = api.writes(CLAIMS), tree_cpu_s(process.pid), time.monotonic()
            for name in burst:
                watch.created[name] = time.monotonic()
                api.create(CLAIMS, claim(name))
            await wait_for(lambda: all(n in watch.written for n in burst), args.timeout, process, log)
            line = phase_line("burst", burst, watch, api.writes(CLAIMS) - before - len(burst))
            line["broker_cpu_ms_per_claim"] = busy_ms(tree_cpu_s(process.pid) - cpu, idle, started, len(burst))
            print(json.dumps(line), flush=True)
            paced = [f"paced-{i}" for i in range(args.claims if args.rate else 0)]
            before, cpu, started = api.writes(CLAIMS), tree_cpu_s(process.pid), time.monotonic()
            start = time.monotonic()
            for i, name in enumerate(paced):
                await asyncio.sleep(max(0.0, start + i / args.rate - time.monotonic()))
                watch.created[name] = time.monotonic()
                api.create(CLAIMS, claim(name))
            if paced:
                await wait_for(lambda: all(n in watch.written for n in paced), args.timeout, process, log)
                line = phase_line(f"paced-{args.rate:g}/s", paced, watch, api.writes(CLAIMS) - before - len(paced))
                line["broker_cpu_ms_per_claim"] = busy_ms(tree_cpu_s(process.pid) - cpu, idle, started, len(paced))
                print(json.dumps(line), flush=True)
            watch.stop.set()
            await nc.close()
        finally:
            if process.returncode is None:
                os.killpg(process.pid, signal.SIGINT)
                try:
                    await asyncio.wait_for(process.wait(), 30)
                except TimeoutError:
                    os.killpg(process.pid, signal.SIGKILL)
            if args.log:
                Path(args.log).write_bytes(log.read_bytes())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=260, help="nodes of 8 H100s (enough for every claim)")
    parser.add_argument("--claims", type=int, default=1000, help="claims per phase")
    parser.add_argument("--rate", type=float, default=100.0, help="the paced phase's claims a second (0: none)")
    parser.add_argument("--db", default=None, help="ledger URL (default: SQLite in the data folder)")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--log", default=None, help="keep the broker's log in this file")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
