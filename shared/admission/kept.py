"""What a caller of `run_cycle` keeps from one cycle to the next, so a cycle costs what changed: the
selector results, the fleet's state, the admission state and the flavors of the fleet's devices."""

from __future__ import annotations

from dataclasses import dataclass, field

from shared.admission.flavors import FleetFlavors, fleet_flavors
from shared.admission.model import Snapshot
from shared.admission.state import AdmissionState
from shared.dra.allocation import FleetState
from shared.dra.matching import SelectorMemo


@dataclass
class KeptState:
    memo: SelectorMemo = field(default_factory=SelectorMemo)
    fleet: FleetState | None = None  # the last cycle's, brought up to date when the fleet is the same
    admission: AdmissionState | None = None
    flavors: FleetFlavors | None = None

    def forget_cycle(self) -> None:
        """After a claim's fault: the next cycle builds its states anew, as a first one would."""
        self.admission = self.fleet = None

    def admission_for(self, snapshot: Snapshot) -> AdmissionState:
        """The kept admission state brought up to date for `snapshot`, or a new one."""
        if self.admission is None or not self.admission.fits(snapshot, self.fleet):
            known = self.flavors = fleet_flavors(snapshot, self.flavors, self.memo)
            self.admission = AdmissionState(snapshot, self.memo, known.flavors, known.capacity,
                                            self._fleet_state(snapshot))
        self.admission.begin(snapshot)
        return self.admission

    def _fleet_state(self, snapshot: Snapshot) -> FleetState:
        """The last cycle's fleet state when the fleet, classes and unusable nodes are the same objects and
        values (the admission state takes what runs); otherwise a new one. Derived data only: placements by
        the same rules as a new state's, without rebuilding every index each cycle (where two nodes score
        the same, which one comes first may differ: it follows the order they last changed in)."""
        last = self.fleet
        if (last is not None and last.fleet is snapshot.fleet and last.classes is snapshot.classes
                and last.unusable_nodes == dict(snapshot.unusable_nodes)):
            last.sync(())
            return last
        self.fleet = FleetState(snapshot.fleet, snapshot.classes, (), memo=self.memo,
                                unusable_nodes=snapshot.unusable_nodes)
        return self.fleet
