"""The quota invariants users rely on (contract, Quotas), checked on what runs: a plain, pure function
that tests and benchmarks call after every cycle. It recounts from the fleet, the quotas and the
running claims alone, sharing no arithmetic with the admission cycle's QuotaBook, so a wrong book cannot
vouch for itself.

- No device is held twice, and no shared counter (a MIG-capable GPU's slices) is drawn beyond its
  capacity: a whole GPU and its partitions exclude each other.
- A tenant never holds more of a flavor than its nominal plus its borrowingLimit.
- A cohort never holds more of a flavor than its members' nominal plus the free capacity it uses, and
  all cohorts together use no more free capacity than there is (the devices of the flavor beyond the
  sum of every tenant's nominal quota over the whole fleet). A tenant without a cohort is a cohort of
  its own; a tenant without quotas has a nominal of 0.
- lendingLimit: the part of a tenant's nominal it does not lend is used by nobody else, so what the
  members of a cohort use beyond the parts they keep fits in what they lend plus their share of the
  free capacity (Kueue's arithmetic, flat cohorts).
- Nested cohorts (Kueue KEP-79): per node x and flavor, T(x) = nominal(x) - used(x) for a tenant and
  T(x) = nominal(x) + sum over children c of min(lendingLimit(c), T(c)) for a cohort; T(x) is at least
  -borrowingLimit(x) at every node that has one, and the fleet's free capacity covers what the top
  cohorts (which lend each other nothing) draw: free + sum of min(0, T(top)) >= 0. And a subtree never
  holds more than its own and its descendants' nominal plus its borrowingLimit.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from fractions import Fraction

from shared.admission.flavors import Flavors
from shared.admission.model import Running
from shared.admission.quota import QuotaConfig
from shared.dra.inventory import Fleet
from shared.dra.matching import SelectorMemo


def violations(fleet: Fleet, quotas: QuotaConfig, running: Iterable[Running],
               flavors: Flavors | None = None) -> list[str]:
    """Every broken invariant, one sentence each ([] when all hold). `flavors` may be passed to reuse
    its memo of which flavor each kind of device counts against (it must be of `quotas.flavors`)."""
    flavors = flavors or Flavors(quotas.flavors, SelectorMemo())
    by_key = fleet.by_key
    out: list[str] = []
    holder: dict[tuple[str, str, str], str] = {}
    used: Counter[tuple[str, str]] = Counter()  # tenant, flavor
    drawn: dict[tuple[str, str, str, str], int | Fraction] = defaultdict(int)
    for claim in running:
        for key in claim.allocation.keys:
            who = f"{claim.tenant}/{claim.name}"
            if key in holder:
                out.append(f"device {'/'.join(key)} is held by {holder[key]} and {who}")
            holder[key] = who
            device = by_key.get(key)
            if device is None:
                continue
            for counter, amount in device.counter_draws:
                drawn[counter] += amount
            name = flavors.name_of(device)
            if name is not None:
                used[(claim.tenant, name)] += 1
    if drawn:
        capacity_of = {k: q.value for inv in fleet.nodes.values() for k, q in inv.counters.items()}
        for counter, amount in sorted(drawn.items()):
            if counter in capacity_of and amount > capacity_of[counter]:
                out.append(f"counter {'/'.join(counter)} is drawn {amount} of {capacity_of[counter]}")
    if not quotas.enforced:
        return out
    if quotas.nested:
        return out + tree_violations(quotas, used, Counter(flavors.name_of(d) for d in fleet.devices))
    capacity = Counter(flavors.name_of(d) for d in fleet.devices)
    covered: Counter[str] = Counter()
    for quota in quotas.tenants.values():
        for flavor, quota_limit in quota.quotas.items():
            covered[flavor] += quota_limit.nominal
    held: Counter[tuple[str, str]] = Counter()  # cohort, flavor
    nominal: Counter[tuple[str, str]] = Counter()
    lends: Counter[tuple[str, str]] = Counter()
    beyond_kept: Counter[tuple[str, str]] = Counter()
    for quota in quotas.tenants.values():  # every quota counts towards its cohort, used or not
        cohort = quota.cohort or f"tenant:{quota.name}"
        for flavor, quota_limit in quota.quotas.items():
            nominal[(cohort, flavor)] += quota_limit.nominal
            lending = quota_limit.lending_limit
            lends[(cohort, flavor)] += quota_limit.nominal if lending is None else min(lending, quota_limit.nominal)
    for (tenant, flavor), n in sorted(used.items()):
        config = quotas.tenant(tenant)
        limit = config.limit(flavor)
        own = limit.nominal if limit else 0
        if limit is not None and limit.borrowing_limit is not None and n > own + limit.borrowing_limit:
            out.append(f"tenant {tenant} holds {n} {flavor}, over its nominal {own} plus its borrowingLimit "
                       f"{limit.borrowing_limit}")
        cohort = config.cohort or f"tenant:{tenant}"
        held[(cohort, flavor)] += n
        keep = 0 if limit is None else own - (own if limit.lending_limit is None else min(limit.lending_limit, own))
        beyond_kept[(cohort, flavor)] += max(0, n - keep)
    free_used: Counter[str] = Counter()
    lent_over: Counter[str] = Counter()
    for (cohort, flavor), n in sorted(held.items()):
        free = max(0, capacity[flavor] - covered[flavor])
        base = nominal[(cohort, flavor)]
        if n > base + free:
            out.append(f"cohort {cohort} holds {n} {flavor}, over its members' nominal {base} plus the free "
                       f"capacity {free}")
        free_used[flavor] += max(0, n - base)
        lent_over[flavor] += max(0, beyond_kept[(cohort, flavor)] - lends[(cohort, flavor)])
    for flavor in sorted(free_used):
        free = max(0, capacity[flavor] - covered[flavor])
        if free_used[flavor] > free:
            out.append(f"cohorts use {free_used[flavor]} {flavor} beyond their nominal, over the free capacity {free}")
        elif lent_over[flavor] > free:
            out.append(f"cohorts use {lent_over[flavor]} {flavor} beyond what their members keep and lend "
                       f"(lendingLimit), over the free capacity {free}")
    return out


def tree_violations(quotas: QuotaConfig, used: Mapping[tuple[str, str], int],
                    capacity: Mapping[str | None, int]) -> list[str]:
    """The nested-cohort invariants (KEP-79's T), recounted from the quotas and what each tenant holds."""
    out: list[str] = []
    infinite = 1 << 40
    parent: dict[str, str | None] = {}  # cohort -> parent; a tenant without a cohort sits in one of its own
    tenants_of: dict[str, list[str]] = defaultdict(list)
    for cohort in quotas.cohorts:
        parent[cohort] = quotas.cohort(cohort).parent
    for quota in quotas.tenants.values():
        home = quota.cohort or f"tenant:{quota.name}"
        parent.setdefault(home, None)
        tenants_of[home].append(quota.name)
    for name, _ in used:
        if name not in quotas.tenants:
            parent.setdefault(f"tenant:{name}", None)
            if name not in tenants_of[f"tenant:{name}"]:
                tenants_of[f"tenant:{name}"].append(name)
    children: dict[str, list[str]] = defaultdict(list)
    for cohort, up in parent.items():
        if up is not None:
            children[up].append(cohort)
    flavors = {f for _, f in used} | {f for t in quotas.tenants.values() for f in t.quotas} | {
        f for c in quotas.cohort_tree.values() for f in c.quotas}
    for flavor in sorted(flavors):
        covered = sum(t.quotas[flavor].nominal for t in quotas.tenants.values() if flavor in t.quotas) + sum(
            c.quotas[flavor].nominal for c in quotas.cohort_tree.values() if flavor in c.quotas)
        free = max(0, capacity.get(flavor, 0) - covered)

        def node(cohort: str, flavor: str = flavor) -> tuple[int, int, int]:
            """T, the subtree's nominal and what the subtree holds, checking the subtree's nodes on the way."""
            own = quotas.cohort(cohort).limit(flavor)
            t_value = nominal = own.nominal if own else 0
            held = 0
            for tenant in tenants_of.get(cohort, ()):
                limit = quotas.tenant(tenant).limit(flavor)
                n = used.get((tenant, flavor), 0)
                tenant_t = (limit.nominal if limit else 0) - n
                if limit is not None and limit.borrowing_limit is not None and tenant_t < -limit.borrowing_limit:
                    out.append(f"tenant {tenant} holds {n} {flavor}, over its nominal {limit.nominal} plus its "
                               f"borrowingLimit {limit.borrowing_limit}")
                lend = limit.lending_limit if limit is not None and limit.lending_limit is not None else infinite
                t_value += min(lend, tenant_t)
                nominal += limit.nominal if limit else 0
                held += n
            for child in children.get(cohort, ()):
                child_t, child_nominal, child_held = node(child)
                limit = quotas.cohort(child).limit(flavor)
                lend = limit.lending_limit if limit is not None and limit.lending_limit is not None else infinite
                t_value += min(lend, child_t)
                nominal += child_nominal
                held += child_held
            if own is not None and own.borrowing_limit is not None:
                if t_value < -own.borrowing_limit:
                    out.append(f"cohort {cohort}: T({flavor}) = {t_value}, below minus its borrowingLimit "
                               f"{own.borrowing_limit} (KEP-79)")
                if held > nominal + own.borrowing_limit:
                    out.append(f"cohort {cohort}'s subtree holds {held} {flavor}, over its nominal {nominal} "
                               f"plus its borrowingLimit {own.borrowing_limit}")
            return t_value, nominal, held

        drawn = 0
        for cohort in sorted(c for c, up in parent.items() if up is None):
            top_t, _, _ = node(cohort)
            drawn += max(0, -top_t)
        if drawn > free:
            out.append(f"top cohorts draw {drawn} {flavor} beyond their subtrees' quota, over the free capacity "
                       f"{free}")
    return out


def held_per_flavor(fleet: Fleet, running: Iterable[Running], flavors: Flavors) -> dict[str, dict[str, int]]:
    """Devices held per tenant and flavor: what the messages above count, for a test's own assertions."""
    out: dict[str, dict[str, int]] = defaultdict(dict)
    for claim in running:
        for key in claim.allocation.keys:
            device = fleet.by_key.get(key)
            name = flavors.name_of(device) if device is not None else None
            if name is not None:
                out[claim.tenant][name] = out[claim.tenant].get(name, 0) + 1
    return dict(out)
