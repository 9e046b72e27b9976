"""Flavors: every device counts against the first flavor whose selector accepts it; the capacity per flavor.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from shared.admission.model import Snapshot
from shared.admission.quota import Flavor
from shared.dra.cel import CompiledSelector, SelectorError, compile_selector
from shared.dra.inventory import Fleet, FleetDevice
from shared.dra.matching import SelectorMemo


class Flavors:
    """Which flavor a device counts against, memoised per kind of device (the selectors are CEL)."""

    def __init__(self, flavors: Sequence[Flavor], memo: SelectorMemo) -> None:
        self.memo = memo
        self.compiled: list[tuple[Flavor, CompiledSelector]] = []
        for flavor in flavors:
            try:
                self.compiled.append((flavor, compile_selector(flavor.selector)))
            except SelectorError:
                continue  # the admin API refuses such flavors; an old one never matches
        self._by_profile: dict[int, Flavor | None] = {}

    def of(self, device: FleetDevice) -> Flavor | None:
        found = self._by_profile.get(device.profile_id, False)
        if found is False:
            found = None
            for flavor, selector in self.compiled:
                try:
                    if self.memo.matches(selector, device):
                        found = flavor
                        break
                except SelectorError:
                    continue
            self._by_profile[device.profile_id] = found
        return found  # type: ignore[return-value]

    def name_of(self, device: FleetDevice) -> str | None:
        flavor = self.of(device)
        return flavor.name if flavor else None

    def units_of(self, device: FleetDevice) -> float:
        flavor = self.of(device)
        return flavor.value if flavor else 0.0


def flavor_deltas(devices: Iterable[FleetDevice], flavors: Flavors) -> dict[str, int]:
    out: dict[str, int] = defaultdict(int)
    for d in devices:
        name = flavors.name_of(d)
        if name is not None:
            out[name] += 1
    return dict(out)


@dataclass
class FleetFlavors:
    """Each device's flavor and the devices per flavor, for one fleet and one list of flavors."""

    fleet: Fleet
    defined: tuple[Flavor, ...]
    flavors: Flavors
    capacity: dict[str, int]


def fleet_flavors(snapshot: Snapshot, known: FleetFlavors | None, memo: SelectorMemo) -> FleetFlavors:
    """Each device's flavor and the devices per flavor: `known` while the fleet and the flavors stay the same."""
    if known is not None and known.fleet is snapshot.fleet and known.defined == snapshot.quotas.flavors:
        return known
    flavors = Flavors(snapshot.quotas.flavors, memo)
    capacity: dict[str, int] = defaultdict(int)
    for device in snapshot.fleet.devices:
        name = flavors.name_of(device)
        if name is not None:
            capacity[name] += 1
    return FleetFlavors(snapshot.fleet, snapshot.quotas.flavors, flavors, dict(capacity))
