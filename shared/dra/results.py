"""What an allocation decision says: its state, the devices per request (as ResourceClaim.status.allocation
has them), and why a claim is refused.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from fractions import Fraction
from functools import cached_property
from typing import Any

from shared.dra import v1 as dra
from shared.dra.inventory import FleetDevice

DeviceKey = tuple[str, str, str]


Amount = int | Fraction


class State(StrEnum):
    PENDING = "Pending"
    ALLOCATED = "Allocated"
    REJECTED = "Rejected"
    PREEMPTED = "Preempted"
    RELEASED = "Released"


@dataclass(frozen=True)
class DeviceResult:
    request: str
    driver: str
    pool: str
    device: str
    admin_access: bool = False  # monitoring access: the device stays free for others

    @property
    def key(self) -> DeviceKey:
        return (self.driver, self.pool, self.device)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"request": self.request, "driver": self.driver, "pool": self.pool,
                               "device": self.device}
        if self.admin_access:
            out["adminAccess"] = True
        return out


@dataclass(frozen=True)
class Allocation:
    node: str
    results: tuple[DeviceResult, ...]
    config: tuple[Mapping[str, Any], ...] = ()

    @cached_property
    def keys(self) -> tuple[DeviceKey, ...]:
        """Devices this allocation holds exclusively (admin-access results hold nothing)."""
        return tuple(r.key for r in self.results if not r.admin_access)

    def to_json(self) -> dict[str, Any]:
        """Mirrors ResourceClaim.status.allocation, plus nodeName for convenience."""
        return {
            "nodeName": self.node,
            "devices": {"results": [r.to_json() for r in self.results], "config": [dict(c) for c in self.config]},
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [self.node]}]}
                ]
            },
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Allocation:
        return cls(
            node=data["nodeName"],
            results=tuple(
                DeviceResult(r["request"], r["driver"], r["pool"], r["device"], bool(r.get("adminAccess")))
                for r in data["devices"]["results"]
            ),
            config=tuple(data["devices"].get("config", ())),
        )


@dataclass(frozen=True)
class Decision:
    state: State
    allocation: Allocation | None = None
    reason: str | None = None
    unsatisfiable: bool = False  # Pending, and no device of today's fleet could ever satisfy it
    cut: bool = False  # Pending because its budget ran out before the search ended (shared/dra/budget.py)


class Rejected(Exception):
    """The claim is wrong as written; carries the reason."""


@dataclass(frozen=True)
class DeviceFilter:
    """Restricts one decision to some devices (quota tiers: flavors within nominal first). `key` names
    the restriction for the index cache; `accepts` must depend only on what a device is, not on which."""

    key: Any
    accepts: Callable[[FleetDevice], bool]


@dataclass(frozen=True)
class Outcome:
    claim: dra.ResourceClaim
    decision: Decision
