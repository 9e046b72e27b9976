"""The clocks of waiting gangs, kept beyond the admission state that runs them: a gang that has been first
in its tenant's order for 4m59s is reserved for at its gangReserveAfter of 5m, not 5 minutes after the
allocator restarted, or after a quota or fleet change built the admission state anew.

The core keeps the clocks in memory (shared.admission.gangs.WaitingGangs: `first_since`, `complete_since`);
this shell does not touch how it sets them. After each cycle it takes them as they stand (`marks`), keeps
them for the next state built anew (`ClockedKeptState`) and writes to the ledger what differs from what it
last wrote, in the cycle's transaction; as it starts it reads them back. With no gang waiting (the common
case) that is a comparison of two empty mappings: no query.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from shared.admission.gangs import GangKey, GangMark
from shared.admission.kept import KeptState
from shared.admission.model import Snapshot
from shared.admission.state import AdmissionState
from shared.ledger import gang_waits
from shared.ledger.handles import AsyncSession


@dataclass
class ClockedKeptState(KeptState):
    """A KeptState whose gangs' clocks outlive its admission state: one built anew (another fleet or
    quotas, a claim's fault, the first cycle of a process) starts with `marks`, the last ones known."""

    marks: Mapping[GangKey, GangMark] = field(default_factory=dict)

    def admission_for(self, snapshot: Snapshot) -> AdmissionState:
        before = self.admission
        state = super().admission_for(snapshot)
        if state is not before and self.marks:
            state.gangs.restore(self.marks)
        return state


class GangClocks:
    """What the ledger holds of the gangs' clocks (`ledger`: None until read) and what this transaction
    wrote of them, theirs once it commits."""

    def __init__(self, kept: ClockedKeptState) -> None:
        self.kept = kept
        self.ledger: Mapping[GangKey, GangMark] | None = None
        self._written: Mapping[GangKey, GangMark] | None = None

    async def before_cycle(self, session: AsyncSession) -> None:
        """The first time: the ledger's clocks, for the admission state the cycle builds."""
        if self.ledger is None:
            self.ledger = await gang_waits.load(session)
            self.kept.marks = self.ledger

    async def after_cycle(self, session: AsyncSession, state: AdmissionState | None) -> None:
        """The clocks as the cycle left them (`state` None: no claim waits, so no gang), written where they
        differ from the ledger's: rows of gangs admitted in the cycle, or with no member waiting, go."""
        await self.before_cycle(session)
        marks = state.gangs.marks(state.admitted_now) if state is not None else {}
        self.kept.marks = marks
        ledger = self.ledger or {}
        if marks == ledger:
            return
        changed = {key: mark for key, mark in marks.items() if ledger.get(key) != mark}
        await gang_waits.write(session, changed, [key for key in ledger if key not in marks])
        self._written = marks

    def committed(self) -> None:
        if self._written is not None:
            self.ledger, self._written = self._written, None

    def rolled_back(self) -> None:
        self._written = None
