"""The preemption search: which running claims a waiting claim may preempt, by which rule (priority
within a tenant, reclaim of lent quota, fair share), on which node, fewest and cheapest first. It reads
and moves the admission state it is given (a victim evicted for a trial, restored unless it is preempted).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from shared.admission.claim_guard import per_claim
from shared.admission.flavors import flavor_deltas
from shared.admission.holdings import NO_VICTIMS, allocated_devices
from shared.admission.model import (
    MAX_PREEMPTION_NODES,
    ClaimKey,
    Preemption,
    Running,
    Waiting,
)
from shared.admission.state import AdmissionState
from shared.dra.budget import BudgetExceeded
from shared.dra.results import Allocation, Decision, DeviceKey, Rejected, State


def _candidates(state: AdmissionState, preemptor: Waiting, hosts: Collection[str]
                ) -> tuple[dict[str, list[tuple[Running, str]]], dict[str, float]]:
    """Running claims `preemptor` may consider, with the rule that lets it, before checking the
    outcome, per node, and the GPU units they hold on each node (what orders the nodes). Only
    preemptible claims on `hosts` that ran before this cycle, never one that displaced the preemptor
    (no back and forth); in its own tenant those of lower priority ("priority"); in other tenants
    only claims holding a flavor their tenant borrows (any claim in an open fleet): "reclaim" within
    the cohort (in a tree: within the tree, see QuotaBook.guaranteed_room), for a preemptor with nominal
    headroom, else "fair-share" outside its cohort, from tenants whose share is at least the preemptor's
    (the victim's share after the move must stay at or above). Under reclaim and
    fair share, not a claim within its tenant's minRuntime of its allocation (when that ends is noted for
    the explanation), nor any of a tenant whose maxPreemptionsPerMinute is spent."""
    book, quotas = state.book, state.snapshot.quotas
    now = state.snapshot.now
    enforced = quotas.enforced
    flavors, sized = state.room.claim_facts(preemptor)[:2]
    least = sized or 0
    values = [f.value for f in quotas.flavors if f.name in flavors]
    # the preemptor's share after the move is at least this; a victim tenant's must stay at or above it
    mine = book.share(preemptor.tenant) + least * min(values, default=0.0) / book.weight(preemptor.tenant)
    tree = book.top_of(preemptor.tenant)
    headroom: dict[int, bool] = {}  # per borrowing distance to the victim's tenant
    own_only = _stuck_on_quota(state, preemptor)  # a claim its quota keeps out preempts within its tenant
    view = state.victim_tenants()
    by_flavor = state.holdings.by_flavor
    on_hosts: dict[str, list[tuple[Running, str]]] = {}
    units_on: dict[str, float] = defaultdict(float)
    # preempted or admitted in this cycle, or displaced the preemptor once (no back and forth)
    spared = state.preempted | state.admitted_now | preemptor.displaced_by
    own = preemptor.tenant
    for tenant, claims, weight, share, tenant_cohort in view.tenants:
        borrowed: frozenset[str | None] | None = None
        if tenant == own:
            rule = "priority"
        elif own_only:
            continue
        elif enforced and tenant_cohort == tree:
            # reclaim keeps the preemptor (or, in a tree, its side under the nearest cohort it shares with
            # the victim's tenant) within its nominal quota
            levels = book.distance(own, tenant) if book.nested else 0
            fits = headroom.get(levels)
            if fits is None:
                room = sum(book.guaranteed_room(own, f, levels) for f in flavors)
                fits = headroom[levels] = not flavors or room >= max(1, least)
            if fits and not (book.nested and flavors and not any(
                    book.side_borrows(tenant, f, book.distance(tenant, own)) for f in flavors)):
                rule = "reclaim"
            elif levels > 0 and share >= mine:  # another cohort of its tree: fair share, as between trees
                rule = "fair-share"
            else:
                continue  # a cohort-mate: only reclaim takes from it
        elif share >= mine:
            rule = "fair-share"
        else:
            continue
        if rule != "priority" and enforced:
            borrowed = view.borrowed(tenant)
            if not borrowed:
                continue
        runs_until = 0.0  # under reclaim and fair share: a claim allocated after this is spared (minRuntime)
        if rule != "priority":
            if quotas.preemptions_per_minute(tenant) is not None and _rate_spent(state, tenant):
                continue
            if now is not None and (least_run := quotas.min_runtime(tenant)) > 0:
                runs_until = now - least_run
        # Only claims holding a flavor the preemptor can use could free what it needs (devices or
        # quota), and under reclaim and fair share only one their tenant borrows: those alone are read.
        if sized is None:
            wanted: Collection[str | None] | None = None if borrowed is None else borrowed
        else:
            wanted = flavors if borrowed is None else borrowed & flavors
        if wanted is None:
            pool = claims
        elif len(wanted) == 1:
            pool = by_flavor[tenant].get(next(iter(wanted)), NO_VICTIMS)
        else:  # the tenant's claims per flavor, merged in flavor order (a claim of two flavors once)
            pools = by_flavor[tenant]
            pool = {}
            for flavor in sorted(wanted, key=str):
                if found_pool := pools.get(flavor):
                    pool.update(found_pool)
        by_priority, by_fair_share = rule == "priority", rule == "fair-share"  # per tenant, not per claim
        below = preemptor.priority if by_priority else None
        for key, (victim, node, units) in pool.items():
            if key in spared or node not in hosts:
                continue
            if by_priority:
                if victim.priority >= preemptor.priority:
                    continue
            elif by_fair_share and share - units / weight < mine:
                continue
            if runs_until and victim.allocated_at is not None and victim.allocated_at > runs_until:
                state.answers.note_wait(preemptor, tenant, rule, victim.allocated_at + quotas.min_runtime(tenant))
                continue
            if victim.gang is not None and not _gang_movable(state, victim, spared, runs_until, below,
                                                             share - _units(state, victim) / weight < mine
                                                             if by_fair_share else False):
                continue  # a member whose gang cannot be preempted whole
            found = on_hosts.get(node)
            if found is None:
                on_hosts[node] = [(victim, rule)]
            else:
                found.append((victim, rule))
            units_on[node] += units
    return on_hosts, units_on


def _gang_movable(state: AdmissionState, victim: Running, spared: Collection[Any], runs_until: float,
                  below: int | None, share_too_low: bool) -> bool:
    """Whether every other running member of the victim's gang may be preempted with it: preemptible, not
    spared, of a priority under `below` (priority rule), past its tenant's minRuntime where that applies;
    and under fair share the victim's tenant's share stays at or above the preemptor's without the whole
    gang (`share_too_low` says it does not)."""
    if share_too_low:
        return False
    for mate in state.holdings.gang_of(victim)[1:]:
        if not mate.preemptible or mate.key in spared or (below is not None and mate.priority >= below):
            return False
        if runs_until and mate.allocated_at is not None and mate.allocated_at > runs_until:
            return False
    return True


def _rate_left(state: AdmissionState, tenant: str) -> int | None:
    """How many more of `tenant`'s claims fair share or reclaim may preempt in this minute (its
    maxPreemptionsPerMinute less those of the last minute and of this cycle); None: no limit."""
    most = state.snapshot.quotas.preemptions_per_minute(tenant)
    if most is None:
        return None
    done = state.snapshot.recent_preemptions.get(tenant, 0)
    done += sum(1 for p in state.preemptions if p.victim[0] == tenant and p.rule != "priority")
    return max(0, most - done)


def _rate_spent(state: AdmissionState, tenant: str) -> bool:
    return _rate_left(state, tenant) == 0


def _within_rates(state: AdmissionState, victims: Sequence[tuple[Running, str]]) -> bool:
    """Whether preempting `victims` keeps every tenant within its maxPreemptionsPerMinute."""
    per_tenant = Counter(moved.tenant for victim, rule in victims if rule != "priority"
                         for moved in _moved(state, victim))
    return all((left := _rate_left(state, tenant)) is None or count <= left for tenant, count in per_tenant.items())


def _stuck_on_quota(state: AdmissionState, waiting: Waiting) -> bool:
    """Its quota keeps the claim out whatever other tenants' claims are evicted: only its own tenant's
    claims could give quota back. Either its borrowingLimits stop it, or what it may take now is too
    little and no eviction elsewhere returns any: no cohort member borrows a flavor it could use and
    no cohort has spilled into the free capacity of those flavors."""
    book, tenant = state.book, waiting.tenant
    if not state.snapshot.quotas.enforced:
        return False
    facts = state.room.claim_facts(waiting)
    flavors, least = facts[0], facts[1] or 0
    if not flavors or least <= 0:
        return False
    if sum(book.room(tenant, f, lent_only=False) for f in flavors) < least:
        return True  # its borrowingLimits stop it, whatever is lent
    if state.room.quota_short(tenant, facts) is None or any(book.over[f] > 0 for f in flavors):
        return False
    if book.nested:  # the tree's borrowers of those flavors, from the sets the book keeps
        top = book.top_of(tenant)
        return not any(m != tenant and book.top_of(m) == top for f in flavors for m in book.borrowers[f])
    members = book.members[book.cohort_of(tenant)]
    return not any(m != tenant and book.borrowing(m, f) > 0 for m in members for f in flavors)


def prefilter(state: AdmissionState) -> tuple[Callable[[Waiting], bool], Callable[[str], bool], Mapping[str, int]]:
    """A cheap test, built once per pass, of whether a waiting claim has any victim candidate: a
    lower-priority preemptible claim of its own tenant, or a preemptible claim of another tenant
    that borrows (any other tenant in an open fleet) with a larger share than its own, or, whatever
    the shares, of a cohort-mate that borrows while the claim's tenant has nominal headroom (reclaim).
    Also its two halves: whether a tenant could preempt another tenant's claims (by share or
    reclaim), and each tenant's lowest preemptible priority."""
    lowest: dict[str, int] = {}
    shares: dict[str, float] = {}
    enforced = state.snapshot.quotas.enforced
    fresh: dict[str, Counter[int]] = defaultdict(Counter)  # admitted in this cycle: not candidates
    for key in state.admitted_now:
        if (admitted := state.holdings.running[key]).preemptible:
            fresh[admitted.tenant][admitted.priority] += 1
    for tenant, counts in state.holdings.priorities.items():  # preemptible claims that ran before this cycle
        live = [p for p, n in counts.items() if n - fresh[tenant][p] > 0]
        if not live:
            continue
        lowest[tenant] = min(live)
        if not enforced or state.book.borrowed_count[tenant] > 0:
            shares[tenant] = state.book.share(tenant)
    top = max(shares.values(), default=None)

    # per cohort, its members that borrow and run preemptible claims: reclaim takes from them whatever
    # the shares (a tenant within its nominal quota gets back what it lent; see QuotaBook._available)
    borrowers: dict[str, set[str]] = defaultdict(set)
    if enforced:
        for tenant in lowest:
            if state.book.borrowed_count[tenant] > 0:
                borrowers[state.book.top_of(tenant)].add(tenant)

    def by_reclaim(tenant: str, flavors: frozenset[str] | None = None) -> bool:
        """A cohort-mate borrows and the tenant has nominal headroom (in one of `flavors`)."""
        mates = borrowers.get(state.book.top_of(tenant)) if borrowers else None
        if not mates or (len(mates) == 1 and tenant in mates):
            return False
        headroom = state.book.reclaim_flavors(tenant)
        return bool(headroom if flavors is None else headroom & flavors)

    def by_fair_share(tenant: str) -> bool:
        mine = state.book.share(tenant)
        if top is None or top < mine:
            return False
        return any(t != tenant and s >= mine for t, s in shares.items())

    def by_share(tenant: str) -> bool:
        """It could preempt another tenant's claims: by fair share or by reclaim."""
        return by_fair_share(tenant) or by_reclaim(tenant)

    stuck: dict[Any, bool] = {}  # per group: its tenant's quota and its spec decide it alike
    group_of, claim_facts = state.queue.group_of, state.room.claim_facts

    def test(waiting: Waiting) -> bool:
        """A claim its quota keeps out may only preempt lower-priority claims of its own tenant."""
        if lowest.get(waiting.tenant, waiting.priority) < waiting.priority:
            return True
        if not (by_fair_share(waiting.tenant) or by_reclaim(waiting.tenant, claim_facts(waiting).flavors)):
            return False
        gid = group_of.get(waiting.key)
        found = stuck.get(gid)
        if found is None:
            found = stuck[gid] = _stuck_on_quota(state, waiting)
        return not found

    return test, by_share, lowest


@per_claim
def try_preempt(state: AdmissionState, waiting: Waiting, within: Collection[str] | None = None) -> Decision | None:
    """The smallest set of victims that lets the claim in, if any (with `within`, victims only on those
    nodes: a gang member confined to one value of its topology key); the search is paid for by the claim's
    tenant (PlacementBudget.paying): a claim whose placements are expensive finds no victims once its
    tenant's budget for the cycle is spent."""
    budget = state.budget
    if budget.put_off(waiting) is not None:
        return None
    with budget.paying(waiting):
        try:
            return _try_preempt(state, waiting, within)
        except BudgetExceeded:
            budget.deferred += 1
            return None


def _try_preempt(state: AdmissionState, waiting: Waiting, within: Collection[str] | None) -> Decision | None:
    try:  # victims only on nodes with devices the claim's first request accepts
        lead = state.placement.plan(waiting.claim).variants[0][0]
        index = state.placement.index(lead)
    except (Rejected, IndexError):
        return None
    hosts = index.nodes if within is None else index.nodes & frozenset(within)
    on_hosts, units_on = _candidates(state, waiting, hosts)
    best: tuple[tuple[int, float, int, int], list[tuple[Running, str]], Allocation] | None = None
    tried = 0  # nodes where evicting the candidates could make room, fewest candidate units first
    for _, node in sorted(zip(units_on.values(), units_on, strict=True)):  # fewest units, then name
        if tried == MAX_PREEMPTION_NODES:
            break
        candidates = on_hosts[node]
        accepted = _accepted_on(state, index, node)
        if len(accepted) < lead.wanted:
            continue
        could_free = sum(1 for r, _ in candidates for k in r.allocation.keys if k in accepted)
        if len(index.free_on(node)) + could_free < lead.wanted:
            continue  # evicting them cannot make room
        tried += 1
        found = _victims_on(state, waiting, sorted(candidates, key=lambda c: _victim_order(state, waiting, c)))
        if found is None:
            continue
        victims, allocation = found
        if not _within_rates(state, victims):
            continue  # room here only by preempting more of a tenant than its maxPreemptionsPerMinute leaves
        score = (max(_reach(state, waiting, v) for v in victims), sum(_units(state, r) for r, _ in victims),
                 max(r.priority for r, _ in victims), -min(r.allocated_order for r, _ in victims))
        if best is None or score < best[0]:
            best = (score, victims, allocation)
    if best is None:
        return None
    _, chosen, allocation = best
    victims = [(moved, rule) for victim, rule in chosen for moved in _moved(state, victim)]  # whole gangs
    for victim, _ in victims:
        _evict(state, victim)
        state.evicted[victim.key] = victim
    state.admit(waiting, allocation)
    for victim, rule in victims:  # reasons state the shares after the move
        state.preemptions.append(Preemption(victim.key, waiting.key, rule,
                                           _preempt_reason(state, waiting, victim, rule)))
    return Decision(State.ALLOCATED, allocation)


def rooms_with_victims(state: AdmissionState, waiting: Waiting, groups: Mapping[str, Sequence[str]]) -> dict[str, int]:
    """Per group of nodes (the values of a gang's topology key), the devices on them that the claim's first
    request accepts and that are free or held by claims the rules let it consider as victims: at most what
    preemption could make room for there. The candidates are worked out once, for every group."""
    try:
        index = state.placement.index(state.placement.plan(waiting.claim).variants[0][0])
    except (Rejected, IndexError):
        return dict.fromkeys(groups, 0)
    hosts = index.nodes
    on_hosts, _ = _candidates(state, waiting, hosts)
    rooms = {}
    for group, nodes in groups.items():
        room = 0
        for node in nodes:
            if node not in hosts:
                continue
            room += len(index.free_on(node))
            if found := on_hosts.get(node):
                accepted = _accepted_on(state, index, node)
                room += sum(1 for r, _ in found for k in r.allocation.keys if k in accepted)
        rooms[group] = room
    return rooms


def _accepted_on(state: AdmissionState, index: Any, node: str) -> frozenset[DeviceKey]:
    """The keys of the node's devices an index accepts: fixed for the fleet, so kept with the index."""
    key = ("accepted", node)
    found: frozenset[DeviceKey] | None = index.cached.get(key)
    if found is None:
        found = index.cached[key] = frozenset(d.key for d in index.devices_on(node))
    return found


def _moved(state: AdmissionState, victim: Running) -> list[Running]:
    """What preempting the victim moves: itself, and every other running member of its gang."""
    return [victim] if victim.gang is None else state.holdings.gang_of(victim)


def _units(state: AdmissionState, r: Running) -> float:
    """The GPU units preempting the claim frees: its gang's, for a gang member."""
    if r.gang is None:
        return state.holdings.holding(r).units
    return sum(state.holdings.holding(m).units for m in state.holdings.gang_of(r))


def _reach(state: AdmissionState, waiting: Waiting, candidate: tuple[Running, str]) -> int:
    """Reclaim takes from the nearest borrowers in the tree first: the borrowing distance of a reclaim
    victim (kueue PR#4806); 0 for every other victim, and for every victim when cohorts do not nest."""
    victim, rule = candidate
    if rule != "reclaim" or not state.book.nested:
        return 0
    return state.book.distance(waiting.tenant, victim.tenant)


def _victim_order(state: AdmissionState, waiting: Waiting, c: tuple[Running, str]) -> tuple[int, float, int, int]:
    r = c[0]
    return (_reach(state, waiting, c), _units(state, r), r.priority, -r.allocated_order)


def _evict(state: AdmissionState, victim: Running) -> None:
    state.holdings.drop(victim)
    state.preempted.add(victim.key)


def _restore(state: AdmissionState, victim: Running) -> None:
    state.holdings.hold(victim)
    state.preempted.discard(victim.key)


def _evict_all(state: AdmissionState, moved: list[Running]) -> None:
    for victim in moved:
        _evict(state, victim)


def _restore_all(state: AdmissionState, moved: list[Running]) -> None:
    for victim in moved:
        _restore(state, victim)


def _fits_with(state: AdmissionState, waiting: Waiting, victims: Sequence[tuple[Running, str]]) -> Allocation | None:
    """With the victims gone, the claim is placed and every victim's rule holds for the outcome."""
    decision, blocks = state.trials.try_admit(waiting)
    if decision.allocation is None or blocks:
        return None
    devices = allocated_devices(state.fleet, decision.allocation)
    deltas = flavor_deltas(devices, state.flavors)
    units = sum(state.flavors.units_of(d) for d in devices)
    for victim, rule in victims:
        if rule == "reclaim":
            book = state.book
            levels = book.distance(waiting.tenant, victim.tenant) if book.nested else 0
            if any(n > book.guaranteed_room(waiting.tenant, f, levels) for f, n in deltas.items()):
                return None  # reclaim is for a tenant (in a tree: its side) that stays within its nominal quota
        elif rule == "fair-share":
            mine = state.book.share_with(waiting.tenant, units)
            if mine > state.book.share(victim.tenant):
                return None
    return decision.allocation


def _victims_on(state: AdmissionState, waiting: Waiting, candidates: list[tuple[Running, str]]
                ) -> tuple[list[tuple[Running, str]], Allocation] | None:
    """Greedy on one node until the claim fits, then drop every victim it does not need. A gang member
    moves with its whole gang (`_moved`): a mate that is a candidate too is not taken twice.

    A victim is first taken out of the quota book only: while the claim's quota, or the idle devices
    of the flavors it has room in, still keep it out (`quota_short`), no placement can pass, so the
    fleet is not touched (the outcome is the same, for less)."""
    taken: list[tuple[Running, str]] = []
    moved_of: dict[ClaimKey, list[Running]] = {}  # per candidate taken: what it moves
    gone: set[ClaimKey] = set()  # moved by a candidate taken
    in_book_only: list[Running] = []
    allocation = None
    facts = state.room.claim_facts(waiting)
    quota_short, count = state.room.quota_short, state.holdings.count
    try:
        for candidate in candidates:
            if candidate[0].key in gone:
                continue
            moved = moved_of[candidate[0].key] = _moved(state, candidate[0])
            for victim in moved:
                count(victim, -1)
                in_book_only.append(victim)
                gone.add(victim.key)
            taken.append(candidate)
            if quota_short(waiting.tenant, facts, idle=True) is not None:
                continue
            for victim in in_book_only:
                count(victim, 1)
                _evict(state, victim)
            in_book_only.clear()
            allocation = _fits_with(state, waiting, taken)
            if allocation is not None:
                break
        if allocation is None:
            return None
        for candidate in list(reversed(taken))[1:]:  # the last one was needed, by construction
            _restore_all(state, moved_of[candidate[0].key])
            rest = [c for c in taken if c is not candidate]
            again = _fits_with(state, waiting, rest)
            if again is not None:
                taken, allocation = rest, again
            else:
                _evict_all(state, moved_of[candidate[0].key])
        return list(taken), allocation
    finally:
        for candidate in taken:
            for victim in moved_of[candidate[0].key]:
                if victim in in_book_only:
                    count(victim, 1)
                else:
                    _restore(state, victim)


def _preempt_reason(state: AdmissionState, waiting: Waiting, victim: Running, rule: str) -> str:
    by = f"{waiting.tenant}/{waiting.name}"
    if victim.gang is not None:
        by = f"{by} with every member of its gang {victim.gang}"
    if rule == "priority":
        return f"preempted by {by}, priority {waiting.priority} over {victim.priority} in tenant {victim.tenant}"
    if rule == "reclaim":
        book = state.book
        levels = book.distance(waiting.tenant, victim.tenant) if book.nested else 0
        if levels > 0:  # the quota taken back is its side's: the cohort under the one both share
            return (f"preempted by {by}: cohort {book.path_of(waiting.tenant)[levels - 1]} of tenant "
                    f"{waiting.tenant} reclaims its nominal quota that {victim.tenant} borrowed (borrowing distance "
                    f"{levels})")
        return (f"preempted by {by}: tenant {waiting.tenant} reclaims its nominal quota that {victim.tenant} "
                "borrowed")
    return (f"preempted by {by} for fair share: afterwards {waiting.tenant}'s share "
            f"{state.book.share(waiting.tenant):.2f} is at or below {victim.tenant}'s "
            f"{state.book.share(victim.tenant):.2f} (GPU units in use"
            f"{' plus past use' if state.book.config.half_life > 0 else ''} per unit of weight)")
