"""Which devices a list of CEL selectors accepts, evaluated as rarely as possible.

cel-python costs 0.25 to 0.8 ms an evaluation, so nothing here evaluates per device when it can help it:
- a selector's result depends only on the device fields it names, so it is kept per distinct tuple of
  those values (a fleet of 1,000 H100s costs one evaluation, not 1,000);
- nodes of one shape (same kinds of device in the same order) match alike, so the devices a selector
  list accepts are kept per node shape, not per node;
- selectors that read a device's identity (uuid, PCI address) are the exception: evaluated per device.
The memo holds derived data only: dropping it never changes an answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from shared.dra.budget import EVALUATION, Meter, Unmetered
from shared.dra.cel import CompiledSelector, SelectorError, SelectorText, compile_selector, evaluate
from shared.dra.inventory import IDENTITY_ATTRIBUTES, FleetDevice, NodeInventory

_CACHE_LIMIT = 200_000
Selector = CompiledSelector | SelectorText  # a plan's selectors are texts, compiled on a memo miss


@dataclass
class SelectorMemo:
    """Selector results and per-shape matches, kept by the caller across decisions and fleet versions."""

    results: dict[tuple[str, Any], bool] = field(default_factory=dict)
    signatures: dict[tuple[frozenset[str], int], Any] = field(default_factory=dict)
    shapes: dict[tuple[tuple[str, ...], int], tuple[int, ...] | SelectorError] = field(default_factory=dict)
    plans: dict[Any, Any] = field(default_factory=dict)  # prepared claims per spec (shared/dra/allocation.py)
    plan_of: dict[int, tuple[Any, Any]] = field(default_factory=dict)  # id(claim) -> (claim, plan)
    key_of: dict[int, tuple[Any, bytes]] = field(default_factory=dict)  # id(claim) -> (claim, spec key): being prepared
    plans_cleared: int = 0  # times `plans` was emptied: caches keyed by a plan's id are void after
    evaluations: int = 0
    # Charged for each evaluation not found here, before it runs: the decision under way sets it
    # (FleetState.metered), so a claim whose selectors are costly pays for them itself.
    meter: Meter = field(default_factory=Unmetered)

    def _signature(self, selector: Selector, device: FleetDevice) -> Any:
        names = selector.names
        if names is None or names & IDENTITY_ATTRIBUTES:
            return device.key
        key = (names, device.profile_id)
        found = self.signatures.get(key)
        if found is None:
            found = (
                device.driver,
                tuple(sorted((k, str(v)) for k, v in device.attributes.items() if k.rpartition("/")[2] in names)),
                tuple(sorted((k, v.value) for k, v in device.capacity.items() if k.rpartition("/")[2] in names)),
            )
            self.signatures[key] = found
        return found

    def matches(self, selector: Selector, device: FleetDevice) -> bool:
        """Raises SelectorError on a CEL runtime error: the selector is wrong, not the device."""
        key = (selector.expression, self._signature(selector, device))
        hit = self.results.get(key)
        if hit is None:
            self.meter.spend_whole(EVALUATION)
            self.evaluations += 1
            program = selector if isinstance(selector, CompiledSelector) else compile_selector(
                selector.expression, self.meter)
            hit = evaluate(program, device.activation)
            if len(self.results) > _CACHE_LIMIT:
                self.results.clear()
            self.results[key] = hit
        return hit

    def accepts(self, selectors: Sequence[Selector], device: FleetDevice) -> bool:
        """Class selectors come first in the list; evaluation stops at the first false, as in DRA.
        A runtime error names the device it happened on."""
        try:
            return all(self.matches(s, device) for s in selectors)
        except SelectorError as error:
            raise SelectorError(f"selector on device {device.driver}/{device.pool}/{device.name}: {error}") from None

    def shape_matches(self, selectors: Sequence[Selector], node: NodeInventory) -> tuple[int, ...] | None:
        """Positions of the devices the selectors accept on every node of this node's shape; None when
        a selector reads device identity and must be matched per node. Raises SelectorError."""
        if any(s.names is None or s.names & IDENTITY_ATTRIBUTES for s in selectors):
            return None
        key = (tuple(s.expression for s in selectors), node.shape_id)
        found = self.shapes.get(key)
        if found is None:
            try:
                found = tuple(i for i, d in enumerate(node.devices) if self.accepts(selectors, d))
            except SelectorError as error:
                found = error
            if len(self.shapes) > _CACHE_LIMIT:
                self.shapes.clear()
            self.shapes[key] = found
        if isinstance(found, SelectorError):
            raise found
        return found
