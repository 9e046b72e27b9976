"""What-if at scale: `shared.admission.whatif.what_if` on bench-quota's fleet (1,000 nodes of 8 GPUs, 100
tenants in cohorts) with 10,000 waiting claims, for a drain of 10 nodes and for every tenant's nominal
quota raised by half. One JSON line each: seconds (both states settled), claims admitted and preempted.
Not a timed test: run it with `make bench-whatif`.

    python bench/whatif.py [--nodes 1000] [--depth 10000]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bench_quota import SEED, build_fleet, build_quotas, new_claim  # noqa: E402
from shared.admission.cycle import run_cycle  # noqa: E402
from shared.admission.kept import KeptState  # noqa: E402
from shared.admission.model import Running, Snapshot  # noqa: E402
from shared.admission.quota import QuotaLimit  # noqa: E402
from shared.admission.whatif import Change, what_if  # noqa: E402
from shared.dra.classes import BUILTIN_CLASSES  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--depth", type=int, default=10_000)
    args = parser.parse_args()
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


if __name__ == "__main__":
    main()
