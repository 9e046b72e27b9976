"""Where one variant of a claim (a choice of firstAvailable alternatives) fits now, best-fit.

A request alone, with at most one matchAttribute, is placed from its index: the best group with room is the
answer (shared/dra/fleet_index.py). Anything else (several requests, All mode, adminAccess,
distinctAttribute) is searched node by node in the first request's preference order (shared/dra/search.py),
where the sweep has not found the node without room since its last release (shared/dra/sweep.py). MIG
partitions go where they leave the most other partitions possible.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from shared.dra.budget import STEP, Meter, PieceTooLarge
from shared.dra.fleet_index import IN_USE, DeviceIndex, Group
from shared.dra.inventory import CounterKey, FleetDevice
from shared.dra.occupancy import Occupancy
from shared.dra.plan import Alternative, Plan
from shared.dra.results import Amount
from shared.dra.search import Constraints, NodeCounters, search_node
from shared.dra.sweep import Sweep

Placed = tuple[str, list[tuple[str, FleetDevice]]]  # the node, and the devices by result name


def place(occupancy: Occupancy, meter: Meter, plan: Plan, number: int, variant: Sequence[Alternative],
          indexes: list[DeviceIndex], sweep: Sweep) -> Placed | None:
    """Variant `number` of the plan placed on the fleet as `occupancy` has it, or None when it has no room."""
    grouping = plan.group_attribute(variant)
    if grouping is None or isinstance(grouping, str):
        if sweep.swept_at.get(number, -1) >= occupancy.clock:
            return None  # it found no room, and nothing was freed anywhere since
        found = _place_simple(occupancy, meter, variant[0], indexes[0], plan)
        if found is None:
            sweep.finished(number, occupancy.clock)
            meter.progressed()
        return found
    return _place_searching(occupancy, meter, plan, number, variant, indexes, sweep)


def _place_simple(occupancy: Occupancy, meter: Meter, alternative: Alternative, index: DeviceIndex, plan: Plan
                  ) -> Placed | None:
    """One ExactCount request, at most one matchAttribute: the best group with room is the answer,
    unless shared counters make its free devices exclude each other."""
    wanted = alternative.body.wanted
    for group in index.best_groups(wanted):
        meter.spend(STEP)
        picked = _pick(occupancy, meter, group, wanted, alternative, plan)
        if picked is not None:
            return group.node, [(alternative.result_name, d) for d in picked]
    return None


def _pick(occupancy: Occupancy, meter: Meter, group: Group, wanted: int, alternative: Alternative, plan: Plan
          ) -> list[FleetDevice] | None:
    left = occupancy.counters.get(group.node)
    if left is None or not any(d.counter_draws for d in group.free):
        return group.free[:wanted]
    counters = NodeCounters(dict(left))
    candidates = _partition_order(occupancy, group.node, group.free, counters)
    found = search_node([alternative], {alternative.result_name: candidates},
                        Constraints(plan.constraints), counters, meter)
    return [d for _, d in found] if found is not None else None


def _partition_order(occupancy: Occupancy, node: str, free: list[FleetDevice], counters: NodeCounters
                     ) -> list[FleetDevice]:
    """Among equally good fits, the partition that leaves the most other partitions possible first:
    a 1g slice goes where it does not break the 4g and 3g placements (NVIDIA's slot geometry, read
    from the counters, not hard-coded)."""
    best = free[0].fit_rank
    ties = [d for d in free if d.fit_rank == best]
    if len(ties) < 2 or not ties[0].counter_draws:
        return free
    scored = sorted(ties, key=lambda d: (-_room_left(occupancy, node, d, counters.left), d.name))
    return scored + [d for d in free if d.fit_rank != best]


def _room_left(occupancy: Occupancy, node: str, device: FleetDevice, left: Mapping[CounterKey, Amount]) -> int:
    """How much partitioning stays possible beside `device`: the placements still open, weighted by
    their size in slot counters (counters of capacity one, like NVIDIA's memory slices)."""
    slots = {key for key, amount in device.counter_draws if amount == 1}
    score = 0
    in_use = occupancy.in_use
    for peer in occupancy.peers(node, device):
        if peer.key in in_use or peer is device:
            continue
        peer_slots = [key for key, amount in peer.counter_draws if amount == 1]
        if all(left.get(key, 0) >= 1 and key not in slots for key in peer_slots):
            score += len(peer_slots) ** 2
    return score


def _place_searching(occupancy: Occupancy, meter: Meter, plan: Plan, number: int, variant: Sequence[Alternative],
                     indexes: list[DeviceIndex], sweep: Sweep) -> Placed | None:
    """The general case: several requests, All mode, adminAccess or distinctAttribute. Nodes come in
    the first request's preference order; each node is searched on its own, and only where the sweep
    has not found it without room since its last release."""
    lead = next((i for i, a in enumerate(variant) if not a.admin_access), None)
    if lead is None:
        nodes: Iterable[str] = sorted(set.intersection(*(set(ix.node_names()) for ix in indexes)))
    else:
        nodes = (g.node for g in indexes[lead].best_groups(variant[lead].wanted))
    constraints = Constraints(plan.constraints)
    freed_at, unavailable = occupancy.freed_at, occupancy.unavailable
    searched = False
    for node in nodes:
        if sweep.skips(number, node, freed_at.get(node, 0)):
            continue
        meter.spend(STEP)
        searched = True
        candidates: dict[str, list[FleetDevice]] = {}
        for alternative, index in zip(variant, indexes, strict=True):
            if alternative.admin_access:
                here = [d for d in index.devices_on(node) if unavailable(d) in (None, IN_USE)]
            else:
                here = index.free_on(node)
                if alternative.all_mode and len(here) != len(index.devices_on(node)):
                    here = []  # All needs every matching device of the node, none of them in use
            if len(here) < alternative.wanted:
                break
            candidates[alternative.result_name] = here
        else:
            counters = NodeCounters(dict(occupancy.counters.get(node, {})))
            try:
                found = search_node(variant, candidates, constraints, counters, meter)
            except PieceTooLarge:  # its combinations have no end: it counts as having no room
                sweep.given_up.add(node)
                found = None
            if found is not None:
                return node, found
        sweep.searched(number, node, occupancy.clock)
        meter.progressed()
    sweep.finished(number, occupancy.clock)
    if searched:
        meter.progressed()
    return None
