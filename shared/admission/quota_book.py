"""The quota book: usage per tenant and flavor against nominal quotas, borrowing and lending within cohorts.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping

from shared.admission.model import Block
from shared.admission.quota import QuotaConfig


class QuotaBook:
    """Usage per tenant and flavor against the quotas, kept up to date incrementally as the cycle admits
    and preempts, so asking what a cohort still lends costs O(1).

    The arithmetic that runs on every admission and quota check writes `max(0, x)` as `x if x > 0 else
    0`: CPython 3.11's max() parses keyword arguments and builds an iterator on each call, about fifteen
    times the cost of the comparison, and this runs tens of thousands of times a cycle."""

    def __init__(self, config: QuotaConfig, capacity: Mapping[str, int]) -> None:
        self.config = config
        self.capacity = capacity  # devices per flavor in the fleet
        self.used: dict[tuple[str, str], int] = defaultdict(int)
        self.units: dict[str, float] = defaultdict(float)
        self.members: dict[str, list[str]] = defaultdict(list)
        self.keep: dict[tuple[str, str], int] = {}  # nominal a tenant never lends
        self.lends: dict[tuple[str, str], int] = defaultdict(int)  # per cohort and flavor
        self.spill: dict[tuple[str, str], int] = defaultdict(int)  # members' use beyond what they keep
        self.over: dict[str, int] = defaultdict(int)  # cohorts' spill beyond what they lend: free capacity used
        self.covered: dict[str, int] = defaultdict(int)  # nominal quota per flavor over all tenants
        self.unused: dict[str, int] = dict(capacity)  # devices per flavor no tenant uses (idle() reads it)
        self.borrowed_count: dict[str, int] = defaultdict(int)  # flavors a tenant uses beyond its nominal
        self._borrowing: dict[str, set[str]] = defaultdict(set)  # those flavors, kept as usage moves
        self._borrowed: dict[str, frozenset[str | None]] = {}  # borrowed_flavors() as last asked, per tenant
        self.cohort_versions: dict[str, int] = defaultdict(int)  # per cohort: its members' usage changed
        self.free_version = 0  # the free capacity some cohort spilled into changed
        self._fixed: dict[tuple[str, str], tuple[int, int, tuple[str, str], int, int]] = {}  # per quotas
        self._nominals: dict[tuple[str, str], int] = {}
        self._cohorts: dict[str, str] = {}  # the quotas are fixed for a book's life: looked up once
        self._weights: dict[str, float] = {}
        self.past: dict[str, float] = {}  # past use per tenant in GPU units (fairSharing.halfLife), with penalties
        # The tree (config.nested): per cohort its parent (None: a top cohort, under the free capacity), per
        # cohort and flavor what its subtree lends its parent (`lent_up`, 0 for a top cohort) and its
        # borrowingLimit; per tenant its top cohort (usage anywhere in a tree moves that tree's version).
        self.nested = config.nested
        self.parent: dict[str, str | None] = {}
        self.lent_up: dict[tuple[str, str], int] = {}
        self.cohort_caps: dict[tuple[str, str], int] = {}
        self._tops: dict[str, str] = {}
        self.pool_flavors: dict[str, set[str]] = {}  # per cohort: the flavors its pool holds any of
        self.borrowers: dict[str, set[str]] = defaultdict(set)  # in a tree: per flavor, the tenants beyond nominal
        self.paths: dict[str, tuple[str, ...]] = {}  # per tenant: its cohort and the cohort's ancestors, nearest first
        for tenant in config.tenants.values():
            cohort = self.cohort_of(tenant.name)
            self.members[cohort].append(tenant.name)
            for flavor, limit in tenant.quotas.items():
                lent = min(limit.lending_limit, limit.nominal) if limit.lending_limit is not None else limit.nominal
                self.keep[(tenant.name, flavor)] = limit.nominal - lent
                self.lends[(cohort, flavor)] += lent
                self.covered[flavor] += limit.nominal
        if self.nested:
            self._build_tree()

    def _build_tree(self) -> None:
        """Kueue's SubtreeQuota bottom up: a cohort's pool (`lends`) is its own nominal plus what its members
        and child cohorts lend it; a child cohort lends its parent its pool up to its lendingLimit (all of it
        when unset); a top cohort lends nothing (top cohorts share only the free capacity)."""
        config = self.config
        names = set(config.cohorts) | {c for c in self.members if not c.startswith("tenant:")}
        depth = {name: len(config.ancestors(name)) for name in names}
        for name in names:
            self.parent[name] = config.cohort(name).parent
        for (owner, flavor), pool in self.lends.items():
            if pool:
                self.pool_flavors.setdefault(owner, set()).add(flavor)
        for name in sorted(names, key=lambda n: (-depth[n], n)):  # children before their parents
            cohort = config.cohort(name)
            self.pool_flavors.setdefault(name, set()).update(cohort.quotas)
            for flavor, own in cohort.quotas.items():
                self.lends[(name, flavor)] += own.nominal
                self.covered[flavor] += own.nominal
                if own.borrowing_limit is not None:
                    self.cohort_caps[(name, flavor)] = own.borrowing_limit
            parent = cohort.parent
            if parent is None:
                continue
            for flavor in sorted(self.pool_flavors.get(name, ())):
                pool = self.lends[(name, flavor)]
                self.pool_flavors.setdefault(parent, set()).add(flavor)
                found = cohort.limit(flavor)
                lent = pool if found is None or found.lending_limit is None else min(found.lending_limit, pool)
                self.lent_up[(name, flavor)] = lent
                self.lends[(parent, flavor)] += lent

    def top_of(self, tenant: str) -> str:
        """The top cohort of the tenant's tree (its own cohort when cohorts do not nest)."""
        found = self._tops.get(tenant)
        if found is None:
            found = self._tops[tenant] = self.path_of(tenant)[-1]
        return found

    def path_of(self, tenant: str) -> tuple[str, ...]:
        """The tenant's cohort and its ancestors, nearest first."""
        found = self.paths.get(tenant)
        if found is None:
            cohort = self.cohort_of(tenant)
            found = self.paths[tenant] = (tuple(self.config.ancestors(cohort)) if self.nested
                                          and not cohort.startswith("tenant:") else (cohort,))
        return found

    def cohort_of(self, tenant: str) -> str:
        found = self._cohorts.get(tenant)
        if found is None:
            found = self._cohorts[tenant] = self.config.tenant(tenant).cohort or f"tenant:{tenant}"
        return found

    def weight(self, tenant: str) -> float:
        found = self._weights.get(tenant)
        if found is None:
            found = self._weights[tenant] = self.config.tenant(tenant).weight
        return found

    def nominal(self, tenant: str, flavor: str) -> int:
        found = self._nominals.get((tenant, flavor))
        if found is None:
            limit = self.config.tenant(tenant).limit(flavor)
            found = self._nominals[(tenant, flavor)] = limit.nominal if limit else 0
        return found

    def share(self, tenant: str) -> float:
        """GPU units in use, plus past use under fairSharing.halfLife, per unit of weight."""
        past = self.past
        if past:
            return (self.units[tenant] + past.get(tenant, 0.0)) / self.weight(tenant)
        return self.units[tenant] / self.weight(tenant)

    def share_with(self, tenant: str, units: float) -> float:
        """The tenant's share if it held `units` more GPU units."""
        return (self.units[tenant] + self.past.get(tenant, 0.0) + units) / self.weight(tenant)

    def cohort_version(self, tenant: str) -> int:
        """Moves whenever usage in the tenant's tree moves (its cohort's, when cohorts do not nest)."""
        return self.cohort_versions[self.top_of(tenant) if self.nested else self.cohort_of(tenant)]

    def add(self, tenant: str, flavor: str | None, units: float, count: int = 1) -> None:
        """The tenant takes `count` more devices of the flavor (fewer, when negative), weighing `units`."""
        self.units[tenant] += units
        if flavor is None:
            return
        if self.nested:
            self._add_nested(tenant, flavor, count)
            return
        self.cohort_versions[self.cohort_of(tenant)] += 1
        key = (tenant, flavor)
        self.unused[flavor] = self.unused.get(flavor, 0) - count
        keep = self.keep.get(key, 0)
        used = self.used[key]
        now = self.used[key] = used + count
        before = used - keep if used > keep else 0
        after = now - keep if now > keep else 0
        nominal = self.nominal(tenant, flavor)
        if (used > nominal) != (now > nominal):
            self.borrowed_count[tenant] += 1 if count > 0 else -1
            if now > nominal:
                self._borrowing[tenant].add(flavor)
            else:
                self._borrowing[tenant].discard(flavor)
            self._borrowed.pop(tenant, None)
        if before != after:
            cohort = (self.cohort_of(tenant), flavor)
            lends, spill = self.lends[cohort], self.spill[cohort]
            over_before = spill - lends if spill > lends else 0
            spill = self.spill[cohort] = spill + after - before
            over_change = (spill - lends if spill > lends else 0) - over_before
            if over_change:
                self.over[flavor] += over_change
                self.free_version += 1

    def _add_nested(self, tenant: str, flavor: str, count: int) -> None:
        """add() in a tree: what a node uses beyond the part it keeps (its pool less what it lends up)
        spills into its parent's pool, level by level; a top cohort's spill is free capacity in use."""
        self.cohort_versions[self.top_of(tenant)] += 1
        key = (tenant, flavor)
        self.unused[flavor] = self.unused.get(flavor, 0) - count
        keep = self.keep.get(key, 0)
        used = self.used[key]
        now = self.used[key] = used + count
        nominal = self.nominal(tenant, flavor)
        if (used > nominal) != (now > nominal):
            self.borrowed_count[tenant] += 1 if count > 0 else -1
            if now > nominal:
                self._borrowing[tenant].add(flavor)
                self.borrowers[flavor].add(tenant)
            else:
                self._borrowing[tenant].discard(flavor)
                self.borrowers[flavor].discard(tenant)
            self._borrowed.pop(tenant, None)
        change = (now - keep if now > keep else 0) - (used - keep if used > keep else 0)
        for cohort in self.path_of(tenant):
            if not change:
                return
            node = (cohort, flavor)
            local = self.lends[node] - self.lent_up.get(node, 0)
            usage = self.spill[node]
            beyond = usage - local if usage > local else 0
            usage = self.spill[node] = usage + change
            change = (usage - local if usage > local else 0) - beyond
        if change:
            self.over[flavor] += change
            self.free_version += 1

    def units_in_use(self) -> dict[tuple[str, str], float]:
        """GPU units each tenant holds per flavor (past_use.units_in_use's figures, from the counts kept)."""
        values = {f.name: f.value for f in self.config.flavors}
        return {key: n * values[key[1]] for key, n in self.used.items() if n > 0 and key[1] in values}

    def borrowing(self, tenant: str, flavor: str) -> int:
        beyond = self.used[(tenant, flavor)] - self.nominal(tenant, flavor)
        return beyond if beyond > 0 else 0

    def borrow_cap(self, tenant: str, flavor: str) -> int:
        """The tenant's borrowingLimit for the flavor (none: unbounded)."""
        limit = self.config.tenant(tenant).limit(flavor)
        return limit.borrowing_limit if limit and limit.borrowing_limit is not None else 1 << 30

    def room(self, tenant: str, flavor: str, *, lent_only: bool = True) -> int:
        """Devices of the flavor the tenant may still take: check()'s arithmetic solved for the most that
        passes, what is available to it (`_available`) within its nominal headroom plus its borrowingLimit
        (with `lent_only=False`, as if its cohort and the free capacity lent without end)."""
        fixed = self._fixed.get((tenant, flavor)) or self._fixed_of(tenant, flavor)
        nominal, cap = fixed[0], fixed[1]
        used = self.used[(tenant, flavor)]
        headroom = nominal - used if nominal > used else 0
        cap_left = cap - (used - nominal if used > nominal else 0)
        most = headroom + cap_left if cap_left > 0 else headroom
        if not lent_only:
            return most
        available = self._available(fixed, flavor, used, tenant)
        return available if available < most else most

    def _fixed_of(self, tenant: str, flavor: str) -> tuple[int, int, tuple[str, str], int, int]:
        """What the quotas fix for a tenant and flavor: nominal, borrowing cap, cohort key, the flavor's
        free capacity and the part of its nominal the tenant keeps (never lends); looked up once."""
        fixed = self._fixed.get((tenant, flavor))
        if fixed is None:
            fixed = self._fixed[(tenant, flavor)] = (
                self.nominal(tenant, flavor), self.borrow_cap(tenant, flavor), (self.cohort_of(tenant), flavor),
                self.free_capacity(flavor), self.keep.get((tenant, flavor), 0))
        return fixed

    def borrowed_flavors(self, tenant: str) -> frozenset[str | None]:
        """Flavors the tenant uses beyond its nominal quota: kept by add() as usage crosses a nominal
        quota, not worked out from every flavor it used (the preemption search asks per tenant and attempt)."""
        found = self._borrowed.get(tenant)
        if found is None:
            found = self._borrowed[tenant] = frozenset(self._borrowing.get(tenant, ()))
        return found

    def idle(self, flavor: str) -> int:
        """Devices of the flavor nobody uses (an upper bound where some are on unusable nodes)."""
        idle = self.unused.get(flavor, 0)
        return idle if idle > 0 else 0

    def free_capacity(self, flavor: str) -> int:
        """Devices of the flavor no tenant's nominal quota covers: anyone may borrow them."""
        return max(0, self.capacity.get(flavor, 0) - self.covered[flavor])

    def borrowable(self, tenant: str, flavor: str) -> int:
        """How many more devices of the flavor the tenant could take beyond its nominal quota: what is
        available to it (`_available`) less its nominal headroom. The cohort's pool holds the tenant's own
        lent, unused quota, which its headroom already counts: it is taken out, so a tenant never borrows
        its own quota (nor, through it, past another's lendingLimit)."""
        fixed = self._fixed_of(tenant, flavor)
        used = self.used[(tenant, flavor)]
        nominal = fixed[0]
        left = self._available(fixed, flavor, used, tenant) - (nominal - used if nominal > used else 0)
        return left if left > 0 else 0

    def _available(self, fixed: tuple[int, int, tuple[str, str], int, int], flavor: str, used: int,
                   tenant: str) -> int:
        """Devices of the flavor the tenant may take now, its borrowingLimit aside (Kueue's `available`):
        the part of its nominal it keeps (never lends) and does not use, what its cohort lends that nobody
        uses, and the free capacity no cohort has spilled into.

        Its nominal headroom is not all of it: what it lends sits in the cohort's pool, and while
        cohort-mates borrow it, it is theirs. The tenant takes it back by reclaim (preemption of the
        borrowers), never by being admitted beside them: then its cohort would hold more than its
        members' nominal quota, on devices of the free capacity or of another cohort's idle quota."""
        _, _, cohort, free, keep = fixed
        if self.nested:
            return self._available_tree(tenant, flavor, free) + (keep - used if keep > used else 0)
        lent, spare = self.lends[cohort] - self.spill[cohort], free - self.over[flavor]
        return (lent if lent > 0 else 0) + (spare if spare > 0 else 0) + (keep - used if keep > used else 0)

    def _available_tree(self, tenant: str, flavor: str, free: int,
                        binds: list[tuple[str, int, int, int, int]] | None = None) -> int:
        """What the tenant's cohort makes available to it (Kueue's `available`, top down): the free
        capacity no top cohort spilled into, then per cohort what it draws from its parent, capped by its
        borrowingLimit (what it lends up plus its limit, less what it draws already), plus the part of
        its pool it keeps that its subtree does not use. With `binds`, each cohort whose borrowingLimit
        bound is noted, top first: (cohort, borrowingLimit, what it may still draw, what it lends up, what
        it draws), for reasons."""
        spare = free - self.over[flavor]
        available = spare if spare > 0 else 0
        path = self.path_of(tenant)
        for at in range(len(path) - 1, -1, -1):
            node = (path[at], flavor)
            pool, up = self.lends[node], self.lent_up.get(node, 0)
            local, usage = pool - up, self.spill[node]
            cap = self.cohort_caps.get(node)
            if cap is not None:
                draws = usage - local if usage > local else 0
                most = up - draws + cap
                if most < 0:
                    most = 0
                if available > most:
                    if binds is not None:
                        binds.append((path[at], cap, most, up, draws))
                    available = most
            available += local - usage if local > usage else 0
        return available

    def check(self, tenant: str, deltas: Mapping[str, int]) -> list[Block]:
        """Blocking quotas if the tenant took `deltas` more devices per flavor; [] when it may."""
        if not self.config.enforced:
            return []
        blocks = []
        for flavor, delta in sorted(deltas.items()):
            if delta <= 0:
                continue
            used = self.used[(tenant, flavor)]
            fixed = self._fixed_of(tenant, flavor)
            nominal, cap = fixed[0], fixed[1]
            cohort_limit = None
            borrow = used + delta - nominal
            if borrow > cap:
                why = (f"{tenant} would borrow {borrow} {flavor} beyond its nominal {nominal}, over its "
                       f"borrowingLimit of {cap}")
            else:
                # within its nominal quota too: what it lends may be borrowed (see _available)
                available = self._available(fixed, flavor, used, tenant)
                if delta <= available:
                    continue
                headroom = nominal - used if nominal > used else 0
                lent_out = headroom - available if headroom > available else 0
                if self.nested:
                    why, cohort_limit = self._tree_reason(tenant, flavor, delta, used, nominal, available, fixed[3])
                elif borrow <= 0:
                    why = (f"{tenant} is within its nominal {nominal} {flavor} (in use {used}), but its cohort "
                           f"borrows {lent_out} of the quota it lends: only {available} more are free to it "
                           f"until they are given back")
                else:
                    why = (f"{tenant} needs to borrow {borrow - max(0, used - nominal)} more {flavor} (nominal "
                           f"{nominal}, in use {used}), but its cohort and the free capacity lend only "
                           f"{available - headroom if available > headroom else 0} more"
                           + (f", and its cohort borrows {lent_out} of the quota it lends" if lent_out else ""))
            room = self.borrowable(tenant, flavor)
            limit = self.config.tenant(tenant).limit(flavor)
            borrowed_by = {m: b for m in self.members[self.cohort_of(tenant)]
                           if m != tenant and (b := self.borrowing(m, flavor))}
            if self.nested and not borrowed_by:  # none in its cohort: the nearest in the tree, by distance
                top = self.top_of(tenant)
                borrowed_by = {m: self.borrowing(m, flavor) for m in sorted(
                    (m for m in self.borrowers[flavor] if m != tenant and self.top_of(m) == top),
                    key=lambda m: (self.distance(tenant, m), m))}
            blocks.append(Block(flavor, delta, nominal, used, limit.borrowing_limit if limit else None, room,
                                borrowed_by, why, cohort_limit))
        return blocks

    def _tree_reason(self, tenant: str, flavor: str, delta: int, used: int, nominal: int, available: int,
                     free: int) -> tuple[str, tuple[str, int, int] | None]:
        """Why the tree keeps `delta` more of the flavor from the tenant, naming the cohorts whose limits
        or pools bind, nearest first, with the numbers; and the nearest cohort whose borrowingLimit binds,
        with its limit and the limit that would let the claim in."""
        binds: list[tuple[str, int, int, int, int]] = []
        self._available_tree(tenant, flavor, free, binds)
        said = []
        for cohort, cap, most, up, draws in reversed(binds):
            parent = self.parent.get(cohort)
            above = f"cohort {parent}" if parent else "the free capacity"
            lends = f"it lends {above} {up} and " if up else ""
            said.append(f"cohort {cohort} may draw only {most} more from {above} ({lends}its borrowingLimit is "
                        f"{cap}; its subtree draws {draws})")
        if not said:
            for cohort in self.path_of(tenant):
                node = (cohort, flavor)
                if self.lends[node]:
                    said.append(f"cohort {cohort} has {max(0, self.lends[node] - self.spill[node])} of its pool "
                                f"of {self.lends[node]} free")
        spare = max(0, free - self.over[flavor])
        why = (f"{tenant} needs {delta} more {flavor} (nominal {nominal}, in use {used}), but its cohort tree "
               f"lets it take only {available} more: " + "; ".join(said + [f"the free capacity has {spare}"]))
        nearest = binds[-1] if binds else None
        return why, (nearest[0], nearest[1], nearest[1] + delta - available) if nearest is not None else None

    def distance(self, tenant: str, other: str) -> int:
        """Borrowing distance (kueue PR#4806): cohort edges from the tenant's cohort up to the nearest
        cohort it shares with `other` (0: the same cohort); a tenant of another tree is farthest."""
        mine = self.path_of(tenant)
        theirs = set(self.path_of(other))
        return next((at for at, cohort in enumerate(mine) if cohort in theirs), len(mine))

    def guaranteed_room(self, tenant: str, flavor: str, levels: int) -> int:
        """Devices of the flavor the tenant may take while the node `levels` up its path (0: the tenant
        itself, k: its k-th cohort) stays within its own and its descendants' nominal quota, borrowing
        nothing from above: what reclaim may take back for it from borrowers whose nearest shared cohort
        is `levels` up (0: its own nominal headroom, as in flat cohorts)."""
        used, nominal = self.used[(tenant, flavor)], self.nominal(tenant, flavor)
        if levels <= 0:
            return nominal - used if nominal > used else 0
        keep = self.keep.get((tenant, flavor), 0)
        absorbed = keep - used if keep > used else 0  # taken within what it keeps: no cohort sees it
        path = self.path_of(tenant)
        for cohort in path[:levels - 1]:
            node = (cohort, flavor)
            local, usage = self.lends[node] - self.lent_up.get(node, 0), self.spill[node]
            absorbed += local - usage if local > usage else 0
        node = (path[levels - 1], flavor)
        pool, usage = self.lends[node], self.spill[node]
        return absorbed + (pool - usage if pool > usage else 0)

    def side_borrows(self, tenant: str, flavor: str, levels: int) -> bool:
        """Whether the node `levels` up the tenant's path (0: the tenant) holds more of the flavor than its
        own and its descendants' nominal: it borrows from the cohort above it, so reclaim may take back."""
        if levels <= 0:
            return self.used[(tenant, flavor)] > self.nominal(tenant, flavor)
        node = (self.path_of(tenant)[levels - 1], flavor)
        return self.spill[node] > self.lends[node]

    def reclaim_flavors(self, tenant: str) -> frozenset[str]:
        """Flavors in which the tenant could reclaim at some level of its tree: its own nominal headroom,
        or room within the nominal quota of one of its cohorts (`headroom_flavors` when cohorts do not nest)."""
        if not self.nested:
            return self.headroom_flavors(tenant)
        flavors = set(self.config.tenant(tenant).quotas)
        for cohort in self.path_of(tenant):
            flavors.update(self.pool_flavors.get(cohort, ()))
        levels = range(len(self.path_of(tenant)))
        return frozenset(f for f in flavors if any(self.guaranteed_room(tenant, f, k) > 0 for k in levels))

    def headroom_flavors(self, tenant: str) -> frozenset[str]:
        """Flavors where the tenant still has nominal quota."""
        limits = self.config.tenant(tenant).quotas
        return frozenset(f for f, limit in limits.items() if self.used[(tenant, f)] < limit.nominal)
