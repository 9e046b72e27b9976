"""The fleet as the decision core sees it: devices per node, built from ResourceSlices.

DRA rules applied here, once, so the allocator never sees them: only the newest generation of a pool
counts, an incomplete pool is held back, unqualified attribute names belong to the driver's domain.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from functools import cached_property
from typing import Any

from shared.dra import v1 as dra
from shared.dra.cel_library import SemVer, device_activation
from shared.dra.quantity import Quantity, exact, parse_quantity

AttributeValue = int | bool | str | SemVer
HEALTHY, THROTTLED, UNHEALTHY = "Healthy", "Throttled", "Unhealthy"
# Attributes that name one physical device rather than a kind of device; selectors that read them are
# evaluated per device, everything else per distinct device kind.
IDENTITY_ATTRIBUTES = frozenset({"uuid", "parentUUID", "pciBusID", "pcieBusID", "pcieRoot", "minor", "index",
                                 "parentIndex"})
_INTERNED: dict[Any, int] = {}


def intern_id(value: Any) -> int:
    """A small int per distinct value, so that cache keys built from device kinds hash in O(1).

    Process-wide and append-only: it grows with the number of distinct device kinds and node layouts
    ever seen, not with the fleet's size.
    """
    found = _INTERNED.get(value)
    if found is None:
        found = _INTERNED[value] = len(_INTERNED)
    return found


def qualify(name: str, driver: str) -> str:
    return name if "/" in name else f"{driver}/{name}"


def _split(qualified: str) -> tuple[str, str]:
    domain, _, name = qualified.rpartition("/")
    return domain, name


@dataclass(frozen=True)
class FleetDevice:
    """One allocatable device; `key` (driver, pool, device) is what the ledger makes unique."""

    node: str
    driver: str
    pool: str
    name: str
    attributes: Mapping[str, AttributeValue]  # fully qualified names
    capacity: Mapping[str, Quantity]  # fully qualified names
    taints: tuple[dra.DeviceTaint, ...] = ()
    consumes_counters: tuple[dra.DeviceCounterConsumption, ...] = ()
    health: str = HEALTHY  # from the node's telemetry: placement takes Throttled last, Unhealthy never
    # The readings behind `health`, for people (the usage page's node map); placement reads only health.
    temperature_c: int | None = None
    throttle_reasons: tuple[str, ...] = ()

    @cached_property
    def key(self) -> tuple[str, str, str]:  # built once: placement and usage look devices up by key constantly
        return (self.driver, self.pool, self.name)

    @cached_property
    def profile_id(self) -> int:
        """What kind of device this is: everything but its identity (uuid, PCI address, name)."""
        return intern_id((
            self.driver,
            tuple((k, v) for k, v in self.attributes.items() if k.rpartition("/")[2] not in IDENTITY_ATTRIBUTES),
            tuple((k, v.text) for k, v in self.capacity.items()),
            self.taints,
            tuple((key[2:], amount) for key, amount in self.counter_draws),  # not the pool: nodes alike share
            self.health,
        ))

    @cached_property
    def fit_rank(self) -> tuple[int, int]:
        """Best fit: healthy before throttled, then the smallest memory, so a 20 GB job takes a 1g MIG slice
        or an A100-40GB before an H200."""
        memory = self.memory
        return (1 if self.health == THROTTLED else 0, int(memory.value) if memory is not None else 0)

    @cached_property
    def counter_draws(self) -> tuple[tuple[CounterKey, int | Fraction], ...]:
        return tuple(((self.driver, self.pool, c.counter_set, name), exact(parse_quantity(v.value).value))
                     for c in self.consumes_counters for name, v in c.counters.items())

    @property
    def memory(self) -> Quantity | None:
        return self.capacity.get(f"{self.driver}/memory")

    def attribute_text(self, qualified: str) -> str | None:
        value = self.attributes.get(qualified)
        if value is None:
            return None
        if isinstance(value, SemVer):
            return f"{value.major}.{value.minor}.{value.patch}"
        return str(value)

    @cached_property
    def activation(self) -> Any:
        attributes: dict[str, dict[str, Any]] = defaultdict(dict)
        for qualified, value in self.attributes.items():
            domain, name = _split(qualified)
            attributes[domain][name] = value
        capacity: dict[str, dict[str, Quantity]] = defaultdict(dict)
        for qualified, quantity in self.capacity.items():
            domain, name = _split(qualified)
            capacity[domain][name] = quantity
        return device_activation(self.driver, attributes, capacity)

    def __hash__(self) -> int:
        return hash(self.key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FleetDevice) and self.key == other.key


CounterKey = tuple[str, str, str, str]  # driver, pool, counter set, counter


@dataclass(frozen=True)
class NodeInventory:
    """A node's full inventory as the watcher publishes it; `sequence` orders updates per node."""

    node: str
    devices: tuple[FleetDevice, ...]
    labels: Mapping[str, str] = field(default_factory=dict)
    counters: Mapping[CounterKey, Quantity] = field(default_factory=dict)  # partitionable devices (MIG)
    sequence: int = 0
    observed_at: float = 0.0
    removed: bool = False

    @cached_property
    def shape_id(self) -> int:
        """Nodes of one shape (same kinds of device in the same order) match selectors alike."""
        return intern_id(tuple(d.profile_id for d in self.devices))


def _attribute_value(attribute: dra.DeviceAttribute) -> AttributeValue:
    if attribute.version is not None:
        return SemVer.parse(attribute.version)
    return attribute.value


def _current_pools(slices: Iterable[dra.ResourceSlice]) -> dict[tuple[str, str], list[dra.ResourceSlice]]:
    """Per (driver, pool): the slices of its newest generation, only where that generation is complete."""
    newest: dict[tuple[str, str], int] = {}
    slices = list(slices)
    for s in slices:
        key = (s.spec.driver, s.spec.pool.name)
        newest[key] = max(newest.get(key, s.spec.pool.generation), s.spec.pool.generation)
    current: dict[tuple[str, str], list[dra.ResourceSlice]] = defaultdict(list)
    for s in slices:
        key = (s.spec.driver, s.spec.pool.name)
        if s.spec.pool.generation == newest[key]:
            current[key].append(s)
    return {k: v for k, v in sorted(current.items()) if len(v) == v[0].spec.pool.resource_slice_count}


def counters_from_slices(slices: Iterable[dra.ResourceSlice]) -> dict[str, dict[CounterKey, Quantity]]:
    """Shared counters (a MIG-capable GPU's compute and memory slices) per node."""
    by_node: dict[str, dict[CounterKey, Quantity]] = defaultdict(dict)
    for (driver, pool), members in _current_pools(slices).items():
        for s in members:
            if s.spec.node_name is None:
                continue
            for counter_set in s.spec.shared_counters:
                for name, capacity in counter_set.counters.items():
                    by_node[s.spec.node_name][(driver, pool, counter_set.name, name)] = parse_quantity(capacity.value)
    return dict(by_node)


def devices_from_slices(slices: Iterable[dra.ResourceSlice]) -> dict[str, list[FleetDevice]]:
    """Node-local devices per node, from the newest generation of each complete pool."""
    by_node: dict[str, list[FleetDevice]] = defaultdict(list)
    for (driver, pool), members in _current_pools(slices).items():  # incomplete pools are held back
        for s in sorted(members, key=lambda m: m.metadata.name):
            for device in s.spec.devices:
                node = device.node_name or s.spec.node_name
                if node is None:
                    continue  # network-attached devices are not node-local; not brokered yet
                by_node[node].append(
                    FleetDevice(
                        node=node,
                        driver=driver,
                        pool=pool,
                        name=device.name,
                        attributes={
                            qualify(k, driver): _attribute_value(v) for k, v in device.attributes.items()
                        },
                        capacity={qualify(k, driver): parse_quantity(v.value) for k, v in device.capacity.items()},
                        taints=device.taints,
                        consumes_counters=device.consumes_counters,
                    )
                )
    return dict(by_node)


@dataclass(frozen=True)
class Fleet:
    """Immutable view of every node's inventory; the allocator builds a new one per change."""

    nodes: Mapping[str, NodeInventory] = field(default_factory=dict)

    def with_node(self, inventory: NodeInventory) -> Fleet:
        nodes = dict(self.nodes)
        if inventory.removed:
            nodes.pop(inventory.node, None)
        else:
            nodes[inventory.node] = inventory
        return Fleet(nodes)

    @cached_property
    def devices(self) -> tuple[FleetDevice, ...]:
        return tuple(d for name in sorted(self.nodes) for d in self.nodes[name].devices)

    @cached_property
    def by_key(self) -> Mapping[tuple[str, str, str], FleetDevice]:
        return {d.key: d for d in self.devices}

    @cached_property
    def nodes_by_shape(self) -> Mapping[int, tuple[str, ...]]:
        """Node names per node shape, each list sorted: selectors are matched once per shape."""
        out: dict[int, list[str]] = defaultdict(list)
        for name in sorted(self.nodes):
            out[self.nodes[name].shape_id].append(name)
        return {shape: tuple(names) for shape, names in out.items()}

    @classmethod
    def from_slices(cls, slices: Iterable[dra.ResourceSlice], labels: Mapping[str, Mapping[str, str]]) -> Fleet:
        slices = list(slices)
        by_node = devices_from_slices(slices)
        counters = counters_from_slices(slices)
        return cls(
            {
                node: NodeInventory(node=node, devices=tuple(devices), labels=dict(labels.get(node, {})),
                                    counters=counters.get(node, {}))
                for node, devices in by_node.items()
            }
        )
