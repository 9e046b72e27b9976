"""What a caller of `run_cycle` keeps from one cycle to the next, so a cycle costs what changed: the
selector results, the fleet's state, the admission state and the flavors of the fleet's devices."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from shared.dra.allocation import FleetState
from shared.dra.matching import SelectorMemo

if TYPE_CHECKING:  # the state and flavor modules use this one
    from shared.admission.flavors import Flavors
    from shared.admission.quota import Flavor
    from shared.admission.state import AdmissionState
    from shared.dra.inventory import Fleet


@dataclass
class KeptFlavors:
    """Each device's flavor and the devices per flavor, for one fleet and one list of flavors."""

    fleet: Fleet
    defined: tuple[Flavor, ...]
    flavors: Flavors
    capacity: dict[str, int]


@dataclass
class KeptState:
    memo: SelectorMemo = field(default_factory=SelectorMemo)
    fleet: FleetState | None = None  # the last cycle's, brought up to date when the fleet is the same
    admission: AdmissionState | None = None
    flavors: KeptFlavors | None = None

    def forget_cycle(self) -> None:
        """After a claim's fault: the next cycle builds its states anew, as a first one would."""
        self.admission = self.fleet = None
