"""Where a gang with `gang-topology: K` may go: the nodes per value of node label K (a clique, a rack), the
values ordered by what they have free for the gang, and a trial confined to one value's nodes.

A trial is confined by holding, for its length, the free devices of every other node (as the admission
pass holds what it admits), and giving them back after: the placement rules stay those of one claim.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence

from shared.admission.model import Waiting
from shared.dra.allocation import FleetState
from shared.dra.fleet_index import DeviceIndex
from shared.dra.inventory import Fleet
from shared.dra.results import Allocation, DeviceResult, Rejected

CONFINED = "gang-topology"  # the request name of what a confined trial holds (never given to a claim)
MAX_KEPT_INDEXES = 512  # indexes (with a label key) whose free devices per value are kept


class Domains:
    """The nodes per value of a node label, worked out once per fleet and key; and per index of devices,
    the free devices per value, worked out again only when the index's free devices changed."""

    def __init__(self) -> None:
        self._fleet: Fleet | None = None
        self._by_key: dict[str, dict[str, tuple[str, ...]]] = {}
        # per index and label key: the values with the index's nodes among theirs (fixed for the fleet), and
        # the free devices per value at the index's version they were counted at
        self._within: dict[tuple[int, int], tuple[DeviceIndex, Mapping[str, tuple[str, ...]],
                                                  tuple[tuple[str, tuple[str, ...]], ...]]] = {}
        self._free: dict[tuple[int, int], tuple[int, dict[str, int], tuple[str, ...]]] = {}

    def of(self, fleet: Fleet, key: str) -> Mapping[str, tuple[str, ...]]:
        if fleet is not self._fleet:
            self._fleet, self._by_key, self._within, self._free = fleet, {}, {}, {}
        found = self._by_key.get(key)
        if found is None:
            nodes: dict[str, list[str]] = defaultdict(list)
            for name in sorted(fleet.nodes):
                value = fleet.nodes[name].labels.get(key)
                if value is not None:
                    nodes[value].append(name)
            found = self._by_key[key] = {v: tuple(n) for v, n in sorted(nodes.items())}
        return found

    def free(self, placement: FleetState, member: Waiting, domains: Mapping[str, tuple[str, ...]]
             ) -> dict[str, int]:
        """Per label value of `domains` (as of() gave them), the free devices the member's first request
        accepts on its nodes. Counted over the nodes the index holds only (the others have none it
        accepts), and again only when the index's free devices changed: many gangs wait for one spec."""
        return self.free_ordered(placement, member, domains)[0]

    def free_ordered(self, placement: FleetState, member: Waiting, domains: Mapping[str, tuple[str, ...]]
                     ) -> tuple[dict[str, int], tuple[str, ...]]:
        """`free`, and its values as ordered_values() orders them, kept with the count: every gang of a
        spec tried in a cycle reads them while the index's free devices stay the same."""
        try:
            index = placement.index(placement.plan(member.claim).variants[0][0])
        except (Rejected, IndexError):
            free = dict.fromkeys(domains, 0)
            return free, tuple(ordered_values(free))
        at = (id(index), id(domains))
        within = self._within.get(at)
        if within is None or within[0] is not index or within[1] is not domains:
            if len(self._within) >= MAX_KEPT_INDEXES:  # indexes of specs gone are not kept alive for long
                self._within.clear()
                self._free.clear()
            held = index.nodes
            within = self._within[at] = (index, domains, tuple((v, tuple(n for n in nodes if n in held))
                                                               for v, nodes in domains.items()))
            self._free.pop(at, None)
        counted = self._free.get(at)
        if counted is not None and counted[0] == index.version:
            return counted[1], counted[2]
        count = index.free_count
        free = {value: sum(count(n) for n in nodes) for value, nodes in within[2]}
        ordered = tuple(ordered_values(free))
        self._free[at] = (index.version, free, ordered)  # read after counting: a node counted first may bump it
        return free, ordered


def free_per_value(placement: FleetState, member: Waiting, domains: Mapping[str, tuple[str, ...]]
                   ) -> dict[str, int]:
    """Per label value, the free devices the member's first request accepts on its nodes (uncached:
    Domains.free keeps them)."""
    try:
        index = placement.index(placement.plan(member.claim).variants[0][0])
    except (Rejected, IndexError):
        return dict.fromkeys(domains, 0)
    return {value: sum(len(index.free_on(n)) for n in nodes) for value, nodes in domains.items()}


def ordered_values(free: Mapping[str, int]) -> list[str]:
    """The values with the most free first (then by name: a fixed order)."""
    return sorted(free, key=lambda v: (-free[v], v))


def usable_nodes(placement: FleetState, members: Sequence[Waiting]) -> frozenset[str]:
    """The nodes with a device some request (or firstAvailable alternative) of some member accepts: the
    only ones a confined trial has to close."""
    nodes: set[str] = set()
    for member in members:
        try:
            requests = placement.plan(member.claim).requests
        except Rejected:
            continue
        for _, alternatives in requests:
            for alternative in alternatives:
                try:
                    nodes |= placement.index(alternative).nodes
                except Rejected:
                    continue
    return frozenset(nodes)


@contextlib.contextmanager
def confined(placement: FleetState, fleet: Fleet, nodes: Sequence[str], usable: frozenset[str]) -> Iterator[None]:
    """Placements made inside use only `nodes`: the free devices of every other node in `usable` (where the
    claims placed could go at all) are held meanwhile."""
    inside = set(nodes)
    in_use = placement.in_use
    held = []
    for name in sorted(usable):
        inventory = fleet.nodes.get(name)
        if name in inside or inventory is None:
            continue
        free = tuple(DeviceResult(CONFINED, d.driver, d.pool, d.name) for d in inventory.devices
                     if d.key not in in_use)
        if free:
            allocation = Allocation(name, free)
            placement.take(allocation)
            held.append(allocation)
    try:
        yield
    finally:
        for allocation in held:
            placement.give_back(allocation)
