"""Waiting claims in groups of one spec and tenant, and the heads of the queue in fair-share order.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Container
from typing import cast

from shared.admission.holdings import PlanFacts
from shared.dra.plan import Plan


class Group:
    """The waiting claims of one tenant with one claim spec (one plan), in the tenant's order: priority,
    then arrival. Claims alike get the same answer, so a cycle tries a group's claims from the head and
    stops at the first that does not fit: what stays free and what quota is left only shrink while a
    cycle admits, so the rest would not fit either."""

    __slots__ = ("tenant", "plan", "facts", "entries", "fresh", "cut")

    def __init__(self, tenant: str, plan: Plan, facts: PlanFacts) -> None:
        self.tenant = tenant
        self.plan = plan
        self.facts = facts  # what quota arithmetic needs of the spec
        self.entries: list[tuple[int, int, str]] = []  # (-priority, arrival, name), sorted
        self.fresh: set[str] = set()  # names with no answer yet: they get the group's answer this cycle
        self.cut: set[str] = set()  # names answered that their search was cut short: a verdict replaces it


Head = tuple[tuple[int, int, str], tuple[str, int]]  # a group's head entry, and the group


class Heads:
    """A tenant's group heads during a pass, least first: the heads it started with, read in their
    sorted order (not copied: the kept groups do not change in a pass), merged with a heap of the heads
    that follow admitted ones. A head dropped without a trial (`skip`) costs an iterator step, not a heap
    operation."""

    __slots__ = ("sorted", "at", "pushed")

    def __init__(self, heads: list[Head]) -> None:
        self.sorted = heads
        self.at = 0
        self.pushed: list[Head] = []

    def first(self) -> Head | None:
        if self.at < len(self.sorted):
            head = self.sorted[self.at]
            if not self.pushed or head < self.pushed[0]:
                return head
        return self.pushed[0] if self.pushed else None

    def pop(self) -> Head:
        head = self.first()
        assert head is not None
        if self.at < len(self.sorted) and head is self.sorted[self.at]:
            self.at += 1
        else:
            heapq.heappop(self.pushed)
        return head

    def push(self, head: Head) -> None:
        heapq.heappush(self.pushed, head)

    def skip(self, closed: Container[int], dead: Container[tuple[str, int]],
             quota_full: Callable[[tuple[str, int]], bool] | None) -> bool:
        """Drops from the front the heads of specs no node has room for (`closed`, by plan id) and of
        groups whose tenant's quota is too small for them (`dead`, or found so by `quota_full`): both
        stay refused for the rest of the pass. Whether any head was dropped. A dropped head costs a set
        lookup, not a trial or an answer (the pass answers such groups at its end)."""
        ordered, at, pushed = self.sorted, self.at, self.pushed
        start, popped = at, False
        while True:
            bound = pushed[0] if pushed else LAST_HEAD
            for head in itertools.islice(ordered, at, None):  # the sorted heads before the least pushed
                if bound < head:
                    break
                gid = head[1]
                if not (gid[1] in closed or gid in dead or (quota_full is not None and quota_full(gid))):
                    self.at = at
                    return popped or at != start
                at += 1
            if not pushed:
                break
            gid = pushed[0][1]  # the least head now
            if not (gid[1] in closed or gid in dead or (quota_full is not None and quota_full(gid))):
                break
            heapq.heappop(pushed)
            popped = True
        self.at = at
        return popped or at != start


LAST_HEAD = cast(Head, ((float("inf"),),))  # compares greater than every head
