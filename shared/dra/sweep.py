"""How far a claim's placement search got, kept between cycles.

A search its budget cut short goes on where it stopped, and a search that found no room looks again only at
the nodes where devices were freed since: only a release makes a node that had no room for a claim have
room (taking devices never does, and any other change of the fleet starts a new FleetState, and with it
new sweeps). So a node searched in vain when the free clock read c needs no new search while the node's
last release is at or before c. This makes a retry cost what changed, not the fleet's size: the many
combinations of a claim of many requests are searched once, not at every release.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Sweep:
    """One claim spec's search under one filter, per variant (a firstAvailable combination)."""

    swept_at: dict[int, int] = field(default_factory=dict)  # variant -> free clock at its last full search
    partial: int | None = None  # the variant whose first full search was cut short, and the nodes it covered
    checked: dict[str, int] = field(default_factory=dict)  # node -> free clock when searched in vain
    given_up: set[str] = field(default_factory=set)  # nodes whose search ran past PIECE_LIMIT (no room, then)

    def skips(self, variant: int, node: str, freed_at: int) -> bool:
        """Whether the node, last freed at `freed_at`, was searched in vain for the variant since."""
        at = self.swept_at.get(variant)
        if at is not None:
            return freed_at <= at
        return variant == self.partial and freed_at <= self.checked.get(node, -1)

    def searched(self, variant: int, node: str, clock: int) -> None:
        """The node has no room for the variant now (kept while the variant's first search is unfinished)."""
        if variant in self.swept_at:
            return
        if self.partial != variant:
            self.partial, self.checked = variant, {}
        self.checked[node] = clock

    def finished(self, variant: int, clock: int) -> None:
        """Every node of the variant was searched (or skipped as unchanged) without room."""
        self.swept_at[variant] = clock
        if self.partial == variant:
            self.partial, self.checked = None, {}


__all__ = ["Sweep"]
