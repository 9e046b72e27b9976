"""The reason a gang member waits with while its gang lacks members, written and read in one place: the
allocator builds it (shared/admission/gang_pass.py), the notifier reads the gang and its numbers back from
a status (shared/alerts: gang-incomplete). Pure.

    gang train-7: 3 of 4 members received
    gang train-7: 1 of 3 members received (b, c Rejected: a member with its name has to be submitted again)
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

SHOWN_REJECTED = 4  # names a reason lists of the members Rejected on their own; the rest are counted
_REJECTED_TAIL = " Rejected: a member with its name has to be submitted again"
_INCOMPLETE = re.compile(
    r"gang (?P<gang>[a-z0-9](?:[-a-z0-9]*[a-z0-9])?): (?P<have>[0-9]{1,9}) of (?P<size>[0-9]{1,9}) members received"
    rf"(?: \((?P<rejected>[^()]+?){re.escape(_REJECTED_TAIL)}\))?")
_MORE = re.compile(r"(?P<names>.+) and (?P<more>[0-9]{1,9}) more")


@dataclass(frozen=True)
class IncompleteGang:
    """What an incomplete gang's reason says: the gang, how many of its members arrived, and the members
    Rejected on their own that it names (`more_rejected` those it only counts)."""

    gang: str
    have: int
    size: int
    rejected: tuple[str, ...] = ()
    more_rejected: int = 0

    @property
    def missing(self) -> int:
        return max(0, self.size - self.have)


def rejected_note(names: Sequence[str]) -> str:
    """What the reason adds about the members Rejected on their own ('' when none): the first few named."""
    if not names:
        return ""
    shown = ", ".join(names[:SHOWN_REJECTED])
    if len(names) > SHOWN_REJECTED:
        shown += f" and {len(names) - SHOWN_REJECTED} more"
    return f" ({shown}{_REJECTED_TAIL})"


def incomplete_reason(gang: str, have: int, size: int, note: str = "") -> str:
    """The reason of each waiting member of a gang that has `have` of its `size` members; `note` is
    rejected_note's text about its members Rejected on their own."""
    return f"gang {gang}: {have} of {size} members received{note}"


def read_incomplete(reason: str | None) -> IncompleteGang | None:
    """The gang and its numbers from a status reason that incomplete_reason built; None for any other."""
    if not reason:
        return None
    found = _INCOMPLETE.fullmatch(reason)
    if found is None:
        return None
    rejected: tuple[str, ...] = ()
    more = 0
    if (listed := found["rejected"]) is not None:
        if (counted := _MORE.fullmatch(listed)) is not None:
            listed, more = counted["names"], int(counted["more"])
        rejected = tuple(listed.split(", "))
    return IncompleteGang(found["gang"], int(found["have"]), int(found["size"]), rejected, more)
