"""The device indexes a fleet's state has built (shared/dra/fleet_index.py): one per kind of request,
grouping and filter, built on first use so a cycle pays only for the kinds of request it meets.

Two requests whose selectors accept the same devices (with the same tolerations, grouping and filter) share
one index. An index lives as long as a plan that waits reads it: one no plan reads any more is dropped, and
built again from the selector memo if a claim needs it later.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from shared.dra.cel_errors import SelectorError
from shared.dra.fleet_index import DeviceIndex
from shared.dra.inventory import Fleet
from shared.dra.matching import SelectorMemo
from shared.dra.occupancy import Occupancy
from shared.dra.plan import Alternative
from shared.dra.results import DeviceFilter, Rejected


class IndexCache:
    def __init__(self, fleet: Fleet, memo: SelectorMemo, occupancy: Occupancy) -> None:
        self.fleet = fleet
        self.memo = memo
        self.occupancy = occupancy
        self._indexes: dict[tuple[Any, ...], DeviceIndex | SelectorError] = {}
        self._index_of: dict[tuple[int, str | None, Any], tuple[Alternative, tuple[Any, ...]]] = {}  # -> index key
        self._by_acceptance: dict[Any, DeviceIndex] = {}  # indexes by what they hold (DeviceIndex.acceptance)
        self._readers: dict[int, int] = {}  # per index (by id): the plans and filters that read it
        self._shape_indexes: dict[int, list[DeviceIndex]] = {}

    def index(self, alternative: Alternative, group_attribute: str | None, only: DeviceFilter | None) -> DeviceIndex:
        """The index of devices an alternative accepts (within `only`); raises Rejected on a CEL runtime error."""
        only_key = only.key if only else None
        known = self._index_of.get((id(alternative), group_attribute, only_key))
        found: DeviceIndex | SelectorError | None = None
        if known is not None and known[0] is alternative:  # the same request object: no key to build
            found = self._indexes.get(known[1])
        if found is None:
            key = (*alternative.index_key(group_attribute), only_key)
            found = self._index_by_key(key, alternative, group_attribute, only)
            if len(self._index_of) > 50_000:  # requests of specs long gone: bounded like the plan memo
                self._index_of.clear()
            self._index_of[(id(alternative), group_attribute, only_key)] = (alternative, key)
        if isinstance(found, SelectorError):
            raise Rejected(f"request {alternative.result_name!r}: {found}")
        assert found is not None
        return found

    def _index_by_key(self, key: tuple[Any, ...], alternative: Alternative, group_attribute: str | None,
                      only: DeviceFilter | None) -> DeviceIndex | SelectorError:
        found = self._indexes.get(key)
        if found is None:
            occupancy = self.occupancy
            try:
                found = DeviceIndex(alternative.selectors, alternative.body.tolerations, group_attribute,
                                    self.fleet, self.memo, occupancy.unavailable, occupancy.idle,
                                    only.accepts if only else None, occupancy.only_use, occupancy.in_use)
            except SelectorError as error:
                found = error
            else:
                alike = (found.acceptance, alternative.body.tolerations, group_attribute, only.key if only else None)
                same = self._by_acceptance.get(alike)
                if same is not None:
                    found = same  # another request accepts the same devices: one index serves both
                else:
                    found.alike = alike
                    self._by_acceptance[alike] = found
                    for shape in found.shapes:
                        self._shape_indexes.setdefault(shape, []).append(found)
                found.keys.append(key)
            self._indexes[key] = found
        return found

    def read_by(self, indexes: Iterable[DeviceIndex], change: int) -> None:
        """Count the plans that read these indexes; one no plan reads any more is dropped."""
        for index in set(indexes):
            readers = self._readers.get(id(index), 0) + change
            if readers > 0:
                self._readers[id(index)] = readers
                continue
            self._readers.pop(id(index), None)
            for key in index.keys:
                if self._indexes.get(key) is index:
                    del self._indexes[key]
            if self._by_acceptance.get(index.alike) is index:
                del self._by_acceptance[index.alike]
            for shape in index.shapes:
                kept = self._shape_indexes.get(shape)
                if kept is not None and index in kept:
                    kept.remove(index)

    def touch(self, node: str) -> None:
        """Tell the indexes that hold devices of the node that what is free there changed."""
        inventory = self.fleet.nodes.get(node)
        if inventory is not None:
            for index in self._shape_indexes.get(inventory.shape_id, ()):
                index.touch(node)
