"""Per-device telemetry on inventory messages and the one rule that turns it into a health verdict.

The watcher writes it, the allocator (refuses unhealthy devices) and the notifier (device-unhealthy,
device-throttled alerts) read it, so the rule and the wire shape live here, in one place:

    "telemetry": {"devices": {"gpu-0": {"health": "Healthy" | "Throttled" | "Unhealthy",
                                        "temperatureC": 41, "throttleReasons": [], "eccUncorrected": 0}}}
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, cast

Health = Literal["Healthy", "Throttled", "Unhealthy"]
HEALTH_VALUES: tuple[Health, ...] = ("Healthy", "Throttled", "Unhealthy")

# NVML clock event ("throttle") reason bits, named as NVML names them (nvmlClocksEventReason*).
THROTTLE_REASON_BITS: tuple[tuple[int, str], ...] = (
    (0x1, "GpuIdle"),
    (0x2, "ApplicationsClocksSetting"),
    (0x4, "SwPowerCap"),
    (0x8, "HwSlowdown"),
    (0x10, "SyncBoost"),
    (0x20, "SwThermalSlowdown"),
    (0x40, "HwThermalSlowdown"),
    (0x80, "HwPowerBrakeSlowdown"),
    (0x100, "DisplayClockSetting"),
)
# Reasons that mean the GPU runs slower than asked because of heat or the power supply. Idle, a
# software power cap or application clocks are normal operation and must not raise alerts.
SLOWDOWN_REASONS = frozenset({"HwSlowdown", "SwThermalSlowdown", "HwThermalSlowdown", "HwPowerBrakeSlowdown"})


def throttle_reason_names(mask: int) -> tuple[str, ...]:
    """The names of the bits set in an NVML clock event reasons mask, in bit order."""
    return tuple(name for bit, name in THROTTLE_REASON_BITS if mask & bit)


def health_of(*, ecc_uncorrected: int, throttle_reasons: Iterable[str], error: bool = False) -> Health:
    """Unhealthy beats Throttled beats Healthy: data corruption or a device NVML cannot read is unusable,
    a slowed-down one still works but should not get new long jobs silently."""
    if error or ecc_uncorrected > 0:
        return "Unhealthy"
    if SLOWDOWN_REASONS.intersection(throttle_reasons):
        return "Throttled"
    return "Healthy"


@dataclass(frozen=True)
class DeviceTelemetry:
    health: Health
    temperature_c: int = 0
    throttle_reasons: tuple[str, ...] = ()
    ecc_uncorrected: int = 0
    error: str | None = field(default=None, compare=False)  # local diagnostics only, not on the wire

    @classmethod
    def observe(cls, *, temperature_c: int, throttle_reasons: Iterable[str], ecc_uncorrected: int,
                error: str | None = None) -> DeviceTelemetry:
        """Readings in, verdict computed by the shared rule, so no caller can disagree with it."""
        reasons = tuple(throttle_reasons)
        health = health_of(ecc_uncorrected=ecc_uncorrected, throttle_reasons=reasons, error=error is not None)
        return cls(health, temperature_c, reasons, ecc_uncorrected, error)

    def to_json(self) -> dict[str, Any]:
        return {"health": self.health, "temperatureC": self.temperature_c,
                "throttleReasons": list(self.throttle_reasons), "eccUncorrected": self.ecc_uncorrected}

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> DeviceTelemetry:
        """Tolerant reader: an unknown health is treated as Unhealthy rather than trusted."""
        health = value.get("health")
        return cls(
            health=cast(Health, health) if health in HEALTH_VALUES else "Unhealthy",
            temperature_c=int(value.get("temperatureC") or 0),
            throttle_reasons=tuple(str(r) for r in value.get("throttleReasons") or ()),
            ecc_uncorrected=int(value.get("eccUncorrected") or 0),
        )


def to_json(devices: Mapping[str, DeviceTelemetry]) -> dict[str, Any]:
    """The payload's `telemetry` value; empty when a source has no readings (files, Kubernetes)."""
    if not devices:
        return {}
    return {"devices": {name: devices[name].to_json() for name in sorted(devices)}}


def from_json(telemetry: Mapping[str, Any] | None) -> dict[str, DeviceTelemetry]:
    """Device name → telemetry from an inventory payload's `telemetry`; missing means no readings."""
    devices = (telemetry or {}).get("devices") or {}
    return {str(name): DeviceTelemetry.from_json(value) for name, value in devices.items()
            if isinstance(value, Mapping)}
