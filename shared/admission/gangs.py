"""The waiting members of gangs (claims admitted all or nothing), by tenant and gang name, kept across
cycles, and what each gang is as a unit: its members that agree, those that disagree, whether it is
complete. A claim without a gang never reaches this module.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from functools import cached_property, lru_cache
from types import MappingProxyType
from typing import Any

from shared.admission.gang_topology import Domains
from shared.admission.model import ClaimKey, Waiting
from shared.contract.gang_reasons import rejected_note
from shared.dra.claims import GangSettings
from shared.dra.results import Allocation

GangKey = tuple[str, str]  # tenant, gang name
_DIGITS = re.compile(r"[0-9]+")
# A waiting gang's two clocks: since when it has been complete (its gang-topology-wait counts from it) and
# since when it has been first in its tenant's order (its gangReserveAfter counts from it); None: not running.
GangMark = tuple[float | None, float | None]


@dataclass(frozen=True)
class GangUnit:
    """A gang as the cycle decides it: its members that agree on its settings, in trial order."""

    key: GangKey
    settings: GangSettings
    members: tuple[Waiting, ...]

    @property
    def name(self) -> str:
        return self.key[1]

    @property
    def complete(self) -> bool:
        return len(self.members) == self.settings.size

    @cached_property
    def priority(self) -> int:
        """Its highest member's (a unit's members are fixed: worked out once)."""
        return max(m.priority for m in self.members)

    @cached_property
    def arrival(self) -> int:
        """When it became complete: its last member's arrival."""
        return max(m.arrival for m in self.members)


class WaitingGangs:
    """The gang members that wait, per gang, brought up to date with each snapshot by the admission state,
    and the last reason each was told (a member is answered again only when its reason changes)."""

    def __init__(self) -> None:
        self.gangs: dict[GangKey, dict[str, tuple[Waiting, GangSettings]]] = {}
        self.members: dict[ClaimKey, GangKey] = {}
        self.invalid: dict[ClaimKey, str] = {}  # claims whose gang annotations do not read: why
        self.told: dict[ClaimKey, str] = {}
        self.complete_since: dict[GangKey, float] = {}  # when a gang waiting to split was first seen complete
        self.domains = Domains()  # the nodes per value of each topology key
        self.refused_now: list[GangUnit] = []  # complete gangs the cycle's pass could not admit
        self.first_since: dict[GangKey, float] = {}  # when a gang was first seen first in its tenant's order
        self.held_now: dict[GangKey, list[Allocation]] = {}  # what starving gangs hold until the cycle ends
        # per gang, its claims Rejected on their own (their spec, or disagreeing): named to the others until
        # the gang has no member left waiting
        self.lost: dict[GangKey, dict[str, None]] = {}
        # each gang as a unit, worked out again only when a member came, went or was answered: a cycle
        # reads the gangs that changed and the complete ones, not every incomplete gang
        self._units: dict[GangKey, tuple[GangUnit, list[tuple[Waiting, str]]]] = {}
        self._complete: set[GangKey] = set()
        self._changed: set[GangKey] = set()
        # per complete gang that did not fit (with a topology key too, unless a preferred gang's wait still
        # runs): what its trial read (its members' capacity versions, its cohort's and the free capacity's
        # quota versions) and its refusal; while they are the same its trial would be too (Any:
        # shared.admission.gang_pass's Refusal)
        self.failed_at: dict[GangKey, tuple[tuple[Any, ...], Any]] = {}
        # per complete gang refused, the unit whose members were all answered and told a reason of this shape
        # (numbers blanked) when it was last refused: while the unit is the same object (it is rebuilt when a
        # member comes, goes or is answered again), no member is due a reason of that shape (`told_alike`)
        self._told_units: dict[GangKey, tuple[GangUnit, str]] = {}

    def add(self, waiting: Waiting, settings: GangSettings) -> None:
        key = (waiting.tenant, settings.name)
        self.gangs.setdefault(key, {})[waiting.name] = (waiting, settings)
        self.members[waiting.key] = key
        self._changed.add(key)

    def update(self, now: Waiting) -> None:
        """A member rebuilt with the same spec, priority and arrival (it was answered)."""
        key = self.members.get(now.key)
        if key is not None:
            members = self.gangs[key]
            members[now.name] = (now, members[now.name][1])
            self._changed.add(key)

    def lose(self, waiting: Waiting, gang: str) -> None:
        """A claim of the gang is Rejected on its own: the members left waiting say so."""
        names = self.lost.setdefault((waiting.tenant, gang), {})
        if waiting.name not in names:
            names[waiting.name] = None
            self._changed.add((waiting.tenant, gang))

    def missing(self, key: GangKey) -> str:
        """What the reason of a gang that waits for members adds about those Rejected, if any."""
        return rejected_note([n for n in self.lost.get(key, ()) if n not in self.gangs.get(key, ())])

    def remove(self, waiting: Waiting) -> None:
        self.invalid.pop(waiting.key, None)
        self.told.pop(waiting.key, None)
        key = self.members.pop(waiting.key, None)
        if key is None:
            if self.lost:  # a lost claim leaves: its record goes with the gang's last member
                for gang, names in list(self.lost.items()):
                    if gang[0] == waiting.tenant and waiting.name in names and gang not in self.gangs:
                        del self.lost[gang]
            return
        members = self.gangs[key]
        del members[waiting.name]
        self._changed.add(key)
        self.complete_since.pop(key, None)
        self.first_since.pop(key, None)
        if not members:
            del self.gangs[key]
            self.lost.pop(key, None)

    def marks(self, leaving: Collection[ClaimKey] = ()) -> Mapping[GangKey, GangMark]:
        """The gangs' clocks as they stand (complete_since, first_since), except those of gangs with a member
        in `leaving` (admitted in this cycle: their clocks go once the members run). A copy: a shell keeps it
        to restore (`restore`) into a state built anew. Costs nothing when no gang has a clock running."""
        complete, first = self.complete_since, self.first_since
        if not complete and not first:
            return MappingProxyType({})
        marks = {key: (complete.get(key), first.get(key)) for key in complete.keys() | first.keys()}
        if leaving:
            for key in list(marks):
                tenant = key[0]
                if any((tenant, name) in leaving for name in self.gangs.get(key, ())):
                    del marks[key]
        return MappingProxyType(marks)

    def restore(self, marks: Mapping[GangKey, GangMark]) -> None:
        """Clocks kept from before (an earlier process, or a state this one replaced), for the gangs that
        wait complete now: a gang that is not (a member left meanwhile) starts its clocks again, as it would
        had it been seen losing the member. A clock running here already is kept."""
        for key, (complete, first) in marks.items():
            if key not in self.gangs or not self._unit(key)[0].complete:
                continue
            if complete is not None:
                self.complete_since.setdefault(key, complete)
            if first is not None:
                self.first_since.setdefault(key, first)

    def due(self, waiting: Waiting, reason: str, *, numbers_may_lag: bool = False) -> bool:
        """Whether a member is to be told `reason` (it has no answer yet, or another one). With
        `numbers_may_lag` (a complete gang that does not fit), an answered member is not told the same
        reason with other numbers ("the most free on one is 24", then 16): as a claim's answer, it is
        refreshed when the allocator asks its waiting claims again (CLAIMBROKER_REASON_REFRESH), so a
        busy fleet does not make every waiting gang publish its members' statuses each cycle."""
        told = self.told.get(waiting.key)
        if waiting.answered and told is not None and (
                told == reason or numbers_may_lag and _shape(told) == _shape(reason)):
            return False
        self.told[waiting.key] = reason
        return True

    def told_alike(self, unit: GangUnit, reason: str) -> bool:
        """Whether `due(m, reason, numbers_may_lag=True)` is False for every member: the same unit was last
        refused with a reason of the same shape and all its members were answered (see note_told)."""
        kept = self._told_units.get(unit.key)
        return kept is not None and kept[0] is unit and kept[1] == _shape(reason)

    def note_told(self, unit: GangUnit, reason: str) -> None:
        """The unit's members were each asked `due(m, reason, numbers_may_lag=True)`: each was told a reason
        of its shape now or before. Kept when every member was answered already (a member not answered is
        due whatever it was told)."""
        if all(m.answered for m in unit.members):
            self._told_units[unit.key] = (unit, _shape(reason))
        else:
            self._told_units.pop(unit.key, None)

    def units(self) -> tuple[list[GangUnit], list[tuple[GangUnit, list[tuple[Waiting, str]]]]]:
        """The complete gangs, in tenant and name order, and each gang that changed since the last call
        with the members that disagree with it (and why)."""
        changed = []
        for key in sorted(self._changed):
            before = self._units.get(key)
            if key not in self.gangs:
                self._units.pop(key, None)
                self._complete.discard(key)
                self.failed_at.pop(key, None)
                self._told_units.pop(key, None)
                continue
            found = self._units[key] = self._unit(key)
            if before is None or [m.key for m in before[0].members] != [m.key for m in found[0].members]:
                self.failed_at.pop(key, None)  # other members: its trial is another one
            changed.append(found)
            if found[0].complete:
                self._complete.add(key)
            else:
                self._complete.discard(key)
        self._changed.clear()
        return [self._units[k][0] for k in sorted(self._complete)], changed

    def _unit(self, key: GangKey) -> tuple[GangUnit, list[tuple[Waiting, str]]]:
        """The gang as a unit, and its members that disagree with it. The first member to arrive states the
        gang's settings; a member that states another size or topology, or one more than the size,
        disagrees (the others go on waiting)."""
        ordered = sorted(self.gangs[key].values(), key=lambda m: (m[0].arrival, m[0].name))
        first, stated = ordered[0][0], ordered[0][1]
        agreed: list[Waiting] = []
        disagree = []
        for waiting, settings in ordered:
            problem = _disagreement(key[1], first, stated, settings)
            if problem is None and len(agreed) == stated.size:
                problem = (f"gang {key[1]}: it has its {stated.size} members already "
                           f"({', '.join(m.name for m in agreed[:4])}{', ...' if stated.size > 4 else ''}); "
                           "this claim is one more than its gang-size")
            if problem is not None:
                disagree.append((waiting, problem))
            else:
                agreed.append(waiting)
        return GangUnit(key, stated, tuple(agreed)), disagree


@lru_cache(maxsize=4096)
def _shape(reason: str) -> str:
    """The reason with its numbers blanked: a refused gang's members are each asked it with one reason,
    and most were told the last cycle's, so both are worked out once, not once per member."""
    return _DIGITS.sub("#", reason)


def _disagreement(gang: str, first: Waiting, stated: GangSettings, settings: GangSettings) -> str | None:
    """Why a member's gang settings disagree with those its first member stated, if they do."""
    for field, mine, theirs in (("gang-size", settings.size, stated.size),
                                ("gang-topology", settings.topology, stated.topology),
                                ("gang-topology-mode", settings.mode, stated.mode),
                                ("gang-topology-wait", settings.wait, stated.wait)):
        if mine != theirs:
            return (f"gang {gang}: its {field} {_shown(mine)} disagrees with {_shown(theirs)} stated by "
                    f"its first member {first.name}")
    return None


def _shown(value: object) -> str:
    if value is None:
        return "(none)"
    if isinstance(value, float):
        return f"{value:g}s"
    return str(value)
