"""The waiting queue as a shell keeps it between cycles, recording what came and went.

A cycle compares the waiting claims of its snapshot with the ones it saw last time to find what
changed. The shell that keeps the queue knows that already: handing it over (`QueueChanges`) lets a
cycle skip comparing every waiting claim, which is most of what a deep queue would cost it. The full
tuple still goes into the snapshot, so a cycle that did not see the previous snapshot (or a record
that does not add up) falls back to the comparison.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, ValuesView

from shared.admission.model import ClaimKey, QueueChanges, Waiting

_VERSIONS = itertools.count(1)  # one sequence for every queue of the process: versions never collide


class WaitingQueue(Mapping[ClaimKey, Waiting]):
    """Waiting claims by key, in the order they were first put, with the changes since the last
    `snapshot()`. Read as a mapping; changed only through `put` and `pop`, which record the change."""

    def __init__(self) -> None:
        self._claims: dict[ClaimKey, Waiting] = {}
        self._before: dict[ClaimKey, Waiting | None] = {}  # per key changed since the last snapshot: what it held
        self._version = 0  # of the last snapshot (0: none taken)

    def __len__(self) -> int:
        return len(self._claims)

    def __contains__(self, key: object) -> bool:
        return key in self._claims

    def __iter__(self) -> Iterator[ClaimKey]:
        return iter(self._claims)

    def __getitem__(self, key: ClaimKey) -> Waiting:
        return self._claims[key]

    def get(self, key: ClaimKey, default: Waiting | None = None) -> Waiting | None:  # type: ignore[override]
        # the dict's own: Mapping.get would raise and catch KeyError on every miss
        return self._claims.get(key, default)

    def values(self) -> ValuesView[Waiting]:
        return self._claims.values()

    def put(self, waiting: Waiting) -> None:
        """Queue the claim, or replace the one queued under its key (a rebuilt claim is a change)."""
        key = waiting.key
        before = self._claims.get(key)
        if before is waiting:
            return
        self._before.setdefault(key, before)
        self._claims[key] = waiting

    def pop(self, key: ClaimKey) -> Waiting | None:
        """Take the claim out of the queue (None if it is not queued)."""
        before = self._claims.pop(key, None)
        if before is not None:
            self._before.setdefault(key, before)
        return before

    def snapshot(self) -> tuple[tuple[Waiting, ...], QueueChanges]:
        """Every waiting claim, and what came and went since the last snapshot, for `Snapshot`."""
        came, went = [], []
        for key, before in self._before.items():
            now = self._claims.get(key)
            if now is before:
                continue  # put back as it was
            if before is not None:
                went.append(before)
            if now is not None:
                came.append(now)
        since, self._version = self._version, next(_VERSIONS)
        self._before = {}
        return tuple(self._claims.values()), QueueChanges(since, self._version, tuple(came), tuple(went))
