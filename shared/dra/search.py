"""The search for a claim of several requests on one node: combinations under its constraints and the
node's shared counters, each device tried charged to the decision's meter (shared/dra/budget.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from shared.dra import v1 as dra
from shared.dra.budget import Meter
from shared.dra.inventory import CounterKey, FleetDevice
from shared.dra.plan import Alternative
from shared.dra.results import Amount, DeviceKey


class Constraints:
    """Incremental check of a claim's constraints over the devices picked so far."""

    def __init__(self, constraints: Sequence[dra.DeviceConstraint]) -> None:
        self.constraints = constraints

    @staticmethod
    def _applies(constraint: dra.DeviceConstraint, result_name: str) -> bool:
        if not constraint.requests:
            return True
        parent = result_name.split("/", 1)[0]
        return result_name in constraint.requests or parent in constraint.requests

    def admits(self, chosen: Sequence[tuple[str, FleetDevice]], result_name: str, device: FleetDevice) -> bool:
        for constraint in self.constraints:
            if not self._applies(constraint, result_name):
                continue
            attribute = constraint.match_attribute or constraint.distinct_attribute or ""
            value = device.attribute_text(attribute)
            if value is None:
                return False
            others = [d.attribute_text(attribute) for name, d in chosen if self._applies(constraint, name)]
            if constraint.match_attribute and others and others[0] != value:
                return False
            if constraint.distinct_attribute and value in others:
                return False
        return True


def counters_fit(left: Mapping[CounterKey, Amount], device: FleetDevice) -> bool:
    """Every counter the device draws on has enough left (an unknown counter has none)."""
    return all(left.get(key, -1) >= amount for key, amount in device.counter_draws)


class NodeCounters:
    """Shared counters left on one node during a search: take and give back as devices are tried."""

    def __init__(self, left: dict[CounterKey, Amount]) -> None:
        self.left = left

    def fits(self, device: FleetDevice) -> bool:
        return counters_fit(self.left, device)

    def take(self, device: FleetDevice) -> None:
        for key, amount in device.counter_draws:
            self.left[key] = self.left.get(key, 0) - amount

    def give_back(self, device: FleetDevice) -> None:
        for key, amount in device.counter_draws:
            self.left[key] = self.left.get(key, 0) + amount


def search_node(
    variant: Sequence[Alternative],
    candidates: Mapping[str, list[FleetDevice]],
    constraints: Constraints,
    counters: NodeCounters,
    meter: Meter,
) -> list[tuple[str, FleetDevice]] | None:
    """Depth-first over the variant's requests on one node; combinations within a request, never
    permutations; a request with fewer candidates than it needs is pruned before trying anything."""
    chosen: list[tuple[str, FleetDevice]] = []
    taken: set[DeviceKey] = set()

    step = meter.spend

    def pick(index: int) -> bool:
        if index == len(variant):
            return True
        alternative = variant[index]
        pool = [d for d in candidates[alternative.result_name] if d.key not in taken]
        if alternative.all_mode:
            return choose_all(alternative, pool, index)
        if len(pool) < alternative.body.wanted:
            return False
        return choose(alternative, pool, 0, alternative.body.wanted, index)

    def add(name: str, device: FleetDevice) -> None:
        chosen.append((name, device))
        taken.add(device.key)
        counters.take(device)

    def remove() -> None:
        _, device = chosen.pop()
        taken.discard(device.key)
        counters.give_back(device)

    def choose_all(alternative: Alternative, pool: list[FleetDevice], index: int) -> bool:
        mark = len(chosen)
        for device in pool:
            step()
            if not (counters.fits(device) and constraints.admits(chosen, alternative.result_name, device)):
                break
            add(alternative.result_name, device)
        else:
            if pick(index + 1):
                return True
        while len(chosen) > mark:
            remove()
        return False

    def choose(alternative: Alternative, pool: list[FleetDevice], start: int, remaining: int, index: int) -> bool:
        if remaining == 0:
            return pick(index + 1)
        for i in range(start, len(pool) - remaining + 1):
            step()
            device = pool[i]
            if not counters.fits(device) or not constraints.admits(chosen, alternative.result_name, device):
                continue
            add(alternative.result_name, device)
            if choose(alternative, pool, i + 1, remaining - 1, index):
                return True
            remove()
        return False

    return list(chosen) if pick(0) else None
