"""Typed settings, read once at the edge (CLI or service entry point) and passed in."""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h)?$")


def parse_duration(value: str | float | int) -> float:
    """'10m', '30s', '1.5h', '250ms' or plain seconds."""
    if isinstance(value, int | float):
        return float(value)
    match = _DURATION.match(value.strip())
    if not match:
        raise ValueError(f"invalid duration {value!r}: use e.g. 30s, 10m, 1h")
    number, unit = float(match[1]), match[2] or "s"
    return number * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[unit]


class BrokerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CLAIMBROKER_", extra="ignore")

    nats_url: str | None = None
    db: str | None = None
    data_dir: Path = Path(".claimbroker")
    api_host: str = "127.0.0.1"
    api_port: int = 8080
    inventory: list[Path] = []
    kube: bool = False
    pending_alert_after: float = 600.0
    inventory_poll_interval: float = 2.0
    allocator_batch: int = 64
    ack_wait: float = 30.0
    max_deliver: int = 10

    @field_validator("pending_alert_after", mode="before")
    @classmethod
    def _duration(cls, value: str | float) -> float:
        return parse_duration(value)

    def database_url(self) -> str:
        return self.db or f"sqlite+aiosqlite:///{(self.data_dir / 'ledger.db').resolve()}"
