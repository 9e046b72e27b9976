"""Each service's settings group (shared/settings.py) is read from the same CLAIMBROKER_* variables as before:
its fields are BrokerSettings' own, with their values."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from shared.settings import (
    AdminApiSettings,
    AllocatorSettings,
    BrokerSettings,
    BusSettings,
    NotifierSettings,
    WatcherSettings,
)

GROUPS = {"bus": BusSettings, "allocator": AllocatorSettings, "notifier": NotifierSettings,
          "watcher": WatcherSettings, "admin_api": AdminApiSettings}


@pytest.mark.parametrize("name", sorted(GROUPS))
def test_a_group_holds_the_settings_fields_of_its_names(name: str) -> None:
    settings = BrokerSettings()
    group = getattr(settings, name)
    assert isinstance(group, GROUPS[name])
    for field in dataclasses.fields(group):
        assert field.name in BrokerSettings.model_fields, field.name
        assert getattr(group, field.name) == getattr(settings, field.name)


def test_the_groups_read_the_environment_variables_of_their_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    for variable, value in {"NATS_URL": "nats://bus:4222", "TENANT_BACKLOG": "4", "ALLOCATOR_BATCH": "64",
                            "MIN_RUNTIME": "5m", "GANG_RESERVE_AFTER": "0s", "WEBHOOKS": '["slack:https://hooks.example/x"]',
                            "KUBE": "true", "HEARTBEAT_INTERVAL": "10s", "API_PORT": "9090",
                            "ADMIN_JOB_TIMEOUT": "2m"}.items():
        monkeypatch.setenv(f"CLAIMBROKER_{variable}", value)
    settings = BrokerSettings()
    assert settings.bus.nats_url == "nats://bus:4222" and settings.bus.tenant_backlog == 4
    assert settings.allocator.allocator_batch == 64 and settings.allocator.min_runtime == 300.0
    assert settings.allocator.gang_reserve_after == 0.0
    assert [(w.url, w.format) for w in settings.notifier.webhooks] == [("https://hooks.example/x", "slack")]
    assert settings.watcher.kube and settings.watcher.heartbeat_interval == 10.0
    assert settings.admin_api.api_port == 9090 and settings.admin_api.admin_job_timeout == 120.0


def test_the_command_lines_overrides_reach_the_groups(tmp_path: Path) -> None:
    settings = BrokerSettings().model_copy(update={"inventory": [tmp_path / "fleet.yaml"], "stream_replicas": 3})
    assert settings.allocator.inventory == settings.watcher.inventory == [tmp_path / "fleet.yaml"]
    assert settings.bus.stream_replicas == 3
