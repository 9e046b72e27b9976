"""Waves of waiting claims driven through decision cycles as the allocator's shell drives them, for the
properties of the core: each wave's claims join the queue, some running claims finish, three cycles run,
and each cycle's result is settled (victims queue again, never to take back what displaced them; admitted
claims run; Rejected ones leave; Pending ones are answered)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from shared.admission.model import CycleResult, Running, Waiting
from shared.admission.waiting_queue import WaitingQueue
from shared.dra.results import State


@dataclass
class Waves:
    waves: list[list[Waiting]]
    rng: Any
    running: dict[tuple[str, str], Running] = field(default_factory=dict)
    queue: WaitingQueue = field(default_factory=WaitingQueue)
    arrival: int = 0
    order: int = 0
    pairs: set[tuple[tuple[str, str], tuple[str, str]]] = field(default_factory=set)  # (victim, by)

    def __post_init__(self) -> None:
        self.originals = {w.key: w for wave in self.waves for w in wave}

    def cycles(self) -> Iterator[None]:
        """Yields once per cycle to run (the caller settles its result)."""
        for wave in self.waves:
            for w in wave:
                self.arrival += 1
                if w.key not in self.running and w.key not in self.queue:
                    self.queue.put(replace(w, arrival=self.arrival))
            for key in [k for k in sorted(self.running) if self.rng.random() < 0.3]:  # some claims finish
                del self.running[key]
            for _ in range(3):
                yield

    def settle(self, result: CycleResult) -> None:
        for p in result.preemptions:
            assert (p.by, p.victim) not in self.pairs, f"{p.victim} and {p.by} preempted each other"
            self.pairs.add((p.victim, p.by))
            victim = self.running.pop(p.victim)
            self.queue.put(Waiting(victim.tenant, victim.name, self.originals[p.victim].claim, victim.priority,
                                   victim.preemptible, victim.arrival, displaced_by=frozenset({p.by})))
        for d in result.decisions:
            w = self.queue.get((d.tenant, d.name))
            if w is None:
                continue
            if d.decision.allocation is not None:
                self.order += 1
                self.running[w.key] = Running(w.tenant, w.name, d.decision.allocation, w.priority, w.preemptible,
                                              w.arrival, self.order)
                self.queue.pop(w.key)
            elif d.decision.state is State.REJECTED:
                self.queue.pop(w.key)
            elif d.decision.state is State.PENDING and not w.answered:
                self.queue.put(replace(w, answered=True))
