"""Why a claim waits, as structured data: the blocking quotas with who borrows what, the capacity
shortfall per request, what preemption could take, and what change would let the claim in.

Served by the admin API (`explain`) and `claimbroker explain`; built from the same cycle that decided,
so it never disagrees with the reason the tenant was given.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from shared.admission.gang_explain import gang_suggestions
from shared.admission.groups import GroupId
from shared.admission.model import Block, ClaimKey, Waiting
from shared.admission.quota_book import QuotaBook
from shared.admission.quota_room import QuotaRoom
from shared.dra.allocation import FleetState
from shared.dra.fleet_index import DeviceIndex
from shared.dra.plan import Plan
from shared.dra.results import Decision, Rejected

MAX_CAPACITY_ENTRIES = 32  # requests and alternatives explained one by one (a claim may have 256)


def _capacity(state: FleetState, spec_capacity: dict[int, tuple[Plan, int, list[dict[str, Any]]]],
              waiting: Waiting) -> list[dict[str, Any]]:
    """Per request: what matches, what is free and why the rest is not; the same for every claim of one
    spec while the fleet's state stays the same, so worked out once per spec and state."""
    try:
        plan = state.plan(waiting.claim)
    except Rejected:
        return []
    kept = spec_capacity.get(id(plan))
    if kept is not None and kept[0] is plan and kept[1] == state.version:
        return kept[2]
    out: list[dict[str, Any]] = []
    for _, alternatives in plan.requests:
        for alternative in alternatives:
            if len(out) == MAX_CAPACITY_ENTRIES:
                break
            try:
                index = state.index(alternative)
            except Rejected:
                continue
            requested = "all" if alternative.all_mode else alternative.body.wanted
            figures = _index_figures(index)
            out.append({"request": alternative.result_name, "requested": requested, **figures,
                        "unavailable": dict(figures["unavailable"])})
    spec_capacity[id(plan)] = (plan, state.version, out)
    return out


def _index_figures(index: DeviceIndex) -> dict[str, Any]:
    """What an index holds and why the rest is not free: the same for every claim it serves, so worked
    out once per index while its free devices stay the same."""
    kept = index.cached.get("figures")
    if kept is not None and kept[0] == index.version:
        return kept[1]
    held = {why: n for why, n in index.blocked.items() if n}
    if index.tainted:
        held["tainted"] = index.tainted
    if index.unhealthy:
        held["unhealthy"] = index.unhealthy
    figures = {"matching": index.matching, "free": index.free_total, "mostFreeOnOneNode": index.most_free(),
               "mostOnOneNode": index.largest_group, "nodes": index.nodes_with_matches, "unavailable": held}
    index.cached["figures"] = (index.version, figures)
    return figures


def _suggestions(blocks: list[Block], capacity: list[dict[str, Any]], decision: Decision, tenant: str,
                 preemption: dict[str, Any]) -> list[str]:
    out = []
    for b in blocks:
        need = b.used + b.requested - b.nominal
        borrowers = ', '.join(f'{t} ({n})' for t, n in sorted(b.borrowed_by.items())) or 'others'
        if b.cohort_limit is not None:  # in a tree, a cohort's borrowingLimit binds before the tenant's quota
            cohort, limit, enough = b.cohort_limit
            out.append(f"raise cohort {cohort}'s {b.flavor} borrowingLimit from {limit} to {enough}, or wait for "
                       f"{borrowers} to return borrowed {b.flavor}")
        elif need <= 0:  # within its nominal: cohort-mates borrow what it lends, and it takes it back by reclaim
            out.append(f"wait for {borrowers} to return borrowed {b.flavor}: reclaim preempts their preemptible "
                       f"claims that borrow it, or set {tenant}'s {b.flavor} lendingLimit to keep it from lending")
        elif b.borrowing_limit is not None and need > b.borrowing_limit:
            out.append(f"raise {tenant}'s {b.flavor} borrowingLimit from {b.borrowing_limit} to {need}, or its "
                       f"nominal from {b.nominal} to {b.used + b.requested}")
        else:
            out.append(f"raise {tenant}'s {b.flavor} nominal from {b.nominal} to {b.used + b.requested}, or wait "
                       f"for {borrowers} to return borrowed {b.flavor}")
    for c in capacity:
        requested = c["requested"]
        if isinstance(requested, int) and c["mostOnOneNode"] < requested:
            out.append(f"request {c['request']!r}: no node has {requested} matching devices (most: "
                       f"{c['mostOnOneNode']}); ask for fewer or add such a node")
        elif isinstance(requested, int) and c["mostFreeOnOneNode"] < requested:
            more = requested - c["mostFreeOnOneNode"]
            devices = "matching device is" if more == 1 else "matching devices are"
            out.append(f"request {c['request']!r}: wait until {more} more {devices} free on one node, or relax "
                       "its selectors")
    if decision.unsatisfiable and not out:
        out.append("no device of today's fleet can satisfy the claim: change its selectors or add hardware")
    if preemption.get("candidates") and not out:
        out.append("raise the claim's priority (claimbroker.io/priority) above the claims it would displace")
    return out


@dataclass
class Alike:
    """What the explanations given after one cycle share. Once the cycle has decided nothing moves, so
    claims of one tenant, priority and group with one reason read alike; a tenant's figures are the same
    in each of its claims' explanations; and claims of one spec with one reason and no blocking quota read
    alike but for their tenant and priority: many tenants wait for the same few specs, so those parts are
    worked out once per spec and reason."""

    candidates: int  # preemptible claims running after the cycle
    given: dict[tuple[Any, ...], dict[str, Any]] = field(default_factory=dict)
    parts: dict[Any, tuple[dict[str, Any], dict[str, Any]]] = field(default_factory=dict)
    tenants: dict[str, dict[str, Any]] = field(default_factory=dict)


def cut_explanation(waiting: Waiting, decision: Decision) -> dict[str, Any]:
    """A claim whose placement ran out of budget: what it is known to be, without working out more."""
    return {"state": decision.state.value, "reason": decision.reason, "unsatisfiable": False,
            "tenant": {"name": waiting.tenant}, "priority": waiting.priority, "budgetExceeded": True,
            "toAdmit": ["ask for fewer requests or firstAvailable alternatives, or fewer distinct selectors: the "
                        "claim's placement search costs more than a cycle allows, so it goes on in slices"]}


class Explainer:
    """Why claims wait, from the cycle that decided: the quotas that block them (from the quota book after
    the cycle), each spec's capacity per request (kept per plan and fleet version) and what preemption
    could take."""

    def __init__(self, placement: FleetState, book: QuotaBook, room: QuotaRoom,
                 group_of: Mapping[ClaimKey, GroupId | None],
                 gang_of: Callable[[Waiting], dict[str, Any] | None] = lambda _: None) -> None:
        self.placement = placement
        self.book = book
        self.room = room
        self.group_of = group_of  # each waiting claim's group (the queue's)
        self.gang_of = gang_of  # a gang member's `gang` part (shared.admission.gang_explain)
        # what a spec's requests match and what of it is free, per plan, kept per fleet version
        self.spec_capacity: dict[int, tuple[Plan, int, list[dict[str, Any]]]] = {}

    def forget(self, plan: Plan) -> None:
        self.spec_capacity.pop(id(plan), None)

    def pending(self, waiting: Waiting, decision: Decision, blocks: list[Block], alike: Alike) -> dict[str, Any]:
        """Why the claim waits, as structured data; what it shares with other claims' explanations comes
        from (and goes to) `alike`."""
        gid = self.group_of.get(waiting.key)  # its group is of its tenant and plan
        same = (waiting.tenant, waiting.priority, gid, decision.reason)
        found = alike.given.get(same)
        if found is not None:
            return found
        tenant = alike.tenants.get(waiting.tenant)
        if tenant is None:
            book = self.book
            tenant = alike.tenants[waiting.tenant] = {
                "name": waiting.tenant, "unitsInUse": round(book.units[waiting.tenant], 4),
                "weight": book.weight(waiting.tenant), "share": round(book.share(waiting.tenant), 4)}
            if book.config.half_life > 0:  # fairSharing.halfLife: the share counts past use too
                tenant["pastUse"] = round(book.past.get(waiting.tenant, 0.0), 4)
        key = None
        if not blocks and gid is not None:  # a quota's figures are the tenant's own
            key = (gid[1], decision.reason, decision.unsatisfiable)
        parts = alike.parts.get(key) if key is not None else None
        if parts is None:
            parts = self._spec_parts(waiting, decision, blocks, alike.candidates)
            if key is not None:
                alike.parts[key] = parts
        head, tail = parts
        found = {**head, "tenant": tenant, "priority": waiting.priority, **tail}
        if decision.reason is not None and decision.reason.startswith("gang ") and (
                gang := self.gang_of(waiting)) is not None:  # one reason per gang: its members read alike
            found["gang"] = gang
            found["toAdmit"] = [*gang_suggestions(gang), *found["toAdmit"]]
        alike.given[same] = found
        return found

    def _spec_parts(self, waiting: Waiting, decision: Decision, blocks: list[Block], candidates: int
                    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """An explanation but for the tenant's figures and the claim's priority (which go between the two)."""
        preemption = {
            "candidates": candidates,
            "outcome": ("no preemptible claim may be displaced for it by the rules (priority within its tenant, "
                        "reclaim of borrowed quota, fair share)" if candidates else "nothing runs that could be "
                        "preempted"),
        }
        capacity = _capacity(self.placement, self.spec_capacity, waiting)
        head = {"state": decision.state.value, "reason": decision.reason, "unsatisfiable": decision.unsatisfiable}
        tail = {
            "flavors": sorted(self.room.claim_facts(waiting).flavors),  # what its requests accept: the demand it adds
            "quota": [b.to_json() for b in blocks],
            "capacity": capacity,
            "preemption": preemption,
            "toAdmit": _suggestions(blocks, capacity, decision, waiting.tenant, preemption),
        }
        return head, tail
