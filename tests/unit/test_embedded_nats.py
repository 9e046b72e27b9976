"""The embedded nats-server's JetStream sync: every write fsynced by default, as the settings say."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.bus.embedded import EmbeddedNats


@pytest.mark.parametrize(("sync", "written"), [
    ("always", '"sync_interval": "always"'), ("10s", '"sync_interval": "10s"'), ("default", None)])
def test_the_embedded_server_runs_with_the_sync_asked_for(tmp_path: Path, sync: str, written: str | None) -> None:
    server = EmbeddedNats(tmp_path / "nats", sync=sync)
    server.start()
    try:
        config = (tmp_path / "nats" / "nats-server.conf").read_text()
        log = (tmp_path / "nats" / "nats-server.log").read_text()
    finally:
        server.stop()
    assert (written in config) if written else "sync_interval" not in config
    assert f'Store Directory: "{tmp_path / "nats" / "js" / "jetstream"}"' in log  # where -sd kept it before


def test_the_default_is_every_write_synced(tmp_path: Path) -> None:
    assert EmbeddedNats(tmp_path).sync == "always"


def test_a_server_left_running_by_a_killed_run_is_stopped_and_its_port_reused(tmp_path: Path) -> None:
    from urllib.parse import urlsplit

    orphan = EmbeddedNats(tmp_path / "nats")
    port = urlsplit(orphan.start()).port
    assert orphan.process is not None
    try:
        successor = EmbeddedNats(tmp_path / "nats", port=port or -1)
        assert urlsplit(successor.start()).port == port  # the orphan had it until it was stopped
        successor.stop()
        assert orphan.process.wait(timeout=10) is not None
    finally:
        orphan.kill()
