"""What of the fleet is taken during a decision cycle: the devices in use, how many per node, what is left
of each node's shared counters (MIG), and the free clock that counts releases (shared/dra/sweep.py).

An index (shared/dra/fleet_index.py) asks it whether a device can be given now (`unavailable`), whether a
node is untouched (`idle`) and where a device that is not free can only be in use (`only_use`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from shared.dra.fleet_index import IN_USE
from shared.dra.inventory import UNHEALTHY, CounterKey, Fleet, FleetDevice
from shared.dra.quantity import exact
from shared.dra.results import Amount, DeviceKey
from shared.dra.search import counters_fit


class Occupancy:
    """The devices taken from a fleet, kept current by `take`, `give_back` and `sync`."""

    def __init__(self, fleet: Fleet, unusable_nodes: Mapping[str, str], in_use: Iterable[DeviceKey]) -> None:
        self.fleet = fleet
        self.unusable_nodes = dict(unusable_nodes)  # node -> why (stale inventory)
        self.in_use: set[DeviceKey] = set()
        self.usage: dict[str, int] = {}  # node -> devices of it in use
        self.counters: dict[str, dict[CounterKey, Amount]] = {}  # node -> what is left of its shared counters
        self.clock = 0  # counts releases: a node's last one is freed_at[node]
        self.freed_at: dict[str, int] = {}
        self._counter_fit: dict[DeviceKey, bool] = {}  # per device, dropped when its counter set changes
        self._counter_peers: dict[tuple[str, tuple[str, str, str]], list[FleetDevice]] = {}
        for node in fleet.nodes.values():
            if node.counters:
                self.counters[node.node] = {k: exact(q.value) for k, q in node.counters.items()}
        by_key = fleet.by_key
        for key in in_use:
            device = by_key.get(key)
            if device is not None:
                self._mark(device, taken=True)

    def idle(self, node: str) -> bool:
        """Nothing on the node is in use and it may be used: every healthy device of it is free."""
        return not self.usage.get(node) and node not in self.unusable_nodes

    def only_use(self, node: str) -> bool:
        """Whether an accepted device of the node that is not free can only be in use: no shared counters
        on it and its inventory is current (health is judged when an index is built)."""
        return node not in self.counters and node not in self.unusable_nodes

    def unavailable(self, device: FleetDevice) -> str | None:
        """Why an accepted device cannot be given now, or None when it can."""
        if device.key in self.in_use:
            return IN_USE
        if device.node in self.unusable_nodes:
            return "stale inventory"
        if device.health == UNHEALTHY:
            return "unhealthy"
        if device.counter_draws:
            fits = self._counter_fit.get(device.key)
            if fits is None:
                left = self.counters.get(device.node, {})
                fits = self._counter_fit[device.key] = counters_fit(left, device)
            if not fits:
                return "shared counters"
        return None

    def take(self, keys: Iterable[DeviceKey]) -> None:
        by_key = self.fleet.by_key
        for key in keys:
            device = by_key.get(key)
            if device is not None and key not in self.in_use:
                self._mark(device, taken=True)

    def give_back(self, keys: Iterable[DeviceKey]) -> None:
        by_key = self.fleet.by_key
        for key in keys:
            device = by_key.get(key)
            if device is not None and key in self.in_use:
                self._mark(device, taken=False)

    def sync(self, in_use: Iterable[DeviceKey]) -> set[str]:
        """Make what is taken equal `in_use`, touching only what differs; returns the nodes that changed."""
        wanted = set(in_use) & self.fleet.by_key.keys()
        by_key = self.fleet.by_key
        nodes = set()
        for key in sorted(self.in_use - wanted):
            self._mark(by_key[key], taken=False)
            nodes.add(by_key[key].node)
        for key in sorted(wanted - self.in_use):
            self._mark(by_key[key], taken=True)
            nodes.add(by_key[key].node)
        return nodes

    def _mark(self, device: FleetDevice, *, taken: bool) -> None:
        sign = 1 if taken else -1
        if taken:
            self.in_use.add(device.key)
        else:
            self.in_use.discard(device.key)
            self.clock += 1
            self.freed_at[device.node] = self.clock
        self.usage[device.node] = self.usage.get(device.node, 0) + sign
        left = self.counters.get(device.node)
        if left is not None and device.counter_draws:
            for key, amount in device.counter_draws:
                left[key] = left.get(key, 0) - sign * amount
            for peer in self.peers(device.node, device):  # their fit may have changed with the counters
                self._counter_fit.pop(peer.key, None)

    def peers(self, node: str, device: FleetDevice) -> list[FleetDevice]:
        """Devices of the node that draw on any counter set this device draws on."""
        peers: list[FleetDevice] = []
        for counter_set in {key[:3] for key, _ in device.counter_draws}:
            members = self._counter_peers.get((node, counter_set))
            if members is None:
                members = self._counter_peers[(node, counter_set)] = [
                    d for d in self.fleet.nodes[node].devices if any(k[:3] == counter_set for k, _ in d.counter_draws)]
            peers.extend(members)
        return peers
