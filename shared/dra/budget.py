"""What deciding one claim may cost: a meter in deterministic units.

A claim's spec decides how much work its placement takes (CEL expressions to compile and evaluate,
combinations to search), and Kubernetes accepts claims whose search is exponential. So every piece of
that work is charged to a meter, and a claim whose meter runs out waits (its reason says so) instead of
holding up the others. Units, not seconds: the same snapshot gets the same decisions however loaded the
machine is, so `simulate` and the allocator agree. One unit is about one device tried by the search
(2 to 5 us in CPython); the other weights were measured against it (`make bench-core`).
"""

from __future__ import annotations

STEP = 1  # one device tried by a placement search, one group or node looked at, one node an index covers
COMPILE = 150  # one CEL expression compiled (about 0.6 ms in cel-python; only a cache miss is charged)
EVALUATION = 150  # one CEL evaluation the selector memo did not have (0.25 to 0.8 ms)

# A claim's placement may spend this much in one cycle (about 6 ms). Its tenant's claims share a little more
# per cycle (AdmissionState), and work cut short resumes in the next cycle (shared/dra/sweep.py), so a claim
# that needs more is placed over several cycles instead of stalling one.
CLAIM_BUDGET = 1_500
TENANT_BUDGET = 2_000  # per tenant and cycle; a quarter as much again is its floor pool (see FLOOR_BUDGET)
# What a caller that decides once and cannot go on later (tests, one-off tools) gives a decision: about 3 s.
ONE_SHOT_BUDGET = 1_000_000
# Cycles in a row a claim's work may be cut short before its answer says so: an ordinary claim whose selectors
# are new is done within a few (a cycle runs every CLAIMBROKER_PLACEMENT_CONTINUE_AFTER, 0.1 s, while such
# work is left) and gets its verdict; an expensive one says it waits for its search within about a second.
CUT_PATIENCE = 10
# What every attempt may spend even once its tenant's share for the cycle is gone: enough for a claim that
# only needs what is cached (a single request placed from an index), not for new CEL work or a search.
FLOOR_BUDGET = 100


class BudgetExceeded(Exception):
    """The meter ran out: the work stops here, and what it found so far stays in the caches."""


class PieceTooLarge(BudgetExceeded):
    """One piece of work ran past PIECE_LIMIT before it was done (a node whose combinations have no end)."""


# The most a single piece of divisible work may cost before it is given up (a search of one node): about
# 0.1 s. A meter's first piece runs past the meter's limit, up to this, so every meter makes progress.
PIECE_LIMIT = 25_000


class Meter:
    """Units left for the work of one decision; `spend` raises BudgetExceeded once they are gone.

    Every meter given any units makes progress: until it has done one piece of work (`done`: a selector
    compiled or evaluated, an index built, a node searched, all of which are kept, so the next meter goes on
    from there), it is not stopped at its limit; only a divisible piece that runs past PIECE_LIMIT is. So
    work bigger than any one budget is still done, a piece per meter, and its cost is counted past the limit
    (the payer's next budget repays it: see AdmissionState's allowances)."""

    __slots__ = ("limit", "spent", "done")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.spent = 0
        self.done = False  # a piece of work was done and kept: from now on the limit holds

    def spend(self, units: int = STEP) -> None:
        """Before divisible work: raises (and the work is not done, nor counted) if it would run out."""
        if self.spent + units > self.limit and (self.done or self.limit <= 0):
            raise BudgetExceeded
        if not self.done and self.spent + units > PIECE_LIMIT:
            raise PieceTooLarge
        self.spent += units

    def spend_whole(self, units: int) -> None:
        """Before a piece that cannot be split (compiling, evaluating, building an index): as `spend`, but a
        first piece is never too large, and once it is done, the meter has made progress."""
        if self.spent + units > self.limit and (self.done or self.limit <= 0):
            raise BudgetExceeded
        self.spent += units
        self.done = True

    def progressed(self) -> None:
        """A piece of divisible work was done and kept (a node searched in vain, a variant finished)."""
        self.done = True

    @property
    def left(self) -> int:
        return max(0, self.limit - self.spent)


class Unmetered(Meter):
    """For work no claim pays for (a fleet's flavors, trusted callers): counts, never stops."""

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__(0)

    def spend(self, units: int = STEP) -> None:
        self.spent += units

    def spend_whole(self, units: int) -> None:
        self.spent += units

    @property
    def left(self) -> int:
        return 1 << 62


__all__ = ["CLAIM_BUDGET", "COMPILE", "CUT_PATIENCE", "EVALUATION", "FLOOR_BUDGET", "ONE_SHOT_BUDGET", "PIECE_LIMIT",
           "STEP", "TENANT_BUDGET", "BudgetExceeded", "Meter", "PieceTooLarge", "Unmetered"]
