"""Free devices per request alternative, indexed so a decision never scans the fleet.

An index holds the devices one request alternative (its class and request selectors and its
tolerations) accepts, grouped per node, or per node and value of the attribute a matchAttribute
constraint names (a NUMA node, a PCIe root). Groups sit in buckets keyed by placement preference:
the fit rank of the group's best free device (healthy before throttled, smallest memory first), then
the number of free devices (fewest first: partly used nodes before empty ones, so whole nodes stay
free for big jobs). Finding the best group with room for n devices walks a handful of bucket keys,
whatever the fleet's size; taking a device updates only the groups of its node.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from shared.dra import v1 as dra
from shared.dra.budget import STEP
from shared.dra.inventory import IDENTITY_ATTRIBUTES, UNHEALTHY, Fleet, FleetDevice
from shared.dra.matching import Selector, SelectorMemo

IN_USE = "in use"  # the one reason an index also counts by subtraction, on nodes where it is the only one
GroupKey = tuple[str, str | None]  # node, value of the grouping attribute (None: the whole node)
# Why a matching device is not free: IN_USE, "shared counters", "unhealthy", "stale inventory".
Unavailability = Callable[[FleetDevice], str | None]


def tolerated(taint: dra.DeviceTaint, tolerations: Sequence[dra.Toleration]) -> bool:
    for t in tolerations:
        if t.effect not in (None, "") and t.effect != taint.effect:
            continue
        if t.operator == "Exists" and (t.key is None or t.key == taint.key):
            return True
        if t.operator == "Equal" and t.key == taint.key and (t.value or None) == (taint.value or None):
            return True
    return False


def blocked_by_taint(device: FleetDevice, tolerations: Sequence[dra.Toleration]) -> bool:
    """NoSchedule and NoExecute taints block a device unless tolerated; other effects are ignored."""
    return any(t.effect in ("NoSchedule", "NoExecute") and not tolerated(t, tolerations) for t in device.taints)


@dataclass(frozen=True)
class _Template:
    accepted: int
    tainted: int
    unhealthy: int
    lacking: int
    groups: tuple[tuple[str | None, tuple[int, ...]], ...]


def _reads_identity(attribute: str) -> bool:
    return attribute.rpartition("/")[2] in IDENTITY_ATTRIBUTES


@dataclass
class Group:
    key: GroupKey
    devices: list[FleetDevice]  # accepted and untainted, best fit first
    free: list[FleetDevice] = field(default_factory=list)
    bucket: tuple[tuple[int, int], int] | None = None

    @property
    def node(self) -> str:
        return self.key[0]


@dataclass
class _IdleNodes:
    """Untouched nodes of one shape: interchangeable, so each of the shape's groups stands in a bucket
    once for all of them. A node is materialised into real groups the first time it is picked or
    touched, which keeps building an index O(shapes), not O(nodes)."""

    shape: int
    template: _Template
    nodes: dict[str, None]  # in name order
    sample: tuple[FleetDevice, ...]  # the first node's devices: the shape's fit ranks


BucketKey = tuple[tuple[int, int], int]


class DeviceIndex:
    def __init__(
        self,
        selectors: Sequence[Selector],
        tolerations: Sequence[dra.Toleration],
        group_attribute: str | None,
        fleet: Fleet,
        memo: SelectorMemo,
        unavailable: Unavailability,
        idle: Callable[[str], bool] = lambda node: False,
        accepts: Callable[[FleetDevice], bool] | None = None,
        only_use: Callable[[str], bool] = lambda node: False,
        in_use: Collection[tuple[str, str, str]] = frozenset(),
    ) -> None:
        """Raises SelectorError when a selector fails on a device: the claim is wrong as written.
        `accepts` narrows the devices further (a quota tier); it must judge a device by its kind."""
        self.group_attribute = group_attribute
        self.accepts = accepts
        self.tolerations = tolerations
        self.fleet = fleet
        self.unavailable = unavailable
        self.only_use = only_use  # node where a device that is not free can only be in use (no counters, not stale)
        self.in_use = in_use  # the keys of devices in use (the caller's set, kept current by it)
        self.groups: dict[GroupKey, Group] = {}
        self.by_node: dict[str, list[Group]] = {}
        self.idle_nodes: dict[int, _IdleNodes] = {}  # shape -> its untouched nodes
        self.idle_shape: dict[str, int] = {}  # untouched node -> its shape
        self.templates: dict[str, _Template] = {}  # node -> template, for nodes with per-node templates
        self.buckets: dict[BucketKey, dict[Any, None]] = {}
        self.bucket_keys: list[BucketKey] = []
        self.matching = 0  # devices the selectors accept, in the whole fleet
        self.tainted = 0  # of those, blocked by a taint the request does not tolerate
        self.unhealthy = 0  # of those, marked unhealthy by telemetry
        self.lacking = 0  # of those, without the grouping attribute (a matchAttribute cannot use them)
        self.largest_group = 0  # the most usable devices in one group: more can never be allocated together
        self.nodes_with_matches = 0
        self.shapes: set[int] = set()  # node shapes with matching devices: where a change may matter
        self.kind_samples: dict[int, FleetDevice] = {}  # one accepted device per kind
        self.version = 0  # bumped whenever a free list changes: a Pending answer cached per version holds
        self.keys: list[Any] = []  # the keys the index cache finds it under, and what it holds (IndexCache)
        self.alike: Any = None
        self.cached: dict[Any, Any] = {}  # what callers work out from it (explain's figures, preemption's keys)
        self._free_materialised = 0
        self._blocked: Counter[str] = Counter()
        self._node_blocked: dict[str, dict[str, int]] = {}
        self._blocked_stale: set[str] = set()  # nodes refreshed since `blocked` was last counted
        # First what the selectors accept (the CEL work, charged per evaluation the memo lacks: cut short, it
        # goes on from the memo next time), then the walk over the nodes (charged whole, before it starts).
        # What is accepted, per shape (or per node, for selectors that read a device's identity), is the
        # index's `acceptance`: two indexes that accept alike with the same tolerations, grouping and filter
        # hold the same devices, so the index cache keeps one of them (shared/dra/index_cache.py).
        matches: dict[int, tuple[int, ...] | None] = {}
        per_device: dict[str, tuple[int, ...]] = {}
        for shape, names in fleet.nodes_by_shape.items():
            positions = matches[shape] = memo.shape_matches(selectors, fleet.nodes[names[0]])
            if positions is None:
                for name in names:
                    per_device[name] = tuple(i for i, d in enumerate(fleet.nodes[name].devices)
                                             if memo.accepts(selectors, d))
        memo.meter.spend_whole(STEP * len(fleet.nodes))
        acceptance: list[tuple[Any, tuple[int, ...]]] = []
        per_node = group_attribute is not None and _reads_identity(group_attribute)
        for shape, names in fleet.nodes_by_shape.items():
            positions = matches[shape]
            if positions is not None and not positions:
                continue  # no node of this shape has a matching device
            if positions is not None:
                acceptance.append((shape, positions))
            shared: _Template | None = None
            pool: list[str] = []
            for name in names:
                devices = fleet.nodes[name].devices
                if positions is None or per_node:
                    accepted = positions if positions is not None else per_device[name]
                    if positions is None:
                        acceptance.append((name, accepted))
                    template = self.templates[name] = self._template(devices, accepted)
                else:
                    template = shared = shared or self._template(devices, positions)
                if not template.accepted:
                    continue
                self.shapes.add(shape)
                self._count(template)
                if template is shared and idle(name):
                    pool.append(name)
                else:
                    self._materialise(name, template)
            if pool and shared is not None and shared.groups:
                entry = _IdleNodes(shape, shared, dict.fromkeys(pool), fleet.nodes[pool[0]].devices)
                self.idle_nodes[shape] = entry
                self.idle_shape.update(dict.fromkeys(pool, shape))
                for value, positions_in_group in shared.groups:
                    rank = entry.sample[positions_in_group[0]].fit_rank
                    self._enter((rank, len(positions_in_group)), ("idle", shape, value))
        self.acceptance = tuple(acceptance)

    # -- building -----------------------------------------------------------------------------------

    def _template(self, devices: Sequence[FleetDevice], accepted: Sequence[int]) -> _Template:
        """How one node's accepted devices split into groups, by position: the same for every node of a
        shape, so it is worked out once per shape. Groups list devices best fit first."""
        tainted = unhealthy = lacking = 0
        grouped: dict[str | None, list[int]] = {}
        attribute = self.group_attribute
        if self.accepts is not None:
            accepted = [i for i in accepted if self.accepts(devices[i])]
        for i in accepted:
            self.kind_samples.setdefault(devices[i].profile_id, devices[i])
        for i in sorted(accepted, key=lambda i: (devices[i].fit_rank, i)):
            d = devices[i]
            if d.taints and blocked_by_taint(d, self.tolerations):
                tainted += 1
            elif d.health == UNHEALTHY:
                unhealthy += 1
            else:
                value = d.attribute_text(attribute) if attribute else None
                if attribute and value is None:
                    lacking += 1
                else:
                    grouped.setdefault(value, []).append(i)
        groups = tuple((value, tuple(grouped[value])) for value in sorted(grouped, key=str))
        return _Template(len(accepted), tainted, unhealthy, lacking, groups)

    def _count(self, template: _Template) -> None:
        self.nodes_with_matches += 1
        self.matching += template.accepted
        self.tainted += template.tainted
        self.unhealthy += template.unhealthy
        self.lacking += template.lacking
        for _, positions in template.groups:
            self.largest_group = max(self.largest_group, len(positions))

    def _materialise(self, name: str, template: _Template) -> None:
        devices = self.fleet.nodes[name].devices
        groups = []
        for value, positions in template.groups:
            group = Group((name, value), [devices[i] for i in positions])
            groups.append(group)
            self.groups[group.key] = group
        if groups:
            self.by_node[name] = groups
            self.refresh(name)

    def _leave_idle(self, name: str) -> None:
        """An untouched node is picked or changed: it becomes real groups of its own."""
        shape = self.idle_shape.pop(name)
        entry = self.idle_nodes[shape]
        del entry.nodes[name]
        if not entry.nodes:
            for value, positions in entry.template.groups:
                rank = entry.sample[positions[0]].fit_rank
                self._leave((rank, len(positions)), ("idle", shape, value))
            del self.idle_nodes[shape]
        self._materialise(name, entry.template)

    # -- keeping up ---------------------------------------------------------------------------------

    def touch(self, node: str) -> None:
        """The node changed (a device taken or given back): recompute its free devices."""
        if node in self.idle_shape:
            self._leave_idle(node)
        else:
            self.refresh(node)

    def refresh(self, node: str) -> None:
        """Recompute the node's free devices and buckets; why the others are not free is counted when
        asked (`blocked`), since only reasons read it."""
        unavailable, in_use = self.unavailable, self.in_use
        only_use = self.only_use(node)
        for group in self.by_node.get(node, ()):
            if only_use:
                free = [d for d in group.devices if d.key not in in_use]
            else:
                free = [d for d in group.devices if unavailable(d) is None]
            if free != group.free:
                self.version += 1
                self._free_materialised += len(free) - len(group.free)
                group.free = free
            bucket = (free[0].fit_rank, len(free)) if free else None
            if bucket != group.bucket:
                if group.bucket is not None:
                    self._leave(group.bucket, ("group", 0, group.key))
                group.bucket = bucket
                if bucket is not None:
                    self._enter(bucket, ("group", 0, group.key))
        self._blocked_stale.add(node)

    @property
    def blocked(self) -> Counter[str]:
        """Accepted devices that are not free, by why (in use, shared counters, ...), over the fleet."""
        if self._blocked_stale:
            unavailable = self.unavailable
            for node in self._blocked_stale:
                counts: dict[str, int] = {}
                if self.only_use(node):
                    if in_use := sum(len(g.devices) - len(g.free) for g in self.by_node.get(node, ())):
                        counts[IN_USE] = in_use
                else:
                    for group in self.by_node.get(node, ()):
                        for d in group.devices:
                            if (why := unavailable(d)) is not None:
                                counts[why] = counts.get(why, 0) + 1
                previous = self._node_blocked.get(node)
                if previous:
                    self._blocked.subtract(previous)
                if counts or previous:
                    self._node_blocked[node] = counts
                    self._blocked.update(counts)
            self._blocked_stale.clear()
        return self._blocked

    def _enter(self, bucket: BucketKey, member: Any) -> None:
        members = self.buckets.get(bucket)
        if members is None:
            members = self.buckets[bucket] = {}
            bisect.insort(self.bucket_keys, bucket)
        members[member] = None

    def _leave(self, bucket: BucketKey, member: Any) -> None:
        del self.buckets[bucket][member]

    # -- reading ------------------------------------------------------------------------------------

    @property
    def free_total(self) -> int:
        idle = sum(len(e.nodes) * sum(len(p) for _, p in e.template.groups) for e in self.idle_nodes.values())
        return self._free_materialised + idle

    def best_groups(self, wanted: int) -> Iterator[Group]:
        """Groups with at least `wanted` free devices, best placement first. The caller may take
        devices between steps; each group is yielded once."""
        for bucket in list(self.bucket_keys):
            if bucket[1] < wanted:
                continue
            for kind, shape, key in list(self.buckets.get(bucket, ())):
                if kind == "group":
                    group = self.groups[key]  # type: ignore[index]
                    if len(group.free) >= wanted:
                        yield group
                    continue
                entry = self.idle_nodes.get(shape)
                while entry is not None and entry.nodes:
                    node = next(iter(entry.nodes))
                    self._leave_idle(node)
                    group = self.groups[(node, key)]
                    if len(group.free) >= wanted:
                        yield group
                    entry = self.idle_nodes.get(shape)

    def most_free(self) -> int:
        return max((b[1] for b in self.bucket_keys if self.buckets[b]), default=0)

    def kinds(self) -> list[FleetDevice]:
        """One device of each kind (profile) this index accepts."""
        return list(self.kind_samples.values())

    def node_names(self) -> list[str]:
        return sorted(self.nodes)

    @cached_property
    def nodes(self) -> frozenset[str]:
        """Every node with a device this index accepts (free or not): fixed for the fleet."""
        return frozenset(self.by_node) | frozenset(self.idle_shape)

    def _ensure(self, node: str) -> None:
        if node in self.idle_shape:
            self._leave_idle(node)

    def free_on(self, node: str) -> list[FleetDevice]:
        self._ensure(node)
        return [d for group in self.by_node.get(node, ()) for d in group.free]

    def free_count(self, node: str) -> int:
        """len(free_on(node)), without building the list."""
        self._ensure(node)
        return sum(len(group.free) for group in self.by_node.get(node, ()))

    def devices_on(self, node: str) -> list[FleetDevice]:
        self._ensure(node)
        return [d for group in self.by_node.get(node, ()) for d in group.devices]
