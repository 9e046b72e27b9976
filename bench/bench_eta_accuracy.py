"""How good the start estimates are (issue 39), on a synthetic trace run simulate-style through the decision
core: claims of 1, 2, 4 or 8 GPUs arrive (Poisson, at `--load` of the fleet's capacity) on `--nodes` nodes x 8
GPUs, each runs a lognormal time (its tenant's median, 20 minutes to 4 hours, sigma 1), and in the annotated
run half of them carry claimbroker.io/expected-runtime: what its user expected, the actual runtime times a
lognormal error (sigma `--annotation-error`, default 0.3). Every `--tick` seconds of the trace's clock, as the
allocator's cycles and its estimator would: the claims that ended leave, the arrived ones queue, cycles run
until settled, then each claim that waits and has no estimate yet gets its estimate at submission
(estimate_starts on that snapshot, with the runtimes observed so far per tenant, as the estimator reads them
from the ledger, and one EstimateMemo kept). At its actual start, |start - p50| is its error.
The same trace (same arrivals, sizes and runtimes) runs twice: with half the claims annotated, and with none.
The first `--warmup` of the trace is left out of the figures (runtimes observed are few there).
Prints one JSON line per run: claims that waited, median and p90 absolute error of the p50 in minutes (all,
and in the annotated run the annotated and the other half), the signed error's p10, p50 and p90 (actual start -
p50: above 0, later than said), the waits themselves and the waits said (p50 - submission), median and p90,
and the share that started within [p50, p90] and before p90 (a tick's slack either side).
Run: `make bench-eta` prints the cost; this prints the accuracy (`python bench/bench_eta_accuracy.py`).
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import random
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from shared.admission.estimate_publishing import quantile, runtimes_from  # noqa: E402
from shared.admission.estimates import EstimateMemo, Runtimes, estimate_starts  # noqa: E402
from shared.admission.model import ClaimKey, CycleResult, Running, Waiting  # noqa: E402
from shared.admission.quota import QuotaConfig  # noqa: E402
from shared.admission.sim_clock import ClockedQueue  # noqa: E402
from shared.dra import model as dra  # noqa: E402
from shared.dra.classes import BUILTIN_CLASSES  # noqa: E402
from shared.dra.inventory import Fleet  # noqa: E402
from shared.fleet.sources import documents_from  # noqa: E402

START = 1_767_225_600.0  # 2026-01-01T00:00:00Z: the trace's clock
TENANT_MEDIANS = {"short": 1200.0, "medium": 3600.0, "long": 7200.0, "longest": 14400.0}  # seconds
SIGMA = 1.0  # of each tenant's lognormal runtimes
SIZES = (1, 1, 2, 2, 4, 8)


@dataclass(frozen=True)
class TraceClaim:
    tenant: str
    name: str
    arrives: float
    size: int
    runtime: float  # what it actually runs
    expected: float  # what its user would annotate


def trace(claims: int, nodes: int, load: float, annotation_error: float, seed: int) -> list[TraceClaim]:
    """Arrivals at `load` of the fleet's GPU-seconds: the mean claim holds mean(size) x mean(runtime)."""
    rng = random.Random(seed)
    mean_size = sum(SIZES) / len(SIZES)
    mean_runtime = sum(m * math.exp(SIGMA**2 / 2) for m in TENANT_MEDIANS.values()) / len(TENANT_MEDIANS)
    rate = load * nodes * 8 / (mean_size * mean_runtime)  # claims per second
    out, at = [], START
    tenants = sorted(TENANT_MEDIANS)
    for i in range(claims):
        at += rng.expovariate(rate)
        tenant = rng.choice(tenants)
        runtime = min(7 * 86400.0, max(60.0, rng.lognormvariate(math.log(TENANT_MEDIANS[tenant]), SIGMA)))
        out.append(TraceClaim(tenant, f"c{i}", at, rng.choice(SIZES), runtime,
                              runtime * math.exp(rng.gauss(0.0, annotation_error))))
    return out


def document(c: TraceClaim, annotated: bool) -> dra.ResourceClaim:
    annotations = {"claimbroker.io/preemptible": "false"}
    if annotated:
        annotations["claimbroker.io/expected-runtime"] = f"{max(1, round(c.expected))}s"
    return dra.parse_claim({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                            "metadata": {"name": c.name, "namespace": c.tenant, "annotations": annotations},
                            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                                "deviceClassName": "gpu.nvidia.com", "count": c.size}}]}}})


def build_fleet(nodes: int) -> Fleet:
    specs = [{"name": f"node-{i:04d}", "gpuModel": "H100", "gpuCount": 8, "numaNodes": 2} for i in range(nodes)]
    docs = documents_from([{"kind": "Topology", "nodes": specs}], "bench")
    return Fleet.from_slices(docs.slices, docs.labels)


class Replay(ClockedQueue):
    """The trace on its clock: admitted claims run their actual runtime, then leave."""

    def __init__(self, fleet: Fleet, claims: dict[ClaimKey, TraceClaim], annotated: set[ClaimKey]) -> None:
        super().__init__(fleet, BUILTIN_CLASSES, QuotaConfig(), START)
        self.claims, self.annotated = claims, annotated
        self.ends: list[tuple[float, ClaimKey]] = []
        self.started: dict[ClaimKey, float] = {}
        self.order = 0

    def apply(self, cycle: CycleResult) -> bool:
        changed = False
        for d in cycle.decisions:
            key = (d.tenant, d.name)
            queued = self.waiting.get(key)
            if queued is None:
                continue
            if d.decision.allocation is not None:
                c = self.claims[key]
                self.order += 1
                self.running[key] = Running(c.tenant, c.name, d.decision.allocation, 0, False, queued.arrival,
                                            self.order, self.now, None,
                                            c.expected if key in self.annotated else None)
                self.waiting.pop(key)
                self.started[key] = self.now
                heapq.heappush(self.ends, (self.now + c.runtime, key))
                changed = True
            elif not queued.answered:
                self.waiting.put(replace(queued, answered=True))
        return changed


def replay(claims: list[TraceClaim], nodes: int, annotate: bool, tick: float, warmup: float,
           runtimes_every: float) -> dict[str, Any]:
    by_key = {(c.tenant, c.name): c for c in claims}
    arrival = {key: i for i, key in enumerate(by_key)}
    annotated = {(c.tenant, c.name) for i, c in enumerate(claims) if annotate and i % 2 == 0}
    run = Replay(build_fleet(nodes), by_key, annotated)
    memo = EstimateMemo()
    runtimes, runtimes_at = Runtimes(), -math.inf
    finished: list[tuple[str, str | None, float]] = []  # observed runs: (tenant, flavor, seconds)
    at_submission: dict[ClaimKey, float] = {}  # p50 of the estimate each waiting claim got when it came
    p90s: dict[ClaimKey, float | None] = {}
    pending = iter(claims)
    following = next(pending, None)
    cpu = 0.0
    now = START
    while following is not None or run.waiting or run.ends:
        now += tick
        run.now = now
        while run.ends and run.ends[0][0] <= now:
            _, key = heapq.heappop(run.ends)
            done = run.running.pop(key)
            finished.append((done.tenant, None, by_key[key].runtime))
        came = []
        while following is not None and following.arrives <= now:
            key = (following.tenant, following.name)
            came.append(following)
            run.waiting.put(Waiting(following.tenant, following.name, document(following, key in annotated), 0,
                                    False, arrival[key]))
            following = next(pending, None)
        run.ask_again()
        run.settle()
        if now - runtimes_at >= runtimes_every:
            runtimes, runtimes_at = runtimes_from(finished), now
        new = [k for c in came if (k := (c.tenant, c.name)) in run.waiting]
        if new:
            started = time.process_time()
            estimates = estimate_starts(run.snapshot(), runtimes, memo=memo)
            cpu += time.process_time() - started
            for key in new:
                estimate = estimates.get(key)
                if estimate is not None and estimate.p50 is not None:
                    at_submission[key] = estimate.p50
                    p90s[key] = estimate.p90
    measured = [k for k in at_submission if by_key[k].arrives >= START + warmup and k in run.started]

    def errors(keys: list[ClaimKey]) -> dict[str, Any]:
        gaps = sorted(abs(run.started[k] - at_submission[k]) / 60 for k in keys)
        if not gaps:
            return {"claims": 0}
        waits = sorted((run.started[k] - by_key[k].arrives) / 60 for k in keys)
        late = sorted((run.started[k] - at_submission[k]) / 60 for k in keys)  # > 0: later than its p50
        said = sorted((at_submission[k] - by_key[k].arrives) / 60 for k in keys)
        between = sum(1 for k in keys if at_submission[k] - tick <= run.started[k] <= (p90s[k] or math.inf) + tick)
        before_p90 = sum(1 for k in keys if run.started[k] <= (p90s[k] or math.inf) + tick)
        return {"claims": len(keys), "error_p50_min": round(quantile(gaps, 0.5), 1),
                "error_p90_min": round(quantile(gaps, 0.9), 1),
                "late_p10_p50_p90_min": [round(quantile(late, q), 1) for q in (0.1, 0.5, 0.9)],
                "wait_p50_min": round(quantile(waits, 0.5), 1), "wait_p90_min": round(quantile(waits, 0.9), 1),
                "said_p50_min": round(quantile(said, 0.5), 1), "said_p90_min": round(quantile(said, 0.9), 1),
                "within_p50_p90": round(between / len(keys), 2), "before_p90": round(before_p90 / len(keys), 2)}

    out: dict[str, Any] = {"annotated": "half" if annotate else "none", "nodes": nodes, "claims": len(claims),
                           "waited_with_estimate": len(measured), "estimate_cpu_s": round(cpu, 1),
                           "all": errors(measured)}
    if annotate:
        out["annotated_half"] = errors([k for k in measured if k in annotated])
        out["other_half"] = errors([k for k in measured if k not in annotated])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--claims", type=int, default=1500)
    parser.add_argument("--load", type=float, default=0.95, help="arrivals as a fraction of the fleet's capacity")
    parser.add_argument("--annotation-error", type=float, default=0.3,
                        help="sigma of the lognormal factor between an annotation and the actual runtime")
    parser.add_argument("--tick", type=float, default=30.0, help="seconds of the trace between cycles")
    parser.add_argument("--warmup", type=float, default=6 * 3600.0, help="seconds of the trace not measured")
    parser.add_argument("--runtimes-every", type=float, default=300.0,
                        help="seconds between reads of the observed runtimes")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    claims = trace(args.claims, args.nodes, args.load, args.annotation_error, args.seed)
    for annotate in (True, False):
        print(json.dumps(replay(claims, args.nodes, annotate, args.tick, args.warmup, args.runtimes_every)),
              flush=True)


if __name__ == "__main__":
    main()
