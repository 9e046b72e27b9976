"""Quota benchmark (issue 4): 1,000 nodes with 8 GPUs each (A100 to B300), 100 tenants in 10 cohorts with
nominal quotas per generation (about the fleet's size in all) and borrowing, a waiting queue held at a
depth of 1,000 and of 10,000 claims. Each cycle a share of the running claims finishes, new claims
arrive to keep the depth, and one admission cycle runs: fair-share order, quotas, preemption (claims
carry priorities), explanations. The fleet is filled first (cycles without finishing claims, until one
admits nothing), so both depths measure the same steady state of a full fleet. Prints one JSON line per
depth.

admissions_per_s is claims admitted over the time spent in cycles; cycle_*_ms are per cycle. `answered` counts
the Pending answers the cycles gave (a claim is answered once, then keeps its answer while it waits behind
its kind), and decisions_per_s is admissions and answers over that time: a deeper queue admits as many
claims a cycle but answers more of the new ones, which wait instead of being admitted at once.
After every cycle (outside the timing) the quota invariants are checked on what runs
(shared/admission/invariant.py): `quota_violations` counts the cycles that broke one, of those checked, with the
first messages (`--no-check` skips it); `decisions` is a digest of what the cycles admitted (claim, node,
devices) and preempted, to compare two versions of the decision core on one workload.
The workload is drawn from one seed (`--seed`, default 11): the gap between the depths depends on it (other
seeds give other quotas and claims), so compare depths over several seeds, not one.
Run: `make bench-quota` (or `python bench/bench_quota.py --depth 1000 --cycles 20 --seed 2`).

The gang mix (`--gang-fraction 0.2`, issue 38): that share of the claims are members of gangs of 2 to 16
members (claimbroker.io/gang, gang-size), each member of one gang alike (GPUs, model, priority), a third of
the gangs with `gang-topology: nvidia.com/gpu.clique` (required) and a model; the fleet's nodes carry clique
labels, per model, in groups of 8 nodes (A100, H100, H200) or 18 (B200, B300). Members arrive interleaved
with other claims and with the members of the other gangs being submitted (8 at a time), and a running
gang finishes whole. The rest of the workload is drawn as without gangs, from its own random stream.
`--release-cycles N` then runs N more cycles in which one running claim (with gangs: one gang) finishes and
nothing else arrives but what keeps the depth, and prints their median (`one_release_cycle_p50_ms`): a
cycle's cost is to follow what changed, not the depth of the queue.
`--cpu-time` times the cycles as the thread's CPU time instead of wall time: on a machine shared with other
work, the wall time of a cycle includes the time the others ran.

Nested cohorts and past use (issue 41): `--tree` puts the 10 cohorts under 3 organisations under one root
(three levels of cohorts above the tenants; each organisation has 8 devices of each generation of its own,
lends the root 4 of its pool and may borrow a third of the generation's devices from it); `--half-life 24h`
turns on fairSharing.halfLife: each tenant starts with a past use drawn from its own stream, each cycle is a
minute of simulated time, and the shell brings past use up to date before each cycle with the units the
last cycle left held (its result's `units_in_use`; outside the timing, as the allocator's ledger would).
The invariant recount then checks the tree at every level.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import random
import statistics
import sys
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from services.runtime.gc_tuning import CollectorPacing, tune_gc  # noqa: E402
from shared.admission.cycle import run_cycle  # noqa: E402
from shared.admission.flavors import Flavors  # noqa: E402
from shared.admission.invariant import violations  # noqa: E402
from shared.admission.kept import KeptState  # noqa: E402
from shared.admission.model import CycleResult, Running, Snapshot, Waiting  # noqa: E402
from shared.admission.past_use import bring_up_to  # noqa: E402
from shared.admission.quota import QuotaConfig, parse_quotas  # noqa: E402
from shared.admission.waiting_queue import WaitingQueue  # noqa: E402
from shared.dra import model as dra  # noqa: E402
from shared.dra.claims import gang_name  # noqa: E402
from shared.dra.classes import BUILTIN_CLASSES  # noqa: E402
from shared.dra.inventory import Fleet  # noqa: E402
from shared.dra.matching import SelectorMemo  # noqa: E402
from shared.dra.results import State  # noqa: E402
from shared.fleet.sources import documents_from  # noqa: E402
from shared.settings import parse_duration  # noqa: E402

MODELS = ("A100", "H100", "H200", "B200", "B300")
CLIQUE = "nvidia.com/gpu.clique"
CLIQUE_NODES = {"A100": 8, "H100": 8, "H200": 8, "B200": 18, "B300": 18}  # nodes per clique, per model
OPEN_GANGS = 8  # gangs being submitted at a time: their members arrive interleaved
TENANTS = 100
COHORTS = 10
SEED = 11  # the default workload: every figure in the README is of it unless it names another seed


def build_fleet(nodes: int, cliques: bool = False) -> Fleet:
    specs: list[dict[str, Any]] = [{"name": f"node-{i:05d}", "gpuModel": MODELS[i % len(MODELS)], "gpuCount": 8,
                                    "numaNodes": 2} for i in range(nodes)]
    if cliques:  # the nodes of one model, in order, share a clique per CLIQUE_NODES of them
        for i, spec in enumerate(specs):
            model = spec["gpuModel"]
            spec["nodeLabels"] = {CLIQUE: f"{model.lower()}-{i // len(MODELS) // CLIQUE_NODES[model] + 1:02d}"}
    docs = documents_from([{"kind": "Topology", "nodes": specs}], "bench")
    fleet = Fleet.from_slices(docs.slices, docs.labels)
    fleet.nodes_by_shape  # noqa: B018 - worked out when inventory arrives, not per decision
    return fleet


ORGS = 3  # with --tree: the organisations the cohorts sit in, under one root
CYCLE_SECONDS = 60.0  # with --half-life: the simulated time between two cycles


def build_quotas(nodes: int, rng: random.Random, tree: bool = False, half_life: float = 0.0) -> QuotaConfig:
    """Each generation's devices split among the tenants' nominal quotas (a tenant holds two or three
    generations), some lending limits, some borrowing limits, weights 1 to 3. With `tree`, the cohorts
    nest under organisations with quotas of their own, under one root (no draw of `rng` changes, so the
    tenants' quotas are those of the flat workload)."""
    per_model = nodes * 8 // len(MODELS)
    tenants: list[dict[str, Any]] = []
    for t in range(TENANTS):
        models = rng.sample(MODELS, rng.choice((2, 3)))
        quotas = {}
        for m in models:
            limit: dict[str, Any] = {"nominal": max(1, per_model * 2 // TENANTS // 2)}
            if rng.random() < 0.3:
                limit["borrowingLimit"] = rng.choice((0, 4, 16))
            if rng.random() < 0.3:
                limit["lendingLimit"] = limit["nominal"] // 2
            quotas[m] = limit
        tenants.append({"name": f"t{t:03d}", "cohort": f"c{t % COHORTS}", "weight": rng.choice((1.0, 2.0, 3.0)),
                        "quotas": quotas})
    document: dict[str, Any] = {"kind": "Quotas", "tenants": tenants}
    if tree:
        # each organisation may draw a third of a generation's devices from the root, and lends it 4 of its own
        own = {m: {"nominal": 8, "borrowingLimit": per_model // ORGS, "lendingLimit": 4} for m in MODELS}
        document["cohorts"] = [{"name": "root"}, *({"name": f"org{o}", "parent": "root", "quotas": own}
                                                   for o in range(ORGS)),
                               *({"name": f"c{c}", "parent": f"org{c % ORGS}"} for c in range(COHORTS))]
    if half_life > 0:
        document["fairSharing"] = {"halfLife": f"{half_life:g}s"}
    return parse_quotas(document)


def new_claim(rng: random.Random, serial: int) -> Waiting:
    tenant = f"t{rng.randrange(TENANTS):03d}"
    body: dict[str, Any] = {"deviceClassName": "gpu.nvidia.com", "count": rng.choice((1, 1, 2, 2, 4, 8))}
    if rng.random() < 0.6:
        body["selectors"] = [{"cel": {"expression": f'device.attributes["gpu.nvidia.com"].productName == '
                                                    f'"{rng.choice(MODELS)}"'}}]
    priority = rng.choice((0, 0, 0, 1, 2))
    claim = dra.parse_claim({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                             "metadata": {"name": f"c{serial}", "namespace": tenant,
                                          "annotations": {"claimbroker.io/priority": str(priority)}},
                             "spec": {"devices": {"requests": [{"name": "gpu", "exactly": body}]}}})
    return Waiting(tenant, f"c{serial}", claim, priority, True, serial)


class GangStream:
    """The gang members of the gang mix: gangs of 2 to 16 alike members, a third of them on one clique,
    drawn from their own seeded stream; OPEN_GANGS gangs are submitted at a time, a member of a random one
    each time a gang member is due, so members arrive interleaved with other claims and other gangs."""

    def __init__(self, seed: int, fraction: float) -> None:
        self.rng = random.Random(seed * 1_000_003 + 38)
        self.fraction = fraction
        self.open: list[list[dict[str, Any]]] = []  # per gang being submitted, its members still to come
        self.gangs = 0

    def due(self) -> bool:
        return self.rng.random() < self.fraction

    def member(self, serial: int) -> Waiting:
        rng = self.rng
        while len(self.open) < OPEN_GANGS:
            self.open.append(self._gang())
        at = rng.randrange(len(self.open))
        members = self.open[at]
        spec = members.pop()
        if not members:
            self.open[at] = self._gang()
        annotations = dict(spec["annotations"])
        claim = dra.parse_claim({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                                 "metadata": {"name": f"c{serial}", "namespace": spec["tenant"],
                                              "annotations": annotations},
                                 "spec": {"devices": {"requests": [{"name": "gpu", "exactly": spec["body"]}]}}})
        return Waiting(spec["tenant"], f"c{serial}", claim, spec["priority"], True, serial)

    def _gang(self) -> list[dict[str, Any]]:
        rng = self.rng
        self.gangs += 1
        size = rng.randint(2, 16)
        tenant = f"t{rng.randrange(TENANTS):03d}"
        body: dict[str, Any] = {"deviceClassName": "gpu.nvidia.com", "count": rng.choice((1, 2, 4, 8, 8))}
        annotations = {"claimbroker.io/priority": str(rng.choice((0, 0, 0, 1, 2))),
                       "claimbroker.io/gang": f"g{self.gangs}", "claimbroker.io/gang-size": str(size)}
        topology = rng.random() < 1 / 3
        if topology:
            annotations["claimbroker.io/gang-topology"] = CLIQUE
        if topology or rng.random() < 0.6:  # a clique holds one model
            body["selectors"] = [{"cel": {"expression": f'device.attributes["gpu.nvidia.com"].productName == '
                                                        f'"{rng.choice(MODELS)}"'}}]
        member = {"tenant": tenant, "body": body, "annotations": annotations,
                  "priority": int(annotations["claimbroker.io/priority"])}
        return [member] * size


def _keyed(w: Waiting) -> tuple[tuple[str, str], Waiting]:
    return w.key, w


def run(nodes: int, depth: int, cycles: int, seed: int = SEED, check: bool = True, gang_fraction: float = 0.0,
        release_cycles: int = 0, cpu_time: bool = False, tree: bool = False, half_life: float = 0.0) -> dict[str, Any]:
    clock = time.thread_time if cpu_time else time.perf_counter  # CPU time: what other work on the machine leaves out
    rng = random.Random(seed)
    fleet = build_fleet(nodes, cliques=gang_fraction > 0)
    quotas = build_quotas(nodes, rng, tree, half_life)
    past_rng = random.Random(seed * 1_000_003 + 41)  # its own stream: the flat workload's draws stay the same
    past: dict[tuple[str, str], float] = {(f"t{t:03d}", m): past_rng.choice((0.0, 0.0, 4.0, 16.0, 64.0))
                                          for t in range(TENANTS) for m in MODELS} if half_life > 0 else {}
    sim_now = 0.0
    held_units: Mapping[tuple[str, str], float] = {}  # GPU units held per tenant and flavor, after the last cycle
    past_s = 0.0  # spent bringing past use up to date (the shell's work, outside the cycles' timing)
    gangs = GangStream(seed, gang_fraction) if gang_fraction > 0 else None
    serial = 0
    waiting = WaitingQueue()  # as a shell keeps it: the cycle is handed what came and went
    running: dict[tuple[str, str], Running] = {}
    submitted: dict[tuple[str, str], Waiting] = {}  # waiting and running claims as first queued (none that ended)

    def arrive() -> None:
        nonlocal serial
        serial += 1
        came = gangs.member(serial) if gangs is not None and gangs.due() else new_claim(rng, serial)
        waiting.put(submitted.setdefault(*_keyed(came)))

    while len(waiting) < depth:
        arrive()
    gc.collect()
    gc.freeze()
    memo = KeptState()
    collector = CollectorPacing()  # as the allocator runs: what a cycle keeps is frozen after it
    times, admitted, preempted, answered, gang_admitted = [], 0, 0, 0, 0
    checker = Flavors(quotas.flavors, SelectorMemo())  # its own memo: the cycles' stays as theirs
    broken: list[str] = []  # quota invariants broken after a cycle (shared/admission/invariant.py), outside the timing
    broken_cycles = checked = 0
    digest = hashlib.sha256()  # what was decided: admissions (claim, node, devices) and preemptions, per cycle

    def one_cycle(finished: list[tuple[str, str]], record: bool) -> tuple[float, int, CycleResult]:
        """`finished` end, arrivals keep the depth, one cycle runs and what it decided is applied."""
        nonlocal broken, broken_cycles, checked, past, sim_now, past_s, held_units
        if half_life > 0:  # a minute passed with what ran, then `finished` end
            stepped = time.perf_counter()
            past = bring_up_to(past, sim_now, held_units, sim_now + CYCLE_SECONDS, half_life)
            sim_now += CYCLE_SECONDS
            past_s += time.perf_counter() - stepped
        for key in finished:
            del running[key]
            del submitted[key]
        while len(waiting) < depth:
            arrive()
        queued, changes = waiting.snapshot()
        snapshot = Snapshot(fleet, BUILTIN_CLASSES, quotas, tuple(running.values()), queued, changes=changes,
                            now=sim_now if half_life > 0 else None, past_use=past)
        started = clock()
        result = run_cycle(snapshot, memo)
        elapsed = clock() - started
        held_units = result.units_in_use  # what runs once this cycle's decisions are applied (below)
        collector.after_cycle()
        if record:
            digest.update(repr(sorted((d.tenant, d.name, d.decision.allocation.node, d.decision.allocation.keys)
                                      for d in result.decisions if d.decision.allocation is not None)).encode())
            digest.update(repr([(p.victim, p.by, p.rule) for p in result.preemptions]).encode())
        for p in result.preemptions:  # back to the queue with their first arrival
            running.pop(p.victim)
            waiting.put(submitted[p.victim])
        count = 0
        for d in result.decisions:
            w = waiting.get((d.tenant, d.name))
            if w is None:
                continue
            if d.decision.allocation is not None:
                gang = gang_name(w.claim) if gangs is not None else None
                running[w.key] = Running(w.tenant, w.name, d.decision.allocation, w.priority, True, w.arrival,
                                         serial + count, gang=gang)
                waiting.pop(w.key)
                count += 1
            elif not w.answered:
                waiting.put(replace(w, answered=True))
        if record:
            found = violations(fleet, quotas, running.values(), checker) if check else []
            checked += check
            broken_cycles += bool(found)
            broken += found[:max(0, 3 - len(broken))]
        return elapsed, count, result

    warming, index = True, 0
    while index < cycles:
        finished = [] if warming else rng.sample(sorted(running), len(running) // 20)  # 5% of running claims finish
        elapsed, count, result = one_cycle(_whole_gangs(running, finished) if gangs else finished, True)
        if warming:  # fill the fleet first (no claim finishes) until a cycle admits nothing more: the
            warming = count > 0  # steady state of a full fleet is what is measured, at every depth
            continue
        index += 1
        times.append(elapsed)
        admitted += count
        gang_admitted += sum(1 for d in result.decisions
                             if d.decision.allocation is not None and running[(d.tenant, d.name)].gang)
        preempted += len(result.preemptions)
        answered += sum(1 for d in result.decisions if d.decision.state is State.PENDING)
    times.sort()
    out = {"nodes": nodes, "tenants": TENANTS, "queue_depth": depth, "cycles": cycles, "admitted": admitted,
           "preempted": preempted, "answered": answered, "admissions_per_s": round(admitted / sum(times), 1),
           "decisions_per_s": round((admitted + answered) / sum(times), 1),
           "cycle_p50_ms": round(statistics.median(times) * 1000, 1),
           "cycle_p99_ms": round(times[min(len(times) - 1, int(len(times) * 0.99))] * 1000, 1),
           "quota_violations": {"cycles": broken_cycles, "checked": checked, "first": broken},
           "decisions": digest.hexdigest()[:16]}
    if tree or half_life > 0:
        out |= {"tree": tree, "half_life_s": half_life,
                "past_use_step_ms": round(past_s * 1000 / max(1, cycles), 2) if half_life > 0 else None}
    if gangs is not None:
        members = [w for w in waiting.values() if gang_name(w.claim) is not None]
        out |= {"gang_fraction": gang_fraction, "gang_members_admitted": gang_admitted,
                "gang_members_waiting": len(members),
                "gangs_waiting": len({(w.tenant, gang_name(w.claim)) for w in members})}
    if release_cycles:
        quiet = []
        for _ in range(release_cycles):  # one claim (one gang) finishes: what changed is that and its refill
            one = [rng.choice(sorted(running))]
            quiet.append(one_cycle(_whole_gangs(running, one) if gangs else one, False)[0])
        out["one_release_cycle_p50_ms"] = round(statistics.median(quiet) * 1000, 2)
    return out


def _whole_gangs(running: dict[tuple[str, str], Running], keys: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """`keys` with the other running members of their gangs: a gang's job ends whole."""
    members: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for r in running.values():
        if r.gang is not None:
            members.setdefault((r.tenant, r.gang), []).append(r.key)
    out: dict[tuple[str, str], None] = {}
    for key in keys:
        gang = running[key].gang
        out.update(dict.fromkeys(sorted(members[(key[0], gang)]) if gang is not None else (key,)))
    return list(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--depth", type=int, action="append", help="queue depth (repeatable)")
    parser.add_argument("--cycles", type=int, default=30)
    parser.add_argument("--seed", type=int, default=SEED, help="workload seed: quotas, claims, which claims finish")
    parser.add_argument("--no-check", action="store_true", help="skip the quota invariants after each cycle")
    parser.add_argument("--gang-fraction", type=float, default=0.0,
                        help="share of the claims that are gang members (the gang mix: 0.2)")
    parser.add_argument("--release-cycles", type=int, default=0,
                        help="then this many cycles after one release each: their median cycle")
    parser.add_argument("--cpu-time", action="store_true",
                        help="time cycles as this thread's CPU time, not wall time (a machine shared with other work)")
    parser.add_argument("--tree", action="store_true",
                        help="the cohorts nest: three levels (root, organisations with quotas, cohorts)")
    parser.add_argument("--half-life", default="0s",
                        help="fairSharing.halfLife (such as 24h): past use orders the tenants, a minute a cycle")
    args = parser.parse_args()
    tune_gc()  # as `claimbroker up` and `serve` run
    for depth in args.depth or (1000, 10_000):
        print(json.dumps(run(args.nodes, depth, args.cycles, args.seed, not args.no_check, args.gang_fraction,
                             args.release_cycles, args.cpu_time, args.tree, parse_duration(args.half_life))),
              flush=True)


if __name__ == "__main__":
    main()
