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
        for tenant in config.tenants.values():
            cohort = self.cohort_of(tenant.name)
            self.members[cohort].append(tenant.name)
            for flavor, limit in tenant.quotas.items():
                lent = min(limit.lending_limit, limit.nominal) if limit.lending_limit is not None else limit.nominal
                self.keep[(tenant.name, flavor)] = limit.nominal - lent
                self.lends[(cohort, flavor)] += lent
                self.covered[flavor] += limit.nominal

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
        return self.units[tenant] / self.weight(tenant)

    def cohort_version(self, tenant: str) -> int:
        return self.cohort_versions[self.cohort_of(tenant)]

    def add(self, tenant: str, flavor: str | None, units: float, count: int = 1) -> None:
        """The tenant takes `count` more devices of the flavor (fewer, when negative), weighing `units`."""
        self.units[tenant] += units
        if flavor is None:
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
        available = self._available(fixed, flavor, used)
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
        left = self._available(fixed, flavor, used) - (nominal - used if nominal > used else 0)
        return left if left > 0 else 0

    def _available(self, fixed: tuple[int, int, tuple[str, str], int, int], flavor: str, used: int) -> int:
        """Devices of the flavor the tenant may take now, its borrowingLimit aside (Kueue's `available`):
        the part of its nominal it keeps (never lends) and does not use, what its cohort lends that nobody
        uses, and the free capacity no cohort has spilled into.

        Its nominal headroom is not all of it: what it lends sits in the cohort's pool, and while
        cohort-mates borrow it, it is theirs. The tenant takes it back by reclaim (preemption of the
        borrowers), never by being admitted beside them: then its cohort would hold more than its
        members' nominal quota, on devices of the free capacity or of another cohort's idle quota."""
        _, _, cohort, free, keep = fixed
        lent, spare = self.lends[cohort] - self.spill[cohort], free - self.over[flavor]
        return (lent if lent > 0 else 0) + (spare if spare > 0 else 0) + (keep - used if keep > used else 0)

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
            borrow = used + delta - nominal
            if borrow > cap:
                why = (f"{tenant} would borrow {borrow} {flavor} beyond its nominal {nominal}, over its "
                       f"borrowingLimit of {cap}")
            else:
                # within its nominal quota too: what it lends may be borrowed (see _available)
                available = self._available(fixed, flavor, used)
                if delta <= available:
                    continue
                headroom = nominal - used if nominal > used else 0
                lent_out = headroom - available if headroom > available else 0
                if borrow <= 0:
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
            blocks.append(Block(flavor, delta, nominal, used, limit.borrowing_limit if limit else None, room,
                                borrowed_by, why))
        return blocks

    def headroom_flavors(self, tenant: str) -> frozenset[str]:
        """Flavors where the tenant still has nominal quota."""
        limits = self.config.tenant(tenant).quotas
        return frozenset(f for f, limit in limits.items() if self.used[(tenant, f)] < limit.nominal)
