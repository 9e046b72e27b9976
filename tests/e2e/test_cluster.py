"""On a three-server NATS cluster the broker's streams keep three replicas (CLAIMBROKER_STREAM_REPLICAS=3),
a service's own stream check never shrinks them, and a claim published after one server is killed is
still acknowledged and kept."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest

from services.bus.embedded import nats_server_binary
from services.bus.publish import publish_json
from services.bus.streams import ensure_streams
from shared.contract import subjects
from tests.builders import a_claim
from tests.e2e.helpers import free_port

pytestmark = pytest.mark.e2e



@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[list[str], dict[str, subprocess.Popen[bytes]]]]:
    ports, routes = [free_port() for _ in range(3)], [free_port() for _ in range(3)]
    joined = ",".join(f"nats://127.0.0.1:{p}" for p in routes)
    servers = {
        f"n{i}": subprocess.Popen(
            [nats_server_binary(), "-a", "127.0.0.1", "-p", str(ports[i]), "-js", "-sd", str(tmp_path / f"n{i}"),
             "-n", f"n{i}", "--cluster_name", "cb", "--cluster", f"nats://127.0.0.1:{routes[i]}", "--routes", joined],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for i in range(3)}
    yield [f"nats://127.0.0.1:{p}" for p in ports], servers
    for server in servers.values():
        server.kill()
        server.wait()


async def _quiet(_: Exception) -> None:
    return None


async def test_streams_keep_three_replicas_and_a_claim_survives_a_server(
        cluster: tuple[list[str], dict[str, subprocess.Popen[bytes]]]) -> None:
    urls, servers = cluster
    nc = await nats.connect(servers=urls, max_reconnect_attempts=-1, reconnect_time_wait=0.2, error_cb=_quiet)
    try:
        js = nc.jetstream()
        for _ in range(100):  # the cluster elects its JetStream meta leader first
            try:
                await ensure_streams(js, 3)
                break
            except Exception:  # not ready yet
                await asyncio.sleep(0.1)
        info = await js.stream_info(subjects.CLAIMS_STREAM)
        assert info.config.num_replicas == 3
        await ensure_streams(js)  # what every service runs when it starts
        assert (await js.stream_info(subjects.CLAIMS_STREAM)).config.num_replicas == 3

        leader = info.cluster.leader if info.cluster else None
        assert leader in servers
        servers[leader].kill()
        servers[leader].wait()
        document = a_claim("survivor", "team").request().document()
        for _ in range(100):  # a new leader is elected among the two left
            try:
                ack = await publish_json(js, subjects.submit("team"), document, msg_id="survivor")
                break
            except Exception:  # no leader yet
                await asyncio.sleep(0.1)
        assert ack.stream == subjects.CLAIMS_STREAM
        after = await js.stream_info(subjects.CLAIMS_STREAM)
        assert after.state.messages == 1 and after.cluster is not None and after.cluster.leader != leader
    finally:
        await nc.close()
