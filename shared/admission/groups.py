"""Waiting claims in groups of one spec and tenant, and the heads of the queue in fair-share order.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections import Counter, defaultdict
from collections.abc import Callable, Container
from typing import cast

from shared.admission.model import ClaimKey, QueueChanges, Snapshot, Waiting, claim_key, queue_entry
from shared.admission.quota_room import PlanFacts
from shared.dra.plan import Plan

GroupId = tuple[str, int]  # a group's tenant and the id of its plan


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


Head = tuple[tuple[int, int, str], GroupId]  # a group's head entry, and the group


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


class WaitingGroups:
    """The waiting claims of one fleet in groups, brought up to date with each snapshot in O(what changed),
    with each tenant's group heads in order (what the admission pass reads) and the claims that wait
    outside any group: Rejected as written, or whose spec is not prepared yet."""

    def __init__(self) -> None:
        self.waiting: dict[ClaimKey, Waiting] = {}
        self._queued: set[Waiting] = set()  # every waiting claim in the groups
        self._version: int | None = None  # of the snapshot `_queued` is (QueueChanges), if it had one
        self.groups: dict[GroupId, Group] = {}
        self.specs: Counter[int] = Counter()  # groups per plan id: a pass that has closed every spec stops
        self.unsized: Counter[str] = Counter()  # per tenant: groups of specs with no fixed size (need a trial)
        # per tenant, each group's head entry with the group, sorted: the pass reads it in order (Heads)
        self.tenant_heads: dict[str, list[Head]] = defaultdict(list)
        self.group_of: dict[ClaimKey, GroupId | None] = {}  # None: the claim is Rejected as written
        self.fresh_groups: set[GroupId] = set()  # groups that may hold claims with no answer yet
        self.invalid: set[ClaimKey] = set()  # claims Rejected as written
        self.unprepared: dict[ClaimKey, Waiting] = {}  # claims whose plan or indexes are not built yet
        self.cut_answered: set[ClaimKey] = set()  # claims whose answer says their search was cut short

    def changes(self, snapshot: Snapshot) -> tuple[list[Waiting], dict[ClaimKey, Waiting]]:
        """The claims that came since the last snapshot, in claim order, and those that left, by key (a
        claim rebuilt is in both); the queue as this holds it becomes the snapshot's. Claims are compared by
        identity in bulk: only those that came or went cost a Python step."""
        changes = snapshot.changes
        if changes is not None and changes.since == self._version and (
                moved := self._moved(changes, len(snapshot.waiting))) is not None:
            new, went = moved
            left = {w.key: w for w in went}
            self._queued -= went
            self._queued |= new
        else:
            waiting = set(snapshot.waiting)
            left = {w.key: w for w in self._queued - waiting}
            new = waiting - self._queued
            self._queued = waiting
        self._version = changes.version if changes is not None else None
        return sorted(new, key=claim_key), left

    def _moved(self, changes: QueueChanges, depth: int) -> tuple[set[Waiting], set[Waiting]] | None:
        """The claims that came and went, if they follow on from the queue as this holds it and add up to
        `depth` claims (else None: the shell's record and this disagree, so the queues are compared in full)."""
        came, went = set(changes.came), set(changes.went)
        queued = self._queued
        if (len(came) == len(changes.came) and len(went) == len(changes.went) and went <= queued
                and queued.isdisjoint(came) and len(queued) - len(went) + len(came) == depth):
            return came, went
        return None

    def refuse(self, waiting: Waiting) -> None:
        """The claim is Rejected as written (or its tenant may not send it): it waits in no group."""
        self.group_of[waiting.key] = None
        self.invalid.add(waiting.key)

    def add(self, waiting: Waiting, plan: Plan, facts: PlanFacts) -> None:
        """The claim joins the group of its tenant and plan (`facts`: the plan's)."""
        gid = (waiting.tenant, id(plan))
        group = self.groups.get(gid)
        if group is None or group.plan is not plan:
            if group is not None:  # the id of a plan dropped from the memo came back: a new group
                self._move_head(gid, group.entries[0] if group.entries else None, None)
                self.unsized[waiting.tenant] -= group.facts.least is None
            else:
                self.specs[gid[1]] += 1
            group = self.groups[gid] = Group(waiting.tenant, plan, facts)
            self.unsized[waiting.tenant] += group.facts.least is None
        head = group.entries[0] if group.entries else None
        bisect.insort(group.entries, queue_entry(waiting))
        self._move_head(gid, head, group.entries[0])
        if waiting.key in self.cut_answered:
            group.cut.add(waiting.name)
        if not waiting.answered:
            group.fresh.add(waiting.name)
            self.fresh_groups.add(gid)
        self.group_of[waiting.key] = gid

    def update(self, now: Waiting) -> None:
        """A waiting claim rebuilt with the same spec, priority and arrival (it was answered, or what
        displaced it changed): its group and place stay; only whether it awaits an answer may change."""
        self.waiting[now.key] = now
        if now.key in self.unprepared:
            self.unprepared[now.key] = now
        gid = self.group_of.get(now.key)
        group = self.groups.get(gid) if gid is not None else None
        if group is not None:
            if now.answered:
                group.fresh.discard(now.name)
            else:
                group.fresh.add(now.name)
                self.fresh_groups.add(gid)  # type: ignore[arg-type]

    def remove(self, waiting: Waiting) -> Plan | None:
        """The claim leaves the queue; the plan of its group when no group of that plan is left."""
        if self.waiting.get(waiting.key) is waiting:
            del self.waiting[waiting.key]
        self.invalid.discard(waiting.key)
        self.unprepared.pop(waiting.key, None)
        self.cut_answered.discard(waiting.key)
        gid = self.group_of.pop(waiting.key, None)
        group = self.groups.get(gid) if gid is not None else None
        if gid is None or group is None:
            return None
        entries = group.entries
        head = entries[0]
        at = bisect.bisect_left(entries, queue_entry(waiting))
        if at < len(entries) and entries[at] == queue_entry(waiting):
            del entries[at]
        group.fresh.discard(waiting.name)
        group.cut.discard(waiting.name)
        self._move_head(gid, head, entries[0] if entries else None)
        if not entries:
            del self.groups[gid]
            self.unsized[gid[0]] -= group.facts.least is None
            self.specs[gid[1]] -= 1
            if not self.specs[gid[1]]:
                del self.specs[gid[1]]
                return group.plan
        return None

    def answered_cut(self, waiting: Waiting, cut: bool) -> None:
        """Note whether the answer given says the claim's search was cut short (a verdict replaces it)."""
        gid = self.group_of.get(waiting.key)
        group = self.groups.get(gid) if gid is not None else None
        if cut:
            self.cut_answered.add(waiting.key)
            if group is not None:
                group.cut.add(waiting.name)
        elif waiting.key in self.cut_answered:
            self.cut_answered.discard(waiting.key)
            if group is not None:
                group.cut.discard(waiting.name)

    def _move_head(self, gid: GroupId, old: tuple[int, int, str] | None, new: tuple[int, int, str] | None) -> None:
        if old == new:
            return
        heads = self.tenant_heads[gid[0]]
        if old is not None:
            del heads[bisect.bisect_left(heads, (old, gid))]
        if new is not None:
            bisect.insort(heads, (new, gid))
