"""One admission pass: the heads in fair-share order tried until nothing more fits, then the preemptors.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Collection, Iterable, Mapping

from shared.admission.gang_pass import gang_units, gang_units_of, share_after, try_gang
from shared.admission.gangs import GangUnit
from shared.admission.groups import GroupId, Heads, WaitingGroups
from shared.admission.model import UNANSWERED, Block, Waiting, queue_entry
from shared.admission.preemption import prefilter
from shared.admission.state import AdmissionState
from shared.dra.results import Decision, State

NO_FLAVORS: frozenset[str] = frozenset()  # a tenant with room in every flavor so far


class OutOfRoom(Exception):
    """The tenant's quota has room in no flavor with an idle device, and every spec it waits with has a
    fixed size, so none of its groups can be admitted for the rest of the pass."""


def admission_pass(cycle: AdmissionState) -> tuple[list[tuple[Waiting, Decision, list[Block]]], dict[str, int]]:
    """Lowest share first, re-ranked after every admission; within a tenant priority, then arrival.

    Only group heads are tried: a head that fits is admitted and the next claim of its group becomes the
    head; a head that does not fit answers for its whole group. Free devices and quota only shrink while
    the pass admits, so a spec no node has room for is refused for every tenant for the rest of the pass
    (found by a trial, or by counting: fewer devices it accepts are idle than it takes), and so is a group
    whose tenant's quota has too little room for its spec among the idle devices (arithmetic on rooms
    kept per tenant and flavor and idle devices per flavor, cheaper than a trial that would place the
    claim on devices its quota refuses): such heads are dropped without a trial and without
    re-ranking the tenant, and the claims of their groups that have no answer yet are answered at the
    end. Once a tenant is found to have room in no flavor with an idle device, the rest of its heads are
    not looked at (`OutOfRoom`: in a deep queue a tenant at its quota waits in many groups). Once no
    spec is open the pass stops, and the tenants left only come in order. So a cycle costs
    O(admitted + trials) plus at most a set lookup per group, whatever the depth of the queue. Returns
    what was decided and the order tenants came in (the claims admitted are `cycle.admitted_now`)."""
    waiting_groups = cycle.queue
    waiting_of, tenant_heads = waiting_groups.waiting, waiting_groups.tenant_heads
    heads = {t: Heads(q) for t, q in tenant_heads.items() if q}
    position: dict[tuple[str, int], int] = {}  # per group: claims admitted from it so far
    book = cycle.book
    tenants = [(book.share(t), q[0][0][0], q[0][0][1], t) for t, q in tenant_heads.items() if q]
    decided: list[tuple[Waiting, Decision, list[Block]]] = []
    # complete gangs, each one entry among the tenants under a name no tenant has ("\0" is in no DNS label)
    gang_at: dict[str, tuple[GangUnit, float]] = {}
    if cycle.gangs.members:
        answered, complete = gang_units(cycle)
        decided.extend(answered)
        for unit in complete:
            units = gang_units_of(cycle, unit)
            token = f"\0{unit.key[0]}\0{unit.name}"
            gang_at[token] = (unit, units)
            tenants.append((share_after(cycle, unit, units), -unit.priority, unit.arrival, token))
    heapq.heapify(tenants)
    first_seen: dict[str, int] = {}
    admitted = cycle.admitted_now  # so far in this cycle (the kept groups change only in begin())
    groups = waiting_groups.groups
    quota_dead: set[tuple[str, int]] = set()  # groups their tenant's quota keeps out for the rest of the pass
    # per tenant and flavors a spec accepts: one more than the devices its quota and the idle devices were
    # found to leave over them; as both only shrink in a pass, any spec of as many devices or more over
    # those flavors is kept out too, without the arithmetic
    too_many: dict[tuple[str, frozenset[str]], int] = {}
    # per tenant, the flavors it was found to have no room in (its quota or no idle device): a spec over
    # only those is kept out too, whatever it takes
    no_room_in: dict[str, frozenset[str]] = {}
    quota_full: Callable[[tuple[str, int]], bool] | None = None
    if cycle.snapshot.quotas.enforced:
        quota_short, idle_of = cycle.room.quota_short, cycle.book.idle
        unused, unsized = book.unused, waiting_groups.unsized

        def quota_full(gid: tuple[str, int]) -> bool:
            facts = groups[gid].facts
            need = facts.least
            if need is None:
                return False
            tenant, flavors = gid[0], facts.flavors
            key = (tenant, flavors)
            bound = too_many.get(key)
            if bound is None or need < bound:
                if flavors <= no_room_in.get(tenant, NO_FLAVORS):
                    short = 0  # what quota_short would find, for less
                else:
                    found = quota_short(tenant, facts, idle=True)
                    if found is None:
                        return False
                    short = found
                if sum(idle_of(f) for f in flavors) < need:  # no node has room for the spec
                    no_room.add(gid[1])
                    open_specs.discard(gid[1])
                    return True
                too_many[key] = short + 1  # below `bound`: short < need
                if short == 0:
                    out = no_room_in[tenant] = no_room_in.get(tenant, NO_FLAVORS) | flavors
                    if not unsized[tenant] and all(n <= 0 or f in out for f, n in unused.items()):
                        raise OutOfRoom  # no flavor with an idle device has room for it: no group fits
            quota_dead.add(gid)
            return True

    tried: set[tuple[str, int]] = set()  # groups a trial answered

    def refuse(tenant: str, gid: tuple[str, int], head: Waiting, decision: Decision, blocks: list[Block]) -> None:
        """The group's answer, for the claims behind the head that have none yet (or all, if Rejected)."""
        group = groups[gid]
        verdict = not decision.cut  # replaces an answer that said the search was cut short
        if not head.answered or decision.state is not State.PENDING or (verdict and head.name in group.cut):
            decided.append((head, decision, blocks))  # an answered claim still Pending keeps its answer
        if decision.state is State.REJECTED:
            rest = group.entries[position.get(gid, 0) + 1:]
        elif group.fresh or (verdict and group.cut):
            names = group.fresh | group.cut if verdict else group.fresh
            rest = sorted(queue_entry(waiting_of[(tenant, n)]) for n in names
                          if n != head.name and (tenant, n) not in admitted)
        else:
            return
        decided.extend((waiting_of[(tenant, e[2])], decision, blocks) for e in rest)

    open_specs = set(waiting_groups.specs)  # plan ids of the specs some node may still have room for
    trials = cycle.trials
    try_admit, admit = trials.try_admit, cycle.admit
    no_room = trials.start_pass()  # failed placements stay failed (see TrialAdmission.shrinking)
    try:
        while tenants:
            if not open_specs and not gang_at:  # no node has room for any spec: every head left would be dropped
                for *_, tenant in sorted(tenants):
                    first_seen.setdefault(tenant, len(first_seen))
                break
            share, _, _, tenant = heapq.heappop(tenants)
            if gang_at and (found := gang_at.get(tenant)) is not None:
                unit, units = found
                now = share_after(cycle, unit, units)
                if now > share:  # its tenant admitted more since: its place moved back
                    heapq.heappush(tenants, (now, -unit.priority, unit.arrival, tenant))
                else:
                    del gang_at[tenant]
                    decided.extend(try_gang(cycle, unit))
                continue
            first_seen.setdefault(tenant, len(first_seen))
            queue = heads[tenant]
            try:
                if not queue.skip(no_room, quota_dead, quota_full):  # a head that may fit: tried
                    entry, gid = queue.pop()
                    waiting = waiting_of[(tenant, entry[2])]
                    decision, blocks = try_admit(waiting, room_known=True)
                    if decision.allocation is not None:
                        decided.append((waiting, decision, blocks))
                        admit(waiting, decision.allocation)
                        at = position[gid] = position.get(gid, 0) + 1
                        if at < len(entries := groups[gid].entries):
                            queue.push((entries[at], gid))
                    else:
                        refuse(tenant, gid, waiting, decision, blocks)
                        tried.add(gid)
                        if gid[1] in no_room:  # the trial found no node with room for the spec
                            open_specs.discard(gid[1])
                        queue.skip(no_room, quota_dead, quota_full)  # dropped without re-ranking the tenant
            except OutOfRoom:
                continue  # its quota has room for none of its groups: it is not ranked again
            if (top := queue.first()) is not None:
                heapq.heappush(tenants, (book.share(tenant), top[0][0], top[0][1], tenant))
        for tenant, head, gid in dropped_unanswered(waiting_groups, position, tried):  # quota, a closed spec, no room
            refuse(tenant, gid, waiting_of[(tenant, head[2])], UNANSWERED, [])
    finally:
        trials.end_pass()
    return decided, first_seen


def dropped_unanswered(queue: WaitingGroups, position: Mapping[GroupId, int],
                       tried: Collection[GroupId]) -> list[tuple[str, tuple[int, int, str], GroupId]]:
    """The groups the pass dropped without a trial that hold claims with no answer yet, with their heads,
    in tenant order, then head order (the rest of the dropped groups keep their answers)."""
    pending = []
    for gid in list(queue.fresh_groups):
        group = queue.groups.get(gid)
        if group is None or not group.fresh:
            queue.fresh_groups.discard(gid)
        elif gid not in tried and (at := position.get(gid, 0)) < len(group.entries):
            pending.append((gid[0], group.entries[at], gid))
    return sorted(pending)


def preemptors(cycle: AdmissionState, order: Mapping[str, int]) -> Iterable[Waiting]:
    """Pending claims that have a victim candidate, in fair-share order: tenants in the order the
    admission pass took them, each tenant's claims by priority, then arrival. Per tenant the walk stops
    at the first claim that can preempt nothing, when no claim after it could either."""
    may_preempt, by_share, lowest = prefilter(cycle)
    groups, tenant_heads, waiting_of = cycle.queue.groups, cycle.queue.tenant_heads, cycle.queue.waiting
    queued = [t for t, heads in tenant_heads.items() if heads]
    for tenant in sorted(queued, key=lambda t: (order.get(t, len(order)), t)):
        entries = heapq.merge(*(groups[gid].entries for _, gid in tenant_heads[tenant]))
        for entry in entries:
            waiting = waiting_of[(tenant, entry[2])]
            if waiting.key in cycle.admitted_now:
                continue
            if may_preempt(waiting):
                done = len(cycle.preemptions)
                yield waiting
                if len(cycle.preemptions) != done:  # shares and candidates moved
                    may_preempt, by_share, lowest = prefilter(cycle)
            elif not by_share(tenant) and -entry[0] <= lowest.get(tenant, -entry[0]):
                break  # the rest have no higher priority, and only priority could let them preempt
