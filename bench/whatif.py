"""What-if at scale: `shared.admission.whatif.what_if` on bench-quota's fleet (1,000 nodes of 8 GPUs, 100
tenants in cohorts) with 10,000 waiting claims, for a drain of 10 nodes and for every tenant's nominal
quota raised by half. One JSON line each: seconds (both states settled), claims admitted and preempted.

What the admin API's limits are chosen from (shared/settings.py, admin_*): a what-if adding N nodes of 8
GPUs as a Topology (the job's work: the nodes built, both states settled), and a quota import of N tenants
on SQLite (the job's work: the body read, then the dry run's plan, then the import written), each in a
fresh process: seconds and peak memory. Not a timed test: run it with `make bench-whatif`.

    python bench/whatif.py [--nodes 1000] [--depth 10000] [--added 1000,5000,20000] [--tenants 10000,100000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bench_quota import SEED, build_fleet, build_quotas, new_claim  # noqa: E402
from shared.admission.cycle import run_cycle  # noqa: E402
from shared.admission.kept import KeptState  # noqa: E402
from shared.admission.model import Running, Snapshot  # noqa: E402
from shared.admission.quota import QuotaConfig, QuotaLimit  # noqa: E402
from shared.admission.whatif import Change, what_if  # noqa: E402
from shared.dra.classes import BUILTIN_CLASSES  # noqa: E402


def peak_mb() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024


def one_added(count: int) -> None:
    """A what-if adding `count` nodes to the built-in fleet, as the API's job does it after the checks."""
    from shared.contract.events import node_inventories
    from shared.dra.classes import merge_classes
    from shared.dra.inventory import Fleet
    from shared.fleet.sources import BUILTIN_TOPOLOGY, documents_from

    built = documents_from([BUILTIN_TOPOLOGY], "built-in")
    fleet = Fleet({n.node: n for n in node_inventories(built.slices, built.labels, observed_at=time.time())})
    started = time.perf_counter()
    added = documents_from([{"kind": "Topology", "nodes": [
        {"namePrefix": "extra-", "count": count, "gpuModel": "H100", "gpuCount": 8}]}], "addInventory")
    nodes = node_inventories(added.slices, added.labels, observed_at=time.time())
    built_s = time.perf_counter() - started
    what_if(fleet, merge_classes(added.classes), QuotaConfig(), [], [], {}, Change(add_nodes=nodes))
    print(json.dumps({"bench": "whatif-added", "nodes_added": count, "devices_added": count * 8,
                      "seconds": round(time.perf_counter() - started, 2), "of_which_building_nodes": round(built_s, 2),
                      "peak_mb": peak_mb()}), flush=True)


def one_import(tenants: int) -> None:
    """A quota import of `tenants` tenants (one quota each) on a fresh SQLite ledger: the JSON body read
    and checked, the dry run's plan, then the import written."""
    from services.admin_api.offload import Limits
    from services.admin_api.quotas import parse_import
    from shared.ledger.engine import create_engine, migrate, sessions
    from shared.ledger.quota_store import apply_quota_config, plan_quota_config

    body = json.dumps({"kind": "Quotas", "tenants": [{"name": f"t{i:06d}", "quotas": {"H100": {"nominal": 1}}}
                                                     for i in range(tenants)]}).encode()
    limits = replace(Limits.defaults(), import_max_tenants=tenants, import_max_quotas=tenants)

    async def run() -> dict[str, float]:
        url = f"sqlite+aiosqlite:///{tempfile.mkdtemp(prefix='bench-whatif-')}/ledger.db"
        await migrate(url)
        engine = create_engine(url)
        seconds: dict[str, float] = {}
        try:
            started = time.perf_counter()
            config = parse_import(body, limits)
            seconds["read_s"] = time.perf_counter() - started
            async with sessions(engine)() as s, s.begin():
                started = time.perf_counter()
                await plan_quota_config(s, config)
                seconds["dry_run_s"] = time.perf_counter() - started
            async with sessions(engine)() as s, s.begin():
                started = time.perf_counter()
                await apply_quota_config(s, config, "bench")
                seconds["import_s"] = time.perf_counter() - started
        finally:
            await engine.dispose()
        return seconds

    seconds = asyncio.run(run())
    print(json.dumps({"bench": "quota-import", "tenants": tenants, "body_mb": round(len(body) / 2**20, 1),
                      **{k: round(v, 2) for k, v in seconds.items()}, "peak_mb": peak_mb()}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--depth", type=int, default=10_000)
    parser.add_argument("--added", default="1000,5000,20000", help="what-ifs adding this many nodes (0: none)")
    parser.add_argument("--tenants", default="10000,100000", help="quota imports of this many tenants (0: none)")
    parser.add_argument("--one-added", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--one-import", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one_added:
        one_added(args.one_added)
        return
    if args.one_import:
        one_import(args.one_import)
        return
    rng = random.Random(SEED)
    fleet, quotas = build_fleet(args.nodes), build_quotas(args.nodes, rng)
    claims = [new_claim(rng, serial) for serial in range(1, args.depth + 1)]
    first = run_cycle(Snapshot(fleet, BUILTIN_CLASSES, quotas, (), tuple(claims)), KeptState())  # today's fleet
    by_key = {w.key: w for w in claims}
    running = [Running(d.tenant, d.name, d.decision.allocation, 0, True, by_key[(d.tenant, d.name)].arrival, i)
               for i, d in enumerate(first.decisions) if d.decision.allocation is not None]
    held = {r.key for r in running}
    waiting = [w for w in claims if w.key not in held]
    documents = {w.key: w.claim for w in claims}
    raised = replace(quotas, tenants={name: replace(t, quotas={f: QuotaLimit(q.nominal + q.nominal // 2,
                                                                           q.borrowing_limit, q.lending_limit)
                                                               for f, q in t.quotas.items()})
                                      for name, t in quotas.tenants.items()})
    for name, change in (("drain 10 nodes", Change(drain=frozenset(sorted(fleet.nodes)[:10]))),
                         ("nominal +50%", Change(quotas=raised))):
        started = time.perf_counter()
        answer = what_if(fleet, BUILTIN_CLASSES, quotas, running, waiting, documents, change)
        print(json.dumps({"bench": "whatif", "change": name, "nodes": args.nodes, "running": len(running),
                          "waiting": len(waiting), "seconds": round(time.perf_counter() - started, 2),
                          "admitted": len(answer.admitted), "preempted": len(answer.preempted)}), flush=True)
    for flag, sizes in (("--one-added", args.added), ("--one-import", args.tenants)):
        for size in (int(n) for n in sizes.split(",") if int(n) > 0):
            subprocess.run([sys.executable, __file__, flag, str(size)], check=True)


if __name__ == "__main__":
    main()
