"""gang-incomplete: one alert per gang (tenant + gang name) whose members have waited for the rest of the
gang longer than the tenant's pending threshold, resolved when the gang is complete or has no member left.

A member is in its gang's wait while its status is Pending with the incomplete-gang reason
(shared/contract/gang_reasons.py). The gang is complete when a member's status stops being that reason
while the member stays (Allocated, or Pending for another reason: the gang is whole and waits for devices);
it is gone when its last waiting member leaves (Released, Rejected). Pure: ClaimRules feeds it statuses and
time; each incomplete gang costs one small record, dropped when the gang resolves.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from shared.alerts.book import Action, Alert, Raise, Resolve, alert_key
from shared.contract.gang_reasons import IncompleteGang

GANG_INCOMPLETE = "gang-incomplete"


@dataclass(slots=True, eq=False)
class GangWait:
    """One incomplete gang: since when, its latest numbers, how many of its members wait in it."""

    tenant: str
    since: float
    reading: IncompleteGang
    members: int = 0
    alerted: bool = False
    open: bool = True  # False once resolved; members whose last status still says they wait point at it

    @property
    def key(self) -> str:
        return alert_key(GANG_INCOMPLETE, self.tenant, self.reading.gang)

    @property
    def name(self) -> str:
        return f"gang {self.reading.gang} of tenant {self.tenant}"


class GangRule:
    def __init__(self) -> None:
        self.gangs: dict[tuple[str, str], GangWait] = {}

    def join(self, tenant: str, reading: IncompleteGang, since: float) -> GangWait:
        """A member waits in its gang's wait, with the numbers its reason gives (the gang's latest)."""
        wait = self.gangs.get((tenant, reading.gang))
        if wait is None:
            wait = self.gangs[(tenant, reading.gang)] = GangWait(tenant, since, reading)
        wait.since = min(wait.since, since)  # a restart seeds members in any order
        wait.reading = reading
        wait.members += 1
        return wait

    def leave(self, wait: GangWait, claim: str, state: str, reason: str, *, complete: bool) -> list[Action]:
        """A member's status is no longer its gang's incomplete reason: `state` and `reason` are its new ones,
        `complete` when they say the gang is (Allocated, or Pending for a reason about no missing member)."""
        if not wait.open:
            return []
        wait.members -= 1
        if complete:
            how = (f"{wait.name} is complete: member {claim} is Allocated" if state == "Allocated" else
                   f"{wait.name} is complete and waits as a whole: {reason}")
        elif wait.members <= 0:
            how = f"{wait.name} has no member waiting any more (the last, {claim}, is {state})"
        else:
            return []
        return [self._close(wait, how)]

    def restore(self, tenant: str, gang: str) -> None:
        """Its alert was open when the notifier (re)started. With no member waiting in it (the gang became
        complete or left meanwhile) the next `due` resolves it."""
        wait = self.gangs.get((tenant, gang))
        if wait is None:
            wait = self.gangs[(tenant, gang)] = GangWait(tenant, float("inf"), IncompleteGang(gang, 0, 0))
        wait.alerted = True

    def due(self, now: float, threshold: Callable[[str], float]) -> list[Action]:
        """Gangs incomplete past their tenant's threshold, each alerted once per wait."""
        out: list[Action] = []
        for wait in list(self.gangs.values()):
            if wait.members <= 0:
                out.append(self._close(wait, f"{wait.name} is complete or has no member waiting any more"))
                continue
            after = threshold(wait.tenant)
            if wait.alerted or now - wait.since < after:
                continue
            wait.alerted = True
            out.append(Raise(self._alert(wait, now - wait.since, after)))
        return out

    def _close(self, wait: GangWait, summary: str) -> Resolve:
        wait.open = False
        del self.gangs[(wait.tenant, wait.reading.gang)]
        return Resolve(wait.key, summary)

    @staticmethod
    def _alert(wait: GangWait, waited: float, after: float) -> Alert:
        r = wait.reading
        summary = (f"{wait.name}: {r.have} of {r.size} members received for {duration(waited)} "
                   f"(threshold {duration(after)}); missing {r.missing} member{'' if r.missing == 1 else 's'}")
        if r.rejected:
            names = ", ".join(r.rejected) + (f" and {r.more_rejected} more" if r.more_rejected else "")
            summary += f", among them {names} Rejected on their own: submit them again"
        details = {"gang": r.gang, "received": r.have, "size": r.size, "missing": r.missing,
                   "rejected": list(r.rejected), "rejectedNotNamed": r.more_rejected,
                   "incompleteSeconds": round(waited, 1), "thresholdSeconds": after}
        return Alert(GANG_INCOMPLETE, "warning", wait.key, summary, details, {"tenant": wait.tenant, "gang": r.gang})


def duration(seconds: float) -> str:
    """90s, 12m, 3h5m: how long, for a person."""
    if seconds < 120:
        return f"{seconds:.0f}s"
    minutes = int(seconds // 60)
    if minutes < 120:
        return f"{minutes}m"
    return f"{minutes // 60}h{minutes % 60}m" if minutes % 60 else f"{minutes // 60}h"
