"""What-if: the same decision core on today's fleet and queue, settled once as they are and once with a
proposed change (quotas, nodes added or drained, a tenant removed), and what differs. Nothing is written;
the same inputs give the same answer."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from shared.admission.flavors import Flavors
from shared.admission.invariant import violations
from shared.admission.kept import KeptState
from shared.admission.model import ClaimKey, CycleResult, Running, Snapshot, Waiting
from shared.admission.past_use import PastUse, per_tenant
from shared.admission.quota import QuotaConfig
from shared.admission.settling import run_until_settled
from shared.dra import model as dra
from shared.dra.claims import gang_name
from shared.dra.inventory import Fleet, NodeInventory
from shared.dra.results import State

MAX_CYCLES = 16  # a state settles when a cycle changes nothing; preemption victims retry in the next


@dataclass(frozen=True)
class Change:
    quotas: QuotaConfig | None = None  # the whole proposed configuration (a patch is merged by the caller)
    add_nodes: tuple[NodeInventory, ...] = ()
    drain: frozenset[str] = frozenset()
    remove_tenants: frozenset[str] = frozenset()


@dataclass
class Settled:
    running: dict[ClaimKey, Running]
    waiting: dict[ClaimKey, Waiting]
    preempted: dict[ClaimKey, str] = field(default_factory=dict)  # the rule of the last preemption
    reasons: dict[ClaimKey, str] = field(default_factory=dict)  # why each still waits


def settle(fleet: Fleet, classes: Mapping[str, dra.DeviceClass], quotas: QuotaConfig,
           running: Iterable[Running], waiting: Iterable[Waiting], unusable: Mapping[str, str] | None = None,
           past_use: PastUse | None = None) -> Settled:
    """Cycles until one changes nothing (at most MAX_CYCLES): admissions, preemptions, and the victims
    and the rest trying again, as the allocator would over its next cycles (with the tenants' past use as
    it is now, under the quotas' fairSharing.halfLife)."""
    out = Settled({r.key: r for r in running}, {w.key: w for w in waiting})
    order = max((r.allocated_order for r in out.running.values()), default=0)
    # every claim that preempted a claim, kept as the ledger keeps it: a victim never takes back from any of them
    displaced = {w.key: w.displaced_by for w in out.waiting.values() if w.displaced_by}

    def snapshot() -> Snapshot:
        return Snapshot(fleet, classes, quotas, tuple(out.running.values()),
                        tuple(sorted(out.waiting.values(), key=lambda w: (w.arrival, w.key))),
                        unusable_nodes=unusable or {}, past_use=past_use or {})

    def apply(cycle: CycleResult) -> bool:
        nonlocal order
        changed = bool(cycle.preemptions)
        for p in cycle.preemptions:
            victim = out.running.pop(p.victim)
            out.preempted[p.victim] = p.rule
            displaced[p.victim] = displaced.get(p.victim, frozenset()) | {p.by}
            out.waiting[p.victim] = Waiting(victim.tenant, victim.name, _claim_of(victim), victim.priority,
                                            victim.preemptible, victim.arrival, displaced_by=displaced[p.victim])
        for d in cycle.decisions:
            key = (d.tenant, d.name)
            queued = out.waiting.get(key)
            if queued is None:
                continue
            if d.decision.allocation is not None:
                order += 1
                out.running[key] = _running_of(queued, d.decision.allocation, order)
                del out.waiting[key]
                out.reasons.pop(key, None)
                changed = True
            elif d.decision.state is State.REJECTED:
                del out.waiting[key]
                out.reasons[key] = d.decision.reason or "Rejected"
            else:
                out.reasons[key] = d.decision.reason or "Pending"
                if not queued.answered:
                    out.waiting[key] = replace(queued, answered=True)
        return changed

    run_until_settled(snapshot, KeptState(), apply, most_changing=MAX_CYCLES)
    return out


@dataclass(frozen=True, eq=False)  # by identity, as Running
class _Running(Running):
    """A running claim that remembers its document, so a preemption can put it back in the queue."""

    claim: dra.ResourceClaim | None = None


def _running_of(waiting: Waiting, allocation: Any, order: int) -> _Running:
    return _Running(waiting.tenant, waiting.name, allocation, waiting.priority, waiting.preemptible,
                    waiting.arrival, order, gang=gang_name(waiting.claim),
                    claim=waiting.claim)


def _claim_of(running: Running) -> dra.ResourceClaim:
    claim = running.claim if isinstance(running, _Running) else None
    if claim is None:
        raise ValueError(f"what-if needs the document of running claim {running.tenant}/{running.name}")
    return claim


@dataclass
class WhatIf:
    admitted: list[ClaimKey]
    preempted: list[tuple[ClaimKey, str]]  # a claim that runs today and would not, with the rule (or drain)
    over_quota_before: list[str]
    over_quota_after: list[str]
    over_quota_claims: list[tuple[ClaimKey, str]]  # running claims beyond a tenant's limit after, newest first
    usage: dict[str, dict[str, tuple[int, int]]]  # tenant -> flavor -> devices held (before, after)
    shares: dict[str, tuple[float, float]]
    pending: dict[str, tuple[int, int]]  # tenant -> claims waiting (before, after)

    def to_json(self) -> dict[str, Any]:
        return {
            "admitted": ["/".join(k) for k in self.admitted],
            "preempted": [{"claim": "/".join(k), "rule": rule} for k, rule in self.preempted],
            "overQuota": {"before": self.over_quota_before, "after": self.over_quota_after,
                          "claims": [{"claim": "/".join(k), "flavor": f} for k, f in self.over_quota_claims]},
            "usage": {t: {f: {"before": b, "after": a} for f, (b, a) in sorted(per.items())}
                      for t, per in sorted(self.usage.items())},
            "shares": {t: {"before": round(b, 3), "after": round(a, 3)} for t, (b, a) in sorted(self.shares.items())},
            "pending": {t: {"before": b, "after": a} for t, (b, a) in sorted(self.pending.items())},
        }


def what_if(fleet: Fleet, classes: Mapping[str, dra.DeviceClass], quotas: QuotaConfig,
            running: Iterable[Running], waiting: Iterable[Waiting],
            documents: Mapping[ClaimKey, dra.ResourceClaim], change: Change,
            unusable: Mapping[str, str] | None = None, past_use: PastUse | None = None) -> WhatIf:
    """Settle today's state, and today's state with `change`; `documents` are the running claims'
    (a drained node's claims, and preemption victims, go back to the queue). `unusable`: nodes the
    allocator places nothing on, and why (stale inventory), as it has them today. `past_use`: the tenants'
    past use now (per tenant and flavor, GPU units), which shares count where the quotas (today's, or the
    change's: a changed fairSharing.halfLife) have a half-life; the change's tree edits come in its quotas."""
    now_running = [_Running(r.tenant, r.name, r.allocation, r.priority, r.preemptible, r.arrival,
                            r.allocated_order, r.allocated_at, gang=r.gang, claim=documents.get(r.key))
                   for r in running]
    now_waiting = list(waiting)
    before = settle(fleet, classes, quotas, now_running, now_waiting, unusable, past_use)

    nodes = {name: inventory for name, inventory in fleet.nodes.items() if name not in change.drain}
    nodes.update({n.node: n for n in change.add_nodes})
    after_fleet = Fleet(nodes)
    after_quotas = change.quotas if change.quotas is not None else quotas
    if change.remove_tenants:
        after_quotas = replace(after_quotas, tenants={n: t for n, t in after_quotas.tenants.items()
                                                      if n not in change.remove_tenants})
    gone: list[tuple[ClaimKey, str]] = []
    kept_running, requeued = [], []
    for r in now_running:
        if r.tenant in change.remove_tenants:
            continue
        if r.allocation.node in change.drain:
            gone.append((r.key, "drain"))
            requeued.append(Waiting(r.tenant, r.name, _claim_of(r), r.priority, r.preemptible, r.arrival))
        else:
            kept_running.append(r)
    after = settle(after_fleet, classes, after_quotas, kept_running,
                   [w for w in now_waiting if w.tenant not in change.remove_tenants] + requeued,
                   {n: why for n, why in (unusable or {}).items() if n in after_fleet.nodes}, past_use)

    drained = {k for k, _ in gone}
    admitted = sorted(k for k in after.running if k not in before.running)
    preempted = sorted(gone + [(k, after.preempted.get(k, "preempted")) for k in before.running
                               if k not in after.running and k not in drained and k[0] not in change.remove_tenants])
    flavors_before = Flavors(quotas.flavors, KeptState().memo)
    flavors_after = Flavors(after_quotas.flavors, KeptState().memo)
    held_before = _held(fleet, before.running.values(), flavors_before)
    held_after = _held(after_fleet, after.running.values(), flavors_after)
    usage: dict[str, dict[str, tuple[int, int]]] = defaultdict(dict)
    for tenant, flavor in sorted(set(held_before) | set(held_after)):
        usage[tenant][flavor] = (held_before.get((tenant, flavor), 0), held_after.get((tenant, flavor), 0))
    tenants = sorted({k[0] for k in (*before.running, *before.waiting, *after.running, *after.waiting)})
    past = per_tenant(past_use or {})
    return WhatIf(
        admitted=admitted, preempted=preempted,
        over_quota_before=violations(fleet, quotas, before.running.values(), flavors_before),
        over_quota_after=violations(after_fleet, after_quotas, after.running.values(), flavors_after),
        over_quota_claims=_beyond_limits(after_fleet, after_quotas, after.running.values(), held_after, flavors_after),
        usage=dict(usage),
        shares={t: (_share(t, quotas, held_before, flavors_before, past),
                    _share(t, after_quotas, held_after, flavors_after, past)) for t in tenants},
        pending={t: (sum(1 for k in before.waiting if k[0] == t), sum(1 for k in after.waiting if k[0] == t))
                 for t in tenants})


def _beyond_limits(fleet: Fleet, quotas: QuotaConfig, running: Iterable[Running], held: Counter[tuple[str, str]],
                   flavors: Flavors) -> list[tuple[ClaimKey, str]]:
    """Per tenant and flavor held beyond nominal plus borrowingLimit: the newest claims holding it until
    what they hold covers the excess (those a quota admin would see go first)."""
    if not quotas.enforced:
        return []
    out: list[tuple[ClaimKey, str]] = []
    newest_first = sorted(running, key=lambda r: -r.allocated_order)
    for (tenant, flavor), count in sorted(held.items()):
        own = quotas.tenants.get(tenant)
        limit = own.limit(flavor) if own is not None else None
        if limit is None or limit.borrowing_limit is None:
            continue  # no hard cap of its own (it borrows what its cohort lends)
        excess = count - (limit.nominal + limit.borrowing_limit)
        if excess <= 0:
            continue
        for r in newest_first:
            if excess <= 0:
                break
            if r.tenant != tenant:
                continue
            devices = (fleet.by_key.get(key) for key in r.allocation.keys)
            holds = sum(1 for d in devices if d is not None and (flavors.name_of(d) or "other") == flavor)
            if holds:
                out.append((r.key, flavor))
                excess -= holds
    return out


def _held(fleet: Fleet, running: Iterable[Running], flavors: Flavors) -> Counter[tuple[str, str]]:
    """Devices held per tenant and flavor (a device of no flavor counts as its node's model, "other")."""
    held: Counter[tuple[str, str]] = Counter()
    for r in running:
        for key in r.allocation.keys:
            device = fleet.by_key.get(key)
            flavor = flavors.name_of(device) if device is not None else None
            held[(r.tenant, flavor or "other")] += 1
    return held


def _share(tenant: str, quotas: QuotaConfig, held: Mapping[tuple[str, str], int], flavors: Flavors,
           past: Mapping[str, float]) -> float:
    values = {f.name: f.value for f in quotas.flavors}
    own = quotas.tenants.get(tenant)
    weight = own.weight if own is not None else 1.0
    units = sum(count * values.get(flavor, 1.0) for (t, flavor), count in held.items() if t == tenant)
    return (units + (past.get(tenant, 0.0) if quotas.half_life > 0 else 0.0)) / weight
